"""Gate time for two runs of N op results each (no re-runs: those are timed by the nightly).

The candidate differs from the baseline in a few hundred items (status regressions and
improvements) and in one op whose error drifts, so every path of the comparison is exercised.

Example: python benchmarks/bench_gate.py --rows 200000 --repeat 3
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from conformance.gate.core import run_gate
from opdb import Store


def _rows(run: str, n: int, rng: random.Random, candidate: bool) -> list[dict]:
    rows = []
    for i in range(n):
        op = f"op{i % 700}"
        status, err = "pass", rng.uniform(1e-7, 1e-6)
        if candidate and i % 997 == 0:
            status = "mismatch"
        if candidate and i % 1999 == 1:
            status = "pass_fallback"
        if candidate and op == "op5":
            err *= 8  # drift inside tolerance
        rows.append({"run_id": run, "item_key": f"{op}|function|float32|{i}", "op": op, "variant": "function",
                     "dtype": "float32", "sample": i, "status": status, "max_abs_err": err, "max_rel_err": err})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as d:
        db = Path(d) / "g.sqlite"
        with Store.open(db) as st:
            for name, cand in (("base", False), ("cand", True)):
                st.start_run(target="t", build=name, torch_version="2.13", config={}, run_id=name)
                st.insert("op_results", _rows(name, args.rows, rng, cand), batch_size=2000)
                st.finish_run(name)
            times = []
            for _ in range(args.repeat):
                t = time.perf_counter()
                result = run_gate(st, "base", "cand", attempts=0)
                times.append(time.perf_counter() - t)
    print(f"gate over two runs of {args.rows:,} op results: median {statistics.median(times):.2f} s "
          f"(runs: {', '.join(f'{x:.2f}' for x in times)}); verdict {result.verdict}, "
          f"{len(result.of('regression'))} regressions, {len(result.of('drift'))} drifting ops, "
          f"{len(result.of('improvement'))} improvements")


if __name__ == "__main__":
    main()
