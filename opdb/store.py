"""The result store: one SQLite file, opened through :class:`Store`.

Every write goes through :meth:`Store.insert` (batched ``insert_all``); every read the rest of
the project needs is a named method here or in :mod:`opdb.queries`.

Example::

    >>> from opdb import Store
    >>> store = Store.memory()
    >>> run = store.start_run(target="cpu", build="-", torch_version="2.13.0", config={})
    >>> store.insert("op_results", [{"run_id": run, "item_key": "abs|function|float32|0",
    ...                              "status": "pass"}])
    1
    >>> store.done_keys("op_results", run)
    {'abs|function|float32|0'}
"""

from __future__ import annotations

import datetime as _dt
import itertools
import json
import os
import socket
import sqlite3
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlite_utils

from . import schema
from .status import FAILING

SQLITE_MAGIC = b"SQLite format 3\x00"
BUSY_TIMEOUT_MS = 60_000
# Run fields that must agree before two databases may be merged as shards of one run.
RUN_IDENTITY = ("target", "build", "torch_version", "kind")


class OpdbError(Exception):
    """A problem with a database file or its contents; the message names the file and the problem."""


def now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def _check_file(path: Path) -> None:
    """Refuse what is not an SQLite file before anything opens it (nothing is written here)."""
    if path.is_dir():
        raise OpdbError(f"{path}: is a directory, not an SQLite database")
    if not path.exists():
        return
    try:
        with path.open("rb") as fh:
            head = fh.read(100)
        size = path.stat().st_size
    except OSError as exc:
        raise OpdbError(f"{path}: cannot be read ({exc.strerror})") from None
    if head and head[:16] != SQLITE_MAGIC:
        raise OpdbError(f"{path}: not an SQLite database (header {head[:15]!r})")
    if head and len(head) < 100:
        raise OpdbError(f"{path}: damaged SQLite database (truncated to {size} bytes)")
    wal = Path(f"{path}-wal")
    if head and not (wal.exists() and wal.stat().st_size):
        # The header says how many pages the file holds (valid when bytes 92..96 match the change
        # counter at 24..28): a file shorter than that, or not a whole number of pages, was cut.
        # Skipped while a WAL holds frames: a checkpoint in progress may write page 1 first.
        page = int.from_bytes(head[16:18], "big")
        page = 65536 if page == 1 else page
        pages = int.from_bytes(head[28:32], "big")
        if page < 512 or page & (page - 1):
            raise OpdbError(f"{path}: damaged SQLite database (page size {page} in its header)")
        if size % page or (head[92:96] == head[24:28] and pages * page > size):
            raise OpdbError(f"{path}: damaged SQLite database (truncated: {size} bytes, "
                            f"{pages * page} expected)")


def _connect_ro(path: Path) -> sqlite3.Connection:
    """A read-only connection: never switches the journal mode, never migrates, never writes."""
    from urllib.parse import quote

    conn = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro", uri=True,
                           timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False)
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA query_only = 1")
    return conn


def _probe(path: Path, *, need_schema: bool) -> int:
    """Read the schema version through a read-only connection; refuse newer or damaged files."""
    try:
        conn = _connect_ro(path)
        try:
            found = conn.execute("PRAGMA user_version").fetchone()[0]
            # quick_check reads every page (~0.1 s per 100 MB): damage is found here, before a
            # writer touches the file, not halfway through a command.
            verdict = conn.execute("PRAGMA quick_check(1)").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise OpdbError(f"{path}: not a usable SQLite database ({exc})") from None
    if verdict != "ok":
        raise OpdbError(f"{path}: damaged SQLite database (quick_check: {' '.join(str(verdict).split())[:200]})")
    if found > schema.SCHEMA_VERSION:
        raise OpdbError(f"{path}: schema version {found} is newer than this opdb understands "
                        f"({schema.SCHEMA_VERSION}); upgrade the harness to read it")
    if need_schema and found == 0:
        raise OpdbError(f"{path}: not an opdb database (no schema)")
    return found


