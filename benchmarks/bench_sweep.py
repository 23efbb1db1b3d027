"""Op-sweep speed against the floor, in one run on this machine.

(a) the floor: generate every OpInfo sample_inputs sample for the dtype set and run it once on
    the CPU (function variant), in one process, no harness;
(b) ``conformance run --target neuron-emu`` over the same op x dtype set, 2 workers: the
    function variant alone (the floor's work on both sides), and the default forward variants
    (function, inplace, out), and with backward;
(c) the pytest-plugin path for the function variant set (``-n 2``).

Example: python benchmarks/bench_sweep.py --dtypes float32,bfloat16,int64
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch


def floor(dtypes: list[str]) -> tuple[float, int]:
    from conformance.inputs.opinfo import cpu_dtypes, infos, samples

    infos()  # import op_db outside the timing, as the run's workers have it preloaded
    t = time.perf_counter()
    n = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for info in infos():
            ok = {str(d).removeprefix("torch.") for d in cpu_dtypes(info)}
            for d in dtypes:
                if d not in ok:
                    continue
                try:
                    for s in samples(info, getattr(torch, d)):
                        n += 1
                        try:
                            info.op(s.input, *s.args, **s.kwargs)
                        except Exception:  # noqa: BLE001
                            pass
                except Exception:  # noqa: BLE001
                    pass
    return time.perf_counter() - t, n


def timed(cmd: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dtypes", default="float32,bfloat16,int64")
    ap.add_argument("--build", default="2.33.0")
    ap.add_argument("--skip-pytest", action="store_true")
    ap.add_argument("--with-backward", action="store_true")
    args = ap.parse_args()
    dtypes = args.dtypes.split(",")
    torch.set_num_threads(1)
    a, n = floor(dtypes)
    print(f"(a) floor: {n} samples generated and run once on CPU in {a:.1f} s")
    conf = [sys.executable, "-m", "conformance", "run", "--target", "neuron-emu", "--build", args.build,
            "--dtypes", args.dtypes, "-n", "2", "--no-schema", "--quiet", "--exit-zero"]
    with tempfile.TemporaryDirectory() as d:
        variant_sets = [("function", "function"), ("function,inplace,out", "forward variants")]
        if args.with_backward:
            variant_sets.append(("function,inplace,out,backward", "forward + backward"))
        for variants, label in variant_sets:
            db = Path(d) / f"{label.replace(' ', '_')}.sqlite"
            b = timed(conf + ["--variants", variants, "--db", str(db)])
            print(f"(b) conformance run, {label}: {b:.1f} s wall (ratio b/a = {b / a:.2f})")
        if not args.skip_pytest:
            c = timed([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--conformance-target",
                       "neuron-emu", "--conformance-build", args.build, "--conformance-dtypes", args.dtypes,
                       "--conformance-db", str(Path(d) / "pt.sqlite"), "-n", "2", "-k", "function"])
            print(f"(c) pytest plugin, function variant, -n 2: {c:.1f} s wall (ratio c/a = {c / a:.2f})")


if __name__ == "__main__":
    main()
