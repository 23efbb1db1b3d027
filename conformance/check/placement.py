"""Placement: where a sample's tensors go for one call, and how they come back.

- :func:`on_device` copies a sample to a device (or the CPU) keeping what a kernel may look at:
  strides, storage offset and the rest of the storage, memory overlap, aliasing between
  arguments. :func:`clone_sample`, :func:`leafify` and :func:`to_cpu` are its kin.
- Arguments an op wants on the CPU although its other inputs are on the device (the scalars of a
  foreach op, ``_pack_padded_sequence``'s lengths) are learned from the op's own error
  (:func:`on_cpu_where_wanted`) and kept on the CPU from then on (:func:`cpu_args`).
- Inside :func:`guarded_inputs`, CPU copies lie between guard regions, so that a kernel reading
  past an input reads a known fill and one writing past it is seen (:meth:`Guards.intact`): the
  CPU reference's self-consistency (:mod:`conformance.check.selfcheck`) runs on them.

Example::

    >>> import torch
    >>> from torch.testing._internal.opinfo.core import SampleInput
    >>> base = torch.arange(6.0)
    >>> with guarded_inputs() as guards:
    ...     moved = on_device(SampleInput(base[1:4], args=(base[2:5],)), "cpu")
    >>> moved.input.untyped_storage().data_ptr() == moved.args[0].untyped_storage().data_ptr()
    True
    >>> guards.intact(), moved.input.untyped_storage().nbytes() == base.untyped_storage().nbytes()
    (True, True)
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false as is_non_overlapping_and_dense
from torch.utils._pytree import tree_map

from .compare import leaves


def _whole_storage(t: torch.Tensor) -> torch.Tensor:
    """A 1-D tensor over all of ``t``'s storage."""
    return t.new_empty(0).set_(t.untyped_storage(), 0, (t.untyped_storage().nbytes() // t.element_size(),), (1,))


#: Per sample (by id, the sample kept alongside), the arguments its op wants on the CPU although
#: the others are on the device (:func:`on_cpu_where_wanted`): ``input``, ``args.<i>`` or
#: ``kwargs.<name>``. A side table: OpInfo's ``SampleInput`` takes no new attributes.
_PLACED: dict[int, tuple[Any, tuple[str, ...]]] = {}
#: What :func:`on_cpu_where_wanted` learned in this process, per OpInfo (or overload) x variant.
_LEARNED: dict[str, tuple[str, ...]] = {}
#: A target error that asks for an argument on the CPU ("Expected scalars to be on CPU", "'lengths'
#: argument should be a 1D CPU int64 tensor", "high must be a scalar tensor and on CPU"), not one
#: that merely names the CPU ("fell back to the CPU", "two devices, neuron:0 and cpu").
_CPU_WORD = re.compile(r"\bon\s+(the\s+)?(CPU|cpu)\b|\b(CPU|cpu)\s+(\w+\s+){0,2}tensor\b")


def _argument_names(sample: Any) -> list[str]:
    """The sample's arguments that hold a tensor, in call order."""
    def has(v: Any) -> bool:
        return any(isinstance(x, torch.Tensor) for x in leaves(v))

    names = ["input"] if has(sample.input) else []
    names += [f"args.{i}" for i, a in enumerate(sample.args) if has(a)]
    return names + [f"kwargs.{k}" for k, v in sample.kwargs.items() if k != "out" and has(v)]


def _with_arguments(sample: Any, donor: Any, names: tuple[str, ...]) -> Any:
    """``sample`` with the arguments ``names`` taken from ``donor`` (same call, other placement)."""
    args, kwargs, inp = list(sample.args), dict(sample.kwargs), sample.input
    for n in names:
        where, _, at = n.partition(".")
        if where == "input":
            inp = donor.input
        elif where == "args" and at.isdigit() and int(at) < len(args):
            args[int(at)] = donor.args[int(at)]
        elif where == "kwargs" and at in kwargs:
            kwargs[at] = donor.kwargs[at]
    return type(sample)(inp, args=tuple(args), kwargs=kwargs)


def cpu_args(sample: Any) -> tuple[str, ...]:
    """The arguments of ``sample`` that stay on the CPU when it goes to a device."""
    got = _PLACED.get(id(sample))
    return got[1] if got is not None and got[0] is sample else ()


def _set_cpu_args(sample: Any, names: tuple[str, ...]) -> None:
    if len(_PLACED) > 4096:  # samples of finished groups
        _PLACED.clear()
    _PLACED[id(sample)] = (sample, names)


def on_cpu_where_wanted(sample: Any, key: str, call: Callable[[], Any]) -> Any:
    """``call()`` (which runs the sample on the target through :func:`on_device`); when it raises
    an error that names the CPU, each tensor argument in turn is left on the CPU (the others on
    the device), and the first placement with which the call runs is kept for the sample and
    learned for ``key`` (a later sample of that key starts with what was learned). Some ops want an argument on the CPU on every device (the scalars of a
    foreach op, ``_pack_padded_sequence``'s lengths, ``tensor_split``'s indices): learned from the
    op's own error on the device, never from a list. ``call`` returns (result, sample on the
    device); a placement counts only when another tensor argument stays on the device and the
    result is on the device (else the call ran on the CPU). The call's own error stands when no
    single argument on the CPU makes it run."""
    if key in _LEARNED and not cpu_args(sample):
        _set_cpu_args(sample, _LEARNED[key])
    try:
        return call()
    except Exception as exc:
        if cpu_args(sample) or not _CPU_WORD.search(str(exc)):
            raise
        names = _argument_names(sample)
        for name in names if len(names) > 1 else ():  # one tensor on the CPU, the call on the device
            _set_cpu_args(sample, (name,))
            try:
                got = call()
            except Exception:  # noqa: BLE001 - not this argument
                continue
            results = [x for x in leaves(got[0]) if isinstance(x, torch.Tensor)]
            if results and all(x.device.type == "cpu" for x in results):
                continue  # it ran on the CPU, not on the device
            _LEARNED[key] = (name,)
            return got
        _set_cpu_args(sample, ())
        raise exc from None


class Guards:
    """The guard regions of the CPU copies made while :func:`guarded_inputs` is active."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.regions: list[tuple[torch.Tensor, Any]] = []  # (a guard region, its fill)

    def intact(self) -> bool:
        """Whether every guard still holds its fill (a kernel that writes past an input does not)."""
        for region, value in self.regions:
            if isinstance(value, float) and math.isnan(value):
                if not bool(torch.isnan(region).all()):
                    return False
            elif not bool((region == value).all()):
                return False
        return True


@contextlib.contextmanager
def _holding(slot: list[Any], value: Any) -> Iterator[Any]:
    """``slot[0]`` is ``value`` inside, what it was after."""
    was = slot[0]
    slot[0] = value
    try:
        yield value
    finally:
        slot[0] = was


#: While set (:func:`guarded_inputs`), CPU copies of a sample lie between guard regions.
_GUARDED: list[Guards | None] = [None]
_GUARD_BYTES = 256


@contextlib.contextmanager
def guarded_inputs(kind: str = "nan") -> Iterator[Guards]:
    """Inside, :func:`on_device` to the CPU places each tensor's storage between two guard
    regions of a fill: "nan" (NaN, the dtype's largest integer, True) or "other" (12345, the
    smallest integer, False). A kernel that reads past its inputs reads those, not whatever the
    heap held, and so gives other values from one fill to the other (or raises); one that writes
    past them leaves the guards changed (:meth:`Guards.intact`) and the heap whole."""
    with _holding(_GUARDED, Guards(kind)) as guards:
        yield guards


_ZEROED_OUTS: list[int] = [0]  # 0: off; else the bytes an empty tensor's zeroed storage holds


@contextlib.contextmanager
def zeroed_outs(capacity: int = 1 << 12) -> Iterator[None]:
    """Inside, the ``out=`` tensors a call is given come with the result's shapes, filled with
    zeros (:func:`conformance.check.execute.out_like`), and an empty tensor of a sample (a
    schema search's ``out=``) goes to the CPU with ``capacity`` bytes of zeroed storage behind
    it: a kernel that resizes it keeps that storage, so an element it leaves unwritten holds 0,
    not what a fresh allocation would (a self-consistency re-run's poison)."""
    with _holding(_ZEROED_OUTS, max(1, capacity)):
        yield


def outs_zeroed() -> bool:
    return bool(_ZEROED_OUTS[0])


def _zeroed_empty(t: torch.Tensor) -> torch.Tensor:
    """An empty CPU tensor like ``t`` over zeroed storage of the :func:`zeroed_outs` capacity."""
    n = -(-_ZEROED_OUTS[0] // t.element_size())
    return torch.zeros(n, dtype=t.dtype).resize_(t.shape)


def active_guards() -> Guards | None:
    """The guards of the :func:`guarded_inputs` block the caller is in (None: in none)."""
    return _GUARDED[0]


@contextlib.contextmanager
def unguarded() -> Iterator[None]:
    """Inside, no guards (within :func:`guarded_inputs`)."""
    with _holding(_GUARDED, None):
        yield


def filler(dtype: torch.dtype) -> Any:
    """What fills the gaps of a non-contiguous copy, a pre-filled ``out=`` and a guard region:
    NaN, ``True`` or the dtype's largest value."""
    if dtype.is_floating_point or dtype.is_complex:
        return math.nan
    if dtype == torch.bool:
        return True
    return torch.iinfo(dtype).max


def _guard_value(dtype: torch.dtype, kind: str) -> Any:
    if kind == "nan":
        return filler(dtype)
    if dtype.is_floating_point or dtype.is_complex:
        return 12345.0
    return False if dtype == torch.bool else torch.iinfo(dtype).min


def _guarded(flat: torch.Tensor, guards: Guards, nbytes: int = 0) -> torch.Tensor:
    """A copy of the 1-D ``flat`` in the middle of a buffer padded on both sides with a fill, at
    least ``nbytes`` long (the padding a multiple of 64 bytes, so the data keeps a fresh
    allocation's alignment). The copy's storage is its own bytes only, as the original's is (an
    op that checks a view against its storage's size must see the same size): a numpy view of
    the middle of the buffer, which keeps the whole buffer alive."""
    import numpy as np

    size = flat.element_size()
    pad = -(-max(_GUARD_BYTES, nbytes, flat.numel() * size) // 64) * 64
    raw = np.zeros(pad + flat.numel() * size + pad + 64, dtype=np.uint8)
    lead = (-raw.ctypes.data) % 64  # numpy aligns less than a tensor allocation does
    raw = raw[lead:lead + pad + flat.numel() * size + pad]
    whole = torch.from_numpy(raw).view(flat.dtype)
    value = _guard_value(flat.dtype, guards.kind)
    whole.fill_(value)
    n = pad // size
    guards.regions += [(whole[:n], value), (whole[n + flat.numel():], value)]
    middle = torch.from_numpy(raw[pad:pad + flat.numel() * size]).view(flat.dtype)
    return middle.copy_(flat)


def on_device(sample: Any, device: str | torch.device) -> Any:
    """``sample`` with every tensor copied to ``device`` in the layout it has: strides, storage
    offset and the rest of its storage (``as_strided`` reads it), memory overlap (an expanded
    tensor stays expanded) and storage shared between
    arguments (``cat([x, y], out=x)`` stays aliased), which ``Tensor.to`` keeps only for one dense
    tensor at a time. The target must see the input the CPU saw: an op may reject an overlapping
    or aliased ``out=``. Arguments the op wants on the CPU (:func:`cpu_args`) stay there."""
    strided = [x for x in leaves((sample.input, sample.args, sample.kwargs))
               if isinstance(x, torch.Tensor) and x.layout == torch.strided and x.numel() > 0]
    uses: dict[int, int] = {}
    for x in strided:
        uses[x.untyped_storage().data_ptr()] = uses.get(x.untyped_storage().data_ptr(), 0) + 1
    copies: dict[int, torch.Tensor] = {}

    guard = _GUARDED[0] if torch.device(device).type == "cpu" else None
    # a kernel reading past one input (shapes outside its contract) reads about as far as the
    # sample's other tensors are long: the guards are twice as long as all of them together
    guard_bytes = 2 * sum(x.untyped_storage().nbytes() for x in strided) if guard else 0

    def one(t: torch.Tensor) -> torch.Tensor:
        if t.layout == torch.strided and t.numel() == 0 and outs_zeroed() and torch.device(device).type == "cpu":
            return _zeroed_empty(t)
        if t.layout != torch.strided or t.numel() == 0:
            return t.to(device, copy=True)
        ptr = t.untyped_storage().data_ptr()
        if guard:
            if ptr not in copies:
                copies[ptr] = _guarded(_whole_storage(t), guard, guard_bytes)
            base = copies[ptr]
            return base.as_strided(t.shape, t.stride(), base.storage_offset() + t.storage_offset())
        whole = t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.numel() * t.element_size()
        if uses.get(ptr, 0) < 2 and whole and (t.is_contiguous() or is_non_overlapping_and_dense(t)):
            return t.to(device, copy=True)
        if ptr not in copies:
            copies[ptr] = _whole_storage(t).to(device, copy=True)
        return copies[ptr].as_strided(t.shape, t.stride(), t.storage_offset())

    return clone_sample(sample, one, device)


def clone_sample(sample: Any, fn: Callable[[torch.Tensor], torch.Tensor], device: str | torch.device | None = None) -> Any:
    """Copy a sample's tensors through ``fn``; schema-generated ``device`` arguments become
    ``device`` (the CPU for the reference run, the target's device for the target run). A tensor
    passed twice (``cat([x, y], out=x)``) is copied once, so the copies alias as the originals do.
    Going to a device, the arguments the op wants on the CPU (:func:`cpu_args`) are plain CPU
    copies instead."""
    keep = cpu_args(sample) if device is not None and torch.device(device).type != "cpu" else ()
    if keep:
        moved = _clone_sample(sample, fn, device)
        return _with_arguments(moved, _clone_sample(sample, lambda t: t.detach().clone(), "cpu"), keep)
    return _clone_sample(sample, fn, device)


def _clone_sample(sample: Any, fn: Callable[[torch.Tensor], torch.Tensor], device: str | torch.device | None) -> Any:
    from conformance.inputs.schema import DeviceArg

    done: dict[int, Any] = {}

    def one(t: Any) -> Any:
        if isinstance(t, torch.Tensor):
            if id(t) not in done:
                done[id(t)] = fn(t.detach())
            return done[id(t)]
        if isinstance(t, torch.UntypedStorage):
            if id(t) not in done:
                done[id(t)] = _storage_copy(t, fn)
            return done[id(t)]
        if isinstance(t, DeviceArg):
            return torch.device(device or "cpu")
        return t

    if device is None and not _needs_mapping(sample):
        return sample.transform(one)
    mapped = _map_sample(sample, one)
    # Factory samples name the device they were generated for ("cpu"): the target run must
    # create its tensors on the target, or it would silently be a CPU-vs-CPU comparison.
    if device is not None and _is_cpu(mapped.kwargs.get("device")):
        mapped.kwargs["device"] = torch.device(device)
    return mapped


def _is_cpu(value: Any) -> bool:
    return (isinstance(value, str) and value == "cpu") or (isinstance(value, torch.device) and value.type == "cpu")


def _needs_mapping(sample: Any) -> bool:
    """Whether ``sample`` holds a device argument or a storage (which ``transform`` passes by)."""
    from conformance.inputs.schema import DeviceArg

    return any(isinstance(v, (DeviceArg, torch.UntypedStorage))
               for v in [sample.input, *sample.args, *sample.kwargs.values()])


def storage_bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """A 1-D uint8 tensor over all of ``storage`` (how a Storage argument is copied and stored)."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage, 0, (storage.nbytes(),), (1,))


def _storage_copy(storage: torch.UntypedStorage, fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.UntypedStorage:
    """A Storage argument (``set_``'s source) copied where ``fn`` copies the sample's tensors: the
    storage of ``fn``'s copy of its bytes (on the CPU between guards, on the target's device),
    so that the CPU and the target calls get equal storages. Where ``fn`` lays its copy out
    otherwise (the noncontiguous contract's copies, with gaps), the bytes go as they are: a
    storage has no layout, and a longer one would be another argument."""
    raw = storage_bytes(storage)
    got = fn(raw)
    if got.storage_offset() == 0 and got.is_contiguous() and got.untyped_storage().nbytes() == storage.nbytes():
        return got.untyped_storage()
    return raw.to(got.device, copy=True).untyped_storage()


def _map_sample(sample: Any, one: Callable[[Any], Any]) -> Any:
    def walk(v: Any) -> Any:
        if isinstance(v, (list, tuple)):
            return type(v)(walk(x) for x in v)
        return one(v)

    return type(sample)(walk(sample.input), args=tuple(walk(a) for a in sample.args),
                        kwargs={k: walk(v) for k, v in sample.kwargs.items()})


def _tensor_to_cpu(x: torch.Tensor) -> torch.Tensor:
    """A CPU copy of ``x`` as it is: a negative or conjugate view stays a view with that bit
    (its data copied as stored, the bit set again on the CPU), as the CPU's own result is one;
    a plain copy would compute the negation, which some dtypes have no kernel for (bool)."""
    x = x.detach()
    if x.layout == torch.strided and x.is_neg() and x.device.type != "cpu":
        return torch._neg_view(_tensor_to_cpu(torch._neg_view(x)))
    return x.to("cpu", copy=True)


def to_cpu(value: Any) -> Any:
    return tree_map(lambda x: _tensor_to_cpu(x) if isinstance(x, torch.Tensor) else x, value)


def leafify(sample: Any, device: str | torch.device,
            make: Callable[[torch.Tensor, str | torch.device], torch.Tensor] | None = None) -> Any:
    """``sample``'s tensors as fresh leaves on ``device`` (those the op wants on the CPU,
    :func:`cpu_args`, on the CPU). ``make(t, device)``: how each is copied there (default a
    plain copy; the noncontiguous contract passes non-contiguous copies)."""
    copy = make or (lambda t, d: t.to(d, copy=True))

    def one(d: str | torch.device) -> Any:
        return sample.transform(lambda t: copy(t.detach(), d).requires_grad_(t.requires_grad)
                                if isinstance(t, torch.Tensor) else t)

    keep = cpu_args(sample)
    if keep and torch.device(device).type != "cpu":
        return _with_arguments(one(device), one("cpu"), keep)
    return one(device)


__all__ = ["Guards", "active_guards", "outs_zeroed", "zeroed_outs", "clone_sample", "cpu_args", "filler", "guarded_inputs", "leafify", "on_cpu_where_wanted",
           "on_device", "storage_bytes", "to_cpu", "unguarded"]
