"""Localize a model-level divergence to the first ATen op whose own output diverges.

The model's ATen graph (``make_fx`` over ``functional_call``; with ``backward=True`` the joint
forward + backward graph of a vector-Jacobian product with seeded cotangents) is run node by node
with three environments:

* **cpu** -- every node on the CPU (the reference);
* **device** -- every node on the target, each fed the target's own earlier results
  (``propagated`` error: what the model run sees);
* **local** -- each node on the target fed the *CPU's* inputs (``local`` error: what this op
  alone gets wrong).

The first node (graph order) whose local error exceeds the tolerance is the culprit; when no
node's local error does, the first node whose propagated error does is reported with a note that
the error accumulated. Errors are normwise, as in the model comparison: ``||t - c|| / ||c|| <= tol`` per output
tensor (:func:`rel_l2`). Random ops (``nondeterministic_seeded``) and ops whose values are
undefined (``empty_like`` and the other ``meta`` comparators: uninitialised memory) are not
compared; the device continues from the CPU's values. An op that returns values and indices
(``max_pool2d_with_indices``, ``sort``, ``topk``: indices may legally differ on ties) is judged by
its values.

Example::

    >>> import torch
    >>> from conformance.models.localize import localize
    >>> from conformance.targets import get_target
    >>> m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU())
    >>> localize(m, (torch.randn(2, 4),), get_target("cpu"), torch.float32, tol=1e-5) is None
    True
"""

from __future__ import annotations

import copy
import operator
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn
from torch.func import functional_call
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from conformance.check.comparators import comparator_for
from conformance.check.compare import leaves
from conformance.structure import flatten, map_tensors, named_leaves, tensor_leaves, unflatten

from .tracing import isolated_caches, node_target


@dataclass(frozen=True)
class Divergence:
    op: str  # "aten::gelu.default"
    node: str  # fx node name
    index: int  # position among the graph's op nodes
    local_err: float  # ||t - c|| / ||c|| with the CPU's inputs
    propagated_err: float  # ||t - c|| / ||c|| along the device's own chain
    detail: str


def _float_like(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point()


def _float_leaves(value: Any) -> list[torch.Tensor]:
    """The floating-point tensors of an output (an op's values without its indices)."""
    return [x for _, x in named_leaves(value) if isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex())]


def _values_and_indices(value: Any) -> bool:
    """Whether an output holds float values beside integer tensors (``max_pool2d_with_indices``,
    ``sort``, ``topk``, ``max.dim``...: indices that may legally differ where values tie)."""
    kinds = {x.is_floating_point() or x.is_complex() for _, x in named_leaves(value) if isinstance(x, torch.Tensor)}
    return kinds == {True, False}


def rel_l2(cpu: Any, dev: Any) -> float:
    """Worst normwise relative error ``||t - c|| / ||c||`` over the float tensors of an output
    (exact comparison for integer/bool tensors: 0 or inf). NaN/Inf where the CPU has none: inf."""
    worst = 0.0
    for (_, c), (_, t) in zip(named_leaves(cpu), named_leaves(dev), strict=False):
        if not (isinstance(c, torch.Tensor) and isinstance(t, torch.Tensor)):
            continue
        if c.shape != t.shape:
            return float("inf")
        if not c.numel():
            continue
        if not (c.is_floating_point() or c.is_complex()):
            worst = max(worst, 0.0 if torch.equal(c, t.to(c.dtype)) else float("inf"))
            continue
        c64, t64 = c.detach().double(), t.detach().double()
        cf, tf = torch.isfinite(c64), torch.isfinite(t64)
        if not torch.equal(cf, tf):
            return float("inf")
        nc, nt = c64[~cf], t64[~tf]  # same positions: the same NaN/Inf values
        if not (torch.equal(torch.isnan(nc), torch.isnan(nt)) and torch.equal(nc.nan_to_num(0.0), nt.nan_to_num(0.0))):
            return float("inf")
        num = float((t64[cf] - c64[cf]).norm())
        den = float(c64[cf].norm())
        worst = max(worst, num / den if den > 0 else (0.0 if num == 0 else float("inf")))
    return worst


def _shapes(value: Any) -> str:
    parts = [f"{list(t.shape)} {str(t.dtype).removeprefix('torch.')}" for t in leaves(value) if isinstance(t, torch.Tensor)]
    return ", ".join(parts[:4]) + (" ..." if len(parts) > 4 else "")


