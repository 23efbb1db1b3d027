"""A run: select work -> execute in isolated worker processes -> record into opdb.

Workers are forked processes; each takes one (OpInfo, dtype) group at a time and streams a
"start" message before every item and a row after it. The supervisor records rows in batches,
turns a dead worker into a ``crash`` row for the item in flight and a silent one into a
``timeout`` row (after killing it), restarts the worker and continues the group after that
item. One bad sample never costs the others. A run interrupted at any point (even kill -9)
resumes with ``--resume RUN_ID``: recorded item keys are skipped, nothing is run twice.
"""

from __future__ import annotations

import collections
import contextlib
import json
import math
import multiprocessing as mp
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import torch

from opdb import Store
from opdb.store import now

from . import datafiles
from .isolation import read_output
from .ledger import Ledger
from .select import VARIANTS, Group, SelectionError, parse_dtypes, parse_shard, select_groups, shard_of
from .sweep import SweepConfig, run_group
from .verdict import FAILING, Status, decide_unrun


@dataclass(frozen=True)
class RunSpec:
    target: str = "neuron-emu"
    build: str | None = None
    ops: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ()
    thorough: bool = False
    workers: int = 2
    shard: str = "1/1"
    timeout_s: float = 60.0
    seed: int | None = None
    max_samples: int | None = None
    ledger: str | None = None
    run_id: str | None = None  # join/label a run explicitly (shards of one run share it)
    variants: tuple[str, ...] = VARIANTS
    opinfo: bool = True  # the OpInfo sweep
    schema: bool = False  # schema-driven inputs for overloads no OpInfo reaches
    models: tuple[str, ...] = ()  # model families ("all" for every family)
    model_limit: int | None = None  # at most this many graphs per family
    model_modes: tuple[str, ...] = ("eager", "compile")

    def __post_init__(self) -> None:
        # Checked up front, before a database is opened: a bad value writes nothing. A NaN or
        # infinite timeout would disable the timeout; zero or fewer samples would run nothing.
        t = self.timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            raise SelectionError(f"--timeout {t!r}: must be a finite number of seconds above 0 (e.g. 60)")
        for name, value in (("--max-samples", self.max_samples), ("--model-limit", self.model_limit)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise SelectionError(f"{name} {value!r}: must be a whole number of at least 1 (or left out for all)")
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            raise SelectionError(f"--workers {self.workers!r}: must be a whole number of at least 1")
        parse_shard(self.shard)
        parse_dtypes(self.dtypes)

    def sweep_config(self) -> SweepConfig:
        kw: dict[str, Any] = {"thorough": self.thorough, "max_samples": self.max_samples,
                              "ledger": Ledger.load(self.ledger), "variants": tuple(self.variants),
                              "model_modes": tuple(self.model_modes)}
        if self.seed is not None:
            kw["seed"] = self.seed
        return SweepConfig(**kw)


@dataclass
class Summary:
    run_id: str
    infra: str | None = None  # why the canaries failed, when they did
    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    op_time: collections.Counter[str] = field(default_factory=collections.Counter)
    wall_s: float = 0.0
    items: int = 0  # the whole run (this shard), earlier sessions of a resumed run included
    session_items: int = 0  # of which run in this session
    interrupted: bool = False
    graphs: int = 0  # graphs a compiler target compiled (this session)
    uncompiled: int = 0  # items of a compiler target that compiled none (this session)
    compiler: bool = False  # some item carried a compiler's proof

    @property
    def failures(self) -> int:
        return sum(n for s, n in self.counts.items() if Status(s) in FAILING)

    def render(self, top: int = 10) -> str:
        earlier = self.items - self.session_items
        lines = [f"run {self.run_id}: {self.items} items in {self.wall_s:.1f} s"
                 + (f" ({earlier} recorded by an earlier session)" if earlier > 0 else "")
                 + (" (interrupted)" if self.interrupted else "")]
        if self.infra:
            lines.append(f"INFRA: canaries failed, the run was stopped: {self.infra}")
        for status in Status:
            if self.counts.get(status.value):
                lines.append(f"  {status.value:<18}{self.counts[status.value]:>8}")
        if self.compiler:
            lines.append(f"compiled graphs: {self.graphs} ({self.uncompiled} items compiled none)")
        if self.op_time:
            lines.append("slowest ops (target time, s):")
            lines += [f"  {op:<40}{t:>8.3f}" for op, t in self.op_time.most_common(top)]
        return "\n".join(lines)


# -- worker side ---------------------------------------------------------------------------
def _worker(conn: Connection, spec: RunSpec, output: str, supervisor: int) -> None:
    from .isolation import Capture, die_with

    # die with the fork server (our parent) and with the supervisor, even while hung in an item
    boot = sys.modules.get("conformance._workerboot")  # loaded by the fork server we come from
    die_with(getattr(boot, "FORKSERVER_PID", None) or os.getppid(), supervisor)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor decides when to stop
    import faulthandler

    faulthandler.disable()  # a device fault is expected here and recorded as `crash`; no dump
    capture = Capture(output)  # what the worker prints goes with the item it ran, not to the console
    torch.set_num_threads(1)
    from .targets import get_target

    try:
        target = get_target(spec.target, spec.build)
        config = spec.sweep_config()
    except Exception as exc:  # noqa: BLE001
        conn.send(("fatal", f"{type(exc).__name__}: {exc}"))
        return
    from .execute import set_phase_hook

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
        for row in work_for(group)(target, group, config, skip=skip, on_start=on_start):
            row["output"] = capture.take()
            conn.send(("row", row))
        capture.take()  # what came after the group's last item belongs to no item
        conn.send(("done", group.key))


def work_for(group: Group) -> Callable[..., Any]:
    """The generator that runs one group of this kind (imported when first needed)."""
    if group.kind == "opinfo":
        return run_group
    if group.kind == "schema":
        from .inputs.schema import run_schema_group

        return run_schema_group
    if group.kind == "model":
        from .models.runner import run_model_group

        return run_model_group
    raise SelectionError(f"unknown work kind {group.kind!r}")


# -- supervisor side -----------------------------------------------------------------------
def worker_context() -> Any:
    """Workers come from a fork server that has torch, the OpInfo db and the device package
    loaded but has never run autograd: forking the supervisor itself breaks once the calling
    process ran autograd on a device (its engine threads do not survive fork), and spawning
    from scratch costs seconds per worker restart."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["conformance._workerboot"])
    return ctx


def _start_worker_server() -> None:
    import multiprocessing.forkserver
    import threading

    from .isolation import PDEATHSIG_ENV, SUPERVISOR_ENV

    # the fork server reads these when it starts (conformance._workerboot): it dies with us
    os.environ[SUPERVISOR_ENV] = str(os.getpid())
    os.environ[PDEATHSIG_ENV] = "1" if threading.current_thread() is threading.main_thread() else ""
    worker_context()
    multiprocessing.forkserver.ensure_running()


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


class Only:
    """A skip-container that skips every item except ``keys`` (used to re-run chosen items)."""

    def __init__(self, keys: frozenset[str]) -> None:
        self.keys = keys

    def __contains__(self, key: object) -> bool:
        return key not in self.keys

    def __or__(self, seen: set[str]) -> Only:
        return Only(self.keys - frozenset(seen))


class Supervisor:
    """Runs groups in worker processes. Rows go to ``sink(row, table)`` (by default the store's
    batched writers); ``only`` restricts each group to chosen item keys (re-runs)."""

    def __init__(self, spec: RunSpec, store: Store | None, run_id: str, groups: Sequence[Group],
                 done: dict[str, set[str]], progress: Callable[[str], None] | None, *,
                 sink: Callable[[dict[str, Any], str], None] | None = None,
                 only: dict[str, frozenset[str]] | None = None) -> None:
        self.spec, self.store, self.run_id = spec, store, run_id
        self.queue = collections.deque(groups)
        self.total_groups = len(groups)
        self.done = done
        self.only = only
        self.summary = Summary(run_id)
        self.progress = progress
        _start_worker_server()  # (again: re-runs and canaries come here directly) ties it to us
        self.ctx = worker_context()
        self.writers = {t: store.writer(t) for t in ("op_results", "model_results")} if store else {}
        self.sink = sink or (lambda row, table: self.writers[table].add(row))
        self.slots: list[_Slot] = []
        self.crash_safe: set[str] = set()  # schema groups whose CPU reference killed a worker
        self.kind_time: collections.Counter[str] = collections.Counter()  # worker-seconds per group kind
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

    def _skip(self, group: Group, seen: set[str]) -> Any:
        if self.only is not None:
            return Only(self.only.get(group.key, frozenset())) | seen
        keys = set(self.done.get(group.key, ())) | seen
        if group.key in self.crash_safe:
            from .inputs.schema import CrashSafe

            return CrashSafe(keys)
        return frozenset(keys)

    def _restart(self, slot: _Slot) -> _Slot:
        """Replace a dead or killed worker; it continues the same group after the bad item."""
        self._kill(slot)
        read_output(slot.output)  # what it printed after its last item belongs to none
        new = self._spawn(slot.output)
        new.group, new.seen, new.assigned_at = slot.group, slot.seen, slot.assigned_at
        return new

    def _record(self, row: dict[str, Any], table: str) -> None:
        row.update(run_id=self.run_id, shard=self.spec.shard, recorded_at=now())
        self.sink(row, table)
        self.summary.counts[row["status"]] += 1
        self.summary.items += 1
        self.summary.session_items += 1
        self.summary.op_time[row.get("op") or row.get("model_id") or "?"] += row.get("duration_s") or 0.0
        graphs = (row.get("proof") or {}).get("graphs")
        if graphs is not None:
            self.summary.compiler = True
            self.summary.graphs += graphs
            self.summary.uncompiled += graphs == 0

    def _synthetic(self, group: Group, key: str, status: Status, error: str, duration: float,
                   output: str | None = None) -> None:
        name, variant, dtype, sample = key.split("|")
        if group.table == "model_results":
            row = {"model_id": name, "mode": variant, "dtype": dtype, "family": name.split(".")[0]}
        else:
            row = {"op": name, "variant": variant, "dtype": dtype, "sample": int(sample)}
        self._record({"item_key": key, **row, "status": status.value, "error": error, "duration_s": duration,
                      "output": output}, group.table)

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
            slot.phase = payload
        elif kind == "row":
            slot.seen.add(payload["item_key"])
            slot.inflight = None
            assert slot.group is not None
            self._record(payload, slot.group.table)
        elif kind == "done":
            self.groups_done += 1
            if slot.group is not None:
                self.kind_time[slot.group.kind] += time.monotonic() - slot.assigned_at
                self.kind_done[slot.group.kind] += 1
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
        if slot.inflight is not None:
            why = f"signal {-code} ({signal.Signals(-code).name})" if code is not None and code < 0 else f"exit code {code}"
            assert slot.group is not None
            output = read_output(slot.output)  # the dead worker's last words belong to the item
            if slot.group.kind == "schema" and slot.group.key not in self.crash_safe:
                # a generated input killed the worker: search again, pre-flighting each input's
                # CPU run in a forked child so one that crashes the reference is just rejected.
                # Also after a death in the target phase: a reference kernel that wrote out of
                # bounds often only aborts at a later free, during the target's run; blaming the
                # target needs the crash to survive the pre-flight.
                self.crash_safe.add(slot.group.key)
                slot.inflight = None
                self.slots[i] = self._restart(slot)
                return
            if slot.group.kind == "schema" and slot.phase != "cpu":
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

    def _check_timeout(self, i: int) -> None:
        slot = self.slots[i]
        if slot.proc is None or slot.inflight is None:
            return
        elapsed = time.monotonic() - slot.since
        # a crash-safe search forks twice per input: it gets three times the item's time
        limit = self.spec.timeout_s * (3 if slot.group is not None and slot.group.key in self.crash_safe else 1)
        if elapsed > limit:
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
        """Seconds left: the groups still queued or running, each at the mean worker time of
        finished groups of its kind (schema searches and model graphs take far longer than an
        OpInfo x dtype group), shared by the workers. None until enough groups finished."""
        done = sum(self.kind_done.values())
        if done < max(3, self.total_groups // 50):
            return None
        overall = sum(self.kind_time.values()) / done
        left = collections.Counter(g.kind for g in self.queue)
        left.update(s.group.kind for s in self.slots if s.proc is not None and s.group is not None)
        work = sum(n * (self.kind_time[k] / self.kind_done[k] if self.kind_done[k] else overall)
                   for k, n in left.items())
        return work / max(1, sum(s.proc is not None for s in self.slots))

    def _report(self, force: bool = False) -> None:
        if self.progress is None:
            return
        t = time.monotonic()
        if not force and t - self._last_progress < 2.0:
            return
        self._last_progress = t
        el = t - self._start
        left = self.eta_s()
        eta = f", eta {left:.0f} s" if left is not None else ""
        counts = " ".join(f"{k}={v}" for k, v in sorted(self.summary.counts.items()))
        self.progress(f"[{self.groups_done}/{self.total_groups} groups, {self.summary.items} items, "
                      f"{el:.0f} s{eta}] {counts}")


def _done_by_group(keys: set[str]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = collections.defaultdict(set)
    for k in keys:
        op, _variant, dtype, _sample = k.split("|")
        out[f"{op}|{dtype}"].add(k)
    return out


def _git_sha() -> str:
    head = Path(__file__).resolve().parent.parent / ".git" / "HEAD"
    try:
        ref = head.read_text().strip()
        if ref.startswith("ref: "):
            return (head.parent / ref[5:]).read_text().strip()[:12]
        return ref[:12]
    except OSError:
        return ""


def run_canaries(spec: RunSpec, store: Store, run_id: str) -> str | None:
    """Run the canary items; store them (variant ``canary``); return why they failed, or None."""
    data = datafiles.canaries()
    cspec = RunSpec(**{**spec.__dict__, "variants": ("function",), "max_samples": data.samples, "workers": 1})
    groups = [Group(op, data.dtype) for op in data.ops]
    rows: list[dict[str, Any]] = []
    sup = Supervisor(cspec, None, run_id, groups, {}, None, sink=lambda row, table: rows.append(row))
    sup.run()
    bad = []
    for r in rows:
        r["item_key"] = r["item_key"].replace("|function|", "|canary|")
        r["variant"] = "canary"
        if not Status(r["status"]).passed:
            bad.append(f"{r['op']} sample {r['sample']}: {r['status']} ({(r.get('error') or '')[:120]})")
    store.insert("op_results", rows)
    if not rows:
        return "no canary produced a result"
    return "; ".join(bad) or None


def rerun_items(spec: RunSpec, run_id: str, keys: Sequence[str], attempts: int) -> dict[str, list[str]]:
    """Re-run chosen items ``attempts`` times each (same seeds, isolated workers); returns the
    statuses per item key. Nothing is written."""
    by_group: dict[str, set[str]] = collections.defaultdict(set)
    kinds: dict[str, str] = {}
    for key in keys:
        name, variant, dtype, _ = key.split("|")
        gkey = f"{name}|{dtype}"
        by_group[gkey].add(key)
        kinds[gkey] = "model" if variant in ("eager", "compile") else ("schema" if variant == "schema" else "opinfo")
    groups = [Group(g.split("|")[0], g.split("|")[1], kinds[g]) for g in sorted(by_group)]
    only = {g: frozenset(v) for g, v in by_group.items()}
    out: dict[str, list[str]] = collections.defaultdict(list)
    for _ in range(attempts):
        sup = Supervisor(spec, None, run_id, groups, {}, None, only=only,
                         sink=lambda row, table: out[row["item_key"]].append(row["status"]))
        sup.run()
    return dict(out)


def spec_from_run(run: dict[str, Any], workers: int) -> RunSpec:
    """The spec a stored run was started with (what --resume continues)."""
    c = json.loads(run.get("config") or "{}")
    return RunSpec(target=run["target"], build=c.get("build_spec") or run["build"], ops=tuple(c.get("ops", ())),
                   dtypes=tuple(c.get("dtypes", ())), thorough=bool(c.get("thorough")), workers=workers,
                   shard=c.get("shard", "1/1"), timeout_s=float(c.get("timeout_s", 60.0)), seed=c.get("seed"),
                   max_samples=c.get("max_samples"), ledger=c.get("ledger"), run_id=run["id"],
                   variants=tuple(c.get("variants") or VARIANTS), opinfo=c.get("opinfo", True),
                   schema=bool(c.get("schema")), models=tuple(c.get("models", ())),
                   model_limit=c.get("model_limit"), model_modes=tuple(c.get("model_modes") or ("eager", "compile")))


def _selection_text(spec: RunSpec) -> str:
    parts = [f"--ops {','.join(spec.ops)}" if spec.ops else "every op",
             f"--dtypes {','.join(spec.dtypes)}" if spec.dtypes else "default dtypes"]
    if spec.models:
        parts.append(f"--models {','.join(spec.models)}")
    return ", ".join(parts)


def _select(spec: RunSpec) -> list[Group]:
    """The run's groups; a selection or shard that holds none is refused, naming why."""
    every = select_groups(spec.ops or None, spec.dtypes or None, (1, 1), opinfo=spec.opinfo,
                          schema=spec.schema, models=spec.models, model_limit=spec.model_limit)
    if not every:
        raise SelectionError(f"{_selection_text(spec)}: the selection holds no (op, dtype) pair the CPU supports")
    k, n = parse_shard(spec.shard)
    groups = shard_of(every, (k, n))
    if not groups:
        raise SelectionError(f"--shard {spec.shard}: shard {k} of {n} is empty (the selection has only "
                             f"{len(every)} group{'s' if len(every) != 1 else ''}; use N <= {len(every)})")
    return groups


# Config keys that may differ between shards of one run (everything else defines the run).
_PER_SHARD = ("shard",)


def _check_run_id(store: Store, spec: RunSpec, config: dict[str, Any], where: str) -> None:
    """A reused --run-id joins the run only as another shard of the same spec: another selection,
    seed or build would mix two runs under one id, and a shard already recorded would be silently
    skipped (that is what --resume is for)."""
    assert spec.run_id is not None
    existing = store.get_run(spec.run_id)
    if existing is None:
        return
    stored = json.loads(existing.get("config") or "{}")
    mine = json.loads(json.dumps(config, sort_keys=True))
    for key in sorted(set(stored) | set(mine)):
        if key in _PER_SHARD or stored.get(key) == mine.get(key):
            continue
        raise SelectionError(f"--run-id {spec.run_id}: {where} holds that run with {key}={stored.get(key)!r}, this "
                             f"run has {key}={mine.get(key)!r}; use a new --run-id (or --resume {spec.run_id})")
    from opdb.queries import results_by_key

    recorded = sum(1 for table in ("op_results", "model_results")
                   for r in results_by_key(store, spec.run_id, table, ("shard",)).values()
                   if r["shard"] == spec.shard)
    if recorded or existing.get("status") == "finished":
        raise SelectionError(f"--run-id {spec.run_id}: {where} already holds shard {spec.shard} of that run "
                             f"({recorded} results, status {existing.get('status')}); continue it with "
                             f"--resume {spec.run_id} or use a new --run-id")


def _whole_run(store: Store, run_id: str, shard: str, summary: Summary) -> None:
    """Counts and items of everything the run (this shard) holds, earlier sessions included:
    a resumed run's exit code and summary are about the whole run, not the part run now."""
    from opdb.queries import results_by_key

    counts: collections.Counter[str] = collections.Counter()
    for table, cols in (("op_results", ("status", "shard", "variant")), ("model_results", ("status", "shard"))):
        for r in results_by_key(store, run_id, table, cols).values():
            if r["shard"] == shard and r.get("variant") != "canary":
                counts[r["status"]] += 1
    summary.counts = counts
    summary.items = sum(counts.values())


class EmptyRun(SelectionError):
    """A run that recorded no item: there is nothing to check, which is never a pass."""


def execute_run(spec: RunSpec, db_path: str | os.PathLike[str], *, resume: str | None = None,
                progress: Callable[[str], None] | None = None) -> Summary:
    """Run (or resume) a sweep into ``db_path``; returns the summary of the whole run (this
    shard), earlier sessions of a resumed run included. A run that ends with no item raises
    :class:`EmptyRun` (after recording it)."""
    from .targets import get_target

    target = None
    _start_worker_server()  # its imports overlap with the selection's
    if resume:
        with Store.open(db_path, create=False) as store:
            run = store.get_run(resume)
        if run is None:
            raise SelectionError(f"{db_path}: no run with id {resume!r} to resume")
        spec = spec_from_run(run, spec.workers)
    # Validate everything before the database is touched: a bad selection writes nothing.
    config = spec.sweep_config()
    groups = _select(spec)
    if not resume:
        target = get_target(spec.target, spec.build)
        if spec.build and spec.build.endswith(".toml"):
            spec = RunSpec(**{**spec.__dict__, "build": str(Path(spec.build).resolve())})
    with Store.open(db_path) as store:
        if resume:
            store.resume_run(resume, shard=spec.shard)
            run_id = resume
        else:
            assert target is not None
            run_config = {**config.describe(), "ops": list(spec.ops), "dtypes": list(spec.dtypes),
                          "shard": spec.shard, "timeout_s": spec.timeout_s, "ledger": spec.ledger,
                          "build_spec": spec.build, "opinfo": spec.opinfo, "schema": spec.schema,
                          "models": list(spec.models), "model_limit": spec.model_limit,
                          "layouts": target.probe_layouts()}
            if spec.run_id:
                _check_run_id(store, spec, run_config, str(db_path))
            run_id = store.start_run(
                target=spec.target, build=target.build, torch_version=torch.__version__,
                kind="mixed" if spec.models and spec.opinfo else ("models" if spec.models else "ops"),
                config=run_config, run_id=spec.run_id, shard=spec.shard, git_sha=_git_sha())
        infra = run_canaries(spec, store, run_id)
        if infra:
            store.set_run_status(run_id, "infra")
            store.finish_run(run_id, shard=spec.shard, status="infra")
            return Summary(run_id, infra=infra)
        done = _done_by_group(store.done_keys("op_results", run_id) | store.done_keys("model_results", run_id))
        sup = Supervisor(spec, store, run_id, groups, done, progress)
        previous = signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        try:
            summary = sup.run()
        finally:
            signal.signal(signal.SIGTERM, previous)
        store.finish_run(run_id, shard=spec.shard, status="interrupted" if summary.interrupted else "finished")
        _whole_run(store, run_id, spec.shard, summary)
    if not summary.items and not summary.interrupted:
        raise EmptyRun(f"run {run_id}: {_selection_text(spec)}, --variants {','.join(spec.variants)}: "
                       "the run recorded no item, so nothing was checked")
    return summary


def stderr_progress(line: str) -> None:
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K" + line)
    else:
        sys.stderr.write(line + "\n")
    sys.stderr.flush()
