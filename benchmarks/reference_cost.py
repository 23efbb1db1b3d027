"""What the ``reference`` variant costs: the same OpInfo sweep without and with every OpInfo's
reference inputs (``--reference-inputs none`` / ``all``), one after the other, and what it finds.

Prints each run's wall time and the worker-seconds of its OpInfo groups (``group_times``: the
figure the ETA prices, less sensitive to start-up than the wall), their ratio, the share one
night's slice adds (``--nights N``: a N-th of the variant, over the run without it), the reference
items and how many of them fail, and the op x dtype pairs only reference items flag.

Example (the README's figure: the whole OpInfo database, float32, on 2.33.0)::

    python benchmarks/reference_cost.py --build 2.33.0 --dtypes float32 --variants function
    python benchmarks/reference_cost.py --build 2.33.0 --dtypes float32      # a night's variants and sizes
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import sqlite_utils

PASSED = ("pass", "pass_fallback", "skip", "xfail")


def run(db: Path, a: argparse.Namespace, reference: str) -> float:
    variants = a.variants + ",reference" if a.variants and reference != "none" else a.variants
    cmd = [sys.executable, "-m", "conformance", "run", "--target", "neuron-emu", "--quiet", "--exit-zero",
           "--no-schema", "--refcache", "none", "-n", str(a.workers), "--db", str(db), "--reference-inputs", reference,
           "--sizes", a.sizes, *(("--build", a.build) if a.build else ()), *(("--dtypes", a.dtypes) if a.dtypes else ()),
           *(("--variants", variants) if variants else ()), *(x for op in a.ops for x in ("--ops", op))]
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    took = time.perf_counter() - t
    if proc.returncode not in (0, 1):
        sys.exit(f"reference_cost: {' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return took


def worker_seconds(db: Path) -> float:
    return sqlite_utils.Database(db).execute(
        "select coalesce(sum(wall_s), 0) from group_times where kind = 'opinfo'").fetchone()[0]


def failing_pairs(db: Path, reference: bool) -> set[tuple[str, str]]:
    marks = ", ".join("?" for _ in PASSED)
    return {tuple(r) for r in sqlite_utils.Database(db).execute(
        f"select distinct op, dtype from op_results where status not in ({marks}) and variant "
        f"{'=' if reference else '!='} 'reference' and variant != 'canary'", list(PASSED)).fetchall()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="2.33.0")
    ap.add_argument("--dtypes", default="float32")
    ap.add_argument("--variants", default="", help="as for conformance run (default: all of them)")
    ap.add_argument("--sizes", default="samples", help="as for conformance run")
    ap.add_argument("--ops", action="append", default=[])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--nights", type=int, default=0, help="the nightly's N (default: conformance.select's)")
    a = ap.parse_args()
    if not a.nights:
        from conformance.select import REFERENCE_NIGHTS

        a.nights = REFERENCE_NIGHTS
    with tempfile.TemporaryDirectory() as tmp:
        dbs = {r: Path(tmp) / f"{r}.sqlite" for r in ("none", "all")}
        wall = {r: run(dbs[r], a, r) for r in dbs}
        work = {r: worker_seconds(dbs[r]) for r in dbs}
        d = sqlite_utils.Database(dbs["all"])
        items, failing = d.execute("select count(*), sum(status not in (?, ?, ?, ?)) from op_results "
                                   "where variant = 'reference'", list(PASSED)).fetchone()
        only = failing_pairs(dbs["all"], True) - failing_pairs(dbs["all"], False)
    added = work["all"] / work["none"] - 1
    print(f"without reference inputs: {wall['none']:.1f} s wall, {work['none']:.1f} worker-s of OpInfo groups")
    print(f"with every op's reference inputs: {wall['all']:.1f} s wall, {work['all']:.1f} worker-s of OpInfo groups")
    print(f"reference variant adds {added:.2f}x the OpInfo sweep (worker-s; wall {wall['all'] / wall['none'] - 1:.2f}x); "
          f"one slice of {a.nights} nights adds {100 * added / a.nights:.1f}%")
    print(f"reference items {items}, failing {failing or 0}; op x dtype pairs only reference items flag: {len(only)} "
          f"({', '.join(sorted(f'{op} {dt}' for op, dt in only)[:12])})")


if __name__ == "__main__":
    main()