def trace_graph(model: nn.Module, inputs: tuple, *, backward: bool = False,
                seed: int = 0) -> tuple[fx.GraphModule, list[Any]]:
    """The ATen graph to localize over and its flat real inputs (placeholders in order).

    Inputs and outputs of any structure (ModelOutput, KV caches: :mod:`conformance.structure`) are
    traced through their tensor leaves: the graph takes the inputs' tensors and returns the outputs'.
    """
    params = {n: p.detach().clone().requires_grad_(backward) for n, p in model.named_parameters()}
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    named, in_spec = flatten(tuple(inputs))
    fixed = [x for _, x in named]
    tensors = [x for x in fixed if isinstance(x, torch.Tensor)]

    def caller(m: nn.Module) -> Any:
        def call(params: dict, buffers: dict, args: list) -> list[torch.Tensor]:  # make_fx counts its parameters
            it = iter(args)
            rebuilt = unflatten(in_spec, [next(it) if isinstance(x, torch.Tensor) else x for x in fixed])
            return tensor_leaves(functional_call(m, {**params, **buffers}, rebuilt))
        return call

    call = caller(model)

    if not backward:
        with isolated_caches(model):
            gm = make_fx(call, tracing_mode="fake")(params, buffers, tensors)
        flat, _ = tree_flatten((params, buffers, tensors))
        return gm, flat
    # Cotangents for the float outputs, seeded, from a real forward run on a copy.
    with torch.no_grad():
        out = caller(copy.deepcopy(model))(params, {k: v.clone() for k, v in buffers.items()}, [t.clone() for t in tensors])
    gen = torch.Generator().manual_seed(seed)
    cots = [torch.randn(o.shape, generator=gen).to(o.dtype) for o in out if _float_like(o)]

    def joint(params: dict, buffers: dict, args: list, cots: list) -> Any:
        out = call(params, buffers, args)
        outs = [o for o in out if _float_like(o) and o.requires_grad]
        grads = torch.autograd.grad(outs, list(params.values()), grad_outputs=cots[:len(outs)], allow_unused=True)
        return out, grads

    with isolated_caches(model):
        gm = make_fx(joint, tracing_mode="fake")(params, buffers, tensors, cots)
    flat, _ = tree_flatten((params, buffers, tensors, cots))
    return gm, [x.detach() if isinstance(x, torch.Tensor) else x for x in flat]


