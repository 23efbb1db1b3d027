"""What backward and the schema-driven generator add to the default sweep, in one run each on
this machine, as ratios to the forward-only sweep; and the coverage the whole gives.

Three ``conformance run`` invocations on the same build and default dtypes, 2 workers:

(1) forward only: every OpInfo x dtype, variants function, inplace, out; no schema inputs;
(2) forward + backward: the same plus the backward variant (what the default sweep runs);
(3) schema-driven inputs alone: every overload no OpInfo reaches (``--ops 'aten::*'``).

(2) - (1) is the time backward adds; (3) is the time the generator adds. The schema rows of (3)
are then copied into (2)'s run and ``conformance ops --coverage`` prints the table the default
sweep (OpInfo + backward + schema) produces.

Example: python benchmarks/bench_coverage.py --build 2.33.0
"""

from __future__ import annotations

import argparse
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed(cmd: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def run_id(db: Path) -> str:
    with sqlite3.connect(db) as c:
        return c.execute("select id from runs order by started_at desc limit 1").fetchone()[0]


def graft_schema_rows(into: Path, source: Path) -> str:
    """Copy (3)'s schema rows and layout probe into (2)'s run; returns that run's id."""
    target_run, source_run = run_id(into), run_id(source)
    with sqlite3.connect(into) as c:
        cols = [r[1] for r in c.execute("pragma table_info(op_results)") if r[1] != "id"]
        names = ", ".join(cols)
        c.execute("attach ? as s", [str(source)])
        c.execute(f"insert into op_results ({names}) select {names} from s.op_results "  # noqa: S608
                  "where run_id = ? and variant = 'schema'", [source_run])
        c.execute("update op_results set run_id = ? where run_id = ?", [target_run, source_run])
        c.execute("update runs set config = (select config from s.runs where id = ?) where id = ?",
                  [source_run, target_run])
        c.execute("delete from coverage where run_id = ?", [target_run])
    return target_run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--build", default="2.33.0")
    ap.add_argument("--workers", default="2")
    ap.add_argument("--keep", default=None, help="Keep the databases in this folder.")
    args = ap.parse_args()
    base = [sys.executable, "-m", "conformance", "run", "--target", "neuron-emu", "--build", args.build,
            "-n", args.workers, "--quiet", "--exit-zero"]
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(args.keep or tmp)
        d.mkdir(parents=True, exist_ok=True)
        fwd = timed(base + ["--no-schema", "--variants", "function,inplace,out", "--db", str(d / "forward.sqlite")])
        print(f"(1) forward only (OpInfo function/inplace/out): {fwd:.1f} s", flush=True)
        bwd = timed(base + ["--no-schema", "--db", str(d / "default.sqlite")])
        print(f"(2) forward + backward: {bwd:.1f} s; backward adds {bwd - fwd:.1f} s "
              f"= {(bwd - fwd) / fwd:.2f}x the forward-only sweep", flush=True)
        sch = timed(base + ["--ops", "aten::*", "--db", str(d / "schema.sqlite")])
        print(f"(3) schema-driven inputs alone: {sch:.1f} s = {sch / fwd:.2f}x the forward-only sweep", flush=True)
        print(f"default sweep (2)+(3): {bwd + sch:.1f} s = {(bwd + sch) / fwd:.2f}x the forward-only sweep")
        rid = graft_schema_rows(d / "default.sqlite", d / "schema.sqlite")
        subprocess.run([sys.executable, "-m", "conformance", "ops", "--coverage", rid,
                        "--db", str(d / "default.sqlite")], check=False)


if __name__ == "__main__":
    main()
