"""The nightly's wall time, cold and warm, with each build's worker time per phase.

Runs what ``nox -s conformance`` runs (``conformance ops --store`` then ``conformance nightly``:
every shipped build, OpInfo sweep, schema search, models at the default limit, coverage, gate,
report) twice into one fresh directory:

- cold: an empty database (no schema corpus to replay, no stored group times to price the ETA
  and order the groups, no CPU references to share);
- warm: the same command again, as the next night finds it.

For each pass it prints the wall time and, per build, the worker time of each phase (the sum of
``group_times.wall_s`` by kind: opinfo, schema, model) with the items each phase recorded, so a
change in coverage shows next to a change in time. Extra arguments go to ``conformance nightly``.

Example::

    python benchmarks/nightly_time.py                      # ~30-45 min on 2 cores
    python benchmarks/nightly_time.py --passes warm -- --build 2.32.0 --build 2.33.0 --no-models
"""

from __future__ import annotations

import argparse
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_ids(db: Path) -> set[str]:
    if not db.exists():
        return set()
    con = sqlite3.connect(db)
    try:
        return {r for (r,) in con.execute("select id from runs")}
    except sqlite3.OperationalError:  # no table yet
        return set()


def phases(db: Path, before: set[str]) -> list[str]:
    con = sqlite3.connect(db)
    lines = []
    for run_id, build in con.execute("select id, build from runs order by started_at").fetchall():
        if run_id in before:
            continue
        times = dict(con.execute("select kind, round(sum(wall_s)) from group_times where run_id = ? group by kind",
                                 [run_id]).fetchall())
        ops = con.execute("select count(*) from op_results where run_id = ?", [run_id]).fetchone()[0]
        models = con.execute("select count(*) from model_results where run_id = ?", [run_id]).fetchone()[0]
        lines.append(f"  build {build}: opinfo {times.get('opinfo', 0):.0f} s, schema {times.get('schema', 0):.0f} s, "
                     f"models {times.get('model', 0):.0f} s of worker time; {ops} op items, {models} model items")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--passes", default="cold,warm", help="cold,warm (warm alone: after a cold pass in --dir)")
    ap.add_argument("--dir", default=None, help="keep the database here (default: a temporary directory)")
    ap.add_argument("nightly_args", nargs="*")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(args.dir or tmp)
        where.mkdir(parents=True, exist_ok=True)
        db = where / "opdb.sqlite"
        for label in args.passes.split(","):
            before = run_ids(db)
            t0 = time.monotonic()
            subprocess.run([sys.executable, "-m", "conformance", "ops", "--store", "--db", str(db)], check=True,
                           stdout=subprocess.DEVNULL)
            rc = subprocess.run([sys.executable, "-m", "conformance", "nightly", "--db", str(db), "--site",
                                 str(where / "site"), *args.nightly_args], stdout=subprocess.DEVNULL).returncode
            wall = time.monotonic() - t0
            print(f"{label} nightly: {wall / 60:.1f} min wall (exit {rc}: 0 no regressions, 1 regressions found)")
            for line in phases(db, before):
                print(line)
            if rc not in (0, 1):
                sys.exit(rc)


if __name__ == "__main__":
    main()
