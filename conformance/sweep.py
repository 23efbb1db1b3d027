"""One group of the op sweep: generate a group's samples, execute each variant, compare, and
decide — yielding one plain result row per item. The runner (:mod:`conformance.run`) handles
processes, isolation, resume and recording.

Example::

    >>> from conformance.sweep import SweepConfig, run_group
    >>> from conformance.select import Group
    >>> from conformance.targets import get_target
    >>> rows = list(run_group(get_target("cpu"), Group("abs", "float32"), SweepConfig()))
    >>> {r["status"] for r in rows}
    {'pass'}
"""

from __future__ import annotations

import time
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from . import comparators
from .compare import arbitrate, compare
from .execute import run_backward, run_item, signature
from .inputs.opinfo import DEFAULT_SEED, by_name, samples, variant_fn
from .ledger import Ledger
from .select import VARIANTS, Group, item_key
from .targets import Target
from .verdict import NOT_COMPILED, Status, decide, decide_unrun


@dataclass(frozen=True)
class SweepConfig:
    thorough: bool = False
    seed: int = DEFAULT_SEED
    variants: tuple[str, ...] = VARIANTS
    ledger: Ledger = field(default_factory=Ledger.load)
    max_samples: int | None = None  # per group; None = all
    model_modes: tuple[str, ...] = ("eager", "compile")  # model items per graph

    def describe(self) -> dict[str, Any]:
        return {"thorough": self.thorough, "seed": self.seed, "variants": list(self.variants),
                "max_samples": self.max_samples, "model_modes": list(self.model_modes)}


def evaluate(target: Target, info: Any, op: str, variant: str, dtype: str, index: int, sample: Any,
             config: SweepConfig) -> dict[str, Any]:
    """Execute, compare and decide one item; returns its result row (without run bookkeeping)."""
    tol = config.ledger.tolerance(op, variant, dtype, target.name)
    xfail = config.ledger.expected_failure(op, variant, dtype, target.name)
    kind = comparators.comparator_for(op)
    start = time.perf_counter()
    out = run_backward(target, info, sample) if variant == "backward" else run_item(target, info, variant, sample)
    row: dict[str, Any] = {
        "item_key": item_key(op, variant, dtype, index), "op": op, "variant": variant, "dtype": dtype,
        "sample": index, "atol": tol.atol, "rtol": tol.rtol, "tol_source": tol.source, "comparator": kind,
        "native_ops": list(out.native), "fallback_ops": list(out.fallback), "reached_ops": list(out.reached),
        "proof": out.proof,
        "signature": signature(sample),
        "seed": config.seed,
    }
    close = False
    error = out.cpu_error and f"CPU reference failed: {out.cpu_error}"
    if out.cpu_error is None and out.target_error is None:
        inp = sample.input if isinstance(sample.input, torch.Tensor) else None
        ev = compare(out.cpu, out.target, atol=tol.atol, rtol=tol.rtol, device_meta=out.device_meta,
                     per_tensor=comparators.per_tensor_fn(kind, inp), comparator=kind)
        if not ev.close and out.arbiter is not None and ev.dtype_ok and ev.shape_ok and kind == "allclose":
            arb = out.arbiter()
            if arb is not None:
                ev = arbitrate(ev, out.cpu, out.target, arb, atol=tol.atol)
        row.update(ev.row())
        close = ev.close
        error = None if close else ev.detail
    elif out.target_error is not None:
        error = out.target_error
    status = decide(cpu_error=out.cpu_error, target_error=out.target_error, close=close,
                    fallback=out.fallback, expected_failure=xfail.statuses if xfail else None,
                    graphs=out.graphs)
    if status is Status.ERROR and out.target_error is None and out.graphs == 0:
        error = f"{NOT_COMPILED} ({_eager_why(out.proof)})"
    if status in (Status.XFAIL, Status.XPASS) and xfail is not None:
        error = f"{error or 'passed'} [expected failure: {xfail.where}: {xfail.reason}]"
    row["status"] = status.value
    row["error"] = error
    row["duration_s"] = out.duration_s or (time.perf_counter() - start)
    return row


def _eager_why(proof: dict[str, Any]) -> str:
    return (f"backend {proof.get('backend')!r}: {proof.get('frames', 0)} frames converted, "
            f"{proof.get('graph_breaks', 0)} graph breaks{_reasons(proof)}, outputs on {proof.get('device') or 'no device'}")


def _reasons(proof: dict[str, Any]) -> str:
    reasons = proof.get("break_reasons") or []
    return f" ({'; '.join(reasons)})" if reasons else ""


BACKWARD_DTYPES = ("float32", "bfloat16")


def plan(info: Any, config: SweepConfig, dtype: str = "float32") -> list[str]:
    """The forward variants the OpInfo has (backward is planned separately)."""
    return [v for v in config.variants if v != "backward" and variant_fn(info, v) is not None]


def wants_backward(info: Any, config: SweepConfig, dtype: str) -> bool:
    if "backward" not in config.variants or dtype not in BACKWARD_DTYPES or not info.supports_autograd:
        return False
    return getattr(torch, dtype) in info.supported_backward_dtypes("cpu")


def run_group(target: Target, group: Group, config: SweepConfig, *, skip: Container[str] = frozenset(),
              on_start: Callable[[str], None] | None = None) -> Iterator[dict[str, Any]]:
    """Yield a row per item of ``group``; items whose key is in ``skip`` are not run.

    ``on_start(key)`` is called before each item executes, so a supervisor knows which item was
    in flight if the process dies.
    """
    info = by_name()[group.op]
    dtype = getattr(torch, group.dtype)
    variants = plan(info, config)
    try:
        gen = samples(info, dtype, thorough=config.thorough, seed=config.seed)
        for index, sample in enumerate(gen):
            if config.max_samples is not None and index >= config.max_samples:
                break
            for variant in variants:
                key = item_key(group.op, variant, group.dtype, index)
                if key in skip:
                    continue
                if on_start:
                    on_start(key)
                yield evaluate(target, info, group.op, variant, group.dtype, index, sample, config)
        if wants_backward(info, config, group.dtype):
            gen = samples(info, dtype, thorough=config.thorough, seed=config.seed, requires_grad=True)
            for index, sample in enumerate(gen):
                if config.max_samples is not None and index >= config.max_samples:
                    break
                key = item_key(group.op, "backward", group.dtype, index)
                if key in skip:
                    continue
                if on_start:
                    on_start(key)
                yield evaluate(target, info, group.op, "backward", group.dtype, index, sample, config)
    except Exception as exc:  # noqa: BLE001 - the sample generator itself failed
        key = item_key(group.op, "function", group.dtype, -1)
        if key not in skip:
            yield {"item_key": key, "op": group.op, "variant": "function", "dtype": group.dtype, "sample": -1,
                   "status": decide_unrun("cpu").value, "error": f"sample generation failed: {type(exc).__name__}: {exc}"[:2000],
                   "duration_s": 0.0, "seed": config.seed}
