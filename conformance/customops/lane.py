"""The custom-op lane as a work kind (:data:`CUSTOM_OPS`): a group per dtype whose worker
discovers the custom ops of its own target and yields every item of each (:mod:`.items`).

Groups are listed without a target, so a group names what it selects, not what it will find: its
``op`` is the selection's custom-op globs (``neuron::*``; ``*::*``, every custom op, in a run
without ``--ops``), its dtype one of :data:`DTYPES`. Its items are named by the op each found
(``neuron::rms_norm.default|custom_fwd|float32|0``), so results, the gate and re-runs see them as
they see ATen ops; a re-run's group is the op's own name, a glob matching only it. Which group
holds an item (resume, a restarted worker's skips) is :meth:`CustomOpLane.holds`.

Example::

    >>> from conformance.work import Selection
    >>> [g.key for g in CUSTOM_OPS.groups(Selection(ops=("neuron::*",), dtypes=("float32",)))]
    ['neuron::*|float32']
    >>> [g.key for g in CUSTOM_OPS.groups(Selection(dtypes=("float32", "int64")))]
    ['*::*|float32']
    >>> CUSTOM_OPS.groups(Selection(ops=("abs",)))
    []
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterator
from fnmatch import fnmatchcase
from typing import Any

from conformance.select import SelectionError, parse_dtypes
from conformance.work import NOTHING, Group, ItemKey, Selection

from .variants import VARIANTS

#: The dtypes the lane runs (a custom kernel's working dtypes: float32, and bfloat16 as trained).
DTYPES = ("float32", "bfloat16")
#: A run without ``--ops`` checks every custom op its target has.
EVERY = "*::*"


def globs_of(group_op: str) -> list[str]:
    return [g for g in group_op.split(",") if g]


def selects(group_op: str, op: str) -> bool:
    """Whether a group's globs select the overload ``op`` (by its overload name or its name
    without the overload: ``neuron::rms_norm`` selects ``neuron::rms_norm.default``)."""
    bare = op.rsplit(".", 1)[0]
    return any(fnmatchcase(op, g) or fnmatchcase(bare, g) for g in globs_of(group_op))


class CustomOpLane:
    """The work kind: one group per dtype of :data:`DTYPES` the selection asks for, when its
    ``--ops`` hold custom-op globs (a namespace other than ``aten::``) or it has none at all."""

    name = "custom_ops"
    table = "op_results"
    variants = VARIANTS
    crash_safe_factor = 0  # a death is the item's crash (or its reference's, on the CPU)
    timeout_factor = 1

    def groups(self, selection: Selection) -> list[Group]:
        globs = selection.custom_globs
        if not globs and (selection.ops or not selection.opinfo):
            return []
        bad = [g for g in globs if ItemKey.SEP in g or "," in g]
        if bad:
            raise SelectionError(f"op glob {bad[0]!r}: a custom-op glob may hold neither '|' nor ','")
        return [Group(",".join(globs) or EVERY, d, self.name) for d in parse_dtypes(selection.dtypes) if d in DTYPES]

    def holds(self, group: Group, key: ItemKey) -> bool:
        """Whether ``key`` is an item of ``group`` (its name need not be the group's)."""
        return key.variant in self.variants and key.dtype == group.dtype and selects(group.op, key.name)

    def run(self, target: Any, group: Group, config: Any, *, skip: Container[str] = NOTHING,
            on_start: Callable[[str], None] | None = None) -> Iterator[dict[str, Any]]:
        from conformance.check.verdict import decide_unrun

        from .discovery import discover
        from .items import op_rows

        try:
            ops = [op for op in discover(target.device) if selects(group.op, op)]
        except Exception as exc:  # noqa: BLE001 - one row says the lane could not look
            key = str(ItemKey(group.op, VARIANTS[0], group.dtype, -1))
            if key not in skip:
                yield {**self.synthetic_row(ItemKey.parse(key)), "item_key": key, "status": decide_unrun("harness").value,
                       "seed": config.seed, "duration_s": 0.0,
                       "error": f"infra: discovering the target's custom ops failed: {type(exc).__name__}: {exc}"[:2000]}
            return
        for op in ops:
            yield from op_rows(target, op, group.dtype, config, skip, on_start)

    def synthetic_row(self, key: ItemKey) -> dict[str, Any]:
        return {"op": key.name, "variant": key.variant, "dtype": key.dtype, "sample": int(key.sample)}


CUSTOM_OPS = CustomOpLane()
