"""Compile behaviour and latency of a model item on the target.

:class:`CountingBackend` wraps a target's ``torch.compile`` backend and counts the graphs it
compiles (device-generic); :func:`shape_sweep` runs a compiled model over its spec's shape
variants in inference, recording recompiles and p50/p99 forward latency after ``WARMUP`` calls;
:func:`time_forward` and :func:`percentile` are the latency measurement itself.

Example::

    >>> percentile([3.0, 1.0, 2.0], 0.5)
    2.0
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from conformance.check.compare import leaves

from .training import cast

WARMUP = 1
TIMED_ITERS = 5


def percentile(xs: Sequence[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


class CountingBackend:
    """A ``torch.compile`` backend that counts graph compilations and delegates to ``inner``."""

    def __init__(self, inner: str | Callable[..., Any]):
        self.inner = torch._dynamo.lookup_backend(inner) if isinstance(inner, str) else inner
        self.compiles = 0
        self.seconds = 0.0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any, **kwargs: Any) -> Any:
        self.compiles += 1
        t0 = time.perf_counter()
        try:
            return self.inner(gm, example_inputs, **kwargs)
        finally:
            self.seconds += time.perf_counter() - t0


def time_forward(fn: Callable[..., Any], inputs: tuple, target: Any, iters: int) -> list[float]:
    """Milliseconds of each of ``iters`` forwards (synchronized with the target)."""
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn(*inputs)
        target.synchronize()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def _shape(inputs: tuple) -> list[Any]:
    return [list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__ for x in leaves(inputs)]


@contextlib.contextmanager
def inference(model: nn.Module) -> Iterator[None]:
    """``model`` in eval mode under ``no_grad`` (its training flags restored after): the latency
    a model is deployed with, and for a compiled model an inference graph per shape, which the
    backend lowers in about half the time of a joint forward-backward one (measured on one graph
    per family; the canonical shape's extra dynamo trace takes most of that back)."""
    flags = {m: m.training for m in model.modules()}
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        for m, training in flags.items():
            m.training = training


def shape_sweep(spec: Any, fn: Callable[..., Any], dtype: torch.dtype, target: Any, counter: CountingBackend,
                first_s: float, timed_iters: int = TIMED_ITERS) -> dict[str, Any]:
    """Compile count of the canonical shape, then each shape variant's recompiles, and latency at
    each (run in inference: the canonical shape compiles its inference graph here)."""
    shapes, recompiles = [], 0
    for v, inputs in enumerate(spec.shape_variants()):
        x = target.to_device(cast(inputs, dtype))
        before = counter.compiles
        fn(*x)  # first call at this shape: compiles when the shape (or the inference mode) is new
        target.synchronize()
        n = counter.compiles - before
        if v:
            recompiles += n
        times = time_forward(fn, x, target, WARMUP + timed_iters)[WARMUP:] if timed_iters else []
        shapes.append({"shape": _shape(inputs), "recompiled": bool(v and n), "compiles": n,
                       "p50_ms": percentile(times, 0.5), "p99_ms": percentile(times, 0.99)})
    return {"recompiles": recompiles, "compile_s": first_s, "shapes": shapes,
            "p50_ms": shapes[0]["p50_ms"], "p99_ms": shapes[0]["p99_ms"]}
