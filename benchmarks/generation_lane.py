"""The generation lane's figures (#46): causal LMs and buckets covered per build, agreement and
near-tie flip rates on the clean ``ideal`` build and the shipped ones, wide flips, recompiles per
bucket on the compile path, and what the lane costs per build.

    python benchmarks/generation_lane.py --models hf@0/25 --builds ideal,2.33.0 --work /tmp/gen
    python benchmarks/generation_lane.py --db /tmp/gen/gen.sqlite        # figures of runs already stored

It runs ``conformance run --generate MODELS`` per build into ``WORK/gen.sqlite`` (float32 and
bfloat16, eager and compile, the buckets of conformance/data/generation.toml unless ``--buckets``;
an interrupted run resumes when the command is run again), then prints per build: models selected,
run and skipped (top reasons), items per status, agreement (share of identical sequences), near-tie
flips per 100 sequences, wide flips, first divergent ops, p50/p99 of the per-token decode time,
recompiles per bucket on the compile path, and the run's wall time and worker time per model.
The lane's cost for all of transformers' causal LMs per build is the worker time scaled by
enumerated / selected (each model is its own group). Needs the ``hf`` extra; says so without it.
"""

from __future__ import annotations

import argparse
import collections
import sqlite3
import statistics
from datetime import datetime
from pathlib import Path

from _stored_run import run_id_of, run_or_resume


def _run(args: argparse.Namespace, db: Path, build: str) -> None:
    run_or_resume(db, run_id_of("gen", build, args.models, args.buckets or "default"),
                  ["--target", "neuron-emu", "--build", build, "--generate", args.models, "--dtypes", args.dtypes,
                   "--gen-modes", args.modes, "-n", str(args.workers),
                   *(["--buckets", args.buckets] if args.buckets else [])])


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo = int(k)
    return s[lo] + (s[min(lo + 1, len(s) - 1)] - s[lo]) * (k - lo)


def report(db: Path, enumerated: int | None) -> None:
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    runs = con.execute("select * from runs where exists (select 1 from gen_results g where g.run_id = runs.id) "
                       "order by started_at").fetchall()
    for run in runs:
        rows = [dict(r) for r in con.execute("select * from gen_results where run_id = ?", [run["id"]])]
        models = {r["model_id"] for r in rows}
        skipped = {r["model_id"] for r in rows if r["status"] == "skip"}
        ran = [r for r in rows if r["status"] != "skip"]
        wall = (datetime.fromisoformat(run["finished_at"]) - datetime.fromisoformat(run["started_at"])).total_seconds() \
            if run["finished_at"] else float("nan")
        print(f"build {run['build']} (run {run['id']}, {run['status']}): {len(models)} models selected, "
              f"{len(models - skipped)} decoded, {len(skipped)} skipped; {len(rows)} items")
        print("  statuses: " + ", ".join(f"{k} {v}" for k, v in collections.Counter(r["status"] for r in rows).most_common()))
        seqs = sum(r["prompts"] or 0 for r in ran)
        near = sum(r["near_tie_flips"] or 0 for r in ran)
        wide = sum(r["wide_flips"] or 0 for r in ran)
        agree = [r["agreement"] for r in ran if r["agreement"] is not None]
        if agree:
            print(f"  agreement: mean {statistics.mean(agree):.3f} over {len(agree)} items ({seqs} sequences); "
                  f"near-tie flips {near} ({100 * near / max(seqs, 1):.1f} per 100 sequences); wide flips {wide}")
            for dtype in ("float32", "bfloat16"):
                sub = [r for r in ran if r["dtype"] == dtype and r["agreement"] is not None]
                if sub:
                    s = sum(r["prompts"] or 0 for r in sub)
                    print(f"    {dtype}: agreement {statistics.mean(r['agreement'] for r in sub):.3f}, near-tie "
                          f"{100 * sum(r['near_tie_flips'] or 0 for r in sub) / max(s, 1):.1f}/100, wide "
                          f"{sum(r['wide_flips'] or 0 for r in sub)}, mismatch "
                          f"{sum(r['status'] == 'mismatch' for r in sub)} of {len(sub)} items")
        ops = collections.Counter(r["first_divergent_op"] for r in ran if r["first_divergent_op"])
        if ops:
            print("  first divergent ops: " + ", ".join(f"{k} ({v})" for k, v in ops.most_common(8)))
        recompiles: dict[int, list[int]] = collections.defaultdict(list)
        for r in ran:
            if r["mode"] == "compile" and r["recompiles"] is not None:
                recompiles[r["bucket"]].append(r["recompiles"])
        if recompiles:
            print("  recompiles per bucket (compile path, median over models): "
                  + ", ".join(f"{b}: {statistics.median(v):g}" for b, v in sorted(recompiles.items())))
        p50 = [r["decode_p50_ms"] for r in ran if r["decode_p50_ms"]]
        p99 = [r["decode_p99_ms"] for r in ran if r["decode_p99_ms"]]
        if p50:
            print(f"  decode per token (target): p50 median {statistics.median(p50):.1f} ms, p99 median "
                  f"{statistics.median(p99):.1f} ms")
        per_model: dict[str, float] = collections.defaultdict(float)
        for r in rows:
            per_model[r["model_id"]] += r["duration_s"] or 0.0
        work = sum(per_model.values())
        cost = sorted(per_model.values())
        line = (f"  cost: wall {wall / 60:.1f} min, worker {work / 60:.1f} min; per model median {_pct(cost, 0.5):.0f} s, "
                f"p90 {_pct(cost, 0.9):.0f} s, max {cost[-1]:.0f} s")
        if enumerated:
            line += f"; all {enumerated} causal LMs about {work * enumerated / max(len(models), 1) / 3600:.1f} h of worker time"
        print(line)
        reasons = collections.Counter((r["error"] or "")[:90] for r in rows if r["status"] == "skip")
        for reason, n in reasons.most_common(5):
            print(f"    skipped {n}: {reason}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="hf@0/25", help="--generate selection (hf, hf@K/N, ids)")
    ap.add_argument("--builds", default="ideal,2.33.0")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--modes", default="eager,compile")
    ap.add_argument("--buckets", default=None)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--work", default="results/generation_lane")
    ap.add_argument("--db", default=None, help="report the runs stored here, run nothing")
    args = ap.parse_args()
    try:
        from conformance.generate import lms

        enumerated = len(lms.causal_types())
    except Exception as exc:  # noqa: BLE001 - no transformers: say so
        print(f"generation lane: {exc}")
        return
    if args.db:
        report(Path(args.db), enumerated)
        return
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    db = work / "gen.sqlite"
    for build in args.builds.split(","):
        _run(args, db, build)
    print(f"enumerated: {enumerated} causal LMs in transformers' causal-LM mapping; selection {args.models}")
    report(db, enumerated)


if __name__ == "__main__":
    main()
