"""The model zoo's figures (#39): what each library lists, what runs, why the rest is skipped,
distinct graphs and architectures, and what an architecture costs through the per-graph protocol.

    python benchmarks/zoo_lane.py --models timm@0/12,tv@0/12,hf@0/8 --build 2.33.0 --work /tmp/zoo
    python benchmarks/zoo_lane.py --db /tmp/zoo/zoo.sqlite          # figures of runs already stored

It runs ``conformance run --models ...`` into ``WORK/zoo.sqlite`` (an interrupted run resumes: run it
again with the same arguments), then prints, per library: architectures enumerated, selected, run
(a verdict), skipped by the zoo or by the CPU, the support classes, distinct graphs and
size-blind architectures, the top skip reasons, and the per-architecture cost (seconds of worker
time for all its items: median, p90, max, total) with the run's wall time. The cost of the whole
zoo per build is the total scaled by enumerated / selected (cost grows linearly: each architecture
is its own group). Needs the ``zoo`` and ``hf`` extras; without them it says so and exits 0.
"""

from __future__ import annotations

import argparse
import collections
import json
import sqlite3
import statistics
from datetime import datetime
from pathlib import Path

from _stored_run import run_id_of, run_or_resume


def _enumerated() -> dict[str, int]:
    from conformance.models.selection import installed_libraries, zoo_specs

    return {lib: len(zoo_specs(lib)) for lib in installed_libraries()}


def _run(args: argparse.Namespace, db: Path) -> None:
    run_or_resume(db, run_id_of("zoo", args.build, args.models),
                  ["--target", "neuron-emu", "--build", args.build, "--models", args.models, "--dtypes", args.dtypes,
                   "--model-modes", args.modes, "-n", str(args.workers)])


def _reason(error: str) -> str:
    text = (error or "").removeprefix("skipped by the zoo: ")
    if text.startswith("over budget"):
        return "over the parameter budget"
    if text.startswith("CPU reference failed: "):
        return "fails on the CPU: " + text.removeprefix("CPU reference failed: ").split(":")[0]
    return text.split(":")[0][:60]


def figures(db: Path, enumerated: dict[str, int]) -> None:
    from reports.pages.support import library_of, models, summary

    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    for run in con.execute("select * from runs order by started_at"):
        rows = [dict(r) for r in con.execute("select * from model_results where run_id = ?", [run["id"]])]
        wall = (datetime.fromisoformat(run["finished_at"]) - datetime.fromisoformat(run["started_at"])).total_seconds() \
            if run["finished_at"] else float("nan")
        print(f"run {run['id']}: build {run['build']}, {len(rows)} items, {run['status']}, wall {wall:.0f} s "
              f"(started {run['started_at']})")
        recs = models(rows)
        for s in summary(recs.values()):
            n = enumerated.get(s.library)
            print(f"  {s.library}: enumerated {n if n is not None else '?'}, selected {s.models}, distinct graphs "
                  f"{s.graphs}, distinct architectures {s.topologies}; " + ", ".join(f"{c} {k}" for c, k in s.counts))
        by_model: dict[str, float] = collections.defaultdict(float)
        for r in rows:
            by_model[r["model_id"]] += r["duration_s"] or 0.0
        for lib in sorted({library_of(m) for m in by_model}):
            ran = sorted(t for (m, _), rec in recs.items() if library_of(m) == lib and rec["support"] != "skipped"
                         for t in [by_model[m]])
            if ran:
                p90 = ran[min(len(ran) - 1, int(0.9 * len(ran)))]
                print(f"  cost {lib}: {len(ran)} run, per architecture median {statistics.median(ran):.1f} s, "
                      f"p90 {p90:.1f} s, max {ran[-1]:.1f} s, total {sum(ran):.0f} s of worker time")
        reasons = collections.Counter(_reason(r["error"]) for r in rows if r["status"] == "skip")
        if reasons:
            print("  skipped by reason: " + "; ".join(f"{k} {n}" for k, n in reasons.most_common(10)))
        blockers = collections.Counter(r["first_divergent_op"] for r in rows
                                       if r["status"] not in ("pass", "pass_fallback", "skip") and r["first_divergent_op"])
        if blockers:
            print("  first divergent ops: " + "; ".join(f"{k} {n}" for k, n in blockers.most_common(8)))
        traced = sum(1 for r in rows if "trace_error" in json.loads(r["params"] or "{}"))
        if traced:
            print(f"  make_fx could not trace {traced} items' models (no graph hash; the protocol still ran)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="timm@0/12,tv@0/12,hf@0/8", help="a zoo selection (conformance run --models)")
    ap.add_argument("--build", default="2.33.0")
    ap.add_argument("--dtypes", default="float32")
    ap.add_argument("--modes", default="eager", help="--model-modes (eager,compile for the compile path too)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--work", type=Path, default=Path("/tmp/zoo_lane"), help="folder of the run's database")
    ap.add_argument("--db", type=Path, default=None, help="only print the figures of this database's runs")
    args = ap.parse_args()
    try:
        enumerated = _enumerated()
    except Exception as exc:  # noqa: BLE001 - a broken install says why
        enumerated = {}
        print(f"zoo libraries not importable: {type(exc).__name__}: {exc}")
    if not enumerated:
        print("the zoo needs its libraries: pip install -c constraints.txt -e '.[zoo,hf]' (nothing measured)")
        return
    print("enumerated: " + ", ".join(f"{k} {v}" for k, v in enumerated.items()) + f" ({sum(enumerated.values())})")
    db = args.db
    if db is None:
        args.work.mkdir(parents=True, exist_ok=True)
        db = args.work / "zoo.sqlite"
        _run(args, db)
    figures(db, enumerated)


if __name__ == "__main__":
    main()
