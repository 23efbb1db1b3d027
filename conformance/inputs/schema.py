"""Schema-driven inputs: Hypothesis strategies built from an ATen operator's schema, for the
overloads that no OpInfo sample reaches.

Each overload gets a derandomized, bounded search: examples the CPU reference rejects are
discarded; accepted ones run on the target through the same execute/compare path as OpInfo
samples; on a mismatch Hypothesis shrinks to a minimal failing input, and that input is stored
(``inputs`` blob) so ``conformance repro`` reproduces it.

When a search finds no input the CPU accepts, the CPU's own error messages are read for what
it wanted (:func:`hints_from_errors`: ranks, dtypes, per-argument dtypes/shapes/ranks) and up to
``STEERED_PASSES`` more searches are steered by them. Hints come from the reference kernel only,
never from the target. An input that crashes the reference kernel kills its worker; the
supervisor then re-sends the overload as :class:`CrashSafe` and every input's CPU run is first
tried in a forked child (:func:`cpu_preflight`).

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
import os
import re
import signal
import tempfile
import time
from collections.abc import Callable, Container, Iterable, Iterator
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import torch
from hypothesis import HealthCheck, Phase, given, reject, settings
from hypothesis import strategies as st

from opdb.blobs import dump_inputs

# float32 is listed twice: most kernels accept it, so it is drawn (and shrunk to) most often
SMALL_DTYPES = (torch.float32, torch.float32, torch.int64, torch.bfloat16, torch.bool, torch.int32)
MAX_EXAMPLES = 12
REJECT_CAP = 120  # calls rejected by the CPU in one search before it is given up
STEERED_PASSES = 2  # further searches steered by the rejections' hints
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


_DTYPE_WORDS = {
    "float": torch.float32, "float32": torch.float32, "double": torch.float64, "float64": torch.float64,
    "half": torch.float16, "float16": torch.float16, "bfloat16": torch.bfloat16, "long": torch.int64,
    "int64": torch.int64, "int": torch.int32, "int32": torch.int32, "short": torch.int16, "char": torch.int8,
    "byte": torch.uint8, "kbyte": torch.uint8, "uint8": torch.uint8, "bool": torch.bool,
    "complexfloat": torch.complex64, "complex64": torch.complex64, "quint8": torch.quint8,
    "qint8": torch.qint8, "qint32": torch.qint32,
}
_WORD_NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5}
_RANK_PATTERNS = (
    re.compile(r"\b([1-5])[- ]?d\b"),  # 3D, 3-D, 3d
    re.compile(r"\b([1-5]) or [1-5][- ]?d\b"),  # "2 or 3d": the first one
    re.compile(r"\b([1-5]) dims?\b"), re.compile(r"\bdimension ([1-5])\b"), re.compile(r"\bequals to ([1-5])\b"),
    re.compile(r"\b([1-5])-dimensional\b"), re.compile(r"dim\(\) == ([1-5])"),
)
_AT_LEAST = re.compile(r"at least (?:an? )?(\w+)[- ]dim|dim\(\) (>=?) ?([0-5])|at least (\w+) dimensions")
_WANT_DTYPE = (
    re.compile(r"(?:scalar type|dtype|to be of type|to be) (\w+)"), re.compile(r"but expected (\w+)"),
    re.compile(r"one of the following scalar types: ([\w, ]+)"), re.compile(r"expect \w+ to be (\w+)"),
)
_AVOID_DTYPE = re.compile(r"not implemented for '(\w+)'")
_ARG_DTYPE = (  # (argument name, dtype word)
    re.compile(r"'(\w+)' to have scalar type (\w+)"), re.compile(r"\b(\w+) must be (?:an? )?(int|integral|long|float|bool)\b"),
    re.compile(r"\b(out) tensor to have dtype (\w+)"),
)
_ARG_ONE_ELEMENT = re.compile(r"\b(\w+) must be a 1-element tensor")
_ARG_RANK = re.compile(r"\b(\w+) (?:has to be|should be|must be|to be) (?:an? )?(?:non-empty )?([1-5])[- ]?d\b", re.I)


@dataclass(frozen=True)
class Hints:
    """What the CPU reference's own error messages asked for (tensor ranks, dtypes), used to
    steer a further search after a first one found no valid input. Learned from the reference
    kernel, never from the target."""

    ranks: tuple[int, ...] = ()
    dtypes: tuple[torch.dtype, ...] = ()
    avoid: tuple[torch.dtype, ...] = ()
    arg_dtypes: tuple[tuple[str, torch.dtype], ...] = ()  # a named tensor argument's dtype
    arg_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()  # a named tensor argument's shape
    arg_ranks: tuple[tuple[str, int], ...] = ()  # a named tensor argument's rank

    def __bool__(self) -> bool:
        return bool(self.ranks or self.dtypes or self.avoid or self.arg_dtypes or self.arg_shapes or self.arg_ranks)

    def merge(self, other: Hints) -> Hints:
        def union(a: tuple[Any, ...], b: tuple[Any, ...]) -> tuple[Any, ...]:
            return tuple(dict.fromkeys(a + b))

        return Hints(union(self.ranks, other.ranks), union(self.dtypes, other.dtypes), union(self.avoid, other.avoid),
                     tuple(dict(self.arg_dtypes + other.arg_dtypes).items()),
                     tuple(dict(self.arg_shapes + other.arg_shapes).items()),
                     tuple(dict(self.arg_ranks + other.arg_ranks).items()))

    def describe(self) -> str:
        parts = []
        if self.ranks:
            parts.append("ranks " + ",".join(map(str, self.ranks)))
        if self.dtypes:
            parts.append("dtypes " + ",".join(str(d).removeprefix("torch.") for d in self.dtypes))
        if self.avoid:
            parts.append("avoiding " + ",".join(str(d).removeprefix("torch.") for d in self.avoid))
        parts += [f"{name}: {str(d).removeprefix('torch.')}" for name, d in self.arg_dtypes]
        parts += [f"{name}: shape {list(shape)}" for name, shape in self.arg_shapes]
        parts += [f"{name}: {rank}-D" for name, rank in self.arg_ranks]
        return "; ".join(parts)


def hints_from_errors(messages: Iterable[str]) -> Hints:
    """Ranks and dtypes the CPU reference asked for in its rejections (what it *got* is ignored).

    >>> hints_from_errors(["Expected 3D or 4D tensor, but got: []"]).ranks
    (3, 4)
    >>> hints_from_errors(["Found dtype Long but expected Float"]).dtypes
    (torch.float32,)
    """
    ranks: list[int] = []
    want: list[torch.dtype] = []
    avoid: list[torch.dtype] = []
    arg_dtypes: dict[str, torch.dtype] = {}
    arg_shapes: dict[str, tuple[int, ...]] = {}
    arg_ranks: dict[str, int] = {}
    too_small = False
    for raw in messages:
        for pat in _ARG_DTYPE:
            for name, word in pat.findall(raw):
                word = {"integral": "long"}.get(word.lower(), word.lower())
                if word in _DTYPE_WORDS:
                    arg_dtypes.setdefault(name, _DTYPE_WORDS[word])
        for name in _ARG_ONE_ELEMENT.findall(raw):
            arg_shapes.setdefault(name, (1,))
        for name, rank in _ARG_RANK.findall(raw):
            arg_ranks.setdefault(name.lower(), int(rank))
        for name in _AVOID_DTYPE.findall(raw):
            if name.lower() in _DTYPE_WORDS:
                avoid.append(_DTYPE_WORDS[name.lower()])
        msg = re.sub(r"\bgot\b[^;]*", "", raw.replace("\n", " ").lower())  # what the call had, not what it wanted
        msg = re.sub(r"not implemented for '\w+'|found (?:dtype )?\w+", "", msg)
        for pat in _RANK_PATTERNS:
            ranks.extend(int(x) for x in pat.findall(msg))
        for m in _AT_LEAST.finditer(msg):
            word = m.group(1) or m.group(4)
            if word:
                n = _WORD_NUMBERS.get(word, int(word) if word.isdigit() else 0)
            else:
                n = int(m.group(3)) + (m.group(2) == ">")
            ranks.extend(range(max(1, n), min(5, n + 1) + 1))
        if "no dimensions" in msg or "out of range" in msg or "0-dim" in msg:
            too_small = True
        if "matrix" in msg or "matrices" in msg:
            ranks.append(2)
        for pat in _WANT_DTYPE:
            for group in pat.findall(msg):
                for word in re.split(r"[, ]+", group):
                    if word in _DTYPE_WORDS:
                        want.append(_DTYPE_WORDS[word])
        if "complex" in msg:
            want.append(torch.complex64)
        if "qtensor" in msg or "quantiz" in msg:
            want += [torch.quint8, torch.qint8]
        if "int tensor" in msg or "integral" in msg or "integer" in msg:
            want.append(torch.int64)
            want.append(torch.int32)
        if "floating point" in msg or "float tensor" in msg:
            want.append(torch.float32)
    if too_small and not ranks:
        ranks = [2, 3, 4]
    want = [d for d in want if d not in avoid and d not in arg_dtypes.values()]
    return Hints(tuple(dict.fromkeys(sorted(ranks))), tuple(dict.fromkeys(want)), tuple(dict.fromkeys(avoid)),
                 tuple(arg_dtypes.items()), tuple(arg_shapes.items()), tuple(arg_ranks.items()))


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
            return lambda draw, ctx: [inner(draw, ctx) for _ in range(ctx.list_len)]
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
    if kind == "StringType":
        return _choice(_STRINGS.get(name, ["none", "mean", "sum"]))
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
    return None  # Dimname, Storage, Stream, Any, ...: not generated


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


@cache
def schema_candidates() -> tuple[str, ...]:
    """Overloads a backend can see that no OpInfo the sweep runs reaches (the map is measured
    from each OpInfo's first sample; an OpInfo with no default dtype on the CPU runs nothing).
    Layout-specific overloads are candidates too: most take strided inputs, and those that do
    not are told apart by the CPU's own rejections."""
    from conformance import catalog
    from conformance.inputs.opinfo import by_name, cpu_dtypes
    from conformance.select import DEFAULT_DTYPES

    infos = by_name()

    def runs(name: str) -> bool:
        info = infos.get(name)
        return info is not None and any(str(d).removeprefix("torch.") in DEFAULT_DTYPES for d in cpu_dtypes(info))

    skip = ("composite_implicit", "no_cpu_kernel")
    return tuple(o.name for o in catalog.overloads(with_opinfos=True)
                 if not any(runs(i) for i in o.opinfos) and not any(o.has(c) for c in skip))


class CrashSafe(frozenset):  # type: ignore[type-arg]
    """A skip set that also asks for crash-safe search: the supervisor sends it after the CPU
    reference killed a worker during this overload's search."""

    crash_safe = True


PREFLIGHT_TIMEOUT_S = 30.0
CRASH_SAFE_SHRINK_STEPS = 60


def _in_child(run: Callable[[], None]) -> str | None:
    """Run ``run`` in a forked child; how it died ("crashed (signal X)", "hung"), or None."""
    pid = os.fork()
    if pid == 0:  # child: run, then leave without cleanup (exceptions are reported by the real run)
        import faulthandler
        import gc

        faulthandler.disable()  # an expected crash, reported by the parent; no traceback dump
        try:
            run()
            gc.collect()  # free now: heap corruption often only shows when memory is freed
        except BaseException:  # noqa: BLE001, S110
            pass
        os._exit(0)
    deadline = time.monotonic() + PREFLIGHT_TIMEOUT_S
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return f"hung (over {PREFLIGHT_TIMEOUT_S:g} s)"
        time.sleep(0.002)
    if os.WIFSIGNALED(status):
        return f"crashed (signal {signal.Signals(os.WTERMSIG(status)).name})"
    return None


def cpu_preflight(info: Any, sample: Any) -> str | None:
    """Run the CPU reference on ``sample`` in a forked child first; the reason when the child
    died (a crashing reference kernel is a rejected input, not the end of the search)."""
    from conformance.execute import _clone

    cpu = _clone(sample, lambda t: t.clone())
    died = _in_child(lambda: info.op(cpu.input, *cpu.args, **cpu.kwargs))
    return None if died is None else f"CPU reference {died}"


def target_preflight(target: Any, info: Any, sample: Any) -> str | None:
    """Run ``sample`` on the target alone in a forked child (no CPU reference ran in that
    process, so nothing the reference corrupted can fail there); how the target died, or None."""
    from conformance.execute import _clone

    def run() -> None:
        dev = _clone(sample, lambda t: t.to(target.device, copy=True), target.device)
        target.wrap(info.op)(dev.input, *dev.args, **dev.kwargs)
        target.synchronize()

    return _in_child(run)


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
    from conformance.execute import signature
    from conformance.select import item_key
    from conformance.sweep import evaluate
    from conformance.verdict import Status, decide, decide_unrun

    key = item_key(group.op, "schema", group.dtype, 0)
    if key in skip:
        return
    if on_start:
        on_start(key)
    info = _Info(group.op)
    base_row = {"item_key": key, "op": group.op, "variant": "schema", "dtype": "any", "sample": 0,
                "seed": config.seed}
    try:
        call_strategy(info.packet)
    except ValueError as exc:
        yield {**base_row, "status": decide_unrun("cpu").value, "error": f"no valid input: {exc}", "duration_s": 0.0}
        return
    rejected: collections.Counter[str] = collections.Counter()
    accepted: list[dict[str, Any]] = []
    failing: dict[str, Any] = {}
    crash_safe = bool(getattr(skip, "crash_safe", False))

    def search(strategy: st.SearchStrategy[Call]) -> None:
        # [rejections left, crash-safe shrink steps left]: each crash-safe call costs two forks
        budget = [REJECT_CAP // 3 if crash_safe else REJECT_CAP, CRASH_SAFE_SHRINK_STEPS]

        @settings(max_examples=MAX_EXAMPLES, derandomize=True, database=None, deadline=None, print_blob=False,
                  phases=(Phase.generate, Phase.shrink), suppress_health_check=list(HealthCheck))
        @given(strategy)
        def prop(call: Call) -> None:
            if not accepted and budget[0] <= 0:
                return  # given up: let Hypothesis run out its remaining examples at no cost
            if failing and crash_safe:  # shrinking, two forks a step: bounded
                if budget[1] <= 0:
                    return  # counts as passing: Hypothesis keeps the smallest failure found so far
                budget[1] -= 1
            sample = _sample(call)
            dtype = _first_dtype(sample)
            if crash_safe:
                why = cpu_preflight(info, sample)
                if why is not None:
                    rejected[why] += 1
                    budget[0] -= 1
                    reject()
                died = target_preflight(target, info, sample)
                if died is not None:  # the target's own crash, with no reference run before it
                    row = {"status": decide_unrun("target").value, "dtype": str(dtype).removeprefix("torch.") if dtype else "none",
                           "error": f"the target {died} running this input alone in a forked process "
                                    "(no CPU reference ran there)", "duration_s": 0.0, "signature": signature(sample),
                           "reached_ops": [group.op], "native_ops": [], "fallback_ops": []}
                    accepted.append(row)
                    failing.clear()
                    failing.update(row=row, call=call)
                    raise AssertionError(row["error"])
            row = evaluate(target, info, group.op, "function",
                           str(dtype).removeprefix("torch.") if dtype else "none", 0, sample, config)
            if row["status"] == Status.SKIP.value:
                rejected[(row.get("error") or "")[:200]] += 1
                budget[0] -= 1
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

    # First an unsteered search; while it finds nothing, the CPU's own rejections (the ranks and
    # dtypes it asked for) steer up to STEERED_PASSES more.
    search(call_strategy(info.packet))
    hints = Hints()
    for _ in range(1 if crash_safe else STEERED_PASSES):
        if accepted:
            break
        more = hints.merge(hints_from_errors(rejected))
        if more == hints:
            break
        hints = more
        search(call_strategy(info.packet, hints))
    steered = f" (steered by the CPU's errors: {hints.describe()})" if hints else ""
    if failing:
        row = dict(failing["row"])
        row.update(base_row, dtype=row["dtype"], inputs=_blob(failing["call"]))
        row["error"] = f"minimal failing input after shrinking{steered}: {row.get('signature')}; {row.get('error') or ''}"
        yield row
    elif accepted:
        row = dict(accepted[0])
        row.update(base_row, dtype=row["dtype"])
        row["reached_ops"] = sorted({o for r in accepted for o in (r.get("reached_ops") or [])})
        row["native_ops"] = sorted({o for r in accepted for o in (r.get("native_ops") or [])})
        row["fallback_ops"] = sorted({o for r in accepted for o in (r.get("fallback_ops") or [])})
        row["error"] = None
        if Status(row["status"]).passed:  # a fallback seen in any accepted call marks the whole search
            row["status"] = decide(cpu_error=None, target_error=None, close=True, fallback=row["fallback_ops"]).value
        yield row
    else:
        top = "; ".join(f"{n}x {msg}" for msg, n in rejected.most_common(2))
        yield {**base_row, "status": decide_unrun("cpu").value, "duration_s": 0.0,
               "error": f"no valid input: {sum(rejected.values())} generated calls rejected by the CPU{steered} ({top})"}


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

    args, kwargs = call.materialize()
    return dump_inputs({"args": [plain(a) for a in args], "kwargs": {k: plain(v) for k, v in kwargs.items()}})

