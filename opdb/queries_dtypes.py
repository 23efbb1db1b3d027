"""Read queries over the dtype probes of a run (variant ``dtypes``, ``conformance.sweep.dtypes``):
per op x dtype, what the OpInfo claims, what runs on the CPU and on the target, forward and
backward, and the verdict, for the report's op pages and matrix.

A probe's record is its row's ``proof.dtypes``: ``claimed``/``cpu``/``device``, each
``{"forward": ..., "backward": ...}`` (a claim true or false; a side ``ok``, ``raises``, ``mixed``
or ``n/a`` over the samples probed), and a ``note`` where the CPU contradicts the claim.

Example::

    >>> from opdb import Store
    >>> dtype_probes(Store.memory(), "no-such-run")
    []
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .status import FAILING
from .store import Store

#: The dtype probe's variant (``conformance.select.DTYPE_PROBE``; opdb imports nothing of the
#: harness, so a test holds the two equal). Its items are no samples: the matrix counts them apart.
DTYPE_PROBE = "dtypes"
DIRECTIONS = ("forward", "backward")


@dataclass(frozen=True)
class DtypeProbe:
    """One op x dtype's probe in a run."""

    op: str
    dtype: str
    status: str
    error: str | None  # why it fails, or why it was skipped (no sample)
    claimed: tuple[bool | None, bool | None]  # the OpInfo's claim, forward and backward (None: not probed)
    cpu: tuple[str, str]  # ok | raises | mixed | n/a, forward and backward ("" when not probed)
    device: tuple[str, str]
    note: str | None  # where the CPU contradicts the claim (recorded, not failed)
    item_id: int

    @property
    def failing(self) -> bool:
        return self.status in FAILING


def _pair(record: dict[str, Any], side: str, default: Any) -> tuple[Any, Any]:
    got = record.get(side) if isinstance(record.get(side), dict) else {}
    return tuple(got.get(d, default) for d in DIRECTIONS)  # type: ignore[return-value]


def dtype_probes(store: Store, run_id: str, op: str | None = None) -> list[DtypeProbe]:
    """Every dtype probe of a run (of one op when ``op`` is given), by op and dtype."""
    where, params = "run_id = ? and variant = ?", [run_id, DTYPE_PROBE]
    if op is not None:
        where, params = where + " and op = ?", [*params, op]
    out = []
    for op_, dtype, status, error, proof, item_id in store.db.execute(
            f"""select op, coalesce(dtype, '-'), status, error, json_extract(proof, '$.dtypes'), id
                from op_results where {where} order by op, dtype, id""", params):
        try:
            record = json.loads(proof) if proof else {}
        except ValueError:
            record = {}
        record = record if isinstance(record, dict) else {}
        out.append(DtypeProbe(op_, dtype, status, error, _pair(record, "claimed", None), _pair(record, "cpu", ""),
                              _pair(record, "device", ""), record.get("note"), item_id))
    return out
