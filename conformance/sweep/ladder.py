"""The size ladder: an op's sample grown across the sizes where kernels change algorithm.

Accelerator kernels switch path with size (tiles, blocked scans, split reductions), and OpInfo's
samples hold a few dozen elements, so a kernel that is wrong only above 4,096 elements passes
every sample. The ladder takes one sample of each op x dtype that grows (:func:`seed_sample`),
grows it to element counts just below and just above powers of two (:data:`RUNGS`, 2^10 to
2^20) and runs each size as an item of variant ``ladder`` through the same execute / compare /
decide path as a sample (values only: the contracts are the samples' job). The walk climbs until
a rung fails, then bisects between the last passing rung and that one, so that the failing item
with the fewest elements names the size the op goes wrong at ("wrong from 4,097 elements").

How a sample grows (:func:`grow`): one dimension of its input, the one the op runs along (the
sample's ``dim`` argument where it names one, else the last), is lengthened until the input holds
the rung's element count (the other dimensions stay, so the count is the next multiple of their
product). Every other tensor argument of the input's shape, or broadcasting against it along that
dimension, grows with it; any other argument (a weight, an index list, a shape) stays as it is.
A rung just below a power of two is rounded down, so that it stays below.
Grown tensors get fresh random values in the range the sample's own values span (so a sample of
positive values stays positive, and an index stays in its range), from a seed of the op, dtype
and size. A grown sample the CPU refuses is not used: the next sample is tried
(:data:`SEED_SAMPLES` of them); an op none of whose samples grows gets one ``skip`` item
(``op|ladder|dtype|0``) saying so.

Each item's key is ``op|ladder|dtype|N`` (N: the element count asked for); its row's
``proof.ladder`` holds the input's actual element count and the dimension grown. A rung whose
inputs would exceed :data:`MAX_BYTES` with its output (predicted from two small CPU trials: ``diag`` of a
vector grows its output as the square) is not run. A rung recorded before (a resumed run, or a
worker restarted after it died on a later one) is not run again, and whether it failed is taken
from the run (``Skip.failed``): a resumed walk takes the steps an uninterrupted one took, and a
rung that killed a worker is a failure the walk bisects below. A rung that takes longer than :data:`RUNG_SECONDS` is the
last one climbed to, and an op whose grown sample gives one output per slice (``unbind``) has no
ladder.

Example::

    >>> import torch
    >>> from torch.testing._internal.opinfo.core import SampleInput
    >>> s = SampleInput(torch.ones(5, 5, 5), args=(1,))
    >>> g = grow(s, 4097, seed=0)
    >>> tuple(g.input.shape), g.input.numel(), g.args
    ((5, 164, 5), 4100, (1,))
    >>> grow(s, 4095, seed=0).input.numel()  # a rung below a power of two stays below it
    4075
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from conformance.check.verdict import Status
from conformance.work import Group, ItemKey

#: The powers of two around which the ladder's rungs sit: one just below and one just above each
#: up to 2^16, one just above 2^18 and 2^20 (the two largest hold four fifths of the elements a
#: ladder runs: one rung each keeps its cost near a sixth of a pair's).
POWERS = (10, 12, 14, 16, 18, 20)
PAIRED = (10, 12, 14, 16)
RUNGS = tuple(sorted([2**k + d for k in PAIRED for d in (-1, 1)] + [2**k + 1 for k in POWERS if k not in PAIRED]))
#: A rung that takes longer than this (seconds, its whole item) is the last: the next is four times
#: larger, and an op whose cost grows faster than its input (a pairwise loss) would take minutes.
#: Generous, so that a loaded machine does not end a climb that an idle one finishes (the rungs of
#: common ops take well under a second at 2^20).
RUNG_SECONDS = 5.0
#: Bytes of grown input tensors one item may hold (each side holds its copies, and the
#: arbiter a float64 one): a rung above it is not run.
MAX_BYTES = 64 * 2**20
#: Samples of an op x dtype tried, in order, for one that grows and that the CPU accepts grown.
SEED_SAMPLES = 8
VARIANT = "ladder"
#: ``--sizes``: "auto" is the samples, the signatures traced from models
#: (:mod:`conformance.sweep.traced`) where the database holds some, and on an eager target the
#: ladder (on a compiler target every rung is a compile of its own); "all" is every one.
SIZES = ("auto", "samples", "ladder", "traced", "all")


def wanted(sizes: str, compiler: bool) -> tuple[bool, bool]:
    """(run the samples, run the ladder) for ``--sizes`` on a target (compiler or eager)."""
    return sizes not in ("ladder", "traced"), sizes in ("ladder", "all") or (sizes == "auto" and not compiler)


def traced_wanted(sizes: str) -> bool:
    """Whether ``--sizes`` asks for the traced signatures (where the database holds some)."""
    return sizes in ("traced", "all", "auto")


def _axis(sample: Any, ndim: int) -> int:
    """The input dimension the op runs along: the sample's ``dim`` keyword, or its first
    positional int argument, when either names a dimension of the input; else the last."""
    cands = [sample.kwargs.get("dim")] + [a for a in sample.args if isinstance(a, int) and not isinstance(a, bool)][:1]
    for d in cands:
        if isinstance(d, int) and not isinstance(d, bool) and -ndim <= d < ndim:
            return d % ndim
    return ndim - 1


def _fresh(like: torch.Tensor, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """A tensor of ``shape`` and ``like``'s dtype, its values drawn uniformly in the range
    ``like``'s values span (a constant tensor stays that constant)."""
    dtype = like.dtype
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype.is_complex:
        real = _fresh(torch.view_as_real(like.resolve_conj())[..., 0], shape, gen)
        imag = _fresh(torch.view_as_real(like.resolve_conj())[..., 1], shape, gen)
        return torch.complex(real.double(), imag.double()).to(dtype)
    finite = like[torch.isfinite(like)] if dtype.is_floating_point else like
    if finite.numel() == 0:
        return torch.zeros(shape, dtype=dtype)
    lo, hi = finite.min().item(), finite.max().item()
    if dtype.is_floating_point:
        return (torch.rand(shape, generator=gen, dtype=torch.float64) * (hi - lo) + lo).to(dtype)
    return torch.randint(int(lo), int(hi) + 1, shape, generator=gen, dtype=torch.int64).to(dtype)


