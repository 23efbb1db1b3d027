"""Reference self-consistency: does the CPU reference agree with itself on the same inputs?

An op may return memory it never wrote (``resize_as_`` growing a tensor, ``_reshape_alias`` with
strides past its storage, ``empty``-like results, an ``out=`` a kernel leaves unwritten), or read
past its inputs on arguments outside its contract. Those elements of the CPU's result are not a
reference: they differ from one call to the next, and a target that returns other garbage there
is not wrong. Before an item is called a mismatch, the sweep runs its reference again on fresh
copies of its inputs (:func:`again_on_poisoned`): once with every new allocation filled
(PyTorch's ``torch.utils.deterministic.fill_uninitialized_memory``: NaN, the largest integer,
True; and c10's CPU allocator filling every other block it hands out with a junk pattern,
:func:`allocator_fill`) and each input between guard regions of another value
(:func:`conformance.check.placement.guarded_inputs`: a kernel that reads past an input reads
those), and, where that run agrees with the first on a fill value, once more with every
allocation zero-filled, ``out=`` tensors of zeros and NaN guards. :func:`undefined` finds the
elements the runs do not all reproduce; they are left out of the comparison (:func:`masked`), counted and shown. An item
whose whole result is undefined, or whose reference raises on a re-run (it depended on memory
past its inputs), is ``skip``, with that reason (:data:`NOT_REPRODUCIBLE`). It runs only where a
comparison failed, so an item that passes pays nothing; the schema search runs it on every
input it accepts, and rejects one with any undefined element.

Example::

    >>> import torch
    >>> first = torch.tensor([1.0, 2.0, 3.0])
    >>> second = torch.tensor([1.0, 2.0, float("nan")])
    >>> u = undefined(first, second)
    >>> u.elements, u.total, u.everything
    (1, 3, False)
    >>> masked(u, torch.tensor([1.0, 2.0, 9.0]), first)
    tensor([1., 2., 3.])
"""

from __future__ import annotations

import contextlib
import functools
import math
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from .compare import bitwise_equal, leaves
from .placement import guarded_inputs, to_cpu, zeroed_outs

#: How an item whose every result element is undefined (the CPU returns other values on every
#: call with the same inputs) is skipped: it says nothing about the target.
NOT_REPRODUCIBLE = "the CPU reference is not reproducible"
#: How an item whose CPU reference wrote into the guard regions around its inputs is skipped
#: (:func:`conformance.check.placement.guarded_inputs`): its input is outside the op's contract.
WRITES_PAST = f"{NOT_REPRODUCIBLE}: the CPU kernel writes past its inputs (an input outside the op's contract)"


@contextlib.contextmanager
def filled_allocations() -> Iterator[None]:
    """Every tensor allocated inside is filled (NaN, or the largest integer), not left holding
    what the allocator hands back. PyTorch fills only under deterministic algorithms; with
    ``warn_only`` an op that has no deterministic implementation still runs (its warning is
    silenced by the caller's ``warnings`` filter)."""
    import torch.utils.deterministic as det

    was_on, was_warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    was_fill = det.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    det.fill_uninitialized_memory = True
    try:
        yield
    finally:
        det.fill_uninitialized_memory = was_fill
        torch.use_deterministic_algorithms(was_on, warn_only=was_warn)


def again(reference: Callable[[], Any], *, fill: bool = True) -> tuple[Any, str | None]:
    """``reference()`` (a fresh CPU run of the item, its inputs copied anew), with every new
    allocation filled when ``fill``: (result, None), or (None, the error) when this run raises."""
    try:
        with filled_allocations() if fill else contextlib.nullcontext():
            return reference(), None
    except Exception as exc:  # noqa: BLE001 - a reference that raises on its second run is not reproducible
        return None, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"


@dataclass
class Undefined:
    """The elements of a reference that differ between two CPU runs of one item."""

    masks: list[Any] = field(default_factory=list)  # per pytree leaf: a bool tensor, True/False, or None (not masked)
    elements: int = 0  # undefined elements (a scalar leaf counts one)
    total: int = 0  # elements of the result
    structure: bool = True  # False: the two runs differ in structure, dtype, shape or layout

    @property
    def everything(self) -> bool:
        """Nothing of the result is defined (or its structure differs between runs)."""
        return not self.structure or (self.total > 0 and self.elements >= self.total)

    @property
    def any(self) -> bool:
        return not self.structure or self.elements > 0

    def as_json(self) -> dict[str, Any]:
        return {"elements": self.elements, "of": self.total, **({} if self.structure else {"structure": "differs"})}

    def describe(self) -> str:
        if not self.structure:
            return f"{NOT_REPRODUCIBLE}: CPU runs of the same input return results of different structure, dtype or shape"
        return (f"{NOT_REPRODUCIBLE}: {self.elements} of {self.total} result elements differ between CPU runs "
                "of the same input (memory the op leaves unwritten, or reads past its inputs)")


