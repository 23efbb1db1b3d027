"""The emulator's meta-dtype cache (``neuron_emu.dispatch._META_DTYPES``): every OpInfo item of
the int64, float64 and int32 groups on one build, swept without the cache and with it (emptied first), after
an untimed warm-up sweep, in one process, one thread; prints both times and every item whose row differs (random-op statistics
and a few LAPACK last bits also differ between two uncached sweeps).

Example::

    python benchmarks/emu_meta_cache.py --build 2.33.0
"""

from __future__ import annotations

import argparse
import time
import warnings
from collections import Counter

import torch

import neuron_emu.dispatch as dispatch
from conformance.sweep.opinfo import OPINFO, SweepConfig, run_group
from conformance.targets import get_target
from conformance.work import Selection

VOLATILE = {"duration_s", "proof", "recorded_at"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="2.33.0")
    ap.add_argument("--dtypes", default="int64,float64,int32")
    ap.add_argument("--ops", default="", help="only OpInfos whose name starts with this (a glob prefix)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    target = get_target("neuron-emu", build=args.build)
    groups = OPINFO.groups(Selection(ops=(f"{args.ops}*",), dtypes=(args.dtypes,)))  # the dtypes the CPU has
    config = SweepConfig(contracts=("none",))

    def sweep() -> tuple[dict[str, dict], float]:
        t0 = time.perf_counter()
        rows = {r["item_key"]: {k: v for k, v in r.items() if k not in VOLATILE}
                for g in groups for r in run_group(target, g, config)}
        return rows, time.perf_counter() - t0

    sweep()  # warm-up (first calls, lazy imports), untimed
    with_cache = dispatch._meta_dtypes
    dispatch._meta_dtypes = dispatch._meta_dtypes_uncached
    try:
        plain, t_plain = sweep()
    finally:
        dispatch._meta_dtypes = with_cache
    dispatch._META_DTYPES.clear()  # the cached sweep starts empty, as a worker does
    cached, t_cached = sweep()
    entries = len(dispatch._META_DTYPES)
    print(f"{len(cached)} items: cached {t_cached:.1f} s ({entries} cache entries), uncached {t_plain:.1f} s "
          f"(ratio {t_cached / t_plain:.2f})")
    diff = [k for k in cached if cached[k] != plain.get(k)]
    fields = Counter(f for k in diff for f in cached[k] if cached[k].get(f) != plain[k].get(f))
    print(f"items whose row differs: {len(diff)}; fields: {dict(fields)}")
    for k in diff:
        changed = {f: (cached[k].get(f), plain[k].get(f)) for f in cached[k] if cached[k].get(f) != plain[k].get(f)}
        print(f"  {k}: {str(changed)[:240]}")


if __name__ == "__main__":
    main()
