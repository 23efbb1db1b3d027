"""Semantic comparators: tie-tolerant indices, sign-free decompositions, distributions, and
shape-only checks. Which OpInfo gets which comes from ``data/comparators.toml`` and from the
registry's ``nondeterministic_seeded`` tag.

Example::

    >>> import torch
    >>> from conformance.check.comparators import comparator_for, per_tensor_fn
    >>> comparator_for("sort")
    'indices'
    >>> x = torch.tensor([1.0, 1.0, 0.0])
    >>> ev = per_tensor_fn("indices", x)(1, torch.tensor([1, 0, 2]), torch.tensor([0, 1, 2]))
    >>> ev.close
    True
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable
from functools import cache

import numpy as np
import torch

from conformance import datafiles

from .compare import Evidence

PerTensor = Callable[[int, torch.Tensor, torch.Tensor], Evidence | None]


def _table() -> dict[str, tuple[str, ...]]:
    return {kind: rule.ops for kind, rule in datafiles.comparators().items()}


@cache
def _random_opinfos() -> frozenset[str]:
    """OpInfos whose first sample reaches a random (nondeterministic_seeded) overload."""
    from conformance.catalog import overloads as catalog

    rnd = {o.name for o in catalog.overloads() if "random" in o.classes}
    return frozenset(name for name, hits in catalog.opinfo_map().items() if rnd & set(hits))


@cache
def comparator_for(op: str) -> str:
    if op.startswith("aten::"):  # a bare overload (schema-driven inputs): ask the registry
        return _overload_comparator(op)
    for name in ("meta", "random", "indices", "decomposition"):
        if any(fnmatch.fnmatchcase(op, g) for g in _table()[name]):
            return name
    if op in _random_opinfos():
        return "random"
    return "allclose"


def _overload_comparator(name: str) -> str:
    from conformance.catalog import overloads as catalog

    o = next((x for x in catalog.overloads() if x.name == name), None)
    if o is not None and o.has("random"):
        return "random"
    base = name.split("::", 1)[1].split(".", 1)[0]
    # uninitialised results: the empty factories, resizes, and _make_dep_token (an effect token,
    # torch.empty(()) by its meta kernel)
    if base.startswith(("empty", "new_empty", "_empty")) or base in ("resize_", "resize_as_", "_make_dep_token"):
        return "meta"
    return "allclose"


def per_tensor_fn(kind: str, sample_input: object | None = None) -> PerTensor | None:
    if kind == "allclose":
        return None
    if kind == "meta":
        return lambda i, t, c: Evidence(True, comparator="meta", detail="")
    if kind == "random":
        return _random
    if kind == "decomposition":
        return _by_magnitude
    if kind == "indices":
        inp = sample_input if isinstance(sample_input, torch.Tensor) else None
        return lambda i, t, c: _indices(inp, t, c)
    raise ValueError(f"unknown comparator {kind!r}")


def _indices(inp: torch.Tensor | None, t: torch.Tensor, c: torch.Tensor) -> Evidence | None:
    if t.is_floating_point() or t.is_complex() or torch.equal(t, c):
        return None  # values (not indices) use the default comparison
    if inp is None or t.dtype not in (torch.int64, torch.int32):
        return None
    x = inp.detach().cpu()
    if _same_selection(x, t, c):
        return Evidence(True, detail="indices differ only on ties")
    return None


def _gather(x: torch.Tensor, idx: torch.Tensor, dim: int) -> torch.Tensor | None:
    try:
        if idx.dim() == x.dim() - 1:
            idx = idx.unsqueeze(dim)
        if idx.dim() != x.dim() or idx.numel() == 0:
            return None
        if any(a != b for i, (a, b) in enumerate(zip(idx.shape, x.shape, strict=True)) if i != dim):
            return None
        if int(idx.min()) < 0 or int(idx.max()) >= x.shape[dim]:
            return None
        return torch.take_along_dim(x, idx.long(), dim)
    except (RuntimeError, IndexError):
        return None


def _same_selection(x: torch.Tensor, t: torch.Tensor, c: torch.Tensor) -> bool:
    candidates = []
    if x.dim() == 0 or t.dim() == 0:
        flat = x.reshape(-1)
        try:
            candidates.append((flat[t.long().reshape(-1)], flat[c.long().reshape(-1)]))
        except (IndexError, RuntimeError):
            pass
    for d in range(x.dim()):
        a, b = _gather(x, t, d), _gather(x, c, d)
        if a is not None and b is not None:
            candidates.append((a, b))
    return any(torch.equal(a, b) or (a.is_floating_point() and torch.allclose(a, b, equal_nan=True))
               for a, b in candidates)


def _by_magnitude(i: int, t: torch.Tensor, c: torch.Tensor) -> Evidence | None:
    if t.dim() < 2 or not (t.is_floating_point() or t.is_complex()):
        return None
    from .compare import tensor_evidence

    rtol, atol = (1e-3, 1e-4) if t.dtype in (torch.float32, torch.complex64) else (1e-2, 1e-2)
    if t.dtype in (torch.float64, torch.complex128):
        rtol, atol = 1e-7, 1e-7
    ev = tensor_evidence(t.abs(), c.abs(), atol, rtol)
    return Evidence(ev.close, max_abs_err=ev.max_abs_err, max_rel_err=ev.max_rel_err, ulp_err=ev.ulp_err,
                    mismatch_frac=ev.mismatch_frac, nan_agree=ev.nan_agree, comparator="decomposition",
                    detail=ev.detail and f"magnitudes differ: {ev.detail}")


def _random(i: int, t: torch.Tensor, c: torch.Tensor) -> Evidence:
    if t.numel() < 64 or not t.is_floating_point():
        return Evidence(True, comparator="random", detail="")
    a, b = _sortable(t), _sortable(c)
    if np.isfinite(a).all() != np.isfinite(b).all():
        return Evidence(False, comparator="random", detail="non-finite values on one side only")
    stat = ks_statistic(a, b)
    n = a.size * b.size / (a.size + b.size)
    critical = 1.95 * math.sqrt(1 / n)  # alpha = 0.001
    ok = stat <= critical
    return Evidence(ok, comparator="random", max_abs_err=stat,
                    detail="" if ok else f"KS statistic {stat:.3f} > {critical:.3f}: distributions differ")


def _sortable(x: torch.Tensor | np.ndarray) -> np.ndarray:
    """``x`` flattened as a numpy array that orders and ties exactly as its values do: float64
    stays, every narrower float is widened to float32 (exact), so nothing is sorted in a wider
    type than it needs (numpy's vectorised sort of a million float32 takes milliseconds, torch's
    of the same values as float64 a tenth of a second)."""
    if isinstance(x, np.ndarray):
        return x.reshape(-1)
    x = x.detach().cpu().reshape(-1)
    return (x if x.dtype == torch.float64 else x.to(torch.float32)).numpy()


def ks_statistic(a: torch.Tensor | np.ndarray, b: torch.Tensor | np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov statistic: the largest distance between the two empirical
    CDFs, evaluated at every value of either sample."""
    a, b = np.sort(_sortable(a)), np.sort(_sortable(b))
    both = np.concatenate([a, b])
    cdf_a = np.searchsorted(a, both, side="right") / a.size
    cdf_b = np.searchsorted(b, both, side="right") / b.size
    return float(np.abs(cdf_a - cdf_b).max())
