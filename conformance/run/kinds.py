"""The work kinds a run knows, in the order a run lists their groups, and what is looked up
through them: a group's kind, an item key's kind, the groups of a selection.

To add a kind: implement :class:`conformance.work.WorkKind` next to its code and add it to
:data:`KINDS`.

Example::

    >>> [g.key for g in select_groups(["abs"], ["float32", "int64"])]
    ['abs|float32', 'abs|int64']
    >>> kind_of_item("mlp.d1w16.relu.none.bias|eager|float32|0").name
    'model'
"""

from __future__ import annotations

from collections.abc import Sequence

from conformance.customops import CUSTOM_OPS
from conformance.generate.lane import GENERATE
from conformance.models.runner import MODEL
from conformance.select import SelectionError, shard_of
from conformance.sweep.opinfo import OPINFO
from conformance.sweep.schema import SCHEMA
from conformance.sweep.traced import TRACED
from conformance.work import Group, ItemKey, Selection, WorkKind

# a new kind goes last: a shard takes every N-th group, and the others' shards stay as they were
KINDS: tuple[WorkKind, ...] = (OPINFO, SCHEMA, TRACED, MODEL, CUSTOM_OPS, GENERATE)
TABLES = tuple(dict.fromkeys(k.table for k in KINDS))  # the result tables a run writes
_BY_NAME = {k.name: k for k in KINDS}
_BY_VARIANT = {v: k for k in KINDS for v in k.variants}


def kind(name: str) -> WorkKind:
    """The work kind called ``name`` (:attr:`Group.kind`)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise SelectionError(f"unknown work kind {name!r}; known: {', '.join(_BY_NAME)}") from None


def kind_of(group: Group) -> WorkKind:
    return kind(group.kind)


def kind_of_item(key: str | ItemKey) -> WorkKind:
    """The kind that produced an item, from its key's variant (each kind owns its variants)."""
    key = key if isinstance(key, ItemKey) else ItemKey.parse(key)
    try:
        return _BY_VARIANT[key.variant]
    except KeyError:
        raise SelectionError(f"item {key}: no work kind has variant {key.variant!r}") from None


def groups_of(selection: Selection) -> list[Group]:
    """Every kind's groups for ``selection``, kind by kind in :data:`KINDS` order."""
    return [g for k in KINDS for g in k.groups(selection)]


def select_groups(ops: Sequence[str] | None = None, dtypes: Sequence[str] | None = None,
                  shard: tuple[int, int] = (1, 1), *, opinfo: bool = True, schema: bool = False,
                  models: Sequence[str] = (), model_limit: int | None = None) -> list[Group]:
    """The groups of a selection in a stable order, restricted to one shard: every (OpInfo,
    dtype) pair the CPU supports; with ``schema``, every overload no OpInfo reaches that a
    backend could see (``aten::`` globs in ``ops`` select among those, and alone select nothing
    else); with ``models``, every graph of those families (``all`` for every family)."""
    selection = Selection(tuple(ops or ()), tuple(dtypes or ()), opinfo, schema, tuple(models), model_limit)
    return shard_of(groups_of(selection), shard)
