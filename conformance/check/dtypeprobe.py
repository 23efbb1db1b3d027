"""The dtype probe: does the device take a dtype where the CPU takes it, and refuse it where the
CPU refuses it, forward and backward (PyTorch's ``TestCommon.test_dtypes``, with the CPU's
behaviour as the reference instead of the OpInfo's claim).

One sample is called on the CPU and on the target (:func:`call_sample`): forward, then, where an
input requires grad, the gradients of its differentiable outputs (their sum: upstream gradients
of ones) with respect to those inputs. Each side and direction is ``"ok"``, the error it raised,
or None (not run: no input requires grad, or the forward raised). Nothing is compared but whether
a call raised: values are the function and backward items' job.

:func:`judge` reads the samples probed: the first on which the two sides differ decides. The
target running a direction the CPU raises on is ``contract`` (it accepts a dtype the CPU rejects,
what upstream calls "worked but not listed"); the CPU running one the target raises on is
``unsupported_dtype`` (``unsupported_layout`` where the target's error refuses a layout, as a
device without sparse tensors does for every dtype of a sparse op:
:func:`~conformance.check.verdict.decide_dtypes`). What the OpInfo claims is recorded beside it,
and where the CPU itself contradicts the claim that is noted, never failed: it is PyTorch's
matter, not the device's.

Example::

    >>> p = judge([SampleProbe(0, ("ok", None), ("ok", None))], claimed=(True, False))
    >>> p.status.value, p.cpu, p.device
    ('pass', ('ok', 'n/a'), ('ok', 'n/a'))
    >>> p = judge([SampleProbe(1, ("RuntimeError: no", None), ("ok", None))], claimed=(False, False), dtype="int64")
    >>> p.status.value, p.detail
    ('contract', 'the target accepts int64 forward where the CPU rejects it (sample 1: the CPU raises RuntimeError: no)')
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from conformance.targets import Target

from .compare import leaves
from .execute import err, grad_inputs, phase
from .placement import leafify, on_cpu_where_wanted
from .verdict import Status, decide_dtypes

DIRECTIONS = ("forward", "backward")
OK = "ok"
ERROR_CHARS = 300  # of an error kept per sample in the record


@dataclass(frozen=True)
class SampleProbe:
    """One sample on both sides: ``(forward, backward)`` of each, each ``"ok"``, the error it
    raised, or None (not run)."""

    index: int
    cpu: tuple[str | None, str | None]
    target: tuple[str | None, str | None]

    def as_json(self) -> dict[str, Any]:
        return {"index": self.index, "cpu": list(self.cpu), "target": list(self.target)}


def differentiable(dtype: torch.dtype, info: Any) -> bool:
    """Whether the probe takes gradients in ``dtype`` (upstream: floating and complex dtypes)."""
    return bool(info.supports_autograd) and (dtype.is_floating_point or dtype.is_complex)


def _grads(result: Any, sample: Any, placed: Any) -> None:
    """The gradients of ``result``'s differentiable outputs (after the sample's own
    ``output_process_fn_grad``), summed, with respect to ``placed``'s inputs that require grad."""
    outs = [o for o in leaves(sample.output_process_fn_grad(result))
            if isinstance(o, torch.Tensor) and o.requires_grad]
    if not outs:
        raise ValueError("no differentiable output")
    torch.autograd.grad(outs, grad_inputs(placed), [torch.ones_like(o) for o in outs], allow_unused=True)


def _side(target: Target | None, info: Any, sample: Any, backward: bool) -> tuple[str | None, str | None]:
    """(forward, backward) of one side: the CPU when ``target`` is None."""
    device = "cpu" if target is None else target.device
    backward = backward and bool(grad_inputs(sample))
    placed: list[Any] = [None]

    def once() -> tuple[Any, Any]:
        s = leafify(sample, device)
        placed[0] = s
        got = info.op(s.input, *s.args, **s.kwargs)
        if target is not None:
            target.synchronize()
        return got, s

    try:  # the arguments an op wants on the CPU stay there, as the function items learned
        result, _ = once() if target is None else on_cpu_where_wanted(sample, f"{info.name}|function", once)
    except Exception as exc:  # noqa: BLE001 - what raised is the finding
        return err(exc)[:ERROR_CHARS], None
    if not backward:
        return OK, None
    try:
        _grads(result, sample, placed[0])
        if target is not None:
            target.synchronize()
    except Exception as exc:  # noqa: BLE001
        return OK, err(exc)[:ERROR_CHARS]
    return OK, OK


