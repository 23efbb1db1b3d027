"""The status vocabulary: every status an item can have, and what each one means.

Statuses are stored data, so their vocabulary lives at the bottom floor, here, and everything
above imports it: the harness decides a status (``conformance.check.verdict.decide``), the gate ranks
them, the ledger accepts some, the report counts, orders and colours them (its CSS rules are
generated from :data:`INFO`). Adding a status is one entry in :class:`Status` and one in
:data:`INFO` (plus the rule in ``decide`` that chooses it).

Example::

    >>> from opdb.status import Status, worst, severity, FAILING
    >>> worst(["pass", "mismatch", "skip"])
    'mismatch'
    >>> severity("timeout") > severity("mismatch") > severity("pass_fallback") > severity("pass")
    True
    >>> Status.XPASS in FAILING, Status.XFAIL in FAILING
    (True, False)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal


class Status(StrEnum):
    """Every status, in the order tables and legends show them."""

    PASS = "pass"
    PASS_FALLBACK = "pass_fallback"
    XFAIL = "xfail"
    SKIP = "skip"
    STRUCTURAL = "structural"
    XPASS = "xpass"
    CONTRACT = "contract"
    UNSUPPORTED_DTYPE = "unsupported_dtype"
    UNSUPPORTED_LAYOUT = "unsupported_layout"
    UNSUPPORTED = "unsupported"
    MISMATCH = "mismatch"
    ERROR = "error"
    TIMEOUT = "timeout"
    CRASH = "crash"

    @property
    def passed(self) -> bool:
        return INFO[self].kind == "pass"

    @property
    def failed(self) -> bool:
        return INFO[self].kind == "fail"


Kind = Literal["pass", "neutral", "fail"]


@dataclass(frozen=True)
class StatusInfo:
    """What one status means.

    ``kind``: ``pass`` (the target is correct), ``fail`` (a finding), ``neutral`` (nothing to say:
    not compared, or a failure the ledger expects). ``severity``: how bad, for "got worse" (gate,
    diff); equal severities are not a regression. ``rank``: which status a cell holding several
    shows (the highest). ``colour``/``ink``: the badge's background and text colour.
    """

    kind: Kind
    severity: int
    rank: int
    colour: str
    ink: str
    meaning: str


INFO: dict[Status, StatusInfo] = {
    Status.PASS: StatusInfo("pass", 0, 3, "#2b7a3d", "#fff", "matches the CPU, every overload native"),
    Status.PASS_FALLBACK: StatusInfo("pass", 1, 4, "#8cc084", "#111",
                                     "matches the CPU, some overload fell back to the CPU"),
    Status.XFAIL: StatusInfo("neutral", 0, 2, "#b8bfc9", "#111", "fails as a ledger entry expects"),
    Status.SKIP: StatusInfo("neutral", 0, 0, "#e2e5ea", "#333",
                            "not compared: the CPU reference failed, or the sample is undefined"),
    # a custom op no reference is declared for (conformance.customops): torch.library.opcheck's
    # tests pass, but nothing says its values are right, so it is never counted as passing
    Status.STRUCTURAL: StatusInfo("neutral", 0, 1, "#cfe3ee", "#111",
                                  "checked structurally only: a custom op's opcheck tests pass, but no reference "
                                  "is declared for it, so its values are not checked"),
    Status.XPASS: StatusInfo("fail", 2, 5, "#f2d35b", "#111", "passes although a ledger entry expects a failure"),
    Status.CONTRACT: StatusInfo("fail", 3, 6, "#5fa8d3", "#111",
                                "values match the CPU, but a contract does not (out=, strides, aliasing, "
                                "non-contiguous inputs, variants, errors, determinism; a custom op's opcheck tests)"),
    Status.UNSUPPORTED_DTYPE: StatusInfo("fail", 3, 7, "#b79fd6", "#111", "the target rejects the dtype"),
    Status.UNSUPPORTED_LAYOUT: StatusInfo("fail", 3, 8, "#d6a0c4", "#111",
                                          "the target rejects an input's memory format or layout "
                                          "(channels_last, sparse, ...)"),
    Status.UNSUPPORTED: StatusInfo("fail", 3, 9, "#9f9fd6", "#111",
                                   "the target refuses the item before running it (an exporter cannot "
                                   "convert the sample; its reason is the error)"),
    Status.MISMATCH: StatusInfo("fail", 4, 10, "#ee8434", "#111", "runs, but differs from the CPU"),
    Status.ERROR: StatusInfo("fail", 4, 11, "#d1495b", "#fff", "raises where the CPU does not"),
    Status.TIMEOUT: StatusInfo("fail", 5, 12, "#8d1c2e", "#fff", "did not finish within the timeout"),
    Status.CRASH: StatusInfo("fail", 5, 13, "#4a0d17", "#fff", "killed its worker process"),
}

#: Every status name, in display order.
STATUSES: tuple[str, ...] = tuple(s.value for s in Status)
#: The target is correct.
PASSED = frozenset(s for s in Status if INFO[s].kind == "pass")
#: A finding: counted as failing everywhere (console, gate, coverage, report).
FAILING = frozenset(s for s in Status if INFO[s].kind == "fail")
#: Failing statuses a ledger xfail entry may accept (an xpass is the ledger's own finding).
EXPECTABLE: tuple[str, ...] = tuple(s.value for s in Status if s in FAILING and s is not Status.XPASS)
#: How bad a status is; higher is worse.
SEVERITY: dict[str, int] = {s.value: INFO[s].severity for s in Status}
#: Which status a cell shows when it holds several: the highest rank.
WORST_RANK: dict[str, int] = {s.value: INFO[s].rank for s in sorted(Status, key=lambda s: INFO[s].rank)}

_UNKNOWN_SEVERITY = SEVERITY[Status.ERROR]


def severity(status: str | None) -> int:
    """Severity of a status; unknown statuses count as errors, a missing one as -1."""
    if status is None:
        return -1
    return SEVERITY.get(status, _UNKNOWN_SEVERITY)


def worst(statuses: Iterable[str]) -> str | None:
    """The status a cell shows: the worst present (unknown statuses rank above crash)."""
    best, rank = None, -1
    for s in statuses:
        r = WORST_RANK.get(s, len(WORST_RANK))
        if r > rank:
            best, rank = s, r
    return best


def ordered(counts: dict[str, int]) -> list[tuple[str, int]]:
    """``(status, count)`` pairs in display order; unknown statuses last, by name."""
    known = [(s, counts[s]) for s in STATUSES if counts.get(s)]
    extra = sorted((s, n) for s, n in counts.items() if s not in SEVERITY and n)
    return known + extra


def css_rules() -> str:
    """The ``.st-<status>`` badge rules of the report, one per status."""
    return "".join(f".st-{s.value} {{ background: {INFO[s].colour}; color: {INFO[s].ink}; }}\n" for s in Status)


def _check() -> None:
    ranks = sorted(i.rank for i in INFO.values())
    if set(INFO) != set(Status) or ranks != list(range(len(Status))):
        raise AssertionError("opdb.status: INFO must describe every Status once, with distinct ranks 0..n-1")


_check()


#: The gate's finding categories that fail it: status regressions, and errors that grew (while
#: failing: ``worsened``, or while passing: ``drift``).
FAILS_GATE = ("regression", "worsened", "drift")
NUMERICS = ("worsened", "drift")  # findings about a group's error fingerprint, one per group


#: A confirmation re-run's status when it ended ``skip`` because the CPU reference did not agree
#: with itself (conformance.check.selfcheck.NOT_REPRODUCIBLE): the item has no reference to judge
#: the target by, so the gate calls its group neither confirmed nor flaky but unreproducible.
UNREPRODUCIBLE = "skip:unreproducible"
