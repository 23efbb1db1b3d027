"""Merging databases: shards of the same run(s) into one file, without duplicating rows.

Different runs (targets swept on different machines, for the report's cross-backend page) go into
one database one merge at a time: each call takes the shards of one set of runs, and ``out`` may
already hold others.

Every check runs before anything is written: sources are the same runs (ids, targets, builds,
torch versions), no file appears twice, the output is not among the inputs. Sources are attached
read-only, so a merge never writes, migrates or re-journals an input.

Example::

    >>> import tempfile, os
    >>> from opdb import Store, merge_files
    >>> d = tempfile.mkdtemp()
    >>> with Store.open(os.path.join(d, "a.sqlite")) as a:
    ...     _ = a.start_run(target="cpu", build="-", torch_version="2.13.0", config={})
    >>> merge_files(os.path.join(d, "out.sqlite"), [os.path.join(d, "a.sqlite")])["runs"]
    1
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import schema
from .store import OpdbError, Store, check_same_run, same_file


def merge_into(store: Store, sources: Sequence[str | os.PathLike[str]]) -> dict[str, int]:
    """Merge shard databases of the same run(s) into ``store``, without duplicating rows.

    All sources must hold the same runs (same ids, targets, builds, torch versions); a run
    that ``store`` already holds must agree too. Sources are opened read-only; nothing is written
    if any check fails (the same file twice, or ``store`` among the sources, included).
    """
    _refuse_same_files(store.path, sources)
    opened: list[Store] = []
    try:
        for s in sources:
            opened.append(Store.open(s, create=False))
        first = _check_sources(opened)
        for rid, run in first.items():
            mine = store.get_run(rid)
            if mine:
                check_same_run(mine, run, where=str(store.path))
        versions = {r["torch_version"] for r in first.values()}
        versions |= {r["torch_version"] for r in store.runs() if r["id"] in first}
        if len(versions) > 1:
            raise OpdbError(f"merge of runs from different torch versions: {sorted(versions)}")
        counts: dict[str, int] = {}
        for src in opened:
            try:
                _merge_one(store, src, counts)
            except sqlite3.DatabaseError as exc:
                raise OpdbError(f"{src.path}: cannot be merged ({exc})") from None
        with store._transaction():
            for rid in first:
                store._refresh_run_status(rid)
        return counts
    finally:
        for src in opened:
            src.close()


def _merge_one(store: Store, src: Store, counts: dict[str, int]) -> None:
    # ATTACH/DETACH cannot run inside a transaction: attach, copy in one transaction, detach.
    # The source is attached read-only: a merge never writes, migrates or re-journals an input.
    from urllib.parse import quote

    assert src.path is not None
    store._make_writable()
    conn = store.db.conn
    conn.execute("ATTACH DATABASE ? AS src", [f"file:{quote(str(Path(src.path).resolve()))}?mode=ro"])
    try:
        with store._transaction():
            _copy_tables(conn, counts)
    finally:
        conn.execute("DETACH DATABASE src")


def _copy_tables(conn: sqlite3.Connection, counts: dict[str, int]) -> None:
    for table in schema.MERGED:
        have = {r[1] for r in conn.execute(f"PRAGMA src.table_info([{table}])")}
        cols = [c for c in schema.TABLES[table] if c in have]  # an older source lacks newer columns
        if not cols:
            continue
        names = ", ".join(f"[{c}]" for c in cols)
        before = conn.total_changes
        conn.execute(f"insert or ignore into main.[{table}] ({names}) "
                     f"select {names} from src.[{table}]")
        counts[table] = counts.get(table, 0) + conn.total_changes - before


def _refuse_same_files(out: Path | None, sources: Sequence[str | os.PathLike[str]]) -> None:
    if not sources:
        raise OpdbError("merge needs at least one input database")
    for i, s in enumerate(sources):
        if out is not None and (same_file(s, out) or Path(s).resolve() == Path(out).resolve()):
            raise OpdbError(f"{s}: is also the merge output; merge into a different file")
        for t in sources[:i]:
            if same_file(s, t) or Path(s).resolve() == Path(t).resolve():
                raise OpdbError(f"{s}: given twice (as {t}); each input database may appear once")


def _check_sources(opened: Sequence[Store]) -> dict[str, dict[str, Any]]:
    """The runs the sources hold, after checking that they are shards of the same runs."""
    run_sets = []
    for src in opened:
        runs = {r["id"]: r for r in src.runs()}
        if not runs and src.count("ops") == 0:
            raise OpdbError(f"{src.path}: holds no runs and no catalog; nothing to merge")
        run_sets.append(runs)
    first = run_sets[0]
    for src, runs in zip(opened[1:], run_sets[1:], strict=True):
        if set(runs) != set(first):
            extra = sorted(set(runs) ^ set(first))
            raise OpdbError(f"{src.path}: holds different runs than {opened[0].path} "
                            f"({', '.join(extra)}); only shards of the same run merge in one call "
                            "(to put different runs in one database, merge each into OUT in turn)")
        for rid, run in runs.items():
            check_same_run(first[rid], run, where=str(src.path))
    versions = {r["torch_version"] for rs in run_sets for r in rs.values()}
    if len(versions) > 1:
        raise OpdbError(f"merge of runs from different torch versions: {sorted(versions)}")
    return first


def merge_files(out: str | os.PathLike[str], sources: Sequence[str | os.PathLike[str]]) -> dict[str, int]:
    """Merge ``sources`` into the database ``out`` (created if missing).

    Every check runs before ``out`` is created or touched: a refused merge leaves no file behind
    and never writes an input. Returns rows added per table.
    """
    target = Path(out)
    _refuse_same_files(target, sources)
    opened: list[Store] = []
    try:
        for s in sources:
            opened.append(Store.open(s, create=False))
        _check_sources(opened)
    finally:
        for src in opened:
            src.close()
    existed = target.exists()
    try:
        with Store.open(target) as st:
            return merge_into(st, sources)
    except BaseException:
        if not existed:
            for suffix in ("", "-wal", "-shm", "-journal"):
                Path(f"{target}{suffix}").unlink(missing_ok=True)
        raise


