"""The knowledge file: what a team knows about a cause (an explanation, a workaround, an upstream
issue, an owner), kept beside the code so it survives across builds. The shipped one is
``conformance/data/causes.toml``; ``$CONFORMANCE_KNOWLEDGE`` names a team's own for every
command (``conformance errors --knowledge FILE`` for one call). A cause no entry
matches is *unexplained*.

An entry matches a cause by its ``key`` (the ``C…`` hash ``conformance errors`` prints), or by
``match``, a regular expression searched in the cause's one-line text (``kind at locus: Exc:
pattern``), optionally only for one ``kind``. An entry with ``ops`` (fnmatch globs over OpInfo
names and ATen overloads) matches only a cause whose every item is an op item of those ops: what
a team knows of one op's failure need not hold for the same signature elsewhere. The first entry
that matches wins.

Example::

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "k.toml"
    >>> _ = p.write_text('[[cause]]\\nmatch = "sparse tensors"\\nexplanation = "no sparse kernels"\\n')
    >>> k = load(p)
    >>> k.find("C0000000000", "unsupported_layout: NotImplementedError: ... with sparse tensors").explanation
    'no sparse kernels'
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conformance.datafiles import DATA, DataFileError, read_toml
from conformance.datafiles import bad_value as _bad
from conformance.datafiles import check_keys as _keys
from conformance.datafiles import nonblank as _text

KNOWLEDGE = DATA / "causes.toml"
#: Names a team's own knowledge file for every command (``errors --knowledge`` overrides it).
ENV = "CONFORMANCE_KNOWLEDGE"
_KEY = re.compile(r"^C[0-9a-f]{10}$")
_KIND = re.compile(r"^(?:[a-z_]+|contract(?::[a-z_]+)?)$")


@dataclass(frozen=True)
class Entry:
    where: str  # "FILE:[[cause]] N" (1-based), what the report and the CLI cite
    explanation: str
    key: str | None = None
    match: re.Pattern[str] | None = None
    kind: str | None = None
    workaround: str | None = None
    upstream: str | None = None
    owner: str | None = None
    ops: tuple[str, ...] | None = None

    def matches(self, key: str, text: str, ops: Collection[str] | None = None) -> bool:
        """Whether this entry explains the cause ``key`` with one-line text ``text``, whose items
        are op items of ``ops`` (None: unknown, or the cause reaches a model too)."""
        if self.ops is not None and not (ops and all(any(fnmatch.fnmatchcase(o, g) for g in self.ops) for o in ops)):
            return False
        if self.key is not None:
            return key == self.key
        if self.kind is not None and not (text.startswith(self.kind + ":") or text.startswith(self.kind + " at ")):
            return False
        return self.match is not None and self.match.search(text) is not None

    def as_json(self) -> dict[str, str | None]:
        return {"explanation": self.explanation, "workaround": self.workaround, "upstream": self.upstream,
                "owner": self.owner, "knowledge": self.where}


@dataclass(frozen=True)
class Knowledge:
    path: Path
    entries: tuple[Entry, ...]

    def find(self, key: str, text: str, ops: Collection[str] | None = None) -> Entry | None:
        """The first entry matching the cause ``key`` whose one-line text is ``text`` and whose
        items are op items of ``ops`` (see :meth:`Entry.matches`)."""
        return next((e for e in self.entries if e.matches(key, text, ops)), None)


def default_path() -> Path:
    """The knowledge file every command uses: ``$CONFORMANCE_KNOWLEDGE``, else the shipped one."""
    return Path(os.environ[ENV]) if os.environ.get(ENV) else KNOWLEDGE


def _optional(path: Path, key: str, value: Any) -> str | None:
    return None if value is None else _text(path, key, value)


@functools.cache
def load(path: Path = KNOWLEDGE) -> Knowledge:
    """The validated knowledge file; a bad entry is one DataFileError naming file, entry and value."""
    path = Path(path)
    raw = read_toml(path)
    _keys(path, "", raw, set(), {"cause"})
    items = raw.get("cause", [])
    if not isinstance(items, list):
        raise _bad(path, "cause", items, "an array of tables [[cause]]")
    entries = []
    for i, item in enumerate(items):
        where = f"cause[{i}]"
        _keys(path, where, item, {"explanation"}, {"key", "match", "kind", "workaround", "upstream", "owner", "ops"})
        if ("key" in item) == ("match" in item):
            raise DataFileError(f"{path}: {where} must have exactly one of key (a cause's C… key) or match "
                                f"(a regular expression over its text); it has {'both' if 'key' in item else 'neither'}")
        key = match = kind = None
        if "key" in item:
            key = item["key"]
            if not isinstance(key, str) or not _KEY.match(key):
                raise _bad(path, f"{where}.key", key, "a cause key: C and 10 hex digits, as `conformance errors` prints")
        else:
            text = _text(path, f"{where}.match", item["match"])
            try:
                match = re.compile(text)
            except re.error as exc:
                raise _bad(path, f"{where}.match", text, f"a Python regular expression ({exc})") from None
        if "kind" in item:
            kind = item["kind"]
            if not isinstance(kind, str) or not _KIND.match(kind):
                raise _bad(path, f"{where}.kind", kind, "a status (error, mismatch, ...) or contract:<name>")
        ops = None
        if "ops" in item:
            ops = item["ops"]
            if not isinstance(ops, list) or not ops or not all(isinstance(o, str) and o.strip() for o in ops):
                raise _bad(path, f"{where}.ops", ops, "a non-empty list of op globs (OpInfo names or aten:: overloads)")
            ops = tuple(ops)
        upstream = _optional(path, f"{where}.upstream", item.get("upstream"))
        if upstream is not None and not upstream.startswith(("https://", "http://")):
            raise _bad(path, f"{where}.upstream", upstream, "an http(s):// link to the upstream issue")
        entries.append(Entry(f"{path.name}:[[cause]] {i + 1}", _text(path, f"{where}.explanation", item["explanation"]),
                             key, match, kind, _optional(path, f"{where}.workaround", item.get("workaround")),
                             upstream, _optional(path, f"{where}.owner", item.get("owner")), ops))
    return Knowledge(path, tuple(entries))


__all__ = ["KNOWLEDGE", "DataFileError", "Entry", "Knowledge", "load"]
