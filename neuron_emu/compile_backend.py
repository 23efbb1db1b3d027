"""``torch.compile(backend="neuron")``: capture, lower to ATen, partition per build, cache.

The backend lowers each Dynamo graph to ATen with AOTAutograd (forward and backward graphs),
partitions every ATen graph into maximal runs of native / CPU-fallback ops according to the active
build, and caches compiled graphs per (graph, input signature).  Running a compiled graph executes
its ATen ops on neuron tensors through the same dispatch as eager mode, so numerics, defects and
op tracking are identical.  Like the real backend it refuses ``dynamic=True``; shapes that
automatic-dynamic would turn symbolic are specialized per concrete shape in this module's cache
(the one dynamic Dynamo graph is lowered again at every new concrete shape, at its first call).
``torch._dynamo.reset()`` clears the cache, as it would start empty in a fresh process.

Example::

    >>> import torch, neuron_emu
    >>> neuron_emu.reset_compile_stats()
    >>> f = torch.compile(lambda x: torch.relu(x) * 2, backend="neuron")
    >>> _ = f(torch.randn(4, device="neuron"))
    >>> neuron_emu.compile_stats()["compiles"] >= 1
    True
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import torch
from torch._dynamo import register_backend

from . import dispatch as _dispatch

_STATS: dict[str, Any] = {}
_CACHE: dict[tuple, Any] = {}
_SEEN_CODE: set[str] = set()


def reset_compile_stats() -> None:
    """Zeroes the counters and forgets recorded graphs (the compiled-graph cache is kept)."""
    _STATS.clear()
    _STATS.update(compiles=0, recompiles=0, cache_hits=0, cache_misses=0, calls=0,
                  compile_seconds=0.0, graphs=[])


def clear_compile_cache() -> None:
    """Forgets compiled graphs (the next call of any graph recompiles)."""
    _CACHE.clear()
    _SEEN_CODE.clear()


def compile_stats() -> dict[str, Any]:
    """Counters and per-graph partitions of the neuron compile backend.

    Keys: ``compiles`` (ATen lowerings), ``recompiles`` (lowerings of an already seen graph for a
    new input signature), ``cache_misses`` (= lowerings) and ``cache_hits``,
    ``calls`` (executions of compiled graphs; every call but the first of a freshly compiled graph
    is a cache hit), ``compile_seconds`` and ``graphs``: one dict per
    compiled ATen graph with ``kind`` ("forward"/"backward"/"inference"), ``signature``,
    ``partitions`` (list of {"kind": "native"|"fallback", "ops": [...]}), ``native_ops``,
    ``fallback_ops`` and ``compile_seconds``.
    """
    out = dict(_STATS)
    out["graphs"] = [dict(g) for g in _STATS["graphs"]]
    return out


reset_compile_stats()


def _op_name(target) -> str | None:
    if isinstance(target, torch._ops.OpOverload):
        return f"{target._schema.name}.{target._overloadname}"
    return None


def partition(gm: torch.fx.GraphModule) -> list[dict[str, Any]]:
    """Splits an ATen graph into maximal runs of native / fallback ops (topological order)."""
    parts: list[dict[str, Any]] = []
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        name = _op_name(node.target)
        if name is None:
            continue
        kind = "native" if _dispatch.plan_for(name).native else "fallback"
        if not parts or parts[-1]["kind"] != kind:
            parts.append({"kind": kind, "ops": []})
        parts[-1]["ops"].append(name)
    return parts


def _signature(inputs) -> tuple:
    sig = []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            sig.append(("T", tuple(int(s) for s in x.shape), tuple(int(s) for s in x.stride()),
                        str(x.dtype), str(x.device), bool(x.requires_grad)))
        elif isinstance(x, torch.SymInt):
            sig.append(("S", str(x)))
        else:
            sig.append(("V", repr(x)))
    return tuple(sig)


def _is_symbolic(inputs) -> bool:
    for x in inputs:
        if isinstance(x, torch.SymInt):
            return True
        if isinstance(x, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in (*x.shape, *x.stride())):
            return True
    return False


def _graph_compiler(kind_hint: str, signature: tuple):
    def compile_graph(gm: torch.fx.GraphModule, example_inputs):
        from functorch.compile import make_boxed_func

        t0 = time.perf_counter()
        parts = partition(gm)
        native = sorted({o for p in parts if p["kind"] == "native" for o in p["ops"]})
        fallback = sorted({o for p in parts if p["kind"] == "fallback" for o in p["ops"]})
        if fallback and _dispatch._ext().get_strict():
            raise RuntimeError(
                f"neuron_emu strict mode: compiled graph needs CPU fallback for {fallback[0]}"
                f"{' (and ' + str(len(fallback) - 1) + ' more)' if len(fallback) > 1 else ''} on Neuron SDK "
                f"build {_dispatch.S.build.name}: {fallback}")
        kind = kind_hint
        _STATS["graphs"].append(dict(
            kind=kind, signature=signature, partitions=parts, native_ops=native, fallback_ops=fallback,
            build=_dispatch.S.build.name, compile_seconds=time.perf_counter() - t0,
        ))
        return make_boxed_func(gm.forward)

    return compile_graph


def _lower(gm: torch.fx.GraphModule, example_inputs, signature: tuple):
    from torch._functorch.aot_autograd import aot_module_simplified

    return aot_module_simplified(
        gm, list(example_inputs),
        fw_compiler=_graph_compiler("forward", signature),
        bw_compiler=_graph_compiler("backward", signature),
        inference_compiler=_graph_compiler("inference", signature),
    )


def _counted(fn):
    fresh = [True]

    def run(*args):
        _STATS["calls"] += 1
        if fresh[0]:
            fresh[0] = False
        else:
            _STATS["cache_hits"] += 1
        return fn(*args)

    if getattr(fn, "_boxed_call", False):
        run._boxed_call = True  # type: ignore[attr-defined]
    return run


def _compile(gm: torch.fx.GraphModule, example_inputs, code_key: str):
    sig = _signature(example_inputs)
    key = (code_key, sig, torch.is_grad_enabled(), _dispatch.S.build.name)
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    _STATS["cache_misses"] += 1
    t0 = time.perf_counter()
    compiled = _counted(_lower(gm, example_inputs, sig))
    _STATS["compile_seconds"] += time.perf_counter() - t0
    _STATS["compiles"] += 1
    if code_key in _SEEN_CODE:
        _STATS["recompiles"] += 1
    _SEEN_CODE.add(code_key)
    _CACHE[key] = compiled
    return compiled


class _Specializer:
    """Runs a symbolic-shape Dynamo graph by compiling one static graph per concrete signature."""

    def __init__(self, gm: torch.fx.GraphModule, code_key: str):
        self.gm = gm
        self.code_key = code_key

    def __call__(self, *args):
        compiled = _compile(self.gm, args, self.code_key)
        return compiled(*args)


def _structure_key(gm: torch.fx.GraphModule) -> str:
    """Identity of a graph ignoring shapes: its sequence of tensor operations."""
    import operator

    ops = []
    for n in gm.graph.nodes:
        if n.op not in ("call_function", "call_method", "call_module"):
            continue
        t = n.target
        if n.op == "call_method" and t in ("size", "stride", "dim", "numel"):
            continue
        if n.op == "call_function" and (getattr(t, "__module__", "") in (operator.__name__, "_operator")
                                         or "sym_" in getattr(t, "__name__", "")):
            continue
        ops.append(f"{n.op}:{t}")
    return hashlib.sha256("\n".join(ops).encode()).hexdigest()


def _dynamic_requested() -> bool:
    return not torch._dynamo.config.assume_static_by_default


@register_backend(name="neuron")
def neuron_backend(gm: torch.fx.GraphModule, example_inputs, **kwargs):
    """The ``torch.compile`` backend of the emulated Neuron device."""
    if _dynamic_requested():
        raise RuntimeError(
            "neuron backend: dynamic shapes are not supported (torch.compile(..., dynamic=True)); "
            "the Neuron compiler specializes every graph to static shapes. Use dynamic=False or None.")
    code_key = _structure_key(gm)
    if _is_symbolic(example_inputs):
        return _Specializer(gm, code_key)
    return _compile(gm, example_inputs, code_key)


# ``torch._dynamo.reset()`` (dynamo "as if in a fresh process") resets the backends compiled with
# since its last reset: a fresh process holds no compiled graph of this backend's either, so the
# graphs lowered for one compiled model never stand for another's after it (their lowerings, and
# with them a shape sweep's recompiles, would depend on what ran before in the process)
neuron_backend.reset = clear_compile_cache  # type: ignore[attr-defined]
