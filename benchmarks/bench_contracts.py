"""What the contract checks cost: the same op sweep with and without them, in one session.

Runs ``conformance run`` (the OpInfo sweep; with ``--schema`` also the schema-driven search, i.e.
the default sweep) alternately with the default contracts and with ``--contracts none``, ``--reps``
times each, and prints each wall time, the medians and their ratio; then, from the last run with contracts, how many op x dtype pairs each
contract flags (``fail`` on some item) and how many items each checked.

Example (a sixth of the default sweep, 2 workers, twice each way)::

    python benchmarks/bench_contracts.py --shard 1/6 --reps 2
    python benchmarks/bench_contracts.py --shard 1/6 --reps 2 --schema      # the default sweep's share
    python benchmarks/bench_contracts.py --build 2.33.0 --dtypes float32,bfloat16,int64 --reps 1 --keep /tmp/c.sqlite
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import sqlite_utils


def run(db: Path, args: argparse.Namespace, contracts: str, run_id: str) -> float:
    cmd = [sys.executable, "-m", "conformance", "run", "--target", "neuron-emu", "--quiet", "--exit-zero",
           *(() if args.schema else ("--no-schema",)), "-n", str(args.workers), "--db", str(db), "--contracts", contracts, "--run-id", run_id]
    if args.build:
        cmd += ["--build", args.build]
    if args.shard:
        cmd += ["--shard", args.shard]
    if args.dtypes:
        cmd += ["--dtypes", args.dtypes]
    for op in args.ops:
        cmd += ["--ops", op]
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    took = time.perf_counter() - t
    if proc.returncode not in (0, 1):
        sys.exit(f"bench_contracts: {' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return took


def flagged(db: Path, run_id: str) -> None:
    d = sqlite_utils.Database(db)
    pairs: dict[str, set[tuple[str, str]]] = defaultdict(set)
    outcomes: dict[str, Counter[str]] = defaultdict(Counter)
    items = Counter()
    for op, dtype, status, contracts in d.execute(
            "select op, dtype, status, contracts from op_results where run_id = ? and variant != 'canary'",
            [run_id]).fetchall():
        items[status] += 1
        for name, c in json.loads(contracts or "{}").items():
            outcomes[name][c["outcome"]] += 1
            if c["outcome"] == "fail":
                pairs[name].add((op, dtype))
    print(f"run {run_id}: statuses {dict(items)}")
    print(f"{'contract':14s} {'op x dtype flagged':>18s}  {'items pass / fail / n/a':>24s}")
    for name in ("metadata", "aliasing", "noncontiguous", "variants", "out", "errors", "determinism"):
        o = outcomes[name]
        print(f"{name:14s} {len(pairs[name]):18d}  {o['pass']:8d} / {o['fail']:5d} / {o['n/a']:5d}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="")
    ap.add_argument("--shard", default="", metavar="K/N")
    ap.add_argument("--dtypes", default="")
    ap.add_argument("--ops", action="append", default=[])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--schema", action="store_true",
                    help="the default sweep as a nightly runs it (with the schema-driven search), not OpInfo alone")
    ap.add_argument("--keep", default="", help="keep the database of the runs here")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(a.keep) if a.keep else Path(tmp) / "bench.sqlite"
        times: dict[str, list[float]] = {"default": [], "none": []}
        stamp = time.strftime("%Y%m%dT%H%M%S")
        for rep in range(a.reps):
            for mode in (("none", "default") if rep % 2 else ("default", "none")):
                took = run(db, a, mode, f"bench-{stamp}-{mode}-{rep + 1}")
                times[mode].append(took)
                print(f"rep {rep + 1}: contracts {mode:7s} {took:7.1f} s", flush=True)
        with_c, without = statistics.median(times["default"]), statistics.median(times["none"])
        print(f"median with contracts {with_c:.1f} s, without {without:.1f} s: "
              f"contracts add {100 * (with_c / without - 1):.0f}%")
        flagged(db, f"bench-{stamp}-default-{a.reps}")


if __name__ == "__main__":
    main()
