"""The executor interface: a run's groups in, one row per item streamed out to the one writer.

The runner (:mod:`conformance.run.runner`) decides *what* runs (selection, resume, shards,
canaries, re-runs) and where rows go; an executor decides *where and how* it runs. Every
executor owes the runner the same things, whatever it runs on:

- **every item one row.** Each item of each group becomes exactly one row, handed to
  ``sink(row, table)`` as soon as it is made (the store's batched writers in a run, a list for
  canaries and re-runs), with ``run_id``, ``shard`` and ``recorded_at`` filled in.
- **isolation.** A worker that dies costs one ``crash`` row (the item in flight), one that goes
  silent past its timeout is killed and costs one ``timeout`` row; the group goes on after it.
- **skips.** Items in ``Work.done`` (recorded by an earlier session) are not run again; with
  ``Work.only`` just those items run (re-runs).
- **interruption.** Ctrl-C or SIGTERM stops it: rows made so far are flushed and the
  :class:`Summary` comes back with ``interrupted`` set, so the run resumes where it stopped.
- **timings.** ``group_times`` holds the wall seconds of each finished group (opdb
  ``group_times``: the next run's prices for its schedule and ETA).

:class:`~conformance.run.supervisor.Supervisor` is the local executor (forked worker processes on
this machine). A new executor implements :class:`Executor` and is added to :data:`EXECUTORS`.
"""

from __future__ import annotations

import collections
import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from conformance.work import Group
from opdb import Store
from opdb.corpus import TABLE as CORPUS_TABLE
from opdb.status import FAILING, Status
from opdb.store import now

from .spec import RunSpec

Sink = Callable[[dict[str, Any], str], None]  # (row, table)


@dataclass(frozen=True)
class Work:
    """What an executor is handed: a run's groups and what to skip. Plain data, so that an
    executor can ship it elsewhere."""

    spec: RunSpec
    run_id: str
    groups: Sequence[Group]
    done: Mapping[str, set[str]] = field(default_factory=dict)  # group key -> item keys recorded
    failed: Mapping[str, set[str]] = field(default_factory=dict)  # group key -> those of them that failed
    only: Mapping[str, frozenset[str]] | None = None  # group key -> the only item keys to run
    history: Mapping[str, float] | None = None  # group key -> wall seconds it took before
    stage: str = "sweep"  # the progress line's name for this work
    corpus: Mapping[str, dict[str, Any]] | None = None  # group key -> stored schema-corpus entry


@dataclass
class Summary:
    """What a run (or one executor's session of it) did, for the console and the nightly."""

    run_id: str
    infra: str | None = None  # why the canaries failed, when they did
    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    op_time: collections.Counter[str] = field(default_factory=collections.Counter)
    wall_s: float = 0.0
    items: int = 0  # the whole run (this shard), earlier sessions of a resumed run included
    session_items: int = 0  # of which run in this session
    interrupted: bool = False
    graphs: int = 0  # graphs a compiler target compiled (this session)
    batched: int = 0  # items whose result came from a compiled batch (conformance.check.batching)
    uncompiled: int = 0  # items of a compiler target that compiled none (this session)
    compiler: bool = False  # some item carried a compiler's proof
    # schema searches of this session: "replayed" / "searched" (from the corpus or not), and why
    # each search ran ("no corpus entry", "a stored input fails on this target", ...)
    corpus: collections.Counter[str] = field(default_factory=collections.Counter)
    corpus_why: collections.Counter[str] = field(default_factory=collections.Counter)

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
            lines.append(f"compiled graphs: {self.graphs} ({self.uncompiled} items compiled none"
                         + (f"; {self.batched} items from batches" if self.batched else "") + ")")
        if self.corpus:
            why = "; ".join(f"{n} {w}" for w, n in self.corpus_why.most_common())
            lines.append(f"schema search: {self.corpus['replayed']} overloads replayed from the corpus, "
                         f"{self.corpus['searched']} searched" + (f" ({why})" if why else ""))
        if self.op_time:
            lines.append("slowest ops (target time, s):")
            lines += [f"  {op:<40}{t:>8.3f}" for op, t in self.op_time.most_common(top)]
        return "\n".join(lines)


