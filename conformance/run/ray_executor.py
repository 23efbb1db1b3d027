"""The Ray executor: a run's groups as tasks of Ray actors on a Ray cluster, rows streamed back
to this process, which records them (the one writer).

How it runs. The driver (this process) starts one :class:`GroupRunner` actor per slot the
cluster has for ``--task-resources`` (default ``CPU=1``; ``neuron_cores=1`` places actors only on
nodes with a Neuron core, and Ray sets ``NEURON_RT_VISIBLE_CORES`` for each, which its worker
inherits), and hands each idle actor the next group, dearest first by the stored group times
(the local executor's schedule). An actor runs its group the local way: a
:class:`~conformance.run.supervisor.Supervisor` inside it keeps one isolated worker process per run
spec, alive across groups, so a crash costs one ``crash`` row, a hang one ``timeout`` row
(killed at the item timeout), with the same statuses and evidence as on this machine. The
actor's task is a Ray generator: it yields the rows in batches as they come (every 256 rows or a
quarter second), and the group's time at its end.

What is lost where. An actor that dies with its node (or is killed, or its process dies) is an
infrastructure event, never an item's verdict: its group goes back to the front of the queue
with the items already received skipped, and runs on another actor; the actor is replaced when
the cluster has room. A group lost :data:`MAX_LOSSES` times stops the run (as an interruption:
``--resume`` continues it). Interrupted (Ctrl-C, SIGTERM), the driver kills its actors (their
workers die with them) and flushes what it received; ``--resume`` runs the rest. Rows are
recorded only here, so nothing is recorded twice: a retried group skips what came.

The cluster. ``ray_address`` None starts a Ray here (``ray.init``, this machine's cores);
``"auto"`` joins the cluster ``ray start`` runs on this machine; an address joins that one. Each
node needs this package installed (the same version and torch) and the target's device. More
actors are started as nodes join; the console line shows nodes and tasks in flight.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import logging
import math
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance.select import SelectionError
from conformance.work import Group
from opdb.status import FAILING

from .executor import Recorder, Sink, Summary, Work
from .kinds import TABLES
from .progress import Eta, Pricer, Reporter, Snapshot
from .spec import RunSpec, parse_resources

try:
    import ray
    from ray import exceptions as ray_errors
except ImportError as exc:  # the optional extra
    raise SelectionError("--executor ray needs Ray, an optional extra: pip install -e '.[ray]' -c constraints.txt"
                         ) from exc

#: rows (or seconds) an actor's task collects before it yields them to the driver
BATCH_ROWS = 256
BATCH_S = 0.25
#: run specs an actor keeps a live worker for (a nightly's builds, their canaries); the oldest goes
HOSTS_PER_ACTOR = 4
#: times one group may lose its task to a dead actor or node before the run stops
MAX_LOSSES = 3
#: seconds between looks at the cluster's size (to start actors on nodes that joined)
SCALE_EVERY_S = 5.0
#: actors that may die while starting, before any started, until the run gives up (a node
#: without this package, or whose worker server cannot start, would otherwise be retried forever)
MAX_START_FAILURES = 3


# -- the actor side -------------------------------------------------------------------------
class _Host:
    """One run spec's worker inside an actor: a keep-alive local supervisor whose rows are relayed."""

    def __init__(self, spec: RunSpec) -> None:
        from .supervisor import Supervisor

        self.rows: list[tuple[dict[str, Any], str]] = []
        self.sup = Supervisor(Work(spec, "", ()), None, None, relay=lambda row, table: self.rows.append((row, table)),
                              keep_alive=True)

    def run(self, group: Group, done: frozenset[str], only: frozenset[str] | None,
            replay: dict[str, Any] | None, failed: frozenset[str] = frozenset(),
            ) -> Iterator[tuple[list[tuple[dict[str, Any], str]], dict[str, Any] | None]]:
        sup = self.sup
        sup.done = {group.key: set(done)}
        sup.failed = {group.key: set(failed)}
        sup.only = None if only is None else {group.key: only}
        sup.corpus = {group.key: replay} if replay is not None else {}
        finished = sup.feed(group)
        last = time.monotonic()
        while len(sup.group_times) == finished:
            sup._step()
            if self.rows and (len(self.rows) >= BATCH_ROWS or time.monotonic() - last >= BATCH_S):
                batch, self.rows = self.rows, []
                last = time.monotonic()
                yield batch, None
        batch, self.rows = self.rows, []
        yield batch, sup.group_times[-1]

    def close(self) -> None:
        self.sup.close()