def localize(model: nn.Module, inputs: tuple, target: Any, dtype: torch.dtype, *, tol: float,
             backward: bool = False, seed: int = 0) -> Divergence | None:
    """The first op of ``model``'s ATen graph that diverges on ``target`` (None if none does).

    ``model``/``inputs`` are float32 CPU originals (copied, cast to ``dtype``, never mutated).
    """
    model = copy.deepcopy(model).to(dtype)
    inputs = map_tensors(lambda x: x.to(dtype) if _float_like(x) else x, tuple(inputs))
    gm, flat = trace_graph(model, inputs, backward=backward, seed=seed)
    dev = torch.device(target.device)

    def to_dev(v: Any) -> Any:
        def one(x: Any) -> Any:
            if isinstance(x, torch.Tensor):
                return target.to_device(x.detach().clone())  # the target's way on (its build, for the emulator)
            if isinstance(x, torch.device) and x.type == "cpu":
                return dev
            return x
        return tree_map(one, v)

    env_c: dict[fx.Node, Any] = {}
    env_t: dict[fx.Node, Any] = {}
    placeholders = iter(flat)
    first_prop: Divergence | None = None
    index = -1
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            v = next(placeholders)
            env_c[node] = v.clone() if isinstance(v, torch.Tensor) else v
            env_t[node] = to_dev(v)
            continue
        if node.op == "get_attr":
            v = getattr(gm, str(node.target))
            env_c[node], env_t[node] = v, to_dev(v)
            continue
        if node.op == "output":
            break
        index += 1
        args_c, kwargs_c = fx.node.map_arg((node.args, node.kwargs), lambda n: env_c[n])
        local_args, local_kwargs = to_dev((args_c, kwargs_c))  # before the CPU op mutates anything
        out_c = node.target(*args_c, **kwargs_c)
        args_t, kwargs_t = fx.node.map_arg((node.args, node.kwargs), lambda n: env_t[n])
        args_t, kwargs_t = to_dev_devices((args_t, kwargs_t), dev)
        op = node_target(node)
        random = isinstance(node.target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in node.target.tags
        semantic = comparator_for(op) if isinstance(node.target, torch._ops.OpOverload) else "allclose"
        env_c[node] = out_c
        if random or semantic == "meta":  # random or uninitialised values: nothing to compare
            env_t[node] = to_dev(out_c)
            continue
        try:
            out_t = node.target(*args_t, **kwargs_t)
        except Exception as exc:  # noqa: BLE001 - the device cannot run this node
            return Divergence(op, node.name, index, float("inf"), float("inf"),
                              f"{op} (node {node.name}, output {_shapes(out_c)}) raises on the target: "
                              f"{type(exc).__name__}: {exc}"[:2000])
        env_t[node] = out_t
        if node.target is operator.getitem or not any(isinstance(x, torch.Tensor) for x in leaves(out_c)):
            continue  # a getitem only selects: the op that made the tuple was judged (its indices by its values)
        out_local = node.target(*local_args, **local_kwargs)
        local_cpu = tree_map(lambda x: x.detach().to("cpu") if isinstance(x, torch.Tensor) else x, out_local)
        prop_cpu = tree_map(lambda x: x.detach().to("cpu") if isinstance(x, torch.Tensor) else x, out_t)
        if _values_and_indices(out_c):  # indices may legally differ on ties: the values are compared
            out_c, local_cpu, prop_cpu = (_float_leaves(x) for x in (out_c, local_cpu, prop_cpu))
        le, pe = rel_l2(out_c, local_cpu), rel_l2(out_c, prop_cpu)
        if le <= tol and pe <= tol:
            continue
        where = (f"{op} (node {node.name}, #{index} of the {'joint forward+backward' if backward else 'forward'} "
                 f"graph; inputs {_shapes(args_c)} -> output {_shapes(out_c)})")
        errs = (f"local error {le:.3g} (target fed the CPU's inputs) vs propagated error {pe:.3g} "
                f"(target's own chain), ||t - c|| / ||c||, tolerance {tol:g}")
        if le > tol:
            return Divergence(op, node.name, index, le, pe, f"{where}: {errs}"[:2000])
        if first_prop is None:
            first_prop = Divergence(op, node.name, index, le, pe,
                                    f"{where}: error accumulated from earlier ops (no single op diverges locally): "
                                    f"{errs}"[:2000])
    return first_prop


def to_dev_devices(value: Any, dev: torch.device) -> Any:
    """Factory kwargs baked as ``device='cpu'`` by the trace point at the target's device."""
    return tree_map(lambda x: dev if isinstance(x, torch.device) and x.type == "cpu" else x, value)


class _RaisingOp(TorchDispatchMode):
    """Names the first ATen overload whose call raised: the innermost one, since a dispatch mode
    sees the ops below autograd and composite decompositions (the kernels the device is handed)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.op: str | None = None
        self.index = -1
        self.inputs = ""
        self.error: BaseException | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        self.count += 1
        try:
            return func(*args, **(kwargs or {}))
        except Exception as exc:
            if self.op is None:
                self.op = f"{func.namespace}::{func._opname}.{func._overloadname}"
                self.index, self.inputs, self.error = self.count - 1, _shapes((args, kwargs)), exc
            raise


def raising_op(model: nn.Module, inputs: tuple, target: Any, dtype: torch.dtype, *,
               loss: Any = None, seed: int = 0) -> Divergence | None:
    """The ATen op that raises when ``model`` runs on ``target`` (None: nothing raises).

    For an item whose target side raised: a graph traced on the CPU holds the CPU's
    decompositions, not the kernels the device is handed (an LSTM cell, for one, decomposes to a
    fused kernel only on an accelerator), so the model itself runs once more on the target,
    eager, placement, forward and (through ``loss``, else the float outputs' sum) backward, under
    a dispatch mode that names the op whose call raised. Device-generic: what raised is read
    from the run, never from what a device says it supports.

        >>> import torch
        >>> from conformance.targets import get_target
        >>> raising_op(torch.nn.Linear(4, 2), (torch.randn(3, 4),), get_target("cpu"), torch.float32) is None
        True
    """
    model = copy.deepcopy(model).to(dtype)
    inputs = tree_map(lambda x: x.to(dtype) if _float_like(x) else x, tuple(inputs))
    mode = _RaisingOp()
    torch.manual_seed(seed)
    try:
        with mode:
            m = model.to(target.device)
            out = m(*target.to_device(inputs))
            if loss is not None:
                value = loss(tree_map(lambda x: x.to("cpu") if isinstance(x, torch.Tensor) else x, out))
            else:
                value = sum(o.float().sum() for o in leaves(out) if _float_like(o) and o.requires_grad)
            if isinstance(value, torch.Tensor) and value.requires_grad:
                value.backward()
            target.synchronize()
    except Exception as exc:  # noqa: BLE001 - the target's error is what is being localized
        if mode.op is None:
            return None
        err = mode.error or exc
        return Divergence(mode.op, "", mode.index, float("inf"), float("inf"),
                          f"{mode.op} (#{mode.index} of the ATen ops dispatched on the target; inputs "
                          f"{mode.inputs}) raises on the target: {type(err).__name__}: {err}"[:2000])
    return None
