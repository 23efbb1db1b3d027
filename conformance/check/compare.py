"""Compare: numeric evidence between a target's result and the CPU reference.

The evidence (max abs/rel error, ULP distance, mismatch fraction, NaN/Inf agreement,
dtype/shape/stride of the device tensor) is computed here; the status is decided in
:mod:`conformance.check.verdict`. Closeness follows ``torch.testing.assert_close`` semantics
(``|t - c| <= atol + rtol * |c|``, NaNs equal), plus the float64 arbiter rule: a result
outside tolerance still passes when its error against the float64 result is no worse than
``ARBITER_FACTOR`` times the CPU's own error (a device is not punished for being more accurate
than the CPU).

Example::

    >>> import torch
    >>> from conformance.check.compare import compare
    >>> ev = compare(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0001]), atol=1e-5, rtol=1e-6)
    >>> ev.close, round(ev.max_abs_err, 4)
    (False, 0.0001)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

ARBITER_FACTOR = 2.0
_MANTISSA = {torch.float64: 52, torch.float32: 23, torch.bfloat16: 7, torch.float16: 10}


def layout_name(t: torch.Tensor) -> str:
    """``strided``, ``sparse_coo``, ``sparse_csr``, ``sparse_csc``, ``sparse_bsr``, ``sparse_bsc``, ..."""
    return str(t.layout).removeprefix("torch.")


@dataclass(frozen=True)
class Meta:
    """dtype/shape/stride/storage offset/layout of a tensor as it sits on the device."""

    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int = 0
    layout: str = "strided"

    @classmethod
    def of(cls, t: torch.Tensor) -> Meta:
        strided = t.layout == torch.strided
        return cls(str(t.dtype).removeprefix("torch."), tuple(t.shape), tuple(t.stride()) if strided else (),
                   t.storage_offset() if strided else 0, layout_name(t))

    def layout_differs(self, other: Meta) -> str:
        """How this tensor's memory layout differs from ``other``'s ("" when it does not): the
        layout (strided, sparse_coo, sparse_csr, ...), strides of the dimensions longer than 1,
        and the storage offset; none of them for a tensor of no element, which reads no memory."""
        if self.layout != other.layout:
            return f"layout {self.layout} vs {other.layout}"
        if self.shape != other.shape or not self.stride or not other.stride or 0 in self.shape:
            return ""
        parts = []
        if not strides_agree(self, other):
            parts.append(f"strides {list(self.stride)} vs {list(other.stride)}")
        if self.offset != other.offset:
            parts.append(f"storage offset {self.offset} vs {other.offset}")
        return ", ".join(parts)


@dataclass(frozen=True)
class Evidence:
    close: bool
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    ulp_err: float = 0.0
    mismatch_frac: float = 0.0
    nan_agree: bool = True
    dtype_ok: bool = True
    shape_ok: bool = True
    stride_ok: bool = True
    arbiter_err: float | None = None
    cpu_arbiter_err: float | None = None
    comparator: str = "allclose"
    detail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    # a sparse result's structure (layout, sparse/dense dims, block size, index dtypes, the set
    # of specified elements) agrees with the CPU's; False is never forgiven by the arbiter
    structure_ok: bool = True
    # the element that failed worst: {"output": i, "index": [...], "target": x, "cpu": y} and,
    # once arbitrated, "arbiter" (the float64 reference's value there); None when nothing failed
    worst: dict[str, Any] | None = None
    # the largest share of its tolerance any finite element's error takes, |t - c| / (atol +
    # rtol * |c|): 0 when bitwise equal, above 1 where an element fails (the lazy float64 arbiter
    # runs past conformance.sweep.opinfo.ARBITER_MARGIN of it)
    tol_used: float = 0.0

    def row(self) -> dict[str, Any]:
        return {"max_abs_err": _finite(self.max_abs_err), "max_rel_err": _finite(self.max_rel_err),
                "ulp_err": _finite(self.ulp_err), "mismatch_frac": self.mismatch_frac,
                "nan_agree": int(self.nan_agree), "dtype_ok": int(self.dtype_ok),
                "shape_ok": int(self.shape_ok), "stride_ok": int(self.stride_ok),
                "arbiter_err": _finite(self.arbiter_err), "cpu_arbiter_err": _finite(self.cpu_arbiter_err),
                "comparator": self.comparator, "worst": self.worst}


def _finite(x: float | None) -> float | None:
    if x is None:
        return None
    return x if math.isfinite(x) else (1e308 if x > 0 else None)


_EXACT = Evidence(True)


def leaves(value: Any) -> list[Any]:
    """The leaves of ``value`` in pytree order (tuples, lists and dicts walked here directly:
    ``tree_flatten`` is the single largest cost of an item otherwise)."""
    if isinstance(value, torch.Tensor):
        return [value]
    out: list[Any] = []
    _walk(value, out)
    return out


def _walk(value: Any, out: list[Any]) -> None:
    if type(value) in (tuple, list) or (isinstance(value, tuple) and hasattr(value, "n_fields")):
        for v in value:  # plain sequences, and torch.return_types (structseq) as tree_flatten walks them
            _walk(v, out)
    elif type(value) is dict:
        for v in value.values():  # insertion order, as tree_flatten
            _walk(v, out)
    elif isinstance(value, (torch.Tensor, int, float, complex, bool, str, type(None))):
        out.append(value)
    else:
        out.extend(tree_flatten(value)[0])


def ulp(ref: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of ``dtype`` at each value of ``ref`` (float64)."""
    finfo = torch.finfo(dtype)
    mant = _MANTISSA.get(dtype, 23)
    mag = ref.abs().clamp_min(finfo.tiny)
    return torch.exp2(torch.floor(torch.log2(mag)) - mant)


