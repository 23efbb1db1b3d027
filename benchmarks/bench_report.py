"""Benchmark of ``conformance report``: render time and page sizes at scale.

Builds a synthetic opdb (default: 200,000 op results and 2,000 model results over 2 builds, with
coverage, a catalog and gate decisions), renders the site 3 times and prints the median render
time, the site size and the largest page.

    python benchmarks/bench_report.py                      # 2 builds x 100k op results
    python benchmarks/bench_report.py --builds 1           # one build holding all 200k
    python benchmarks/bench_report.py --results 50000 --repeat 1 --keep /tmp/site

Target: <= 10 s render on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opdb import Store  # noqa: E402
from reports import render_site  # noqa: E402
from reports.site import default_jobs  # noqa: E402

TV = "2.13.0+cpu"
STATUSES = ["pass", "pass_fallback", "mismatch", "error", "unsupported_dtype", "skip", "xfail", "xpass",
            "timeout", "crash"]
WEIGHTS = [60, 25, 6, 2, 3, 2, 1, 0.3, 0.4, 0.3]
DTYPES = ["float32", "bfloat16", "float16", "int64"]
VARIANTS = ["function", "function", "function", "inplace", "out"]
CLASSES = ["functional", "inplace", "out", "view", "core", "composite_explicit", "private", "random"]
TOL = ["ledger.toml:default[0] (bf16 results round once more on the device than on the CPU)",
       "ledger.toml:default[2] (transcendentals keep 14+ mantissa bits on the Scalar engine)", "exact (int64)"]


def build_db(path: Path, *, results: int, models: int, builds: int, n_ops: int, seed: int) -> None:
    rnd = random.Random(seed)
    overloads = [f"aten::op{i}.{'default' if i % 3 else 'Tensor'}" for i in range(3000)]
    opinfos = [("nn.functional." if i % 2 else "") + f"op_{i}" for i in range(n_ops)]
    reach = {op: rnd.sample(overloads, rnd.randint(1, 6)) for op in opinfos}
    with Store.open(path) as st:
        st.insert("ops", [{"torch_version": TV, "name": n, "op": n.split(".")[0], "overload": n.split(".")[1],
                           "schema": "", "tags": "[]",
                           "classes": json.dumps(rnd.sample(CLASSES, rnd.randint(1, 3))),
                           "opinfos": json.dumps([o for o in opinfos[:200] if n in reach[o]])}
                          for n in overloads], batch_size=2000)
        per_build = results // builds
        models_per_build = models // builds
        prev = None
        for b in range(builds):
            build = f"2.{30 + b}.0"
            rid, mid = f"ops-{build}", f"models-{build}"
            day = f"2026-11-{b + 1:02d}T10:00:00+00:00"
            st.insert("runs", [{"id": rid, "target": "neuron-emu", "build": build, "torch_version": TV,
                                "host": "bench", "git_sha": "x", "started_at": day, "finished_at": day,
                                "status": "finished", "kind": "ops", "config": "{}"},
                               {"id": mid, "target": "neuron-emu", "build": build, "torch_version": TV,
                                "host": "bench", "git_sha": "x", "started_at": day, "finished_at": day,
                                "status": "finished", "kind": "models", "config": "{}"}])
            rows = []
            per_op = max(1, per_build // n_ops)
            i = 0
            while len(rows) < per_build:
                op = opinfos[i % n_ops]
                k = i // n_ops
                i += 1
                for s in range(per_op):
                    if len(rows) >= per_build:
                        break
                    status = rnd.choices(STATUSES, WEIGHTS)[0]
                    dtype = DTYPES[s % 4]
                    variant = VARIANTS[(s // 4) % 5]
                    ovl = reach[op]
                    fb = status == "pass_fallback"
                    rel = 0.0 if status == "pass" else 10 ** rnd.uniform(-8, 0)
                    rows.append({
                        "run_id": rid, "item_key": f"{op}|{variant}|{dtype}|{k}-{s}", "op": op, "variant": variant,
                        "dtype": dtype, "sample": s, "status": status,
                        "error": (f"<script>alert({s})</script> RuntimeError: failed at {op}"
                                  if status in ("error", "crash") else None),
                        "max_abs_err": rel, "max_rel_err": rel, "ulp_err": rel * 1e6, "mismatch_frac": rel,
                        "arbiter_err": rel, "cpu_arbiter_err": rel / 10, "nan_agree": 1, "dtype_ok": 1,
                        "shape_ok": 1, "stride_ok": 1, "atol": 1e-5, "rtol": 1.3e-6, "tol_source": TOL[s % 3],
                        "comparator": "allclose", "native_ops": "[]" if fb else json.dumps(ovl),
                        "fallback_ops": json.dumps(ovl[:1]) if fb else "[]", "signature": f"f32[{s},{k}]",
                        "seed": seed, "duration_s": rnd.random() / 100, "shard": "1/1",
                    })
            st.insert("op_results", rows, batch_size=1000)
            cov = []
            for n in overloads:
                state = rnd.choices(["exercised", "composite_implicit", "no_cpu_kernel", "random",
                                     "no_valid_input"], [50, 20, 10, 10, 10])[0]
                ex = state == "exercised"
                cov.append({"run_id": rid, "name": n, "state": state, "samples": 30 if ex else 0,
                            "native_samples": rnd.randint(0, 30) if ex else 0,
                            "fallback_samples": rnd.randint(0, 3) if ex else 0,
                            "failing_samples": rnd.randint(0, 1) if ex else 0,
                            "statuses": "{}", "dtypes": json.dumps(DTYPES[:3]), "sources": '["opinfo"]'})
            st.insert("coverage", cov, batch_size=1000)
            mrows = []
            for m in range(models_per_build):
                status = rnd.choices(["pass", "pass_fallback", "mismatch", "error"], [70, 15, 10, 5])[0]
                loss = [2.0 * 0.97 ** t for t in range(50)]
                mrows.append({
                    "run_id": mid, "item_key": f"m{m}|float32|compile", "model_id": f"model_{m}",
                    "family": f"family_{m % 20}", "params": '{"layers": 4}', "graph_hash": f"{m:016x}",
                    "dtype": "float32", "mode": "compile" if m % 2 else "eager", "status": status,
                    "max_abs_err": rnd.random() / 100, "max_rel_err": rnd.random() / 100,
                    "grad_max_rel_err": rnd.random() / 100,
                    "loss_curve": json.dumps({"target": [x * (1 + rnd.random() / 100) for x in loss], "cpu": loss}),
                    "native_ops": json.dumps(overloads[:20]), "fallback_ops": json.dumps(overloads[20:22]),
                    "aten_ops": "{}", "first_divergent_op": rnd.choice(overloads[:30]) if status != "pass" else None,
                    "first_divergent_detail": "rel err 0.1" if status != "pass" else None,
                    "recompiles": m % 3, "compile_s": 1.0, "p50_ms": 2.0, "p99_ms": 5.0,
                    "shapes": json.dumps([{"shape": f"[{2 ** j}, 64]", "recompiles": j % 2, "p50_ms": 2.0 + j,
                                           "p99_ms": 4.0 + j} for j in range(4)]),
                    "duration_s": 1.0})
            st.insert("model_results", mrows, batch_size=1000)
            if prev:
                st.insert("gate_items", [
                    {"baseline_run": prev, "candidate_run": rid, "category": rnd.choice(["regression", "improvement",
                                                                                         "flaky"]),
                     "kind": "op", "item_key": r["item_key"], "op": r["op"], "variant": r["variant"],
                     "dtype": r["dtype"], "baseline": "pass", "candidate": r["status"],
                     "evidence": '{"max_rel_err": 0.1}', "decided_at": day}
                    for r in rows[:: max(1, len(rows) // 2000)]], batch_size=1000)
            prev = rid


def _cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=int, default=200_000, help="op results in the DB (all builds)")
    ap.add_argument("--models", type=int, default=2_000, help="model results in the DB (all builds)")
    ap.add_argument("--builds", type=int, default=2)
    ap.add_argument("--ops", type=int, default=600, help="distinct OpInfo ops")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=1, help="render processes (0: one per CPU, at most 4)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", type=Path, default=None, help="leave the last site here")
    ap.add_argument("--db", type=Path, default=None,
                    help="build the DB here and keep it (reused as is when it exists)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench_report_"))
    try:
        db = args.db or tmp / "bench.sqlite"
        if db.exists():
            print(f"db: reusing {db} ({db.stat().st_size / 1e6:.0f} MB)")
        else:
            t = time.perf_counter()
            build_db(db, results=args.results, models=args.models, builds=args.builds, n_ops=args.ops,
                     seed=args.seed)
            print(f"db: {args.results:,} op results, {args.models:,} model results, {args.builds} builds "
                  f"({db.stat().st_size / 1e6:.0f} MB) built in {time.perf_counter() - t:.1f} s")
        times, cpus, result = [], [], None
        for k in range(args.repeat):
            out = tmp / f"site{k}"
            with Store.open(db) as st:
                c, t = _cpu(), time.perf_counter()
                result = render_site(st, out, db_label=str(db), jobs=args.jobs or None)
                times.append(time.perf_counter() - t)
                cpus.append(_cpu() - c)
            if k < args.repeat - 1:
                shutil.rmtree(out)
        assert result is not None
        sizes = sorted((p.stat().st_size, p) for p in result.out.rglob("*") if p.is_file())
        total = sum(s for s, _ in sizes)
        print(f"render (jobs={args.jobs or default_jobs()}): median {statistics.median(times):.2f} s of {args.repeat} "
              f"({', '.join(f'{x:.2f}' for x in times)})")
        print(f"  CPU time (all processes): median {statistics.median(cpus):.2f} s; load average before: "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        print("  by step (last run): " + ", ".join(f"{k} {v:.2f} s" for k, v in result.timings.items()))
        print(f"site: {len(sizes)} files, {total / 1e6:.1f} MB; largest page "
              f"{result.largest[0]} {result.largest[1] / 1e6:.2f} MB")
        if args.keep:
            if args.keep.exists():
                shutil.rmtree(args.keep)
            shutil.copytree(result.out, args.keep)
            print(f"site kept in {args.keep}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
