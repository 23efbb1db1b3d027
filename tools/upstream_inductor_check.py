"""Does each upstream-known Inductor CPU failure still hold under the installed torch?

Reruns, outside the harness, what PyTorch's own OpInfo test for Inductor
(``test/inductor/test_torchinductor_opinfo.py``, ``test_comprehensive``) does for every op the
stored expectations (``conformance/data/upstream_inductor.toml``) list as an expected failure or
skip on the CPU for one dtype, and prints one line per op: ``holds`` (some sample still fails,
with the first reason), ``stale`` (every sample passes), ``unknown`` (the first ``--max-samples``
pass), or ``absent`` (no such OpInfo here).

What it mirrors from upstream: samples from ``op.sample_inputs`` (``requires_grad`` where the op
supports autograd in the dtype), ``wrapper_set_seed`` made a no-op, ``torch.compile`` with the
inductor backend under ``implicit_fallbacks=False``, ``fullgraph`` and a compiled graph required
unless the op has a data-dependent output (found with fake tensors), random ops run but their
values not compared, values compared by ``torch.testing.assert_close`` (float32: atol 1.5e-5,
rtol 1.3e-5, NaNs equal) and output strides compared; forward only (upstream skips gradients on
the CPU). ``--default-config`` keeps Inductor's defaults instead (``implicit_fallbacks=True``,
what the harness's ``--target inductor`` uses), to tell a config-only failure from a real one.

    .venv/bin/python tools/upstream_inductor_check.py --source newest --dtype float32
    .venv/bin/python tools/upstream_inductor_check.py --ops cholesky --default-config
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import upstream_check_common as common  # noqa: E402
from torch._subclasses.fake_tensor import (  # noqa: E402
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
)
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten, tree_map  # noqa: E402

TOLERANCES = {torch.float32: (1.5e-5, 1.3e-5)}  # (atol, rtol), as upstream's _get_tolerances


class _Rng(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        self.seen = self.seen or torch.Tag.nondeterministic_seeded in func.tags
        return func(*args, **(kwargs or {}))


def _static_and_rng(fn, args, kwargs) -> tuple[bool, bool]:  # noqa: ANN001
    """(no data-dependent output, reaches a random op), from one run on fake tensors."""
    from torch._dispatch.python import enable_python_dispatcher

    mode, rng = FakeTensorMode(), _Rng()
    try:
        fargs, fkwargs = tree_map(lambda x: mode.from_tensor(x) if isinstance(x, torch.Tensor) else x, (args, kwargs))
        with rng, mode, enable_python_dispatcher():
            fn(*fargs, **fkwargs)
    except (DataDependentOutputException, DynamicOutputShapeException):
        return False, rng.seen
    except Exception:  # noqa: BLE001 - fake tensors cannot run it: compile as upstream would, without fullgraph
        return False, rng.seen
    return True, rng.seen


def _clone(x):  # noqa: ANN001, ANN202
    if isinstance(x, torch.Tensor):
        y = x.detach().clone()
        return y.requires_grad_(x.requires_grad) if y.is_leaf and (y.is_floating_point() or y.is_complex()) else y
    return x


def check_sample(fn, sample, dtype: torch.dtype, default_config: bool) -> str:  # noqa: ANN001
    """"" when the sample passes, else why it fails."""
    from torch._inductor.compile_fx import compile_fx

    args, kwargs = [sample.input, *sample.args], sample.kwargs
    static, rng = _static_and_rng(fn, args, kwargs)
    compiled: list[int] = []

    def backend(gm, example_inputs):  # noqa: ANN001, ANN202
        compiled.append(1)
        return compile_fx(gm, example_inputs)

    torch._dynamo.reset()
    config = contextlib.nullcontext() if default_config else torch._inductor.config.patch(implicit_fallbacks=False)
    try:
        with config:
            run = torch.compile(fn, backend=backend, fullgraph=static)
            torch.manual_seed(0)
            expected = fn(*tree_map(_clone, args), **tree_map(_clone, kwargs))
            torch.manual_seed(0)
            actual = run(*tree_map(_clone, args), **tree_map(_clone, kwargs))
    except Exception as exc:  # noqa: BLE001 - the failure upstream expects, most often
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ''}"
    if static and not compiled:
        return "ran without compiling a graph"
    if rng:
        return ""  # upstream: assert_equal=False for ops that reach a random op
    atol, rtol = TOLERANCES.get(dtype, (None, None))
    try:
        torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol, equal_nan=True)
    except AssertionError as exc:
        return "values: " + " ".join(str(exc).split())[:160]
    for a, e in zip(tree_flatten(actual)[0], tree_flatten(expected)[0], strict=False):
        if isinstance(a, torch.Tensor) and a.layout == torch.strided and e.layout == torch.strided:
            if a.numel() > 1 and any(sa != se for sa, se, n in zip(a.stride(), e.stride(), a.shape, strict=False) if n > 1):
                return f"strides {list(a.stride())} vs eager {list(e.stride())}"
    return ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", default="newest", help="expectations source (upstream_inductor.toml)")
    parser.add_argument("--dtype", default="float32", help="dtype name (default float32)")
    parser.add_argument("--ops", nargs="*", help="only these ops (default: every listed one)")
    parser.add_argument("--max-samples", type=int, default=None, help="at most this many samples per op")
    parser.add_argument("--default-config", action="store_true", help="Inductor's defaults (implicit_fallbacks on)")
    a = parser.parse_args()
    warnings.simplefilter("ignore")
    dtype = getattr(torch, a.dtype)
    facts = common.listed_facts(a.source, a.dtype, a.ops)
    config = "Inductor defaults" if a.default_config else "implicit_fallbacks=False"
    print(f"# torch {torch.__version__}, {a.dtype}, source {a.source}, {config}: {len(facts)} ops")
    common.run(facts, dtype, lambda fn, sample: check_sample(fn, sample, dtype, a.default_config), a.max_samples,
               grad=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
