"""Datasette's view of an opdb: the canned queries of ``opdb/browse.toml``, validated, as metadata.

``nox -s browse`` runs this file as a script (standard library only: the session's environment
holds Datasette, not the harness) to write the metadata it passes to ``datasette serve``::

    python opdb/browse.py results/opdb.sqlite --out /tmp/opdb-metadata.json

Example::

    >>> from opdb.browse import load_queries, metadata
    >>> [q.name for q in load_queries()]
    ['fallbacks_of_a_build', 'regressions_between_builds', 'worst_mismatches']
    >>> sorted(metadata("opdb")["databases"]["opdb"]["queries"])[0]
    'fallbacks_of_a_build'
"""

from __future__ import annotations

import json
import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

QUERIES = Path(__file__).with_name("browse.toml")
_TOP = {"title": str, "description": str, "query": list}
_QUERY = ("name", "title", "description", "sql")
_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")


class BrowseError(ValueError):
    """A bad canned-query file: names the file, the key and the value."""


@dataclass(frozen=True)
class CannedQuery:
    name: str  # the URL slug: /DB/NAME
    title: str
    description: str
    sql: str  # named parameters (:build) become Datasette's form fields

    @property
    def params(self) -> list[str]:
        """The named parameters, in order of first use."""
        return list(dict.fromkeys(re.findall(r"(?<![:\w]):([a-z_]\w*)", self.sql)))


def _err(path: Path, key: str, value: Any, expected: str) -> BrowseError:
    return BrowseError(f"{path}: {key} = {value!r}: expected {expected}")


def _load(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise BrowseError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise BrowseError(f"{path}: not UTF-8 (byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise BrowseError(f"{path}: not valid TOML ({exc})") from None


def load(path: Path = QUERIES) -> tuple[dict[str, str], list[CannedQuery]]:
    """(the database's title and description, its canned queries) from ``path``, validated."""
    data = _load(path)
    for key, value in data.items():
        if key not in _TOP:
            raise _err(path, key, value, f"only the keys {', '.join(_TOP)}")
        if not isinstance(value, _TOP[key]):
            raise _err(path, key, value, f"a {_TOP[key].__name__}")
    queries, seen = [], set()
    for i, q in enumerate(data.get("query", [])):
        where = f"query[{i}]"
        if not isinstance(q, dict):
            raise _err(path, where, q, "a table with " + ", ".join(_QUERY))
        for key in q:
            if key not in _QUERY:
                raise _err(path, f"{where}.{key}", q[key], "only the keys " + ", ".join(_QUERY))
        for key in _QUERY:
            if not isinstance(q.get(key), str) or not q[key].strip():
                raise _err(path, f"{where}.{key}", q.get(key), "a non-empty string")
        if not _NAME.match(q["name"]) or q["name"] in seen:
            raise _err(path, f"{where}.name", q["name"], "a new lowercase name of letters, digits and _")
        seen.add(q["name"])
        queries.append(CannedQuery(q["name"], q["title"], q["description"], q["sql"].strip()))
    if not queries:
        raise _err(path, "query", [], "at least one [[query]]")
    return {k: data[k] for k in ("title", "description") if k in data}, queries


def load_queries(path: Path = QUERIES) -> list[CannedQuery]:
    return load(path)[1]


def metadata(db_name: str, path: Path = QUERIES) -> dict[str, Any]:
    """Datasette metadata for a database served under ``db_name`` (its file's stem)."""
    about, queries = load(path)
    return {**about, "databases": {db_name: {
        **about,
        "queries": {q.name: {"title": q.title, "description": q.description, "sql": q.sql} for q in queries},
    }}}


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] != "--out":
        print("usage: python opdb/browse.py DB.sqlite --out METADATA.json", file=sys.stderr)
        return 2
    db, out = Path(argv[0]), Path(argv[2])
    try:
        meta = metadata(db.stem)
    except BrowseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out.write_text(json.dumps(meta, indent=1), encoding="utf-8")
    print(f"wrote {out}: {len(meta['databases'][db.stem]['queries'])} canned queries for {db}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
