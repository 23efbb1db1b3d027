"""Inputs of a custom op that declares no reference, generated from its schema.

The calls come from the schema search's strategies (:func:`conformance.inputs.schema.call_strategy`),
held to the group's dtype, in a derandomized Hypothesis walk (the same calls every run); a call is
kept when the op itself runs it on the target's device (a custom op has no CPU kernel to ask, and
its device kernel is what says which inputs it takes). The first :data:`SAMPLES` kept are the op's
samples; its floating-point inputs are differentiated where the op has an autograd formula.

Example::

    >>> import torch
    >>> from conformance.targets import get_target
    >>> samples, why = schema_samples(get_target("cpu"), torch.ops.aten.mul.Tensor, torch.float32)
    >>> len(samples), samples[0].args[0].dtype
    (2, torch.float32)
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from hypothesis import HealthCheck, Phase, given, settings

from conformance.inputs.hints import Hints
from conformance.inputs.schema import SMALL_DTYPES, Call, DeviceArg, call_strategy

from .discovery import device_key
from .opcheck import differentiable
from .references import Sample

SAMPLES = 2  # kept calls per op x dtype
TRIES = 40  # generated calls at most, kept or not


def on_device(value: Any, target: Any) -> Any:
    """A CPU argument as the target's call takes it (tensors placed, the device argument named)."""
    if isinstance(value, DeviceArg):
        return torch.device(target.device)
    if isinstance(value, (list, tuple)):
        return type(value)(on_device(v, target) for v in value)
    return target.to_device(value) if isinstance(value, torch.Tensor) else value


def schema_samples(target: Any, op: torch._ops.OpOverload, dtype: torch.dtype, *, n: int = SAMPLES,
                   tries: int = TRIES) -> tuple[list[Sample], str]:
    """Up to ``n`` calls of ``op`` in ``dtype`` that run on ``target``, and (when fewer were kept)
    why the others were refused."""
    hints = Hints(dtypes=(dtype,), avoid=tuple(d for d in SMALL_DTYPES if d != dtype))
    strategy = call_strategy(op, hints)  # ValueError: an argument type it cannot generate
    kept: list[Call] = []
    refused: dict[str, int] = {}

    @settings(max_examples=tries, derandomize=True, database=None, deadline=None, print_blob=False,
              phases=(Phase.generate,), suppress_health_check=list(HealthCheck))
    @given(strategy)
    def walk(call: Call) -> None:
        if len(kept) >= n:
            return
        args, kwargs = call.materialize()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                op(*on_device(args, target), **on_device(kwargs, target))
                target.synchronize()
        except Exception as exc:  # noqa: BLE001 - a call the op refuses: not one of its inputs
            why = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:160]}"
            refused[why] = refused.get(why, 0) + 1
            return
        kept.append(call)

    walk()
    grad = differentiable(op, device_key(target.device))
    samples = []
    for call in kept:
        args, kwargs = call.materialize()
        wrt = tuple(i for i, a in enumerate(args) if grad and isinstance(a, torch.Tensor) and a.is_floating_point())
        samples.append(Sample(tuple(args), dict(kwargs), wrt))
    top = "; ".join(f"{k} x{v}" for k, v in sorted(refused.items(), key=lambda kv: -kv[1])[:2])
    return samples, (f"{sum(refused.values())} generated calls refused by the op ({top})" if refused else "")