def same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether two paths name one file (also through links); a missing file equals only itself."""
    pa, pb = Path(a), Path(b)
    try:
        return pa.exists() and pb.exists() and os.path.samefile(pa, pb)
    except OSError:
        return False


def process_owner(pid: int | None = None) -> str:
    """``pid:start`` naming a live process on this host (``start``: its start time in clock ticks
    since boot, from /proc, so that a reused pid is another owner; empty where /proc has none)."""
    pid = os.getpid() if pid is None else pid
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            start = fh.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        start = ""
    return f"{pid}:{start}"


def owner_gone(owner: str | None) -> bool:
    """Whether the process ``owner`` (:func:`process_owner`) on this host is gone; False when
    it cannot tell (no owner recorded)."""
    pid, _, start = (owner or "").partition(":")
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:
        pass  # it lives (another user's)
    return bool(start) and process_owner(int(pid)) != owner


class Store:
    """An opdb database: schema-checked, WAL mode, busy timeout for concurrent writers.

    ``Store.open(path, create=False)`` opens an existing database read-only (``mode=ro``: no WAL
    switch, no migration; an older schema is migrated in a private in-memory copy). The first
    write through such a store (the gate's decisions) reopens the file for writing.
    """

    def __init__(self, db: sqlite_utils.Database, path: Path | None, *, create: bool = True,
                 readonly: bool = False) -> None:
        self.db = db
        self.path = path
        self.readonly = readonly
        where = path or ":memory:"
        try:
            found = schema.version(db)
        except sqlite3.DatabaseError as exc:
            raise OpdbError(f"{where}: not a usable SQLite database ({exc})") from None
        if found > schema.SCHEMA_VERSION:
            raise OpdbError(
                f"{where}: schema version {found} is newer than this opdb understands "
                f"({schema.SCHEMA_VERSION}); upgrade the harness to read it"
            )
        if found < schema.SCHEMA_VERSION:
            if not create and found == 0:
                raise OpdbError(f"{where}: not an opdb database (no schema)")
            if readonly:  # read the file as it is; migrate a private copy, never the file
                mem = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
                db.conn.backup(mem)
                db.conn.close()
                self.db = sqlite_utils.Database(mem)
            schema.migrate(self.db)
        self._killed = self._killed_shards()
        if self._killed and not self.readonly:
            self._mark_killed()

    # -- opening -----------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike[str], *, create: bool = True) -> Store:
        """Open the database at ``path``: ``create=True`` creates or migrates it for writing (WAL;
        a missing parent folder is created); ``create=False`` opens an existing one read-only.

        The file is checked read-only first: a damaged, foreign or newer-schema file is refused
        with an :class:`OpdbError` and left byte-identical.
        """
        p = Path(path)
        _check_file(p)
        exists = p.exists() and p.stat().st_size > 0
        if not create and not p.exists():
            raise OpdbError(f"{p}: no such database")
        if exists or not create:
            _probe(p, need_schema=not create)
        if not create:
            try:
                conn = _connect_ro(p)
            except sqlite3.DatabaseError as exc:
                raise OpdbError(f"{p}: not a usable SQLite database ({exc})") from None
            return cls(sqlite_utils.Database(conn), p, create=False, readonly=True)
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OpdbError(f"{p}: cannot create folder {p.parent} ({exc.strerror})") from None
        return cls(sqlite_utils.Database(_connect_rw(p, wal=True)), p, create=True)

    def _make_writable(self) -> None:
        """Reopen a read-only store for writing (its journal mode stays what the file has)."""
        if not self.readonly or self.path is None:
            return
        _probe(self.path, need_schema=True)
        self.db.conn.close()
        self.db = sqlite_utils.Database(_connect_rw(self.path, wal=False))
        self.readonly = False
        if schema.version(self.db) < schema.SCHEMA_VERSION:
            schema.migrate(self.db)
        if self._killed:
            self._mark_killed()

    @classmethod
    def memory(cls) -> Store:
        return cls(sqlite_utils.Database(memory=True), None)

    def close(self) -> None:
        self.db.conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the one write path ------------------------------------------------------------
    def insert(self, table: str, rows: Iterable[dict[str, Any]], *, batch_size: int = 500,
               replace: bool = False) -> int:
        """Insert rows in batches; rows whose unique key exists are kept as they are
        (``replace=True`` overwrites them). Returns the number of rows offered."""
        if table not in schema.TABLES:
            raise OpdbError(f"unknown table {table!r}; known: {', '.join(schema.TABLES)}")
        rows = rows if isinstance(rows, list) else list(rows)
        if not rows:
            return 0
        cols = list(dict.fromkeys(itertools.chain.from_iterable(rows)))  # every row's keys, in order
        unknown = [c for c in cols if c not in schema.TABLES[table] and c != "id"]
        if unknown:
            raise OpdbError(f"table {table}: unknown column {unknown[0]!r} (schema version {schema.SCHEMA_VERSION})")
        # One prepared statement for the batch: sqlite-utils' insert_all inspects every value of
        # every row, which made it the supervisor's bottleneck at ~14k rows/s. Each row's values
        # are encoded (:func:`_encode`) as they are bound: the plain ones (text, integers, finite
        # floats, NULL) as they are, with no call.
        verb = "insert or replace" if replace else "insert or ignore"
        sql = (f"{verb} into [{table}] ({', '.join(f'[{c}]' for c in cols)}) "
               f"values ({', '.join('?' * len(cols))})")
        with self._transaction():
            for start in range(0, len(rows), batch_size):
                self.db.conn.executemany(sql, [
                    [v if (t := type(v)) in _PLAIN or (t is float and v == v) else _value(v) for v in map(r.get, cols)]
                    for r in rows[start:start + batch_size]])
        return len(rows)

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        # BEGIN IMMEDIATE takes the write lock up front, so concurrent writers queue on the
        # busy timeout instead of failing with "database is locked" mid-transaction.
        self._make_writable()
        conn = self.db.conn
        if conn.in_transaction:
            yield
            return
        schema.execute_waiting(conn, "BEGIN IMMEDIATE", wait_s=BUSY_TIMEOUT_MS / 1000)
        try:
            yield
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def writer(self, table: str, *, batch: int = 200, max_wait_s: float = 2.0) -> Writer:
        """A buffered writer for a stream of results (flushes by count or by age)."""
        return Writer(self, table, batch=batch, max_wait_s=max_wait_s)

    # -- runs ----------------------------------------------------------------------------
    def start_run(self, *, target: str, build: str, torch_version: str, config: dict[str, Any],
                  kind: str = "ops", run_id: str | None = None, shard: str = "1/1",
                  items_total: int | None = None, git_sha: str = "") -> str:
        """Create a run (or join it, for another shard of the same run id); returns its id."""
        run_id = run_id or new_run_id(target, build)
        host = socket.gethostname()
        existing = self.get_run(run_id)
        row = {"id": run_id, "target": target, "build": build, "torch_version": torch_version,
               "host": host, "git_sha": git_sha, "started_at": now(), "finished_at": None,
               "status": "running", "kind": kind, "config": json.dumps(config, sort_keys=True)}
        if existing:
            check_same_run(existing, row, where=str(self.path or ":memory:"))
        else:
            self.insert("runs", [row])
        self.insert("run_shards", [{"run_id": run_id, "shard": shard, "host": host,
                                    "started_at": now(), "finished_at": None,
                                    "status": "running", "items_total": items_total,
                                    "owner": process_owner()}],
                    replace=True)
        return run_id

    def resume_run(self, run_id: str, shard: str = "1/1") -> dict[str, Any]:
        """Mark an interrupted (or killed) run shard as running again; refuses unknown or finished
        runs, and a shard that another live process on this host runs (two writers of one run)."""
        run = self.get_run(run_id)
        if run is None:
            raise OpdbError(f"{self.path}: no run with id {run_id!r} to resume")
        shard_row = self.db.execute(
            "select status, host, owner from run_shards where run_id = ? and shard = ?", [run_id, shard]
        ).fetchone()
        if shard_row and shard_row[0] == "finished":
            raise OpdbError(f"{self.path}: run {run_id!r} shard {shard} already finished; nothing to resume")
        if (shard_row and shard_row[0] == "running" and shard_row[1] == socket.gethostname() and shard_row[2]
                and shard_row[2] != process_owner() and not owner_gone(shard_row[2])):
            raise OpdbError(f"{self.path}: run {run_id!r} shard {shard} is still running (process "
                            f"{shard_row[2].split(':')[0]} on this host); stop it before resuming it")
        with self._transaction():
            self.db.execute("update runs set status = 'running', finished_at = null where id = ?", [run_id])
            self.db.execute(
                "insert or replace into run_shards (run_id, shard, host, started_at, status, owner) "
                "values (?, ?, ?, ?, 'running', ?)", [run_id, shard, socket.gethostname(), now(), process_owner()])
        return self.get_run(run_id) or {}

    # -- killed runs: a shard left 'running' by a process that is gone (kill -9, a lost machine)
    def _killed_shards(self) -> set[tuple[str, str]]:
        """This host's running shards whose process is gone."""
        if "owner" not in self.db["run_shards"].columns_dict:
            return set()
        rows = self.db.execute("select run_id, shard, owner from run_shards where status = 'running' and host = ?",
                               [socket.gethostname()]).fetchall()
        return {(r, s) for r, s, owner in rows if owner_gone(owner)}

    def _mark_killed(self) -> None:
        with self._transaction():
            for run_id, shard in sorted(self._killed):
                self.db.execute("update run_shards set status = 'interrupted' where run_id = ? and shard = ? "
                                "and status = 'running'", [run_id, shard])
                self._refresh_run_status(run_id)
        self._killed = set()

    def killed(self, run_id: str) -> bool:
        """Whether the run was found with a shard whose process is gone when this store opened."""
        return any(r == run_id for r, _ in self._killed) or (
            (row := self.db.execute("select count(*) from run_shards where run_id = ? and status = 'interrupted' "
                                    "and finished_at is null", [run_id]).fetchone()) is not None and row[0] > 0)

    def live_runs(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Rows of ``runs`` as they stand: a read-only store cannot mark a killed run, so its
        rows say 'interrupted' for it here (every running shard of it gone)."""
        if not self._killed:
            return rows
        for row in rows:
            if row.get("status") != "running":
                continue
            shards = self.db.execute("select shard, status from run_shards where run_id = ?", [row["id"]]).fetchall()
            if shards and all(st != "running" or (row["id"], sh) in self._killed for sh, st in shards):
                row["status"] = "interrupted"
        return rows

    def shard_status(self, run_id: str, shard: str = "1/1") -> str | None:
        """A run shard's status (``running``, ``interrupted``, ``finished``, ...); None when the
        run has no such shard."""
        row = self.db.execute("select status from run_shards where run_id = ? and shard = ?", [run_id, shard]).fetchone()
        return row[0] if row else None

    def finish_run(self, run_id: str, *, shard: str = "1/1", status: str = "finished") -> None:
        """Close a shard; the run is finished when all of its recorded shards are."""
        with self._transaction():
            self.db.execute(
                "update run_shards set status = ?, finished_at = ? where run_id = ? and shard = ?",
                [status, now(), run_id, shard])
            self._refresh_run_status(run_id)

    def set_run_status(self, run_id: str, status: str) -> None:
        with self._transaction():
            self.db.execute("update runs set status = ? where id = ?", [status, run_id])

    def _refresh_run_status(self, run_id: str) -> None:
        statuses = [r[0] for r in self.db.execute(
            "select status from run_shards where run_id = ?", [run_id]).fetchall()]
        current = self.db.execute("select status from runs where id = ?", [run_id]).fetchone()
        if current and current[0] == "infra":
            return
        if statuses and all(s == "finished" for s in statuses):
            expected = _shard_count(self.db, run_id)
            status = "finished" if expected is None or len(statuses) >= expected else "partial"
        elif any(s == "running" for s in statuses):
            status = "running"
        else:
            status = "interrupted" if statuses else "running"
        finished = now() if status == "finished" else None
        self.db.execute("update runs set status = ?, finished_at = ? where id = ?",
                        [status, finished, run_id])

    def get_run(self, run_id: str) -> dict[str, Any] | None:
        rows = self.live_runs(list(self.db.query("select * from runs where id = ?", [run_id])))
        return rows[0] if rows else None

    def runs(self) -> list[dict[str, Any]]:
        return self.live_runs(list(self.db.query("select * from runs order by started_at, id")))

    def done_keys(self, table: str, run_id: str, *, failing: bool = False) -> set[str]:
        """Item keys already recorded for ``run_id`` (what a resumed run skips); ``failing``:
        only those whose status failed."""
        where = f" and status in ({', '.join('?' * len(FAILING))})" if failing else ""
        return {r[0] for r in self.db.execute(
            f"select item_key from [{table}] where run_id = ?{where}", [run_id, *(sorted(FAILING) if failing else ())]).fetchall()}

    def replace_gate_decisions(self, baseline_run: str, candidate_run: str, rows: Sequence[dict[str, Any]]) -> None:
        """Replace the stored gate decisions of one (baseline, candidate) pair."""
        with self._transaction():
            self.db.execute("delete from gate_items where baseline_run = ? and candidate_run = ?",
                            [baseline_run, candidate_run])
            if rows:
                self.db["gate_items"].insert_all([_encode(r) for r in rows], batch_size=500)

    # -- catalog -------------------------------------------------------------------------
    def store_catalog(self, rows: Sequence[dict[str, Any]]) -> int:
        return self.insert("ops", rows, replace=True)

    def count(self, table: str, **where: Any) -> int:
        clause = " and ".join(f"[{k}] = ?" for k in where) or "1"
        return self.db.execute(f"select count(*) from [{table}] where {clause}",
                               list(where.values())).fetchone()[0]


class Writer:
    """Buffers result rows and writes them in batches; use as a context manager."""

    def __init__(self, store: Store, table: str, *, batch: int, max_wait_s: float) -> None:
        self.store, self.table, self.batch, self.max_wait_s = store, table, batch, max_wait_s
        self._rows: list[dict[str, Any]] = []
        self._since = time.monotonic()
        self.written = 0

    def add(self, row: dict[str, Any]) -> None:
        self._rows.append(row)
        if len(self._rows) >= self.batch or time.monotonic() - self._since > self.max_wait_s:
            self.flush()

    def flush(self) -> None:
        if self._rows:
            self.written += self.store.insert(self.table, self._rows)
            self._rows = []
        self._since = time.monotonic()

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.flush()


def _connect_rw(path: Path, *, wal: bool) -> sqlite3.Connection:
    from urllib.parse import quote

    try:  # a URI connection, so that ATTACH can name a source with mode=ro
        conn = sqlite3.connect(f"file:{quote(str(path))}", uri=True, timeout=BUSY_TIMEOUT_MS / 1000,
                               isolation_level=None)
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        if wal:
            schema.execute_waiting(conn, "PRAGMA journal_mode = WAL", wait_s=BUSY_TIMEOUT_MS / 1000)
        conn.execute("PRAGMA synchronous = NORMAL")
    except sqlite3.DatabaseError as exc:
        raise OpdbError(f"{path}: not a usable SQLite database ({exc})") from None
    return conn


def new_run_id(target: str, build: str) -> str:
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%S")
    return f"{stamp}-{target}-{build}-{uuid.uuid4().hex[:6]}".replace("/", "_")


def _shard_count(db: sqlite_utils.Database, run_id: str) -> int | None:
    row = db.execute("select shard from run_shards where run_id = ? limit 1", [run_id]).fetchone()
    if not row or "/" not in row[0]:
        return None
    return int(row[0].split("/")[1])


def check_same_run(a: dict[str, Any], b: dict[str, Any], *, where: str) -> None:
    for key in RUN_IDENTITY:
        if a.get(key) != b.get(key):
            raise OpdbError(f"{where}: run {a['id']!r} has {key}={b.get(key)!r} here but "
                            f"{a.get(key)!r} elsewhere; these are not shards of the same run")


_PLAIN = frozenset({str, int, bytes, type(None)})  # stored as they are (exactly these types)
_JSON = json.JSONEncoder(sort_keys=True, default=str).encode  # as json.dumps(v, sort_keys=True, default=str)


def _value(v: Any) -> Any:
    """A value as stored: lists, tuples and dicts as JSON text, NaN as NULL."""
    if isinstance(v, (list, tuple, dict)):
        return _JSON(v) if v else "{}" if isinstance(v, dict) else "[]"
    if isinstance(v, float) and v != v:
        return None
    return v


def _encode(row: dict[str, Any]) -> dict[str, Any]:
    return {k: _value(v) for k, v in row.items()}
