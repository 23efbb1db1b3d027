"""Status vocabulary of the report: display order, severity (for diffs) and "worst of a cell".

Example::

    >>> from reports.status import worst, severity
    >>> worst(["pass", "mismatch", "skip"])
    'mismatch'
    >>> severity("timeout") > severity("mismatch") > severity("pass_fallback") > severity("pass")
    True
"""

from __future__ import annotations

from collections.abc import Iterable

#: Every status, in the order tables and legends show them.
STATUSES = ("pass", "pass_fallback", "xfail", "skip", "xpass", "unsupported_dtype",
            "mismatch", "error", "timeout", "crash")

#: How bad a status is, for the build diff (worse / better).
SEVERITY = {"pass": 0, "xfail": 0, "skip": 0, "pass_fallback": 1, "xpass": 2, "unsupported_dtype": 3,
            "mismatch": 4, "error": 4, "timeout": 5, "crash": 5}

#: Which status a cell shows when it holds several: the last one present in this list.
_WORST_ORDER = ("skip", "xfail", "pass", "pass_fallback", "xpass", "unsupported_dtype",
                "mismatch", "error", "timeout", "crash")
WORST_RANK = {s: i for i, s in enumerate(_WORST_ORDER)}

FAILING = frozenset({"mismatch", "error", "timeout", "crash"})
PASSING = ("pass", "pass_fallback", "xfail", "skip")


def severity(status: str | None) -> int:
    """Severity of a status; unknown statuses count as errors, a missing one as -1."""
    if status is None:
        return -1
    return SEVERITY.get(status, 4)


def worst(statuses: Iterable[str]) -> str | None:
    """The status a cell shows: the worst present (unknown statuses rank above crash)."""
    best, rank = None, -1
    for s in statuses:
        r = WORST_RANK.get(s, len(_WORST_ORDER))
        if r > rank:
            best, rank = s, r
    return best


def ordered(counts: dict[str, int]) -> list[tuple[str, int]]:
    """``(status, count)`` pairs in display order; unknown statuses last, by name."""
    known = [(s, counts[s]) for s in STATUSES if counts.get(s)]
    extra = sorted((s, n) for s, n in counts.items() if s not in SEVERITY and n)
    return known + extra
