"""The perf lane: a candidate build's op, model-graph and per-token decode latency against a
baseline build's, measured interleaved in one session, with a regression called only when its
interval says so.

**How one item is measured.** Two workers (:mod:`conformance.perf.worker`), one per build, build
the item's inputs from the same seed and warm it up. A calibration call sets ``reps``: enough
calls that one side's batch takes about :attr:`PerfSpec.round_s` (at least ``min_reps``). Then
``rounds`` rounds: in each, both workers time ``reps`` calls, in alternating order. Both workers
are pinned to one core (:attr:`PerfSpec.core`): the cores of a shared machine can differ in speed
by tens of percent for minutes at a time, and a pair measured on two cores measures that. Their
per-round medians pair up into ratios (:mod:`conformance.perf.stats`); while the interval
straddles the threshold (or its inverse), ten more rounds are measured with twice the calls, up to
``max_rounds`` (adaptive repetition: a 1.3x slowdown against a 1.2 threshold needs the interval
within about 8% of the estimate, which a loaded machine reaches only with more rounds). p50 and p99 are taken over every timed call of a side.

**Confirmation.** A regression or an improvement is measured again, afresh (new rounds on the
same inputs), and reported only if the second measurement calls it too; the row keeps both. A
call the second measurement does not repeat is stored as ``same`` with ``confirmed = 0``.

**What can go wrong with an item.** An item the baseline cannot run is ``skip`` (nothing to
compare with); one only the candidate cannot run is ``error``; a call that kills a worker is
``crash`` and one that does not return within ``timeout_s`` is ``timeout`` (the worker is
killed); the worker is restarted and the run goes on.

**A run** is stored as it goes (``perf_runs``, ``perf_results``): interrupted (Ctrl-C, SIGTERM),
it is marked ``interrupted`` and ``--resume RUN`` measures only the items it lacks, with the
options it was started with.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from conformance.run.isolation import how_it_ended
from opdb import Store
from opdb import perf as db

from . import stats
from .decode import DTYPES as DECODE_DTYPES
from .items import SIZE_LABELS, PerfItem

START_TIMEOUT_S = 300.0  # a worker's start: torch, the target, its build


class PerfError(ValueError):
    """Bad perf options, or a run that cannot be resumed."""


@dataclass(frozen=True)
class PerfSpec:
    """What a perf run measures and how (stored with the run: ``--resume`` uses it again)."""

    target: str = "neuron-emu"
    build: str | None = None
    baseline_build: str | None = None  # None: the candidate's own build (an A/A run)
    ops: tuple[str, ...] = ()  # OpInfo globs
    dtypes: tuple[str, ...] = ("float32",)
    models: tuple[str, ...] = ()  # model families or ids (float32, eager inference)
    model_limit: int | None = 2  # graphs per family
    sizes: tuple[str, ...] = SIZE_LABELS
    decode: tuple[str, ...] = ()  # causal LMs (hf, hf@K/N, ids): one decode step per bucket, in --dtypes
    buckets: tuple[int, ...] = ()  # prompt lengths of the decode items (empty: generation.toml's)
    threshold: float = stats.THRESHOLD
    confidence: float = stats.CONFIDENCE
    rounds: int = 10
    max_rounds: int = 60
    round_s: float = 0.002
    min_reps: int = 5
    max_reps: int = 2000
    confirm: bool = True
    timeout_s: float = 60.0
    env: tuple[str, ...] = ()
    cpu: int | None = None  # the core both workers are pinned to (None: the last this process may use)

    def __post_init__(self) -> None:
        if not self.threshold > 1.0:
            raise PerfError(f"--threshold {self.threshold}: a ratio above 1 (e.g. 1.2: 20% slower)")
        if not 0.5 <= self.confidence < 1.0:
            raise PerfError(f"--confidence {self.confidence}: a level in [0.5, 1), e.g. 0.95")
        if self.rounds < 5 or self.max_rounds < self.rounds:
            raise PerfError(f"--rounds {self.rounds} (max {self.max_rounds}): at least 5, at most max_rounds")
        bad = [s for s in self.sizes if s not in SIZE_LABELS]
        if bad:
            raise PerfError(f"--sizes {bad[0]!r}: one of {', '.join(SIZE_LABELS)}")
        if not self.ops and not self.models and not self.decode:
            raise PerfError("nothing to measure: give --ops GLOB, --models NAME and/or --decode LM")
        if any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in self.buckets):
            raise PerfError(f"--buckets {','.join(map(str, self.buckets))}: prompt lengths >= 1")
        if self.decode and not set(self.dtypes) & set(DECODE_DTYPES):
            raise PerfError(f"--decode measures {' and '.join(DECODE_DTYPES)}; --dtypes {','.join(self.dtypes)} "
                            "gives neither")
        if self.cpu is not None and hasattr(os, "sched_getaffinity") and self.cpu not in os.sched_getaffinity(0):
            raise PerfError(f"--cpu {self.cpu}: not a core this process may run on "
                            f"({', '.join(map(str, sorted(os.sched_getaffinity(0))))})")

    @property
    def core(self) -> int | None:
        """The core the workers run on (both on the same one: two cores of a shared machine can
        differ in speed by tens of percent for minutes, and a pair split across them measures that)."""
        if self.cpu is not None:
            return self.cpu
        return max(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None

    @property
    def baseline(self) -> str | None:
        return self.baseline_build if self.baseline_build not in (None, "") else self.build

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> PerfSpec:
        d = json.loads(text)
        for k in ("ops", "dtypes", "models", "sizes", "env", "decode", "buckets"):  # the last two: absent before decode items
            d[k] = tuple(d.get(k) or ())
        return cls(**d)


@dataclass
class PerfResult:
    run_id: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    interrupted: bool = False
    skipped_pairs: list[tuple[str, str, str]] = field(default_factory=list)

    def findings(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r.get("verdict") in ("regression", "improvement")]

    @property
    def regressions(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r.get("verdict") == "regression"]


class _Died(Exception):
    """The worker ``side`` died (its pipe closed)."""

    def __init__(self, side: Side) -> None:
        super().__init__(side.role)
        self.side = side


class _Hung(Exception):
    """The worker ``side`` did not answer in time."""

    def __init__(self, side: Side) -> None:
        super().__init__(side.role)
        self.side = side


class Side:
    """One worker process holding one build."""

    def __init__(self, role: str, spec: PerfSpec, build: str | None) -> None:
        self.role, self.spec, self.build_asked = role, spec, build
        self.proc: Any = None
        self.conn: Any = None
        self.build = build or "-"
        self.describe: dict[str, Any] = {}

    def start(self) -> None:
        # A fresh interpreter (``python -m conformance.perf.worker``) on one end of a socket pair:
        # nothing of this process (its threads, its __main__) is inherited.
        ours, theirs = socket.socketpair()
        core = self.spec.core
        cmd = [sys.executable, "-m", "conformance.perf.worker", str(theirs.fileno()), self.spec.target,
               self.build_asked or "", json.dumps(list(self.spec.env)), "" if core is None else str(core)]
        self.proc = subprocess.Popen(cmd, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        theirs.close()
        self.conn = Connection(ours.detach())
        hello = self._reply(START_TIMEOUT_S)
        if "error" in hello:
            self.stop()
            raise PerfError(f"the {self.role} worker ({self.spec.target} {self.build_asked or '-'}) cannot start: "
                            f"{hello['error']}")
        self.build, self.describe = hello["build"], hello.get("describe", {})

    def _reply(self, timeout: float) -> dict[str, Any]:
        if not self.conn.poll(timeout):
            raise _Hung(self)
        try:
            return self.conn.recv()
        except (EOFError, OSError) as exc:
            raise _Died(self) from exc

    def ask(self, msg: tuple[Any, ...], timeout: float) -> dict[str, Any]:
        try:
            self.conn.send(msg)
        except (BrokenPipeError, OSError) as exc:
            raise _Died(self) from exc
        return self._reply(timeout)

    def how_it_died(self) -> str:
        return how_it_ended(self.proc)

    def restart(self) -> None:
        self.stop()
        self.start()

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(Exception):
                self.conn.send(("stop",))
            try:
                self.proc.wait(2)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        with contextlib.suppress(Exception):
            self.conn.close()
        self.proc = None


def select_items(spec: PerfSpec) -> tuple[list[PerfItem], list[tuple[str, str, str]]]:
    """The run's items (ops first, then models, then decode steps) and the op (or causal LM) x
    dtype pairs that have none."""
    from conformance.select import select_ops

    from .items import model_items, op_items

    items: list[PerfItem] = []
    none: list[tuple[str, str, str]] = []
    if spec.ops:
        got, none = op_items(select_ops(spec.ops), spec.dtypes)
        items.extend(i for i in got if i.shape in spec.sizes)
    if spec.models:
        from conformance.models.selection import model_groups

        ids = list(dict.fromkeys(g.key.split("|", 1)[0] for g in model_groups(spec.models, ["float32"],
                                                                               limit=spec.model_limit)))
        items.extend(model_items(ids))
    if spec.decode:
        from conformance.datafiles import generation
        from conformance.generate.lms import select

        from .decode import decode_items

        got, lm_none = decode_items(select(spec.decode, option="--decode"), spec.dtypes,
                                    tuple(sorted(spec.buckets)) or generation().buckets)
        items.extend(got)
        none = [*none, *lm_none]
    return items, none


def _summary(times: Sequence[float]) -> tuple[float, float]:
    return stats.percentile(times, 0.5), stats.percentile(times, 0.99)


class _Measurer:
    def __init__(self, spec: PerfSpec, base: Side, cand: Side) -> None:
        self.spec, self.base, self.cand = spec, base, cand

    def _round(self, r: int, reps: int) -> tuple[list[float], list[float]]:
        t = self.spec.timeout_s
        first, second = (self.base, self.cand) if r % 2 == 0 else (self.cand, self.base)
        a = self._times(first, reps, t)
        b = self._times(second, reps, t)
        return (a, b) if first is self.base else (b, a)

    @staticmethod
    def _times(side: Side, reps: int, timeout: float) -> list[float]:
        reply = side.ask(("time", reps), timeout)
        if "error" in reply:
            raise RuntimeError(f"{side.role}: {reply['error']}")
        return reply["times"]

    def measure(self, key: str, reps: int, start_round: int = 0
                ) -> tuple[stats.Comparison, list[list[float]], list[list[float]], int]:
        """Paired rounds until the verdict is settled: the comparison, both sides' rounds, and the
        calls per round it ended with (doubled with each extension: a round's median of more calls
        is steadier)."""
        s = self.spec
        base_rounds: list[list[float]] = []
        cand_rounds: list[list[float]] = []
        r = start_round
        want = s.rounds
        while True:
            while len(base_rounds) < want:
                b, c = self._round(r, reps)
                base_rounds.append(b)
                cand_rounds.append(c)
                r += 1
            comp = stats.compare(base_rounds, cand_rounds, threshold=s.threshold, confidence=s.confidence, seed=key)
            if not stats.undecided(comp, s.threshold) or want >= s.max_rounds:
                return comp, base_rounds, cand_rounds, reps
            want = min(want + 10, s.max_rounds)
            reps = min(reps * 2, s.max_reps)


class Lane:
    """Runs a :class:`PerfSpec` into a store."""

    def __init__(self, spec: PerfSpec, store: Store, *, progress: Callable[[str], None] | None = None) -> None:
        self.spec, self.store = spec, store
        self.progress = progress or (lambda line: None)
        self.base = Side("baseline", spec, spec.baseline)
        self.cand = Side("candidate", spec, spec.build)

    def run(self, run_id: str | None = None, *, resume: bool = False) -> PerfResult:
        from .worker import machine

        spec = self.spec
        items, none = select_items(spec)
        started = machine()
        self.base.start()
        try:
            self.cand.start()
            if run_id is None:
                run_id = f"perf-{self.cand.build}-vs-{self.base.build}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
            if not resume:
                import torch

                db.start(self.store, {"id": run_id, "target": spec.target, "build": self.cand.build,
                                      "baseline_build": self.base.build, "torch_version": torch.__version__,
                                      "host": started["host"],
                                      "machine": json.dumps({"start": started, "core": spec.core}),
                                      "config": spec.to_json()})
            result = PerfResult(run_id=run_id, skipped_pairs=none)
            have = db.done(self.store, run_id) if resume else set()
            todo = [i for i in items if i.key not in have]
            self.progress(f"perf {run_id}: {len(todo)} items ({len(have)} already measured), "
                          f"{spec.target} {self.cand.build} against {self.base.build}")
            t_start = time.monotonic()
            try:
                for n, item in enumerate(todo, 1):
                    row = self.item(run_id, item)
                    db.record(self.store, [row])
                    result.rows.append(row)
                    self._tell(n, len(todo), row, t_start)
            except KeyboardInterrupt:
                result.interrupted = True
                db.finish(self.store, run_id, "interrupted", {"start": started, "end": machine(), "core": spec.core})
                return result
            db.finish(self.store, run_id, "finished", {"start": started, "end": machine(), "core": spec.core})
            return result
        finally:
            self.cand.stop()
            self.base.stop()

    def _tell(self, n: int, total: int, row: dict[str, Any], t_start: float) -> None:
        interesting = row["status"] != "ok" or row.get("verdict") != "same" or row.get("confirmed") == 0
        if n == 1 or interesting or n % 25 == 0 or n == total:
            spent = time.monotonic() - t_start
            eta = spent / n * (total - n)
            what = (f"{row['verdict']} x{row['ratio']:.2f} [{row['low']:.2f}, {row['high']:.2f}]"
                    + (" (unconfirmed)" if row.get("confirmed") == 0 else "")
                    if row["status"] == "ok" else f"{row['status']}: {row.get('error') or ''}"[:160])
            self.progress(f"[{n}/{total}] {row['item_key']} {what}  (ETA {eta:.0f} s)")

    def item(self, run_id: str, item: PerfItem) -> dict[str, Any]:
        t0 = time.monotonic()
        row: dict[str, Any] = {"run_id": run_id, "item_key": item.key, "kind": item.kind, "subject": item.subject,
                               "dtype": item.dtype, "shape": item.shape, "signature": item.signature}
        try:
            rb = self.base.ask(("prepare", item.as_dict()), self.spec.timeout_s)
            rc = self.cand.ask(("prepare", item.as_dict()), self.spec.timeout_s)
            if "error" in rb:
                return {**row, "status": "skip", "error": f"the baseline cannot run it: {rb['error']}",
                        "wall_s": time.monotonic() - t0}
            if "error" in rc:
                return {**row, "status": "error", "error": rc["error"], "wall_s": time.monotonic() - t0}
            if rb["signature"] != rc["signature"] or (item.signature and rc["signature"] != item.signature):
                return {**row, "status": "skip", "wall_s": time.monotonic() - t0,
                        "error": f"the inputs differ: baseline {rb['signature']}, candidate {rc['signature']}, "
                                 f"selected {item.signature}"}
            row["reached"] = json.dumps(rc["reached"])
            m = _Measurer(self.spec, self.base, self.cand)
            probe = _Measurer._times(self.base, 3, self.spec.timeout_s)
            per_call = max(statistics.median(probe), 1e-7)
            reps = int(min(self.spec.max_reps, max(self.spec.min_reps, math.ceil(self.spec.round_s / per_call))))
            first, b1, c1, reps = m.measure(item.key, reps)
            all_b = [t for r in b1 for t in r]
            all_c = [t for r in c1 for t in r]
            row.update(first_ratio=first.ratio, first_low=first.low, first_high=first.high)
            final, rounds = first, first.rounds
            if first.verdict != "same" and self.spec.confirm:
                again, b2, c2, reps = m.measure(item.key + "|confirm", reps, start_round=first.rounds)
                all_b += [t for r in b2 for t in r]
                all_c += [t for r in c2 for t in r]
                rounds += again.rounds
                if again.verdict == first.verdict:
                    final, row["confirmed"] = again, 1
                else:
                    final = stats.Comparison(again.ratio, again.low, again.high, "same", again.rounds)
                    row["confirmed"] = 0
            p50, p99 = _summary(all_c)
            bp50, bp99 = _summary(all_b)
            row.update(status="ok", ratio=final.ratio, low=final.low, high=final.high, verdict=final.verdict,
                       rounds=rounds, reps=reps, p50=p50, p99=p99, base_p50=bp50, base_p99=bp99,
                       load=round(os.getloadavg()[0], 2))
        except _Hung as exc:
            exc.side.restart()
            what = f"the {exc.side.role}'s call did not return within {self.spec.timeout_s:g} s"
            row.update(status="timeout" if exc.side is self.cand else "skip",
                       error=what if exc.side is self.cand else f"the baseline cannot run it: {what}")
        except _Died as exc:
            how = exc.side.how_it_died()
            exc.side.restart()
            what = f"the {exc.side.role}'s worker died ({how})"
            row.update(status="crash" if exc.side is self.cand else "skip",
                       error=what if exc.side is self.cand else f"the baseline cannot run it: {what}")
        except RuntimeError as exc:  # an error while timing (a defect that fires later)
            row.update(status="error", error=str(exc)[:500])
        row["wall_s"] = time.monotonic() - t0
        return row


def run_perf(spec: PerfSpec, store: Store, *, progress: Callable[[str], None] | None = None,
             resume: str | None = None) -> PerfResult:
    """Measure ``spec`` into ``store`` (``resume``: continue that interrupted run with its own spec)."""
    if resume:
        run = db.get_run(store, resume)
        if run is None:
            raise PerfError(f"--resume {resume}: no perf run with that id in {store.path}")
        if run["status"] == "finished":
            raise PerfError(f"--resume {resume}: that run finished; nothing to resume")
        spec = PerfSpec.from_json(run["config"])
    lane = Lane(spec, store, progress=progress)
    return lane.run(resume, resume=bool(resume))