def _node_local(spec: RunSpec) -> RunSpec:
    """The spec as this node runs it: one worker, and the CPU-side cache beside the database when
    this node sees that folder (one machine, a shared disk), else in this node's temp folder."""
    cache = spec.refcache
    if cache not in (None, "none", "auto") and not Path(cache).parent.is_dir():
        cache = str(Path(tempfile.gettempdir()) / "conformance-refcache" / Path(cache).name)
        Path(cache).parent.mkdir(parents=True, exist_ok=True)
    return spec.replace(workers=1, refcache=cache)


@ray.remote(max_restarts=0, max_task_retries=0)
class GroupRunner:
    """A Ray actor that runs the groups it is handed, one at a time (see the module docstring)."""

    def __init__(self) -> None:
        from .supervisor import start_worker_server

        self.hosts: collections.OrderedDict[RunSpec, _Host] = collections.OrderedDict()
        start_worker_server()  # its imports (torch, the OpInfo db, the device) start now, not at the first group

    def where(self) -> dict[str, Any]:
        ctx = ray.get_runtime_context()
        return {"node": ctx.get_node_id(), "pid": os.getpid(),
                "neuron_cores": os.environ.get("NEURON_RT_VISIBLE_CORES")}

    def run(self, spec: RunSpec, group: Group, done: frozenset[str], only: frozenset[str] | None,
            replay: dict[str, Any] | None, failed: frozenset[str] = frozenset()) -> Iterator[Any]:
        spec = _node_local(spec)
        host = self.hosts.pop(spec, None) or _Host(spec)
        self.hosts[spec] = host  # the most recent last
        while len(self.hosts) > HOSTS_PER_ACTOR:
            self.hosts.popitem(last=False)[1].close()
        yield from host.run(group, done, only, replay, failed)


# -- the driver side ------------------------------------------------------------------------
@dataclass
class _Lane:
    """One run's part of the queue: its work, and where its rows are recorded."""

    work: Work
    recorder: Recorder
    summary: Summary
    seen: dict[str, set[str]] = field(default_factory=lambda: collections.defaultdict(set))  # group key -> received
    failed: dict[str, set[str]] = field(default_factory=lambda: collections.defaultdict(set))  # of them, failing


@dataclass
class _Task:
    lane: int
    group: Group
    actor: Any
    gen: Any  # the ObjectRefGenerator of GroupRunner.run
    started: float


@dataclass
class _Actor:
    handle: Any
    ready: Any = None  # the ref of its where() call until it answered
    node: str | None = None
    task: _Task | None = None


#: Idle, started actors left by the runs of this process, by their options: the next run (a
#: run's canaries, then its sweep; a nightly's builds) takes them instead of starting new ones.
_IDLE: dict[str, list[_Actor]] = collections.defaultdict(list)


def connect(address: str | None) -> None:
    """Join (or start) Ray once per process: ``address`` None starts one on this machine."""
    if ray.is_initialized():
        return
    kw: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.WARNING, "configure_logging": True}
    if address is None:
        kw.update(num_cpus=os.cpu_count() or 1, include_dashboard=False)
    try:
        ray.init(address=address, **kw)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        where = f"--ray-address {address}" if address else "a local Ray"
        raise SelectionError(f"{where}: could not connect ({type(exc).__name__}: {str(exc).strip()[:300]})") from None


