"""What the console shows while a run works: one progress bar per stage, and an ETA that prices
every group instead of averaging them.

A build's time is dominated by a slow tail — schema searches, model graphs, a few OpInfo groups
with slow reference kernels — so a mean over the groups finished so far says "33 s" for a build
that takes 20 minutes. Here each group has a **price**: the wall seconds the same group (op ×
dtype, same target) took in the latest earlier run that timed it (the previous build of the same
nightly, or last night), else the typical price of its kind. Prices are calibrated while the run
goes (per kind: measured / priced over the groups finished), and what is left is both shared
among the workers and bounded below by the longest single group still to finish — a slow group
started last cannot be split.

The run schedules the most expensive groups first (longest-processing-time first), which
shortens the run and leaves only cheap groups for the end, where an error in the estimate
matters least.

Example::

    >>> from conformance.work import Group
    >>> gs = [Group("slow", "float32"), Group("a", "float32"), Group("b", "float32")]
    >>> eta = Eta(Pricer({"slow|float32": 10.0, "a|float32": 1.0, "b|float32": 1.0}), workers=2)
    >>> [g.op for g in eta.schedule(gs)]
    ['slow', 'a', 'b']
    >>> eta.remaining(queued=gs, running=[])   # 12 s of work on 2 workers, but one group takes 10
    10.0
"""

from __future__ import annotations

import hashlib
import re
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TextIO

from conformance.work import Group

# Seconds per group of each kind on a 2-core machine when nothing earlier timed it (means over
# nightlies of the emulator: an OpInfo op × dtype runs all its variants, 0.9-1.4 s; a schema
# search runs the Hypothesis search of one overload; a model graph compiles and trains, 10-17 s).
PRIOR_S: Mapping[str, float] = {"opinfo": 1.0, "schema": 2.0, "model": 12.0}
# What the console calls each kind's work (the stages of a sweep).
TITLES: Mapping[str, str] = {"opinfo": "OpInfo", "schema": "schema search", "model": "models"}


@dataclass
class Pricer:
    """Seconds a group is expected to take: ``history`` (group key -> seconds measured in an
    earlier run of the same target), else the median history of its kind, else :data:`PRIOR_S`."""

    history: Mapping[str, float] = field(default_factory=dict)
    kinds: Mapping[str, str] = field(default_factory=dict)  # group key -> kind, for history's medians

    def __post_init__(self) -> None:
        by_kind: dict[str, list[float]] = {}
        for key, s in self.history.items():
            by_kind.setdefault(self.kinds.get(key, "opinfo"), []).append(s)
        self._typical = {k: statistics.median(v) for k, v in by_kind.items() if v}

    def price(self, group: Group) -> float:
        known = self.history.get(group.key)
        if known is not None:
            return max(known, 1e-3)
        return self._typical.get(group.kind, PRIOR_S.get(group.kind, 1.0))

    def known(self, group: Group) -> bool:
        return group.key in self.history


