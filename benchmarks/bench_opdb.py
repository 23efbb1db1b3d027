"""opdb and catalog figures: catalog build time (cold, cached), batched insert throughput,
time to merge two 100k-row shard databases. Prints medians of --repeat runs.

Example: python benchmarks/bench_opdb.py --rows 100000 --repeat 3
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from opdb import Store, merge_into


def _rows(run: str, start: int, n: int) -> list[dict]:
    return [{"run_id": run, "item_key": f"op{i % 700}|function|float32|{i}", "op": f"op{i % 700}",
             "variant": "function", "dtype": "float32", "sample": i, "status": "pass",
             "max_abs_err": 1e-7, "max_rel_err": 1e-6, "ulp_err": 1.0, "atol": 1e-5, "rtol": 1.3e-6,
             "native_ops": '["aten::abs.default"]', "fallback_ops": "[]", "duration_s": 1e-4}
            for i in range(start, start + n)]


def bench_insert(tmp: Path, rows: int) -> float:
    with Store.open(tmp / f"ins-{time.monotonic_ns()}.sqlite") as st:
        run = st.start_run(target="t", build="b", torch_version="2.13", config={})
        data = _rows(run, 0, rows)
        t = time.perf_counter()
        with st.writer("op_results", batch=500) as w:
            for r in data:
                w.add(r)
        return rows / (time.perf_counter() - t)


def bench_merge(tmp: Path, rows: int) -> float:
    tag = time.monotonic_ns()
    paths = []
    for k in (1, 2):
        p = tmp / f"shard{k}-{tag}.sqlite"
        with Store.open(p) as st:
            st.start_run(target="t", build="b", torch_version="2.13", config={}, run_id="r", shard=f"{k}/2")
            st.insert("op_results", _rows("r", (k - 1) * rows, rows), batch_size=1000)
            st.finish_run("r", shard=f"{k}/2")
        paths.append(p)
    with Store.open(tmp / f"merged-{tag}.sqlite") as out:
        t = time.perf_counter()
        merge_into(out, paths)
        return time.perf_counter() - t


def bench_catalog() -> tuple[float, float]:
    code = "from conformance import catalog; ops, s = catalog.build(use_cache={}); print(s.build_s)"
    cold = float(subprocess.check_output([sys.executable, "-c", code.format(False)], text=True))
    cached = float(subprocess.check_output([sys.executable, "-c", code.format(True)], text=True))
    return cold, cached


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        ins = statistics.median(bench_insert(tmp, args.rows) for _ in range(args.repeat))
        mer = statistics.median(bench_merge(tmp, args.rows) for _ in range(args.repeat))
    cold, cached = bench_catalog()
    print(f"catalog build: cold {cold:.2f} s (incl. OpInfo map), cached {cached:.2f} s")
    print(f"opdb batched insert: {ins:,.0f} rows/s (median of {args.repeat}, {args.rows:,} rows)")
    print(f"opdb merge of two {args.rows:,}-row shard DBs: {mer:.2f} s (median of {args.repeat})")


if __name__ == "__main__":
    main()
