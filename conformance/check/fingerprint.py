"""Error fingerprints: how a target's floating results err against a reference, and whether that
changed between two runs.

**The fingerprint of one item** (:func:`fingerprint`) looks at every element of its floating
outputs. Each element's error is ``e = (target - ref) * sign(ref) / max(|ref|, median |ref|) /
eps(dtype)``: relative to the reference and signed along it (positive: the target's magnitude is
too large), in units of the output dtype's machine epsilon (about ULPs), with near-zero references
measured against the tensor's typical magnitude instead (so cancellation does not blow a relative
error up). Signed along the reference, the mean is the *multiplicative* bias: a kernel that
scales its results by 1.002, or rounds toward zero, moves it although the errors of a tensor of
mixed signs would average out. The sweep takes ``ref`` as the CPU's own result where the item's
values pass (the same for every build: drift between builds shows against it, and no float64
call is paid) and as the float64 arbiter (the same sample computed in float64 on the CPU) where
they fail; the fingerprint says which (``"ref"``), and runs are compared only like for like. Stored per item (``op_results.fingerprint``):
``n`` (finite elements), ``bias`` (mean signed error), ``rms``, ``p99`` and ``max`` of ``|e|``,
``nonfinite`` (elements finite on one side only, or NaN against a number) and ``probes``: the
signed errors at up to :data:`PROBES` fixed positions spread over each floating output
(:data:`MAX_PROBES` per item; base64 float32; NaN where an element is not finite), so two runs of
the same seeded sample can be compared element by element.

**Comparing two runs** (:func:`shift`) pairs the probes of the items both runs hold (same item
key, so the same sample) across all samples of an op x variant x dtype. Two one-sided paired sign
tests -- "|error| grew" and "the signed error moved" -- are calibrated under the null that the two
runs' errors differ only by exchangeable noise (a deterministic device changes no probe at all).
A finding needs both significance and an effect, measured on the probe pairs that changed (a
defect in one kernel an op reaches changes only the samples routed to it; the unchanged samples
must not dilute it):

- magnitude: ``p < P_MAX`` and the RMS error grew by ``>= GROWTH`` and by ``>= MIN_EPS``;
- bias: ``p < P_MAX`` and ``|mean error|`` grew by ``>= max(MIN_EPS, BIAS_FRAC x baseline RMS)``.

The evidence also carries both runs' pooled fingerprints over all elements of the group.

``P_MAX = 1e-6`` needs at least 20 changed pairs all one way, and keeps the family-wise false
alarm rate of a whole sweep (~10,000 groups) below 1% under pure noise. Two identical runs of the
default sweep give 0 findings (see the closing note of issue #16 for the measured figures).

Example::

    >>> import torch
    >>> ref = torch.linspace(1, 2, 1000, dtype=torch.float64)
    >>> fp = fingerprint(ref.float(), ref, ref_kind="float64")
    >>> fp["n"], fp["rms"] < 0.5
    (1000, True)
    >>> worse = fingerprint((ref * 1.002).float(), ref, ref_kind="float64")
    >>> s = shift([fp], [worse])
    >>> s.found, s.kind
    (True, 'magnitude+bias')
"""

from __future__ import annotations

import base64
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .compare import leaves

PROBES = 64  # signed errors kept per output tensor of an item, at fixed positions ...
MAX_PROBES = 512  # ... and per item (at least 4 per output)
P_MAX = 1e-6  # one-sided sign-test p-value a shift must beat
MIN_PAIRS = 20  # changed probe pairs needed before anything is said
GROWTH = 1.10  # pooled RMS error ratio that counts as "grew"
MIN_EPS = 1.0  # smallest effect (in eps) that counts, RMS growth or bias shift
BIAS_FRAC = 0.10  # a bias shift must also reach this fraction of the baseline's RMS error


def _floats(value: Any) -> list[torch.Tensor]:
    out = []
    for x in leaves(value):
        if not isinstance(x, torch.Tensor):
            out.append(None)
            continue
        if x.layout != torch.strided:
            x = x.to_dense()
        if x.dtype == torch.complex32:
            x = x.to(torch.complex64)
        if x.is_complex():
            x = torch.view_as_real(x.resolve_conj())
        out.append(x)
    return out


class _Exact:
    """An output equal to its reference and finite: each error is a zero, signed as the full
    measurement signs it (``(t - r) * sign(r)``: -0.0 where the reference is negative)."""

    def __init__(self, ref: torch.Tensor) -> None:
        self.ref, self.size = ref, ref.numel()

    def at(self, positions: np.ndarray | None) -> np.ndarray:
        """The errors at ``positions`` of the flattened output (None: all of them)."""
        flat = self.ref.detach().reshape(-1)
        if positions is not None:
            flat = flat[torch.from_numpy(positions)]
        return 0.0 * np.sign(flat.to(torch.float64).numpy())


