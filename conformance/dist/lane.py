"""The distributed lane's session: a process group per world size on the target's c10d backend,
items sent to every rank in lock step, crash and hang isolation, results stored as they come.

For each world size, ``world_size`` rank processes (:mod:`.rank`) join one group (FileStore
rendezvous). Every item goes to all ranks; the item's status is the worst of theirs (each rank
judges its own result against the exact answer), its evidence the first failing rank's. A rank
that dies makes the item ``crash`` (which rank, how); ranks that do not all answer within
``timeout_s`` make it ``timeout``; either way the group is torn down (every rank killed) and a new
one started for the next item. A group whose ranks disagree is restarted too (a collective that
raised on some ranks leaves the others' transport out of step); one that raised on every rank is
kept.

Example (the statuses of one world size)::

    >>> worst(["pass", "mismatch", "pass"])
    'mismatch'
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from conformance.run.isolation import how_it_ended
from opdb import Store
from opdb import dist as db

from .items import COLLECTIVES, DTYPES, DistItem, enumerate_items

START_TIMEOUT_S = 300.0
_ORDER = ("pass", "skip", "mismatch", "error", "timeout", "crash")


def worst(statuses: list[str]) -> str:
    return max(statuses, key=lambda s: _ORDER.index(s) if s in _ORDER else len(_ORDER))


class DistError(ValueError):
    """Bad options, or a group that cannot start."""


@dataclass(frozen=True)
class DistSpec:
    target: str = "neuron-emu"
    build: str | None = None
    world_sizes: tuple[int, ...] = (2, 3, 4)
    collectives: tuple[str, ...] = tuple(COLLECTIVES)
    dtypes: tuple[str, ...] = ("float32", "bfloat16", "int64")
    timeout_s: float = 30.0
    env: tuple[str, ...] = ()
    # training parity (conformance.dist.training): fsdp2 and/or tp, 3 steps on 2 ranks against one CPU process
    training: tuple[str, ...] = ()
    training_reference: str = "cpu"

    def __post_init__(self) -> None:
        bad = [w for w in self.world_sizes if w < 1 or w > 16]
        if bad or not self.world_sizes:
            raise DistError(f"--world-sizes {bad[0] if bad else '(none)'}: world sizes from 1 to 16")
        unknown = [c for c in self.collectives if c not in COLLECTIVES]
        if unknown:
            raise DistError(f"--collectives {unknown[0]!r}: one of {', '.join(COLLECTIVES)}")
        odd = [d for d in self.dtypes if d not in DTYPES]
        if odd:
            raise DistError(f"--dtypes {odd[0]!r}: one of {', '.join(DTYPES)}")
        bad_modes = [m for m in self.training if m not in ("fsdp2", "tp")]
        if bad_modes:
            raise DistError(f"--training {bad_modes[0]!r}: fsdp2 or tp")
        if self.timeout_s <= 0:
            raise DistError(f"--timeout {self.timeout_s}: a positive number of seconds")

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


@dataclass
class DistResult:
    run_id: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    interrupted: bool = False

    @property
    def failing(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["status"] not in ("pass", "skip")]


class Group:
    """The rank processes of one world size."""

    def __init__(self, spec: DistSpec, world: int) -> None:
        self.spec, self.world = spec, world
        self.procs: list[subprocess.Popen] = []
        self.conns: list[Connection] = []
        self.build = spec.build or "-"
        self.backend = ""
        self.tmp: Path | None = None  # the ranks' rendezvous folder, removed by stop()

    def start(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="dist-"))
        store = self.tmp / "store"
        for rank in range(self.world):
            ours, theirs = socket.socketpair()
            cmd = [sys.executable, "-m", "conformance.dist.rank", str(theirs.fileno()), str(rank), str(self.world),
                   self.spec.target, self.spec.build or "", str(store), json.dumps(list(self.spec.env)),
                   str(self.spec.timeout_s)]
            self.procs.append(subprocess.Popen(cmd, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL))
            theirs.close()
            self.conns.append(Connection(ours.detach()))
        hello = self._gather(START_TIMEOUT_S)
        problems = [h for h in hello if h is None or "error" in h]
        if problems:
            self.stop()
            what = next((h["error"] for h in problems if h), "a rank died while starting")
            raise DistError(f"the world-size {self.world} group ({self.spec.target} {self.spec.build or '-'}) cannot "
                            f"start: {what}")
        self.build, self.backend = hello[0]["build"], hello[0]["backend"]

    def _gather(self, timeout: float) -> list[dict[str, Any] | None]:
        """Each rank's reply (None: the rank died); raises TimeoutError when some did not answer."""
        replies: dict[int, dict[str, Any] | None] = {}
        deadline = time.monotonic() + timeout
        pending = {c: i for i, c in enumerate(self.conns)}
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(sorted(pending.values()))
            for c in wait(list(pending), timeout=left):
                i = pending.pop(c)
                try:
                    replies[i] = c.recv()
                except (EOFError, OSError):
                    replies[i] = None
        return [replies[i] for i in range(self.world)]

    def run(self, item: DistItem) -> list[dict[str, Any] | None]:
        for c in self.conns:
            with contextlib.suppress(OSError):
                c.send(("item", item.as_dict()))
        return self._gather(self.spec.timeout_s)

    def how_rank_died(self, rank: int) -> str:
        return how_it_ended(self.procs[rank])

    def stop(self, kill: bool = False) -> None:
        for c in self.conns:
            if not kill:
                with contextlib.suppress(Exception):
                    c.send(("stop",))
        for p in self.procs:
            try:
                if kill:
                    raise subprocess.TimeoutExpired(p.args, 0)
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        for c in self.conns:
            with contextlib.suppress(Exception):
                c.close()
        self.procs, self.conns = [], []
        if self.tmp is not None:  # every start made one: 130 were left in /tmp by the suite's runs
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None