class Eta:
    """Seconds left in a run: prices calibrated by the groups finished so far.

    The dearest tenth of the groups (by price) is the run's slow tail; it is calibrated apart
    from the rest (a build that fails more pays more per item: its cheap groups slow down more
    than its dear ones) and spread over the first half of the schedule, so that both kinds of
    group finish early enough to calibrate, and no dear group starts last."""

    TAIL = 0.10  # share of the groups, by price, that is the slow tail
    PSEUDO = 16  # groups at their price that every calibration starts from

    def __init__(self, pricer: Pricer | None = None, workers: int = 1) -> None:
        self.pricer = pricer or Pricer()
        self.workers = max(1, workers)
        self.priced: Counter[tuple[str, ...]] = Counter()  # (kind,) and (kind, class) -> price finished
        self.took: Counter[tuple[str, ...]] = Counter()  # the same -> wall seconds they took
        self.count: Counter[tuple[str, ...]] = Counter()
        self.finished = 0
        self._known = 0  # groups of the run with a measured price
        self._total = 0
        self._tail_from = float("inf")  # price from which a group is in the slow tail

    def _class(self, group: Group) -> str:
        return "tail" if self.pricer.price(group) >= self._tail_from else "body"

    def schedule(self, groups: Iterable[Group]) -> list[Group]:
        """The groups to run, in order: the slow tail (dearest first) interleaved with the rest
        (in their given order) so that the tail has started by the middle of the run."""
        groups = list(groups)
        self._total = len(groups)
        self._known = sum(self.pricer.known(g) for g in groups)
        if self._known * 2 < self._total:
            # unpriced: a run's own order is by name and size (cheap graphs and ops first), so the
            # groups finished early would calibrate a biased price; a fixed shuffle samples fairly
            groups.sort(key=lambda g: hashlib.blake2b(g.key.encode(), digest_size=8).digest())
        by_price = sorted(groups, key=lambda g: -self.pricer.price(g))
        n_tail = max(1, int(len(groups) * self.TAIL)) if len(groups) > 1 else len(groups)
        tail = by_price[:n_tail]
        self._tail_from = self.pricer.price(tail[-1]) if tail else float("inf")
        in_tail = {id(g) for g in tail}
        body = [g for g in groups if id(g) not in in_tail]
        per = max(1, -(-len(body) // (2 * max(1, len(tail)))))  # body groups after each tail group
        out: list[Group] = []
        for i, g in enumerate(tail):
            out.append(g)
            out += body[i * per:(i + 1) * per]
        return out + body[len(tail) * per:]

    def finish(self, group: Group, wall_s: float) -> None:
        price = self.pricer.price(group)
        for key in ((group.kind,), (group.kind, self._class(group))):
            self.priced[key] += price
            self.took[key] += wall_s
            self.count[key] += 1
        self.finished += 1

    def _scale(self, group: Group) -> float:
        """Measured / priced over the finished groups like ``group`` (its kind and class, else its
        kind, else all), shrunk toward 1 as if ``PSEUDO`` more groups had taken their price: a
        few groups of a heavy-tailed kind (one OpInfo group of 60 s among 0.3 s ones) would
        otherwise swing the estimate several-fold."""
        for key in ((group.kind, self._class(group)), (group.kind,)):
            if self.count[key] >= 2 and self.priced[key] > 0:
                return self._shrunk(self.took[key], self.priced[key], self.count[key])
        kinds = [k for k in self.priced if len(k) == 1]
        priced = sum(self.priced[k] for k in kinds)
        n = sum(self.count[k] for k in kinds)
        return self._shrunk(sum(self.took[k] for k in kinds), priced, n) if priced > 0 else 1.0

    def _shrunk(self, took: float, priced: float, n: int) -> float:
        mean = priced / n
        return (took + self.PSEUDO * mean) / (priced + self.PSEUDO * mean)

    def cost(self, group: Group) -> float:
        return self.pricer.price(group) * self._scale(group)

    def ready(self) -> bool:
        """Whether an estimate means something yet: most groups have a measured price, or enough
        groups finished to calibrate the priors."""
        return (self._total > 0 and self._known * 2 >= self._total) or self.finished >= max(3, self._total // 50)

    def remaining(self, queued: Sequence[Group], running: Sequence[tuple[Group, float]]) -> float:
        """``queued`` groups not started, ``running`` (group, seconds it has run) in the workers.
        A group past its price is expected to run a while longer (a quarter of what it ran)."""
        left = [max(self.cost(g) - elapsed, 0.25 * elapsed) for g, elapsed in running]
        work = sum(left) + sum(self.cost(g) for g in queued)
        # a group cannot be split across workers: the last one to start bounds the end from below
        tail = max(left + [self.cost(g) for g in queued], default=0.0)
        return max(work / self.workers, tail)


# A line :meth:`Snapshot.line` writes (to tell progress from everything else in a console log).
LINE = re.compile(r"^\S.* \[[#-]+\] +\d+% .* · [\d,]+ items, [\d,]+ failing · \w+(, eta \w+)?( · \S.*)?$")


def duration(seconds: float) -> str:
    """``95`` -> ``1m35s``; ``4000`` -> ``1h06m``."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def bar(done: int, total: int, width: int = 20) -> str:
    filled = width if total <= 0 else min(width, done * width // total)
    return "[" + "#" * filled + "-" * (width - filled) + "]"


@dataclass
class Snapshot:
    """One state of a running stage, as the progress line shows it."""

    stage: str
    done: Mapping[str, int]  # kind -> groups finished
    total: Mapping[str, int]  # kind -> groups in the run
    items: int
    failing: int
    elapsed_s: float
    eta_s: float | None
    extra: str = ""  # what else the executor shows (Ray: nodes and tasks in flight)

    def line(self) -> str:
        done, total = sum(self.done.values()), sum(self.total.values())
        kinds = " · ".join(f"{TITLES.get(k, k)} {self.done.get(k, 0)}/{n}" for k, n in self.total.items() if n)
        eta = f", eta {duration(self.eta_s)}" if self.eta_s is not None else ""
        return (f"{self.stage} {bar(done, total)} {done * 100 // max(total, 1):>3}% {kinds} · {self.items:,} items, "
                f"{self.failing:,} failing · {duration(self.elapsed_s)}{eta}" + (f" · {self.extra}" if self.extra else ""))


class Reporter:
    """An executor's progress: ``snapshot()`` made into a line and written at most every
    ``every_s`` seconds; with ``force`` (the stage's last line) always, whatever the console's pace
    (:meth:`Console.end`). Nothing is made when there is no ``progress``."""

    def __init__(self, progress: Callable[[str], None] | None, snapshot: Callable[[], Snapshot],
                 every_s: float = 2.0) -> None:
        self.progress, self.snapshot, self.every_s = progress, snapshot, every_s
        self._last = 0.0

    def __call__(self, force: bool = False) -> None:
        if self.progress is None:
            return
        t = time.monotonic()
        if not force and t - self._last < self.every_s:
            return
        self._last = t
        line = self.snapshot().line()
        (getattr(self.progress, "end", self.progress) if force else self.progress)(line)


class Console:
    """Writes progress lines to a stream: on a terminal one line redrawn in place per stage; in a
    log (CI, a file) one line every ``every_s`` seconds, and the stage's last line always."""

    def __init__(self, stream: TextIO | None = None, every_s: float = 10.0) -> None:
        self._stream = stream
        self.every_s = every_s
        self._last = float("-inf")
        self._open = False

    @property
    def stream(self) -> TextIO:
        return self._stream or sys.stderr  # looked up when written: sys.stderr may be replaced

    @property
    def tty(self) -> bool:
        return bool(getattr(self.stream, "isatty", lambda: False)())

    def __call__(self, line: str) -> None:
        if self.tty:
            self.stream.write("\r\033[K" + line)
            self._open = True
        else:
            t = time.monotonic()
            if t - self._last < self.every_s:
                return
            self._last = t
            self.stream.write(line + "\n")
        self.stream.flush()

    def end(self, line: str) -> None:
        """The stage's final state: always written, and the terminal line is closed."""
        if self.tty:
            self.stream.write("\r\033[K" + line + "\n")
        else:
            self.stream.write(line + "\n")
        self._last = float("-inf")
        self._open = False
        self.stream.flush()
