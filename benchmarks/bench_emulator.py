"""Benchmarks of the neuron_emu emulated device.

Prints: per-op dispatch overhead vs plain CPU on small tensors (native path, fallback path,
Python-handled path), the emulated bf16 matmul cost, extension build time (cold in a fresh cache
dir, and cached), and torch.compile cache miss vs hit time.  Medians over repetitions.

    python3 benchmarks/bench_emulator.py [--quick] [--no-cold]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings


def median_us(fn, reps: int, inner: int = 50) -> float:
    for _ in range(5):
        fn()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - t0) / inner * 1e6)
    return statistics.median(samples)


def build_time(cache: str | None) -> float:
    env = dict(os.environ)
    if cache:
        env["NEURON_EMU_CACHE"] = cache
    code = ("import time; t=time.perf_counter(); from neuron_emu._build import load_extension; "
            "load_extension(); print(time.perf_counter()-t)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--no-cold", action="store_true", help="skip the cold extension build")
    args = ap.parse_args()
    reps = 7 if args.quick else 21

    import torch

    import neuron_emu

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    neuron_emu.use_build(neuron_emu.shipped_builds()[-1])
    a_cpu = torch.randn(16)
    a = a_cpu.to("neuron")
    print(f"build {neuron_emu.active_build().name}, torch {torch.__version__}")
    print("per-op dispatch, 16-element float32 tensors (median us/op):")
    rows = [
        ("add (native)", lambda: torch.add(a_cpu, a_cpu), lambda: torch.add(a, a)),
        ("mul_ in-place (native)", lambda: a_cpu.mul_(1.0), lambda: a.mul_(1.0)),
        ("view+t (native)", lambda: a_cpu.view(4, 4).t(), lambda: a.view(4, 4).t()),
        ("i0 (CPU fallback)", lambda: torch.special.i0(a_cpu), lambda: torch.special.i0(a)),
        ("exp (Python: transcendental bits)", lambda: torch.exp(a_cpu), lambda: torch.exp(a)),
    ]
    for name, fcpu, fdev in rows:
        c, d = median_us(fcpu, reps), median_us(fdev, reps)
        print(f"  {name:36s} cpu {c:7.2f}  neuron {d:7.2f}  overhead {d - c:7.2f}")

    x_cpu = torch.randn(256, 256)
    x = x_cpu.to("neuron")
    c = median_us(lambda: x_cpu @ x_cpu, reps, 10)
    d = median_us(lambda: x @ x, reps, 10)
    print(f"emulated bf16-operand matmul 256x256: cpu fp32 {c:.1f} us, neuron {d:.1f} us ({d / c:.1f}x)")

    cached = build_time(None)
    print(f"import neuron_emu incl. torch, extension cached: {cached:.2f} s")
    if not args.no_cold:
        with tempfile.TemporaryDirectory() as tmp:
            print(f"import neuron_emu incl. torch, cold extension build: {build_time(tmp):.1f} s")

    torch._dynamo.reset()
    m = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).to("neuron")
    f = torch.compile(m, backend="neuron")
    with torch.no_grad():
        t0 = time.perf_counter()
        f(torch.randn(4, 32, device="neuron"))
        miss = time.perf_counter() - t0
        inp = torch.randn(4, 32, device="neuron")
        hit = median_us(lambda: f(inp), reps, 10)
        t0 = time.perf_counter()
        f(torch.randn(6, 32, device="neuron"))
        re = time.perf_counter() - t0
    print(f"torch.compile: first call (miss) {miss * 1e3:.0f} ms, new shape (recompile) {re * 1e3:.0f} ms, "
          f"cache hit {hit:.0f} us/call")
    print("compile stats:", {k: v for k, v in neuron_emu.compile_stats().items() if k != "graphs"})


if __name__ == "__main__":
    main()