def _length(x: torch.Tensor, axis: int, numel: int) -> int:
    """How long the grown dimension is for a rung of ``numel`` elements (the others stay)."""
    rest = x.numel() // x.shape[axis]
    length = math.ceil(numel / rest)
    if any(numel < 2**k <= rest * length for k in range(numel.bit_length() + 1)):
        length = numel // rest  # a rung just below a power of two stays below it
    return length


def grow(sample: Any, numel: int, *, seed: int) -> Any | None:
    """``sample`` with its input grown along the dimension the op runs along to hold at least
    ``numel`` elements (see the module doc), or None when it cannot grow: a non-tensor or
    non-strided input, a 0-d or empty one, or one already that large."""
    from torch.testing._internal.opinfo.core import SampleInput

    x = sample.input
    if not isinstance(x, torch.Tensor) or x.layout != torch.strided or x.ndim == 0 or x.numel() == 0:
        return None
    axis = _axis(sample, x.ndim)
    length = _length(x, axis, numel)
    if length <= x.shape[axis]:
        return None
    shape = tuple(x.shape)
    gen = torch.Generator().manual_seed(seed)

    def grown(t: Any) -> Any:
        """``t`` grown with the input, if it has the input's shape or broadcasts against it along
        the axis (aligned from the right); else ``t`` unchanged."""
        if not isinstance(t, torch.Tensor) or t.layout != torch.strided or t.ndim == 0:
            return t
        lead = x.ndim - t.ndim
        if lead < 0 or t.ndim <= x.ndim - 1 - axis:
            return t
        if any(t.shape[i] not in (1, shape[i + lead]) for i in range(t.ndim)):
            return t
        if t.shape[axis - lead] != shape[axis]:
            return t  # broadcast along the axis: it stays 1
        new = list(t.shape)
        new[axis - lead] = length
        out = _fresh(t, tuple(new), gen)
        return out.requires_grad_(t.requires_grad) if out.is_floating_point() or out.is_complex() else out

    new_input = grown(x)
    args = tuple(grown(a) for a in sample.args)
    kwargs = {k: grown(v) for k, v in sample.kwargs.items()}
    return SampleInput(new_input, args=args, kwargs=kwargs)


