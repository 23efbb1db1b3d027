"""Does each upstream-known ONNX failure still hold with the installed torch, onnxscript and ONNX Runtime?

ONNX Script's own OpInfo test for the exporter's torch_lib
(``tests/function_libs/torch_lib/ops_test_data.py``, ``TestOutputConsistencyFullGraph``) runs
each op's samples as an ONNX graph in ONNX Runtime and compares with eager PyTorch. For every op
the stored expectations (``conformance/data/upstream_onnxruntime.toml``) list as an expected
failure or skip for one dtype, this script runs its ``sample_inputs`` samples (no gradients)
the way a user of ``torch.onnx.export`` would, outside the harness: ``torch.export.export``, the
public ``torch.onnx.export(..., dynamo=True)`` and an ONNX Runtime CPU session, and compares with
eager by ``torch.testing.assert_close`` at PyTorch's default tolerance (upstream's unless an op
sets its own), values of random ops not compared (upstream checks their shapes only). The
samples run are every sample, or, for an entry upstream expects of some samples only, those its
recorded ``matchers`` pick. One line per op: ``holds`` (a sample fails: the first reason),
``holds on the matched samples`` (one of the samples upstream's matchers pick fails),
``holds on some sample`` (an entry of some samples whose list records no matchers: every sample
ran, and the failing one may not be one upstream's matcher picks), ``stale`` (every sample run
passes), ``unknown`` (the first ``--max-samples`` pass), or ``absent`` (no such OpInfo here, or
no sample it is about).

    .venv/bin/python tools/upstream_onnx_check.py --dtype float32
    .venv/bin/python tools/upstream_onnx_check.py --ops nn.functional.pad.reflect --max-samples 4
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import upstream_check_common as common  # noqa: E402
from torch.utils._pytree import tree_flatten, tree_map  # noqa: E402

# torch, onnxscript and onnxruntime only: the same helpers a repro script of the sweep embeds
from conformance.targets.onnx_runtime import (  # noqa: E402
    PROVIDER,
    _sample_module,
    _sample_result,
    _session_options,
)


def _reaches_rng(fn, args, kwargs) -> bool:  # noqa: ANN001
    from torch.utils._python_dispatch import TorchDispatchMode

    class Rng(TorchDispatchMode):
        seen = False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            Rng.seen = Rng.seen or torch.Tag.nondeterministic_seeded in func.tags
            return func(*args, **(kwargs or {}))

    try:
        with Rng():
            fn(*tree_map(_clone, args), **tree_map(_clone, kwargs))
    except Exception:  # noqa: BLE001 - eager itself fails: the ONNX run will say why
        pass
    return Rng.seen


def _clone(x):  # noqa: ANN001, ANN202
    """A copy in the same layout over a copy of the whole storage (a view may read beyond its
    elements: as_strided's partial views)."""
    if not isinstance(x, torch.Tensor) or x.layout != torch.strided:
        return x
    with torch.no_grad():
        y = torch.empty(0, dtype=x.dtype)
        return y.set_(x.untyped_storage().clone(), x.storage_offset(), x.size(), x.stride())


def run_onnx(fn, args, kwargs, opset: int):  # noqa: ANN001, ANN201
    import onnxruntime

    module, tensors = _sample_module(fn, tuple(args), kwargs)
    ep = torch.export.export(module, tensors, strict=False)
    program = torch.onnx.export(ep, (), dynamo=True, optimize=True, opset_version=opset, verbose=False)
    options = _session_options(onnxruntime)
    program.initialize_inference_session(
        lambda model: onnxruntime.InferenceSession(model, sess_options=options, providers=[PROVIDER]))
    return _sample_result(program, tensors, program(*tensors))


def _line(exc: BaseException) -> str:
    while exc.__cause__ is not None:
        exc = exc.__cause__
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:160] if text else ''}"


def check_sample(fn, sample, opset: int) -> str:  # noqa: ANN001
    """"" when the sample passes, else why it fails."""
    args, kwargs = [sample.input, *sample.args], dict(sample.kwargs)
    rng = _reaches_rng(fn, args, kwargs)
    try:
        torch.manual_seed(0)
        expected = fn(*tree_map(_clone, args), **tree_map(_clone, kwargs))
    except Exception as exc:  # noqa: BLE001 - eager refuses the sample: upstream's test errors too
        return f"eager: {_line(exc)}"
    try:
        torch.manual_seed(0)
        actual = run_onnx(fn, tree_map(_clone, args), tree_map(_clone, kwargs), opset)
    except Exception as exc:  # noqa: BLE001 - the failure upstream expects, most often
        return _line(exc)
    if rng:
        got, want = tree_flatten(actual)[0], tree_flatten(expected)[0]
        shapes = [tuple(t.shape) for t in got if isinstance(t, torch.Tensor)]
        if shapes != [tuple(t.shape) for t in want if isinstance(t, torch.Tensor)]:
            return f"shapes {shapes}"
        return ""
    try:
        torch.testing.assert_close(actual, expected, equal_nan=True, check_device=False)
    except (AssertionError, TypeError, ValueError) as exc:
        return "values: " + " ".join(str(exc).split())[:160]
    return ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", default="onnxscript", help="expectations source (upstream_onnxruntime.toml)")
    parser.add_argument("--dtype", default="float32", help="dtype name (default float32)")
    parser.add_argument("--ops", nargs="*", help="only these ops (default: every listed one)")
    parser.add_argument("--max-samples", type=int, default=None, help="at most this many samples per op")
    a = parser.parse_args()
    warnings.simplefilter("ignore")
    import logging

    logging.disable(logging.WARNING)  # the exporter logs every step of every export
    import onnxruntime
    import onnxscript
    from torch.onnx._internal.exporter import _registration

    opset = _registration.ONNXRegistry.from_torchlib().opset_version  # the sweep's opset
    dtype = getattr(torch, a.dtype)
    facts = common.listed_facts(a.source, a.dtype, a.ops)
    print(f"# torch {torch.__version__}, onnxscript {onnxscript.__version__}, onnxruntime "
          f"{onnxruntime.__version__}, opset {opset}, {a.dtype}, source {a.source}: {len(facts)} ops")
    common.run(facts, dtype, lambda fn, sample: check_sample(fn, sample, opset), a.max_samples)
    return 0


if __name__ == "__main__":
    sys.exit(main())
