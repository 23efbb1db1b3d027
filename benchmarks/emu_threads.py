"""Per-op cost of the emulated device with more than one intra-op thread, before and after the
first backward (which starts autograd's device thread: from then on libgomp manages a second
team, and with more threads than cores it stops spinning).

    python benchmarks/emu_threads.py [--build 2.33.0] [--threads 2]

Prints the median of --repeats timings (each the mean of --calls calls) per op and phase. Run it
from two checkouts (PYTHONPATH) to compare two versions of the emulator core.
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="2.33.0")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    import torch

    import neuron_emu

    torch.set_num_threads(args.threads)
    neuron_emu.use_build(args.build)
    g = torch.Generator().manual_seed(0)
    dev = "neuron"

    def t(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dev)

    small, mid, big = t(5, 5), t(100, 100), t(1024, 1024)
    img = t(8, 16, 32, 32)
    w = t(16, 16, 3, 3)
    cases = {
        "add 5x5": lambda: small + small,
        "mm 100x100": lambda: mid @ mid,
        "softmax 100x100": lambda: mid.softmax(-1),
        "add 1024x1024": lambda: big + big,
        "sum 1024x1024": lambda: big.sum(),
        "mm 1024x1024": lambda: big @ big,
        "conv2d 8x16x32x32": lambda: torch.nn.functional.conv2d(img, w, padding=1),
        "randn 1024x1024 (factory)": lambda: torch.randn(1024, 1024, device=dev),
    }

    def measure(fn) -> float:
        name = next(n for n, f in cases.items() if f is fn)
        calls = max(3, args.calls if "1024" not in name and "conv" not in name else args.calls // 30)
        fn()
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            times.append((time.perf_counter() - t0) / calls * 1e6)
        return statistics.median(times)

    before = {name: measure(fn) for name, fn in cases.items()}
    x = t(5, 5).requires_grad_()
    (x * 2).sum().backward()  # small ops on autograd's device thread
    after_small = {name: measure(fn) for name, fn in cases.items()}
    x = t(1024, 1024).requires_grad_()
    (x * 2).sum().backward()  # large ones: their kernels run in parallel on that thread
    print(f"build {args.build}, {torch.get_num_threads()} intra-op threads; median us per call")
    print(f"{'op':28s} {'before backward':>16s} {'after a 5x5 one':>16s} {'after 1024x1024':>16s}")
    for name, fn in cases.items():
        print(f"{name:28s} {before[name]:16.1f} {after_small[name]:16.1f} {measure(fn):16.1f}", flush=True)


if __name__ == "__main__":
    main()
