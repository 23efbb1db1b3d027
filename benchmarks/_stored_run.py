"""What the lane benchmarks (zoo_lane.py, generation_lane.py) share: run ``conformance run`` into a
kept database once, resuming an interrupted run of the same id and skipping a finished one. Not a
benchmark itself (run_all.py skips modules whose name starts with ``_``)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path


def run_id_of(*parts: str) -> str:
    """A run id from the benchmark's arguments (``zoo-2.33.0-timm_0_12+tv_0_12``)."""
    return "-".join(parts).replace("/", "_").replace(",", "+").replace("@", "_")


def run_or_resume(db: Path, run_id: str, new_run: list[str]) -> None:
    """``conformance run NEW_RUN --run-id RUN_ID`` into ``db``; ``--resume RUN_ID`` where that run is
    stored unfinished; nothing (a line saying so) where it finished."""
    con = sqlite3.connect(db) if db.exists() else None
    row = con.execute("select status from runs where id = ?", [run_id]).fetchone() if con else None
    if row and row[0] == "finished":
        print(f"run {run_id} already finished in {db}: its figures")
        return
    cmd = [sys.executable, "-m", "conformance", "run"]
    cmd += ["--resume", run_id] if row else [*new_run, "--run-id", run_id]
    subprocess.run([*cmd, "--db", str(db), "--exit-zero", "--quiet"], check=True)
