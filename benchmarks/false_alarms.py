"""False alarms: what the harness reports where nothing is wrong (issue #48).

**Part 1, ideal.** The sweep on the ``ideal`` build, the emulator as a perfect twin of the CPU
(every op the CPU's own kernel over the device's memory, no numerics rules, no defects): the
OpInfo sweep (every variant), the schema search, the model graphs' traced op calls (traced into
the database first, as the nightly does) and the model graphs. Anything that fails there is
the harness's own doing or an emulator fidelity gap. Prints the failing items per lane and
status, then every cause with its items; a cause the knowledge file (``conformance/data/causes.toml``)
explains as a known fidelity gap shows the fix it needs, any other is UNEXPLAINED.

**Part 2, A/A.** Two independent runs of one shipped build (no shared CPU results, the schema
search run afresh in each) gated against each other: regressions and flaky groups, both of
which must be 0. Also what the self-consistency re-runs cost: the items that paid them.

Examples::

    python benchmarks/false_alarms.py                   # everything (about 20 minutes on 2 cores)
    python benchmarks/false_alarms.py --quick           # a slice (a few minutes)
    python benchmarks/false_alarms.py --skip-aa --keep results/false_alarms
    python benchmarks/false_alarms.py --keep results/false_alarms --reuse   # print again, run nothing new
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

from conformance.triage import causes as ca
from opdb import Store
from opdb import queries_causes as qc
from opdb.status import FAILING, Status

# what failed on ideal before issue #48: the OpInfo groups, then the schema search's overloads
QUICK_OPS = ["tensor_split", "to", "lu", "sparse.mm.reduce", "linalg.matrix_rank", "nn.functional.linear_cross_entropy",
             "aten::_foreach_addc*", "aten::resize*", "aten::grid_sampler_2d*", "aten::_fused_adam*", "aten::kaiser*",
             "aten::_lazy_clone*", "aten::_pack_padded*", "aten::randint_like*", "aten::_log_softmax_backward*",
             "aten::_reshape_alias*", "aten::_compute_linear_combination*", "aten::_make_dep_token*"]


def conformance(*args: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "conformance", *args], check=True)
    return time.perf_counter() - t0


def selection(args: argparse.Namespace) -> list[str]:
    ops = QUICK_OPS if args.quick and not args.ops else args.ops
    out = [x for op in ops for x in ("--ops", op)]
    out += ["--dtypes", args.dtypes, "--sizes", args.sizes]
    if args.models != "none":
        out += ["--models", args.models] + (["--model-limit", str(args.model_limit)] if args.model_limit else [])
    return out


def lane(row: dict) -> str:
    if row.get("family") is not None:
        return "models"
    return row["variant"] if row.get("variant") in ("schema", "traced") else "opinfo"


def ideal(args: argparse.Namespace, folder: Path) -> int:
    db = folder / "ideal.sqlite"
    fresh = not (args.reuse and _finished(db))
    if fresh and args.models != "none" and args.sizes in ("auto", "traced", "all"):
        # the model graphs' own op calls, replayed at their sizes (the traced lane), as the nightly has them
        conformance("trace", "--models", args.models, "--model-limit", str(args.model_limit), "--db", str(db),
                    "--quiet")
    took = 0.0 if not fresh else conformance(
        "run", "--build", "ideal", *selection(args), "--db", str(db), "--exit-zero", "--quiet", "-n", str(args.workers))
    with Store.open(db) as st:
        run = next(r for r in st.runs() if r["status"] == "finished")
        rid = run["id"]
        ca.ensure(st, rid)
        ops = list(st.db.query("select * from op_results where run_id = ?", [rid]))
        models = list(st.db.query("select * from model_results where run_id = ?", [rid])) \
            if "model_results" in st.db.table_names() else []
        print(f"## ideal: run {rid} ({took:.0f} s, {args.workers} workers)")
        totals: dict[str, Counter] = defaultdict(Counter)
        for r in ops + models:
            totals[lane(r)][r["status"]] += 1
        bad = 0
        for name in ("opinfo", "schema", "traced", "models"):
            c = totals.get(name, Counter())
            fails = {s: n for s, n in c.items() if Status(s) in FAILING}
            bad += sum(fails.values())
            print(f"{name:7s} {sum(c.values()):7d} items, {sum(fails.values()):5d} failing"
                  + (f"  ({', '.join(f'{s} {n}' for s, n in sorted(fails.items()))})" if fails else ""))
        undefined = sum(1 for r in ops if '"undefined"' in (r.get("proof") or ""))
        placed = sum(1 for r in ops if '"cpu_args"' in (r.get("proof") or ""))
        unrepro = sum(1 for r in ops if r["status"] == "skip" and "not reproducible" in (r.get("error") or ""))
        print(f"self-consistency: {undefined} items compared without their undefined elements, "
              f"{unrepro} skipped as not reproducible; {placed} items with an argument kept on the CPU")
        print()
        for c in ca.run_cause_list(st, rid, history=False):
            _print_cause(st, rid, c)
        return bad


def _finished(db: Path) -> bool:
    if not db.exists():
        return False
    with Store.open(db) as st:
        return any(r["status"] == "finished" for r in st.runs())


def _print_cause(st: Store, rid: str, c: qc.CauseReach) -> None:
    owner = f" (owner: {c.owner})" if c.owner else ""
    tag = (f"known{owner}: {c.explanation}" + (f" Fix: {c.workaround}" if c.workaround else "")) if c.explanation \
        else "UNEXPLAINED"
    print(f"- {c.key} {c.items} item(s) {c.kind} at {c.locus or '-'}: {c.pattern[:160]}")
    print(f"    {tag[:700]}")
    for table in ("op_results", "model_results"):
        try:
            rows = st.db.execute(f"select item_key, status, substr(error, 1, 160) from {table} "
                                 "where run_id = ? and cause = ? limit 4", [rid, c.key]).fetchall()
        except Exception:  # noqa: BLE001 - no such table in an op-only database
            continue
        for k, s, e in rows:
            print(f"    {s:10s} {k}  {e or ''}")


def _has_run(db: Path, rid: str) -> bool:
    with Store.open(db) as st:
        return any(r["id"] == rid and r["status"] == "finished" for r in st.runs())


def aa(args: argparse.Namespace, folder: Path) -> int:
    db = folder / "aa.sqlite"
    sel = selection(args) if args.aa_same else (
        [x for op in (QUICK_OPS if args.quick else ["*", "aten::*"]) for x in ("--ops", op)]
        + ["--dtypes", args.aa_dtypes or args.dtypes, "--sizes", args.aa_sizes or args.sizes])
    if args.aa_max_samples:
        sel += ["--max-samples", str(args.aa_max_samples)]
    aa_sizes = args.aa_sizes or args.sizes
    if aa_sizes in ("auto", "traced", "all") and args.models != "none" and not (args.reuse and _finished(db)):
        conformance("trace", "--models", args.models, "--model-limit", str(args.model_limit), "--db", str(db),
                    "--quiet")  # one trace, replayed by both runs
    ids = []
    for i in (1, 2):
        rid = f"aa{i}-{args.aa_build}"
        if args.reuse and _finished(db) and _has_run(db, rid):
            took = 0.0
        else:
            took = conformance("run", "--build", args.aa_build, *sel, "--db", str(db), "--exit-zero", "--quiet",
                               "--refcache", "none", "--no-corpus", "--run-id", rid, "-n", str(args.workers))
        print(f"A/A run {i}: {rid} ({took:.0f} s)")
        ids.append(rid)
    out = folder / "aa_gate.json"
    gate = subprocess.run([sys.executable, "-m", "conformance", "gate", "--db", str(db), "--baseline", ids[0],
                           "--candidate", ids[1], "--json", str(out)], capture_output=True, text=True)
    print(gate.stdout[-3000:])
    data = json.loads(out.read_text()) if out.exists() else {}
    regressions = len(data.get("regression") or data.get("regressions") or [])
    flaky = len(data.get("flaky_groups") or [])
    print(f"A/A {args.aa_build}: gate exit {gate.returncode}, {regressions} regression finding(s), {flaky} flaky group(s)")
    return regressions + flaky + (gate.returncode != 0)


COST_OPS = ["exp", "sin", "matmul", "nn.functional.conv2d", "cumsum", "log_softmax", "linalg.norm", "addmm",
            "nn.functional.layer_norm", "sum"]


def cost(args: argparse.Namespace) -> None:
    """What the self-consistency re-runs cost a shipped build's sweep: the same groups swept in
    this process with the check off and on (interleaved, ``--cost-reps`` times, medians), and
    how many items paid for it (their values failed)."""
    import statistics

    from conformance.sweep import SweepConfig, run_group
    from conformance.targets import get_target
    from conformance.work import Group

    target = get_target("neuron-emu", args.aa_build)
    groups = [Group(op, dt) for op in args.cost_ops or COST_OPS for dt in ("float32", "bfloat16")]
    took: dict[str, list[float]] = {"off": [], "failing": []}
    rows: list[dict] = [r for g in groups for r in run_group(target, g, SweepConfig())]  # warm-up, not timed
    for rep in range(args.cost_reps):
        for mode in ("off", "failing") if rep % 2 == 0 else ("failing", "off"):  # neither always first
            cfg = SweepConfig(reference_check=mode)
            t0 = time.perf_counter()
            for g in groups:
                for _ in run_group(target, g, cfg):
                    pass
            took[mode].append(time.perf_counter() - t0)
    paid = sum(1 for r in rows if r["status"] == "mismatch" or '"undefined"' in json.dumps(r.get("proof") or {})
               or "not reproducible" in (r.get("error") or ""))
    off, on = statistics.median(took["off"]), statistics.median(took["failing"])
    print(f"self-consistency cost ({args.aa_build}, {len(groups)} groups, {len(rows)} items, {paid} paid, "
          f"medians of {args.cost_reps}): {off:.1f} s off, {on:.1f} s on, x{on / off:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", action="append", default=[], help="op globs (default: every OpInfo and overload)")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--models", default="all", help="model families, 'all', or 'none'")
    ap.add_argument("--model-limit", type=int, default=6,
                    help="graphs per family for the full per-graph protocol, as the nightly (0: the whole corpus, hours)")
    ap.add_argument("--quick", action="store_true", help="the ops that failed on ideal before, one mlp graph")
    ap.add_argument("--aa-build", default="2.33.0")
    ap.add_argument("--aa-same", action="store_true", help="A/A on part 1's selection (default: the sweep, no models)")
    ap.add_argument("--aa-dtypes", help="the A/A runs' dtypes (default: --dtypes)")
    ap.add_argument("--aa-max-samples", type=int, default=0, help="the A/A runs' samples per op x dtype (0: all)")
    ap.add_argument("--sizes", default="auto", choices=["auto", "samples", "ladder", "traced", "all"],
                    help="op items at sample sizes, on the size ladder, at the model graphs' traced calls, or all "
                         "(as conformance run)")
    ap.add_argument("--aa-sizes", choices=["auto", "samples", "ladder", "traced", "all"], help="the A/A runs' --sizes (default: --sizes)")
    ap.add_argument("--reuse", action="store_true", help="with --keep: take the finished runs already there")
    ap.add_argument("--cost", action="store_true", help="only measure what the self-consistency re-runs cost")
    ap.add_argument("--cost-ops", action="append", default=[])
    ap.add_argument("--cost-reps", type=int, default=3)
    ap.add_argument("--skip-ideal", action="store_true")
    ap.add_argument("--skip-aa", action="store_true")
    ap.add_argument("-n", "--workers", type=int, default=2)
    ap.add_argument("--keep", help="keep the databases in this folder")
    args = ap.parse_args()
    if args.quick and not args.model_limit:
        args.model_limit = 1
    if args.quick and args.models == "all":
        args.models = "mlp"
    if not args.ops and not args.quick:
        args.ops = ["*", "aten::*"]
    if args.cost:
        cost(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.keep or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        bad = 0 if args.skip_ideal else ideal(args, folder)
        alarms = 0 if args.skip_aa else aa(args, folder)
        print(f"\nfalse alarms: {bad} failing item(s) on ideal, {alarms} A/A finding(s)")


if __name__ == "__main__":
    main()
