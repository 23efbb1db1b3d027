"""Schema-driven inputs: Hypothesis strategies built from an ATen operator's schema, for the
overloads that no OpInfo sample reaches.

Each overload gets a derandomized, bounded search: examples the CPU reference rejects are
discarded; accepted ones run on the target through the same execute/compare path as OpInfo
samples; on a mismatch Hypothesis shrinks to a minimal failing input, and that input is stored
(``inputs`` blob) so ``conformance repro`` reproduces it.

Example::

    >>> import torch
    >>> from hypothesis import find
    >>> from conformance.inputs.schema import call_strategy
    >>> call = find(call_strategy(torch.ops.aten.add.Tensor), lambda c: True)
    >>> sorted(call.kwargs) == [] and len(call.args) >= 1
    True
"""

from __future__ import annotations

import collections
import io
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import torch
from hypothesis import HealthCheck, Phase, given, reject, settings
from hypothesis import strategies as st

# float32 is listed twice: most kernels accept it, so it is drawn (and shrunk to) most often
SMALL_DTYPES = (torch.float32, torch.float32, torch.int64, torch.bfloat16, torch.bool, torch.int32)
MAX_EXAMPLES = 12
REJECT_CAP = 120  # calls rejected by the CPU before an overload is given up as "no valid input"
_STRINGS = {
    "reduce": ["sum", "mean", "prod", "amax", "amin"], "reduction": ["mean", "sum", "none"],
    "approximate": ["none", "tanh"], "rounding_mode": ["trunc", "floor"], "padding_mode": ["zeros", "reflect"],
    "mode": ["constant", "reflect", "bilinear", "nearest"], "interpolation": ["linear", "lower", "nearest"],
    "side": ["left", "right"], "indexing": ["ij", "xy"], "norm": ["backward", "ortho", "forward"],
    "UPLO": ["L", "U"], "driver": ["gelsd"], "ord": ["fro"], "fill_value": ["0"],
}
_INDEX_NAMES = ("index", "indices", "offsets", "target", "lengths", "per_sample_weights_index")
_SIZE_NAMES = ("size", "shape", "sizes", "output_size", "stride", "kernel_size", "padding", "dilation",
               "output_padding", "repeats", "split_sizes", "normalized_shape")


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


