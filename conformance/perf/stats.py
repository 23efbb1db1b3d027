"""Is the candidate slower? Paired, interleaved rounds and a bootstrap interval of their ratio.

A perf item is measured in rounds; in each round the baseline and the candidate each time the
same call ``reps`` times, one after the other (the order alternates from round to round, so a
machine that speeds up or slows down within a round favours neither). A round gives one paired
ratio: the candidate's median call time over the baseline's. Load that comes and goes between
rounds moves both sides of a pair together and cancels in the ratio.

The estimate is the median of the paired log-ratios, exponentiated; its interval is the
percentile bootstrap of that median (``resamples`` draws of the rounds with replacement, seeded by
the item, so the same timings always give the same interval). A **regression** is called only
when the whole interval lies above ``threshold`` (default 1.2: "at least 20% slower, with 95%
confidence"); an **improvement** when it lies below ``1 / threshold``; anything else is ``same``,
however far its estimate is from 1. The lane confirms every call with a fresh measurement before
it reports it (:mod:`conformance.perf.lane`).

Example::

    >>> from conformance.perf.stats import compare
    >>> base = [[10.0, 10.2, 9.9]] * 12
    >>> cand = [[13.0, 13.1, 12.9]] * 12
    >>> c = compare(base, cand, threshold=1.2, seed="mm")
    >>> round(c.ratio, 2), c.verdict
    (1.3, 'regression')
    >>> compare(base, base, seed="mm").verdict
    'same'
"""

from __future__ import annotations

import math
import random
import statistics
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

THRESHOLD = 1.2
CONFIDENCE = 0.95
RESAMPLES = 2000

VERDICTS = ("regression", "improvement", "same")


@dataclass(frozen=True)
class Comparison:
    """A candidate/baseline ratio with its interval and what it says."""

    ratio: float  # candidate / baseline (median of the paired round ratios)
    low: float
    high: float
    verdict: str  # regression | improvement | same
    rounds: int

    def as_dict(self) -> dict[str, float | str | int]:
        return {"ratio": self.ratio, "low": self.low, "high": self.high, "verdict": self.verdict,
                "rounds": self.rounds}


def percentile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile ``q`` in [0, 1] of ``xs`` (not empty)."""
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def round_ratios(base: Sequence[Sequence[float]], cand: Sequence[Sequence[float]]) -> list[float]:
    """Per round: log(candidate's median call time / baseline's)."""
    if len(base) != len(cand) or not base:
        raise ValueError(f"paired rounds expected, got {len(base)} baseline and {len(cand)} candidate rounds")
    return [math.log(statistics.median(c) / statistics.median(b)) for b, c in zip(base, cand, strict=True)]


def interval(logs: Sequence[float], *, confidence: float = CONFIDENCE, resamples: int = RESAMPLES,
             seed: str = "") -> tuple[float, float, float]:
    """(estimate, low, high) of the median ratio: the percentile bootstrap of the median of the
    paired log-ratios ``logs``, exponentiated; seeded by ``seed``."""
    rng = random.Random(zlib.crc32(seed.encode()))
    n = len(logs)
    meds = sorted(statistics.median(rng.choices(logs, k=n)) for _ in range(resamples))
    alpha = (1.0 - confidence) / 2.0
    return (math.exp(statistics.median(logs)), math.exp(percentile(meds, alpha)),
            math.exp(percentile(meds, 1.0 - alpha)))


def verdict(low: float, high: float, threshold: float = THRESHOLD) -> str:
    if low > threshold:
        return "regression"
    if high < 1.0 / threshold:
        return "improvement"
    return "same"


def compare(base: Sequence[Sequence[float]], cand: Sequence[Sequence[float]], *, threshold: float = THRESHOLD,
            confidence: float = CONFIDENCE, resamples: int = RESAMPLES, seed: str = "") -> Comparison:
    """The comparison of paired rounds of call times (``base[r]``, ``cand[r]``: round r's calls)."""
    ratio, low, high = interval(round_ratios(base, cand), confidence=confidence, resamples=resamples, seed=seed)
    return Comparison(ratio=ratio, low=low, high=high, verdict=verdict(low, high, threshold), rounds=len(base))


def undecided(c: Comparison, threshold: float = THRESHOLD) -> bool:
    """Whether more rounds could change the verdict: the interval straddles the threshold (or its
    inverse), whichever side of it the estimate lies on."""
    return c.low <= threshold < c.high or c.low < 1.0 / threshold <= c.high
