"""Time the ``compile`` items of the model corpus in one process, one thread: the item the
nightly spends most of its model time on (training through ``torch.compile``, then the shape
sweep's recompiles and latency). Prints each item's wall and CPU time and recompiles (and per
shape the graphs Dynamo compiled / the backend lowered, and whether a dynamic graph served it),
then the totals and medians. Run it from two checkouts (``PYTHONPATH=OTHER python benchmarks/...``)
to compare.

Example::

    python benchmarks/model_compile_items.py                       # 1 graph per family, float32
    python benchmarks/model_compile_items.py --per-family 2 --build 2.31.0
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch


def _per_shape(row: dict) -> str:
    """Per shape: graphs Dynamo compiled / graphs the backend lowered, ``d`` where a dynamic graph
    served it, ``s`` a static one (rows from before these facts were recorded: nothing)."""
    shapes = row.get("shapes") or []
    if not shapes or "dynamo_graphs" not in shapes[0]:
        return ""
    mark = {True: "d", False: "s", None: "-"}
    return "  shapes " + " ".join(f"{s['dynamo_graphs']}/{s['lowerings']}{mark[s['dynamic']]}" for s in shapes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-family", type=int, default=1)
    ap.add_argument("--dtypes", default="float32")
    ap.add_argument("--target", default="neuron-emu")
    ap.add_argument("--build", default="2.33.0")
    args = ap.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    from conformance.models.runner import run_model_group
    from conformance.models.selection import model_groups
    from conformance.sweep.opinfo import SweepConfig
    from conformance.targets import get_target

    target = get_target(args.target, args.build)
    chosen = model_groups(["all"], args.dtypes.split(","), limit=args.per_family)  # the first graphs of each family
    times, cpu_times = [], []
    for g in chosen:
        t0, c0 = time.perf_counter(), time.process_time()
        rows = list(run_model_group(target, g, SweepConfig(), modes=("compile",)))
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        times.append(dt)
        cpu_times.append(cpu)
        r = rows[0]
        print(f"{g.key:55s} {dt:6.2f} s (cpu {cpu:5.2f} s)  {r['status']:14s} recompiles {r.get('recompiles')}"
              f"{_per_shape(r)}", flush=True)
    # CPU seconds as well: on a machine others share, the wall time measures their load too
    print(f"{len(times)} compile items: total {sum(times):.1f} s, median {statistics.median(times):.2f} s "
          f"(cpu: total {sum(cpu_times):.1f} s, median {statistics.median(cpu_times):.2f} s)")


if __name__ == "__main__":
    main()
