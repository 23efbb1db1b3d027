"""Would a per-group contract budget lose findings? From a stored run: for every op x variant x
dtype whose contract fails on some item, the rank of its first failing sample among the samples
the contract applied to (outcome pass or fail), and how many such groups a budget of the first K
applicable samples would still catch.

Example (a nightly database)::

    python benchmarks/contract_budget_recall.py results/opdb.sqlite
    python benchmarks/contract_budget_recall.py results/opdb.sqlite --run 20261202T101758-neuron-emu-2.31.0-7faf1e
"""

from __future__ import annotations

import argparse
import json
import sqlite3
from collections import Counter, defaultdict

KS = (1, 2, 3, 4, 5, 8, 16)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("db")
    ap.add_argument("--run", action="append", help="run id (repeatable; default: every run)")
    args = ap.parse_args()
    con = sqlite3.connect(args.db)
    runs = args.run or [r[0] for r in con.execute("select id from runs order by id")]
    for rid in runs:
        per: dict[tuple[str, str, str, str], list[tuple[int, str]]] = defaultdict(list)
        checked: Counter[str] = Counter()
        for op, variant, dtype, sample, raw in con.execute(
                "select op, variant, dtype, sample, contracts from op_results "
                "where run_id = ? and contracts is not null and variant != 'canary'", [rid]):
            for name, c in json.loads(raw).items():
                per[(op, variant, dtype, name)].append((sample, c["outcome"]))
                checked[name] += c["outcome"] != "n/a"
        caught: dict[str, Counter[int]] = defaultdict(Counter)
        total: Counter[str] = Counter()
        for (_, _, _, name), outcomes in per.items():
            applicable = sorted(s for s, o in outcomes if o != "n/a")
            failing = {s for s, o in outcomes if o == "fail"}
            if not failing:
                continue
            rank = next(i for i, s in enumerate(applicable) if s in failing)
            total[name] += 1
            for k in KS:
                caught[name][k] += rank < k
        print(f"run {rid}")
        print(f"  {'contract':14s} {'checked':>8s} {'failing groups':>15s}  caught within the first K applicable samples")
        for name in sorted(checked):
            line = " ".join(f"K={k}:{caught[name][k] / total[name]:.0%}" for k in KS) if total[name] else "-"
            print(f"  {name:14s} {checked[name]:8d} {total[name]:15d}  {line}")


if __name__ == "__main__":
    main()
