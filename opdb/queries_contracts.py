"""Read queries over the contract checks of op results (the ``contracts`` and ``contract_failed``
columns): per op × dtype, each contract's outcome over its items, for the report's op pages and
matrix.

A contract's aggregate over a set of items is ``fail`` if any item failed it (with how many and
the first failure's detail), else ``pass`` if any passed, else ``n/a`` (with the first reason)
when every item that checked it could not; a contract no item checked is absent.

Example::

    >>> from opdb import Store
    >>> from opdb.queries_contracts import contract_outcomes
    >>> contract_outcomes(Store.memory(), "no-such-run")
    []
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .queries_counts import NOT_OPINFO
from .store import Store

#: Every contract, in the order reports show them (``conformance.check.contracts.CONTRACTS``; opdb imports
#: nothing of the harness, so a test holds the two equal). A stored name not in it is shown after.
CONTRACTS = ("metadata", "aliasing", "noncontiguous", "variants", "out", "errors", "determinism")
#: The outcomes a contract check stores, worst first (``conformance.check.contracts.Check.outcome``).
OUTCOMES = ("fail", "pass", "n/a")


def ordered_contracts(names: Iterable[str]) -> list[str]:
    """``names`` (deduplicated) in :data:`CONTRACTS` order, unknown ones after, sorted.

        >>> ordered_contracts(["out", "zeta", "metadata", "out"])
        ['metadata', 'out', 'zeta']
    """
    seen = set(names)
    return [c for c in CONTRACTS if c in seen] + sorted(seen - set(CONTRACTS))


@dataclass(frozen=True)
class ContractOutcome:
    """One contract over the items of one op × dtype."""

    op: str
    dtype: str
    contract: str
    outcome: str  # fail | pass | n/a
    items: int  # the items of that outcome (the failing ones for fail)
    checked: int  # the items that checked this contract at all
    detail: str  # the first (lowest id) item's detail of that outcome: why it failed, why n/a


def contract_outcomes(store: Store, run_id: str, op: str | None = None) -> list[ContractOutcome]:
    """Each contract's aggregate outcome per op × dtype of a run (of one op when ``op`` is given),
    ordered by op and dtype; rows whose ``contracts`` column is not JSON are left out."""
    where, params = "r.run_id = ?", [run_id]
    if op is not None:
        where, params = where + " and r.op = ?", [run_id, op]
    # One row per (op, dtype, contract, outcome); SQLite takes the bare detail column from the row
    # that gives min(r.id), so it is the first item's.
    rows = store.db.execute(
        f"""select r.op, coalesce(r.dtype, '-'), c.key, json_extract(c.value, '$.outcome'), count(*), min(r.id),
                   json_extract(c.value, '$.detail')
            from op_results r, json_each(case when json_valid(r.contracts) then r.contracts else '{{}}' end) c
            where {where} and c.type = 'object'
            group by r.op, r.dtype, c.key, json_extract(c.value, '$.outcome')""", params).fetchall()
    found: dict[tuple[str, str, str], dict[str, tuple[int, str]]] = {}
    for op_, dtype, contract, outcome, n, _first, detail in rows:
        found.setdefault((op_, dtype, contract), {})[str(outcome)] = (n, str(detail or ""))
    out = []
    for (op_, dtype, contract), by in sorted(found.items()):
        checked = sum(n for n, _ in by.values())
        outcome = next((o for o in OUTCOMES if o in by), sorted(by)[0])
        n, detail = by[outcome]
        out.append(ContractOutcome(op_, dtype, contract, outcome, n, checked, detail))
    return out


def matrix_contract_failures(store: Store, run_id: str) -> list[tuple[str, str, str, int]]:
    """``(op, dtype, contract, items)``: how many items of each OpInfo op × dtype failed each
    contract (from ``contract_failed``; schema-driven items and canaries are left out, as in the
    matrix's OpInfo rows)."""
    marks = ", ".join("?" for _ in NOT_OPINFO)
    counts: dict[tuple[str, str, str], int] = {}
    for op, dtype, failed, n in store.db.execute(
            f"""select op, coalesce(dtype, '-'), contract_failed, count(*) from op_results
                where run_id = ? and contract_failed is not null and contract_failed != ''
                  and coalesce(variant, '') not in ({marks})
                group by op, dtype, contract_failed""", [run_id, *NOT_OPINFO]):
        for name in str(failed).split(","):
            if name.strip():
                key = (op, dtype, name.strip())
                counts[key] = counts.get(key, 0) + n
    return [(*k, n) for k, n in sorted(counts.items())]
