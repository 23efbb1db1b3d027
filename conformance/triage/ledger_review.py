"""Reviewing the ledger against stored results: entries that can go, overrides a run suggests.

The policy behind ``conformance ledger stale`` and ``conformance ledger propose``; the commands
only parse options, call these and print.

Example::

    >>> from conformance.check.ledger import Ledger
    >>> from conformance.triage.ledger_review import entry_staleness
    >>> led = Ledger.from_toml('''
    ... [[xfail]]
    ... op = "cumsum"
    ... status = "mismatch"
    ... reason = "accumulates in bf16"
    ... ''', source="inline.toml")
    >>> run = {"id": "r1", "target": "neuron-emu"}
    >>> outcome = {"op": "cumsum", "variant": "function", "dtype": "bfloat16", "status": "pass",
    ...            "max_abs_err": 0.0, "max_rel_err": 0.0}
    >>> entry_staleness(led.xfails[0], [run], {"r1": [outcome]})
    'passed in each of the last 1 runs'
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from conformance.check.ledger import Entry, Ledger, torch_default
from opdb import Store
from opdb.queries import finished_runs, item_outcomes, tolerance_evidence
from opdb.status import PASSED, Status

GROWTH = 1.5  # a proposed tolerance is the worst observed error times this, rounded up to 1, 2 or 5


@dataclass(frozen=True)
class StaleEntry:
    """A ledger entry that can go, and why."""

    entry: Entry
    why: str

    def line(self) -> str:
        e = self.entry
        return f"{e.where}: op={e.op} dtype={e.dtype} target={e.target}: {self.why} (reason was: {e.reason})"


def _needed(entry: Entry, outcome: Mapping[str, Any]) -> bool:
    """Whether ``outcome`` still needs ``entry`` (an xfail: it fails; an override: beyond torch's default)."""
    if entry.kind == "xfail":
        return not (outcome["status"] in PASSED or outcome["status"] == Status.XPASS)
    default = torch_default(outcome["dtype"])
    return not ((outcome["max_abs_err"] or 0) <= default.atol or (outcome["max_rel_err"] or 0) <= default.rtol)


def entry_staleness(entry: Entry, runs: Sequence[Mapping[str, Any]],
                    outcomes: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    """Why ``entry`` can go ('' when it cannot): it expired, or every run of ``runs`` had items it
    matches and none of them needed it. ``outcomes`` maps a run id to its item outcomes."""
    if entry.kind == "default":
        return ""
    if entry.expired():
        return f"expired on {entry.expires}"
    if not runs:
        return ""
    for r in runs:
        hits = [o for o in outcomes[r["id"]] if entry.matches(o["op"], o["variant"], o["dtype"], r["target"])]
        if not hits or any(_needed(entry, o) for o in hits):
            return ""
    if entry.kind == "xfail":
        return f"passed in each of the last {len(runs)} runs"
    return f"not needed in each of the last {len(runs)} runs (errors within torch's default tolerance)"


def stale_entries(store: Store, ledger: Ledger, *, n_runs: int = 3, target: str | None = None) -> list[StaleEntry]:
    """The ledger's entries that can go, judged on the last ``n_runs`` finished runs (of ``target``)."""
    runs = finished_runs(store, target=target, limit=n_runs)
    outcomes = {r["id"]: item_outcomes(store, r["id"]) for r in runs}
    found = [StaleEntry(e, entry_staleness(e, runs, outcomes)) for e in ledger.entries()]
    return [s for s in found if s.why]


def nice(x: float) -> float:
    """Round up to 1, 2 or 5 times a power of ten.

    >>> nice(0.013), nice(0.3), nice(7.0), nice(0.0)
    (0.02, 0.5, 10.0, 0.0)
    """
    if x <= 0:
        return 0.0
    e = math.floor(math.log10(x))
    for m in (1, 2, 5, 10):
        if m * 10**e >= x:
            return float(f"{m * 10**e:.1g}")
    return x


@dataclass(frozen=True)
class Proposal:
    """Tolerance overrides suggested by one run (TOML blocks), and the op x dtype pairs left out."""

    overrides: list[str]
    skipped: int
    max_rel: float

    def summary(self) -> str:
        return (f"# {len(self.overrides)} overrides proposed; {self.skipped} op x dtype pairs left out "
                f"(NaN/dtype/shape disagreement or relative error above {self.max_rel:g}: those are bugs, "
                "not tolerances)")


def propose_overrides(store: Store, run_id: str, *, max_rel: float = 0.1) -> Proposal:
    """Overrides for a run's op x dtype pairs beyond the default tolerance: only plain numeric
    drift (NaNs, dtypes and shapes agree; relative error at most ``max_rel``) is proposed, each
    to be reviewed before it is accepted. Raises ValueError for an unknown run."""
    run = store.get_run(run_id)
    if run is None:
        raise ValueError(f"{store.path or ':memory:'}: no run with id {run_id!r}")
    overrides: list[str] = []
    skipped = 0
    for r in tolerance_evidence(store, run_id):
        if not (r["nan_agree"] and r["dtype_ok"] and r["shape_ok"]) or (r["max_rel"] or 0) > max_rel:
            skipped += 1
            continue
        overrides.append(
            f'[[override]]\nop = "{r["op"]}"\ndtype = "{r["dtype"]}"\ntarget = "{run["target"]}"\n'
            f'atol = {nice(GROWTH * (r["max_abs"] or 0)):g}\nrtol = {nice(GROWTH * (r["max_rel"] or 0)):g}\n'
            f'reason = "proposed from run {run_id}: {r["n"]} of {r["total"]} samples beyond the default '
            f'(max abs {r["max_abs"]:.3g}, max rel {r["max_rel"]:.3g}); review before accepting"\n')
    return Proposal(overrides, skipped, max_rel)
