"""Compile behaviour and latency of a model item on the target.

:class:`CountingBackend` wraps a target's ``torch.compile`` backend and counts the graphs it
compiles, which of them Dynamo made dynamic and which ran (device-generic); :func:`shape_sweep`
runs a model compiled with PyTorch's automatic dynamic shapes over its spec's shape variants in
inference and records, per shape, what a user meets there: the graphs compiled, the graphs the
backend lowered, whether a dynamic graph served it, the first call's time, and p50/p99 forward
latency after ``WARMUP`` calls; :func:`time_forward` and :func:`percentile` are the latency
measurement itself.

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


def _free(value: Any) -> bool:
    """Is ``value`` (a SymInt or SymFloat) still a free symbol, not one that a guard pinned to a
    constant while Dynamo traced?"""
    node = getattr(value, "node", None)
    if node is None:
        return False
    expr = node.expr
    env = getattr(node, "shape_env", None)
    with contextlib.suppress(Exception):  # no replacement known: the expression as it is
        expr = env.replace(expr) if env is not None else expr
    return bool(getattr(expr, "free_symbols", ()))


def symbolic(example_inputs: Sequence[Any]) -> bool:
    """Did Dynamo trace this graph with symbolic sizes (a dynamic graph)? Its example inputs then
    hold SymInts, or fake tensors with SymInt sizes."""
    for x in example_inputs:
        if isinstance(x, torch.SymInt | torch.SymFloat) and _free(x):
            return True
        if isinstance(x, torch.Tensor) and any(isinstance(s, torch.SymInt) and _free(s) for s in x.shape):
            return True
    return False


def lowerings() -> int | None:
    """Graphs lowered through AOTAutograd in this process since dynamo's last reset: PyTorch's own
    compile-time record (``torch._dynamo.utils.compilation_time_metrics``), which every backend
    built on AOTAutograd feeds, also when it compiles at call time (a backend that specializes a
    dynamic graph per concrete shape). None where this PyTorch keeps no such record."""
    metrics = getattr(torch._dynamo.utils, "compilation_time_metrics", None)
    if not isinstance(metrics, dict):
        return None
    return len(metrics.get("create_aot_dispatcher_function", ()))


class CountingBackend:
    """A ``torch.compile`` backend that delegates to ``inner`` and counts the graphs Dynamo hands
    it (``compiles``), records for each whether it is dynamic (``dynamic``, see :func:`symbolic`)
    and which of them ran since ``ran`` was last cleared."""

    def __init__(self, inner: str | Callable[..., Any]):
        self.inner = torch._dynamo.lookup_backend(inner) if isinstance(inner, str) else inner
        self.compiles = 0
        self.seconds = 0.0
        self.dynamic: list[bool] = []  # per graph, in compile order
        self.ran: set[int] = set()  # indexes of the graphs called

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any, **kwargs: Any) -> Any:
        index = self.compiles
        self.compiles += 1
        self.dynamic.append(symbolic(example_inputs))
        t0 = time.perf_counter()
        try:
            compiled = self.inner(gm, example_inputs, **kwargs)
        finally:
            self.seconds += time.perf_counter() - t0

        def run(*args: Any, **kw: Any) -> Any:
            self.ran.add(index)
            return compiled(*args, **kw)

        return run

    def reset(self) -> None:
        """``torch._dynamo.reset()`` resets the backends compiled with since: ``inner`` too, where
        it can be (a backend's own cache of compiled graphs)."""
        reset = getattr(self.inner, "reset", None)
        if callable(reset):
            reset()


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
    each (run in inference: the canonical shape compiles its inference graph here).

    ``fn`` is compiled with automatic dynamic shapes (``dynamic=None``): the canonical shape's
    graph is static, the first shape change compiles once more with the changed sizes symbolic,
    and later shapes reuse that graph unless a guard fails. Per shape: ``dynamo_graphs``, the
    graphs Dynamo traced and handed the backend; ``lowerings``, the graphs the backend lowered
    (through AOTAutograd: a graph a compile cache served is none; None where unobservable), which
    a backend that specializes a dynamic graph per concrete shape (the Neuron compiler) pays at
    every new shape where Dynamo compiles nothing; ``compiles``, the graphs compiled at this shape
    (the more of the two); ``recompiled``, whether a shape after the canonical one compiled any;
    ``dynamic``, whether a graph that served the shape has symbolic sizes (None: no compiled graph
    ran); ``first_ms``, the first call's wall time there (what a user waits at a new shape);
    ``error``, only where that call raised (a backend that refuses the dynamic graph: the later
    shapes are still tried). ``recompiles`` sums the ``compiles`` of the shapes after the
    canonical one."""
    shapes, recompiles = [], 0
    for v, inputs in enumerate(spec.shape_variants()):
        x = target.to_device(cast(inputs, dtype))
        before, lowered = counter.compiles, lowerings()
        counter.ran.clear()
        error = None
        t0 = time.perf_counter()
        try:
            fn(*x)  # first call at this shape: compiles when the shape (or the inference mode) is new
            target.synchronize()
        except Exception as exc:  # noqa: BLE001 - what a user meets at this shape (a backend that refuses it)
            error = f"{type(exc).__name__}: {exc}"[:500]
        first_ms = (time.perf_counter() - t0) * 1e3
        n = counter.compiles - before
        after = lowerings()
        low = after - lowered if after is not None and lowered is not None else None
        compiled = max(n, low or 0)
        if v:
            recompiles += compiled
        ran = sorted(counter.ran)
        record = {"shape": _shape(inputs), "recompiled": bool(v and compiled), "compiles": compiled,
                  "dynamo_graphs": n, "lowerings": low,
                  "dynamic": any(counter.dynamic[i] for i in ran) if ran else None,
                  "first_ms": None if error else round(first_ms, 3), "p50_ms": None, "p99_ms": None}
        if error:
            record["error"] = error
        elif timed_iters:
            times = time_forward(fn, x, target, WARMUP + timed_iters)[WARMUP:]
            record["p50_ms"], record["p99_ms"] = percentile(times, 0.5), percentile(times, 0.99)
        shapes.append(record)
    return {"recompiles": recompiles, "compile_s": first_s, "shapes": shapes,
            "p50_ms": shapes[0]["p50_ms"], "p99_ms": shapes[0]["p99_ms"]}
