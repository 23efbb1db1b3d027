"""The corpus of schema-driven inputs: what a schema search found for one overload, kept in opdb
(table ``schema_corpus``) so that later runs replay it instead of searching again — the pattern
of Hypothesis' example database and of fuzzing corpora.

An :class:`Entry` holds inputs only, never verdicts: the first inputs the CPU rejected (the
``errors`` contract is checked on them), every input the search's generation accepted, and the
minimal failing inputs searches on any target shrank to. :mod:`conformance.sweep.schema` replays them
on the target and the CPU and decides again; it searches instead when the entry is missing, its
fingerprint differs, or the replay cannot stand for a search (see ``replay`` there).

The fingerprint (:func:`fingerprint`) is a digest of what decides which inputs a search
generates and which the CPU accepts: the overload's schema; which CPU-side dispatch keys have a
kernel for it (``torch._C._dispatch_has_kernel_for_dispatch_key``; the target's own keys are
left out, so builds share a corpus); the torch version and git revision; the Hypothesis version;
the source of the strategies (``schema.py``, ``hints.py``), the search's budgets and the
source of its Hypothesis test (from which a derandomized search's seed is derived).

Example::

    >>> import torch
    >>> from conformance.inputs.corpus import Entry, Stored, decode, encode, fingerprint
    >>> digest, basis = fingerprint("aten::abs.default")
    >>> basis["schema"]
    'aten::abs(Tensor self) -> Tensor'
    >>> e = Entry("aten::abs.default", digest, "inputs", True, False, "", "",
    ...           (Stored("valid", True, (torch.ones(2),), {}),))
    >>> back = decode(encode(e, run_id="r1"))
    >>> back.fingerprint == digest and back.calls[0].role, back.calls[0].args[0].tolist()
    (True, 'valid', [1.0, 1.0])
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import torch

from opdb.blobs import UnsafeInputs, dump_inputs, load_inputs
from opdb.store import now

from .schema import DEVICE, DeviceArg

FORMAT = 1  # bump when what an entry holds, or how the search uses it, changes
ROLES = ("rejected", "valid", "failing")
OUTCOMES = ("inputs", "no_valid_input")
MAX_FAILING = 8  # minimal failing inputs kept per overload (from different targets and builds)
DEVICE_MARK = "<device>"  # how a stored input spells the device argument
# CPU-side dispatch keys: a kernel added or removed under one of them changes what the CPU accepts
CPU_KEYS = ("CPU", "CompositeImplicitAutograd", "CompositeExplicitAutograd",
            "CompositeExplicitAutogradNonFunctional", "Autograd", "AutogradCPU", "Meta", "SparseCPU",
            "SparseCsrCPU", "QuantizedCPU", "NestedTensorCPU", "MkldnnCPU")


class CorpusError(ValueError):
    """A stored entry that cannot be used (damaged, tampered, or of another format)."""


@dataclass(frozen=True)
class Stored:
    """One stored input: its role in the search that found it, whether that search checked the
    contracts on it (the first accepted input), and its arguments as the op receives them (the
    device argument as :data:`~conformance.inputs.schema.DEVICE`)."""

    role: str  # rejected | valid | failing
    contracts: bool
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class Entry:
    overload: str
    fingerprint: str
    outcome: str  # inputs | no_valid_input
    complete: bool  # the valid inputs are all a search generated: it found no failure
    crash_safe: bool  # written by a crash-safe search (which checks no rejected inputs)
    steered: str  # " (steered by the CPU's errors: ...)" or ""
    summary: str  # for no_valid_input: the row's error
    calls: tuple[Stored, ...]

    def of(self, role: str) -> list[Stored]:
        return [c for c in self.calls if c.role == role]


@cache
def _search_source() -> str:
    here = Path(__file__).resolve().parent
    return hashlib.sha256(b"".join((here / n).read_bytes() for n in ("schema.py", "hints.py"))).hexdigest()


def fingerprint(overload: str, search: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    """The digest an entry is valid for, and what it was computed from (``search``: the search's
    budgets, which change what it generates)."""
    import hypothesis

    from conformance.catalog.overloads import packet_of

    base, name = overload.split(".", 1)[0], overload.rsplit(".", 1)[1]
    qualified = base if name == "default" else overload  # the dispatcher's own spelling
    packet = packet_of(overload)
    basis = {
        "schema": str(packet._schema),
        "kernels": [k for k in CPU_KEYS if torch._C._dispatch_has_kernel_for_dispatch_key(qualified, k)],
        "torch": f"{torch.__version__} {torch.version.git_version}",
        "hypothesis": hypothesis.__version__,
        "search": {"format": FORMAT, "strategies": _search_source(), **(search or {})},
    }
    return hashlib.sha256(json.dumps(basis, sort_keys=True).encode()).hexdigest(), basis


def _plain(value: Any) -> Any:
    if isinstance(value, DeviceArg):
        return DEVICE_MARK
    if isinstance(value, (list, tuple)):
        return [_plain(x) for x in value]
    return value


def _back(value: Any) -> Any:
    if value == DEVICE_MARK:
        return DEVICE
    if isinstance(value, list):
        return [_back(x) for x in value]
    return value


def encode(entry: Entry, *, run_id: str | None = None, basis: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``schema_corpus`` row of ``entry`` (tensors through :func:`opdb.blobs.dump_inputs`)."""
    blob = dump_inputs({"calls": [{"args": [_plain(a) for a in c.args],
                                   "kwargs": {k: _plain(v) for k, v in c.kwargs.items()}} for c in entry.calls]})
    return {"overload": entry.overload, "fingerprint": entry.fingerprint, "basis": basis, "outcome": entry.outcome,
            "complete": int(entry.complete), "crash_safe": int(entry.crash_safe), "steered": entry.steered,
            "summary": entry.summary, "calls": [{"role": c.role, "contracts": c.contracts} for c in entry.calls],
            "inputs": blob, "run_id": run_id, "recorded_at": now()}