def _same(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Element by element: the same value (NaN equal to NaN; complex: both parts)."""
    if x.dtype == torch.complex32:
        x, y = x.to(torch.complex64), y.to(torch.complex64)
    if x.is_complex():
        xr, yr = torch.view_as_real(x.resolve_conj()), torch.view_as_real(y.resolve_conj())
        return _same(xr, yr).all(dim=-1)
    if x.dtype == torch.bool:  # by the byte: uninitialised bools hold any byte, and 7 == 1 as bools
        x, y = x.view(torch.uint8), y.view(torch.uint8)
    eq = x == y
    if x.is_floating_point():
        eq |= torch.isnan(x) & torch.isnan(y)
    return eq


def undefined(first: Any, second: Any, *more: Any) -> Undefined:
    """Which elements of ``first`` (a CPU result) ``second`` (another CPU run of the same item),
    or any of ``more`` runs, does not reproduce."""
    la, sa = tree_flatten(first)
    others = [tree_flatten(r) for r in (second, *more)]
    u = Undefined()
    if any(so != sa or len(lo) != len(la) for lo, so in others):
        u.structure = False
        return u
    for i, x in enumerate(la):
        ys = [lo[i] for lo, _ in others]
        if any(isinstance(y, torch.Tensor) != isinstance(x, torch.Tensor) for y in ys):
            u.structure = False
            return u
        if not isinstance(x, torch.Tensor):
            differs = any(x != y and not (isinstance(x, float) and isinstance(y, float) and math.isnan(x)
                                          and math.isnan(y)) for y in ys)
            u.masks.append(differs)
            u.elements += int(differs)
            u.total += 1
            continue
        if any(x.dtype != y.dtype or x.shape != y.shape or x.layout != y.layout for y in ys):
            u.structure = False
            return u
        u.total += x.numel()
        if x.layout != torch.strided:  # sparse: the whole tensor agrees or not
            differs = not all(bitwise_equal(x, y) for y in ys)
            u.masks.append(differs)
            u.elements += x.numel() if differs else 0
            continue
        bad = ~_same(x.detach(), ys[0].detach())
        for y in ys[1:]:
            bad |= ~_same(x.detach(), y.detach())
        n = int(bad.sum())
        u.masks.append(bad if n else None)
        u.elements += n
    return u


def masked(u: Undefined, target: Any, cpu: Any) -> Any:
    """``target`` with its elements at ``u``'s undefined places taken from ``cpu`` (so a
    comparison leaves them out); ``target`` itself when its structure is not the CPU's."""
    lt, st = tree_flatten(target)
    lc, sc = tree_flatten(cpu)
    if st != sc or len(lt) != len(lc) or len(lt) != len(u.masks):
        return target
    out = []
    for t, c, m in zip(lt, lc, u.masks, strict=True):
        if m is None or m is False:
            out.append(t)
        elif m is True:
            out.append(c)
        elif isinstance(t, torch.Tensor) and isinstance(c, torch.Tensor) and t.shape == c.shape and t.dtype == c.dtype:
            t = t.clone()
            t[m] = c[m]
            out.append(t)
        else:
            out.append(t)
    return tree_unflatten(out, st)


_POISONED_BLOCKS = 16  # per size: the run's other allocations of that size may take some first ...
_POISON_BYTES = 64 << 20  # ... as far as this many bytes a size allows
#: c10's allocator fills every CPU allocation with this 32-bit pattern under its junk-fill flag
#: (NaN as float32, 1.67e308 as float64, a large integer otherwise), little-endian in memory
_JUNK = 0x7FEDBEEF


@functools.cache
def _c10_flag(name: str) -> Any:
    """c10's allocator flag ``name`` (a ``ctypes.c_bool`` in ``libc10``), or None where this
    build of PyTorch does not export it."""
    import ctypes
    import os

    try:
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))
        return ctypes.c_bool.in_dll(lib, f"FLAGS_caffe2_cpu_allocator_do_{name}")
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def allocator_fill(kind: str) -> Iterator[bool]:
    """Every CPU allocation made inside (tensors, and a kernel's own buffers made as tensors) is
    filled by PyTorch's CPU allocator itself: ``"junk"`` (a NaN or large-integer pattern) or
    ``"zero"``, whatever block the heap hands back. Yields whether it could (the flags are c10's
    ``caffe2_cpu_allocator_do_{junk,zero}_fill``); a build without them yields False."""
    flag = _c10_flag(f"{kind}_fill")
    if flag is None:
        yield False
        return
    was = flag.value
    flag.value = True
    try:
        yield True
    finally:
        flag.value = was