def _value(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)  # JSON has no nan/inf


def _worst(score: torch.Tensor, t: torch.Tensor, c: torch.Tensor) -> dict[str, Any]:
    """Where ``score`` peaks (the failing element that failed worst) and both sides' values there."""
    flat = int(score.flatten().argmax())
    index = [int(i) for i in torch.unravel_index(torch.tensor(flat), score.shape)] if score.dim() else []
    return {"index": index, "target": _value(float(t.flatten()[flat])), "cpu": _value(float(c.flatten()[flat]))}


def tensor_evidence(t: torch.Tensor, c: torch.Tensor, atol: float, rtol: float) -> Evidence:
    """How close ``t`` (the target's) is to ``c`` (the CPU's): each element within ``atol + rtol *
    |c|``, NaNs and infinities where the CPU has them. A complex element is one value, as
    ``torch.isclose`` and ``torch.testing.assert_close`` take it (``|t - c|``, the modulus of the
    difference); the errors shown are measured on its real and imaginary parts."""
    if t.layout != torch.strided or c.layout != torch.strided:  # sparse results: their values, densely
        t, c = t.to_dense() if t.layout != torch.strided else t, c.to_dense() if c.layout != torch.strided else c
    if t.dtype == torch.complex32 or c.dtype == torch.complex32:  # the CPU has few ComplexHalf kernels (no equal)
        t, c = t.to(torch.complex64) if t.dtype == torch.complex32 else t, c.to(torch.complex64) if c.dtype == torch.complex32 else c
    if t.dtype == c.dtype and t.shape == c.shape and torch.equal(t, c):
        if not (t.is_floating_point() or t.is_complex()) or not torch.isnan(t).any():
            return _EXACT  # bitwise equal: nothing to measure (the common case)
    complex_bad = None  # complex elements outside tolerance, by the modulus of the difference
    if t.is_complex() and c.is_complex() and t.shape == c.shape:
        complex_bad = ~torch.isclose(t.resolve_conj().to(torch.complex128), c.resolve_conj().to(torch.complex128),
                                     rtol=rtol, atol=atol, equal_nan=True)
    if t.is_complex() or c.is_complex():
        t, c = torch.view_as_real(t.resolve_conj()), torch.view_as_real(c.resolve_conj())
    if not (t.is_floating_point() or c.is_floating_point()):
        if t.numel() == 0:
            return Evidence(True)
        eq = t == c
        n_bad = int((~eq).sum())
        if n_bad == 0:
            return Evidence(True)
        diff = (t.double() - c.double()).abs()
        return Evidence(False, max_abs_err=float(diff.max()), max_rel_err=float((diff / c.double().abs().clamp_min(1)).max()),
                        mismatch_frac=n_bad / t.numel(), detail=f"{n_bad} of {t.numel()} values differ",
                        worst=_worst(diff, t.double(), c.double()))
    if t.numel() == 0:
        return Evidence(True)
    dtype = c.dtype if c.is_floating_point() else t.dtype
    t64, c64 = t.double(), c.double()
    tn, cn = torch.isnan(t64), torch.isnan(c64)
    nan_agree = bool(torch.equal(tn, cn))
    both_inf = torch.isinf(t64) | torch.isinf(c64)
    inf_bad = both_inf & (t64 != c64) & ~(tn | cn)
    finite = ~(tn | cn | both_inf)
    diff = torch.where(finite, (t64 - c64).abs(), torch.zeros((), dtype=torch.float64))
    allowed = atol + rtol * c64.abs()
    bad = (finite & (diff > allowed)) | inf_bad | (tn != cn)
    if complex_bad is not None:  # the verdict per complex element (both its parts); errors stay per part
        bad = complex_bad.unsqueeze(-1).expand(bad.shape)
    n_bad = int(bad.sum())
    max_abs = float(diff.max())
    used = float((diff / allowed.clamp_min(torch.finfo(torch.float64).tiny)).max()) if max_abs > 0 else 0.0
    rel = diff / c64.abs().clamp_min(torch.finfo(dtype).tiny)
    max_rel = float(torch.where(finite, rel, torch.zeros((), dtype=torch.float64)).max())
    ulps = float((diff / ulp(c64, dtype)).max()) if max_abs > 0 else 0.0
    if inf_bad.any():
        max_abs = max_rel = ulps = math.inf
    if complex_bad is None:
        detail = "" if n_bad == 0 else f"{n_bad} of {t.numel()} values outside atol={atol:g} rtol={rtol:g}"
    else:
        detail = "" if n_bad == 0 else (f"{n_bad // 2} of {t.numel() // 2} complex values outside atol={atol:g} "
                                        f"rtol={rtol:g} (|target - cpu| > atol + rtol*|cpu|)")
    if not nan_agree:
        detail += f"; NaN pattern differs ({int(tn.sum())} NaN on target, {int(cn.sum())} on CPU)"
    worst = None
    if n_bad:  # a NaN or inf where the other side has none outranks any finite excess
        excess = torch.where(bad, (diff - allowed).clamp_min(0), torch.full((), -1.0, dtype=torch.float64))
        worst = _worst(torch.where(inf_bad | (tn != cn), torch.full((), math.inf, dtype=torch.float64), excess), t64, c64)
    return Evidence(n_bad == 0, max_abs_err=max_abs, max_rel_err=max_rel, ulp_err=ulps,
                    mismatch_frac=n_bad / t.numel(), nan_agree=nan_agree, detail=detail.strip("; "), worst=worst,
                    tol_used=used)


