"""Model-level tolerances and closeness: forward outputs, parameter gradients, loss curves.

:func:`model_tolerance` widens the ledger's tolerance for a model item to the model-level floor
of ``data/model_tolerances.toml``; :func:`forward_evidence`, :func:`grad_evidence` and
:func:`loss_close` judge one side of a model item against the CPU's at that tolerance, and
:func:`run_to_run_noise` measures the target's own noise.

Example::

    >>> tol = ModelTolerance(1e-3, 1e-3, 1e-3, 1e-5, 1e-3, "example")
    >>> loss_close([1.0, 0.5], [1.0, 0.5], tol)
    (True, '')
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from conformance import datafiles
from conformance.check.compare import Evidence, compare
from conformance.structure import label, named_leaves

from .localize import rel_l2


@dataclass(frozen=True)
class ModelTolerance:
    fwd_rtol: float  # ||t - c|| / ||c|| per float output tensor (and per node when localizing)
    grad_rtol: float  # per parameter, normwise, floored at 10 % of the largest gradient norm
    loss_rtol: float  # per SGD step, |l_t - l_c| / max(|l_c|, 1)
    atol: float  # the ledger's elementwise tolerance, for the evidence fields only
    rtol: float
    source: str


def model_tolerance(config: Any, model_id: str, dtype: str, target: str) -> ModelTolerance:
    """Ledger tolerance for (model_id, "model", dtype, target), widened to the model-level floor
    of ``data/model_tolerances.toml`` (see there for what each bound means)."""
    import fnmatch

    tol = config.ledger.tolerance(model_id, "model", dtype, target)
    floor = None
    for f in datafiles.model_floors():
        if fnmatch.fnmatchcase(target, f.target) and fnmatch.fnmatchcase(dtype, f.dtype):
            floor = f
    fwd = max(tol.rtol, floor.fwd_rtol if floor else 0.0)
    grad = max(tol.rtol, floor.grad_rtol if floor else 0.0)
    loss = max(tol.rtol, floor.loss_rtol if floor else 0.0)
    src = tol.source if floor is None or fwd == tol.rtol else \
        f"{datafiles.MODEL_TOLERANCES.name}: {floor.reason} (ledger: {tol.source})"
    return ModelTolerance(fwd, grad, loss, tol.atol, tol.rtol, src)


def forward_evidence(cpu_out: Any, tgt_out: Any, tol: ModelTolerance) -> tuple[Evidence, float, str]:
    """(op-sweep evidence at the ledger tolerance, normwise error, failure detail or "").

    The evidence fields (max_abs_err, max_rel_err, shapes, dtypes) are the op sweep's; closeness
    is normwise (``rel_l2 <= fwd_rtol``) plus matching structure, shapes and dtypes.
    """
    c_l, t_l = named_leaves(cpu_out), named_leaves(tgt_out)  # ModelOutputs and caches walked
    ev = compare([x for _, x in c_l], [x for _, x in t_l], atol=tol.atol, rtol=tol.rtol)
    err = rel_l2(cpu_out, tgt_out)
    if [p for p, _ in c_l] != [p for p, _ in t_l]:
        return ev, err, (ev.detail or "output structure differs") + \
            f" (target leaves {[label(p) for p, _ in t_l][:6]}, CPU {[label(p) for p, _ in c_l][:6]})"
    if not (ev.shape_ok and ev.dtype_ok):
        return ev, err, ev.detail or "output structure differs"
    if not err <= tol.fwd_rtol:
        where = ""
        if len(c_l) > 1:  # name the worst leaf
            worst = max(zip(c_l, t_l, strict=True), key=lambda ct: rel_l2(ct[0][1], ct[1][1]))
            where = f"{label(worst[0][0])}: "
        return ev, err, (f"{where}||t - c|| / ||c|| = {err:.3g} > fwd_rtol={tol.fwd_rtol:g} "
                         f"(max abs err {ev.max_abs_err:.3g})")
    return ev, err, ""


def grad_evidence(cpu_grads: dict[str, torch.Tensor | None], tgt_grads: dict[str, torch.Tensor | None],
                  tol: ModelTolerance) -> tuple[bool, float, str]:
    """(close, worst per-parameter error, detail) over every parameter's gradient.

    A parameter's error is ``||g_t - g_c|| / max(||g_c||, 0.1 * largest ||g_c||)``: a bias that
    feeds a norm has ~0 gradient on both sides and must not dominate.
    """
    norms = {n: float(g.double().norm()) for n, g in cpu_grads.items() if g is not None}
    floor = 0.1 * max(norms.values(), default=0.0)
    worst, bad = 0.0, []
    for name, gc in cpu_grads.items():
        gt = tgt_grads.get(name)
        if gc is None and gt is None:
            continue
        if gc is None or gt is None or gc.shape != gt.shape:
            why = "missing" if gt is None else "unexpected" if gc is None else \
                f"shape {list(gt.shape)} vs {list(gc.shape)}"
            bad.append(f"{name}: gradient {why} on target")
            worst = math.inf
            continue
        diff = (gt.double() - gc.double())
        num = float(diff.norm()) if bool(torch.isfinite(diff).all()) else math.inf
        den = max(norms[name], floor)
        e = num / den if den > 0 else (0.0 if num == 0 else math.inf)
        worst = max(worst, e)
        if not e <= tol.grad_rtol:
            bad.append(f"{name}: {e:.3g}")
    detail = "" if not bad else (f"gradients outside grad_rtol={tol.grad_rtol:g}: " + "; ".join(bad[:5])
                                 + (f" (+{len(bad) - 5} more)" if len(bad) > 5 else ""))
    return not bad, worst, detail


def loss_close(cpu: Sequence[float], tgt: Sequence[float], tol: ModelTolerance) -> tuple[bool, str]:
    if len(cpu) != len(tgt):
        return False, f"loss curve has {len(tgt)} steps on target vs {len(cpu)} on CPU"
    for i, (c, t) in enumerate(zip(cpu, tgt, strict=True)):
        if math.isnan(c) and math.isnan(t):
            continue
        if not (abs(t - c) <= tol.loss_rtol * max(abs(c), 1.0)):
            return False, (f"loss curve diverges at step {i}: target {t:.6g} vs CPU {c:.6g} "
                           f"(loss_rtol={tol.loss_rtol:g})")
    return True, ""


def run_to_run_noise(first: Any, again: Any) -> float | None:
    """max |again - first| / max |first| over the floating outputs (None: not measurable)."""
    if again is None:
        return None
    num = den = 0.0
    a_l, b_l = [x for _, x in named_leaves(first)], [x for _, x in named_leaves(again)]
    if len(a_l) != len(b_l):
        return None
    for a, b in zip(a_l, b_l, strict=True):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or not a.is_floating_point() \
                or a.shape != b.shape or not a.numel():
            continue
        a64, b64 = a.double(), b.double()
        fin = torch.isfinite(a64) & torch.isfinite(b64)
        if fin.any():
            num = max(num, float((a64[fin] - b64[fin]).abs().max()))
            den = max(den, float(a64[fin].abs().max()))
    return num / den if den else (0.0 if not num else None)
