"""Model-level parity on the target: forward outputs, gradients and training, the first divergent op."""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from conformance.structure import label, named_leaves, tensor_leaves

from .results import AuditInputError, AuditResult, OutputParity
from .trace import error_text, main_dtype

TRAIN_STEPS = 3


def forward_parity(cpu_out: Any, tgt_out: Any, tol: Any, res: AuditResult) -> bool:
    from conformance.check.compare import compare
    from conformance.models.localize import rel_l2

    c_l, t_l = named_leaves(cpu_out), named_leaves(tgt_out)
    c_paths, t_paths = [p for p, _ in c_l], [p for p, _ in t_l]
    if c_paths != t_paths:
        only_t = [label(p) for p in t_paths if p not in c_paths]
        only_c = [label(p) for p in c_paths if p not in t_paths]
        why = "; ".join(filter(None, [f"only on the target: {', '.join(only_t[:4])}" if only_t else "",
                                      f"only on the CPU: {', '.join(only_c[:4])}" if only_c else ""]))
        res.outputs.append(OutputParity(0, [], "", False, None, None,
                                        f"output structure differs: target returned {len(t_l)} leaves, CPU {len(c_l)}"
                                        + (f" ({why})" if why else " (same paths, another order)"), name="output"))
        return True
    bad = False
    for i, ((path, c), (_, t)) in enumerate(zip(c_l, t_l, strict=True)):
        name = label(path)
        if not isinstance(c, torch.Tensor):
            ok = c == t
            res.outputs.append(OutputParity(i, [], type(c).__name__, bool(ok), None, None,
                                            "" if ok else f"{t!r} vs {c!r}", name=name))
            bad |= not ok
            continue
        ev = compare(c, t, atol=tol.atol, rtol=tol.rtol)
        err = rel_l2(c, t) if isinstance(t, torch.Tensor) else math.inf
        detail = ""
        if not (ev.shape_ok and ev.dtype_ok):
            detail = ev.detail or "structure differs"
        elif not err <= tol.fwd_rtol:
            detail = f"||t - c|| / ||c|| = {err:.3g} > fwd_rtol={tol.fwd_rtol:g}"
        res.outputs.append(OutputParity(i, list(c.shape), str(c.dtype).removeprefix("torch."), not detail,
                                        err, ev.max_abs_err, detail, name=name))
        bad |= bool(detail)
    return bad


def training_loss(out: Any) -> torch.Tensor:
    fl = [o for o in tensor_leaves(out) if o.is_floating_point() and o.requires_grad]
    if not fl:
        raise AuditInputError("--train: the model's outputs carry no gradient (no float output depends on parameters)")
    return sum(o.float().square().mean() for o in fl)  # type: ignore[return-value]


def train_parity(model: nn.Module, inputs: tuple, target: Any, tol: Any, seed: int, res: AuditResult) -> bool:
    from conformance.models.runner import grad_evidence, loss_close, train_side

    spec = SimpleNamespace(loss=training_loss)
    cpu_m = copy.deepcopy(model).train()
    try:
        cpu = train_side(spec, cpu_m, cpu_m, inputs, None, TRAIN_STEPS, seed)
    except AuditInputError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise AuditInputError(f"--train: the model's training step fails on the CPU: {error_text(exc)}") from None
    try:
        tgt_m = copy.deepcopy(model).train().to(target.device)
        tgt = train_side(spec, tgt_m, tgt_m, target.to_device(inputs), target, TRAIN_STEPS, seed)
    except Exception as exc:  # noqa: BLE001
        res.gradients = {"ok": False, "worst_rel_err": None, "detail": f"training step raises on the target: {error_text(exc)}"}
        res.training = {"ok": False, "steps": TRAIN_STEPS, "detail": res.gradients["detail"]}
        return True
    g_ok, g_err, g_detail = grad_evidence(cpu.grads or {}, tgt.grads or {}, tol)
    res.gradients = {"ok": g_ok, "worst_rel_err": g_err, "parameters": len(cpu.grads or {}),
                     "detail": g_detail, "fallback_ops": sorted(tgt.fallback or ())}
    l_ok, l_detail = loss_close(cpu.losses or [], tgt.losses or [], tol)
    res.training = {"ok": l_ok, "steps": TRAIN_STEPS, "cpu_loss": cpu.losses, "target_loss": tgt.losses,
                    "detail": l_detail}
    return not (g_ok and l_ok)


def first_divergent(model: nn.Module, inputs: tuple, target: Any, tol: float, backward: bool, seed: int,
                     res: AuditResult) -> None:
    from conformance.models.localize import localize

    dtype = getattr(torch, main_dtype(model))
    try:
        div = localize(model, inputs, target, dtype, tol=tol, backward=backward, seed=seed)
    except Exception as exc:  # noqa: BLE001 - e.g. data-dependent control flow: no symbolic graph
        bad = next((o for o in res.ops if o.status in ("mismatch", "error") and o.source == "isolated check"), None)
        if bad is not None:
            res.first_divergent_op = bad.name
            res.first_divergent_detail = (f"{bad.name}: {bad.detail} (first failing op of the eager trace; "
                                          f"localize could not trace the graph: {error_text(exc)[:200]})")
        else:
            res.first_divergent_detail = f"localization failed: {error_text(exc)[:300]}"
        return
    if div is not None:
        res.first_divergent_op, res.first_divergent_detail = div.op, div.detail
    else:
        res.first_divergent_detail = "no single op of the ATen graph diverges beyond tolerance"