# -- sparse results ---------------------------------------------------------------------------------
# Two sparse results are the same when they have the same layout, the same structure (sparse and
# dense dimensions; block size for BSR/BSC; index dtypes), the same set of specified elements
# (COO after coalescing, so duplicates and index order do not count; compressed layouts by
# their compressed and plain indices, order within a row or column not counting) and dense values
# within tolerance (``tensor_evidence`` of ``to_dense()``, so the worst element is a dense index).
# A layout difference fails whatever the values (it names both layouts); a different pattern
# with equal dense values fails as a pattern difference and says the dense values are equal
# (``torch.testing.assert_close`` too compares coalesced indices exactly): a user of the result
# sees its ``indices()``/``_nnz()``, and an explicit zero is a specified element.
_COMPRESSED = {torch.sparse_csr: ("crow_indices", "col_indices"), torch.sparse_csc: ("ccol_indices", "row_indices"),
               torch.sparse_bsr: ("crow_indices", "col_indices"), torch.sparse_bsc: ("ccol_indices", "row_indices")}


def is_sparse(t: torch.Tensor) -> bool:
    return t.layout == torch.sparse_coo or t.layout in _COMPRESSED


def _index_arrays(x: torch.Tensor) -> dict[str, torch.Tensor]:
    if x.layout == torch.sparse_coo:
        return {"indices": x._indices()}
    a, b = _COMPRESSED[x.layout]
    return {a: getattr(x, a)(), b: getattr(x, b)()}