@dataclass
class Call:
    """One generated call: positional and keyword arguments (TensorSpecs are materialized later)."""

    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)

    def materialize(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        def mk(v: Any) -> Any:
            if isinstance(v, TensorSpec):
                return v.make()
            if isinstance(v, list):
                return [mk(x) for x in v]
            return v

        return tuple(mk(a) for a in self.args), {k: mk(v) for k, v in self.kwargs.items()}


def _type_name(t: Any) -> str:
    return type(t).__name__


def _shape_strategy(base: tuple[int, ...]) -> st.SearchStrategy[tuple[int, ...]]:
    # same shape (most likely valid), a broadcastable suffix, or a scalar
    return st.sampled_from([base, base[1:] if base else base, ()])


def _arg_strategy(arg: Any, base: tuple[int, ...], dtype: torch.dtype) -> st.SearchStrategy[Any] | None:
    key = (arg.name, str(arg.type), getattr(arg, "N", None), arg.kwarg_only,
           bool(arg.alias_info and arg.alias_info.is_write), base, dtype)
    if key not in _STRATEGIES:
        _STRATEGIES[key] = _make_strategy(arg, base, dtype)
    return _STRATEGIES[key]


_STRATEGIES: dict[tuple[Any, ...], st.SearchStrategy[Any] | None] = {}


def _make_strategy(arg: Any, base: tuple[int, ...], dtype: torch.dtype) -> st.SearchStrategy[Any] | None:
    t, name = arg.type, arg.name
    kind = _type_name(t)
    if kind == "OptionalType" and _type_name(t.getElementType()) == "DeviceObjType":
        return st.just(DEVICE)  # never None: the target run must create its tensors on the target
    if kind == "OptionalType":
        inner = _arg_strategy(_Fake(name, t.getElementType(), arg.kwarg_only, arg.alias_info, getattr(arg, "N", None)),
                              base, dtype)
        return st.none() if inner is None else st.one_of(inner, st.none())
    if kind == "TensorType":
        is_out = arg.alias_info is not None and arg.alias_info.is_write and arg.kwarg_only
        if is_out:
            return st.just(TensorSpec((0,), dtype, 0, "out"))
        tkind = "index" if name in _INDEX_NAMES else ("mask" if "mask" in name else "value")
        tdtype = torch.int64 if tkind == "index" else (torch.bool if tkind == "mask" else dtype)
        return st.builds(TensorSpec, _shape_strategy(base), st.just(tdtype), st.integers(0, 2**16), st.just(tkind))
    if kind == "ListType":
        el = _type_name(t.getElementType())
        if el in ("TensorType", "OptionalType"):
            inner = _arg_strategy(_Fake(name, t.getElementType(), arg.kwarg_only, None), base, dtype)
            return None if inner is None else st.lists(inner, min_size=1, max_size=3)
        if el in ("IntType", "SymIntType"):
            n = getattr(arg, "N", None)  # int[2] kernel_size: exactly 2
            lo, hi = (n, n) if n else (0, 3)
            if "dim" in name:
                return st.lists(st.integers(-1, max(0, len(base) - 1)), min_size=min(lo, 2), max_size=min(hi, 2),
                                unique=True)
            if name in _SIZE_NAMES or "size" in name:
                return st.lists(st.integers(1, 4), min_size=lo, max_size=hi)
            return st.lists(st.integers(0, 3), min_size=lo, max_size=hi)
        if el == "FloatType":
            return st.lists(st.floats(-2, 2, allow_nan=False), min_size=0, max_size=3)
        if el == "NumberType":  # Scalar[]: one per tensor of a foreach list, usually
            return st.lists(st.one_of(st.integers(-2, 3), st.floats(-2, 2, allow_nan=False, width=32)),
                            min_size=1, max_size=3)
        if el == "BoolType":
            return st.lists(st.booleans(), min_size=1, max_size=3)
        return None
    if kind in ("IntType", "SymIntType"):
        if name == "dtype":
            return st.sampled_from([torch.float32, torch.int64])
        if name == "layout":
            return st.just(torch.strided)
        if name == "memory_format":
            return st.sampled_from([torch.contiguous_format, torch.preserve_format])
        if "dim" in name:
            return st.integers(-1, max(0, len(base) - 1))
        return st.integers(0, 4)
    if kind == "FloatType":
        return st.floats(-2, 2, allow_nan=False, width=32)
    if kind == "BoolType":
        return st.booleans()
    if kind == "NumberType":
        return st.one_of(st.integers(-2, 3), st.floats(-2, 2, allow_nan=False, width=32))
    if kind == "StringType":
        return st.sampled_from(_STRINGS.get(name, ["none", "mean", "sum"]))
    if kind == "DeviceObjType":
        return st.just(DEVICE)
    if kind == "ScalarTypeType":
        return st.sampled_from([torch.float32, torch.int64])
    if kind == "LayoutType":
        return st.just(torch.strided)
    if kind == "MemoryFormatType":
        return st.just(torch.contiguous_format)
    if kind == "GeneratorType":
        return st.none()
    return None  # Dimname, Storage, Stream, Any, ...: not generated


@dataclass
class _Fake:
    name: str
    type: Any
    kwarg_only: bool
    alias_info: Any
    N: int | None = None


def call_strategy(op: torch._ops.OpOverload) -> st.SearchStrategy[Call]:
    """A strategy of calls to ``op`` built from its schema. Raises ValueError when an argument
    type cannot be generated (the reason lands in the coverage table)."""
    args = op._schema.arguments

    @st.composite
    def build(draw: Callable[..., Any]) -> Call:
        rank = draw(st.integers(0, 4))
        base = tuple(draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank)))
        dtype = draw(st.sampled_from(SMALL_DTYPES))
        call = Call()
        defaults_from_here = False  # once a positional default is kept, later positionals keep theirs
        for a in args:
            strat = _arg_strategy(a, base, dtype)
            writes = a.alias_info is not None and a.alias_info.is_write
            if strat is None or (defaults_from_here and not a.kwarg_only):
                continue  # has a default (checked below)
            if a.has_default_value() and not writes and a.name != "device" and draw(st.booleans()):
                defaults_from_here = defaults_from_here or not a.kwarg_only
                continue  # keep the default
            value = draw(strat)
            if a.kwarg_only:
                call.kwargs[a.name] = value
            else:
                call.args.append(value)
        return call

    for a in args:
        if _arg_strategy(a, (2,), torch.float32) is None and not a.has_default_value():
            raise ValueError(f"argument {a.name}: {a.type} cannot be generated")
    return build()


@cache
def schema_candidates() -> tuple[str, ...]:
    """Overloads a backend can see that no OpInfo's first sample reaches (layout-specific ones
    have their own coverage state; random ones are compared by distribution)."""
    from conformance import catalog

    skip = ("composite_implicit", "no_cpu_kernel", "sparse", "quantized", "nested", "mkldnn")
    return tuple(o.name for o in catalog.overloads(with_opinfos=True)
                 if not o.opinfos and not any(o.has(c) for c in skip))