class Recorder:
    """What becomes of an item's row, whichever executor ran it and wherever: stamped with the
    run, handed to the sink, counted in the summary; a schema search's side record (``_corpus``)
    counted, and its new corpus entry stored (with the corpus on and a store: canaries and
    re-runs store none), replacing the overload's earlier one. One per run, in the process that
    writes (the one writer)."""

    def __init__(self, spec: RunSpec, run_id: str, store: Store | None, sink: Sink, summary: Summary) -> None:
        self.spec, self.run_id, self.store, self.sink, self.summary = spec, run_id, store, sink, summary

    def record(self, row: dict[str, Any], table: str) -> None:
        self._corpus(row.pop("_corpus", None))
        row.update(run_id=self.run_id, shard=self.spec.shard, recorded_at=now())
        self.sink(row, table)
        s = self.summary
        s.counts[row["status"]] += 1
        s.items += 1
        s.session_items += 1
        s.op_time[row.get("op") or row.get("model_id") or "?"] += row.get("duration_s") or 0.0
        proof = row.get("proof") or {}
        graphs = proof.get("graphs")
        if graphs is not None:
            s.compiler = True
            batch = proof.get("batch") if not (proof.get("batch") or {}).get("alone") else None
            # a batch's graph is every one of its items' proof: counted once, at its first sample
            s.graphs += graphs if batch is None or batch.get("first") == row.get("sample") else 0
            s.batched += batch is not None
            s.uncompiled += graphs == 0

    def _corpus(self, side: dict[str, Any] | None) -> None:
        if side is None or not self.spec.corpus:
            return
        self.summary.corpus[side["how"]] += 1
        if side.get("why"):
            self.summary.corpus_why[side["why"]] += 1
        if side.get("entry") is not None and self.store is not None:
            self.store.insert(CORPUS_TABLE, [{**side["entry"], "run_id": self.run_id}], replace=True)


@runtime_checkable
class Executor(Protocol):
    """Runs one :class:`Work` (see the module's docstring for what it owes)."""

    group_times: list[dict[str, Any]]

    def run(self) -> Summary:
        """Run every group to its end (or until interrupted) and say what happened."""
        ...


#: The executors by name, each ``"module:Class"`` whose class is called as ``(work, store,
#: progress, sink=sink)``. Named, not imported: an executor's module may need an optional
#: package (Ray) that only a run choosing it must have. ``local``: forked worker processes here;
#: ``ray``: Ray actors on a Ray cluster (:mod:`conformance.run.ray_executor`).
EXECUTORS: dict[str, str] = {"local": "conformance.run.supervisor:Supervisor",
                             "ray": "conformance.run.ray_executor:RayExecutor"}


def executor(work: Work, store: Store | None = None, *, sink: Sink | None = None,
             progress: Callable[[str], None] | None = None, name: str | None = None,
             also: Sequence[Work] = ()) -> Executor:
    """The executor ``name`` (default: the one ``work.spec`` names) for ``work``. ``store``
    receives side records (the schema corpus) and, when ``sink`` is None, the rows; ``progress``
    takes the console's lines. ``also``: more runs' work for the same queue (an executor whose
    class takes ``also``: Ray), their summaries in the executor's ``summaries``."""
    name = name or work.spec.executor
    try:
        module, _, cls = EXECUTORS[name].partition(":")
    except KeyError:
        raise ValueError(f"executor {name!r}: unknown (known: {', '.join(sorted(EXECUTORS))})") from None
    factory = getattr(importlib.import_module(module), cls)
    if also:
        return factory(work, store, progress, sink=sink, also=also)
    return factory(work, store, progress, sink=sink)
