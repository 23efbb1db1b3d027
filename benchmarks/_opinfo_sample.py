"""What the per-item benchmarks (item_cost.py, cpu_side_share.py, refcache_share.py) share: the
options of a seeded random sample of OpInfos, and its op x dtype groups. Not a benchmark itself
(run_all.py skips modules whose name starts with ``_``)."""

from __future__ import annotations

import argparse
import random


def add_options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--ops", type=int, default=60, help="random OpInfos (seeded)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtypes", default="float32,bfloat16,int64")


def groups(args: argparse.Namespace) -> tuple[list[str], list]:
    """The chosen OpInfo names (``--ops`` of them, seeded) and their groups in the dtypes the CPU has."""
    from conformance.inputs.opinfo import by_name
    from conformance.sweep.opinfo import OPINFO
    from conformance.work import Selection

    names = sorted(by_name())
    chosen = random.Random(args.seed).sample(names, min(args.ops, len(names)))
    return chosen, OPINFO.groups(Selection(ops=tuple(chosen), dtypes=(args.dtypes,)))