def nbytes(sample: Any) -> int:
    tensors = [sample.input, *sample.args, *sample.kwargs.values()]
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def rung_seed(op: str, dtype: str, numel: int, seed: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}|{op}|{dtype}|{numel}".encode()).digest()[:7], "little")


@dataclass(frozen=True)
class Seed:
    """The sample an op x dtype's ladder grows, and how its output grows with it: two CPU trials
    (at the first rung and at the third) fit ``out_bytes = out0 * (numel / in0) ** power``, so
    that a rung whose output would not fit (``diag`` of 65,535 elements is a 65,535^2 matrix) is
    not run."""

    index: int
    sample: Any
    axis: int
    in0: int = 1
    out0: int = 0
    power: float = 1.0

    def out_bytes(self, numel: int) -> float:
        return self.out0 * (numel / self.in0) ** self.power


def _out_bytes(result: Any) -> tuple[int, int]:
    from torch.utils._pytree import tree_flatten

    tensors = [t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors), len(tensors)


def seed_sample(info: Any, samples: Iterator[tuple[int, Any]], op: str, dtype: str, seed: int) -> Seed | str:
    """The first of the op's samples that grows to the first rung and whose grown form the CPU
    accepts (:class:`Seed`), or why none does."""
    import warnings

    def trial(g: Any) -> tuple[int, int]:
        """The CPU's output bytes and output tensors for the grown sample ``g``."""
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            return _out_bytes(info.op(g.input, *g.args, **g.kwargs))

    why = f"none of its first {SEED_SAMPLES} samples has a strided input of rank 1 or more that grows"
    for index, sample in samples:
        if index >= SEED_SAMPLES:
            break
        g = grow(sample, RUNGS[0], seed=rung_seed(op, dtype, RUNGS[0], seed))
        if g is None:
            continue
        try:
            out0, n0 = trial(g)
        except Exception as exc:  # noqa: BLE001 - the CPU refuses the grown form: try the next sample
            why = f"the CPU refuses its samples grown (sample {index}: {type(exc).__name__}: {str(exc).strip()[:160]})"
            continue
        axis = _axis(sample, sample.input.ndim)
        power = 1.0
        g2 = grow(sample, RUNGS[2], seed=rung_seed(op, dtype, RUNGS[2], seed))
        if g2 is not None:
            try:
                out1, n1 = trial(g2)
            except Exception:  # noqa: BLE001 - the rung itself will say what the CPU does there
                out1, n1 = 0, n0
            if n1 != n0:  # one output per slice (unbind): a rung is a million tensors to compare
                why = (f"its sample {index} grown gives one output per slice ({n0:,} tensors at "
                       f"{g.input.numel():,} elements, {n1:,} at {g2.input.numel():,})")
                continue
            if out0 and out1 > 0 and g2.input.numel() > g.input.numel():
                power = max(1.0, math.log(out1 / out0) / math.log(g2.input.numel() / g.input.numel()))
        return Seed(index, sample, axis, g.input.numel(), out0, power)
    return why


def rung_sample(info: Any, op: str, dtype: str, numel: int, seed: int) -> Any:
    """The grown sample of item ``op|ladder|dtype|numel`` as the sweep ran it (for a repro);
    ValueError when this torch's samples no longer grow to it."""
    from conformance.inputs.opinfo import samples

    found = seed_sample(info, enumerate(samples(info, getattr(torch, dtype), seed=seed)), op, dtype, seed)
    grown = None if isinstance(found, str) else grow(found.sample, numel, seed=rung_seed(op, dtype, numel, seed))
    if grown is None:
        why = found if isinstance(found, str) else "it no longer grows to that size"
        raise ValueError(f"no grown sample of {op} {dtype} with {numel:,} elements ({why})")
    return grown


