"""Bad and hostile databases against the CLI: what each one gets (a clear error, a traceback,
a silently wrong result, a hang) — the figures of issue 19's database and repro findings.

Run against any checkout (the tree on PYTHONPATH is the one measured):

    PYTHONPATH=$PWD python benchmarks/bad_inputs_db.py            # prints one row per case + totals
    PYTHONPATH=$PWD python benchmarks/bad_inputs_db.py repro      # only the cases whose name holds "repro"

A case is "correct" when the command does the right thing: one line naming the problem and exit 2
for a refusal (with no file changed, no output left, no marker written), or success without
changing its input where success is right.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from opdb import Store, schema

TIMEOUT_S = 240  # generous: a sweep on a loaded 2-core machine takes a while to start
HANG_S = 30  # `merge X X` used to wait on its own lock for 5 minutes; a refusal takes seconds


class Evil:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):  # unpickling writes the marker file
        return (open, (self.marker, "w"))


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest() if p.exists() else "-"


def cli(*args: object, cwd: Path | None = None, timeout: float = TIMEOUT_S) -> tuple[int | None, str]:
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    try:
        p = subprocess.run([sys.executable, "-m", "conformance", *map(str, args)], capture_output=True, text=True,
                           timeout=timeout, cwd=cwd, env=env)
    except subprocess.TimeoutExpired:
        return None, "(timed out)"
    return p.returncode, p.stdout + p.stderr


def valid(p: Path, *, build: str = "b1", run_id: str = "r1", rows: int = 300, **row: object) -> Path:
    with Store.open(p) as st:
        rid = st.start_run(target="cpu", build=build, torch_version=torch.__version__, config={"seed": 0},
                           run_id=run_id)
        base = {"op": "abs", "variant": "function", "dtype": "float32", "status": "pass", "atol": 1e-5, "rtol": 1e-5}
        st.insert("op_results", [{**base, **row, "run_id": rid, "item_key": f"k|{i}", "sample": i}
                                 for i in range(rows)])
        st.finish_run(rid)
    return p


def garbage(p: Path) -> Path:
    p.write_bytes(bytes(range(256)) * 40)
    return p


def truncated(p: Path) -> Path:
    valid(p)
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    return p


def damaged(p: Path) -> Path:
    valid(p)
    data = bytearray(p.read_bytes())
    for i in range(4096, len(data), 7):
        data[i] = 0xA5
    p.write_bytes(bytes(data))
    return p


def damaged_deep(p: Path) -> Path:
    valid(p, rows=3000)  # the schema pages stay sound; queries hit the garbled ones
    data = bytearray(p.read_bytes())
    for i in range(len(data) * 2 // 3, len(data), 5):
        data[i] = 0xA5
    p.write_bytes(bytes(data))
    return p


def journal(p: Path, mode: str) -> None:
    c = sqlite3.connect(p)
    c.execute(f"PRAGMA journal_mode = {mode}")
    c.close()


def newer(p: Path) -> Path:
    valid(p)
    journal(p, "DELETE")
    c = sqlite3.connect(p)
    c.execute(f"PRAGMA user_version = {schema.SCHEMA_VERSION + 5}")
    c.close()
    return p


def older(p: Path) -> Path:
    import sqlite_utils

    db = sqlite_utils.Database(p)
    schema.MIGRATIONS[0](db)
    db.execute("PRAGMA user_version = 1")
    db["runs"].insert({"id": "r1", "target": "cpu", "build": "b", "torch_version": torch.__version__,
                       "status": "finished", "kind": "ops", "config": "{}", "started_at": "2026-01-01"})
    db.conn.close()
    return p


def blob(value: object) -> bytes:
    try:
        from opdb.blobs import dump_inputs
    except ImportError:  # the tree before the safe format
        buf = io.BytesIO()
        torch.save(value, buf)
        return buf.getvalue()
    return dump_inputs(value)


def refusal(code: int | None, out: str, *, names: str = "") -> str:
    if code is None:
        return "hang"
    if "Traceback" in out:
        return "traceback"
    lines = [ln for ln in out.splitlines() if ln.strip()]
    if code == 2 and len(lines) == 1 and (not names or names in out):
        return "clear error"
    return "silently wrong"


def case_db_refused(kind: Callable[[Path], Path], cmd: str) -> Callable[[Path], str]:
    def run(tmp: Path) -> str:
        bad = kind(tmp / "bad.sqlite")
        before = sha(bad)
        good = valid(tmp / "good.sqlite")
        args = {"run": ("run", "--target", "cpu", "--ops", "abs", "--dtypes", "float32", "--max-samples", "1",
                        "-n", "1", "--quiet", "--db", bad),
                "report": ("report", "--db", bad, "--out", tmp / "site"),
                "gate": ("gate", "--db", bad, "--baseline", "r0", "--candidate", "r1", "--reruns", "0"),
                "merge": ("merge", tmp / "out.sqlite", good, bad)}[cmd]
        verdict = refusal(*cli(*args), names=str(bad))
        if verdict == "clear error" and (sha(bad) != before or (tmp / "out.sqlite").exists()):
            return "silently wrong"  # refused, but it changed the file or left an output behind
        return verdict
    return run


def case_merge_same(args: Callable[[Path], tuple[object, ...]]) -> Callable[[Path], str]:
    def run(tmp: Path) -> str:
        a = valid(tmp / "a.sqlite")
        (tmp / "link.sqlite").symlink_to(a)
        before = sha(a)
        verdict = refusal(*cli("merge", *args(tmp), timeout=HANG_S))
        return "silently wrong" if verdict == "clear error" and sha(a) != before else verdict
    return run


def case_read_keeps(make: Callable[[Path], Path], cmd: str) -> Callable[[Path], str]:
    def run(tmp: Path) -> str:
        p = make(tmp / "in.sqlite")
        before = sha(p)
        args = {"report": ("report", "--db", p, "--out", tmp / "site"),
                "merge": ("merge", tmp / "out.sqlite", p)}[cmd]
        code, out = cli(*args)
        if code is None:
            return "hang"
        if "Traceback" in out:
            return "traceback"
        return "correct" if code == 0 and sha(p) == before else "silently wrong"
    return run


def case_report_user_folder(tmp: Path) -> str:
    db = valid(tmp / "a.sqlite")
    mine = tmp / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    verdict = refusal(*cli("report", "--db", db, "--out", mine), names=str(mine))
    return "silently wrong" if verdict != "clear error" or sorted(os.listdir(mine)) != ["notes.txt"] else verdict


def case_report_stale(tmp: Path) -> str:
    db = valid(tmp / "a.sqlite")
    cli("report", "--db", db, "--out", tmp / "site")
    (tmp / "site" / "stale.html").write_text("old page")
    code, out = cli("report", "--db", db, "--out", tmp / "site")
    if "Traceback" in out:
        return "traceback"
    return "correct" if code == 0 and not (tmp / "site" / "stale.html").exists() else "silently wrong"


def case_gate_markdown(tmp: Path) -> str:
    db = tmp / "g.sqlite"
    for rid, build, status in (("r0", "<b>base</b>", "pass"), ("r1", '<img src=x onerror="alert(1)">', "mismatch")):
        with Store.open(db) as st:
            st.start_run(target="cpu", build=build, torch_version=torch.__version__, config={}, run_id=rid)
            st.insert("op_results", [{"run_id": rid, "item_key": "abs|function|float32|0", "op": "abs",
                                      "variant": "function", "dtype": "float32", "sample": 0, "status": status}])
            st.finish_run(rid)
    code, out = cli("gate", "--db", db, "--baseline", "r0", "--candidate", "r1", "--reruns", "0",
                    "--markdown", tmp / "g.md")
    if "Traceback" in out:
        return "traceback"
    md = (tmp / "g.md").read_text() if (tmp / "g.md").exists() else ""
    return "correct" if code == 1 and md and "<img" not in md.replace("\\<img", "") else "silently wrong"


def case_fresh_checkout(tmp: Path) -> str:
    code, out = cli("run", "--target", "cpu", "--ops", "abs", "--dtypes", "float32", "--max-samples", "1", "-n", "1",
                    "--quiet", cwd=tmp)
    if code is None:
        return "hang"
    if "Traceback" in out:
        return "traceback"
    if code == 2:
        return "wrongly refused"
    return "correct" if code == 0 and (tmp / "results" / "opdb.sqlite").exists() else "silently wrong"


HOSTILE = "\"\"\";import pathlib;pathlib.Path({m!r}).write_text('pwned');\"\"\""


def case_repro_field(field: str) -> Callable[[Path], str]:
    def run(tmp: Path) -> str:
        marker = tmp / "pwned"
        evil = HOSTILE.format(m=str(marker))
        row: dict[str, object] = {"status": "mismatch"}
        build = "b1"
        if field == "build":
            build = evil
        elif field == "status":
            row["status"] = evil
        elif field == "op":
            # the old script spliced the name after "torch.ops.aten.": new lines become statements
            row.update(op=f"aten::abs.default\nimport pathlib\npathlib.Path({str(marker)!r}).write_text('pwned')\n"
                          "x = torch.ops.aten.abs.default", variant="schema",
                       inputs=blob({"args": [torch.ones(2)], "kwargs": {}}))
        db = valid(tmp / "r.sqlite", build=build, rows=1, **row)
        code, out = cli("repro", "1", "--db", db, "--out", tmp / "repro")
        if code is None:
            return "hang"
        if "Traceback" in out:
            return "traceback"
        script = tmp / "repro" / "repro_1.py"
        if code == 0 and script.exists():
            subprocess.run([sys.executable, str(script)], capture_output=True, timeout=TIMEOUT_S, cwd=tmp)
        if marker.exists():
            return "silently wrong"  # code ran
        return "clear error" if code == 2 else "correct"
    return run


def case_repro_pickle(merged: bool) -> Callable[[Path], str]:
    def run(tmp: Path) -> str:
        marker = tmp / "pwned"
        db = valid(tmp / "r.sqlite", rows=1, op="aten::abs.default", variant="schema", status="mismatch",
                   inputs=pickle.dumps({"args": [Evil(str(marker))], "kwargs": {}}))
        if merged:
            cli("merge", tmp / "m.sqlite", db)
            db = tmp / "m.sqlite"
        verdict = refusal(*cli("repro", "1", "--db", db, "--out", tmp / "repro"))
        return "silently wrong" if marker.exists() else verdict
    return run


CASES: list[tuple[str, Callable[[Path], str]]] = [
    ("merge OUT X X (same input twice)", case_merge_same(lambda t: (t / "out.sqlite", t / "a.sqlite", t / "a.sqlite"))),
    ("merge OUT X LINK-TO-X", case_merge_same(lambda t: (t / "out.sqlite", t / "a.sqlite", t / "link.sqlite"))),
    ("merge X X (output is the input)", case_merge_same(lambda t: (t / "a.sqlite", t / "a.sqlite"))),
    *[(f"{kind.__name__} database -> {cmd}", case_db_refused(kind, cmd))
      for kind in (garbage, truncated, damaged, damaged_deep) for cmd in ("run", "report", "gate", "merge")],
    *[(f"newer-schema database -> {cmd} (file unchanged)", case_db_refused(newer, cmd))
      for cmd in ("report", "gate", "merge")],
    ("older-schema database -> report (not migrated)", case_read_keeps(older, "report")),
    ("older-schema database -> merge input (not migrated)", case_read_keeps(older, "merge")),
    ("rollback-journal database -> report (no WAL switch)",
     case_read_keeps(lambda p: (valid(p), journal(p, "DELETE"))[0], "report")),
    ("rollback-journal database -> merge input (no WAL switch)",
     case_read_keeps(lambda p: (valid(p), journal(p, "DELETE"))[0], "merge")),
    ("report --out a user's non-empty folder", case_report_user_folder),
    ("report --out over a previous report (stale page)", case_report_stale),
    ("gate --markdown with HTML build names", case_gate_markdown),
    ("run on a fresh checkout (no results/)", case_fresh_checkout),
    ("repro: hostile build name (manifest name)", case_repro_field("build")),
    ("repro: hostile stored status", case_repro_field("status")),
    ("repro: hostile schema op name", case_repro_field("op")),
    ("repro: pickle with __reduce__ in inputs", case_repro_pickle(False)),
    ("repro: pickle in inputs, after merge", case_repro_pickle(True)),
]


def main() -> None:
    only = sys.argv[1] if len(sys.argv) > 1 else ""  # a substring of case names, to run a few
    totals: dict[str, int] = {}
    print(f"{'case':<58}outcome")
    cases = [(n, f) for n, f in CASES if only in n]
    for name, fn in cases:
        with tempfile.TemporaryDirectory() as d:
            try:
                outcome = fn(Path(d))
            except Exception as exc:  # noqa: BLE001 - a fixture the measured tree cannot build
                outcome = f"not measurable ({type(exc).__name__})"
        totals[outcome] = totals.get(outcome, 0) + 1
        print(f"{name:<58}{outcome}", flush=True)
    good = totals.get("clear error", 0) + totals.get("correct", 0)
    print(f"\ntried {len(cases)}: clear error {totals.get('clear error', 0)}, correct success "
          f"{totals.get('correct', 0)} (right: {good}); traceback {totals.get('traceback', 0)}; "
          f"silently wrong {totals.get('silently wrong', 0)}; wrongly refused {totals.get('wrongly refused', 0)}; "
          f"hang {totals.get('hang', 0)}")


if __name__ == "__main__":
    main()
