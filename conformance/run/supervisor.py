"""Workers and their supervisor: groups of work run in isolated worker processes.

Workers are forked processes; each takes one group at a time and streams a "start" message
before every item and a row after it. The supervisor records rows in batches, turns a dead
worker into a ``crash`` row for the item in flight and a silent one into a ``timeout`` row
(after killing it), restarts the worker and continues the group after that item. One bad
sample never costs the others. What a group is and how it runs is its work kind's
(:mod:`conformance.run.kinds`); the supervisor only moves groups, rows and deaths.
"""

from __future__ import annotations

import collections
import contextlib
import multiprocessing as mp
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

import torch

from conformance.check.batching import BATCH_PHASE
from conformance.check.verdict import Status, decide_unrun
from conformance.select import SelectionError
from conformance.work import Group, ItemKey, Skip
from opdb import Store
from opdb.corpus import TABLE as CORPUS_TABLE
from opdb.store import now

from .executor import Sink, Summary, Work
from .isolation import read_output
from .kinds import TABLES, kind_of
from .progress import Eta, Pricer, Snapshot
from .spec import RunSpec


# -- worker side ---------------------------------------------------------------------------
def _worker(conn: Connection, spec: RunSpec, output: str, supervisor: int) -> None:
    from .isolation import Capture, die_with

    # die with the fork server (our parent) and with the supervisor, even while hung in an item
    boot = sys.modules.get("conformance.run._workerboot")  # loaded by the fork server we come from
    die_with(getattr(boot, "FORKSERVER_PID", None) or os.getppid(), supervisor)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor decides when to stop
    import faulthandler

    faulthandler.disable()  # a device fault is expected here and recorded as `crash`; no dump
    capture = Capture(output)  # what the worker prints goes with the item it ran, not to the console
    torch.set_num_threads(1)
    from conformance.targets import get_target

    try:
        target = get_target(spec.target, spec.build, spec.imports)
        config = spec.sweep_config()
    except Exception as exc:  # noqa: BLE001
        conn.send(("fatal", f"{type(exc).__name__}: {exc}"))
        return
    from conformance.check.execute import set_phase_hook

    set_phase_hook(lambda phase: conn.send(("phase", phase)))
    conn.send(("ready", target.describe()))

    def on_start(key: str) -> None:
        capture.next_item()
        conn.send(("start", key))

    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        group, skip = msg
        for row in kind_of(group).run(target, group, config, skip=skip, on_start=on_start):
            row["output"] = capture.take()
            conn.send(("row", row))
        capture.take()  # what came after the group's last item belongs to no item
        conn.send(("done", group.key))



