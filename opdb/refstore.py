"""The file of the CPU-side reference cache: one SQLite table of encoded values by hint.

A cache, not a record: it lives in its own file beside the results database
(``DB.refcache.sqlite``), every worker process opens it, rows of another environment are deleted
on open, a damaged file is replaced by an empty one, and a write that stays busy past the timeout
is dropped. What the values are and when they are taken is
:mod:`conformance.check.refcache`'s.

Example::

    >>> import tempfile
    >>> from pathlib import Path
    >>> s = RefStore(Path(tempfile.mkdtemp()) / "r.sqlite", env="e1")
    >>> s.put("h", "d", b"value", seconds=0.5)
    0
    >>> s.get("h"), s.hints(), s.total_bytes()
    (('d', b'value'), {'h'}, 5)
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

_TABLE = ("CREATE TABLE IF NOT EXISTS refs (hint TEXT PRIMARY KEY, digest TEXT NOT NULL, env TEXT NOT NULL,"
          " value BLOB NOT NULL, bytes INTEGER NOT NULL, seconds REAL NOT NULL, used REAL NOT NULL)")


class RefStore:
    """The rows of one environment (``env``) in the cache file at ``path``."""

    def __init__(self, path: str | Path, *, env: str, timeout: float = 30.0) -> None:
        self.path, self.env, self.timeout = Path(path), env, timeout
        try:
            self._db = self._connect()
            self._db.execute("DELETE FROM refs WHERE env != ?", (env,))
        except sqlite3.DatabaseError:  # a damaged file: a new, empty one (it is only a cache)
            self.path.unlink(missing_ok=True)
            self._db = self._connect()

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")  # workers read while another writes
        db.execute("PRAGMA synchronous=NORMAL")  # no fsync per entry: a lost entry is recomputed
        db.execute(_TABLE)
        return db

    def hints(self) -> set[str]:
        return {h for (h,) in self._db.execute("SELECT hint FROM refs")}

    def total_bytes(self) -> int:
        return int(self._db.execute("SELECT COALESCE(SUM(bytes), 0) FROM refs").fetchone()[0])

    def get(self, hint: str) -> tuple[str, bytes] | None:
        """(digest, value) stored for ``hint``, marked as used now; None when there is none."""
        row = self._db.execute("SELECT digest, value FROM refs WHERE hint = ?", (hint,)).fetchone()
        if row is None:
            return None
        try:
            self._db.execute("UPDATE refs SET used = ? WHERE hint = ?", (time.time(), hint))
        except sqlite3.OperationalError:  # busy: the entry just looks older than it is
            pass
        return row[0], row[1]

    def put(self, hint: str, digest: str, value: bytes, *, seconds: float) -> int | None:
        """Store (or replace) ``hint``'s row; the bytes of the row it replaced (0: none), None
        when the file stayed busy past the timeout (nothing stored)."""
        try:
            old = self._db.execute("SELECT bytes FROM refs WHERE hint = ?", (hint,)).fetchone()
            self._db.execute("INSERT OR REPLACE INTO refs VALUES (?, ?, ?, ?, ?, ?, ?)",
                             (hint, digest, self.env, value, len(value), seconds, time.time()))
        except sqlite3.OperationalError:
            return None
        return int(old[0]) if old else 0

    def evict(self, keep_bytes: int) -> tuple[list[str], int]:
        """Delete the least recently used rows until at most ``keep_bytes`` remain; the hints
        deleted and the bytes left."""
        rows = self._db.execute("SELECT hint, bytes FROM refs ORDER BY used").fetchall()
        total = sum(b for _, b in rows)
        gone = []
        for hint, n in rows:
            if total <= keep_bytes:
                break
            gone.append(hint)
            total -= n
        try:
            self._db.executemany("DELETE FROM refs WHERE hint = ?", [(h,) for h in gone])
        except sqlite3.OperationalError:
            return [], self.total_bytes()
        return gone, total

    def retag(self, env: str) -> None:
        """Mark every row as stored under ``env`` (tests: as if written by another torch)."""
        self._db.execute("UPDATE refs SET env = ?", (env,))

    def close(self) -> None:
        self._db.close()
