"""Error causes in the store: the failing rows a cause is computed from, the one write that
replaces a run's causes, and the reads of the ``errors`` command, the gate and the report.

A cause's history is not stored apart: it is read from ``cause_reach`` over the runs of a
target, ordered by when they started, so merging, re-running or deleting a run cannot leave
it stale.

Example::

    >>> from opdb import Store
    >>> from opdb.queries_causes import run_causes, cause_run
    >>> st = Store.memory()
    >>> cause_run(st, "r1") is None, run_causes(st, "r1")
    (True, [])
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .status import FAILING
from .store import Store, now

_FAILING = tuple(sorted(s.value for s in FAILING))
_IN = f"({', '.join('?' * len(_FAILING))})"
#: Columns a cause is computed from, per results table.
FAILING_COLUMNS = {
    "op_results": ("id", "item_key", "op", "variant", "dtype", "sample", "status", "error", "contracts", "contract_failed",
                   "dtype_ok", "shape_ok", "nan_agree", "fingerprint", "comparator", "native_ops", "signature", "proof"),
    "model_results": ("id", "item_key", "model_id", "family", "dtype", "mode", "status", "error",
                      "first_divergent_op", "fwd_rel_err"),
}


def failing_rows(store: Store, run_id: str, table: str) -> Iterator[dict[str, Any]]:
    """The failing rows of a run in ``table``, in id order, with :data:`FAILING_COLUMNS` (and
    ``output`` for a crash or a timeout)."""
    cols = ", ".join(FAILING_COLUMNS[table])
    # what a crashed or hung worker printed (its native crash report), for those items only
    output = "case when status in ('crash', 'timeout') then output end as output"
    return store.db.query(f"select {cols}, {output} from [{table}] where run_id = ? and status in {_IN} order by id",
                          [run_id, *_FAILING])


def native_counts(store: Store, run_id: str, status: str = "mismatch") -> dict[str, tuple[int, int]]:
    """Per ATen overload that ran natively on the target in a run: (items of ``status`` that
    reached it, all items that reached it). What a mismatch is blamed on is computed from it."""
    return {r[0]: (r[1], r[2]) for r in store.db.execute(
        """select j.value, sum(o.status = ?), count(*) from op_results o, json_each(o.native_ops) j
           where o.run_id = ? and json_valid(o.native_ops) group by j.value""", [status, run_id])}


def float32_passing(store: Store, run_id: str) -> dict[tuple[str, str, int], float | None]:
    """{(op, variant, sample): RMS error in eps against the CPU (None: not measured)} of a run's
    float32 op items that pass."""
    return {(r[0], r[1], r[2]): r[3] for r in store.db.execute(
        "select op, variant, sample, case when json_valid(fingerprint) then json_extract(fingerprint, '$.rms') end "
        "from op_results where run_id = ? and dtype = 'float32' and status in ('pass', 'pass_fallback')", [run_id])}


def cause_run(store: Store, run_id: str) -> dict[str, Any] | None:
    rows = list(store.db.query("select * from cause_runs where run_id = ?", [run_id]))
    return rows[0] if rows else None


def replace_run_causes(store: Store, run_id: str, *, rules: str, causes: Sequence[dict[str, Any]],
                       reach: Sequence[dict[str, Any]], assigned: dict[str, list[tuple[str, int]]],
                       failing: int) -> None:
    """Store a run's causes in one transaction: the cause rows (insert or replace), the run's
    reach rows and each failing item's ``cause`` column (replacing what the run had)."""
    with store._transaction():
        store.insert("causes", causes, replace=True)
        store.db.execute("delete from cause_reach where run_id = ?", [run_id])
        store.insert("cause_reach", reach)
        for table, pairs in assigned.items():
            store.db.execute(f"update [{table}] set cause = null where run_id = ? and cause is not null", [run_id])
            store.db.conn.executemany(f"update [{table}] set cause = ? where id = ?", pairs)
        store.insert("cause_runs", [{"run_id": run_id, "rules": rules, "failing": failing, "causes": len(reach),
                                     "computed_at": now()}], replace=True)


def set_knowledge(store: Store, notes: dict[str, dict[str, str | None]]) -> None:
    """Write each cause's knowledge-file fields (every field, NULL where no entry matches)."""
    fields_ = ("explanation", "workaround", "upstream", "owner", "knowledge")
    with store._transaction():
        store.db.conn.executemany(
            f"update causes set {', '.join(f'{f} = ?' for f in fields_)} where key = ?",
            [[note.get(f) for f in fields_] + [key] for key, note in notes.items()])


def cause_ops(store: Store) -> dict[str, set[str] | None]:
    """Per cause, every op its items are of over all stored runs; None for a cause that reaches a
    model too (its items are not all op items)."""
    out: dict[str, set[str] | None] = {}
    for cause, ops, models in store.db.execute("select cause, ops, models from cause_reach"):
        if out.get(cause, set()) is None:
            continue
        if models and json.loads(models):
            out[cause] = None
            continue
        out.setdefault(cause, set()).update(json.loads(ops or "[]"))
    return out


