"""Op signatures traced from model graphs (tables ``traced_signatures`` and ``traced_uses``).

A signature is one ATen overload with its arguments' structure (shapes, strides, storage offsets,
dtypes, the non-tensor arguments) and the kind of values its tensors held, content-keyed and
per torch version; a use is a model graph that calls it, with how often. What a signature
means and how it is replayed is :mod:`conformance.sweep.traced`'s; this module writes and reads
them, so that one night's builds share one trace.

Example::

    >>> from opdb import Store
    >>> from opdb.traced import record, selected, uses
    >>> store = Store.memory()
    >>> sig = {"key": "k1", "op": "aten::mm.default", "dtype": "float32", "spec": "{}", "numel": 8, "nbytes": 32}
    >>> record(store, "2.13.0", [sig], {("k1", "gpt.a"): 3, ("k1", "vit.b"): 1})
    1
    >>> [(s["op"], s["calls"], s["models"]) for s in selected(store, "2.13.0")]
    [('aten::mm.default', 4, 2)]
    >>> uses(store, "2.13.0", ["k1"])["k1"]
    [('gpt.a', 3), ('vit.b', 1)]
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping
from typing import Any

from .store import Store

TABLE, USES = "traced_signatures", "traced_uses"


def record(store: Store, torch_version: str, signatures: Iterable[Mapping[str, Any]],
           calls: Mapping[tuple[str, str], int]) -> int:
    """Store signatures (each with ``key``, ``op``, ``dtype``, ``spec``, ``numel``, ``nbytes``)
    and their uses (``(key, model) -> calls``), adding to what a trace stored before (a model
    traced again replaces its own counts); returns how many signatures are new."""
    before = {r[0] for r in store.db.execute(f"select key from [{TABLE}] where torch_version = ?", [torch_version])}
    store.insert(USES, [{"torch_version": torch_version, "key": k, "model": m, "calls": int(n)}
                        for (k, m), n in sorted(calls.items())], replace=True)
    totals = {r[0]: (r[1], r[2]) for r in store.db.execute(
        f"select key, sum(calls), count(*) from [{USES}] where torch_version = ? group by key", [torch_version])}
    rows = []
    for s in signatures:
        n_calls, n_models = totals.get(s["key"], (0, 0))
        rows.append({**{k: s[k] for k in ("key", "op", "dtype", "spec", "numel", "nbytes")},
                     "torch_version": torch_version, "calls": int(n_calls), "models": int(n_models)})
    store.insert(TABLE, rows, replace=True)
    return len({r["key"] for r in rows} - before)


def selected(store: Store, torch_version: str) -> list[dict[str, Any]]:
    """Every signature stored for ``torch_version`` (whole rows), by overload, dtype and key."""
    return list(store.db.query(f"select * from [{TABLE}] where torch_version = ? order by op, dtype, key",
                               [torch_version]))


def uses(store: Store, torch_version: str, keys: Iterable[str]) -> dict[str, list[tuple[str, int]]]:
    """``key -> [(model, calls), ...]`` (most calls first) for the given signature keys."""
    keys = list(dict.fromkeys(keys))
    out: dict[str, list[tuple[str, int]]] = collections.defaultdict(list)
    for i in range(0, len(keys), 500):
        chunk = keys[i:i + 500]
        marks = ", ".join("?" * len(chunk))
        for key, model, n in store.db.execute(
                f"select key, model, calls from [{USES}] where torch_version = ? and key in ({marks}) "
                "order by key, calls desc, model", [torch_version, *chunk]):
            out[key].append((model, n))
    return dict(out)


def summary(store: Store, torch_version: str) -> dict[str, int]:
    """Counts of what is stored for ``torch_version``: signatures, overloads, calls, models."""
    sigs, ops, calls = store.db.execute(
        f"select count(*), count(distinct op), coalesce(sum(calls), 0) from [{TABLE}] where torch_version = ?",
        [torch_version]).fetchone()
    models = store.db.execute(f"select count(distinct model) from [{USES}] where torch_version = ?",
                              [torch_version]).fetchone()[0]
    return {"signatures": sigs, "overloads": ops, "calls": calls, "models": models}


__all__ = ["TABLE", "USES", "record", "selected", "summary", "uses"]
