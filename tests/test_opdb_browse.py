"""Datasette's canned queries (``opdb/browse.toml``, ``nox -s browse``): each runs through sqlite3
on a real small database and agrees with the named query the report and the console count with;
the indexes serve them; the metadata is what Datasette reads; a bad query file is one clear error."""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from test_report import RUN_A, RUN_B, make_report_db

from opdb import Store
from opdb.browse import BrowseError, load_queries, metadata
from opdb.queries_counts import fallback_overloads, gate_findings

ROOT = Path(__file__).resolve().parent.parent
QUERIES = {q.name: q for q in load_queries()}


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    """The report's database, and the real gate's decision for 2.31.0 -> 2.33.0 stored in it."""
    from conformance.gate.core import run_gate

    path = make_report_db(tmp_path_factory.mktemp("browse") / "opdb.sqlite")
    with Store.open(path) as st:
        assert run_gate(st, RUN_A, RUN_B, attempts=0, common_only=True).verdict == "fail"
    return path


def _run(db: Path, name: str, **params: str) -> list[dict]:
    q = QUERIES[name]
    assert set(params) | {"target"} >= set(q.params), q.params
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in con.execute(q.sql, {"target": "", **params})]
    finally:
        con.close()


def test_the_three_canned_queries_are_shipped():
    assert list(QUERIES) == ["fallbacks_of_a_build", "regressions_between_builds", "worst_mismatches"]
    assert QUERIES["regressions_between_builds"].params == ["baseline", "candidate", "target"]


@pytest.mark.parametrize(("build", "run_id"), [("2.31.0", RUN_A), ("2.33.0", RUN_B)])
def test_fallbacks_of_a_build_agree_with_the_report(db, build, run_id):
    """2.31.0 has no coverage table (counted from the op results), 2.33.0 has one (it decides)."""
    rows = _run(db, "fallbacks_of_a_build", build=build)
    with Store.open(db, create=False) as st:
        expected = [(o.name, o.samples) for o in fallback_overloads(st, run_id)]
    assert [(r["overload"], r["samples"]) for r in rows] == expected and expected
    assert {r["run_id"] for r in rows} == {run_id}


def test_regressions_between_builds_are_the_gate_s_findings(db):
    rows = _run(db, "regressions_between_builds", baseline="2.31.0", candidate="2.33.0")
    with Store.open(db, create=False) as st:
        expected = sorted((f["category"], f["item_key"]) for f in gate_findings(st, RUN_A, RUN_B))
    assert sorted((r["category"], r["item_key"]) for r in rows) == expected and len(expected) == 7
    assert {r["category"] for r in rows} <= {"regression", "worsened", "drift"}
    # a pair the gate never judged gives nothing (the query does not judge it itself)
    assert _run(db, "regressions_between_builds", baseline="2.33.0", candidate="2.31.0") == []


def test_worst_mismatches_are_the_run_s_mismatches_largest_first(db):
    rows = _run(db, "worst_mismatches", build="2.33.0")
    con = sqlite3.connect(db)
    expected = con.execute("select id, max_rel_err from op_results where run_id = ? and status = 'mismatch' "
                           "order by max_rel_err desc, id desc", [RUN_B]).fetchall()
    con.close()
    assert [(r["result_id"], r["max_rel_err"]) for r in rows] == expected and expected
    assert _run(db, "worst_mismatches", build="9.99.0") == []


@pytest.mark.parametrize(("name", "index"), [
    ("worst_mismatches", "idx_op_results_run_id_status_max_rel_err"),
    ("fallbacks_of_a_build", "idx_op_results_run_id_fallback_ops"),
    ("regressions_between_builds", "idx_gate_items_baseline_run_candidate_run_category"),
])
def test_an_index_serves_each_query(db, name, index):
    """No full scan of a result table: each query reaches its rows through an index (schema v10)."""
    q = QUERIES[name]
    con = sqlite3.connect(db)
    plan = [r[-1] for r in con.execute("explain query plan " + q.sql, {p: "" for p in q.params})]
    con.close()
    assert any(index in step for step in plan), plan
    # a full scan reads "SCAN r" (or the table's name) with no index after it
    assert not [s for s in plan if re.fullmatch(r"SCAN (r|g|op_results|gate_items)", s)], plan


def test_metadata_names_the_database_by_its_file_stem(tmp_path):
    out = tmp_path / "meta.json"
    r = subprocess.run([sys.executable, str(ROOT / "opdb" / "browse.py"), "results/nightly.sqlite", "--out", str(out)],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    meta = json.loads(out.read_text())
    assert meta == metadata("nightly")
    assert list(meta["databases"]) == ["nightly"]
    assert set(meta["databases"]["nightly"]["queries"]) == set(QUERIES)


@pytest.mark.parametrize(("text", "names"), [
    ('[[query]]\nname = "x"\ntitle = "t"\ndescription = "d"\n', ["query[0].sql", "None"]),
    ('[[query]]\nname = "Bad-Name"\ntitle = "t"\ndescription = "d"\nsql = "select 1"\n', ["query[0].name", "'Bad-Name'"]),
    ('[[query]]\nname = "x"\ntitle = "t"\ndescription = "d"\nsql = "select 1"\nsqll = "x"\n', ["query[0].sqll"]),
    ('titel = "x"\n', ["titel", "'x'"]),
    ("query = []\n", ["query = []", "at least one"]),
    ('[[query]\n', ["not valid TOML"]),
])
def test_a_bad_query_file_is_one_error_naming_file_key_value(tmp_path, text, names):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(BrowseError) as exc:
        load_queries(path)
    msg = str(exc.value)
    assert msg.startswith(f"{path}:") and "\n" not in msg and all(n in msg for n in names), msg


def test_datasette_reads_the_metadata_when_it_is_installed(db, tmp_path):
    """Optional: Datasette is the browse session's, not the suite's; where it is installed, it serves
    the database with the metadata and each canned query answers."""
    pytest.importorskip("datasette")
    from datasette.app import Datasette

    meta = metadata(db.stem)

    async def go():
        ds = Datasette([str(db)], metadata=meta, settings={"suggest_facets": False})
        statuses = {}
        for name in QUERIES:
            r = await ds.client.get(f"/{db.stem}/{name}.json?build=2.33.0&baseline=2.31.0&candidate=2.33.0&target=")
            statuses[name] = r.status_code
        return statuses

    assert asyncio.run(go()) == dict.fromkeys(QUERIES, 200)
