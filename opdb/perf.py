"""The perf lane's store (tables ``perf_runs`` and ``perf_results``, schema v16).

A perf run is one session that measured a candidate build against a baseline build, interleaved
(:mod:`conformance.perf`); a result is one item's finding. This module writes them and answers
the questions the gate, the report and the CLI ask.

Example::

    >>> from opdb import Store
    >>> from opdb import perf
    >>> st = Store.memory()
    >>> perf.start(st, {"id": "p1", "target": "neuron-emu", "build": "b", "baseline_build": "a", "config": "{}"})
    >>> _ = perf.record(st, [{"run_id": "p1", "item_key": "op|mm|float32|small", "kind": "op", "subject": "mm",
    ...                       "dtype": "float32", "shape": "small", "status": "ok", "ratio": 1.5, "low": 1.4,
    ...                       "high": 1.6, "verdict": "regression", "confirmed": 1}])
    >>> perf.finish(st, "p1", "finished")
    >>> [r["subject"] for r in perf.findings(st, "p1")]
    ['mm']
    >>> perf.latest(st, "neuron-emu", "b", "a")["id"]
    'p1'
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from .store import Store, now

RUNS, RESULTS = "perf_runs", "perf_results"


def start(store: Store, run: Mapping[str, Any]) -> None:
    """Store a new perf run (status ``running``)."""
    store.insert(RUNS, [{"started_at": now(), "status": "running", **run}], replace=True)


def finish(store: Store, run_id: str, status: str, machine: Mapping[str, Any] | None = None) -> None:
    """Mark a run ``finished``, ``interrupted`` or ``infra`` (and store the machine it ran on)."""
    row = dict(store.db[RUNS].get(run_id))
    row.update(status=status, finished_at=now())
    if machine is not None:
        row["machine"] = json.dumps(dict(machine), sort_keys=True)
    store.insert(RUNS, [row], replace=True)


def record(store: Store, rows: Iterable[Mapping[str, Any]]) -> int:
    """Store item results (an item measured again replaces its row)."""
    return store.insert(RESULTS, [{"recorded_at": now(), **r} for r in rows], replace=True)


def get_run(store: Store, run_id: str) -> dict[str, Any] | None:
    rows = list(store.db.query(f"select * from [{RUNS}] where id = ?", [run_id]))
    return rows[0] if rows else None


def runs(store: Store, target: str | None = None) -> list[dict[str, Any]]:
    """Every perf run (of ``target``), oldest first."""
    if not store.db[RUNS].exists():
        return []
    where, args = ("where target = ?", [target]) if target else ("", [])
    return list(store.db.query(f"select * from [{RUNS}] {where} order by started_at, id", args))


def done(store: Store, run_id: str) -> set[str]:
    """Keys of the items a run already holds (what a resumed run skips)."""
    return {r[0] for r in store.db.execute(f"select item_key from [{RESULTS}] where run_id = ?", [run_id])}


def results(store: Store, run_id: str) -> list[dict[str, Any]]:
    """A run's rows, by kind, subject, dtype and size."""
    return list(store.db.query(f"select * from [{RESULTS}] where run_id = ? order by kind desc, subject, dtype, "
                               "shape", [run_id]))


def findings(store: Store, run_id: str) -> list[dict[str, Any]]:
    """A run's regressions and improvements (confirmed ones, where it confirmed), largest change first."""
    import math

    rows = list(store.db.query(f"select * from [{RESULTS}] where run_id = ? and verdict in ('regression', "
                               "'improvement')", [run_id]))
    return sorted(rows, key=lambda r: (r["verdict"], -abs(math.log(r["ratio"] or 1.0)), r["item_key"]))


def latest(store: Store, target: str, build: str, baseline_build: str | None = None) -> dict[str, Any] | None:
    """The latest finished perf run of ``target`` measuring ``build`` (against ``baseline_build``
    when given)."""
    if not store.db[RUNS].exists():
        return None
    sql = f"select * from [{RUNS}] where target = ? and build = ? and status = 'finished'"
    args: list[Any] = [target, build]
    if baseline_build is not None:
        sql += " and baseline_build = ?"
        args.append(baseline_build)
    rows = list(store.db.query(sql + " order by finished_at desc, id desc limit 1", args))
    return rows[0] if rows else None


def p50_history(store: Store, target: str, keys: Iterable[str]) -> dict[str, dict[str, float]]:
    """``key -> {build: p50}``: each build's call time of each item, from the latest finished run
    that measured the build (as candidate or as baseline) and holds the item."""
    keys = list(dict.fromkeys(keys))
    out: dict[str, dict[str, float]] = {k: {} for k in keys}
    if not keys or not store.db[RUNS].exists():
        return out
    for i in range(0, len(keys), 500):
        chunk = keys[i:i + 500]
        marks = ", ".join("?" * len(chunk))
        for key, build, base_build, p50, base_p50 in store.db.execute(
                f"select r.item_key, p.build, p.baseline_build, r.p50, r.base_p50 from [{RESULTS}] r "
                f"join [{RUNS}] p on p.id = r.run_id where p.target = ? and p.status = 'finished' "
                f"and r.status = 'ok' and r.item_key in ({marks}) order by p.finished_at, p.id", [target, *chunk]):
            if base_p50 is not None:
                out[key][base_build] = base_p50
            if p50 is not None:
                out[key][build] = p50  # a later run of the build wins
    return out


def _order(builds: set[str]) -> list[str]:
    from packaging.version import InvalidVersion, Version

    try:
        return sorted(builds, key=Version)
    except InvalidVersion:
        return sorted(builds)


def first_bad(store: Store, target: str, baseline: str, candidate: str, found: list[dict[str, Any]]) -> None:
    """Adds ``first_bad_build`` (or ``first_bad_unknown``, saying why) to each regression row of
    ``found`` (from a run of ``candidate`` against ``baseline``): the perf runs stored for the
    build steps in between, each build against the one before it, are walked from ``baseline``;
    the first step that calls the item a confirmed regression is its first bad build; with no
    build in between it is the candidate; a step with no stored run leaves it unknown from there."""
    runs_ = runs(store, target)
    builds = _order({r["build"] for r in runs_} | {r["baseline_build"] for r in runs_} | {baseline, candidate})
    lo, hi = builds.index(baseline), builds.index(candidate)
    steps = builds[lo:hi + 1]
    if len(steps) <= 2:  # nothing in between (or a candidate older than its baseline): the candidate
        for f in found:
            f["first_bad_build"] = candidate
        return
    flagged: list[tuple[str, str, set[str] | None]] = []
    for before, after in zip(steps, steps[1:], strict=False):
        run = latest(store, target, after, before)
        keys = None if run is None else {r["item_key"] for r in findings(store, run["id"])
                                         if r["verdict"] == "regression" and r.get("confirmed") != 0}
        flagged.append((before, after, keys))
    for f in found:
        for before, after, keys in flagged:
            if keys is None:
                f["first_bad_unknown"] = f"unknown from {after} on: no perf run of {after} against {before}"
                break
            if f["item_key"] in keys:
                f["first_bad_build"] = after
                break
        else:
            f["first_bad_unknown"] = "no single step between the builds called it (a slow creep)"


__all__ = ["RESULTS", "RUNS", "done", "findings", "finish", "first_bad", "get_run", "latest", "p50_history", "record", "results",
           "runs", "start"]
