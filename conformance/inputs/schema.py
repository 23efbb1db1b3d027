"""Schema-driven inputs: Hypothesis strategies built from an ATen operator's schema, for the
overloads that no OpInfo sample reaches (the search that runs them is :mod:`conformance.sweep.schema`).

A strategy draws each argument through a drawer chosen by the argument's type and name; drawers
read the call's shared context (common shape, dtype, list length) and, in a steered search, the
:class:`~conformance.inputs.hints.Hints` the CPU's rejections gave.

Example::

    >>> import torch
    >>> from hypothesis import find
    >>> from conformance.inputs.schema import call_strategy
    >>> call = find(call_strategy(torch.ops.aten.add.Tensor), lambda c: True)
    >>> sorted(call.kwargs) == [] and len(call.args) >= 1
    True
"""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import torch
from hypothesis import strategies as st

from .hints import Hints

SMALL_DTYPES = (torch.float32, torch.float32, torch.int64, torch.bfloat16, torch.bool, torch.int32)
_STRINGS = {
    "reduce": ["sum", "mean", "prod", "amax", "amin"], "reduction": ["mean", "sum", "none"],
    "approximate": ["none", "tanh"], "rounding_mode": ["trunc", "floor"], "padding_mode": ["zeros", "reflect"],
    "mode": ["constant", "reflect", "bilinear", "nearest"], "interpolation": ["linear", "lower", "nearest"],
    "side": ["left", "right"], "indexing": ["ij", "xy"], "norm": ["backward", "ortho", "forward"],
    "UPLO": ["L", "U"], "driver": ["gelsd"], "ord": ["fro"], "fill_value": ["0"],
}
_INDEX_NAMES = ("index", "indices", "offsets", "target", "lengths", "per_sample_weights_index")
_SIZE_NAMES = ("size", "shape", "sizes", "output_size", "stride", "kernel_size", "dilation", "repeats",
               "split_sizes", "normalized_shape")


class DeviceArg:
    """Stands for the ``device`` argument: the CPU run gets ``cpu``, the target run its device."""

    def __repr__(self) -> str:
        return "<device>"


DEVICE = DeviceArg()


class _NoArg:
    def __repr__(self) -> str:
        return "<no positional arguments>"


NOARG = _NoArg()


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: torch.dtype
    seed: int
    kind: str = "value"  # value | index | mask | out

    def make(self, size_hint: int = 2) -> torch.Tensor:
        if self.kind == "out":
            return torch.empty(0, dtype=self.dtype)
        g = torch.Generator().manual_seed(self.seed)
        if self.kind == "index":
            return torch.randint(0, max(1, size_hint), self.shape, generator=g, dtype=torch.int64)
        if self.dtype == torch.bool or self.kind == "mask":
            return torch.randint(0, 2, self.shape, generator=g).bool()
        if self.dtype.is_floating_point:
            return torch.randn(self.shape, generator=g).to(self.dtype)
        return torch.randint(-3, 4, self.shape, generator=g).to(self.dtype)


@dataclass(frozen=True)
class StorageSpec:
    """A ``Storage`` argument: an untyped storage holding ``numel`` elements of ``dtype``, its
    bytes those of a generated tensor (``set_``'s source: the tensor set to it reads them)."""

    numel: int
    dtype: torch.dtype
    seed: int

    def make(self) -> torch.UntypedStorage:
        return TensorSpec((self.numel,), self.dtype, self.seed).make().untyped_storage()


