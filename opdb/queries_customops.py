"""Read queries over a run's custom-op items (the custom-op lane, variants
:data:`opdb.queries_counts.CUSTOM_OP_VARIANTS`): per custom op x dtype x check, the worst status
of its items, the opcheck tests that failed and the first failure's text, for the build page.

Example::

    >>> from opdb import Store
    >>> custom_op_checks(Store.memory(), "no-such-run")
    []
"""

from __future__ import annotations

from dataclasses import dataclass

from .queries_counts import CUSTOM_OP_VARIANTS
from .status import FAILING, worst
from .store import Store


@dataclass(frozen=True)
class CustomOpCheck:
    """One check (variant) of one custom op x dtype in a run."""

    op: str  # the overload, e.g. neuron::rms_norm.default
    dtype: str
    variant: str  # opcheck | custom_fwd | custom_bwd | custom_compile
    status: str  # the worst status of its items
    items: int
    failing: int  # items with a failing status
    failed_checks: tuple[str, ...]  # the opcheck tests that failed (test_faketensor, ...), in first-seen order
    error: str  # the first failing item's error ('' when none failed)


def custom_op_checks(store: Store, run_id: str) -> list[CustomOpCheck]:
    """Every custom op x dtype x check of a run, ordered by op, dtype and check."""
    marks = ", ".join("?" for _ in CUSTOM_OP_VARIANTS)
    groups: dict[tuple[str, str, str], list[tuple[str, str | None, str | None]]] = {}
    for op, dtype, variant, status, failed, error in store.db.execute(
            f"""select op, coalesce(dtype, '-'), variant, status, contract_failed, error from op_results
                where run_id = ? and variant in ({marks}) order by op, dtype, variant, sample, id""",
            [run_id, *CUSTOM_OP_VARIANTS]):
        groups.setdefault((op, dtype, variant), []).append((status, failed, error))
    out = []
    for (op, dtype, variant), items in groups.items():
        bad = [(failed, error) for status, failed, error in items if status in FAILING]
        checks = dict.fromkeys(c for failed, _ in bad for c in (failed or "").split(",") if c)
        out.append(CustomOpCheck(op, dtype, variant, worst(s for s, _, _ in items) or "", len(items), len(bad),
                                 tuple(checks), (bad[0][1] or "") if bad else ""))
    order = {v: i for i, v in enumerate(CUSTOM_OP_VARIANTS)}
    return sorted(out, key=lambda c: (c.op, c.dtype, order.get(c.variant, len(order))))
