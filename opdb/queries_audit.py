"""Read queries of ``conformance audit``: a build's latest finished sweep and its coverage."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .store import Store


def latest_finished_run(store: Store, target: str, build: str) -> dict[str, Any] | None:
    """The newest finished run of ``target`` + ``build`` (None when there is none)."""
    rows = list(store.db.query(
        "select * from runs where target = ? and build = ? and status = 'finished' "
        "order by started_at desc, id desc limit 1", [target, build]))
    return rows[0] if rows else None


def sweep_coverage(store: Store, run_id: str, names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Coverage rows of ``run_id`` for the overloads ``names`` ("aten::x.overload"), by name."""
    if not names or "coverage" not in store.db.table_names():
        return {}
    out: dict[str, dict[str, Any]] = {}
    names = list(dict.fromkeys(names))
    for i in range(0, len(names), 500):
        chunk = names[i:i + 500]
        marks = ",".join("?" * len(chunk))
        for r in store.db.query(
                f"select name, state, samples, native_samples, fallback_samples, failing_samples, statuses "
                f"from coverage where run_id = ? and name in ({marks})", [run_id, *chunk]):
            out[r["name"]] = r
    return out
