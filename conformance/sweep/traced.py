"""Op signatures traced from model graphs, replayed as op items at the sizes the models use.

OpInfo's samples hold a few dozen elements; the model graphs call the same overloads at the sizes
real models run at (sequence lengths, hidden sizes, batch x channels), where a kernel that
changes algorithm with size goes wrong. This lane records every ATen call the model graphs make
on the CPU, forward and backward (:func:`trace_models`, ``conformance trace``), keeps each
distinct *signature* once per torch version with the models that call it (:mod:`opdb.traced`),
and runs signatures as op items of variant ``traced`` (:data:`TRACED`), through the same
execute / compare / decide path as a sample: the float64 arbiter, the reference's
self-consistency, the op's meta-kernel contract, and the contracts on the first item of each
overload x dtype (values only on the rest, as the size ladder).

A signature (:func:`signature_of`) is the overload and each argument: a tensor as its dtype,
shape, strides and storage offset (an expanded or transposed view stays one) and the kind of
values it held; any other argument as it was (ints, floats, lists, dtypes, a device as "the
item's device"). Its key is a digest of that structure without the values, so two calls that
differ only in values are one signature (their use counts add up). How the values come back
(:func:`materialize`): a tensor of integers or booleans whose storage holds at most
:data:`EXACT_VALUES` elements keeps the values the model gave it (token ids, positions,
indices and masks stay valid); any other tensor gets fresh random values, seeded by the
signature and the run's seed, uniform in the range the traced values spanned (so a variance
stays positive, a probability in [0, 1] and a large index in bounds).

Which signatures a run replays (:func:`replayed`): per overload x dtype, the
:data:`PER_GROUP` largest (most elements) and the :data:`PER_GROUP` most called, at most
:data:`MAX_BYTES` of storage each. Random ops (``nondeterministic_seeded``) are not traced: their
values are no verdict. Items are ``aten::op.overload|traced|dtype|N`` (N: from the signature's
key); a failing one says which models call its signature ("used by 3 models: ..."), and its
row's ``proof.traced`` holds the key, the calls and the models.

Example::

    >>> import torch
    >>> calls = trace_module(torch.nn.Linear(4, 3), (torch.ones(2, 4),), "lin")
    >>> sorted({s.op for s in calls.signatures.values()})
    ['aten::addmm.default', 'aten::t.default']
    >>> sig = next(s for s in calls.signatures.values() if s.op == "aten::addmm.default")
    >>> sig.dtype, [a["T"]["shape"] for a in sig.spec["args"]]
    ('float32', [[3], [2, 4], [4, 3]])
    >>> args, kwargs = materialize(sig.spec, seed=0)
    >>> args[2].stride()  # the weight's transpose, as traced
    (1, 4)
"""

from __future__ import annotations

import collections
import copy
import hashlib
import json
import math
import time
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from conformance.catalog.overloads import op_name
from conformance.check.verdict import Status, decide_unrun
from conformance.work import NOTHING, Group, ItemKey, Selection

VARIANT = "traced"
#: Signatures replayed per overload x dtype, by size and by calls (see :func:`replayed`).
PER_GROUP = 4
#: Bytes of storage one replayed signature's tensor arguments may view (as the size ladder's).
MAX_BYTES = 64 * 2**20
#: A tensor of integers or booleans viewing at most this many elements of storage keeps its
#: traced values; a larger one gets fresh ones in its traced range.
EXACT_VALUES = 4096


class Unencodable(Exception):
    """An argument a signature cannot hold (an opaque object, a generator)."""


# -- signatures -----------------------------------------------------------------------------
@dataclass
class Signature:
    key: str
    op: str
    dtype: str
    spec: dict[str, Any]
    numel: int
    nbytes: int

    def row(self) -> dict[str, Any]:
        return {"key": self.key, "op": self.op, "dtype": self.dtype, "numel": self.numel, "nbytes": self.nbytes,
                "spec": json.dumps(self.spec, sort_keys=True, separators=(",", ":"))}


def _extent(shape: Sequence[int], stride: Sequence[int]) -> int:
    """Elements of storage a view of ``shape`` and ``stride`` spans (from its offset)."""
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(shape, stride, strict=True))