def _blocksize(x: torch.Tensor) -> tuple[int, ...]:
    if x.layout not in (torch.sparse_bsr, torch.sparse_bsc):
        return ()
    batch = x.dim() - x.sparse_dim() - x.dense_dim()
    return tuple(x.values().shape[batch + 1:batch + 3])


def pattern(x: torch.Tensor) -> torch.Tensor:
    """The specified elements of a sparse tensor (explicit zeros included) as a dense bool mask
    of its shape."""
    ones = torch.ones(x._values().shape if x.layout == torch.sparse_coo else x.values().shape, dtype=torch.int8)
    if x.layout == torch.sparse_coo:
        mask = torch.sparse_coo_tensor(x._indices(), ones, x.shape, check_invariants=False)
    else:
        a, b = _index_arrays(x).values()
        mask = torch.sparse_compressed_tensor(a, b, ones, x.shape, layout=x.layout, check_invariants=False)
    return mask.to_dense() != 0


def structure_differs(t: torch.Tensor, c: torch.Tensor) -> str:
    """How sparse ``t``'s structure differs from sparse ``c``'s of the same layout ("" when it
    does not): sparse/dense dims, block size, index dtypes, then the set of specified elements.

        >>> import torch
        >>> a = torch.sparse_coo_tensor([[0, 1]], [1.0, 0.0], (3,))
        >>> structure_differs(a, torch.sparse_coo_tensor([[0]], [1.0], (3,)))
        'sparsity pattern differs: 2 specified elements on target vs 1 on CPU (1 only on target, 0 only on CPU)'
    """
    if t.layout == torch.sparse_coo:
        t, c = t.coalesce(), c.coalesce()
    dims_t, dims_c = (t.sparse_dim(), t.dense_dim()), (c.sparse_dim(), c.dense_dim())
    if dims_t != dims_c:
        return f"sparse/dense dims {dims_t} on target vs {dims_c} on CPU"
    if _blocksize(t) != _blocksize(c):
        return f"block size {_blocksize(t)} on target vs {_blocksize(c)} on CPU"
    for (name, it), ic in zip(_index_arrays(t).items(), _index_arrays(c).values(), strict=True):
        if it.dtype != ic.dtype:
            return f"{name} dtype {str(it.dtype).removeprefix('torch.')} on target vs " \
                   f"{str(ic.dtype).removeprefix('torch.')} on CPU"
    same = all(a.shape == b.shape and torch.equal(a, b)
               for a, b in zip(_index_arrays(t).values(), _index_arrays(c).values(), strict=True))
    if same:
        return ""
    mt, mc = pattern(t), pattern(c)
    if torch.equal(mt, mc):
        return ""  # the same elements, listed in another order within a row/column
    return (f"sparsity pattern differs: {int(mt.sum())} specified elements on target vs {int(mc.sum())} on CPU "
            f"({int((mt & ~mc).sum())} only on target, {int((mc & ~mt).sum())} only on CPU)")


def _dense(x: Any) -> Any:
    return x.to_dense() if isinstance(x, torch.Tensor) and is_sparse(x) else x


