"""Execute: one work item (OpInfo x variant x dtype x sample) on the CPU reference and on the
target, with a float64 arbiter computed on demand. Returns plain records; deciding is
:mod:`conformance.compare` and :mod:`conformance.verdict`'s job.

Example::

    >>> import torch
    >>> from conformance.execute import run_item
    >>> from conformance.inputs.opinfo import by_name, samples
    >>> from conformance.targets import get_target
    >>> info = by_name()["abs"]
    >>> s = next(samples(info, torch.float32))
    >>> out = run_item(get_target("cpu"), info, "function", s)
    >>> out.cpu_error is None and out.target_error is None
    True
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_map

from .compare import Meta, leaves
from .inputs.opinfo import variant_fn
from .targets import Target

_FLOAT_LOW = (torch.float32, torch.bfloat16, torch.float16)


@dataclass
class Outcome:
    cpu: Any = None
    cpu_error: str | None = None
    target: Any = None  # copied back to the CPU
    target_error: str | None = None
    device_meta: list[Meta] = field(default_factory=list)
    native: tuple[str, ...] = ()
    fallback: tuple[str, ...] = ()
    duration_s: float = 0.0
    arbiter: Callable[[], Any] | None = None


def _err(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()
    head = msg[0] if msg else ""
    return f"{type(exc).__name__}: {head}"[:2000]


def _clone(sample: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    return sample.transform(lambda t: fn(t.detach()) if isinstance(t, torch.Tensor) else t)


def _out_like(value: Any, device: str | torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return torch.empty(0, dtype=value.dtype, device=device)
    if isinstance(value, (tuple, list)) and all(isinstance(v, torch.Tensor) for v in value):
        return tuple(torch.empty(0, dtype=v.dtype, device=device) for v in value)
    raise TypeError(f"cannot build out= tensors for {type(value).__name__}")


def _invoke(fn: Callable[..., Any], variant: str, s: Any, device: str | torch.device, cpu_result: Any) -> Any:
    if variant == "out":
        out = _out_like(cpu_result, device)
        ret = fn(s.input, *s.args, **s.kwargs, out=out)
        return out if ret is None else ret
    return fn(s.input, *s.args, **s.kwargs)


def _to_cpu(value: Any) -> Any:
    return tree_map(lambda x: x.detach().to("cpu", copy=True) if isinstance(x, torch.Tensor) else x, value)


def run_item(target: Target, info: Any, variant: str, sample: Any, *, want_arbiter: bool = True) -> Outcome:
    """Run one sample of one OpInfo variant on the CPU and on ``target``."""
    fn = variant_fn(info, variant)
    if fn is None:
        return Outcome(cpu_error=f"OpInfo {info.name} has no {variant} variant")
    out = Outcome()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            s_cpu = _clone(sample, torch.clone) if variant == "inplace" else sample
            ref = _invoke(info.op, "function", sample, "cpu", None) if variant == "out" else None
            out.cpu = _invoke(fn, variant, s_cpu, "cpu", ref)
        except Exception as exc:  # noqa: BLE001 - the CPU reference failed: the item is skipped
            out.cpu_error = _err(exc)
            return out
        dev = target.device
        try:
            s_dev = _clone(sample, lambda t: t.to(dev, copy=True))
            wrapped = target.wrap(fn)
            with target.trace() as trace:
                t0 = time.perf_counter()
                result = _invoke(wrapped, variant, s_dev, dev, out.cpu)
                target.synchronize()
                out.duration_s = time.perf_counter() - t0
            out.device_meta = [Meta.of(x) for x in leaves(result) if isinstance(x, torch.Tensor)]
            out.target = _to_cpu(result)
            out.native, out.fallback = tuple(sorted(trace.native)), tuple(sorted(trace.fallback))
        except Exception as exc:  # noqa: BLE001 - any target failure is evidence
            out.target_error = _err(exc)
            out.native, out.fallback = _trace_of(locals().get("trace"))
            return out
    if want_arbiter and sample_dtype(sample) in _FLOAT_LOW:
        out.arbiter = lambda: _arbiter(fn, variant, info, sample)
    return out


def _trace_of(trace: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    if trace is None:
        return (), ()
    return tuple(sorted(trace.native)), tuple(sorted(trace.fallback))


def sample_dtype(sample: Any) -> torch.dtype | None:
    for x in leaves((sample.input, sample.args, sample.kwargs)):
        if isinstance(x, torch.Tensor):
            return x.dtype
    return None


def _arbiter(fn: Callable[..., Any], variant: str, info: Any, sample: Any) -> Any:
    """The same sample computed in float64 on the CPU (None when the op cannot)."""
    def up(t: torch.Tensor) -> torch.Tensor:
        return t.to(torch.float64, copy=True) if t.dtype in _FLOAT_LOW else t.clone()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            s64 = _clone(sample, up)
            ref = None
            if variant == "out":
                ref = _invoke(info.op, "function", _clone(s64, torch.clone), "cpu", None)
            return _invoke(fn, variant, s64, "cpu", ref)
        except Exception:  # noqa: BLE001 - no arbiter for this sample
            return None


def signature(sample: Any) -> str:
    """A compact shape/dtype/stride signature of a sample, e.g. ``f32[3,4]{4,1}, f32[4]; alpha=2``."""
    parts = []
    for x in leaves((sample.input, sample.args)):
        parts.append(_sig(x))
    kw = ", ".join(f"{k}={_sig(v)}" for k, v in sample.kwargs.items())
    return ", ".join(parts) + (f"; {kw}" if kw else "")


_SHORT = {torch.float32: "f32", torch.float64: "f64", torch.bfloat16: "bf16", torch.float16: "f16",
          torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
          torch.bool: "b8", torch.complex64: "c64", torch.complex128: "c128"}


def _sig(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        shape = ",".join(map(str, x.shape))
        s = f"{_SHORT.get(x.dtype, str(x.dtype))}[{shape}]"
        if x.layout == torch.strided and not x.is_contiguous() and x.dim() > 1:
            s += "{" + ",".join(map(str, x.stride())) + "}"
        return s
    if isinstance(x, (list, tuple)):
        return "(" + ",".join(_sig(v) for v in x) + ")"
    r = repr(x)
    return r if len(r) < 40 else r[:37] + "..."