def _row(run_id: str, item: DistItem) -> dict[str, Any]:
    return {"run_id": run_id, "item_key": item.key, "collective": item.collective, "reduce_op": item.reduce_op,
            "dtype": item.dtype, "world_size": item.world_size, "shape": item.shape}


def run_dist(spec: DistSpec, store: Store, *, progress: Callable[[str], None] | None = None,
             run_id: str | None = None) -> DistResult:
    """Every item of ``spec`` into ``store``; a ``run_id`` already stored is resumed (its items kept)."""
    say = progress or (lambda line: None)
    items = enumerate_items(spec.collectives, spec.dtypes, spec.world_sizes)
    have = db.done(store, run_id) if run_id and db.get_run(store, run_id) else set()
    result = DistResult(run_id=run_id or "")
    started = False
    t0 = time.monotonic()
    todo = [i for i in items if i.key not in have]
    try:
        for ws in spec.world_sizes:
            mine = [i for i in todo if i.world_size == ws]
            if not mine:
                continue
            group = Group(spec, ws)
            group.start()
            try:
                if not started:
                    if not result.run_id:
                        result.run_id = (f"dist-{group.build}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
                    if db.get_run(store, result.run_id) is None:
                        import torch

                        db.start(store, {"id": result.run_id, "target": spec.target, "build": group.build,
                                         "torch_version": torch.__version__, "backend": group.backend,
                                         "config": spec.to_json()})
                    say(f"dist {result.run_id}: {len(todo)} items ({len(have)} already checked), {spec.target} "
                        f"{group.build}, backend {group.backend}, world sizes {', '.join(map(str, spec.world_sizes))}")
                    started = True
                for item in mine:
                    row, restart = _one(group, result.run_id, item)
                    db.record(store, [row])
                    result.rows.append(row)
                    if row["status"] != "pass" or len(result.rows) % 50 == 0:
                        say(f"[{len(result.rows)}/{len(todo)}] {item.key} {row['status']}"
                            + (f": {row['error']}" if row.get("error") else "")
                            + f"  ({time.monotonic() - t0:.0f} s)")
                    if restart:
                        group.stop(kill=True)
                        group.start()
            finally:
                group.stop()
        _training(spec, store, result, have, say)
    except KeyboardInterrupt:
        result.interrupted = True
        if result.run_id and db.get_run(store, result.run_id):
            db.finish(store, result.run_id, "interrupted")
        return result
    if result.run_id and db.get_run(store, result.run_id):
        db.finish(store, result.run_id, "finished")
    return result


def _training(spec: DistSpec, store: Store, result: DistResult, have: set[str], say: Callable[[str], None]) -> None:
    """Training parity items (collective ``train:<mode>``, world size 2): stored like collectives."""
    from .training import train_parity

    for mode in spec.training:
        item = DistItem(f"train:{mode}", "", "float32", 2, "llama")
        if item.key in have:
            continue
        if not result.run_id:  # no collective ran first: the run starts here
            import torch

            result.run_id = f"dist-{spec.build or '-'}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
            db.start(store, {"id": result.run_id, "target": spec.target, "build": spec.build or "-",
                             "torch_version": torch.__version__, "config": spec.to_json()})
        got = train_parity(spec.target, spec.build, mode, world_size=2, reference=spec.training_reference,
                           env=spec.env)
        status = {"pass": "pass", "mismatch": "mismatch", "crash": "crash", "timeout": "timeout"}.get(got["status"],
                                                                                                    "error")
        div = got.get("first_divergence")
        error = got.get("error") or (f"step {div['step']}: {div['what']} differs (max rel err {div['max_rel_err']:.3g})"
                                     if div else None)
        row = {**_row(result.run_id, item), "status": status, "error": error, "wall_s": got.get("wall_s"),
               "evidence": json.dumps({k: got.get(k) for k in ("first_divergence", "losses", "max_rel_err",
                                                               "tolerance", "reference", "optimizer")}, default=str)}
        db.record(store, [row])
        result.rows.append(row)
        say(f"training parity {mode}: {status}" + (f": {error}" if error else ""))


def _one(group: Group, run_id: str, item: DistItem) -> tuple[dict[str, Any], bool]:
    """The item's row, and whether the group must be restarted after it."""
    row = _row(run_id, item)
    t0 = time.monotonic()
    try:
        replies = group.run(item)
    except TimeoutError as exc:
        silent = exc.args[0]
        row.update(status="timeout", wall_s=time.monotonic() - t0,
                   error=f"ranks {', '.join(map(str, silent))} of {group.world} did not finish within "
                         f"{group.spec.timeout_s:g} s", evidence=json.dumps({"ranks": silent}))
        return row, True
    dead = [r for r, rep in enumerate(replies) if rep is None]
    if dead:
        how = group.how_rank_died(dead[0])
        row.update(status="crash", wall_s=time.monotonic() - t0,
                   error=f"rank {dead[0]} of {group.world} died ({how})", evidence=json.dumps({"ranks": dead}))
        return row, True
    statuses = [rep["status"] for rep in replies]  # type: ignore[index]
    status = worst(statuses)
    first = next((rep for rep in replies if rep["status"] == status), replies[0])  # type: ignore[index]
    row.update(status=status, error=first.get("error"), wall_s=time.monotonic() - t0,  # type: ignore[union-attr]
               evidence=json.dumps({**(first.get("evidence") or {}),  # type: ignore[union-attr]
                                    "ranks": {s: [r for r, x in enumerate(statuses) if x == s] for s in set(statuses)}}))
    return row, len(set(statuses)) > 1