def sparse_evidence(t: torch.Tensor, c: torch.Tensor, atol: float, rtol: float, *, target_layout: str | None = None,
                    per_tensor: Callable[[torch.Tensor, torch.Tensor], Evidence | None] | None = None) -> Evidence:
    """Evidence for a pair of which at least one is sparse (see the rule above). ``target_layout``:
    the layout the target's result had on the device (default: ``t``'s)."""
    ev = per_tensor(_dense(t), _dense(c)) if per_tensor else None
    if ev is None:
        ev = tensor_evidence(_dense(t), _dense(c), atol, rtol)
    values = "dense values equal" if ev.close and not ev.detail else f"dense values: {ev.detail or 'within tolerance'}"
    lt, lc = target_layout or layout_name(t), layout_name(c)
    if lt != lc or t.layout != c.layout:
        why = f"layout {lt} on target vs {lc} on CPU"
    else:
        why = structure_differs(t, c)
    if not why:
        return ev
    return replace(ev, close=False, stride_ok=False, structure_ok=False, detail=f"{why}; {values}")


def _merge(parts: Sequence[Evidence], comparator: str) -> Evidence:
    if not parts:
        return Evidence(True, comparator=comparator)
    failing = [(i, p) for i, p in enumerate(parts) if p.worst is not None]
    worst = None
    if failing:  # the output whose worst element is farthest off
        i, p = max(failing, key=lambda ip: (ip[1].max_abs_err, -ip[0]))
        worst = {"output": i, **(p.worst or {})}
    return Evidence(
        worst=worst,
        close=all(p.close for p in parts),
        max_abs_err=max(p.max_abs_err for p in parts), max_rel_err=max(p.max_rel_err for p in parts),
        ulp_err=max(p.ulp_err for p in parts), mismatch_frac=max(p.mismatch_frac for p in parts),
        tol_used=max(p.tol_used for p in parts), nan_agree=all(p.nan_agree for p in parts), dtype_ok=all(p.dtype_ok for p in parts),
        shape_ok=all(p.shape_ok for p in parts), stride_ok=all(p.stride_ok for p in parts),
        structure_ok=all(p.structure_ok for p in parts), comparator=comparator, detail="; ".join(f"output {i}: {p.detail}" for i, p in enumerate(parts) if p.detail))


def strides_agree(a: Meta, b: Meta) -> bool:
    """Same shape, and the same stride in every dimension longer than 1; a tensor of no element
    has no meaningful stride (as torch._prims_common.check_significant_strides: Inductor returns
    (0, 0, 0) where eager returns (64, 16, 1) for an empty [0, 4, 16] result)."""
    if a.shape != b.shape or not a.stride or not b.stride or 0 in a.shape:
        return a.shape == b.shape
    return all(sa == sb for sa, sb, n in zip(a.stride, b.stride, a.shape, strict=True) if n > 1)


def _scalar_evidence(t: Any, c: Any, atol: float, rtol: float) -> Evidence:
    if isinstance(c, float) or isinstance(t, float):
        if isinstance(t, (int, float)) and isinstance(c, (int, float)):
            if math.isnan(c) and math.isnan(t):
                return Evidence(True)
            d = abs(t - c)
            ok = d <= atol + rtol * abs(c)
            return Evidence(ok, max_abs_err=d, max_rel_err=d / max(abs(c), 1e-300),
                            detail="" if ok else f"scalar {t!r} != {c!r}")
    ok = t == c
    return Evidence(bool(ok), detail="" if ok else f"value {t!r} != {c!r}")