# -- supervisor side -----------------------------------------------------------------------
def worker_context() -> Any:
    """Workers come from a fork server that has torch, the OpInfo db and the device package
    loaded but has never run autograd: forking the supervisor itself breaks once the calling
    process ran autograd on a device (its engine threads do not survive fork), and spawning
    from scratch costs seconds per worker restart."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["conformance.run._workerboot"])
    return ctx


def start_worker_server() -> None:
    import multiprocessing.forkserver
    import threading

    from .isolation import PDEATHSIG_ENV, SUPERVISOR_ENV

    # the fork server reads these when it starts (conformance.run._workerboot): it dies with us
    os.environ[SUPERVISOR_ENV] = str(os.getpid())
    os.environ[PDEATHSIG_ENV] = "1" if threading.current_thread() is threading.main_thread() else ""
    worker_context()
    try:
        multiprocessing.forkserver.ensure_running()
    except OSError as exc:  # its socket lives in TMPDIR: a deep TMPDIR cannot hold one
        if "too long" not in str(exc):
            raise
        raise SelectionError(f"TMPDIR {tempfile.gettempdir()!r} is too deep for the worker server's socket "
                             f"({exc}); set TMPDIR to a shorter directory, e.g. TMPDIR=/tmp") from None


#: A compiled batch may take this many item timeouts before its worker is killed (it compiles
#: up to ``--compile-batch`` samples' calls at once).
BATCH_TIMEOUT_FACTOR = 4


@dataclass
class _Slot:
    proc: Any
    conn: Connection
    group: Group | None = None
    seen: set[str] = field(default_factory=set)
    inflight: str | None = None
    since: float = 0.0
    ready: bool = False
    phase: str = ""
    assigned_at: float = 0.0
    output: str = ""  # the file the worker's fd 1 and 2 write to



class Supervisor:
    """The local :class:`~conformance.run.executor.Executor`: runs groups in worker processes.
    Rows go to ``sink(row, table)`` (by default the store's batched writers); ``work.only``
    restricts each group to chosen item keys (re-runs)."""

    def __init__(self, work: Work, store: Store | None, progress: Callable[[str], None] | None, *,
                 sink: Sink | None = None) -> None:
        spec, run_id, groups, history = work.spec, work.run_id, work.groups, work.history
        done, only, stage, corpus = work.done, work.only, work.stage, work.corpus
        self.spec, self.store, self.run_id = spec, store, run_id
        # group key -> its stored corpus entry (a schema_corpus row), sent with the group to replay
        self.corpus = corpus or {}
        # groups priced by what they took before (``history``: group key -> wall seconds), the
        # most expensive first: the slow tail starts early and the ETA prices it
        self.eta = Eta(Pricer(history or {}, {g.key: g.kind for g in groups}),
                       workers=max(1, min(spec.workers, len(groups) or 1)))
        self.queue = collections.deque(self.eta.schedule(groups))
        self.total_groups = len(groups)
        self.kind_total = collections.Counter(g.kind for g in groups)
        self.stage = stage
        self.group_times: list[dict[str, Any]] = []  # wall seconds of each group finished (opdb group_times)
        self.done = done
        self.only = only
        self.summary = Summary(run_id)
        self.progress = progress
        start_worker_server()  # (again: re-runs and canaries come here directly) ties it to us
        self.ctx = worker_context()
        self.writers = {t: store.writer(t) for t in TABLES} if store else {}
        self.sink = sink or (lambda row, table: self.writers[table].add(row))
        self.slots: list[_Slot] = []
        self.crash_safe: set[str] = set()  # schema groups whose CPU reference killed a worker
        self.unbatched: set[str] = set()  # groups whose compiled batch killed or hung a worker
        self.kind_done: collections.Counter[str] = collections.Counter()
        self.groups_done = 0
        self._last_progress = 0.0
        self._start = time.monotonic()

    # process management
    def _spawn(self, output: str | None = None) -> _Slot:
        if output is None:
            fd, output = tempfile.mkstemp(prefix="conformance-worker-", suffix=".out")
            os.close(fd)
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(target=_worker, args=(child, self.spec, output, os.getpid()), daemon=True)
        proc.start()
        child.close()
        return _Slot(proc, parent, output=output)

    def _kill(self, slot: _Slot) -> None:
        if slot.proc.is_alive():
            slot.proc.kill()
        slot.proc.join(5)
        slot.conn.close()

    def _retire(self, slot: _Slot) -> None:
        """The slot's worker is gone for good: its output file goes too."""
        if slot.output:
            with contextlib.suppress(OSError):
                os.unlink(slot.output)

    def _assign(self, slot: _Slot) -> None:
        if not self.queue:
            slot.group = None
            slot.conn.send(None)
            return
        group = self.queue.popleft()
        slot.group, slot.seen, slot.inflight, slot.assigned_at = group, set(), None, time.monotonic()
        slot.conn.send((group, self._skip(group, set())))

    def _skip(self, group: Group, seen: set[str]) -> Skip:
        batch = group.key not in self.unbatched
        if self.only is not None:
            return Skip(frozenset(seen), only=self.only.get(group.key, frozenset()), batch=batch)
        return Skip(frozenset(self.done.get(group.key, ())) | frozenset(seen),
                    crash_safe=group.key in self.crash_safe, replay=self.corpus.get(group.key), batch=batch)

    def _restart(self, slot: _Slot) -> _Slot:
        """Replace a dead or killed worker; it continues the same group after the bad item."""
        self._kill(slot)
        read_output(slot.output)  # what it printed after its last item belongs to none
        new = self._spawn(slot.output)
        new.group, new.seen, new.assigned_at = slot.group, slot.seen, slot.assigned_at
        return new

    def _record(self, row: dict[str, Any], table: str) -> None:
        self._corpus(row.pop("_corpus", None))
        row.update(run_id=self.run_id, shard=self.spec.shard, recorded_at=now())
        self.sink(row, table)
        self.summary.counts[row["status"]] += 1
        self.summary.items += 1
        self.summary.session_items += 1
        self.summary.op_time[row.get("op") or row.get("model_id") or "?"] += row.get("duration_s") or 0.0
        proof = row.get("proof") or {}
        graphs = proof.get("graphs")
        if graphs is not None:
            self.summary.compiler = True
            batch = proof.get("batch") if not (proof.get("batch") or {}).get("alone") else None
            # a batch's graph is every one of its items' proof: counted once, at its first sample
            self.summary.graphs += graphs if batch is None or batch.get("first") == row.get("sample") else 0
            self.summary.batched += batch is not None
            self.summary.uncompiled += graphs == 0

    def _corpus(self, side: dict[str, Any] | None) -> None:
        """A schema search's side record: counted; its new corpus entry stored (with the corpus on
        and a store: canaries and re-runs store none), replacing the overload's earlier one."""
        if side is None or not self.spec.corpus:
            return
        self.summary.corpus[side["how"]] += 1
        if side.get("why"):
            self.summary.corpus_why[side["why"]] += 1
        if side.get("entry") is not None and self.store is not None:
            self.store.insert(CORPUS_TABLE, [{**side["entry"], "run_id": self.run_id}], replace=True)

    def _synthetic(self, group: Group, key: str, status: Status, error: str, duration: float,
                   output: str | None = None) -> None:
        kind = kind_of(group)
        self._record({"item_key": key, **kind.synthetic_row(ItemKey.parse(key)), "status": status.value,
                      "error": error, "duration_s": duration, "output": output}, kind.table)

    def _resume_group(self, slot: _Slot) -> None:
        assert slot.group is not None
        slot.conn.send((slot.group, self._skip(slot.group, slot.seen)))

    # the loop
    def run(self) -> Summary:
        n = max(1, min(self.spec.workers, len(self.queue) or 1))
        self.slots = [self._spawn() for _ in range(n)]
        try:
            while any(s.proc is not None for s in self.slots):
                self._step()
                self._report()
        except KeyboardInterrupt:
            self.summary.interrupted = True
        finally:
            for s in self.slots:
                if s.proc is not None:
                    self._kill(s)
                self._retire(s)
            for w in self.writers.values():
                w.flush()
            self.summary.wall_s = time.monotonic() - self._start
            with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C while the last line is written
                self._report(force=True)
        return self.summary

    def _step(self) -> None:
        live = [s for s in self.slots if s.proc is not None]
        ready = wait([s.conn for s in live] + [s.proc.sentinel for s in live], timeout=0.5)
        for i, slot in enumerate(self.slots):
            if slot.proc is None:
                continue
            if slot.conn in ready:
                try:
                    while slot.conn.poll():
                        self._handle(i, slot.conn.recv())
                        slot = self.slots[i]
                        if slot.proc is None:
                            break
                except (EOFError, OSError):
                    self._died(i)
                    continue
            slot = self.slots[i]
            if slot.proc is not None and slot.proc.sentinel in ready and not slot.proc.is_alive():
                self._died(i)
            self._check_timeout(i)
        for w in self.writers.values():
            if time.monotonic() - w._since > 2.0:
                w.flush()

    def _handle(self, i: int, msg: tuple[str, Any]) -> None:
        slot = self.slots[i]
        kind, payload = msg
        if kind == "ready":
            slot.ready = True
            if slot.group is None:
                self._assign(slot)
            else:
                self._resume_group(slot)
        elif kind == "fatal":
            raise SelectionError(f"target {self.spec.target!r} could not start: {payload}")
        elif kind == "start":
            slot.inflight, slot.since, slot.phase = payload, time.monotonic(), ""
        elif kind == "phase":
            if payload == BATCH_PHASE or slot.phase == BATCH_PHASE:
                slot.since = time.monotonic()  # a batch has its own time limit, and the item after it too
            slot.phase = payload
        elif kind == "row":
            slot.seen.add(payload["item_key"])
            slot.inflight = None
            assert slot.group is not None
            self._record(payload, kind_of(slot.group).table)
        elif kind == "done":
            self.groups_done += 1
            if slot.group is not None:
                wall = time.monotonic() - slot.assigned_at
                self.kind_done[slot.group.kind] += 1
                self.eta.finish(slot.group, wall)
                self.group_times.append({"run_id": self.run_id, "shard": self.spec.shard, "group_key": slot.group.key,
                                         "kind": slot.group.kind, "wall_s": round(wall, 4)})
            self._assign(slot)
            if slot.group is None:
                slot.proc.join(10)
                slot.conn.close()
                slot.proc = None

    def _died(self, i: int) -> None:
        slot = self.slots[i]
        if slot.proc is None:
            return
        slot.proc.join(1)
        code = slot.proc.exitcode
        if slot.group is None and slot.inflight is None and not self.queue:
            slot.proc = None
            return
        if slot.inflight is not None and slot.phase == BATCH_PHASE:
            self._batch_failed(i)
            return
        if slot.inflight is not None:
            why = f"signal {-code} ({signal.Signals(-code).name})" if code is not None and code < 0 else f"exit code {code}"
            assert slot.group is not None
            output = read_output(slot.output)  # the dead worker's last words belong to the item
            crash_safe_kind = kind_of(slot.group).crash_safe_factor > 0
            if crash_safe_kind and slot.group.key not in self.crash_safe:
                # a generated input killed the worker: search again, pre-flighting each input's
                # CPU run in a forked child so one that crashes the reference is just rejected.
                # Also after a death in the target phase: a reference kernel that wrote out of
                # bounds often only aborts at a later free, during the target's run; blaming the
                # target needs the crash to survive the pre-flight.
                self.crash_safe.add(slot.group.key)
                slot.inflight = None
                self.slots[i] = self._restart(slot)
                return
            if crash_safe_kind and slot.phase != "cpu":
                # crash-safe already: this input ran on the target alone in a forked child and
                # survived, so the death after the reference ran is not the target's to own
                self._synthetic(slot.group, slot.inflight, decide_unrun("cpu"),
                                f"worker died ({why}) on the target after the CPU reference ran, but the same input "
                                "ran on the target alone without crashing: not attributed to the target",
                                time.monotonic() - slot.since, output)
            elif slot.phase == "cpu":  # the reference kernel itself died: the input is invalid, not the target
                self._synthetic(slot.group, slot.inflight, decide_unrun("cpu"),
                                f"CPU reference crashed ({why}); no verdict for the target", time.monotonic() - slot.since, output)
            else:
                self._synthetic(slot.group, slot.inflight, decide_unrun("target"),
                                f"process died during the item on the target: {why}", time.monotonic() - slot.since, output)
            slot.seen.add(slot.inflight)
            slot.inflight = None
        elif not slot.ready:
            last = (read_output(slot.output) or "").splitlines()[-1:]  # e.g. the exception that ended it
            raise SelectionError(f"worker for target {self.spec.target!r} died while starting (exit code {code})"
                                 + (f": {last[0].strip()[:300]}" if last else ""))
        self.slots[i] = self._restart(slot)

    def _batch_failed(self, i: int) -> None:
        """A compiled batch killed or hung the worker: no item is to blame (each sample still
        runs, on its own). The group continues in a new worker, unbatched, from the item that
        was about to run."""
        slot = self.slots[i]
        assert slot.group is not None
        self.unbatched.add(slot.group.key)
        read_output(slot.output)  # what the batch printed belongs to no item
        slot.inflight, slot.phase = None, ""
        self.slots[i] = self._restart(slot)

    def _check_timeout(self, i: int) -> None:
        slot = self.slots[i]
        if slot.proc is None or slot.inflight is None:
            return
        elapsed = time.monotonic() - slot.since
        # a crash-safe search forks twice per input: it gets a multiple of the item's time
        limit = self.spec.timeout_s * (kind_of(slot.group).crash_safe_factor
                                       if slot.group is not None and slot.group.key in self.crash_safe else 1)
        if slot.phase == BATCH_PHASE and elapsed > self.spec.timeout_s * BATCH_TIMEOUT_FACTOR:
            self._kill(slot)
            self._batch_failed(i)
            return
        if slot.phase != BATCH_PHASE and elapsed > limit:
            assert slot.group is not None
            self._kill(slot)
            self._synthetic(slot.group, slot.inflight,
                            decide_unrun("cpu" if slot.phase == "cpu" else "target", timed_out=True),
                            f"{'CPU reference: ' if slot.phase == 'cpu' else ''}no result after {limit:g} s; worker killed",
                            elapsed, read_output(slot.output))
            slot.seen.add(slot.inflight)
            slot.inflight = None
            self.slots[i] = self._restart(slot)

    def eta_s(self) -> float | None:
        """Seconds left (:class:`conformance.run.progress.Eta`): the queued and running groups at their
        calibrated prices, shared by the workers, never less than the longest one still to finish.
        None while there is nothing to price them by."""
        if not self.eta.ready():
            return None
        t = time.monotonic()
        running = [(s.group, t - s.assigned_at) for s in self.slots if s.proc is not None and s.group is not None]
        return self.eta.remaining(list(self.queue), running)

    def snapshot(self) -> Snapshot:
        return Snapshot(self.stage, dict(self.kind_done), dict(self.kind_total), self.summary.items,
                        self.summary.failures, time.monotonic() - self._start, self.eta_s())

    def _report(self, force: bool = False) -> None:
        if self.progress is None:
            return
        t = time.monotonic()
        if not force and t - self._last_progress < 2.0:
            return
        self._last_progress = t
        line = self.snapshot().line()
        # the stage's last line is written whatever the console's pace (Console.end)
        (getattr(self.progress, "end", self.progress) if force else self.progress)(line)
