"""What one OpInfo item costs against the floor, and where: in one process, one thread, on the
emulator, over the same op x dtype groups:

- the floor: every sample generated and run once on the CPU (what ``bench_sweep.py`` calls (a));
- the sweep with ``--contracts none`` and with the default contracts (function variant), each
  ``--reps`` times (median printed), with the op calls an item makes on each side and the time
  spent inside them (``execute.invoke``: the op itself, the emulator's dispatch included) against
  the rest (copies, op trace, comparison, fingerprint, contracts' own work).

An item compares the target with the CPU, so it calls the op at least twice (more with the float64
arbiter and the contracts' extra calls); the ratio to the floor cannot go below that count.

Example::

    python benchmarks/item_cost.py                      # 60 random OpInfos x float32/bfloat16/int64
    python benchmarks/item_cost.py --ops 677 --reps 1   # every OpInfo
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections import Counter

import _opinfo_sample
import torch

from conformance.check import contracts, execute
from conformance.inputs.opinfo import by_name, samples
from conformance.sweep.opinfo import SweepConfig, run_group
from conformance.targets import get_target


def floor(groups: list) -> tuple[float, int]:
    t0, n = time.perf_counter(), 0
    for g in groups:
        info = by_name()[g.op]
        try:
            for s in samples(info, getattr(torch, g.dtype)):
                n += 1
                try:
                    info.op(s.input, *s.args, **s.kwargs)
                except Exception:  # noqa: BLE001 - a sample the op rejects still costs its call
                    pass
        except Exception:  # noqa: BLE001 - the generator failed: the sweep records that too
            pass
    return time.perf_counter() - t0, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _opinfo_sample.add_options(ap)
    ap.add_argument("--build", default="2.33.0")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    target = get_target("neuron-emu", build=args.build)
    chosen, groups = _opinfo_sample.groups(args)
    warm = SweepConfig(variants=("function",))
    for g in groups[:3]:  # first-use costs (emulator build, op_db, caches) outside the timing
        for _ in run_group(target, g, warm):
            pass
    floors = [floor(groups) for _ in range(args.reps)]
    floor_s, n_floor = statistics.median(f[0] for f in floors), floors[0][1]
    print(f"{len(groups)} op x dtype groups of {len(chosen)} OpInfos ({args.dtypes}), build {args.build}, 1 thread")
    print(f"floor: {n_floor} samples in {floor_s:.2f} s ({floor_s / n_floor * 1e6:.0f} us/sample; median of {args.reps})")

    calls: Counter[str] = Counter()
    inside = [0.0]
    plain = execute.invoke

    def counted(fn, variant, s, device, ref, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        calls["cpu" if str(device) == "cpu" else "target"] += 1
        t0 = time.perf_counter()
        try:
            return plain(fn, variant, s, device, ref, *a, **k)
        finally:
            inside[0] += time.perf_counter() - t0

    print(f"{'contracts':10s} {'items':>6s} {'s (median)':>10s} {'us/item':>8s} {'x floor':>8s} "
          f"{'cpu calls':>9s} {'target calls':>12s} {'in op calls':>11s}")
    for label, wanted in (("none", ("none",)), ("default", ("default",))):
        config = SweepConfig(variants=("function",), contracts=wanted)
        times, share = [], []
        for _ in range(args.reps):
            calls.clear()
            inside[0] = 0.0
            execute.invoke = contracts.invoke = counted
            try:
                t0 = time.perf_counter()
                n = sum(1 for g in groups for _ in run_group(target, g, config))
                times.append(time.perf_counter() - t0)
            finally:
                execute.invoke = contracts.invoke = plain
            share.append(inside[0] / times[-1])
        took = statistics.median(times)
        print(f"{label:10s} {n:6d} {took:10.2f} {took / n * 1e6:8.0f} {took / floor_s:8.1f} "
              f"{calls['cpu'] / n:9.2f} {calls['target'] / n:12.2f} {statistics.median(share):11.0%}")


if __name__ == "__main__":
    main()
