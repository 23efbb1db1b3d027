"""opdb: schema versions, the write path, concurrent writers, resume bookkeeping, merge."""

from __future__ import annotations

import multiprocessing as mp
import sqlite3

import pytest

from opdb import SCHEMA_VERSION, OpdbError, Store, merge_into


def _row(run: str, i: int, status: str = "pass") -> dict:
    return {"run_id": run, "item_key": f"abs|function|float32|{i}", "op": "abs",
            "variant": "function", "dtype": "float32", "sample": i, "status": status,
            "native_ops": ["aten::abs.default"], "max_abs_err": float("nan")}


def test_new_db_gets_current_schema(tmp_path):
    with Store.open(tmp_path / "a.sqlite") as st:
        assert st.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert st.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert {"runs", "run_shards", "ops", "op_results", "model_results"} <= set(st.db.table_names())


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "new.sqlite"
    sqlite3.connect(path).execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(OpdbError, match="newer than this opdb"):
        Store.open(path)


def test_not_sqlite_is_refused_and_untouched(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("hello, not a database")
    with pytest.raises(OpdbError, match="not an SQLite database"):
        Store.open(path)
    assert path.read_text() == "hello, not a database"


def test_directory_is_refused_and_a_missing_folder_is_created_for_writing(tmp_path):
    with pytest.raises(OpdbError, match="is a directory"):
        Store.open(tmp_path)
    with pytest.raises(OpdbError, match="no such database"):  # reading never creates anything
        Store.open(tmp_path / "missing" / "x.sqlite", create=False)
    assert not (tmp_path / "missing").exists()
    with Store.open(tmp_path / "missing" / "x.sqlite") as st:  # a fresh checkout has no results/ yet
        assert st.runs() == []


def test_insert_ignores_duplicates_and_encodes(store):
    run = store.start_run(target="t", build="b", torch_version="2.13", config={"x": 1})
    store.insert("op_results", [_row(run, 0), _row(run, 1)])
    store.insert("op_results", [_row(run, 0, "mismatch")])  # already recorded: kept as is
    rows = list(store.db.query("select * from op_results order by sample"))
    assert [r["status"] for r in rows] == ["pass", "pass"]
    assert rows[0]["native_ops"] == '["aten::abs.default"]'
    assert rows[0]["max_abs_err"] is None


def test_unknown_table_is_refused(store):
    with pytest.raises(OpdbError, match="unknown table 'nope'"):
        store.insert("nope", [{"a": 1}])


def _writer(path: str, run: str, start: int, n: int) -> None:
    with Store.open(path) as st:
        with st.writer("op_results", batch=25) as w:
            for i in range(start, start + n):
                w.add(_row(run, i))


def test_concurrent_writers(tmp_path):
    path = str(tmp_path / "c.sqlite")
    with Store.open(path) as st:
        run = st.start_run(target="t", build="b", torch_version="2.13", config={})
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, run, k * 300, 300)) for k in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    with Store.open(path) as st:
        assert st.count("op_results", run_id=run) == 1200
        assert len(st.done_keys("op_results", run)) == 1200


def _first_opener(path: str, barrier, errors) -> None:
    barrier.wait()
    try:
        with Store.open(path) as st:
            st.start_run(target="t", build="b", torch_version="2.13", config={}, run_id="r", shard=str(mp.current_process().pid))
    except Exception as exc:  # noqa: BLE001 - the test reports what each process met
        errors.put(f"{type(exc).__name__}: {exc}")


