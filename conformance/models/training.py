"""One side of a model item: ``TRAIN_STEPS`` steps of forward, backward and SGD.

:func:`train_side` runs a model (eager, on the target, or compiled) from given weights and data
and keeps what the comparison needs: the first forward's output, the first step's gradients, the
loss curve, the target's ATen op trace and a repeat of the first forward (its run-to-run noise).
The helpers move a value tree between dtypes and onto the CPU.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

from conformance.structure import map_tensors

TRAIN_STEPS = 3
LR = 0.01


def cast(tree: Any, dtype: torch.dtype) -> Any:
    """``tree`` with its floating tensors in ``dtype``."""
    return tree_map(lambda x: x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x,
                    tree)


def _to_cpu(tree: Any) -> Any:
    """Device tensors to the CPU (differentiable: gradients flow back to the device)."""
    return map_tensors(lambda x: x.to("cpu"), tree)


def detach_cpu(tree: Any) -> Any:
    """Detached CPU copies of the tensors of ``tree``."""
    return map_tensors(lambda x: x.detach().to("cpu"), tree)


@dataclass
class SideResult:
    out: Any = None  # first forward output (CPU copy, detached)
    grads: dict[str, torch.Tensor | None] | None = None  # first step's gradients (CPU copies)
    losses: list[float] | None = None
    again: Any = None  # the first forward repeated on the same weights and inputs (target side)
    first_s: float = 0.0  # wall time of the first forward+backward
    native: set[str] | None = None
    fallback: set[str] | None = None
    error: str | None = None


def train_side(spec: Any, model: nn.Module, fn: Callable[..., Any], inputs: tuple, target: Any | None,
               steps: int, seed: int, *, compiled: bool = False) -> SideResult:
    """Forward + backward (+ SGD step) ``steps`` times on one side.

    On the target side the first forward is repeated once, eager, without gradients, on the same
    weights, inputs and random seed (buffers such as batch-norm statistics restored after it):
    the target's own run-to-run noise, against which the gate judges a model's error growth.

    The target's op trace covers one step: the first (eager), or the second for a compiled
    callable, run with ``set_stance("eager_on_recompile")`` so that frames a dispatch-tracing
    mode exposes are not compiled (cached graphs still run) and compile counts stay clean.
    """
    res = SideResult(losses=[])
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    trace_at = 1 if compiled else 0  # a single compiled step is not traced
    for step in range(steps):
        torch.manual_seed(seed + step)
        opt.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        if step == trace_at and target is not None:
            stance = torch.compiler.set_stance("eager_on_recompile") if compiled \
                else contextlib.nullcontext()
            with stance, target.trace() as tr:
                out = fn(*inputs)
                loss = spec.loss(_to_cpu(out))
                loss.backward()
            target.synchronize()
            res.native, res.fallback = set(tr.native), set(tr.fallback)
        else:
            out = fn(*inputs)
            loss = spec.loss(_to_cpu(out))
            loss.backward()
            if target is not None:
                target.synchronize()
        if step == 0:
            res.first_s = time.perf_counter() - t0
            res.out = detach_cpu(out)
            if target is not None:
                res.again = _repeat(model, inputs, seed)
            res.grads = {n: (p.grad.detach().to("cpu").clone() if p.grad is not None else None)
                         for n, p in model.named_parameters()}
        res.losses.append(float(loss.detach().float()))
        opt.step()
    return res


def _repeat(model: nn.Module, inputs: tuple, seed: int) -> Any:
    """The first forward once more (eager, no gradients; buffers restored after it)."""
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    torch.manual_seed(seed)
    try:
        with torch.no_grad():
            return detach_cpu(model(*inputs))
    except Exception:  # noqa: BLE001 - no noise estimate; the parity run already said what failed
        return None
    finally:
        with torch.no_grad():
            for n, b in model.named_buffers():
                b.copy_(buffers[n])
