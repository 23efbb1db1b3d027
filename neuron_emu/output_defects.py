"""Defects that act on a call's results (wrong_result, wrong_dtype, view_as_copy, out_reallocates,
...), the accepts_invalid result of a call the CPU kernel rejected, and the schema helpers they
share: which arguments a call writes, which of its returns are fresh, written or views."""

from __future__ import annotations

import torch

from . import defects as _defects
from .routing import OpPlan, S


def _outputs(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [o for o in out if isinstance(o, torch.Tensor)]
    return []


def _return_kind(ret) -> str:
    """"fresh" (a new tensor), "written" (an out=/in-place argument) or "view" (an alias of an input)."""
    if ret.alias_info is None:
        return "fresh"
    return "written" if ret.alias_info.is_write else "view"


def _map_returns(plan: OpPlan, out, fn):
    """`out` with fn(tensor, return kind) applied to each tensor it holds (list elements included)."""
    rets = plan.op._schema.returns

    def one(v, ret):
        kind = _return_kind(ret)
        if isinstance(v, torch.Tensor):
            return fn(v, kind)
        if isinstance(v, list):
            return [fn(t, kind) if isinstance(t, torch.Tensor) else t for t in v]
        return v

    if len(rets) == 1:
        return one(out, rets[0])
    if isinstance(out, (tuple, list)) and len(out) == len(rets):
        return type(out)(one(v, r) for v, r in zip(out, rets, strict=True))
    return out


def _arg_values(plan: OpPlan, args, kwargs):
    """(schema argument, value) for every argument of the call."""
    for i, a in enumerate(plan.op._schema.arguments):
        if i < len(args):
            yield a, args[i]
        elif a.name in kwargs:
            yield a, kwargs[a.name]


def _tensors_of(v) -> list[torch.Tensor]:
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (list, tuple)):
        return [t for t in v if isinstance(t, torch.Tensor)]
    return []


def _input_tensors(plan: OpPlan, args, kwargs) -> list[torch.Tensor]:
    """The call's neuron tensor inputs: every tensor argument the op does not write (not out=)."""
    return [t for a, v in _arg_values(plan, args, kwargs)
            if a.alias_info is None or not a.alias_info.is_write
            for t in _tensors_of(v) if t.device.type == "neuron"]


def _out_tensors(plan: OpPlan, args, kwargs) -> list[torch.Tensor]:
    return [t for a, v in _arg_values(plan, args, kwargs) if a.is_out for t in _tensors_of(v)]


def _reallocate(t: torch.Tensor) -> None:
    """out_reallocates: `t` keeps its values, sizes and strides in new storage."""
    fresh = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device)
    fresh.copy_(t)
    t.set_(fresh)


def _garbage(plan: OpPlan, args, kwargs, err: Exception):
    """accepts_invalid: the result of a call the CPU kernel rejected -- zeros shaped like the first
    tensor input for fresh results, the out= tensors zeroed, in-place arguments as they are."""
    schema = plan.op._schema
    inputs = _input_tensors(plan, args, kwargs)
    outs = _out_tensors(plan, args, kwargs)
    for t in outs:
        t.zero_()
    written = {}
    for a, v in _arg_values(plan, args, kwargs):
        if a.alias_info is not None and a.alias_info.is_write:
            written.setdefault(frozenset(a.alias_info.before_set), v)
    like = outs[0] if outs else (inputs[0] if inputs else None)
    res = []
    for r in schema.returns:
        typ = str(r.type)
        if (r.alias_info is not None and r.alias_info.is_write
                and frozenset(r.alias_info.before_set) in written):
            res.append(written[frozenset(r.alias_info.before_set)])
        elif typ == "Tensor":
            res.append(_defects.garbage_like(like, "neuron"))
        elif typ == "List[Tensor]":
            res.append([_defects.garbage_like(like, "neuron")])
        elif typ in ("bool", "int", "SymInt", "float", "Scalar"):
            res.append(False if typ == "bool" else 0.0 if typ == "float" else 0)
        elif typ.startswith("Optional["):
            res.append(None)
        else:
            raise err  # no garbage of this return type: the kernel's error stands
    if not res:
        return None
    return res[0] if len(res) == 1 else tuple(res)


def _apply_output_defects(plan: OpPlan, fired, out, args, kwargs):
    for d in fired:
        if d.kind in ("wrong_result", "nan"):
            _defects.perturb_outputs(d, _outputs(out))
        elif d.kind == "wrong_dtype":
            if isinstance(out, torch.Tensor):
                out = _defects.wrong_dtype(out)
            elif isinstance(out, tuple):
                out = tuple(_defects.wrong_dtype(o) if isinstance(o, torch.Tensor) else o for o in out)
        elif d.kind == "wrong_strides":
            out = _map_returns(plan, out, lambda t, k: _defects.relayout(t) if k == "fresh" else t)
        elif d.kind == "view_as_copy":
            out = _map_returns(plan, out, lambda t, k: t.clone(memory_format=torch.contiguous_format)
                               if k == "view" else t)
        elif d.kind == "out_reallocates":
            for t in _out_tensors(plan, args, kwargs):
                _reallocate(t)
        elif d.kind == "nondeterministic":
            if S.defect_state.times_fired(d) % 2 == 0:  # every second call: consecutive calls differ
                for t in _results(plan, out):
                    _defects.nudge_ulp(t)
        elif d.kind == "noncontiguous_wrong":
            if any(not t.is_contiguous() for t in _input_tensors(plan, args, kwargs)):
                _defects.perturb_outputs(d, _results(plan, out), "wrong_result")
    return out


def _results(plan: OpPlan, out) -> list[torch.Tensor]:
    """The tensors a call produced (fresh or written), not the views of its inputs it returned."""
    got: list[torch.Tensor] = []

    def keep(t, kind):
        if kind != "view":
            got.append(t)
        return t

    _map_returns(plan, out, keep)
    return got

