"""What a schema search (or a replay of its corpus entry) saw of one overload (:class:`Found`),
and the one result row made of it (:func:`row_of`): its minimal failing input as a repro
``inputs`` blob, and the ``errors`` contract checked on the inputs the CPU rejected
(:func:`check_rejected`).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import torch

from conformance.check import contracts
from conformance.check.compare import leaves
from conformance.check.execute import on_device, phase, signature
from conformance.check.metacheck import OUT_OF_CONTRACT
from conformance.check.selfcheck import NOT_REPRODUCIBLE
from conformance.check.verdict import Status, decide, decide_unrun
from conformance.inputs import corpus
from conformance.inputs.schema import NOARG, Call, DeviceArg
from opdb.blobs import dump_inputs

REJECTED_CHECKED = 3  # inputs the CPU rejected that are also run on the target (contract "errors")


@dataclasses.dataclass
class Found:
    """What a search (or a replay of its corpus entry) saw of one overload, before its row."""

    steered: str = ""  # " (steered by the CPU's errors: ...)" or ""
    accepted: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # rows of accepted inputs
    failing: dict[str, Any] = dataclasses.field(default_factory=dict)  # {"row", "call", "contracts"}
    rejections: list[Rejected] = dataclasses.field(default_factory=list)  # contract errors, per rejected input
    rejected: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    # the inputs for the corpus, in the order seen: (role, checked the contracts, Call)
    log: list[tuple[str, bool, Call]] = dataclasses.field(default_factory=list)
    summary: str | None = None  # a replayed no_valid_input's stored error


def row_of(found: Found, base_row: dict[str, Any]) -> dict[str, Any]:
    """The overload's one row: its minimal failing input, or its first accepted input with what
    every accepted input reached, or why no input was valid."""
    if found.failing:
        row = dict(found.failing["row"])
        row.update(base_row, dtype=row["dtype"], inputs=blob(found.failing["call"]))
        with_rejections(row, found.rejections)
        row["error"] = (f"minimal failing input after shrinking{found.steered}: {row.get('signature')}; "
                        f"{row.get('error') or ''}")
        return row
    accepted = found.accepted
    if accepted:
        row = dict(accepted[0])
        row.update(base_row, dtype=row["dtype"])
        row["reached_ops"] = sorted({o for r in accepted for o in (r.get("reached_ops") or [])})
        row["native_ops"] = sorted({o for r in accepted for o in (r.get("native_ops") or [])})
        row["fallback_ops"] = sorted({o for r in accepted for o in (r.get("fallback_ops") or [])})
        row["error"] = None
        if Status(row["status"]).passed:  # a fallback seen in any accepted call marks the whole search
            row["status"] = decide(cpu_error=None, target_error=None, close=True,
                                   fallback=row["fallback_ops"]).value
        with_rejections(row, found.rejections)
        return row
    if found.summary is not None:
        error = found.summary
    else:
        top = "; ".join(f"{n}x {msg}" for msg, n in found.rejected.most_common(2))
        error = (f"no valid input: {sum(found.rejected.values())} generated calls rejected by the CPU"
                 f"{found.steered} ({top})")
    return {**base_row, "status": decide_unrun("cpu").value, "duration_s": 0.0, "error": error}


@dataclasses.dataclass(frozen=True)
class Rejected:
    """Contract ``errors`` on one input the CPU rejected, with that input (a sample as generated
    or as the corpus stored it): the row keeps the first that fails as its ``inputs``."""

    check: contracts.Check
    sample: Any


def check_rejected(target: Any, info: Any, sample: Any, cpu_error: str) -> Rejected:
    """Contract ``errors`` for one input the CPU rejected: the target must raise too. An input
    skipped because the CPU does not reproduce its own result, or because the op's meta kernel
    refuses what its CPU kernel accepted (:data:`~conformance.check.metacheck.OUT_OF_CONTRACT`),
    was not rejected by the CPU: nothing is asked of the target (n/a). A failure's detail is the
    OpInfo ``errors`` check's, after its ``error input N``: ``(signature): the CPU raises X; the
    target returns [shapes]`` (one wording, so that one bug is one cause whichever kind of item
    meets it)."""
    if cpu_error.startswith(NOT_REPRODUCIBLE) or OUT_OF_CONTRACT in cpu_error:
        return Rejected(contracts.na(cpu_error), sample)
    phase("target")
    try:
        moved = on_device(sample, target.device)
        result = target.wrap(info.op)(moved.input, *moved.args, **moved.kwargs)
        target.synchronize()
    except Exception:  # noqa: BLE001 - raised, as the CPU does
        return Rejected(contracts.Check("pass"), sample)
    shapes = [list(x.shape) for x in leaves(result) if isinstance(x, torch.Tensor)]
    return Rejected(contracts.Check("fail", f"({signature(sample)}): the CPU raises "
                                            f"{cpu_error.removeprefix('CPU reference failed: ')}; the target returns "
                                            f"{shapes or type(result).__name__}"), sample)


#: The ``errors`` contract of a search that checked no input the CPU rejected (the first
#: accepted input's own check speaks of OpInfo error_inputs, which an overload has none of).
NO_REJECTED = "no input the CPU rejects was checked on the target (the search generated none, or ran crash-safe)"


def with_rejections(row: dict[str, Any], rejections: list[Rejected]) -> None:
    """Put the rejected inputs' ``errors`` contract on the search's row (and into its status);
    where it is what fails the row, the first input that failed it becomes the row's ``inputs``
    and ``signature`` (role ``rejected``: ``conformance repro`` checks that the CPU raises and the
    target does too)."""
    checked = [r for r in rejections if r.check.outcome != "n/a"]
    checks = {name: contracts.Check(**c) for name, c in (row.get("contracts") or {}).items()}
    if not checked:
        if "errors" in checks:
            why = next((r.check.detail for r in rejections), NO_REJECTED)
            checks["errors"] = contracts.na(why)
            row["contracts"] = {name: c.as_json() for name, c in checks.items()}
        return
    bad = [(k, r) for k, r in enumerate(checked) if r.check.outcome == "fail"]
    checks["errors"] = (contracts.fail("; ".join(f"error input {k} {r.check.detail}" for k, r in bad)) if bad
                        else contracts.Check("pass", f"{len(checked)} inputs the CPU rejects raise on the target"))
    row["contracts"] = {name: c.as_json() for name, c in checks.items()}
    failed = contracts.failed(checks)
    row["contract_failed"] = ",".join(failed) or None
    if failed and Status(row["status"]).passed:
        row["status"] = Status.CONTRACT.value
        row["error"] = contracts.summary(checks)
    if bad and row["status"] == Status.CONTRACT.value and not row.get("inputs"):
        # the row's input and its signature are those of the input that fails it, as a failing
        # search's are its minimal failing input's (the op page's sample line, the repro)
        row["inputs"] = blob(bad[0][1].sample, role="rejected")
        row["signature"] = signature(bad[0][1].sample)


def first_dtype(sample: Any) -> torch.dtype | None:
    """The dtype of a sample's first tensor (its row's ``dtype``), or None."""
    for x in leaves((sample.input, sample.args, sample.kwargs)):
        if isinstance(x, torch.Tensor):
            return x.dtype
    return None


DEVICE_MARK = corpus.DEVICE_MARK  # how a stored input spells the device argument (standalone scripts map it)


def blob(call: Call | corpus.Stored | Any, role: str | None = None) -> bytes:
    """The row's ``inputs``: a generated call (materialized), a stored input or a sample, as repro
    reads it; ``role`` says what kind of input it is where it is not a failing one (``rejected``)."""
    def plain(v: Any) -> Any:
        if isinstance(v, DeviceArg):
            return DEVICE_MARK
        if isinstance(v, torch.memory_format):  # memory formats do not pickle
            return f"<{str(v).removeprefix('torch.')}>"
        if isinstance(v, list):
            return [plain(x) for x in v]
        return v

    if isinstance(call, corpus.Stored):
        args, kwargs = call.args, call.kwargs
    elif isinstance(call, Call):
        args, kwargs = call.materialize()
    else:  # a sample: its input is its first positional argument (NOARG: it has none)
        args = (() if call.input is NOARG else (call.input,)) + tuple(call.args)
        kwargs = call.kwargs
    value = {"args": [plain(a) for a in args], "kwargs": {k: plain(v) for k, v in kwargs.items()}}
    return dump_inputs({**value, "role": role} if role else value)