@dataclass
class Call:
    """One generated call: positional and keyword arguments (TensorSpecs and StorageSpecs are
    materialized later)."""

    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)

    def materialize(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        def mk(v: Any) -> Any:
            if isinstance(v, (TensorSpec, StorageSpec)):
                return v.make()
            if isinstance(v, list):
                return [mk(x) for x in v]
            return v

        return tuple(mk(a) for a in self.args), {k: mk(v) for k, v in self.kwargs.items()}


def _type_name(t: Any) -> str:
    # most types have a class of their own; Storage (and Stream, ...) are a plain Type of a kind
    name = type(t).__name__
    return t.kind() if name == "Type" else name



@dataclass(frozen=True)
class _Ctx:
    """What one generated call shares across its arguments."""

    base: tuple[int, ...]  # the common tensor shape
    dtype: torch.dtype  # the common dtype
    list_len: int  # the common length of Tensor[] / Scalar[] lists (foreach, fused optimizers)
    hints: Hints = Hints()
    uniform: bool = False  # every tensor argument takes the common shape


# Drawing goes through a few cached primitive strategies: building Hypothesis strategy objects
# per call (shapes and dtypes differ per call) cost ~6 ms per example in validation alone, ten
# times the CPU and target work of a typical example.
Draw = Callable[[st.SearchStrategy[Any]], Any]
Drawer = Callable[[Draw, _Ctx], Any]


@cache
def _ints(lo: int, hi: int) -> st.SearchStrategy[int]:
    return st.integers(lo, hi)


_BOOL = st.booleans()
_FLOAT = st.floats(-2, 2, allow_nan=False, width=32)
_NUMBER = st.one_of(st.integers(-2, 3), _FLOAT)
_SEED = st.integers(0, 2**16)


def _pick(draw: Draw, options: list[Any] | tuple[Any, ...]) -> Any:
    return options[draw(_ints(0, len(options) - 1))] if len(options) > 1 else options[0]


def _shapes(base: tuple[int, ...], uniform: bool = False) -> list[tuple[int, ...]]:
    # mostly the common shape (most likely valid); else a broadcastable suffix, the leading or
    # last dim alone (a bias, a per-channel vector), a scalar, or one dim inserted after the first
    # (an input of one more rank than its target, as in nll_loss2d)
    if uniform:
        return [base]
    inserted = base[:1] + (2,) + base[1:] if base else (2,)
    return [base, base, base, base[1:], base[:1], base[-1:], (), inserted]


def _tensor_dtypes(ctx: _Ctx, kind: str) -> list[torch.dtype]:
    if kind == "index":
        return [torch.int64, torch.int32] if torch.int32 in ctx.hints.dtypes else [torch.int64]
    if kind == "mask":
        return [torch.bool]
    extra = [d for d in ctx.hints.dtypes if d not in (torch.quint8, torch.qint8, torch.qint32)]
    return [ctx.dtype, ctx.dtype, *extra] if extra else [ctx.dtype]


def _scalar_types(hints: Hints) -> list[torch.dtype]:
    return list(dict.fromkeys([torch.float32, torch.int64, *hints.dtypes]))


def _list(elem: Drawer, lo: int, hi: int, unique: bool = False) -> Drawer:
    def draw_list(draw: Draw, ctx: _Ctx) -> list[Any]:
        out = [elem(draw, ctx) for _ in range(draw(_ints(lo, hi)))]
        return list(dict.fromkeys(out)) if unique else out

    return draw_list


def _optional(inner: Drawer) -> Drawer:
    return lambda draw, ctx: None if draw(_BOOL) else inner(draw, ctx)


def _const(value: Any) -> Drawer:
    return lambda draw, ctx: value


def _of(strategy: st.SearchStrategy[Any]) -> Drawer:
    return lambda draw, ctx: draw(strategy)


def _choice(options: list[Any]) -> Drawer:
    return lambda draw, ctx: _pick(draw, options)


def _arg_drawer(arg: Any) -> Drawer | None:
    key = (arg.name, str(arg.type), getattr(arg, "N", None), arg.kwarg_only,
           bool(arg.alias_info and arg.alias_info.is_write))
    if key not in _DRAWERS:
        _DRAWERS[key] = _make_drawer(arg)
    return _DRAWERS[key]


_DRAWERS: dict[tuple[Any, ...], Drawer | None] = {}


def _tensor_drawer(name: str, is_out: bool) -> Drawer:
    tkind = "index" if name in _INDEX_NAMES else ("mask" if "mask" in name else "value")

    def draw_tensor(draw: Draw, ctx: _Ctx) -> TensorSpec:
        hints, base = ctx.hints, ctx.base
        wanted = dict(hints.arg_dtypes).get(name) if hints.arg_dtypes else None
        if is_out:
            return TensorSpec((0,), wanted or (torch.int64 if name in ("indices", "index") else ctx.dtype), 0, "out")
        kind = tkind
        if wanted is not None:
            dtype, kind = wanted, ("value" if wanted.is_floating_point else tkind)
        else:
            dtype = _pick(draw, _tensor_dtypes(ctx, tkind))
        ranks = dict(hints.arg_ranks) if hints.arg_ranks else {}
        if hints.arg_shapes and name in dict(hints.arg_shapes):
            shape = dict(hints.arg_shapes)[name]
        elif name in ranks or (name == "self" and "input" in ranks):
            r = ranks.get(name, ranks.get("input", 0))
            padded = base + (2,) * r  # the common shape cut (or padded) to the rank it asked for
            shape = _pick(draw, [padded[:r], (padded[-r:] if r else ())])
        else:
            shape = _pick(draw, _shapes(base, ctx.uniform))
        return TensorSpec(shape, dtype, draw(_SEED), kind)

    return draw_tensor


def _draw_storage(draw: Draw, ctx: _Ctx) -> StorageSpec:
    # as many elements of the common dtype as a tensor of the common shape holds (a tensor set to
    # it keeps its size), or more: a view into it at an offset (set_'s storage_offset, size and
    # stride, drawn as any offset and size are: at most 4 and 4**3) reads within it
    n = math.prod(ctx.base)
    return StorageSpec(_pick(draw, [n, n + 8, 72]), ctx.dtype, draw(_SEED))


def _make_drawer(arg: Any) -> Drawer | None:
    t, name = arg.type, arg.name
    kind = _type_name(t)
    n = getattr(arg, "N", None)  # int[2] kernel_size, bool[3] output_mask: exactly N
    if kind == "OptionalType" and _type_name(t.getElementType()) == "DeviceObjType":
        return _const(DEVICE)  # never None: the target run must create its tensors on the target
    if kind == "OptionalType":
        inner = _arg_drawer(_Fake(name, t.getElementType(), arg.kwarg_only, arg.alias_info, n))
        return _const(None) if inner is None else _optional(inner)
    if kind == "TensorType":
        return _tensor_drawer(name, arg.alias_info is not None and arg.alias_info.is_write and arg.kwarg_only)
    if kind == "ListType":
        el = _type_name(t.getElementType())
        if el in ("TensorType", "OptionalType"):
            inner = _arg_drawer(_Fake(name, t.getElementType(), arg.kwarg_only, None))
            if inner is None:
                return None
            # the lists of a foreach or fused-optimizer call pair up by index (params[i] with
            # grads[i]): every tensor of a list takes the call's common shape, so that the i-th
            # tensors agree (a kernel reading a grad as long as its param reads past a shorter one)
            return lambda draw, ctx: [inner(draw, dataclasses.replace(ctx, uniform=True)) for _ in range(ctx.list_len)]
        lo, hi = (n, n) if n else (0, 3)
        if el in ("IntType", "SymIntType"):
            if "dim" in name:
                return lambda draw, ctx: _list(_of(_ints(-1, max(0, len(ctx.base) - 1))), min(lo, 2), min(hi, 2),
                                               unique=True)(draw, ctx)
            if "padding" in name:  # zero padding is the common valid case
                return _list(_of(_ints(0, 1)), lo, hi)
            if name in _SIZE_NAMES or "size" in name:
                return _list(_of(_ints(1, 4)), lo, hi)
            return _list(_of(_ints(0, 3)), lo, hi)
        if el == "FloatType":
            return _list(_of(_FLOAT), lo, hi)
        if el == "NumberType":  # Scalar[]: one per tensor of a foreach list
            return lambda draw, ctx: [draw(_NUMBER) for _ in range(ctx.list_len)]
        if el == "BoolType":
            return _list(_of(_BOOL), *((n, n) if n else (1, 3)))
        return None
    if kind in ("IntType", "SymIntType"):
        if name == "dtype":
            return lambda draw, ctx: _pick(draw, _scalar_types(ctx.hints))
        if name == "layout":
            return _const(torch.strided)
        if name == "memory_format":
            return _choice([torch.contiguous_format, torch.preserve_format])
        if "dim" in name:
            return lambda draw, ctx: draw(_ints(-1, max(0, len(ctx.base) - 1)))
        if "group" in name:
            return _of(_ints(1, 2))
        return _of(_ints(0, 4))
    if kind == "FloatType":
        return _of(_FLOAT)
    if kind == "BoolType":
        return _of(_BOOL)
    if kind == "NumberType":
        return _of(_NUMBER)
    if kind == "StringType" and name in ("filename", "path"):
        # from_file(shared=True) creates its file: keep it out of the working directory
        return _const(os.path.join(tempfile.gettempdir(), "conformance-schema-file.bin"))
    if kind == "StringType":  # the values the CPU named in a steered search, else the usual ones
        options = _STRINGS.get(name, ["none", "mean", "sum"])
        return lambda draw, ctx: _pick(draw, dict(ctx.hints.arg_choices).get(name, options) if ctx.hints.arg_choices
                                       else options)
    if kind == "DeviceObjType":
        return _const(DEVICE)
    if kind == "ScalarTypeType":
        return lambda draw, ctx: _pick(draw, _scalar_types(ctx.hints))
    if kind == "LayoutType":
        return _const(torch.strided)
    if kind == "MemoryFormatType":
        return _const(torch.contiguous_format)
    if kind == "GeneratorType":
        return _const(None)
    if kind == "StorageType":
        return _draw_storage
    return None  # Dimname, Stream, Any, ...: not generated


@dataclass
class _Fake:
    name: str
    type: Any
    kwarg_only: bool
    alias_info: Any
    N: int | None = None


def call_strategy(op: torch._ops.OpOverload, hints: Hints = Hints()) -> st.SearchStrategy[Call]:
    """A strategy of calls to ``op`` built from its schema (steered by ``hints`` when given).
    Raises ValueError when an argument type cannot be generated (the reason lands in the
    coverage table)."""
    args = op._schema.arguments
    drawers = [_arg_drawer(a) for a in args]
    for a, d in zip(args, drawers, strict=True):
        if d is None and not a.has_default_value():
            raise ValueError(f"argument {a.name}: {a.type} cannot be generated")
    dtypes = [d for d in (*hints.dtypes, *SMALL_DTYPES) if d not in hints.avoid] or list(SMALL_DTYPES)
    dtypes = [d for d in dtypes if d not in (torch.quint8, torch.qint8, torch.qint32)] or list(SMALL_DTYPES)
    ranks = list(hints.ranks) or [0, 1, 2, 3, 4]

    @st.composite
    def build(draw: Draw) -> Call:
        rank = _pick(draw, ranks)
        # steered searches make half their calls without size-1 dims (a kernel that splits or
        # windows a dim rejects them); the other half keep them (sizes that must match a list)
        lo = _pick(draw, [1, 2]) if hints else 1
        base = tuple(draw(_ints(lo, 4)) for _ in range(rank))
        # steered searches make half their calls with one shape for every tensor (pad and pool
        # backwards, norms: arguments whose shapes must agree)
        uniform = bool(hints) and draw(_BOOL)
        ctx = _Ctx(base, _pick(draw, dtypes), draw(_ints(1, 3)), hints, uniform)
        call = Call()
        defaults_from_here = False  # once a positional default is kept, later positionals keep theirs
        for a, drawer in zip(args, drawers, strict=True):
            writes = a.alias_info is not None and a.alias_info.is_write
            if drawer is None or (defaults_from_here and not a.kwarg_only):
                continue  # has a default (checked above)
            if a.has_default_value() and not writes and a.name != "device" and draw(_BOOL):
                defaults_from_here = defaults_from_here or not a.kwarg_only
                continue  # keep the default
            value = drawer(draw, ctx)
            if a.kwarg_only:
                call.kwargs[a.name] = value
            else:
                call.args.append(value)
        return call

    return build()


