"""What the shared CPU side saves the second build of a nightly, and that it changes no verdict.

In one process, one thread, on the emulator, over the same random OpInfos (seeded):

1. build A with an empty reference cache (conformance.check.refcache): the first build of a
   nightly, which fills it (and pays for the digests and writes);
2. build B without a cache;
3. build B with the cache build A filled: what the second and third builds of a nightly pay.

Prints each pass's time, the cache's hits and size, and the rows of (2) and (3) compared field by
field (statuses, errors, evidence, fingerprints, contracts): they must be identical.

Example::

    python benchmarks/refcache_share.py                      # 60 random OpInfos, forward variants
    python benchmarks/refcache_share.py --ops 677 --dtypes float32,bfloat16,int64
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import _opinfo_sample
import torch

from conformance.check import refcache
from conformance.sweep.opinfo import SweepConfig, run_group
from conformance.targets import get_target

VOLATILE = ("duration_s",)


def sweep(build: str, groups: list, config: SweepConfig) -> tuple[float, list[dict]]:
    target = get_target("neuron-emu", build=build)
    t0 = time.perf_counter()
    rows = [r for g in groups for r in run_group(target, g, config)]
    return time.perf_counter() - t0, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _opinfo_sample.add_options(ap)
    ap.add_argument("--variants", default="function,inplace,out")
    ap.add_argument("--contracts", default="default")
    ap.add_argument("--builds", default="2.32.0,2.33.0", help="A,B")
    ap.add_argument("--reps", type=int, default=3, help="passes of build B without and with the cache (medians)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    a, b = args.builds.split(",")
    chosen, groups = _opinfo_sample.groups(args)
    base = dict(variants=tuple(args.variants.split(",")), contracts=(args.contracts,))
    sweep(b, groups[:3], SweepConfig(**base))  # first-use costs outside the timings
    with tempfile.TemporaryDirectory() as d:
        path = str(Path(d) / "refs.sqlite")
        cached = SweepConfig(**base, refcache=path)
        t_fill, _ = sweep(a, groups, cached)
        filled = refcache.open_cache(path)
        stored, size = filled.stored, filled._disk
        plains, warms = [], []
        for _ in range(args.reps):  # alternating, so that a load change hits both alike
            t, plain = sweep(b, groups, SweepConfig(**base))
            plains.append(t)
            filled.hits = filled.misses = 0
            t, warm = sweep(b, groups, cached)
            warms.append(t)
            hits, misses = filled.hits, filled.misses
        t_plain, t_warm = statistics.median(plains), statistics.median(warms)
    print(f"{len(groups)} op x dtype groups of {len(chosen)} OpInfos ({args.dtypes}; {args.variants}; "
          f"contracts {args.contracts}), {len(plain)} items, 1 thread")
    print(f"build {a}, filling the cache: {t_fill:.2f} s; {stored} references stored, {size / 1e6:.1f} MB")
    print(f"build {b} without the cache:  {t_plain:.2f} s (median of {args.reps})")
    print(f"build {b} with it:            {t_warm:.2f} s = {t_warm / t_plain:.3f}x; "
          f"{hits} CPU-side values taken from it, {misses} computed")
    diff = [(x["item_key"], k) for x, y in zip(plain, warm, strict=True) for k in sorted(set(x) | set(y))
            if k not in VOLATILE and x.get(k) != y.get(k)]
    print(f"rows differing between the two build-{b} passes: {len({k for k, _ in diff})} "
          f"(fields: {sorted({f for _, f in diff})[:8]})")
    by_key = {x["item_key"]: (x, y) for x, y in zip(plain, warm, strict=True)}
    for key in sorted({k for k, _ in diff})[:5]:
        x, y = by_key[key]
        print(f"  {key}: without: {x['status']} {str(x.get('error'))[:150]!r}; with: {y['status']} {str(y.get('error'))[:150]!r}")


if __name__ == "__main__":
    main()
