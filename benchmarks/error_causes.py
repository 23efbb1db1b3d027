"""Error causes over stored runs: how many causes the failing items collapse into, per target and
build, what is new and gone against the previous run of the same target (meaningful between
runs of one selection, as a nightly's builds are), what computing them costs,
and (``--sample N``) a seeded random sample of causes with some of their items, for the hand
check of purity (one real cause per group) and splits (one group per real cause).

Without ``DB`` it makes one: a small sweep of three shipped emulator builds (about two minutes).

Examples::

    python benchmarks/error_causes.py                         # a fresh small DB
    python benchmarks/error_causes.py results/opdb.sqlite     # every finished run of a DB
    python benchmarks/error_causes.py DB --sample 50 --members 4 > hand_check.txt
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from conformance.triage import causes as ca
from opdb import Store
from opdb import queries_causes as qc


def small_db(folder: Path) -> Path:
    db = folder / "causes.sqlite"
    for build in ("2.31.0", "2.32.0", "2.33.0"):
        subprocess.run([sys.executable, "-m", "conformance", "run", "--target", "neuron-emu", "--build", build,
                        "--ops", "nn.functional.*", "--ops", "aten::upsample*", "--dtypes", "float32,bfloat16",
                        "--db", str(db), "--quiet", "--exit-zero", "-n", "2"], check=True)
    return db


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("db", nargs="?", help="an opdb database (default: make a small one)")
    ap.add_argument("--sample", type=int, default=0, help="print this many random causes for a hand check")
    ap.add_argument("--members", type=int, default=3, help="items shown per sampled cause")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(args.db) if args.db else small_db(Path(tmp))
        with Store.open(db) as st:
            runs = [r for r in st.runs() if r["status"] == "finished"]
            took = []
            for r in runs:  # recompute: what a run's first `conformance errors` costs
                t0 = time.perf_counter()
                ca.compute(st, r["id"])
                took.append(time.perf_counter() - t0)
            ca.apply_knowledge(st)
            report(st, runs, took)
            if args.sample:
                hand_check(st, runs, args.sample, args.members, args.seed)


def report(st: Store, runs: list[dict], took: list[float]) -> None:
    print(f"{'target':<15} {'build':<20} {'run':<44} {'failing':>8} {'causes':>7} {'ratio':>7} {'new':>4} "
          f"{'gone':>4} {'explained':>9} {'s':>5}")
    prev: dict[str, str] = {}
    for r, s in zip(runs, took, strict=True):
        summary = qc.cause_run(st, r["id"])
        found = qc.run_causes(st, r["id"], history=False)
        keys = {c.key for c in found}
        before = prev.get(r["target"])
        new = gone = "-"
        if before is not None:
            old = set(qc.cause_keys(st, before))
            new, gone = str(len(keys - old)), str(len(old - keys))
        prev[r["target"]] = r["id"]
        ratio = f"{summary['failing'] / summary['causes']:.0f}:1" if summary["causes"] else "-"
        print(f"{r['target'][:15]:<15} {r['build'][:20]:<20} {r['id'][-44:]:<44} {summary['failing']:>8,} {summary['causes']:>7,} "
              f"{ratio:>7} {new:>4} {gone:>4} {sum(1 for c in found if c.explanation):>9} {s:>5.1f}")
    total_f = sum(qc.cause_run(st, r["id"])["failing"] for r in runs)
    total_c = sum(qc.cause_run(st, r["id"])["causes"] for r in runs)
    if runs:
        print(f"all runs: {total_f:,} failing items in {total_c:,} run x cause pairs; computing took "
              f"{statistics.median(took):.1f} s per run (median of {len(runs)})")
    if prev:
        latest = list(prev.values())
        kinds: dict[str, int] = {}
        for rid in latest:
            for c in qc.run_causes(st, rid, history=False):
                kinds[c.kind] = kinds.get(c.kind, 0) + 1
        print("causes by kind in each target's latest run: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))


def hand_check(st: Store, runs: list[dict], n: int, members: int, seed: int) -> None:
    """A seeded sample of causes of the latest run of each target, with random items of each."""
    latest = {r["target"]: r for r in runs}
    pool = [(r, c) for r in latest.values() for c in qc.run_causes(st, r["id"], history=False)]
    rng = random.Random(seed)
    chosen = rng.sample(pool, min(n, len(pool)))
    print(f"\nhand-check sample: {len(chosen)} of {len(pool)} causes (seed {seed})")
    for i, (run, c) in enumerate(chosen, 1):
        print(f"\n[{i}] {c.key} {run['target']} {run['build']}: {c.items} items, {len(c.ops)} ops, "
              f"{len(c.models)} models, dtypes {','.join(c.dtypes)}")
        print(f"    cause: {c.text()}")
        for table in ("op_results", "model_results"):
            rows = qc.cause_members(st, run["id"], table, c.key)
            for row in rng.sample(rows, min(members, len(rows))):
                print(f"    - {row['item_key']} [{row['status']}]: {(row['error'] or '')[:220]}")


if __name__ == "__main__":
    main()
