"""The distributed lane's store (tables ``dist_runs`` and ``dist_results``, schema v17).

Example::

    >>> from opdb import Store
    >>> from opdb import dist
    >>> st = Store.memory()
    >>> dist.start(st, {"id": "d1", "target": "neuron-emu", "build": "2.33.0", "config": "{}"})
    >>> _ = dist.record(st, [{"run_id": "d1", "item_key": "all_reduce|sum|float32|2|vector", "status": "pass"}])
    >>> dist.finish(st, "d1", "finished")
    >>> sorted(dist.done(st, "d1")), dist.get_run(st, "d1")["status"]
    (['all_reduce|sum|float32|2|vector'], 'finished')
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .store import Store, now

RUNS, RESULTS = "dist_runs", "dist_results"


def start(store: Store, run: Mapping[str, Any]) -> None:
    store.insert(RUNS, [{"started_at": now(), "status": "running", **run}], replace=True)


def finish(store: Store, run_id: str, status: str) -> None:
    row = dict(store.db[RUNS].get(run_id))
    row.update(status=status, finished_at=now())
    store.insert(RUNS, [row], replace=True)


def record(store: Store, rows: Iterable[Mapping[str, Any]]) -> int:
    return store.insert(RESULTS, [{"recorded_at": now(), **r} for r in rows], replace=True)


def get_run(store: Store, run_id: str) -> dict[str, Any] | None:
    rows = list(store.db.query(f"select * from [{RUNS}] where id = ?", [run_id]))
    return rows[0] if rows else None


def done(store: Store, run_id: str) -> set[str]:
    return {r[0] for r in store.db.execute(f"select item_key from [{RESULTS}] where run_id = ?", [run_id])}


def results(store: Store, run_id: str) -> list[dict[str, Any]]:
    return list(store.db.query(f"select * from [{RESULTS}] where run_id = ? order by world_size, collective, "
                               "reduce_op, dtype, shape", [run_id]))


def runs(store: Store, target: str | None = None) -> list[dict[str, Any]]:
    if not store.db[RUNS].exists():
        return []
    where, args = ("where target = ?", [target]) if target else ("", [])
    return list(store.db.query(f"select * from [{RUNS}] {where} order by started_at, id", args))




def latest(store: Store, target: str, build: str) -> dict[str, Any] | None:
    """The latest finished dist run of ``target`` on ``build``."""
    if not store.db[RUNS].exists():
        return None
    rows = list(store.db.query(f"select * from [{RUNS}] where target = ? and build = ? and status = 'finished' "
                               "order by finished_at desc, id desc limit 1", [target, build]))
    return rows[0] if rows else None


def statuses(store: Store, run_ids: Iterable[str]) -> dict[str, dict[str, str]]:
    """``run id -> {item key: status}`` of the given runs (one query)."""
    ids = list(dict.fromkeys(run_ids))
    out: dict[str, dict[str, str]] = {i: {} for i in ids}
    if not ids:
        return out
    marks = ", ".join("?" * len(ids))
    for run_id, key, status in store.db.execute(
            f"select run_id, item_key, status from [{RESULTS}] where run_id in ({marks})", ids):
        out[run_id][key] = status
    return out


__all__ = ["RESULTS", "RUNS", "done", "finish", "get_run", "latest", "record", "results", "runs", "start", "statuses"]