def _tensor(t: torch.Tensor) -> dict[str, Any]:
    if t.layout != torch.strided or t.is_quantized or t.is_nested or t.device.type != "cpu":
        raise Unencodable(f"a {t.layout} tensor on {t.device}")
    shape, stride, offset = list(t.shape), list(t.stride()), int(t.storage_offset())
    extent = _extent(shape, stride)
    spec: dict[str, Any] = {"dtype": str(t.dtype).removeprefix("torch."), "shape": shape, "stride": stride,
                            "offset": offset}
    region = t.as_strided((extent,), (1,), offset) if extent else t.new_empty(0)
    if t.dtype.is_complex:
        raise Unencodable("a complex tensor")
    if extent == 0:
        spec["values"] = {"range": [0, 0]}
    elif (not t.dtype.is_floating_point) and extent <= EXACT_VALUES:
        spec["values"] = {"exact": region.to(torch.int64).tolist()}
    else:
        with torch.no_grad():
            flat = region.detach().to(torch.float64)
            finite = flat[torch.isfinite(flat)]
            lo, hi = (finite.min().item(), finite.max().item()) if finite.numel() else (0.0, 0.0)
        spec["values"] = {"range": [lo, hi]}
    return spec


def _encode(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return {"T": _tensor(v)}
    if isinstance(v, (list, tuple)):
        return [_encode(x) for x in v]
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else {"float": repr(v)}
    if isinstance(v, torch.dtype):
        return {"dtype": str(v).removeprefix("torch.")}
    if isinstance(v, torch.device):
        return {"device": True}
    if isinstance(v, torch.memory_format):
        return {"memory_format": str(v).removeprefix("torch.")}
    if isinstance(v, torch.layout):
        return {"layout": str(v).removeprefix("torch.")}
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise Unencodable("a symbolic size")
    raise Unencodable(type(v).__name__)


def _structure(v: Any) -> Any:
    """The spec without the tensors' values (what the key digests)."""
    if isinstance(v, dict) and "T" in v:
        return {"T": {k: x for k, x in v["T"].items() if k != "values"}}
    if isinstance(v, list):
        return [_structure(x) for x in v]
    if isinstance(v, dict):
        return {k: _structure(x) for k, x in v.items()}
    return v


def _tensors(v: Any) -> Iterator[dict[str, Any]]:
    if isinstance(v, dict) and "T" in v:
        yield v["T"]
    elif isinstance(v, list):
        for x in v:
            yield from _tensors(x)
    elif isinstance(v, dict):
        for x in v.values():
            yield from _tensors(x)


def signature_of(func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Signature:
    """The signature of one call (raises :class:`Unencodable` for one it cannot hold)."""
    spec = {"args": _encode(list(args)), "kwargs": {k: _encode(v) for k, v in sorted(kwargs.items())}}
    op = op_name(func)
    body = json.dumps({"op": op, **_structure(spec)}, sort_keys=True, separators=(",", ":"))
    key = hashlib.sha1(body.encode()).hexdigest()
    tensors = list(_tensors(spec))
    floating = [t for t in tensors if getattr(torch, t["dtype"]).is_floating_point]
    dtype = (floating or tensors)[0]["dtype"] if tensors else (
        next((v["dtype"] for v in spec["kwargs"].values() if isinstance(v, dict) and "dtype" in v), "none"))
    numel = sum(math.prod(t["shape"]) for t in tensors)
    nbytes = sum((t["offset"] + _extent(t["shape"], t["stride"])) * getattr(torch, t["dtype"]).itemsize
                 for t in tensors)
    return Signature(key, op, dtype, spec, numel, nbytes)


# -- tracing --------------------------------------------------------------------------------
@dataclass
class Traced:
    """What a trace saw: each signature once, and ``(key, model) -> calls``."""

    signatures: dict[str, Signature] = field(default_factory=dict)
    calls: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    skipped: collections.Counter[str] = field(default_factory=collections.Counter)  # why, per call
    models: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # model -> why its trace failed

    def merge(self, other: Traced) -> None:
        for k, s in other.signatures.items():
            self.signatures.setdefault(k, s)
        self.calls.update(other.calls)
        self.skipped.update(other.skipped)
        self.models += other.models
        self.failed.update(other.failed)


class _Recorder(TorchDispatchMode):
    def __init__(self, model: str, out: Traced) -> None:
        super().__init__()
        self.model, self.out = model, out

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func.namespace == "aten" and torch.Tag.nondeterministic_seeded not in func.tags:
            try:
                sig = signature_of(func, args, kwargs)  # before the call: an in-place op changes its input
            except Unencodable as exc:
                self.out.skipped[f"{op_name(func)}: {exc}"] += 1
            else:
                self.out.signatures.setdefault(sig.key, sig)
                self.out.calls[(sig.key, self.model)] += 1
        return func(*args, **kwargs)


def trace_module(model: torch.nn.Module, inputs: tuple[Any, ...], name: str,
                 loss: Callable[[Any], torch.Tensor] | None = None) -> Traced:
    """The calls of ``model(*inputs)`` (and of ``loss(output).backward()`` when ``loss`` is given)."""
    out = Traced(models=[name])
    with _Recorder(name, out):
        result = model(*inputs)
        if loss is not None:
            loss(result).backward()
    return out


def trace_models(models: Sequence[str], limit: int | None = None, dtypes: Sequence[str] | None = None,
                 progress: Callable[[str], None] | None = None) -> Traced:
    """Trace the model graphs the model lane selects (``models``: ``all``, family names, ``hf``
    or model ids; ``limit`` graphs per family; the dtypes of ``dtypes`` each graph supports),
    forward and backward on the CPU. A graph whose trace fails is named in ``failed``; the rest go on."""
    from conformance.models.selection import model_groups, resolve_spec
    from conformance.models.training import cast

    total, start = Traced(), time.monotonic()
    groups = model_groups(list(models), list(dtypes) if dtypes else None, limit)
    for i, g in enumerate(groups, start=1):
        name = f"{g.op}|{g.dtype}"
        try:
            spec = resolve_spec(g.op)
            torch.manual_seed(0)
            dtype = getattr(torch, g.dtype)
            model = copy.deepcopy(spec.build()).to(dtype)
            total.merge(trace_module(model, cast(spec.example_inputs(), dtype), name, spec.loss))
        except Exception as exc:  # noqa: BLE001 - a graph the model lane reports failing on the CPU too
            first = (str(exc).strip().splitlines() or [""])[0][:200]
            total.failed[name] = f"{type(exc).__name__}: {first}"
        if progress is not None:
            progress(f"trace [{i}/{len(groups)}] {name}: {len(total.signatures)} signatures, "
                     f"{sum(total.calls.values())} calls, {time.monotonic() - start:.0f}s")
    return total


def trace_into(store: Any, models: Sequence[str], limit: int | None = None, dtypes: Sequence[str] | None = None,
               progress: Callable[[str], None] | None = None) -> list[str]:
    """Trace (:func:`trace_models`) and store the signatures with their uses in ``store``
    (:mod:`opdb.traced`, under this torch's version); returns what to print about it."""
    from opdb import traced as stored

    t0 = time.monotonic()
    got = trace_models(models, limit, dtypes, progress)
    if getattr(progress, "end", None) is not None:
        progress.end(f"traced {len(got.models)} graphs in {time.monotonic() - t0:.0f}s")
    new = stored.record(store, torch.__version__, [s.row() for s in got.signatures.values()], got.calls)
    have = stored.summary(store, torch.__version__)
    lines = [f"traced {len(got.models)} model graphs ({', '.join(sorted(set(dtypes or ('float32', 'bfloat16'))))}): "
             f"{len(got.signatures)} signatures of {len({s.op for s in got.signatures.values()})} overloads, "
             f"{sum(got.calls.values())} calls; {new} new in the database",
             f"the database holds {have['signatures']} signatures of {have['overloads']} overloads "
             f"({have['calls']} calls by {have['models']} model graphs) for torch {torch.__version__}; "
             f"a run replays up to {2 * PER_GROUP} per overload x dtype (--sizes auto, traced or all)"]
    if got.skipped:
        lines.append(f"calls not kept ({sum(got.skipped.values())}): " + "; ".join(
            f"{n}x {why}" for why, n in got.skipped.most_common(3)))
    for name, why in sorted(got.failed.items()):
        lines.append(f"could not trace {name}: {why}")
    return lines


# -- replay ---------------------------------------------------------------------------------
def _fill(t: dict[str, Any], gen: torch.Generator) -> torch.Tensor:
    dtype = getattr(torch, t["dtype"])
    length = t["offset"] + _extent(t["shape"], t["stride"])
    values = t["values"]
    if "exact" in values:
        base = torch.zeros(t["offset"], dtype=torch.int64)
        flat = torch.cat([base, torch.tensor(values["exact"], dtype=torch.int64)]).to(dtype)
    else:
        lo, hi = values["range"]
        if dtype == torch.bool:
            flat = torch.randint(0, 2, (length,), generator=gen).bool() if hi > lo else torch.full((length,), bool(lo))
        elif dtype.is_floating_point:
            u = torch.rand(length, generator=gen, dtype=torch.float64)
            flat = (lo + (hi - lo) * u).to(dtype)
        else:
            flat = torch.randint(int(lo), int(hi) + 1, (length,), generator=gen, dtype=torch.int64).to(dtype)
    return flat.as_strided(t["shape"], t["stride"], t["offset"])


def _decode(v: Any, gen: torch.Generator) -> Any:
    from conformance.inputs.schema import DEVICE

    if isinstance(v, list):
        return [_decode(x, gen) for x in v]
    if isinstance(v, dict):
        if "T" in v:
            return _fill(v["T"], gen)
        if "dtype" in v:
            return getattr(torch, v["dtype"])
        if "device" in v:
            return DEVICE
        if "memory_format" in v:
            return getattr(torch, v["memory_format"])
        if "layout" in v:
            return getattr(torch, v["layout"])
        if "float" in v:
            return float(v["float"])
    return v


def materialize(spec: Mapping[str, Any], seed: int) -> tuple[list[Any], dict[str, Any]]:
    """The call's arguments, fresh tensors of the traced structure (see the module docstring)."""
    gen = torch.Generator().manual_seed(seed)
    return _decode(spec["args"], gen), {k: _decode(v, gen) for k, v in spec["kwargs"].items()}


def replayed(rows: Iterable[Mapping[str, Any]], per_group: int = PER_GROUP,
             max_bytes: int = MAX_BYTES) -> dict[tuple[str, str], list[Mapping[str, Any]]]:
    """The stored signatures (``traced_signatures`` rows) a run replays, by (overload, dtype):
    the ``per_group`` largest and the ``per_group`` most called within ``max_bytes``, largest
    first. Signatures without a tensor argument or above the byte budget are left out."""
    by: dict[tuple[str, str], list[Mapping[str, Any]]] = collections.defaultdict(list)
    for r in rows:
        if r["dtype"] != "none" and r["numel"] and r["nbytes"] <= max_bytes:
            by[(r["op"], r["dtype"])].append(r)
    out = {}
    for k, sigs in sorted(by.items()):
        largest = sorted(sigs, key=lambda r: (-r["numel"], r["key"]))[:per_group]
        called = sorted(sigs, key=lambda r: (-r["calls"], r["key"]))[:per_group]
        keep = {r["key"]: r for r in largest + called}
        out[k] = sorted(keep.values(), key=lambda r: (-r["numel"], r["key"]))
    return out


def sample_index(key: str) -> int:
    """The item's number from its signature's key (stable, unique in practice)."""
    return int(key[:12], 16)


def selects(selection: Selection, op: str, dtype: str) -> bool:
    """Whether a run's ``--ops``/``--dtypes`` select a traced overload x dtype: an ``aten::`` glob
    matching the overload, or an OpInfo glob matching its name (``cumsum`` selects
    ``aten::cumsum.default`` and ``aten::cumsum.out``); no ``--ops``: every one."""
    from fnmatch import fnmatchcase

    if selection.dtypes and dtype not in {d.strip() for ds in selection.dtypes for d in ds.split(",")}:
        return False
    if not selection.ops:
        return True
    base = op.split("::", 1)[1].split(".", 1)[0]
    return (any(fnmatchcase(op, g) for g in selection.aten_globs)
            or any(fnmatchcase(base, g) or fnmatchcase(base.rstrip("_"), g) for g in selection.info_globs))


def _used_by(models: Sequence[str], n_models: int) -> str:
    shown = ", ".join(models[:3]) + (", ..." if n_models > 3 else "")
    return f"used by {n_models} model{'' if n_models == 1 else 's'}: {shown}"


class TracedReplay:
    """The work kind: one group per traced overload x dtype. Its groups come from the run's
    database (:func:`conformance.run.runner` adds them, the signatures travel as ``Skip.replay``),
    not from the selection alone."""

    name = "traced"
    table = "op_results"
    variants = (VARIANT,)
    crash_safe_factor = 0
    timeout_factor = 1

    def groups(self, selection: Selection) -> list[Group]:
        return []  # from the store: conformance.run.runner._traced

    def run(self, target: Any, group: Group, config: Any, *, skip: Container[str] = NOTHING,
            on_start: Callable[[str], None] | None = None) -> Iterator[dict[str, Any]]:
        import dataclasses

        from conformance.sweep.opinfo import evaluate, harness_error
        from conformance.sweep.schema import OverloadInfo

        sigs = (getattr(skip, "replay", None) or {}).get("signatures") or []
        try:
            info = OverloadInfo(group.op)
        except (AttributeError, ValueError) as exc:  # an overload this torch does not have
            info, missing = None, exc
        values_only = dataclasses.replace(config, contracts=("none",))
        for i, sig in enumerate(sigs):
            index = sample_index(sig["key"])
            key = str(ItemKey(group.op, VARIANT, group.dtype, index))
            if key in skip:
                continue
            if on_start is not None:
                on_start(key)
            if info is None:
                yield {**self.synthetic_row(ItemKey.parse(key)), "item_key": key, "status": decide_unrun("cpu").value,
                       "duration_s": 0.0, "seed": config.seed,
                       "error": f"no such overload in this torch: {missing}"[:2000]}
                continue
            spec, seed = json.loads(sig["spec"]), (config.seed * 1_000_003 + index) % 2**63
            try:
                sample = _sample(*materialize(spec, seed))
                row = evaluate(target, info, group.op, "function", group.dtype, index, sample,
                               config if i == 0 else values_only)
            except Exception as exc:  # noqa: BLE001 - the harness failed on this item
                row = harness_error(Group(group.op, group.dtype), "function", index, exc, config)
            models = sig.get("used_by") or []
            row.update(item_key=key, variant=VARIANT, sample=index, seed=config.seed)
            row["proof"] = {**(row.get("proof") or {}), "traced": {
                "key": sig["key"], "numel": sig["numel"], "calls": sig["calls"], "models": sig["models"],
                "used_by": models[:10]}}
            if not Status(row["status"]).passed and row["status"] != Status.SKIP.value:
                row["error"] = f"{row.get('error') or row['status']} ({_used_by(models, sig['models'])})"[:2000]
                row["inputs"] = _inputs(spec, seed)  # what repro replays (the sweep's own call, again)
            yield row

    def synthetic_row(self, key: ItemKey) -> dict[str, Any]:
        return {"op": key.name, "variant": key.variant, "dtype": key.dtype, "sample": int(key.sample)}


def _inputs(spec: Mapping[str, Any], seed: int) -> bytes:
    from conformance.inputs.corpus import Stored
    from conformance.sweep.schema.rows import blob

    args, kwargs = materialize(spec, seed)
    return blob(Stored("failing", False, tuple(args), kwargs))


def _sample(args: list[Any], kwargs: dict[str, Any]) -> Any:
    from torch.testing._internal.opinfo.core import SampleInput

    if not args:
        raise ValueError("a traced call with no positional argument")
    return SampleInput(args[0], args=tuple(args[1:]), kwargs=kwargs)


TRACED = TracedReplay()

__all__ = ["EXACT_VALUES", "MAX_BYTES", "PER_GROUP", "TRACED", "VARIANT", "Signature", "Traced", "Unencodable", "trace_into",
           "materialize", "replayed", "sample_index", "selects", "signature_of", "trace_models", "trace_module"]