class _Info:
    """The slice of an OpInfo that the executor uses, for a bare ATen overload."""

    def __init__(self, name: str) -> None:
        from conformance.catalog import packet_of

        self.name = name
        self.variant_test_name = ""
        self.packet = packet = packet_of(name)
        self.op = lambda *a, **k: packet(*(x for x in a if x is not NOARG), **k)
        self.mutates = packet._schema.is_mutable  # the CPU run must not mutate the target's inputs
        self.inplace_variant = None
        self.supports_out = False


def _sample(call: Call) -> Any:
    from torch.testing._internal.opinfo.core import SampleInput

    args, kwargs = call.materialize()
    if args:
        return SampleInput(args[0], args=args[1:], kwargs=kwargs)
    return SampleInput(NOARG, args=(), kwargs=kwargs)


def run_schema_group(target: Any, group: Any, config: Any, *, skip: Container[str] = frozenset(),
                     on_start: Callable[[str], None] | None = None) -> Iterator[dict[str, Any]]:
    """Search inputs for one overload and yield its single result row."""
    from conformance.select import item_key
    from conformance.sweep import evaluate
    from conformance.verdict import Status

    key = item_key(group.op, "schema", group.dtype, 0)
    if key in skip:
        return
    if on_start:
        on_start(key)
    info = _Info(group.op)
    base_row = {"item_key": key, "op": group.op, "variant": "schema", "dtype": "any", "sample": 0,
                "seed": config.seed}
    try:
        strategy = call_strategy(info.packet)
    except ValueError as exc:
        yield {**base_row, "status": Status.SKIP.value, "error": f"no valid input: {exc}", "duration_s": 0.0}
        return
    rejected: collections.Counter[str] = collections.Counter()
    accepted: list[dict[str, Any]] = []
    failing: dict[str, Any] = {}

    @settings(max_examples=MAX_EXAMPLES, derandomize=True, database=None, deadline=None, print_blob=False,
              phases=(Phase.generate, Phase.shrink), suppress_health_check=list(HealthCheck))
    @given(strategy)
    def prop(call: Call) -> None:
        if not accepted and sum(rejected.values()) >= REJECT_CAP:
            return  # given up: let Hypothesis run out its remaining examples at no cost
        sample = _sample(call)
        dtype = _first_dtype(sample)
        row = evaluate(target, info, group.op, "function", str(dtype).removeprefix("torch.") if dtype else "none",
                       0, sample, config)
        if row["status"] == Status.SKIP.value:
            rejected[(row.get("error") or "")[:200]] += 1
            reject()
        accepted.append(row)
        if Status(row["status"]).failed:
            failing.clear()
            failing.update(row=row, call=call)
            raise AssertionError(row.get("error") or row["status"])

    try:
        prop()
    except AssertionError:
        pass
    except Exception as exc:  # noqa: BLE001 - Hypothesis gave up (e.g. Unsatisfiable)
        rejected[f"{type(exc).__name__}: {exc}"[:120]] += 0
    if failing:
        row = dict(failing["row"])
        row.update(base_row, dtype=row["dtype"], inputs=_blob(failing["call"]))
        row["error"] = f"minimal failing input after shrinking: {row.get('signature')}; {row.get('error') or ''}"
        yield row
    elif accepted:
        row = dict(accepted[0])
        row.update(base_row, dtype=row["dtype"])
        row["reached_ops"] = sorted({o for r in accepted for o in (r.get("reached_ops") or [])})
        row["native_ops"] = sorted({o for r in accepted for o in (r.get("native_ops") or [])})
        row["fallback_ops"] = sorted({o for r in accepted for o in (r.get("fallback_ops") or [])})
        row["error"] = None
        row["status"] = Status.PASS_FALLBACK.value if row["fallback_ops"] else row["status"]
        yield row
    else:
        top = "; ".join(f"{n}x {msg}" for msg, n in rejected.most_common(2))
        yield {**base_row, "status": Status.SKIP.value, "duration_s": 0.0,
               "error": f"no valid input: {sum(rejected.values())} generated calls rejected by the CPU ({top})"}


def _first_dtype(sample: Any) -> torch.dtype | None:
    from conformance.compare import leaves

    for x in leaves((sample.input, sample.args, sample.kwargs)):
        if isinstance(x, torch.Tensor):
            return x.dtype
    return None


DEVICE_MARK = "<device>"  # how a stored input spells the device argument (standalone scripts map it)


def _blob(call: Call) -> bytes:
    def plain(v: Any) -> Any:
        if isinstance(v, DeviceArg):
            return DEVICE_MARK
        if isinstance(v, torch.memory_format):  # memory formats do not pickle
            return f"<{str(v).removeprefix('torch.')}>"
        if isinstance(v, list):
            return [plain(x) for x in v]
        return v

    buf = io.BytesIO()
    args, kwargs = call.materialize()
    torch.save({"args": [plain(a) for a in args], "kwargs": {k: plain(v) for k, v in kwargs.items()}}, buf)
    return buf.getvalue()