def walk(info: Any, group: Group, samples: Iterator[tuple[int, Any]], seed: int,
         evaluate: Callable[[int, Any], dict[str, Any]], skip: Container[str],
         on_start: Callable[[str], None] | None) -> Iterator[dict[str, Any]]:
    """The ladder's rows for one op x dtype. ``evaluate(numel, grown_sample)``: the item's row,
    decided as a function-variant sample (renamed here to the ladder's key)."""
    found = seed_sample(info, samples, group.op, group.dtype, seed)
    if isinstance(found, str):
        key = str(group.item(VARIANT, 0))
        if key not in skip:
            yield {"item_key": key, "op": group.op, "variant": VARIANT, "dtype": group.dtype, "sample": 0,
                   "status": "skip", "error": f"no size ladder: {found}", "duration_s": 0.0, "seed": seed}
        return
    sample, axis = found.sample, found.axis
    rest = sample.input.numel() // sample.input.shape[axis]  # elements per unit of the grown dimension
    failed_before = getattr(skip, "failed", frozenset())
    sizes: set[int] = set()  # element counts run: two rungs that grow to one count run once
    slow = [False]  # a rung took longer than RUNG_SECONDS: the climb ends

    def rung(numel: int) -> tuple[str, int, dict[str, Any] | None] | None:
        """Run the rung of ``numel`` elements and say how it went: ("failed" | "passed" |
        "neutral", its element count, its row), or None where it is not run (too large, a count
        already run). A rung recorded before (a resumed run, or a worker restarted
        after a later item) is not run again: whether it failed is what the run recorded
        (``Skip.failed``), so that a resumed walk takes the steps an uninterrupted one took."""
        key = str(ItemKey(group.op, VARIANT, group.dtype, numel))
        actual = rest * _length(sample.input, axis, numel)
        if actual <= sample.input.numel() or actual in sizes:
            return None
        if key in skip:
            sizes.add(actual)
            return ("failed" if key in failed_before else "passed"), actual, None
        g = grow(sample, numel, seed=rung_seed(group.op, group.dtype, numel, seed))
        if g is None or nbytes(g) + found.out_bytes(g.input.numel()) > MAX_BYTES:
            return None
        sizes.add(actual)
        if on_start:
            on_start(key)
        t0 = time.perf_counter()
        row = evaluate(numel, g)
        took = time.perf_counter() - t0
        row.update(item_key=key, variant=VARIANT, sample=numel)
        row["proof"] = {**(row.get("proof") or {}), "ladder": {
            "numel": g.input.numel(), "dim": axis, "from_sample": found.index}}
        if took > RUNG_SECONDS:
            row["proof"]["ladder"]["last"] = f"this size took {took:.1f} s: larger ones are not run"
            slow[0] = True
        status = Status(row["status"])
        return ("failed" if status.failed else "passed" if status.passed else "neutral"), actual, row

    passed = 0  # the element count of the largest rung that passed
    for numel in RUNGS:
        got = rung(numel)
        if got is None:
            continue
        how, actual, row = got
        if row is not None:
            yield row
        if how == "passed":
            passed = actual
        if how != "failed":  # passed, or neutral (skipped, unsupported): climb on
            if slow[0]:
                return
            continue
        # failed: bisect the grown dimension's length between the last passing rung and this one,
        # so that the failing item with the fewest elements is the size the op goes wrong at
        lo, hi = passed // rest, actual // rest
        while passed and hi - lo > 1:
            mid = (lo + hi) // 2
            probe = rung(mid * rest)
            if probe is None:
                break
            if probe[2] is not None:
                yield probe[2]
            if probe[0] == "failed":
                hi = mid
            else:
                lo = mid
        return

__all__ = ["MAX_BYTES", "PAIRED", "POWERS", "RUNG_SECONDS", "RUNGS", "SEED_SAMPLES", "SIZES", "VARIANT", "Seed", "grow", "rung_sample", "seed_sample",
           "walk", "wanted"]