def compare(cpu: Any, target: Any, *, atol: float, rtol: float, device_meta: Sequence[Meta] | None = None,
            per_tensor: Callable[[int, torch.Tensor, torch.Tensor], Evidence | None] | None = None,
            comparator: str = "allclose") -> Evidence:
    """Evidence for ``target`` (already copied to the CPU) against ``cpu``.

    ``device_meta`` holds the dtype/shape/stride of the target's tensors as they were on the
    device; ``per_tensor`` lets a semantic comparator decide a tensor pair (None = default).
    """
    c_leaves, t_leaves = leaves(cpu), leaves(target)
    if len(c_leaves) != len(t_leaves):
        return Evidence(False, shape_ok=False, comparator=comparator,
                        detail=f"target returned {len(t_leaves)} values, CPU {len(c_leaves)}")
    parts: list[Evidence] = []
    tensor_i = 0
    for i, (c, t) in enumerate(zip(c_leaves, t_leaves, strict=True)):
        if isinstance(c, torch.Tensor) != isinstance(t, torch.Tensor):
            parts.append(Evidence(False, dtype_ok=False, detail=f"output {i}: {type(t).__name__} vs {type(c).__name__}"))
            continue
        if not isinstance(c, torch.Tensor):
            parts.append(_scalar_evidence(t, c, atol, rtol))
            continue
        cm = Meta.of(c)
        dm = device_meta[tensor_i] if device_meta and tensor_i < len(device_meta) else Meta.of(t)
        tensor_i += 1
        dtype_ok, shape_ok = dm.dtype == cm.dtype, dm.shape == cm.shape
        stride_ok = strides_agree(dm, cm)
        if not shape_ok or t.shape != c.shape:
            parts.append(Evidence(False, dtype_ok=dtype_ok, shape_ok=False, stride_ok=stride_ok,
                                  detail=f"shape {list(dm.shape)} on target vs {list(cm.shape)} on CPU"))
            continue
        if is_sparse(t) or is_sparse(c) or dm.layout != cm.layout:
            ev = sparse_evidence(t, c, atol, rtol, target_layout=dm.layout,
                                 per_tensor=(lambda x, y, i=i: per_tensor(i, x, y)) if per_tensor else None)
            close = ev.close and dtype_ok
            detail = ev.detail if dtype_ok else f"dtype {dm.dtype} on target vs {cm.dtype} on CPU; {ev.detail}".strip("; ")
            parts.append(replace(ev, close=close, dtype_ok=dtype_ok, shape_ok=shape_ok,
                                 stride_ok=ev.structure_ok, detail=detail))
            continue
        ev = per_tensor(i, t, c) if per_tensor else None
        if ev is None:
            ev = tensor_evidence(t, c, atol, rtol)
        close = ev.close and dtype_ok
        detail = ev.detail if dtype_ok else f"dtype {dm.dtype} on target vs {cm.dtype} on CPU; {ev.detail}".strip("; ")
        parts.append(replace(ev, close=close, dtype_ok=dtype_ok, shape_ok=shape_ok, stride_ok=stride_ok, detail=detail))
    return _merge(parts, comparator)


def arbitrate(ev: Evidence, cpu: Any, target: Any, arbiter: Any, *, atol: float) -> Evidence:
    """Apply the float64 arbiter rule to evidence that failed plain closeness."""
    if not ev.structure_ok:
        return ev  # a sparse result of another layout or pattern: no accuracy excuses it
    c_l, t_l, a_l = ([_dense(x) for x in leaves(v)] for v in (cpu, target, arbiter))
    if not (len(c_l) == len(t_l) == len(a_l)) or not ev.dtype_ok or not ev.shape_ok:
        return ev
    t_err = c_err = 0.0
    for c, t, a in zip(c_l, t_l, a_l, strict=True):
        if not isinstance(c, torch.Tensor) or not isinstance(a, torch.Tensor):
            continue
        if not (c.is_floating_point() or c.is_complex()) or a.shape != c.shape:
            if isinstance(c, torch.Tensor) and not torch.equal(c, t):
                return ev  # non-float outputs must match exactly
            continue
        a64 = a.to(torch.complex128 if a.is_complex() else torch.float64)
        t64 = t.to(a64.dtype)
        c64 = c.to(a64.dtype)
        an = torch.isnan(a64) if not a64.is_complex() else torch.isnan(a64.real)
        tn = torch.isnan(t64) if not t64.is_complex() else torch.isnan(t64.real)
        cn = torch.isnan(c64) if not c64.is_complex() else torch.isnan(c64.real)
        if not torch.equal(tn, an) and not torch.equal(tn, cn):
            return ev
        mask = ~(an | tn | cn)
        if mask.any():
            te = (t64 - a64).abs()[mask]
            ce = (c64 - a64).abs()[mask]
            if torch.isinf(te).any() and not torch.isinf(ce).any():
                return ev
            t_err = max(t_err, float(torch.nan_to_num(te, posinf=0.0).max()))
            c_err = max(c_err, float(torch.nan_to_num(ce, posinf=0.0).max()))
    ok = t_err <= ARBITER_FACTOR * c_err + atol
    worst = ev.worst
    if worst is not None and worst.get("output", 0) < len(a_l) and isinstance(a_l[worst.get("output", 0)], torch.Tensor):
        a = a_l[worst.get("output", 0)]
        a = torch.view_as_real(a.resolve_conj()) if a.is_complex() else a
        try:
            worst = {**worst, "arbiter": _value(float(a.double()[tuple(worst["index"])]))}
        except (IndexError, RuntimeError):
            pass  # the arbiter's output has another shape: no value to show
    detail = (f"{ev.detail}; float64 arbiter: target error {t_err:.3g} vs CPU error {c_err:.3g} "
              f"({'within' if ok else 'beyond'} {ARBITER_FACTOR:g}x)")
    return replace(ev, close=ok, arbiter_err=t_err, cpu_arbiter_err=c_err, detail=detail, worst=worst)