def _poison_heap(result: Any) -> None:
    """Where the allocator cannot fill (:func:`allocator_fill` yields False): allocate and free
    blocks the sizes of ``result``'s tensors, filled with zero bytes, so that the allocator
    hands the same blocks to the next run's allocations of those sizes. (A block of 16 bytes or
    less keeps glibc's own free-list pointers, so this is the weaker way.)"""
    sizes = [x.untyped_storage().nbytes() for x in leaves(result)
             if isinstance(x, torch.Tensor) and x.layout == torch.strided and x.untyped_storage().nbytes()]
    blocks = [torch.zeros((n,), dtype=torch.uint8) for n in sizes
              for _ in range(max(1, min(_POISONED_BLOCKS, _POISON_BYTES // n)))]
    del blocks


def _nbytes(result: Any) -> int:
    """The bytes of ``result``'s largest tensor."""
    return max((x.untyped_storage().nbytes() for x in leaves(result)
                if isinstance(x, torch.Tensor) and x.layout == torch.strided), default=0)


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _fill_like(x: torch.Tensor) -> torch.Tensor:
    """Element by element: could this value be what the filled re-run writes into memory a
    kernel leaves unwritten (NaN, the dtype's largest integer, True, or the allocator's junk
    pattern)? A bool counts for any byte but 0."""
    if x.dtype == torch.complex32:
        x = x.to(torch.complex64)
    if x.is_complex():
        return _fill_like(torch.view_as_real(x.resolve_conj())).any(dim=-1)
    if x.dtype == torch.bool:
        return x.view(torch.uint8) != 0
    size = x.element_size()
    bits = x.contiguous().view(_BITS[size]) if size in _BITS else None
    if bits is None:
        return torch.ones(x.shape, dtype=torch.bool)  # no cheap test: assume it could
    junk = _JUNK.to_bytes(4, "little")
    if size >= 4:
        words = [int.from_bytes(junk * (size // 4), "little", signed=True)]
    else:  # a 1- or 2-byte element holds the part of the pattern at its offset
        words = [int.from_bytes(junk[i:i + size], "little", signed=bits.dtype.is_signed) for i in range(0, 4, size)]
    hit = torch.zeros(x.shape, dtype=torch.bool)
    for w in words:
        hit |= bits == w
    if x.is_floating_point():
        hit |= torch.isnan(x)
    else:
        hit |= x == torch.iinfo(x.dtype).max
    return hit


def _may_coincide(first: Any, filled: Any) -> bool:
    """Whether the filled re-run's result agrees with the first run anywhere it holds a fill
    value (:func:`_fill_like`): only there can garbage of the first run agree with the fill by
    chance, and a second, zero-filled re-run is needed to tell. Elements where the two differ
    are undefined already; where they agree on any other value, the kernel wrote it."""
    la, sa = tree_flatten(first)
    lb, sb = tree_flatten(filled)
    if sa != sb or len(la) != len(lb):
        return False  # different structure: undefined() says so without another run
    for x, y in zip(la, lb, strict=True):
        if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
            continue
        if x.layout != torch.strided or y.layout != torch.strided:
            return True
        if x.dtype != y.dtype or x.shape != y.shape:
            return False
        if x.numel() and bool((_same(x.detach(), y.detach()) & _fill_like(y.detach())).any()):
            return True
    return False


def again_on_poisoned(reference: Callable[[], tuple[Any, Any, str | None]], first: Any
                      ) -> tuple[list[Any], str | None]:
    """An item's CPU reference (``reference()``: result, its sample, its error) computed again on
    fresh copies of its inputs: with every new allocation filled (NaN, the largest integer, True,
    the allocator's junk) and the inputs between guards of one value, then, only where that run
    agrees with the first on a fill value (:func:`_may_coincide`), with every allocation
    zero-filled (:func:`allocator_fill`; where PyTorch lacks the flag, the heap poisoned with
    zeros, :func:`_poison_heap`), ``out=`` tensors of zeros and the inputs between NaN guards.
    An element a kernel leaves unwritten is a fill value in the one run and zero in the other,
    whatever the heap held, so :func:`undefined` always sees it.
    ([results], None), or ([], the error of a run that raised). ``first``: the reference's first
    result."""
    results = []
    # the filled re-run reads "other" guards (12345, the smallest integer, False): a first run
    # that read past an input read the heap, or NaN guards (the schema search's guarded
    # reference), never those; the zero-filled re-run reads NaN guards
    for kind, fill in (("other", True), ("nan", False)):
        if not fill and not _may_coincide(first, results[0]):
            break  # nothing of the first run can coincide with the filled run's fill by chance
        with warnings.catch_warnings(), allocator_fill("junk" if fill else "zero") as filling, \
                guarded_inputs(kind), contextlib.nullcontext() if fill else zeroed_outs(2 * _nbytes(first)):
            warnings.simplefilter("ignore")
            if not fill and not filling:
                _poison_heap(first)
            got, raised = again(reference, fill=fill)
        if raised is not None:
            return [], raised
        result, _, error = got
        if error is not None:
            return [], error
        results.append(to_cpu(result))
    return results, None


__all__ = ["NOT_REPRODUCIBLE", "WRITES_PAST", "Undefined", "again_on_poisoned", "again", "allocator_fill", "filled_allocations", "masked", "undefined"]
