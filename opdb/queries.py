"""Named read queries. The rest of the project reads opdb through these (and ``Store``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from .store import OpdbError, Store


def op_result(store: Store, result_id: int) -> dict[str, Any]:
    rows = list(store.db.query("select * from op_results where id = ?", [result_id]))
    if not rows:
        raise OpdbError(f"{store.path}: no op result with id {result_id}")
    return rows[0]


def status_counts(store: Store, run_id: str, table: str = "op_results") -> dict[str, int]:
    return {r["status"]: r["n"] for r in store.db.query(
        f"select status, count(*) as n from [{table}] where run_id = ? group by status", [run_id])}


def tolerance_evidence(store: Store, run_id: str) -> list[dict[str, Any]]:
    """Per (op, variant, dtype): the worst errors of mismatching items and how many there were."""
    return list(store.db.query(
        """select op, dtype, count(*) as n, max(max_abs_err) as max_abs, max(max_rel_err) as max_rel,
                  min(nan_agree) as nan_agree, min(dtype_ok) as dtype_ok, min(shape_ok) as shape_ok,
                  (select count(*) from op_results b where b.run_id = a.run_id and b.op = a.op
                      and b.dtype = a.dtype) as total
           from op_results a where run_id = ? and status = 'mismatch'
           group by op, dtype order by op, dtype""", [run_id]))


def latest_run(store: Store, *, target: str | None = None, build: str | None = None,
               kind: str | None = None) -> dict[str, Any] | None:
    clauses, params = [], []
    for col, val in (("target", target), ("build", build), ("kind", kind)):
        if val is not None:
            clauses.append(f"{col} = ?")
            params.append(val)
    where = " and ".join(clauses) or "1"
    rows = store.live_runs(list(store.db.query(
        f"select * from runs where {where} order by started_at desc, id desc limit 1", params)))
    return rows[0] if rows else None


def op_evidence(store: Store, run_id: str) -> Iterator[dict[str, Any]]:
    """What coverage is computed from: each op result's variant, dtype, status and overload lists."""
    return store.db.query("select variant, dtype, status, native_ops, fallback_ops, reached_ops, op, error "
                          "from op_results where run_id = ?", [run_id])


def coverage_rows(store: Store, run_id: str) -> list[dict[str, Any]]:
    return list(store.db.query("select * from coverage where run_id = ? order by name", [run_id]))


def gate_pairs(store: Store) -> list[dict[str, Any]]:
    """(baseline, candidate) run pairs the gate has decided, newest first."""
    return list(store.db.query(
        "select baseline_run, candidate_run, max(decided_at) as decided_at, count(*) as items "
        "from gate_items group by baseline_run, candidate_run order by decided_at desc"))


def results_by_key(store: Store, run_id: str, table: str = "op_results",
                   columns: tuple[str, ...] | None = None) -> dict[str, dict[str, Any]]:
    """A run's result rows keyed by item key (only ``columns`` when given: rows hold large JSON)."""
    if table not in ("op_results", "model_results", "gen_results"):
        raise OpdbError(f"not a result table: {table!r}")
    cols = "*" if not columns else ", ".join(f"[{c}]" for c in dict.fromkeys(("item_key", *columns)))
    cur = store.db.execute(f"select {cols} from [{table}] where run_id = ?", [run_id])
    names = [d[0] for d in cur.description]
    return {row[0]: dict(zip(names, row, strict=True)) for row in cur}


def finished_runs(store: Store, *, target: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
    """Finished runs, newest first."""
    where, params = "status = 'finished'", []
    if target:
        where += " and target = ?"
        params.append(target)
    q = f"select * from runs where {where} order by started_at desc, id desc"
    if limit:
        q += f" limit {int(limit)}"
    return list(store.db.query(q, params))


def item_outcomes(store: Store, run_id: str) -> list[dict[str, Any]]:
    """(op, variant, dtype, status, errors) of every op result of a run."""
    return list(store.db.query(
        "select op, variant, dtype, status, max_abs_err, max_rel_err from op_results where run_id = ?", [run_id]))


def result_ids(store: Store, run_id: str, item_keys: list[str]) -> dict[str, int]:
    """Op result ids (what ``conformance repro`` takes) of some item keys of a run."""
    out: dict[str, int] = {}
    for i in range(0, len(item_keys), 500):
        chunk = item_keys[i:i + 500]
        marks = ", ".join("?" for _ in chunk)
        out.update(store.db.execute(f"select item_key, id from op_results where run_id = ? and item_key in ({marks})",
                                    [run_id, *chunk]).fetchall())
    return out


def item_history(store: Store, run_ids: list[str], item_keys: list[str]) -> list[dict[str, Any]]:
    """The rows of ``item_keys`` in each of ``run_ids``, op and model results, in one statement:
    ``run_id, item_key, status, contract_failed`` (op results) and ``recompiles``, ``model_id``,
    ``mode``, ``dtype``, ``loss_curve``, ``fingerprint``, ``noise`` (model results).

    What the gate's first-bad-build search reads: one call per gate, whatever the number of
    findings (ids and keys travel as two JSON arrays, so no parameter limit applies; each pair is
    one probe of the ``(run_id, item_key)`` index).
    """
    if not run_ids or not item_keys:
        return []
    runs, keys = json.dumps(list(dict.fromkeys(run_ids))), json.dumps(list(dict.fromkeys(item_keys)))
    return list(store.db.query(
        """select run_id, item_key, status, contract_failed, null as recompiles, null as model_id, null as mode,
                  null as dtype, null as loss_curve, null as fingerprint, null as noise from op_results
             where run_id in (select value from json_each(:runs)) and item_key in (select value from json_each(:keys))
           union all
           select run_id, item_key, status, null, recompiles, model_id, mode, dtype, loss_curve, fingerprint, noise
             from model_results
             where run_id in (select value from json_each(:runs)) and item_key in (select value from json_each(:keys))""",
        {"runs": runs, "keys": keys}))


def group_errors(store: Store, run_ids: list[str], ops: list[str]) -> list[dict[str, Any]]:
    """The op results of ``ops`` in each of ``run_ids`` with their status and errors, in one
    statement (what the first-bad-build search re-tests numerics on: statuses, max errors, error
    fingerprints)."""
    if not run_ids or not ops:
        return []
    return list(store.db.query(
        """select run_id, item_key, op, variant, dtype, status, max_rel_err, fingerprint from op_results
           where run_id in (select value from json_each(:runs)) and op in (select value from json_each(:ops))""",
        {"runs": json.dumps(list(dict.fromkeys(run_ids))), "ops": json.dumps(sorted(set(ops)))}))


def group_seconds(store: Store, *, target: str, torch_version: str, exclude_run: str | None = None) -> dict[str, float]:
    """Group key -> wall seconds the group took in the latest earlier run of ``target`` (under
    the same torch) that timed it: the prices of the next run's schedule and ETA."""
    rows = store.db.query(
        """select g.group_key, g.wall_s from group_times g join runs r on r.id = g.run_id
           where r.target = ? and r.torch_version = ? and g.run_id != ?
           order by r.started_at, g.run_id""", [target, torch_version, exclude_run or ""])
    return {r["group_key"]: r["wall_s"] for r in rows}  # later runs overwrite earlier ones
