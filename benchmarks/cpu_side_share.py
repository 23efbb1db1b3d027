"""How much of an OpInfo item is the same for every build (the CPU side), i.e. what sharing it
between the builds of a nightly could save at most. In one process, one thread, on the emulator:
sample generation, the CPU-side phases (the reference and every contract's CPU calls, timed from
``phase("cpu")`` to the next phase switch) and the float64 arbiter, against the whole sweep.

Example::

    python benchmarks/cpu_side_share.py                      # 60 random OpInfos x float32/bfloat16/int64
    python benchmarks/cpu_side_share.py --ops 20 --variants function,inplace,out
"""

from __future__ import annotations

import argparse
import time
import warnings

import _opinfo_sample
import torch

from conformance.check import execute
from conformance.sweep import opinfo as sweep_mod
from conformance.sweep.opinfo import SweepConfig, run_group
from conformance.targets import get_target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _opinfo_sample.add_options(ap)
    ap.add_argument("--variants", default="function")
    ap.add_argument("--build", default="2.33.0")
    args = ap.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    target = get_target("neuron-emu", build=args.build)
    chosen, groups = _opinfo_sample.groups(args)

    spent = {"cpu": 0.0, "target": 0.0}
    current: list = [None, 0.0]

    def hook(name: str) -> None:
        now = time.perf_counter()
        if current[0] is not None:
            spent[current[0]] += now - current[1]
        current[0], current[1] = name, now

    gen_s = [0.0]
    samples = sweep_mod.samples

    def timed_samples(*a, **k):
        it = samples(*a, **k)
        while True:
            t0 = time.perf_counter()
            try:
                s = next(it)
            except StopIteration:
                gen_s[0] += time.perf_counter() - t0
                return
            gen_s[0] += time.perf_counter() - t0
            yield s

    arb_s = [0.0]
    arbiter = execute._arbiter

    def timed_arbiter(*a):
        t0 = time.perf_counter()
        try:
            return arbiter(*a)
        finally:
            arb_s[0] += time.perf_counter() - t0

    execute.set_phase_hook(hook)
    sweep_mod.samples, execute._arbiter = timed_samples, timed_arbiter
    config = SweepConfig(variants=tuple(args.variants.split(",")))
    t0 = time.perf_counter()
    n = sum(1 for g in groups for _ in run_group(target, g, config))
    total = time.perf_counter() - t0
    execute.set_phase_hook(None)
    cpu = spent["cpu"]
    print(f"{n} items of {len(groups)} op x dtype groups in {total:.2f} s ({total / n * 1e3:.2f} ms/item)")
    for label, s in (("sample generation", gen_s[0]), ("CPU-side calls (reference, contracts)", cpu),
                     ("float64 arbiter", arb_s[0])):
        print(f"  {label:40s} {s:7.2f} s  {s / total:6.1%}")
    shared = gen_s[0] + cpu + arb_s[0]
    print(f"  {'the same for every build':40s} {shared:7.2f} s  {shared / total:6.1%}"
          f"  (shared by 3 builds: saves <= {shared * 2 / 3 / total:.1%} of the OpInfo time of 3)")


if __name__ == "__main__":
    main()
