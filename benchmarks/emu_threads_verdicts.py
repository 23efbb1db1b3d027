"""The emulator's verdicts with one intra-op thread against several: every float32 OpInfo group
(function and backward variants, no contracts, the first --samples samples) on one build,
written to a JSON file per run, then compared.

    python benchmarks/emu_threads_verdicts.py run --threads 1 --out /tmp/t1.json
    python benchmarks/emu_threads_verdicts.py run --threads 2 --out /tmp/t2.json
    python benchmarks/emu_threads_verdicts.py diff /tmp/t1.json /tmp/t2.json

Run ``run`` from two checkouts (PYTHONPATH) to compare two versions of the emulator core at the
same thread count. A call below ATen's grain size runs serially on a flushing build, so statuses
must not differ; a large call's reduction order may move the error by an ULP.
"""
from __future__ import annotations

import argparse
import json
import time
import warnings


def run(args: argparse.Namespace) -> None:
    warnings.simplefilter("ignore")
    import torch

    torch.set_num_threads(args.threads)
    from conformance.sweep.opinfo import OPINFO, SweepConfig, run_group
    from conformance.targets import get_target
    from conformance.work import Selection

    target = get_target("neuron-emu", args.build)
    groups = OPINFO.groups(Selection(dtypes=("float32",)))
    config = SweepConfig(variants=("function", "backward"), contracts=("none",), max_samples=args.samples)
    out, t0 = {}, time.perf_counter()
    for g in groups:
        for r in run_group(target, g, config):
            out[r["item_key"]] = [r["status"], r.get("max_abs_err")]
    with open(args.out, "w") as f:
        json.dump(out, f)
    print(f"{len(groups)} groups, {len(out)} items in {time.perf_counter() - t0:.0f} s, "
          f"{torch.get_num_threads()} intra-op threads, build {args.build}: {args.out}")


def diff(args: argparse.Namespace) -> None:
    with open(args.a) as f:
        a = json.load(f)
    with open(args.b) as f:
        b = json.load(f)
    keys = sorted(set(a) | set(b))
    status = [k for k in keys if (a.get(k) or [None])[0] != (b.get(k) or [None])[0]]
    error = [k for k in keys if k not in status and a.get(k) != b.get(k)]
    print(f"{len(keys)} items: {len(status)} differ in status, {len(error)} in error only")
    for k in status + error:
        print(f"  {k}: {a.get(k)} vs {b.get(k)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--threads", type=int, required=True)
    r.add_argument("--build", default="2.33.0")
    r.add_argument("--samples", type=int, default=4)
    r.add_argument("--out", required=True)
    d = sub.add_parser("diff")
    d.add_argument("a")
    d.add_argument("b")
    args = ap.parse_args()
    (run if args.cmd == "run" else diff)(args)


if __name__ == "__main__":
    main()
