"""Workers and their supervisor: groups of work run in isolated worker processes.

Workers are forked processes; each takes one group at a time, names the item it starts (and
its phase) in memory shared with the supervisor (:class:`~conformance.run.isolation.Inflight`)
and sends each item's row as it finishes, before it names the next. The supervisor records rows
in batches, turns a dead worker into a ``crash`` row for the item in flight (it reads the dead
worker's pipe to its end first: an item whose row came is not in flight) and a silent one into a
``timeout`` row (after killing it), restarts the worker and continues the group after that
item. One bad sample never costs the others. What a group is and how it runs is its work kind's
(:mod:`conformance.run.kinds`); the supervisor only moves groups, rows and deaths.
"""

from __future__ import annotations

import collections
import contextlib
import multiprocessing as mp
import os
import select
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any, NamedTuple

import torch

from conformance.check.batching import BATCH_PHASE
from conformance.check.verdict import Status, decide_unrun
from conformance.select import SelectionError
from conformance.work import Group, ItemKey, Skip
from opdb import Store
from opdb.status import FAILING

from .executor import Recorder, Sink, Summary, Work
from .isolation import Inflight, new_output_file, read_output
from .kinds import TABLES, kind_of
from .progress import Eta, Pricer, Reporter, Snapshot
from .spec import RunSpec


# -- worker side ---------------------------------------------------------------------------
def _worker(conn: Connection, spec: RunSpec, output: str, supervisor: int, inflight: Inflight) -> None:
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
        target = get_target(spec.target, spec.build, spec.imports, spec.env)
        config = spec.sweep_config()
    except Exception as exc:  # noqa: BLE001
        conn.send(("fatal", f"{type(exc).__name__}: {exc}"))
        return
    from conformance.check.execute import set_phase_hook

    set_phase_hook(inflight.phase)
    conn.send(("ready", target.describe()))

    def announce(count: int, key: str) -> None:  # a key too long for the shared slot
        conn.send(("start", (count, key)))

    def on_start(key: str) -> None:
        capture.next_item()
        inflight.start(key, announce)

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
            conn.send(("row", row))  # sent (in the pipe) before the slot names the next item
        capture.take()  # what came after the group's last item belongs to no item
        inflight.clear()  # before "done": the next group's items are not this one's
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


#: How an item whose CPU reference killed its worker begins its error (no verdict for the target).
CPU_CRASHED = "CPU reference crashed"


def start_worker_server(target: str | None = None) -> None:
    """Start the fork server the workers come from, unless it runs. ``target``: the name of the
    target its workers will run, whose device package it imports ahead (None: every installed
    target's); a server started earlier keeps what it imported."""
    import multiprocessing.forkserver
    import threading

    from .isolation import PDEATHSIG_ENV, PRELOAD_ENV, SUPERVISOR_ENV

    # the fork server reads these when it starts (conformance.run._workerboot): it dies with us
    if target is not None:
        os.environ[PRELOAD_ENV] = target
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


#: The phases a worker's item goes through (the phase hook's names), as its shared slot stores them.
PHASES = ("", "cpu", "target", BATCH_PHASE)


@dataclass
class _Slot:
    proc: Any
    conn: Connection
    inflight: Inflight  # what the worker runs now, shared with it (kept across restarts)
    group: Group | None = None
    seen: set[str] = field(default_factory=set)
    ready: bool = False
    assigned_at: float = 0.0
    output: str = ""  # the file the worker's fd 1 and 2 write to
    long_key: tuple[int, str] | None = None  # the last item key too long for the slot (count, key)
    poller: Any = None  # polls conn alone: what Connection.poll does, without a selector per call

    def pending(self) -> bool:
        """Whether the worker sent something not read yet, or its end is closed (as ``conn.poll()``)."""
        return bool(self.poller.poll(0))


class _Item(NamedTuple):
    """The item a worker runs, as its slot says: key, phase, since (monotonic)."""

    key: str
    phase: str
    since: float