def all_causes(store: Store) -> list[dict[str, Any]]:
    return list(store.db.query("select * from causes order by key"))


@dataclass
class CauseReach:
    """One cause in one run, with its history over the runs of the same target."""

    key: str
    kind: str
    exc: str
    pattern: str
    locus: str
    items: int
    statuses: dict[str, int]
    ops: list[str]
    dtypes: list[str]
    models: list[str]
    example: str
    example_key: str
    repro_id: int | None
    repro_signature: str | None
    explanation: str | None = None
    workaround: str | None = None
    upstream: str | None = None
    owner: str | None = None
    knowledge: str | None = None
    # (build, run id, items) of every run of the target that has causes, oldest first (0: absent)
    trend: list[tuple[str, str, int]] = field(default_factory=list)
    targets: list[str] = field(default_factory=list)  # every target whose runs show it

    @property
    def first_seen(self) -> tuple[str, str] | None:
        """(build, run) of the first run of the target that shows it."""
        return next(((b, r) for b, r, n in self.trend if n), None)

    @property
    def last_seen(self) -> tuple[str, str] | None:
        return next(((b, r) for b, r, n in reversed(self.trend) if n), None)

    def text(self) -> str:
        where = f" at {self.locus}" if self.locus else ""
        return f"{self.kind}{where}: {self.exc + ': ' if self.exc else ''}{self.pattern}"


def _loads(v: Any, default: Any) -> Any:
    try:
        return json.loads(v) if v else default
    except (TypeError, ValueError):
        return default


def run_causes(store: Store, run_id: str, *, history: bool = True) -> list[CauseReach]:
    """The causes of a run, the widest reach first (items, then key), each with its trend over
    the runs of the same target and the targets that show it (``history``)."""
    rows = list(store.db.query(
        """select c.*, r.items, r.statuses, r.ops, r.dtypes, r.models, r.example, r.example_key, r.repro_id,
                  r.repro_signature
           from cause_reach r join causes c on c.key = r.cause where r.run_id = ?
           order by r.items desc, c.key""", [run_id]))
    out = [CauseReach(r["key"], r["kind"], r["exc"] or "", r["pattern"], r["locus"] or "", r["items"],
                      _loads(r["statuses"], {}), _loads(r["ops"], []), _loads(r["dtypes"], []),
                      _loads(r["models"], []), r["example"] or "", r["example_key"] or "", r["repro_id"],
                      r["repro_signature"], r["explanation"], r["workaround"], r["upstream"], r["owner"],
                      r["knowledge"]) for r in rows]
    if history and out:
        runs = target_runs(store, run_id)
        counts: dict[str, dict[str, int]] = {}
        for cause, rid, n in store.db.execute(
                f"select cause, run_id, items from cause_reach where run_id in ({', '.join('?' * len(runs))})",
                [r[1] for r in runs]):
            counts.setdefault(cause, {})[rid] = n
        targets: dict[str, set[str]] = {}
        for cause, target in store.db.execute(
                "select distinct x.cause, u.target from cause_reach x join runs u on u.id = x.run_id"):
            targets.setdefault(cause, set()).add(target)
        for c in out:
            seen = counts.get(c.key, {})
            c.trend = [(build, rid, seen.get(rid, 0)) for build, rid in runs]
            c.targets = sorted(targets.get(c.key, ()))
    return out


def target_runs(store: Store, run_id: str) -> list[tuple[str, str]]:
    """(build, run id) of every run of ``run_id``'s target that has causes, oldest first, up to
    and including ``run_id`` (a cause's history as that run saw it)."""
    return [(r[0], r[1]) for r in store.db.execute(
        """select u.build, u.id from runs u join cause_runs c on c.run_id = u.id
           where u.target = (select target from runs where id = ?)
             and (u.started_at, u.id) <= (select started_at, id from runs where id = ?)
           order by u.started_at, u.id""", [run_id, run_id])]


def cause_keys(store: Store, run_id: str) -> dict[str, int]:
    """{cause: items} of a run."""
    return dict(store.db.execute("select cause, items from cause_reach where run_id = ?", [run_id]).fetchall())


def cause_members(store: Store, run_id: str, table: str, cause: str) -> list[dict[str, Any]]:
    """The items of a run in ``table`` that have ``cause`` (key, status, error), in id order."""
    return list(store.db.query(f"select item_key, status, error from [{table}] where run_id = ? and cause = ? "
                               "order by id", [run_id, cause]))


def cause_builds(store: Store, keys: Sequence[str]) -> dict[str, list[str]]:
    """{cause: ["target build", ...]} of the runs (with causes computed) that show each cause,
    oldest first."""
    out: dict[str, list[str]] = {}
    keys = list(keys)
    for start in range(0, len(keys), 500):
        part = keys[start:start + 500]
        for cause, target, build in store.db.execute(
                f"""select x.cause, u.target, u.build from cause_reach x join runs u on u.id = x.run_id
                    where x.cause in ({', '.join('?' * len(part))}) order by u.started_at, u.id""", part):
            seen = out.setdefault(cause, [])
            if f"{target} {build}" not in seen:
                seen.append(f"{target} {build}")
    return out