def test_processes_creating_one_new_database_at_once(tmp_path):
    """pytest-xdist workers (and shards) open one new file at the same moment: each must wait for
    the others' WAL switch and migration, not fail with "database is locked" (CI saw it; before
    the fix 21 of 30 such trials had a failing process)."""
    ctx = mp.get_context("fork")
    for trial in range(8):
        path = str(tmp_path / f"new{trial}.sqlite")
        barrier, errors = ctx.Barrier(4), ctx.Queue()
        procs = [ctx.Process(target=_first_opener, args=(path, barrier, errors)) for _ in range(4)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
        found = [errors.get() for _ in range(errors.qsize())] if not errors.empty() else []
        assert not found and all(p.exitcode == 0 for p in procs), (trial, found)
        with Store.open(path) as st:
            assert st.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
            assert st.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            assert st.count("run_shards", run_id="r") == 4


def test_resume_bookkeeping(store):
    run = store.start_run(target="t", build="b", torch_version="2.13", config={})
    store.insert("op_results", [_row(run, i) for i in range(3)])
    assert store.done_keys("op_results", run) == {f"abs|function|float32|{i}" for i in range(3)}
    store.set_run_status(run, "interrupted")
    assert store.resume_run(run)["status"] == "running"
    store.finish_run(run)
    assert store.get_run(run)["status"] == "finished"
    with pytest.raises(OpdbError, match="already finished"):
        store.resume_run(run)
    with pytest.raises(OpdbError, match="no run with id 'ghost'"):
        store.resume_run("ghost")


def _shard(path, run_id: str, shard: str, rows: range, torch_version: str = "2.13") -> None:
    with Store.open(path) as st:
        st.start_run(target="t", build="b", torch_version=torch_version, config={}, run_id=run_id,
                     shard=shard)
        st.insert("op_results", [_row(run_id, i) for i in rows])
        st.insert("ops", [{"torch_version": torch_version, "name": "aten::abs.default"}])
        st.finish_run(run_id, shard=shard)


def test_merge_shards_without_duplicates(tmp_path):
    a, b, out = tmp_path / "a.sqlite", tmp_path / "b.sqlite", tmp_path / "out.sqlite"
    _shard(a, "r1", "1/2", range(0, 60))
    _shard(b, "r1", "2/2", range(50, 100))  # overlapping rows must not double
    with Store.open(out) as st:
        merge_into(st, [a, b])
        merge_into(st, [a, b])  # merging twice changes nothing
        assert st.count("op_results") == 100
        assert st.count("ops") == 1
        assert st.get_run("r1")["status"] == "finished"


def test_partial_shards_leave_run_unfinished(tmp_path):
    a, out = tmp_path / "a.sqlite", tmp_path / "out.sqlite"
    _shard(a, "r1", "1/2", range(10))
    with Store.open(out) as st:
        merge_into(st, [a])
        assert st.get_run("r1")["status"] == "partial"


def test_merge_refuses_different_runs(tmp_path):
    a, b, out = tmp_path / "a.sqlite", tmp_path / "b.sqlite", tmp_path / "out.sqlite"
    _shard(a, "r1", "1/2", range(5))
    _shard(b, "r2", "2/2", range(5))
    with Store.open(out) as st, pytest.raises(OpdbError, match="different runs"):
        merge_into(st, [a, b])
    with Store.open(out) as st:
        assert st.count("op_results") == 0


def test_merge_refuses_different_torch_versions(tmp_path):
    a, b, out = tmp_path / "a.sqlite", tmp_path / "b.sqlite", tmp_path / "out.sqlite"
    _shard(a, "r1", "1/2", range(5), torch_version="2.13")
    _shard(b, "r1", "2/2", range(5), torch_version="2.12")
    with Store.open(out) as st, pytest.raises(OpdbError, match="torch_version"):
        merge_into(st, [a, b])


def test_old_schema_is_migrated_in_place(tmp_path):
    import sqlite_utils

    from opdb.schema import MIGRATIONS

    path = tmp_path / "v1.sqlite"
    db = sqlite_utils.Database(path)
    MIGRATIONS[0](db)
    db.execute("PRAGMA user_version = 1")
    db["runs"].insert({"id": "old", "target": "t", "build": "b", "torch_version": "2.13", "status": "finished"})
    db.conn.close()
    with Store.open(path) as st:
        assert st.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert "coverage" in st.db.table_names() and st.get_run("old")["status"] == "finished"


def test_a_v6_database_gains_the_normwise_forward_error(tmp_path):
    """Schema v7: model rows store the forward error the model tolerance judges (normwise);
    an older database reads NULL for it (the report shows a dash), its other columns intact."""
    import sqlite_utils

    from opdb.schema import MIGRATIONS

    path = tmp_path / "v6.sqlite"
    db = sqlite_utils.Database(path)
    for step in MIGRATIONS[:6]:
        step(db)
    db["model_results"].transform(drop={"fwd_rel_err"})  # _v1 creates today's columns; v6 had none such
    db.execute("PRAGMA user_version = 6")
    db["model_results"].insert({"run_id": "r", "item_key": "mlp.x|eager|float32|0", "status": "pass",
                                "max_rel_err": 73.5})
    db.conn.close()
    with Store.open(path) as st:
        assert st.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        (row,) = st.db.query("select status, max_rel_err, fwd_rel_err from model_results")
        assert row == {"status": "pass", "max_rel_err": 73.5, "fwd_rel_err": None}


def test_a_v9_database_gains_the_browse_indexes(tmp_path):
    """Schema v10: the indexes Datasette's facets and canned queries need (opdb/browse.toml);
    an older database gains them when opened, its rows intact, and a new one has them."""
    import sqlite_utils

    from opdb.schema import BROWSE_INDEXES, MIGRATIONS

    wanted = {"idx_" + "_".join((table, *cols)) for table, cols in BROWSE_INDEXES}
    path = tmp_path / "v9.sqlite"
    db = sqlite_utils.Database(path)
    for step in MIGRATIONS[:9]:
        step(db)
    db.execute("PRAGMA user_version = 9")
    db["op_results"].insert({"run_id": "r", "item_key": "abs|function|float32|0", "status": "mismatch",
                             "max_rel_err": 0.5})
    assert not wanted & {i.name for i in db["op_results"].indexes}
    db.conn.close()
    with Store.open(path) as st:
        assert st.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert wanted <= {i.name for i in st.db["op_results"].indexes}
        assert [r["max_rel_err"] for r in st.db.query("select max_rel_err from op_results")] == [0.5]
    with Store.open(tmp_path / "new.sqlite") as st:
        assert wanted <= {i.name for i in st.db["op_results"].indexes}