class RayExecutor:
    """The Ray :class:`~conformance.run.executor.Executor`. ``also``: more runs' work in the same
    queue (a nightly's builds); ``summaries`` holds each run's summary, ``work``'s first."""

    def __init__(self, work: Work, store: Any, progress: Callable[[str], None] | None, *,
                 sink: Sink | None = None, also: Sequence[Work] = ()) -> None:
        self.spec = work.spec
        self.resources = parse_resources(self.spec.task_resources)
        self.store, self.progress = store, progress
        self.writers = {t: store.writer(t) for t in TABLES} if store is not None else {}
        sink = sink or (lambda row, table: self.writers[table].add(row))
        self.lanes: list[_Lane] = []
        for w in (work, *also):
            summary = Summary(w.run_id)
            self.lanes.append(_Lane(w, Recorder(w.spec, w.run_id, store, sink, summary), summary))
        self.summaries = [lane.summary for lane in self.lanes]
        self.summary = self.summaries[0]
        self.stage = work.stage if not also else f"sweep {self.spec.target} " + "+".join(str(w.spec.build) for w in
                                                                                       (work, *also))
        # every run's groups in one queue, dearest first (as the local schedule), each tagged with its run
        tagged: dict[int, int] = {}
        groups: list[Group] = []
        history: dict[str, float] = {}
        for i, lane in enumerate(self.lanes):
            history.update(lane.work.history or {})
            for g in lane.work.groups:
                g = copy.copy(g)  # one object per run: the schedule tells runs apart by identity
                tagged[id(g)] = i
                groups.append(g)
        self.eta = Eta(Pricer(history, {g.key: g.kind for g in groups}), workers=1)
        self.queue: collections.deque[tuple[int, Group]] = collections.deque(
            (tagged[id(g)], g) for g in self.eta.schedule(groups))
        self.kind_total = collections.Counter(g.kind for g in groups)
        self.kind_done: collections.Counter[str] = collections.Counter()
        self.group_times: list[dict[str, Any]] = []
        self.actors: list[_Actor] = []
        self.losses: collections.Counter[tuple[int, str]] = collections.Counter()
        self.lost_tasks = 0
        self.started_actors = 0
        self.start_failures: list[str] = []
        self._start = time.monotonic()
        self._report = Reporter(progress, self.snapshot)
        self._last_scale = float("-inf")

    # -- actors
    def _capacity(self) -> int:
        """Actors the cluster's live nodes hold, at ``resources`` each."""
        total = ray.cluster_resources()
        fits = [math.floor(total.get(name, 0.0) / amount + 1e-9) for name, amount in self.resources.items() if amount > 0]
        return min(fits) if fits else len(ray.nodes())

    def _options(self) -> dict[str, Any]:
        res = dict(self.resources)
        opts: dict[str, Any] = {"num_cpus": res.pop("CPU", 1.0)}
        if "GPU" in res:
            opts["num_gpus"] = res.pop("GPU")
        if res:
            opts["resources"] = res
        return opts

    def _scale(self, force: bool = False) -> None:
        t = time.monotonic()
        if not force and t - self._last_scale < SCALE_EVERY_S:
            return
        self._last_scale = t
        busy = sum(a.task is not None for a in self.actors)
        want = min(self._capacity(), busy + len(self.queue))
        if not self.actors and want == 0 and self.queue:
            raise SelectionError(f"--task-resources {self.resources}: no node of the Ray cluster has them "
                                 f"(the cluster has {ray.cluster_resources()})")
        opts = self._options()
        idle = _IDLE[repr(sorted(opts.items()))]
        while len(self.actors) < want:
            if idle:
                self.actors.append(idle.pop())
                continue
            handle = GroupRunner.options(**opts).remote()
            self.actors.append(_Actor(handle, ready=handle.where.remote()))

    def _drop(self, actor: _Actor) -> None:
        with contextlib.suppress(Exception):
            ray.kill(actor.handle)
        if actor in self.actors:
            self.actors.remove(actor)
        self._last_scale = float("-inf")  # a replacement, where the cluster has room

    # -- tasks
    def _dispatch(self) -> None:
        for actor in self.actors:
            if not self.queue:
                return
            if actor.ready is not None or actor.task is not None:
                continue
            lane_i, group = self.queue.popleft()
            lane = self.lanes[lane_i]
            w = lane.work
            done = frozenset(w.done.get(group.key, ())) | frozenset(lane.seen.get(group.key, ()))
            failed = frozenset(w.failed.get(group.key, ())) | frozenset(lane.failed.get(group.key, ()))
            only = w.only.get(group.key, frozenset()) if w.only is not None else None
            replay = (w.corpus or {}).get(group.key)
            gen = actor.handle.run.remote(w.spec, group, done, only, replay, failed)
            actor.task = _Task(lane_i, group, actor, gen, time.monotonic())

    def _collect(self, timeout: float) -> None:
        waiting = {id(a.ready): a for a in self.actors if a.ready is not None}
        running = {id(a.task.gen): a.task for a in self.actors if a.task is not None}
        refs = [a.ready for a in waiting.values()] + [t.gen for t in running.values()]
        if not refs:
            time.sleep(min(timeout, 0.1))
            return
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
        if ready:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        for ref in ready:
            if id(ref) in waiting:
                actor = waiting[id(ref)]
                try:
                    actor.node = ray.get(actor.ready)["node"]
                    actor.ready = None
                    self.started_actors += 1
                except ray_errors.RayError as exc:  # it died before it started (its node went, or it could not)
                    self._drop(actor)
                    self.start_failures.append(f"{type(exc).__name__}: {str(exc).strip()[:500]}")
                    if not self.started_actors and len(self.start_failures) >= MAX_START_FAILURES:
                        raise SelectionError(f"Ray actors die while starting ({len(self.start_failures)} so far; is "
                                             "this package installed on every node?); the last: "
                                             f"{self.start_failures[-1]}") from None
            else:
                self._next(running[id(ref)])

    def _next(self, task: _Task) -> None:
        """Take what the task yielded next (or its end)."""
        try:
            rows, end = ray.get(next(task.gen))
        except StopIteration:  # ended without its last message: lost on the way
            self._lost(task, "the task ended without finishing its group")
            return
        except ray_errors.RayTaskError as exc:  # our code raised in the actor: not an infrastructure event
            cause = exc.cause if isinstance(getattr(exc, "cause", None), Exception) else None
            raise (cause or exc) from None
        except ray_errors.RayError as exc:  # the actor, its worker process or its node died
            self._lost(task, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
            return
        lane = self.lanes[task.lane]
        seen = lane.seen[task.group.key]
        for row, table in rows:
            seen.add(row["item_key"])
            if row.get("status") in FAILING:
                lane.failed[task.group.key].add(row["item_key"])
            lane.recorder.record(row, table)
        if end is not None:
            self._finished(task, end)

    def _finished(self, task: _Task, end: dict[str, Any]) -> None:
        lane = self.lanes[task.lane]
        wall = end["wall_s"]
        self.kind_done[task.group.kind] += 1
        self.eta.finish(task.group, wall)
        self.group_times.append({"run_id": lane.work.run_id, "shard": lane.work.spec.shard,
                                 "group_key": task.group.key, "kind": task.group.kind, "wall_s": wall})
        lane.seen.pop(task.group.key, None)
        lane.failed.pop(task.group.key, None)
        task.actor.task = None

    def _lost(self, task: _Task, why: str) -> None:
        """An infrastructure event: the group goes back to the front of the queue (what came is
        skipped), the actor is dropped."""
        key = (task.lane, task.group.key)
        self.losses[key] += 1
        self.lost_tasks += 1
        task.actor.task = None
        self._drop(task.actor)
        if self.losses[key] >= MAX_LOSSES:
            raise _Stop(f"group {task.group.key} lost its task {self.losses[key]} times (last: {why}); "
                        "the run stopped, resume it when the cluster is healthy")
        self.queue.appendleft((task.lane, task.group))

    # -- the loop
    def run(self) -> Summary:
        connect(self.spec.ray_address)
        stopped: str | None = None
        try:
            while self.queue or any(a.task is not None for a in self.actors):
                self._scale()
                self._dispatch()
                self._collect(0.5)
                for w in self.writers.values():
                    if time.monotonic() - w._since > 2.0:
                        w.flush()
                self._report()
        except KeyboardInterrupt:
            stopped = "interrupted"
        except _Stop as exc:
            stopped = str(exc)
        finally:
            if stopped is None:  # every actor is idle: the next run of this process takes them
                _IDLE[repr(sorted(self._options().items()))].extend(self.actors)
                self.actors = []
            self._stop_actors()
            for w in self.writers.values():
                w.flush()
            for s in self.summaries:
                s.wall_s = time.monotonic() - self._start
                s.interrupted = stopped is not None
            with contextlib.suppress(KeyboardInterrupt):
                self._report(force=True)
        if stopped and stopped != "interrupted" and self.progress is not None:
            self.progress(f"ray: {stopped}")
        return self.summary

    def _stop_actors(self) -> None:
        for a in list(self.actors):
            with contextlib.suppress(Exception):
                ray.kill(a.handle)
        self.actors.clear()

    # -- the console
    def eta_s(self) -> float | None:
        if not self.eta.ready():
            return None
        t = time.monotonic()
        running = [(a.task.group, t - a.task.started) for a in self.actors if a.task is not None]
        workers = max(1, sum(a.ready is None for a in self.actors))
        self.eta.workers = workers
        return self.eta.remaining([g for _, g in self.queue], running)

    def snapshot(self) -> Snapshot:
        nodes = len({a.node for a in self.actors if a.node})
        tasks = sum(a.task is not None for a in self.actors)
        extra = f"ray: {nodes} node{'s' if nodes != 1 else ''}, {tasks} task{'s' if tasks != 1 else ''} in flight"
        if self.lost_tasks:
            extra += f", {self.lost_tasks} lost and retried"
        return Snapshot(self.stage, dict(self.kind_done), dict(self.kind_total),
                        sum(s.items for s in self.summaries), sum(s.failures for s in self.summaries),
                        time.monotonic() - self._start, self.eta_s(), extra)


class _Stop(Exception):
    """The run cannot go on here (a group keeps losing its task)."""
