"""Where the nightly's OpInfo phase spends its time: a seeded random sample of op x dtype groups
(every dtype) run in one process, one thread, with the nightly's settings (every variant,
``--sizes auto``, the night's reference-inputs slice, the contracts' budget), each item's time
(from the previous row to its own) summed per variant, and the size ladder's per rung.

An item's time holds everything the worker does for it: the sample's generation (the first item
of a group pays it), both calls, the comparison, the fingerprint, the contracts. The table's
shares say which variant or rung a cost cut must reach; ``--against DIR`` runs the same sample
from another checkout (``git worktree add DIR REF``; this script runs with that checkout's
package first on ``PYTHONPATH``, so the other needs no copy of it) and this one in turn, ``--reps`` times, and
prints the median of each and their ratio, so that the machine's load (shared cores drift by tens
of percent within an hour) falls on both alike.

Example::

    python benchmarks/opinfo_phase.py                                # 400 groups of 2.31.0, ~40 s
    python benchmarks/opinfo_phase.py --groups 200 --against /tmp/old --reps 3
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
import warnings
from collections import Counter
from pathlib import Path


def measure(groups: int, build: str, seed: int) -> dict[str, list[float]]:
    """{label: [seconds, items]} over the sampled groups; "(all)" is the whole."""
    import torch

    from conformance.sweep.ladder import RUNGS
    from conformance.sweep.opinfo import OPINFO, SweepConfig, run_group
    from conformance.targets import get_target
    from conformance.work import Selection

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    target = get_target("neuron-emu", build=build)
    chosen = OPINFO.groups(Selection())
    random.Random(seed).shuffle(chosen)
    chosen = chosen[:groups]
    config = SweepConfig(sizes="auto", reference_inputs="0/4", contract_budget=2)
    for g in chosen[:5]:  # first-use costs (the emulator, op_db, caches) outside the timing
        for _ in run_group(target, g, config):
            pass
    took: Counter[str] = Counter()
    items: Counter[str] = Counter()
    t_all = time.perf_counter()
    for g in chosen:
        t0 = time.perf_counter()
        for row in run_group(target, g, config):
            t1 = time.perf_counter()
            label = row.get("variant") or "?"
            if label == "ladder":  # per rung; the bisection's probes (sizes between rungs) together
                numel = int(str(row["item_key"]).rsplit("|", 1)[-1])
                label = f"ladder {numel:>9,}" if numel in RUNGS else "ladder (bisection)"
            took[label] += t1 - t0
            items[label] += 1
            t0 = t1
    out = {k: [took[k], items[k]] for k in took}
    out["(all)"] = [time.perf_counter() - t_all, sum(items.values())]
    return out


def table(got: dict[str, list[float]]) -> None:
    total = got["(all)"][0]
    print(f"{'variant / rung':20s} {'items':>7s} {'s':>7s} {'share':>6s} {'ms/item':>8s}")
    ladder_s = sum(v[0] for k, v in got.items() if k.startswith("ladder "))
    for k, (s, n) in sorted(((k, v) for k, v in got.items() if k != "(all)"), key=lambda kv: -kv[1][0]):
        print(f"{k:20s} {int(n):7d} {s:7.2f} {s / total:6.1%} {1e3 * s / max(n, 1):8.2f}")
    print(f"phase: {int(got['(all)'][1])} items in {total:.1f} s; ladder {ladder_s / total:.0%} of it")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", type=int, default=400, help="random op x dtype groups (seeded)")
    ap.add_argument("--build", default="2.31.0")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--against", default=None, help="another checkout: run it and this one in turn")
    ap.add_argument("--reps", type=int, default=3, help="with --against: runs of each")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # one run's figures (for --against)
    args = ap.parse_args()
    if args.json:
        print(json.dumps(measure(args.groups, args.build, args.seed)))
        return
    if not args.against:
        table(measure(args.groups, args.build, args.seed))
        return
    here = Path(__file__).resolve().parents[1]
    runs: dict[str, list[float]] = {"this": [], "other": []}
    for rep in range(args.reps):
        for who, root in (("other", Path(args.against).resolve()), ("this", here)):
            cmd = [sys.executable, str(Path(__file__).resolve()), "--json", "--groups",  # its code: PYTHONPATH
                   str(args.groups), "--build", args.build, "--seed", str(args.seed)]
            res = subprocess.run(cmd, cwd=root, capture_output=True, text=True,
                                 env={**os.environ, "PYTHONPATH": str(root)})
            if res.returncode:
                sys.exit(f"{who} ({root}) failed:\n{res.stderr[-2000:]}")
            s = json.loads(res.stdout.strip().splitlines()[-1])["(all)"][0]
            runs[who].append(s)
            print(f"rep {rep + 1}: {who:5s} {s:6.1f} s", flush=True)
    a, b = statistics.median(runs["other"]), statistics.median(runs["this"])
    print(f"phase (median of {args.reps}): other {a:.1f} s, this {b:.1f} s; this/other {b / a:.2f}")


if __name__ == "__main__":
    main()
