"""The result dtypes the CPU kernel gives for a call's original arguments, from the op's meta
kernel, cached per operator and argument signature (the native path narrows int64/float64
inputs and casts its results back to these dtypes)."""

from __future__ import annotations

import warnings
from typing import Any

import torch


def _to_meta(v):
    if isinstance(v, torch.Tensor):
        if v.device.type == "cpu" and v.dim() == 0:
            return v  # a CPU scalar (possibly a wrapped Python number) stays as it is
        return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
    if isinstance(v, torch.device) and v.type == "neuron":
        return torch.device("meta")
    if isinstance(v, (list, tuple)) and any(isinstance(t, torch.Tensor) for t in v):
        return type(v)(_to_meta(t) if t is not None else None for t in v)
    return v


#: The result dtypes of a meta run, per operator and argument signature (:func:`_dtype_key`):
#: a meta kernel in Python costs ~0.2 ms, 40x an int64 add, and every int64/float64 call asks.
_META_DTYPES: dict[tuple, list[torch.dtype | None]] = {}
_META_DTYPES_MAX = 16384
_BOOL_PROBE = torch.empty(1, dtype=torch.bool)


def _dtype_key(v: Any) -> Any:
    """What of an argument can decide a result dtype: a tensor's dtype, whether it is 0-dim
    (type promotion ranks those below dimensioned tensors) and, for a CPU scalar (a wrapped
    Python number among them), how it promotes; everything else by type and value.
    Shapes and values of tensors are left out: no kernel's result dtype depends on them."""
    if isinstance(v, torch.Tensor):
        if v.dim() == 0 and v.device.type == "cpu":
            # A CPU scalar may be a wrapped Python number, which promotes as its category's
            # default dtype (t + 1.5 is float32 for an int64 t; t + tensor(1.5, float64) is
            # float64): how it promotes against a bool tensor tells the two apart.
            return ("S", v.dtype, torch.result_type(_BOOL_PROBE, v))
        return ("T", v.dtype, v.dim() == 0, v.layout)
    if isinstance(v, (list, tuple)):
        return (type(v), tuple(_dtype_key(x) for x in v))
    if isinstance(v, (bool, int, float, complex, str, torch.dtype, torch.device, torch.layout,
                      torch.memory_format)) or v is None:
        return (type(v), v)
    if isinstance(v, torch.Generator):
        return (torch.Generator,)
    raise TypeError("no dtype key")  # anything else: not cached


def _meta_dtypes(op, args, kwargs) -> list[torch.dtype | None] | None:
    """The result dtypes the CPU kernel would give for these (unconverted) arguments, from the
    op's meta kernel; None when it has none (the caller then uses its per-rule heuristic).
    Successful answers are cached per operator and argument signature (:func:`_dtype_key`);
    a failed meta run is asked again (it may depend on shapes)."""
    try:
        key = (op, _dtype_key(args), _dtype_key(tuple(sorted(kwargs.items()))))
    except TypeError:
        key = None
    if key is not None:
        hit = _META_DTYPES.get(key)
        if hit is not None:
            return hit
    got = _meta_dtypes_uncached(op, args, kwargs)
    if key is not None and got is not None:
        if len(_META_DTYPES) >= _META_DTYPES_MAX:
            _META_DTYPES.clear()
        _META_DTYPES[key] = got
    return got


def _meta_dtypes_uncached(op, args, kwargs) -> list[torch.dtype | None] | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = op(*[_to_meta(a) for a in args], **{k: _to_meta(v) for k, v in kwargs.items()})
    except Exception:
        return None
    items = res if isinstance(res, (tuple, list)) else [res]
    return [r.dtype if isinstance(r, torch.Tensor) else None for r in items]