def decode(row: dict[str, Any]) -> Entry:
    """An entry from its stored row; raises :class:`CorpusError` saying what is wrong with it
    (a blob that is not in the safe format is never unpickled)."""
    where = f"schema_corpus entry {row.get('overload')!r}"
    try:
        roles = json.loads(row.get("calls") or "null")
    except ValueError:
        raise CorpusError(f"{where}: column calls is not JSON") from None
    if not isinstance(roles, list) or not all(
            isinstance(r, dict) and r.get("role") in ROLES and isinstance(r.get("contracts"), bool) for r in roles):
        raise CorpusError(f"{where}: column calls is not a list of {{role: {'|'.join(ROLES)}, contracts: bool}}")
    if row.get("outcome") not in OUTCOMES:
        raise CorpusError(f"{where}: outcome {row.get('outcome')!r} is not one of {', '.join(OUTCOMES)}")
    try:
        box = load_inputs(row.get("inputs"), where=where)
    except UnsafeInputs as exc:  # damaged, tampered, or an old pickle: never unpickled
        raise CorpusError(str(exc)) from None
    calls = box.get("calls") if isinstance(box, dict) else None
    if not isinstance(calls, list) or len(calls) != len(roles) or not all(
            isinstance(c, dict) and isinstance(c.get("args"), list) and isinstance(c.get("kwargs"), dict)
            for c in calls):
        raise CorpusError(f"{where}: its inputs blob does not hold one {{args, kwargs}} per entry of calls")
    return Entry(str(row["overload"]), str(row.get("fingerprint") or ""), row["outcome"], bool(row.get("complete")),
                 bool(row.get("crash_safe")), str(row.get("steered") or ""), str(row.get("summary") or ""),
                 tuple(Stored(r["role"], r["contracts"], tuple(_back(a) for a in c["args"]),
                              {k: _back(v) for k, v in c["kwargs"].items()}) for r, c in zip(roles, calls, strict=True)))


def same_input(a: Stored, b: Stored) -> bool:
    """Whether two stored inputs are the same call (tensors equal in dtype, shape and values)."""

    def eq(x: Any, y: Any) -> bool:
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            return (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.dtype == y.dtype
                    and x.shape == y.shape and bool(torch.equal(x, y)))
        if isinstance(x, torch.UntypedStorage) or isinstance(y, torch.UntypedStorage):  # equal bytes
            return (isinstance(x, torch.UntypedStorage) and isinstance(y, torch.UntypedStorage)
                    and x.nbytes() == y.nbytes() and bytes(x.cpu()) == bytes(y.cpu()))
        if isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
            return len(x) == len(y) and all(eq(p, q) for p, q in zip(x, y, strict=True))
        return type(x) is type(y) and x == y

    return eq(list(a.args), list(b.args)) and a.kwargs.keys() == b.kwargs.keys() and all(
        eq(a.kwargs[k], b.kwargs[k]) for k in a.kwargs)
