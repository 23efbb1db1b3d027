"""The recall of each contract under its budget, against checking every sample.

From runs stored with every sample checked (``--contract-budget all``), replays the budget the
sweep applies (:class:`conformance.check.contracts.Budget`: per op x variant x dtype, the first K
samples a budgeted contract is offered, then each sample of a new shape class) over the stored
outcomes and signatures, and prints per contract and K:

- groups: op x variant x dtype x run groups where the contract fails on some sample;
- recall: the share of those groups in which the budget still checks a failing sample (so the
  group still shows the failure);
- items: the share of failing items the budget checks (a sampled-out failing item passes);
- checks: the share of offered samples the budget checks (what it saves).

Contracts outside ``BUDGETED`` run on every sample they apply to: recall 100 % by construction.

Example (three builds swept with every sample checked)::

    for b in 2.31.0 2.32.0 2.33.0; do
      conformance run --build $b --no-schema --contract-budget all --db exhaustive.sqlite; done
    python benchmarks/contract_budget_recall.py exhaustive.sqlite
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import subprocess
import sys
from collections import defaultdict

from conformance.check.contracts import BUDGETED, SAMPLED_OUT, Budget

KS = (1, 2, 4, 8)
#: Outcomes that say the check made no call on the item (the sweep does not count them).
NOT_OFFERED = ("no input with two or more elements", "no method, in-place, out= variant or alias")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("db", help="a database of runs swept with --contract-budget all (made first with --sweep)")
    ap.add_argument("--run", action="append", help="run id (repeatable; default: every run)")
    ap.add_argument("--k", default=",".join(map(str, KS)), help="budgets to replay")
    ap.add_argument("--sweep", metavar="GLOB", action="append",
                    help="first sweep these OpInfos on every shipped build into DB, every sample checked")
    ap.add_argument("--dtypes", default="float32,bfloat16,int64", help="with --sweep")
    args = ap.parse_args()
    ks = [int(k) for k in args.k.split(",")]
    if args.sweep:
        for build in ("2.31.0", "2.32.0", "2.33.0"):
            cmd = [sys.executable, "-m", "conformance", "run", "--build", build, "--no-schema", "--contract-budget",
                   "all", "--dtypes", args.dtypes, "--quiet", "--exit-zero", "--db", args.db, "--refcache", "none",
                   *[x for g in args.sweep for x in ("--ops", g)]]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    con = sqlite3.connect(args.db)
    runs = args.run or [r[0] for r in con.execute("select id from runs order by id")]
    # (run, op, variant, dtype) -> [(sample, signature, {contract: outcome})], in sample order
    groups: dict[tuple[str, str, str, str], list[tuple[int, str, dict[str, str]]]] = defaultdict(list)
    for rid in runs:
        for op, variant, dtype, sample, sig, raw in con.execute(
                "select op, variant, dtype, sample, signature, contracts from op_results "
                "where run_id = ? and contracts is not null and variant != 'canary' order by op, variant, dtype, sample",
                [rid]):
            outcomes = {}
            for name, c in json.loads(raw).items():
                if c.get("detail") == SAMPLED_OUT:
                    sys.exit(f"run {rid} was swept with a contract budget ({op} {variant} {dtype} sample {sample}): "
                             "replaying one needs every sample checked (conformance run --contract-budget all)")
                if name in BUDGETED and not any(c.get("detail", "").startswith(p) for p in NOT_OFFERED):
                    outcomes[name] = c["outcome"]
            if outcomes:
                groups[(rid, op, variant, dtype)].append((sample, sig or "", outcomes))
    print(f"{len(runs)} runs, {len(groups)} op x variant x dtype groups with a budgeted contract offered")
    print(f"{'contract':14s} {'K':>3s} {'failing groups':>15s} {'recall':>8s} {'failing items checked':>22s} "
          f"{'checks kept':>12s}")
    for name in BUDGETED:
        for k in ks:
            failing = caught = items_failing = items_caught = offered = checked = 0
            for (_, _, variant, _), rows in groups.items():
                budget = Budget(k)
                hit = any_fail = False
                for sample, sig, outcomes in rows:
                    if name not in outcomes:
                        continue
                    offered += 1
                    wanted = budget.wants(name, variant, sample, sig)
                    checked += wanted
                    if outcomes[name] == "fail":
                        any_fail = True
                        items_failing += 1
                        items_caught += wanted
                        hit = hit or wanted
                failing += any_fail
                caught += hit
            print(f"{name:14s} {k:3d} {failing:15d} {caught / max(failing, 1):8.1%} "
                  f"{items_caught / max(items_failing, 1):22.1%} {checked / max(offered, 1):12.1%}")


if __name__ == "__main__":
    main()
