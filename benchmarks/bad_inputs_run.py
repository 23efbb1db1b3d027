"""Bad inputs to ``conformance run``: each is tried through the real CLI and classified.

    PYTHONPATH=$PWD python benchmarks/bad_inputs_run.py

Prints one row per input and the totals: ``clear`` (exit 2, one line naming the value, nothing
written), ``traceback``, ``silent`` (ran anyway, or exited 0/1 as if the input were fine), and
``unclear`` (refused, but the line does not name the value or something was written). Two
scenario rows check exit codes rather than refusals: a resumed run that holds mismatches must
exit 1, and a zero-item run must exit 2.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

PY = sys.executable
BASE = ["--target", "cpu", "--ops", "abs", "--dtypes", "float32", "--variants", "function",
        "--max-samples", "1", "--quiet"]

# (label, extra args, text the error line must contain)
FLAGS = [
    ("--timeout nan", ["--timeout", "nan"], "nan"),
    ("--timeout 0", ["--timeout", "0"], "--timeout"),
    ("--timeout -5", ["--timeout", "-5"], "-5"),
    ("--timeout inf", ["--timeout", "inf"], "inf"),
    ("--dtypes float", ["--dtypes", "float"], "float"),
    ("--dtypes qint8", ["--dtypes", "qint8"], "qint8"),
    ("--dtypes ,", ["--dtypes", ","], "--dtypes"),
    ("--dtypes float32,nope", ["--dtypes", "float32,nope"], "nope"),
    ("--shard 5/5", ["--shard", "5/5"], "5/5"),
    ("--shard 0/3", ["--shard", "0/3"], "0/3"),
    ("--shard 3/2", ["--shard", "3/2"], "3/2"),
    ("--shard x/y", ["--shard", "x/y"], "x/y"),
    ("--shard 1/0", ["--shard", "1/0"], "1/0"),
    ("--max-samples 0", ["--max-samples", "0"], "--max-samples"),
    ("--max-samples -1", ["--max-samples", "-1"], "-1"),
]


def cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "conformance", "run", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=600, env=os.environ)


def rows_in(db: Path) -> int:
    if not db.exists():
        return -1
    import sqlite3

    con = sqlite3.connect(db)
    try:
        return sum(con.execute(f"select count(*) from {t}").fetchone()[0] for t in ("runs", "op_results"))
    except sqlite3.Error:
        return 0
    finally:
        con.close()


def classify(p: subprocess.CompletedProcess[str], must_name: str, before: int, after: int) -> tuple[str, str]:
    err = p.stderr.strip()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if "Traceback" in p.stderr or "Traceback" in p.stdout:
        return "traceback", lines[-1] if lines else ""
    if p.returncode != 2:
        return "silent", f"exit {p.returncode}: {(p.stdout.strip().splitlines() or [''])[0]}"
    line = lines[-1] if lines else ""
    if len(lines) != 1 or must_name not in line or after != before:
        return "unclear", line + ("" if after == before else " [database written]")
    return "clear", line


def flag_cases(work: Path) -> list[tuple[str, str, str]]:
    out = []
    for label, extra, must in FLAGS:
        db = work / f"flag{len(out)}.sqlite"
        base = list(BASE)
        if extra[0] in base:  # the case replaces the base's value of that option
            i = base.index(extra[0])
            del base[i:i + 2]
        p = cli([*base, *extra, "--db", str(db)], work)
        verdict, line = classify(p, must, -1, rows_in(db))
        out.append((label, verdict, line))
    return out


def run_id_cases(work: Path) -> list[tuple[str, str, str]]:
    out = []
    db = work / "runid.sqlite"
    first = cli([*BASE, "--run-id", "R1", "--db", str(db)], work)
    assert first.returncode == 0, first.stderr
    for label, extra in (("--run-id reused, other --ops", ["--ops", "neg"]),
                         ("--run-id reused, other --seed", ["--seed", "7"]),
                         ("--run-id reused, same spec", [])):
        before = rows_in(db)
        args = [*BASE, "--run-id", "R1", "--db", str(db)]
        if extra[:1] == ["--ops"]:
            args[args.index("abs")] = extra[1]
        else:
            args += extra
        p = cli(args, work)
        out.append((label, *classify(p, "R1", before, rows_in(db))))
    return out


RESUME = '''
import sys
from conformance.run import RunSpec, execute_run
m = sys.argv[2]
good = """
[build]
name = "resume-defect"
inherits = "2.33.0"
[ops]
native = ["aten::neg.default", "aten::reciprocal.default"]
[[defects]]
op = "aten::neg.default"
kind = "wrong_result"
magnitude = 0.5
"""
hang = """
[[defects]]
op = "aten::reciprocal.default"
kind = "hang"
"""
open(m, "w").write(good + hang)
def stop(line):
    # interrupted (as by a signal) once neg's group is done and its mismatches are counted, while
    # reciprocal hangs; the hang is gone when the run resumes, so the resumed part is clean
    if "mismatch=" in line and not line.startswith("[0/"):
        raise KeyboardInterrupt
s = execute_run(RunSpec(target="neuron-emu", build=m, ops=("neg", "reciprocal"), dtypes=("float32",),
                        workers=1, timeout_s=300, variants=("function", "out")), sys.argv[1], progress=stop)
open(m, "w").write(good)
print(s.run_id, s.interrupted)
'''


def resume_case(work: Path) -> tuple[str, str, str]:
    db, manifest = work / "resume.sqlite", work / "resume.toml"
    p = subprocess.run([PY, "-c", RESUME, str(db), str(manifest)], capture_output=True, text=True, timeout=900)
    run_id, interrupted = p.stdout.split()[-2:]
    if interrupted != "True":
        return ("--resume of a run holding mismatches", "n/a", "the first part was not interrupted")
    r = cli(["--resume", run_id, "--db", str(db), "--quiet", "-n", "1"], work)
    line = r.stdout.strip().splitlines()[0] if r.stdout.strip() else r.stderr.strip()[-200:]
    mismatch = [ln.strip() for ln in r.stdout.splitlines() if ln.strip().startswith("mismatch")]
    if "Traceback" in r.stderr:
        return ("--resume of a run holding mismatches", "traceback", line)
    return ("--resume of a run holding mismatches", "clear" if r.returncode == 1 and mismatch else "silent",
            f"exit {r.returncode}: {line}; {mismatch[0] if mismatch else 'no mismatch counted'}")


def zero_items_case(work: Path) -> tuple[str, str, str]:
    # --variants inplace on an op with no in-place variant: a valid selection that runs nothing
    db = work / "zero.sqlite"
    p = cli(["--target", "cpu", "--ops", "nn.functional.conv2d", "--dtypes", "float32", "--variants", "inplace",
             "--quiet", "--db", str(db)], work)
    if "Traceback" in p.stderr:
        return ("run that ends with zero items", "traceback", p.stderr.strip().splitlines()[-1])
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    ok = p.returncode == 2 and len(lines) == 1
    return ("run that ends with zero items", "clear" if ok else "silent",
            f"exit {p.returncode}: {(lines or p.stdout.strip().splitlines() or [''])[-1]}")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        rows = flag_cases(work) + run_id_cases(work) + [zero_items_case(work), resume_case(work)]
    width = max(len(r[0]) for r in rows)
    for label, verdict, line in rows:
        print(f"{label:<{width}}  {verdict:<9}  {textwrap.shorten(line, 110)}")
    counts = {v: sum(r[1] == v for r in rows) for v in ("clear", "traceback", "silent", "unclear")}
    print(f"tried {len(rows)}: clear error {counts['clear']}, traceback {counts['traceback']}, "
          f"silently wrong {counts['silent']}, unclear {counts['unclear']}")


if __name__ == "__main__":
    main()