def call_sample(target: Target, info: Any, index: int, sample: Any, backward: bool) -> SampleProbe:
    """Sample ``index`` on the CPU, then on ``target`` (forward, and backward when asked)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        phase("cpu")
        cpu = _side(None, info, sample, backward)
        phase("target")
        dev = _side(target, info, sample, backward)
    return SampleProbe(index, cpu, dev)


def differs(p: SampleProbe) -> tuple[str, str, str] | None:
    """The first direction in which the sides differ, as (direction, "accepts" | "rejects", the
    error of the side that raised); None when they agree."""
    for d, (c, t) in zip(DIRECTIONS, zip(p.cpu, p.target, strict=True), strict=True):
        if c is None or t is None or (c == OK) == (t == OK):
            continue
        return (d, "accepts", c) if t == OK else (d, "rejects", t)
    return None


def summary(outcomes: Sequence[str | None]) -> str:
    """One side and direction over the samples probed: ok (every one ran), raises (every one
    raised), mixed, or n/a (none ran)."""
    ran = [o for o in outcomes if o is not None]
    if not ran:
        return "n/a"
    ok = sum(o == OK for o in ran)
    return OK if ok == len(ran) else "raises" if ok == 0 else "mixed"


@dataclass(frozen=True)
class Probe:
    """The verdict of one op x dtype's probe."""

    status: Status
    detail: str | None  # why it fails (None: it does not)
    claimed: tuple[bool, bool]  # what the OpInfo claims for the device type: forward, backward
    cpu: tuple[str, str]  # :func:`summary` of each direction
    device: tuple[str, str]
    note: str | None  # where the CPU contradicts the OpInfo's claim (recorded, not failed)
    samples: tuple[SampleProbe, ...]

    def as_json(self) -> dict[str, Any]:
        return {"claimed": dict(zip(DIRECTIONS, self.claimed, strict=True)),
                "cpu": dict(zip(DIRECTIONS, self.cpu, strict=True)),
                "device": dict(zip(DIRECTIONS, self.device, strict=True)),
                "note": self.note, "samples": [s.as_json() for s in self.samples]}


def judge(probes: Sequence[SampleProbe], *, claimed: tuple[bool, bool], dtype: str = "",
          expected_failure: Sequence[str] | None = None) -> Probe:
    """The verdict over the samples probed (the first that differs decides; see the module doc)."""
    cpu = tuple(summary([p.cpu[i] for p in probes]) for i in range(2))
    dev = tuple(summary([p.target[i] for p in probes]) for i in range(2))
    how, detail, error = None, None, ""
    for p in probes:
        d = differs(p)
        if d is None:
            continue
        direction, how, error = d
        detail = (f"the target accepts {dtype} {direction} where the CPU rejects it (sample {p.index}: the CPU raises {error})"
                  if how == "accepts" else
                  f"the target rejects {dtype} {direction} where the CPU runs it (sample {p.index}: the target raises {error})")
        break
    notes = [f"the OpInfo claims {dtype} {d} but the CPU raises on every sample probed"
             for d, c, s in zip(DIRECTIONS, claimed, cpu, strict=True) if c and s == "raises"]
    notes += [f"the CPU runs {dtype} {d} on every sample probed but the OpInfo does not claim it"
              for d, c, s in zip(DIRECTIONS, claimed, cpu, strict=True) if not c and s == OK]
    return Probe(decide_dtypes(how, error=error, expected_failure=expected_failure), detail, claimed, cpu, dev,
                 "; ".join(notes) or None, tuple(probes))
