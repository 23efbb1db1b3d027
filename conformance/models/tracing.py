"""ATen-graph tracing, structural hashing and op histograms.

The graph is traced with ``make_fx`` over ``functional_call`` so that parameters and buffers
are graph inputs (placeholders) rather than constants: the hash sees their shapes and dtypes,
never their values. Default tracing mode is ``fake`` (no real compute, no buffer mutation).
The traced graph is the forward pass in train mode with autograd enabled (what a training step
runs forward); the backward graph is not hashed. Lowering is the CPU one of this torch build
(e.g. ``nn.LSTM`` becomes ``aten::mkldnn_rnn_layer`` where oneDNN is available).
``method="export"`` uses ``torch.export.export(...).run_decompositions()`` instead (core ATen;
slower, and its hashes differ from ``make_fx`` hashes).

Example:
    >>> import torch
    >>> from conformance.models.tracing import graph_hash, aten_histogram
    >>> m = torch.nn.Linear(4, 2)
    >>> x = torch.randn(3, 4)
    >>> graph_hash(m, (x,)) == graph_hash(torch.nn.Linear(4, 2), (torch.zeros(3, 4),))
    True
    >>> aten_histogram(m, (x,))["aten::addmm.default"]
    1
    >>> from conformance.models.tracing import topology_hash, trace
    >>> wide = trace(torch.nn.Linear(8, 5), (torch.zeros(3, 8),))
    >>> topology_hash(trace(m, (x,))) == topology_hash(wide), graph_hash(m, (x,)) == hash_graph(wide)
    (True, False)
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch
from torch import fx, nn
from torch.func import functional_call
from torch.fx.experimental.proxy_tensor import make_fx


def _library_caches(module: nn.Module) -> list[Any]:
    """The ``functools`` caches defined by the packages ``module``'s layers come from: not torch's,
    and never the harness's or the emulator's own (the registry's families live in this package;
    its caches hold loaded data files and learned placements, which no trace fills)."""
    packages = {type(m).__module__.split(".")[0] for m in module.modules()} - {
        "torch", "builtins", __name__.split(".")[0], "neuron_emu"}
    if not packages:
        return []
    # type(), not isinstance(): the heap holds weak proxies, and isinstance asks a dead one for its
    # __class__ (ReferenceError: the model items of a fixed nightly failed their trace with it)
    return [o for o in gc.get_objects() if type(o) is functools._lru_cache_wrapper
            and (getattr(o, "__module__", None) or "").split(".")[0] in packages]


@contextlib.contextmanager
def isolated_caches(module: nn.Module) -> Iterator[None]:
    """Run a fake-mode trace of ``module`` with its libraries' function caches emptied before and
    after: a cache keyed by sizes, dtype and device (transformers' ``lru_cache`` of anchors and
    patch coordinates: RT-DETR, DINOv3, Mask2Former...) would otherwise hand the trace a real
    tensor made by an earlier run, and the next real run the FakeTensor the trace made ("Please
    convert all Tensors to FakeTensors first")."""
    caches = _library_caches(module)
    for cache in caches:
        cache.cache_clear()
    try:
        yield
    finally:
        for cache in caches:
            cache.cache_clear()


def trace(
    module: nn.Module, inputs: tuple, *, method: str = "make_fx", tracing_mode: str = "fake"
) -> fx.GraphModule:
    """Trace ``module(*inputs)`` to an ATen-level ``fx.GraphModule``."""
    if method == "export":
        return torch.export.export(module, tuple(inputs)).run_decompositions().graph_module
    if method != "make_fx":
        raise ValueError(f"unknown trace method {method!r}; known: make_fx, export")
    state = {**dict(module.named_parameters()), **dict(module.named_buffers())}

    def fn(state: dict, *args: Any) -> Any:
        return functional_call(module, state, args)

    # a real tensor the model keeps outside its parameters and buffers (a plain attribute, a
    # sinusoid table) is a constant of the graph, as torch.export takes it
    with isolated_caches(module):
        return make_fx(fn, tracing_mode=tracing_mode, _allow_non_fake_inputs=True)(state, *inputs)


def _meta(value: Any) -> Any:
    """Shape/dtype structure of a node's ``meta['val']`` (values never included)."""
    if isinstance(value, torch.Tensor):
        return (
            tuple(int(s) if not isinstance(s, torch.SymInt) else str(s) for s in value.shape),
            str(value.dtype),
        )
    if isinstance(value, list | tuple):
        return tuple(_meta(v) for v in value)
    if isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
        return str(value)
    return repr(value) if value is not None else None


def _arg(a: Any, index: dict[fx.Node, int]) -> Any:
    """Encode an argument: nodes as indices, containers recursively, constants by repr."""
    if isinstance(a, fx.Node):
        return f"%{index[a]}"
    if isinstance(a, list | tuple):
        return tuple(_arg(x, index) for x in a)
    if isinstance(a, dict):
        return tuple(sorted((k, _arg(v, index)) for k, v in a.items()))
    return (
        repr(a)
        if not isinstance(a, torch.dtype | torch.device | torch.layout | torch.memory_format)
        else str(a)
    )


def node_target(node: fx.Node) -> str:
    t = node.target
    if isinstance(t, torch._ops.OpOverload):
        return f"{t.namespace}::{t._opname}.{t._overloadname}"
    return getattr(t, "__name__", str(t))


def graph_records(gm: fx.GraphModule) -> list[tuple]:
    """One record per node: (kind/op, args, kwargs, output meta). Names are never included."""
    index: dict[fx.Node, int] = {}
    records = []
    for i, node in enumerate(gm.graph.nodes):
        index[node] = i
        if node.op == "placeholder":
            rec: tuple = ("in", _meta(node.meta.get("val")))
        elif node.op == "get_attr":
            rec = ("const", _meta(getattr(gm, str(node.target), None)))
        elif node.op == "output":
            rec = ("out", _arg(node.args, index))
        else:
            rec = (
                node_target(node),
                _arg(node.args, index),
                _arg(node.kwargs, index),
                _meta(node.meta.get("val")),
            )
        records.append(rec)
    return records


def hash_graph(gm: fx.GraphModule) -> str:
    """SHA-256 (first 20 hex chars) of the graph's node records."""
    text = "\n".join(repr(r) for r in graph_records(gm))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _sizeless(rec: Any) -> Any:
    """A record with its sizes blanked: tensor shapes become their rank, numbers ``#``."""
    if isinstance(rec, tuple):
        if len(rec) == 2 and isinstance(rec[0], tuple) and isinstance(rec[1], str) and rec[1].startswith("torch."):
            return (len(rec[0]), rec[1])  # a tensor's (shape, dtype) meta
        return tuple(_sizeless(r) for r in rec)
    if isinstance(rec, str) and rec.lstrip("-").replace(".", "", 1).isdigit():
        return "#"  # an int or float constant (a size, a width, an epsilon)
    return rec


def topology_hash(gm: fx.GraphModule) -> str:
    """SHA-256 (first 20 hex chars) of the graph with its sizes blanked: models that differ only
    in width, image size or other numbers (timm's ``_small``/``_base`` variants) share it, while
    another depth, layer kind or wiring changes it."""
    text = "\n".join(repr(_sizeless(r)) for r in graph_records(gm))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def histogram(gm: fx.GraphModule) -> dict[str, int]:
    """``"ns::name.overload" -> count`` for every operator-overload call in ``gm``."""
    ops = (
        n for n in gm.graph.nodes if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
    )
    return dict(sorted(Counter(node_target(n) for n in ops).items()))


def graph_hash(module: nn.Module, inputs: tuple, *, method: str = "make_fx") -> str:
    """Structural hash of the ATen graph of ``module(*inputs)``."""
    return hash_graph(trace(module, inputs, method=method))


def aten_histogram(module: nn.Module, inputs: tuple, *, method: str = "make_fx") -> dict[str, int]:
    """ATen op histogram of ``module(*inputs)`` from the same trace as ``graph_hash``."""
    return histogram(trace(module, inputs, method=method))


class Traceable:
    """``trace()``, ``graph_hash()`` and ``aten_histogram()`` for a model spec that has ``build()``
    and ``example_inputs(batch_shape_variant)`` (the registry's, the zoo's)."""

    def trace(self, method: str = "make_fx", batch_shape_variant: int = 0) -> fx.GraphModule:
        """ATen graph of the forward pass of a fresh build on shape variant ``batch_shape_variant``."""
        return trace(self.build(), self.example_inputs(batch_shape_variant), method=method)  # type: ignore[attr-defined]

    def graph_hash(self, method: str = "make_fx") -> str:
        """Structural hash of this spec's ATen graph."""
        return hash_graph(self.trace(method))

    def aten_histogram(self, method: str = "make_fx") -> dict[str, int]:
        """ATen op histogram of this spec's forward graph."""
        return histogram(self.trace(method))
