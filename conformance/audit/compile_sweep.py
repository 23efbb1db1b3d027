"""``torch.compile`` with the target's backend over every input-shape set: compiles, recompiles,
compiled parity and latency."""

from __future__ import annotations

import copy
import time
from typing import Any

import torch
from torch import nn

from .results import AuditConfig, AuditInputError, AuditResult, ShapeRow
from .trace import cpu_run, error_text, to_cpu


def compile_sweep(model: nn.Module, sets: list[tuple], labels: list[str], target: Any, tol: float,
                   config: AuditConfig, res: AuditResult) -> None:
    from conformance.models.localize import rel_l2
    from conformance.models.runner import CountingBackend, percentile

    backend = target.compile_backend()
    res.compile = {"backend": backend if isinstance(backend, str) else getattr(backend, "__name__", "callable"),
                   "dynamic": False, "compiles": 0, "recompiles": 0, "compile_s": None, "error": None,
                   "recompiled_shapes": []}
    torch._dynamo.reset()
    counter = CountingBackend(backend)
    tgt_model = copy.deepcopy(model).to(target.device)
    fn = torch.compile(tgt_model, backend=counter, dynamic=False)
    for i, (x, label) in enumerate(zip(sets, labels, strict=True)):
        row = ShapeRow(label)
        cpu_out, _ = cpu_run(model, x, f"the model (shape set {label})") if i else (None, None)
        try:
            xd = target.to_device(x)
            before = counter.compiles
            t0 = time.perf_counter()
            with torch.no_grad():
                out = fn(*xd)
            target.synchronize()
            if i == 0:
                res.compile["compile_s"] = time.perf_counter() - t0
            row.compiles = counter.compiles - before
            row.recompiled = bool(i and row.compiles)
            ref = cpu_out if i else None
            if ref is None:
                with torch.no_grad():
                    ref = to_cpu(model(*x))
            row.rel_err = rel_l2(ref, to_cpu(out))
            row.parity_ok = row.rel_err <= tol
            times = []
            with torch.no_grad():
                for k in range(config.warmup + config.timed_iters):
                    t0 = time.perf_counter()
                    fn(*xd)
                    target.synchronize()
                    if k >= config.warmup:
                        times.append((time.perf_counter() - t0) * 1e3)
            row.p50_ms, row.p99_ms = percentile(times, 0.5), percentile(times, 0.99)
        except AuditInputError:
            raise
        except Exception as exc:  # noqa: BLE001
            row.error = error_text(exc)[:500]
            res.compile["error"] = res.compile["error"] or f"{label}: {row.error}"
        res.shapes.append(row)
    res.compile["compiles"] = counter.compiles
    res.compile["recompiles"] = sum(r.compiles for r in res.shapes[1:])
    res.compile["recompiled_shapes"] = [r.inputs for r in res.shapes if r.recompiled]
    torch._dynamo.reset()
