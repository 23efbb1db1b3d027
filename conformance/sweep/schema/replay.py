"""The schema search's corpus side (:mod:`conformance.inputs.corpus`): whether a stored entry can
be replayed (:func:`stored_entry`), its replay on the target and the CPU (:func:`replay`), and the
entry a search leaves behind (:func:`entry_of`), merged with what the old one adds (:func:`merged`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from conformance.check.verdict import Status
from conformance.inputs import corpus
from conformance.inputs.schema import NOARG, Call
from conformance.sweep.opinfo import evaluate
from conformance.work import Group

from .rows import REJECTED_CHECKED, Found, check_rejected, first_dtype


def stored_entry(raw: dict[str, Any] | None, digest: str) -> tuple[corpus.Entry | None, str]:
    """The replayable entry of ``raw`` (a ``schema_corpus`` row), or None and why not."""
    if raw is None:
        return None, "no corpus entry"
    try:
        entry = corpus.decode(raw)
    except corpus.CorpusError as exc:  # ignored: the search's entry replaces it
        return None, f"corpus entry ignored: {exc}"
    if entry.fingerprint != digest:
        return None, "schema, CPU kernels, torch or the search changed since the corpus entry was stored"
    return entry, ""


def replay(target: Any, info: Any, group: Group, config: Any, entry: corpus.Entry,
           check_errors: bool) -> tuple[Found | None, str]:
    """Run a corpus entry's inputs on the target and the CPU now, as the search that stored them
    ran them (the same contracts on the same inputs); None, and why, where that cannot stand for
    a search: an input's CPU verdict changed (rejected now accepted, or accepted now rejected),
    a generated input fails on this target (the search shrinks it), or the entry's inputs end at
    another target's failure (they are not all a search generates). A stored minimal failing
    input that fails here is this target's finding, reported as the search reports one."""
    found = Found(steered=entry.steered)
    no_contracts = dataclasses.replace(config, contracts=("none",))

    def run(stored: corpus.Stored, cfg: Any) -> tuple[dict[str, Any], Any]:
        sample = _stored_sample(stored)
        dtype = first_dtype(sample)
        return evaluate(target, info, group.op, "function",
                        str(dtype).removeprefix("torch.") if dtype else "none", 0, sample, cfg), sample

    for stored in entry.of("rejected"):
        row, sample = run(stored, no_contracts)
        if row["status"] != Status.SKIP.value:
            return None, "an input the CPU rejected when the corpus entry was stored is accepted now"
        found.rejected[(row.get("error") or "")[:200]] += 1
        if check_errors and not entry.crash_safe and len(found.rejections) < REJECTED_CHECKED:
            found.rejections.append(check_rejected(target, info, sample, row.get("error") or ""))
    if entry.outcome == "no_valid_input":
        found.summary = entry.summary
        return found, ""
    for stored in reversed(entry.of("failing")):  # the newest first
        row, _ = run(stored, config if stored.contracts else no_contracts)
        if row["status"] == Status.SKIP.value:
            return None, "a stored failing input is rejected by the CPU now"
        if Status(row["status"]).failed:
            found.failing.update(row=row, call=stored, contracts=stored.contracts)
            return found, ""
    if not entry.complete:
        return None, "the corpus entry's inputs end at a failure on another target or build"
    for stored in entry.of("valid"):
        row, _ = run(stored, config if stored.contracts else no_contracts)
        if row["status"] == Status.SKIP.value:
            return None, "an input the CPU accepted when the corpus entry was stored is rejected now"
        if Status(row["status"]).failed:
            return None, "a stored input fails on this target (the search shrinks it)"
        found.accepted.append(row)
    if not found.accepted:
        return None, "the corpus entry holds no accepted input"
    return found, ""


def _stored_sample(stored: corpus.Stored) -> Any:
    """A SampleInput of copies of a stored input's tensors (the stored ones stay as they are)."""
    from torch.testing._internal.opinfo.core import SampleInput

    def copy(v: Any) -> Any:
        if isinstance(v, (torch.Tensor, torch.UntypedStorage)):
            return v.clone()
        if isinstance(v, list):
            return [copy(x) for x in v]
        return v

    args, kwargs = [copy(a) for a in stored.args], {k: copy(v) for k, v in stored.kwargs.items()}
    if args:
        return SampleInput(args[0], args=tuple(args[1:]), kwargs=kwargs)
    return SampleInput(NOARG, args=(), kwargs=kwargs)


def _stored(role: str, checked: bool, call: Call) -> corpus.Stored:
    args, kwargs = call.materialize()
    return corpus.Stored(role, checked, tuple(args), kwargs)


def entry_of(op: str, digest: str, found: Found, crash_safe: bool, row: dict[str, Any]) -> corpus.Entry:
    """The ``schema_corpus`` entry a search leaves: the inputs it logged, then its minimal failing one."""
    calls = [_stored(role, checked, call) for role, checked, call in found.log]
    if found.failing:
        failing = found.failing["call"]
        calls.append(failing if isinstance(failing, corpus.Stored)
                     else _stored("failing", found.failing["contracts"], failing))
    outcome = "inputs" if found.accepted else "no_valid_input"
    return corpus.Entry(op, digest, outcome, complete=not found.failing, crash_safe=crash_safe,
                        steered=found.steered, summary=row["error"] if outcome == "no_valid_input" else "",
                        calls=tuple(calls))


def merged(new: corpus.Entry, old: corpus.Entry | None) -> corpus.Entry:
    """``new`` with what ``old`` (the same fingerprint) adds: its minimal failing inputs and, when
    ``new`` stopped at a failure, its complete generation."""
    if old is None or old.crash_safe != new.crash_safe or old.outcome != new.outcome:
        return new
    base = new
    if not new.complete and old.complete:  # keep what a search generates where nothing fails
        base = dataclasses.replace(old, calls=tuple(c for c in old.calls if c.role != "failing"),
                                   steered=new.steered)
    failing = new.of("failing")
    for c in reversed(old.of("failing")):
        if len(failing) < corpus.MAX_FAILING and not any(corpus.same_input(c, f) for f in failing):
            failing.insert(0, c)  # older first: the replay tries the newest first
    failing = failing[-corpus.MAX_FAILING:]
    return dataclasses.replace(base, calls=tuple(c for c in base.calls if c.role != "failing")
                               + tuple(failing))