class Supervisor:
    """The local :class:`~conformance.run.executor.Executor`: runs groups in worker processes.
    Rows go to ``sink(row, table)`` (by default the store's batched writers); ``work.only``
    restricts each group to chosen item keys (re-runs).

    ``relay``: rows go to it as the workers made them, unstamped and uncounted (another process
    records them: the Ray executor's driver). ``keep_alive``: a worker whose queue is empty
    waits for more instead of exiting (:meth:`feed` adds a group); the Ray executor's tasks keep
    one such supervisor per run spec, so that a worker's start-up is paid once, not per group."""

    def __init__(self, work: Work, store: Store | None, progress: Callable[[str], None] | None, *,
                 sink: Sink | None = None, relay: Sink | None = None, keep_alive: bool = False) -> None:
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
        # group key -> its item keys recorded as failing (earlier sessions', then this one's)
        self.failed: dict[str, set[str]] = {g: set(keys) for g, keys in (work.failed or {}).items()}
        self.only = only
        self.summary = Summary(run_id)
        self.progress = progress
        start_worker_server(spec.target)  # (again: re-runs and canaries come here directly) ties it to us
        self.ctx = worker_context()
        self.writers = {t: store.writer(t) for t in TABLES} if store else {}
        self.sink = sink or (lambda row, table: self.writers[table].add(row))
        self.recorder = Recorder(spec, run_id, store, self.sink, self.summary)
        self.relay, self.keep_alive = relay, keep_alive
        self.slots: list[_Slot] = []
        self.crash_safe: set[str] = set()  # schema groups whose CPU reference killed a worker
        self.unbatched: set[str] = set()  # groups whose compiled batch killed or hung a worker
        self.kind_done: collections.Counter[str] = collections.Counter()
        self.groups_done = 0
        self._start = time.monotonic()
        self._report = Reporter(progress, self.snapshot)

    # process management
    def _spawn(self, output: str | None = None, inflight: Inflight | None = None) -> _Slot:
        if output is None:
            output = new_output_file()
        inflight = inflight or Inflight(self.ctx, PHASES, BATCH_PHASE)
        inflight.reset()  # the worker it was shared with is dead: nothing in flight
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(target=_worker, args=(child, self.spec, output, os.getpid(), inflight), daemon=True)
        proc.start()
        child.close()
        poller = select.poll()
        poller.register(parent.fileno(), select.POLLIN)
        return _Slot(proc, parent, inflight, output=output, poller=poller)

    def _kill(self, slot: _Slot) -> None:
        if slot.proc.is_alive():
            slot.proc.kill()
        slot.proc.join(5)
        slot.conn.close()

    def _drain(self, i: int) -> None:
        """Handle what the worker sent and is not handled yet (a dead one's last rows too)."""
        with contextlib.suppress(EOFError, OSError):  # the end of a dead worker's pipe
            while self.slots[i].proc is not None and self.slots[i].pending():
                self._handle(i, self.slots[i].conn.recv())

    def _current(self, slot: _Slot, *, dead: bool = False) -> _Item | None:
        """The item the slot's worker runs, or None: between items (its last item's row has
        come), or a live worker's slot read mid-write or its long key not come yet (see later).
        ``dead``: the worker is dead and its pipe read to the end, its slot final."""
        state = slot.inflight.read(settled=dead)
        if state is None or state[1] is None:
            return None
        count, key, phase, since = state
        if key == "":  # the key was sent instead: the message with this count
            key = slot.long_key[1] if slot.long_key and slot.long_key[0] == count else None
        if key is None or key in slot.seen:
            return None
        return _Item(key, phase, since)

    def _retire(self, slot: _Slot) -> None:
        """The slot's worker is gone for good: its output file goes too."""
        if slot.output:
            with contextlib.suppress(OSError):
                os.unlink(slot.output)

    def _assign(self, slot: _Slot) -> None:
        if not self.queue:
            slot.group = None
            if not self.keep_alive:
                slot.conn.send(None)
            return
        group = self.queue.popleft()
        slot.group, slot.seen, slot.assigned_at = group, set(), time.monotonic()
        slot.conn.send((group, self._skip(group, set())))

    def _skip(self, group: Group, seen: set[str]) -> Skip:
        batch = group.key not in self.unbatched
        if self.only is not None:  # a re-run: a traced group's signatures still come with it
            return Skip(frozenset(seen), only=self.only.get(group.key, frozenset()), batch=batch,
                        replay=self.corpus.get(group.key) if group.kind == "traced" else None)
        return Skip(frozenset(self.done.get(group.key, ())) | frozenset(seen),
                    crash_safe=group.key in self.crash_safe, replay=self.corpus.get(group.key), batch=batch,
                    failed=frozenset(self.failed.get(group.key, ())))

    def _restart(self, slot: _Slot) -> _Slot:
        """Replace a dead or killed worker; it continues the same group after the bad item."""
        self._kill(slot)
        read_output(slot.output)  # what it printed after its last item belongs to none
        new = self._spawn(slot.output, slot.inflight)
        new.group, new.seen, new.assigned_at = slot.group, slot.seen, slot.assigned_at
        return new

    def _record(self, row: dict[str, Any], table: str) -> None:
        if row.get("status") in FAILING:  # a restarted worker's walk reads it (Skip.failed)
            self.failed.setdefault(ItemKey.parse(row["item_key"]).group_key, set()).add(row["item_key"])
        (self.relay or self.recorder.record)(row, table)

    def _synthetic(self, group: Group, key: str, status: Status, error: str, duration: float,
                   output: str | None = None) -> None:
        kind = kind_of(group)
        self._record({"item_key": key, **kind.synthetic_row(ItemKey.parse(key)), "status": status.value,
                      "error": error, "duration_s": duration, "output": output}, kind.table)

    def _resume_group(self, slot: _Slot) -> None:
        assert slot.group is not None
        slot.conn.send((slot.group, self._skip(slot.group, slot.seen)))

    def feed(self, group: Group) -> int:
        """Queue one more group (``keep_alive``) and start it on an idle worker, starting one
        where none lives; returns how many groups had finished before it (its ``group_times``
        entry is the next one)."""
        self.queue.append(group)
        self.total_groups += 1
        if not self.slots:
            self.slots = [self._spawn() for _ in range(max(1, self.spec.workers))]
        for i, slot in enumerate(self.slots):
            if slot.proc is None:  # it died between groups
                with contextlib.suppress(OSError):
                    slot.conn.close()
                self.slots[i] = slot = self._spawn(slot.output or None, slot.inflight)
            if slot.ready and slot.group is None and self.queue:
                self._assign(slot)  # (a worker not ready yet takes it when it is)
        return len(self.group_times)

    def close(self) -> None:
        """End the workers (``keep_alive``: they wait for work) and remove their output files."""
        for s in self.slots:
            if s.proc is not None:
                self._kill(s)
                s.proc = None
            self._retire(s)

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
                    while slot.pending():
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
        if kind == "row":
            slot.seen.add(payload["item_key"])
            assert slot.group is not None
            self._record(payload, kind_of(slot.group).table)
        elif kind == "ready":
            slot.ready = True
            if slot.group is None:
                self._assign(slot)
            else:
                self._resume_group(slot)
        elif kind == "fatal":
            raise SelectionError(f"target {self.spec.target!r} could not start: {payload}")
        elif kind == "start":  # an item key too long for the shared slot: (count, key)
            slot.long_key = payload
        elif kind == "done":
            self.groups_done += 1
            if slot.group is not None:
                wall = time.monotonic() - slot.assigned_at
                self.kind_done[slot.group.kind] += 1
                self.eta.finish(slot.group, wall)
                self.group_times.append({"run_id": self.run_id, "shard": self.spec.shard, "group_key": slot.group.key,
                                         "kind": slot.group.kind, "wall_s": round(wall, 4)})
            self._assign(slot)
            if slot.group is None and not self.keep_alive:
                slot.proc.join(10)
                slot.conn.close()
                slot.proc = None

    def _died(self, i: int) -> None:
        slot = self.slots[i]
        if slot.proc is None:
            return
        slot.proc.join(1)
        code = slot.proc.exitcode
        self._drain(i)  # rows it sent before it died: their items are not in flight
        slot = self.slots[i]
        if slot.proc is None:  # its last message was its group's "done", and no group is left
            return
        item = self._current(slot, dead=True)
        if slot.group is None and item is None and not self.queue:
            slot.proc = None
            return
        if item is not None and item.phase == BATCH_PHASE:
            self._batch_failed(i)
            return
        if item is not None:
            why = f"signal {-code} ({signal.Signals(-code).name})" if code is not None and code < 0 else f"exit code {code}"
            assert slot.group is not None
            output = read_output(slot.output)  # the dead worker's last words belong to the item
            crash_safe_kind = kind_of(slot.group).crash_safe_factor > 0
            took = time.monotonic() - item.since
            if crash_safe_kind and slot.group.key not in self.crash_safe:
                # a generated input killed the worker: search again, pre-flighting each input's
                # CPU run in a forked child so one that crashes the reference is just rejected.
                # Also after a death in the target phase: a reference kernel that wrote out of
                # bounds often only aborts at a later free, during the target's run; blaming the
                # target needs the crash to survive the pre-flight.
                self.crash_safe.add(slot.group.key)
                self.slots[i] = self._restart(slot)
                return
            if crash_safe_kind and item.phase != "cpu":
                # crash-safe already: this input ran on the target alone in a forked child and
                # survived, so the death after the reference ran is not the target's to own
                self._synthetic(slot.group, item.key, decide_unrun("cpu"),
                                f"worker died ({why}) on the target after the CPU reference ran, but the same input "
                                "ran on the target alone without crashing: not attributed to the target",
                                took, output)
            elif item.phase == "cpu":  # the reference kernel itself died: the input is invalid, not the target
                self._synthetic(slot.group, item.key, decide_unrun("cpu"),
                                f"{CPU_CRASHED} ({why}); no verdict for the target", took, output)
            else:
                self._synthetic(slot.group, item.key, decide_unrun("target"),
                                f"process died during the item on the target: {why}", took, output)
            slot.seen.add(item.key)
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
        self.slots[i] = self._restart(slot)

    def _check_timeout(self, i: int) -> None:
        slot = self.slots[i]
        if slot.proc is None:
            return
        item = self._current(slot)
        if item is None:
            return
        elapsed = time.monotonic() - item.since
        # a crash-safe search forks twice per input: it gets a multiple of the item's time
        kind = kind_of(slot.group) if slot.group is not None else None
        limit = self.spec.timeout_s * (kind.crash_safe_factor if kind is not None and slot.group.key in self.crash_safe
                                       else 1) * (getattr(kind, "timeout_factor", 1) if kind is not None else 1)
        batch = item.phase == BATCH_PHASE
        if elapsed <= (self.spec.timeout_s * BATCH_TIMEOUT_FACTOR if batch else limit):
            return
        cpu_s = slot.inflight.cpu_seconds()
        slot.proc.kill()
        slot.proc.join(5)
        self._drain(i)  # a row that came meanwhile: that item ended in time
        slot = self.slots[i]
        if slot.proc is None:
            return
        if getattr(self._current(slot, dead=True), "key", None) != item.key:
            self.slots[i] = self._restart(slot)  # it moved on before it was killed: nobody's fault
        elif batch:
            self._batch_failed(i)
        else:
            assert slot.group is not None
            # the item's limit covers both sides: a target killed in its own phase is not shown to
            # be slow when the CPU reference took most of the time (a quadratic op on a large rung)
            cpu_side = item.phase == "cpu" or (item.phase == "target" and elapsed - cpu_s < limit / 2)
            why = (f"no result after {limit:g} s; worker killed" if item.phase != "target" or not cpu_side else
                   f"no result after {limit:g} s; worker killed in the target's phase, but the CPU reference "
                   f"took {cpu_s:.0f} s of it and the target under half the limit ({elapsed - cpu_s:.0f} s): "
                   "no verdict about the target")
            self._synthetic(slot.group, item.key, decide_unrun("cpu" if cpu_side else "target", timed_out=True),
                            f"{'CPU reference: ' if item.phase == 'cpu' else ''}{why}",
                            elapsed, read_output(slot.output))
            if cpu_side:  # no verdict, but a size ladder's walk must not climb past it (Skip.failed)
                self.failed.setdefault(slot.group.key, set()).add(item.key)
            slot.seen.add(item.key)
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
