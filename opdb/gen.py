"""The generation lane's store (table ``gen_results``, schema v18).

The lane is a work kind of a run (:mod:`conformance.generate.lane`): its rows carry the run's
item columns and are written by the run's one writer; this module answers the questions the gate,
the report and the CLI ask of them.

Example::

    >>> from opdb import Store
    >>> from opdb import gen
    >>> st = Store.memory()
    >>> _ = st.insert("gen_results", [{"run_id": "r", "item_key": "gen:hf.llama|gen_eager|float32|8",
    ...                                "model_id": "hf.llama", "dtype": "float32", "mode": "eager", "bucket": 8,
    ...                                "status": "pass", "agreement": 1.0}])
    >>> [(r["model_id"], r["bucket"]) for r in gen.results(st, "r")]
    [('hf.llama', 8)]
"""

from __future__ import annotations

from typing import Any

from .store import Store

TABLE = "gen_results"


def _exists(store: Store) -> bool:
    return store.db[TABLE].exists()


def results(store: Store, run_id: str) -> list[dict[str, Any]]:
    """Every generation row of a run, by model, dtype, mode and bucket."""
    if not _exists(store):
        return []
    return list(store.db.query(f"select * from [{TABLE}] where run_id = ? order by model_id, dtype, mode, bucket",
                               [run_id]))


def has_results(store: Store, run_id: str) -> bool:
    if not _exists(store):
        return False
    return store.db.execute(f"select 1 from [{TABLE}] where run_id = ? limit 1", [run_id]).fetchone() is not None


def runs_with_results(store: Store) -> list[dict[str, Any]]:
    """The runs (``runs`` rows, oldest first) that hold generation rows."""
    if not _exists(store):
        return []
    return list(store.db.query(f"select r.* from runs r where exists (select 1 from [{TABLE}] g where g.run_id = r.id) "
                               "order by r.started_at, r.id"))

# -- the report's serving page ------------------------------------------------------------------


def build_run(store: Store, target: str, build: str) -> dict[str, Any] | None:
    """The run of ``(target, build)`` whose generation rows the report shows: the latest finished
    one holding any, else the latest of any status; ``build`` as the runs store it (``-``, or
    empty, for the target's default build)."""
    if not _exists(store):
        return None
    rows = list(store.db.query(
        f"select r.* from runs r where coalesce(r.target, '') = ? and coalesce(nullif(r.build, ''), '-') = ? "
        f"and exists (select 1 from [{TABLE}] g where g.run_id = r.id) "
        "order by r.status = 'finished' desc, r.started_at desc, r.id desc limit 1", [target or "", build or "-"]))
    return rows[0] if rows else None


# -- the gate's generation section --------------------------------------------------------------
