"""Is the target's generated text the CPU's? The near-tie rule, the log-likelihood bound, and the
one verdict of a (model, bucket, dtype, mode) item.

**A sequence.** Its new tokens on the target are compared with the CPU's. At the first position
where they differ the prefix is shared, so both devices scored the same context there: the flip is
a **near tie** when the CPU's top-1/top-2 logit margin at that position is at most
``factor x rtol x rms(CPU logits)`` (``generation.toml``'s ``[near_tie]``; ``rtol`` the model
tolerance of the target and dtype), which two logits each off by a typical in-tolerance error can
swap; a wider flip is a **wide** one, which no in-tolerance rounding explains.

**An item** passes when none of its sequences flips wide and the log-likelihood of the fixed
continuation shifts by no more than its bound (nats per token, ``[[loglik]]``); near-tie flips
are counted in the row, never hidden, and do not fail it. Otherwise it is a ``mismatch``, its
error naming the first wide flip (position, margin, bound, both tokens) or the shift.

Example::

    >>> import torch
    >>> from conformance.generate.decode import Decoded
    >>> cpu = Decoded([5, 7], [torch.tensor([0., 0, 0, 0, 0, 2, 0, 0]), torch.tensor([0., 0, 0, 0, 0, 0, 0, 1.0])], 0.0, [], "static")
    >>> same = judge_sequence(cpu, cpu, rtol=1e-2, factor=2.0)
    >>> same.kind, same.position
    ('agree', None)
    >>> dev = Decoded([5, 6], cpu.logits, 0.0, [], "static")
    >>> flip = judge_sequence(cpu, dev, rtol=1e-2, factor=2.0)
    >>> flip.kind, flip.position, flip.margin
    ('wide', 1, 1.0)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from .decode import Decoded

AGREE, NEAR_TIE, WIDE = "agree", "near_tie", "wide"


@dataclass(frozen=True)
class Sequence:
    """One prompt's tokens on both devices, and what their first difference is."""

    kind: str  # agree | near_tie | wide
    position: int | None = None  # the first divergent new-token position
    margin: float | None = None  # the CPU's top-1/top-2 margin there
    bound: float | None = None  # the near-tie rule's bound there
    cpu_token: int | None = None
    target_token: int | None = None
    step_rel_err: float | None = None  # ||t - c|| / ||c|| of the logits at that position

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def rel_err(cpu: torch.Tensor, dev: torch.Tensor) -> float:
    denom = float(cpu.norm())
    return float((dev - cpu).norm()) / denom if denom > 0 else float((dev - cpu).norm())


def margin_bound(logits: torch.Tensor, rtol: float, factor: float) -> tuple[float, float]:
    """The top-1/top-2 margin of ``logits`` and the near-tie rule's bound for them."""
    top = logits.topk(2).values
    rms = float(logits.pow(2).mean().sqrt())
    return float(top[0] - top[1]), factor * rtol * rms


def judge_sequence(cpu: Decoded, dev: Decoded, *, rtol: float, factor: float) -> Sequence:
    for i, (a, b) in enumerate(zip(cpu.tokens, dev.tokens, strict=False)):
        if a == b:
            continue
        margin, bound = margin_bound(cpu.logits[i], rtol, factor)
        err = rel_err(cpu.logits[i], dev.logits[i]) if i < len(dev.logits) else None
        return Sequence(NEAR_TIE if margin <= bound else WIDE, i, round(margin, 6), round(bound, 6), a, b,
                        None if err is None else round(err, 6))
    if len(cpu.tokens) != len(dev.tokens):  # one side stopped early (an end-of-sequence the other did not give)
        i = min(len(cpu.tokens), len(dev.tokens))
        return Sequence(WIDE, i)
    return Sequence(AGREE)


def shared_prefix_err(pairs: list[tuple[Decoded, Decoded, Sequence]]) -> float:
    """The worst ||t - c|| / ||c|| of a step's logits over the steps before each sequence's divergence."""
    worst = 0.0
    for cpu, dev, seq in pairs:
        upto = seq.position if seq.position is not None else len(cpu.logits)
        for i in range(min(upto, len(cpu.logits), len(dev.logits))):
            worst = max(worst, rel_err(cpu.logits[i], dev.logits[i]))
    return worst


@dataclass(frozen=True)
class Judgement:
    close: bool
    agreement: float
    near_tie: int
    wide: int
    reported: Sequence | None  # the first wide flip, else the first near tie
    first_divergence: int | None
    loglik_shift: float
    loglik_tol: float
    reason: str  # why it is not close ('' when it is)


def judge(seqs: list[Sequence], loglik_cpu: float, loglik_target: float, loglik_tol: float) -> Judgement:
    wide = [s for s in seqs if s.kind == WIDE]
    near = [s for s in seqs if s.kind == NEAR_TIE]
    agree = sum(s.kind == AGREE for s in seqs)
    shift = abs(loglik_target - loglik_cpu)
    reported = min(wide, key=lambda s: s.position or 0) if wide else (min(near, key=lambda s: s.position or 0)
                                                                       if near else None)
    firsts = [s.position for s in seqs if s.position is not None]
    reason = ""
    if wide:
        w = reported
        assert w is not None
        reason = (f"{len(wide)} of {len(seqs)} sequences flip at a wide margin; the first at new token {w.position}: "
                  f"CPU token {w.cpu_token}, target {w.target_token}"
                  + (f" (CPU margin {w.margin:.4g} > near-tie bound {w.bound:.4g})" if w.margin is not None else
                     " (one side stopped early)"))
    elif not shift <= loglik_tol:
        reason = (f"log-likelihood of the fixed continuation shifts by {shift:.4g} nats/token "
                  f"(CPU {loglik_cpu:.4f}, target {loglik_target:.4f}; bound {loglik_tol:.4g})")
    return Judgement(close=not reason, agreement=agree / len(seqs) if seqs else 1.0, near_tie=len(near),
                     wide=len(wide), reported=reported, first_divergence=min(firsts) if firsts else None,
                     loglik_shift=shift, loglik_tol=loglik_tol, reason=reason)