@functools.lru_cache(maxsize=4096)
def _probe_positions(size: int, count: int) -> np.ndarray:
    """``count`` positions spread evenly over ``size`` elements (all of them when fewer)."""
    return np.round(np.linspace(0, size - 1, min(count, size))).astype(np.int64)


def _errors(t64: np.ndarray, r64: np.ndarray, finfo: Any) -> np.ndarray:
    """Each finite element's signed error in eps of the dtype, relative to its reference's
    magnitude, or to the (upper) median magnitude where that is larger."""
    a = np.abs(r64)
    scale = max(float(np.partition(a, a.size // 2)[a.size // 2]), finfo.tiny)
    return (t64 - r64) * np.sign(r64) / np.maximum(a, scale) / finfo.eps


def fingerprint(target: Any, reference: Any, *, ref_kind: str) -> dict[str, Any] | None:
    """The error fingerprint of ``target``'s floating outputs against ``reference`` (None when
    there is nothing floating to measure or the structures differ). In numpy: most results are
    small, and the fingerprint of every item must cost little next to running it."""
    t_l, r_l = _floats(target), _floats(reference)
    if len(t_l) != len(r_l):
        return None
    errs, nonfinite, exact = [], 0, True
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        for t, r in zip(t_l, r_l, strict=True):
            if t is None or r is None or not t.is_floating_point() or not r.is_floating_point():
                continue
            if t.shape != r.shape:
                return None
            if t.numel() == 0:
                continue
            if t.dtype == r.dtype and torch.equal(t, r) and bool(torch.isfinite(t).all()):
                errs.append(_Exact(r))  # every error is 0: measured without the float64 passes
                continue
            exact = False
            finfo = torch.finfo(t.dtype)
            t64 = t.detach().to(torch.float64).reshape(-1).numpy()
            r64 = r.detach().to(torch.float64).reshape(-1).numpy()
            fin = np.isfinite(t64) & np.isfinite(r64)
            if fin.all():  # the common case: no masks, no copies through them (same values)
                errs.append(_errors(t64, r64, finfo))
                continue
            same = (t64 == r64) | (np.isnan(t64) & np.isnan(r64))
            nonfinite += int((~fin & ~same).sum())
            e = np.full(t64.shape, np.nan)
            if fin.any():
                e[fin] = _errors(t64[fin], r64[fin], finfo)
            errs.append(e)
    if not errs:
        return None
    per = max(4, min(PROBES, MAX_PROBES // len(errs)))
    if exact:  # most items on a device that matches its reference: the sums below, without the passes
        picked = np.concatenate([x.at(_probe_positions(x.size, per)) for x in errs])
        return {"ref": ref_kind, "n": sum(x.size for x in errs), "nonfinite": 0,
                "probes": base64.b64encode(picked.astype(np.float32).tobytes()).decode("ascii"),
                "bias": 0.0, "rms": 0.0, "p99": 0.0, "max": 0.0}
    errs = [x.at(None) if isinstance(x, _Exact) else x for x in errs]
    e = np.concatenate(errs) if len(errs) > 1 else errs[0]
    if not e.size:
        return None
    finite = e[~np.isnan(e)]
    n = int(finite.size)
    # Probes per output (a small output next to a big one -- a model's logits next to its
    # gradients, a layer norm's mean next to its result -- is sampled all the same).
    picked = np.concatenate([x[_probe_positions(x.size, per)] for x in errs])
    fp: dict[str, Any] = {"ref": ref_kind, "n": n, "nonfinite": nonfinite,
                          "probes": base64.b64encode(picked.astype(np.float32).tobytes()).decode("ascii")}
    if n:
        mag = np.abs(finite)
        k = max(1, math.ceil(0.99 * n))
        # np.sum, not np.dot: BLAS's dot splits a long vector by its thread count, so the last
        # digits of a million-element item's rms differed between a Ray actor and a local worker
        fp.update(bias=float(finite.sum()) / n, rms=math.sqrt(float(np.sum(finite * finite)) / n),
                  p99=float(np.partition(mag, k - 1)[k - 1]), max=float(mag.max()))
    return fp


def probes(fp: dict[str, Any]) -> torch.Tensor:
    raw = base64.b64decode(fp.get("probes") or "")
    return torch.frombuffer(bytearray(raw), dtype=torch.float32).double() if raw else torch.zeros(0, dtype=torch.float64)


def sign_test_p(greater: int, n: int) -> float:
    """One-sided binomial sign test: P(X >= greater) for X ~ Binomial(n, 1/2)."""
    return sum(math.comb(n, k) for k in range(greater, n + 1)) / 2**n


def _pooled(fps: Sequence[dict[str, Any]]) -> tuple[int, float, float, float]:
    """(elements, bias, rms, p99) over all elements of ``fps``: bias and rms pooled exactly from the
    per-item moments, p99 as the largest per-item p99."""
    n = sum(int(f.get("n") or 0) for f in fps)
    if not n:
        return 0, 0.0, 0.0, 0.0
    bias = sum(f["n"] * f["bias"] for f in fps if f.get("n")) / n
    rms = math.sqrt(sum(f["n"] * f["rms"] ** 2 for f in fps if f.get("n")) / n)
    return n, bias, rms, max(f["p99"] for f in fps if f.get("n"))


@dataclass(frozen=True)
class Shift:
    """How a group's errors moved from the baseline run to the candidate run."""

    pairs: int  # probe pairs finite on both sides
    changed: int  # of those, pairs whose error changed
    worse: int  # changed pairs whose |error| grew
    up: int  # changed pairs whose signed error went up
    p_magnitude: float
    p_bias: float
    baseline: tuple[int, float, float, float]  # pooled (elements, bias, rms, p99)
    candidate: tuple[int, float, float, float]
    found: bool
    kind: str  # "magnitude" | "bias" | "magnitude+bias" | ""

    def evidence(self) -> dict[str, Any]:
        def fmt(p: tuple[int, float, float, float]) -> dict[str, Any]:
            return {"elements": p[0], "bias_eps": round(p[1], 4), "rms_eps": round(p[2], 4), "p99_eps": round(p[3], 4)}

        return {"test": self.kind, "baseline": fmt(self.baseline), "candidate": fmt(self.candidate),
                "probe_pairs": self.pairs, "changed_pairs": self.changed, "worse_pairs": self.worse,
                "up_pairs": self.up, "p_magnitude": self.p_magnitude, "p_bias": self.p_bias,
                "rms_ratio": round(self.candidate[2] / self.baseline[2], 4) if self.baseline[2] else None}


def shift(baseline: Sequence[dict[str, Any]], candidate: Sequence[dict[str, Any]]) -> Shift:
    """Compare paired fingerprints (``baseline[i]`` and ``candidate[i]`` of the same item)."""
    b_p, c_p = [], []
    for b, c in zip(baseline, candidate, strict=True):
        pb, pc = probes(b), probes(c)
        if pb.numel() == pc.numel():
            b_p.append(pb)
            c_p.append(pc)
    eb = torch.cat(b_p) if b_p else torch.zeros(0, dtype=torch.float64)
    ec = torch.cat(c_p) if c_p else torch.zeros(0, dtype=torch.float64)
    ok = ~(torch.isnan(eb) | torch.isnan(ec))
    eb, ec = eb[ok], ec[ok]
    changed = eb != ec
    n_changed = int(changed.sum())
    mag_b, mag_c = eb[changed].abs(), ec[changed].abs()
    decided = mag_b != mag_c
    worse = int((mag_c > mag_b).sum())
    up = int((ec[changed] > eb[changed]).sum())
    p_mag = sign_test_p(worse, int(decided.sum())) if n_changed else 1.0
    p_bias = min(1.0, 2 * sign_test_p(max(up, n_changed - up), n_changed)) if n_changed else 1.0
    kinds = []
    if n_changed >= MIN_PAIRS:
        # Effects on the elements that changed: a defect in one of the kernels an op reaches (mm
        # under matmul) changes only the samples routed to it, and the unchanged ones must not
        # dilute it.
        b, c = eb[changed], ec[changed]
        rms_b, rms_c = float(b.square().mean().sqrt()), float(c.square().mean().sqrt())
        if p_mag < P_MAX and rms_c >= GROWTH * rms_b and rms_c - rms_b >= MIN_EPS:
            kinds.append("magnitude")
        if p_bias < P_MAX and abs(float(c.mean())) - abs(float(b.mean())) >= max(MIN_EPS, BIAS_FRAC * rms_b):
            kinds.append("bias")
    return Shift(int(ok.sum()), n_changed, worse, up, p_mag, p_bias, _pooled(baseline), _pooled(candidate),
                 bool(kinds), "+".join(kinds))


__all__ = ["fingerprint", "shift", "Shift", "sign_test_p", "PROBES", "P_MAX", "MIN_PAIRS", "GROWTH", "MIN_EPS",
           "BIAS_FRAC"]
