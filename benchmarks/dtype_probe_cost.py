"""What the dtype probe (variant ``dtypes``, ``conformance.sweep.dtypes``) costs: the same OpInfo
sweep without and with it, one after the other, and what it finds.

Prints each run's wall time and the worker-seconds of its OpInfo groups (``group_times``: the
figure the ETA prices, less sensitive to start-up than the wall), their ratio, how many groups hold
the probe alone (the dtypes the OpInfos do not claim), the probe's own share of the run with it
(its items' time in the groups that hold samples too, plus the whole of the groups that hold it
alone: measured inside one run, so a load that changes between the two runs does not enter it),
the probe items by status, and every failing probe with its error.

Example (the README's figure: the whole OpInfo database, three dtypes, on 2.33.0)::

    python benchmarks/dtype_probe_cost.py --build 2.33.0 --dtypes float32,bfloat16,int64
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import sqlite_utils

# every variant but the probe (reference items run only with --reference-inputs, off here)
WITHOUT = "function,inplace,out,backward,sparse_coo,sparse_csr,sparse_csc,sparse_bsr,sparse_bsc"


def run(db: Path, a: argparse.Namespace, probe: bool) -> float:
    variants = (a.variants or WITHOUT) + (",dtypes" if probe else "")
    cmd = [sys.executable, "-m", "conformance", "run", "--target", "neuron-emu", "--quiet", "--exit-zero",
           "--no-schema", "--refcache", "none", "-n", str(a.workers), "--db", str(db), "--sizes", a.sizes,
           "--build", a.build, "--dtypes", a.dtypes, "--variants", variants,
           *(x for op in (a.ops or ["*"]) for x in ("--ops", op))]
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    took = time.perf_counter() - t
    if proc.returncode not in (0, 1):
        sys.exit(f"dtype_probe_cost: {' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return took


def worker_seconds(db: Path) -> tuple[float, int]:
    return tuple(sqlite_utils.Database(db).execute(
        "select coalesce(sum(wall_s), 0), count(*) from group_times where kind = 'opinfo'").fetchone())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="2.33.0")
    ap.add_argument("--dtypes", default="float32,bfloat16,int64")
    ap.add_argument("--variants", default="", help=f"the sweep's variants without the probe (default: {WITHOUT})")
    ap.add_argument("--sizes", default="samples", help="as for conformance run")
    ap.add_argument("--ops", action="append", default=[], help="OpInfo globs (default: every OpInfo)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--keep", default="", metavar="DIR", help="keep the two databases there")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(a.keep or tmp)
        where.mkdir(parents=True, exist_ok=True)
        dbs = {p: where / f"{'with' if p else 'without'}_probe.sqlite" for p in (False, True)}
        wall = {p: run(dbs[p], a, p) for p in dbs}
        work = {p: worker_seconds(dbs[p]) for p in dbs}
        d = sqlite_utils.Database(dbs[True])
        # inside the run with the probe, which a loaded machine slows as much as the rest: the probe
        # items of the groups that hold samples too, and the whole of the groups that hold it alone
        alone = ("select op || '|' || dtype from op_results group by op, dtype "
                 "having sum(coalesce(variant, '') != 'dtypes') = 0")
        riding = d.execute(f"select coalesce(sum(duration_s), 0) from op_results where variant = 'dtypes' "
                           f"and op || '|' || dtype not in ({alone})").fetchone()[0]
        alone_s = d.execute(f"select coalesce(sum(wall_s), 0) from group_times where kind = 'opinfo' "
                            f"and group_key in ({alone})").fetchone()[0]
        statuses = d.execute("select status, count(*) from op_results where variant = 'dtypes' group by status "
                             "order by count(*) desc").fetchall()
        failing = d.execute("select op, dtype, status, error from op_results where variant = 'dtypes' and status not in "
                            "('pass', 'pass_fallback', 'skip', 'xfail') order by op, dtype").fetchall()
    print(f"without the probe: {wall[False]:.1f} s wall, {work[False][0]:.1f} worker-s in {work[False][1]} OpInfo groups")
    print(f"with the probe: {wall[True]:.1f} s wall, {work[True][0]:.1f} worker-s in {work[True][1]} OpInfo groups "
          f"({work[True][1] - work[False][1]} hold the probe alone)")
    print(f"the two runs: {work[True][0] / work[False][0]:.3f}x the worker-s, {wall[True] / wall[False]:.3f}x the wall")
    print(f"the probe costs {100 * (riding + alone_s) / work[True][0]:.1f}% of the run's worker-s "
          f"(its items in groups with samples {riding:.1f} s, the groups holding it alone {alone_s:.1f} worker-s)")
    print("probe items: " + ", ".join(f"{s} {n}" for s, n in statuses))
    for op, dtype, status, error in failing:
        print(f"  {op} {dtype}: {status}: {(error or '')[:200]}")


if __name__ == "__main__":
    main()