#: The target's error is explained by single precision when it is at most this many times the
#: error of the CPU computing the same double-precision sample in single precision.
TWIN_FACTOR = 4.0


def twin_errors(cpu: Any, target: Any, twin: Any) -> tuple[float, float] | None:
    """(the target's, the single-precision twin's) worst normwise error ``||x - c|| / ||c||``
    against the CPU's double-precision result over the floating outputs; None when the twin has
    another structure or no floating output is comparable."""
    c_l, t_l, w_l = leaves(cpu), leaves(target), leaves(twin)
    if not (len(c_l) == len(t_l) == len(w_l)):
        return None
    t_err = w_err = -1.0
    for c, t, w in zip(c_l, t_l, w_l, strict=True):
        if not (isinstance(c, torch.Tensor) and isinstance(t, torch.Tensor) and isinstance(w, torch.Tensor)):
            continue
        if not (c.is_floating_point() or c.is_complex()) or not (c.shape == t.shape == w.shape) or c.is_sparse:
            continue
        c64 = c.to(torch.complex128 if c.is_complex() else torch.float64)
        finite = torch.isfinite(c64) & torch.isfinite(t.to(c64.dtype)) & torch.isfinite(w.to(c64.dtype))
        if not finite.any():
            continue
        norm = float(torch.linalg.vector_norm(c64[finite])) or 1.0
        t_err = max(t_err, float(torch.linalg.vector_norm(t.to(c64.dtype)[finite] - c64[finite])) / norm)
        w_err = max(w_err, float(torch.linalg.vector_norm(w.to(c64.dtype)[finite] - c64[finite])) / norm)
    return None if t_err < 0 else (t_err, w_err)


_SAME_WIDTH_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bitwise_equal(a: Any, b: Any) -> bool:
    """Same structure, dtypes, shapes and bits (NaNs in the same places count as equal)."""
    la, lb = leaves(a), leaves(b)
    if len(la) != len(lb):
        return False
    for x, y in zip(la, lb, strict=True):
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            return False
        if not isinstance(x, torch.Tensor):
            if x != y and not (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y)):
                return False
            continue
        if x.dtype != y.dtype or x.shape != y.shape or x.layout != y.layout:
            return False
        if is_sparse(x) and structure_differs(x, y):
            return False
        if x.layout != torch.strided:
            x, y = x.to_dense(), y.to_dense()
        if x.dtype == torch.complex32:  # exact in complex64; the CPU has no ComplexHalf equal
            x, y = x.to(torch.complex64), y.to(torch.complex64)
        if x.is_complex():
            x, y = torch.view_as_real(x.resolve_conj()), torch.view_as_real(y.resolve_conj())
        if x.is_floating_point():
            bits = _SAME_WIDTH_INT.get(x.element_size())
            if bits is not None and torch.equal(x.view(bits), y.view(bits)):
                continue  # the same bits (NaNs included): one pass, no masks (large outputs)
            nx, ny = torch.isnan(x), torch.isnan(y)
            if not torch.equal(nx, ny) or not torch.equal(x[~nx], y[~ny]):
                return False
        elif not torch.equal(x, y):
            return False
    return True
