"""TestCommon-style device tests on the emulated ``neuron`` device, per build.

PyTorch's own ``test/test_ops.py`` is not installed with the torch wheel, so this module carries
the core assertion loops of four of its ``TestCommon`` tests and runs them through PyTorch's
device-test machinery (``instantiate_device_type_tests`` on ``PrivateUse1TestBase``, ``op_db``
OpInfos, ``TestCase.assertEqual``):

* ``test_compare_cpu``         every ``reference_inputs`` sample on the device vs the CPU
                               (atol=rtol=1e-3, after ``output_process_fn_grad``, as upstream)
* ``test_out``                 ``out=`` with a correctly sized device tensor equals the function,
                               and an ``out=`` tensor on the CPU raises (a device tensor's results
                               never land on the host)
* ``test_noncontiguous_samples`` each sample vs its ``noncontiguous()`` twin, exactly
* ``test_variant_consistency_eager`` method and in-place variants vs the function
* ``test_dtypes``              upstream's dtype probe over the selected dtypes: a dtype works when
                               every sample runs; the device must work for exactly the dtypes the
                               CPU works for (claimed dtypes are listed in the failure message)

Usage (the backend is registered before ``common_device_type`` is imported, as it must be)::

    PYTHONPATH=. python benchmarks/testcommon_neuron.py --build ideal --dtypes float32,bfloat16,int64 \\
        --ops "add,mul,cumsum,index_select,norm,max.binary" -- -n 2 -q

Prints one line per test kind: passed/failed/skipped, then the failures grouped by first error
line.  ``--cpu-too`` runs the same tests on the CPU device as well (kinds and causes marked
``[CPU]``): a test that fails there too is no finding about the device.  ``--shard K/N`` takes
the OpInfos whose op_db index is K mod N.  Exit code: 0 when nothing failed, 1 otherwise, 2 on bad arguments.

On the CPU device ``test_compare_cpu`` compares the CPU with itself, so ``--cpu-too`` cannot clear a
compare failure; ``benchmarks/testcommon_not_device.py`` re-checks, with a control each, the
failures on ``ideal`` that are not device bugs (CPU kernels that disagree with themselves, test
artefacts that upstream's own TestCommon skips or xfails, PyTorch policies chosen by device type).
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    import argparse
    import collections
    import re
    import subprocess
    from pathlib import Path

    _KINDS = "test_compare_cpu|test_out|test_noncontiguous_samples|test_variant_consistency_eager|test_dtypes"
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="ideal", help="emulator build: a shipped name or a manifest path")
    ap.add_argument("--dtypes", default="float32,bfloat16,int64")
    ap.add_argument("--ops", default="", help="comma-separated OpInfo names (default: all of op_db)")
    ap.add_argument("--shard", default="", metavar="K/N",
                    help="only the OpInfos whose op_db index is K modulo N (a deterministic part)")
    ap.add_argument("--cpu-too", action="store_true",
                    help="run the same tests on the CPU device as well (what fails there too is no device bug)")
    ap.add_argument("--raw", default="", metavar="PATH", help="also write pytest's whole output there")
    ap.add_argument("pytest_args", nargs="*", help="after --: passed to pytest (e.g. -n 2)")
    a = ap.parse_args()
    m = re.fullmatch(r"(\d+)/([1-9]\d*)", a.shard)
    if a.shard and not (m and int(m.group(1)) < int(m.group(2))):
        print(f"testcommon_neuron: --shard: expected K/N with 0 <= K < N, got {a.shard!r}", file=sys.stderr)
        sys.exit(2)
    env = dict(os.environ, NEURON_EMU_BUILD=a.build, TESTCOMMON_DTYPES=a.dtypes, TESTCOMMON_OPS=a.ops,
               TESTCOMMON_SHARD=a.shard, TESTCOMMON_DEVICES="privateuse1,cpu" if a.cpu_too else "privateuse1",
               COLUMNS="1000")  # pytest cuts summary lines to the terminal width
    repo = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = str(repo) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "pytest", __file__, "-p", "no:randomly", "-p", "no:cacheprovider",
           "-m", "", "-rA", "--tb=no", "-W", "ignore", *a.pytest_args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=repo)
    out = proc.stdout + proc.stderr
    if a.raw:
        Path(a.raw).write_text(out)
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    causes: collections.Counter = collections.Counter()
    failed_ids: dict[str, list[str]] = {}
    for line in out.splitlines():
        m = re.match(r"(PASSED|FAILED|ERROR|SKIPPED)\S* \S*::TestCommonNeuron(\w+)::(" + _KINDS + r")_(\S+)", line)
        if m:
            counts[m.group(3) + ("" if m.group(2) == "PRIVATEUSE1" else f" [{m.group(2)}]")][m.group(1)] += 1
        m = re.match(r"(FAILED|ERROR) \S*::TestCommonNeuron(\w+)::(\S+)(?: - (.*))?$", line)
        if m:
            on_cpu = m.group(2) != "PRIVATEUSE1"
            cause = ("[CPU] " if on_cpu else "") + re.sub(r"0x[0-9a-f]+|\d+(\.\d+)?", "#", m.group(4) or "?")[:150]
            causes[cause] += 1
            failed_ids.setdefault(cause, []).append(m.group(3))
    if not counts:
        print(out[-4000:])
        sys.exit(2)
    print(f"build {a.build}  dtypes {a.dtypes}  ops {a.ops or 'all of op_db'}"
          + (f"  shard {a.shard} (op_db index mod N)" if a.shard else ""))
    for kind, c in sorted(counts.items()):
        print(f"{kind:40s} passed {c['PASSED']:5d}  failed {c['FAILED'] + c['ERROR']:5d}  skipped {c['SKIPPED']:5d}")
    for cause, n in causes.most_common(40):
        print(f"  {n:4d}  {cause}")
        print(f"        {', '.join(failed_ids[cause][:6])}{' ...' if n > 6 else ''}")
    sys.exit(0 if not causes else 1)

# ---------------------------------------------------------------- the test module (under pytest)
import torch  # noqa: E402, I001  (the import order below matters)

import neuron_emu  # noqa: E402,F401  (registers 'neuron' before common_device_type is imported)
from torch.testing._internal.common_device_type import (  # noqa: E402
    OpDTypes,
    instantiate_device_type_tests,
    ops,
)
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402
from torch.testing._internal.common_utils import TestCase  # noqa: E402

_DT = {n: getattr(torch, n) for n in os.environ.get("TESTCOMMON_DTYPES", "float32,bfloat16,int64").split(",")}
_WANT = {s for s in os.environ.get("TESTCOMMON_OPS", "").split(",") if s}
_K, _, _N = (os.environ.get("TESTCOMMON_SHARD") or "0/1").partition("/")
_OPS = [op for i, op in enumerate(op_db) if i % int(_N) == int(_K) and (
        not _WANT or op.name in _WANT or
        (op.name + ("." + op.variant_test_name if op.variant_test_name else "")) in _WANT)]


def _to_cpu(arg):
    return arg.to(device="cpu") if isinstance(arg, torch.Tensor) else arg


class TestCommonNeuron(TestCase):
    exact_dtype = True

    @ops(_OPS, allowed_dtypes=tuple(_DT.values()), dtypes=OpDTypes.supported)
    def test_compare_cpu(self, device, dtype, op):
        for sample in op.reference_inputs(device, dtype):
            cpu_sample = sample.transform(_to_cpu)
            dev = sample.output_process_fn_grad(op(sample.input, *sample.args, **sample.kwargs))
            cpu = cpu_sample.output_process_fn_grad(op(cpu_sample.input, *cpu_sample.args, **cpu_sample.kwargs))
            self.assertEqual(dev, cpu, atol=1e-3, rtol=1e-3, exact_device=False)

    @ops([op for op in _OPS if op.supports_out] or _OPS[:1], allowed_dtypes=tuple(_DT.values()),
         dtypes=OpDTypes.supported)
    def test_out(self, device, dtype, op):
        if not op.supports_out:
            self.skipTest("no out= variant")
        sample = next(iter(op.sample_inputs(device, dtype)))
        expected = op(sample.input, *sample.args, **sample.kwargs)
        flat = expected if isinstance(expected, (tuple, list)) else (expected,)
        if not all(isinstance(t, torch.Tensor) for t in flat):
            self.skipTest("non-tensor outputs")
        outs = [torch.empty_like(t) for t in flat]
        out_arg = outs[0] if isinstance(expected, torch.Tensor) else tuple(outs)
        op(sample.input, *sample.args, **sample.kwargs, out=out_arg)
        self.assertEqual(outs, list(flat))
        for o in outs:
            self.assertEqual(o.device, flat[0].device)
        # out= on the CPU for device inputs: a real device raises.
        cpu_outs = [torch.empty_like(t, device="cpu") for t in flat]
        cpu_arg = cpu_outs[0] if isinstance(expected, torch.Tensor) else tuple(cpu_outs)
        has_device_input = any(isinstance(t, torch.Tensor) and t.device.type != "cpu"
                               for t in (sample.input, *sample.args, *sample.kwargs.values()))
        if has_device_input:
            with self.assertRaises(RuntimeError):
                op(sample.input, *sample.args, **sample.kwargs, out=cpu_arg)

    @ops(_OPS, allowed_dtypes=tuple(_DT.values()), dtypes=OpDTypes.supported)
    def test_noncontiguous_samples(self, device, dtype, op):
        for sample in op.sample_inputs(device, dtype):
            nc = sample.noncontiguous()
            expected = op(sample.input, *sample.args, **sample.kwargs)
            actual = op(nc.input, *nc.args, **nc.kwargs)
            self.assertEqual(actual, expected)

    @ops(_OPS, allowed_dtypes=tuple(_DT.values()), dtypes=OpDTypes.supported)
    def test_variant_consistency_eager(self, device, dtype, op):
        method, inplace = op.get_method(), op.get_inplace()
        if method is None and inplace is None:
            self.skipTest("no method or in-place variant")
        for sample in op.sample_inputs(device, dtype):
            expected = op(sample.input, *sample.args, **sample.kwargs)
            if method is not None:
                self.assertEqual(method(sample.input.clone() if isinstance(sample.input, torch.Tensor)
                                        else sample.input, *sample.args, **sample.kwargs), expected)
            if (inplace is not None and isinstance(sample.input, torch.Tensor)
                    and isinstance(expected, torch.Tensor) and expected.dtype == sample.input.dtype
                    and expected.shape == sample.input.shape):
                x = sample.input.clone()
                inplace(x, *sample.args, **sample.kwargs)
                self.assertEqual(x, expected)

    @ops(_OPS, dtypes=OpDTypes.none)
    def test_dtypes(self, device, op):
        def works(dev, dtype):
            try:
                for sample in op.sample_inputs(dev, dtype):
                    op(sample.input, *sample.args, **sample.kwargs)
            except Exception:
                return False
            return True

        on_device = {str(d) for d in _DT.values() if works(device, d)}
        on_cpu = {str(d) for d in _DT.values() if works("cpu", d)}
        claimed = {str(d) for d in op.supported_dtypes(torch.device(device).type) if d in _DT.values()}
        self.assertEqual(on_device, on_cpu, msg=f"dtypes working: device {sorted(on_device)}, "
                         f"cpu {sorted(on_cpu)}; claimed {sorted(claimed)}")


instantiate_device_type_tests(TestCommonNeuron, globals(),
                              only_for=tuple(os.environ.get("TESTCOMMON_DEVICES", "privateuse1").split(",")))
