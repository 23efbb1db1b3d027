"""The schema search's corpus: stored inputs per ATen overload (table ``schema_corpus``).

Entries are written through the one write path (``Store.insert("schema_corpus", rows,
replace=True)``: one entry per overload, the newest wins); this module holds the read.
What an entry means, and how it is replayed, is :mod:`conformance.inputs.corpus`'s.

Example::

    >>> from opdb import Store
    >>> from opdb.corpus import corpus_entries
    >>> store = Store.memory()
    >>> _ = store.insert("schema_corpus", [{"overload": "aten::abs.default", "fingerprint": "f1"}], replace=True)
    >>> sorted(corpus_entries(store, ["aten::abs.default", "aten::neg.default"]))
    ['aten::abs.default']
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .store import Store

TABLE = "schema_corpus"


def corpus_entries(store: Store, overloads: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
    """The stored entries (whole rows, ``inputs`` as bytes) by overload name: of ``overloads``,
    or all of them when None."""
    rows = {r["overload"]: r for r in store.db.query(f"select * from [{TABLE}]")}
    if overloads is None:
        return rows
    return {name: rows[name] for name in overloads if name in rows}
