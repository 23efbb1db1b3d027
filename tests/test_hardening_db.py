"""Databases as hostile input: the same file twice, damaged files, newer or older schemas, a
user's folder as --out, HTML in build names. One line, exit 2, nothing written or changed."""

from __future__ import annotations

import hashlib
import re
import sqlite3

import pytest
import sqlite_utils
from click.testing import CliRunner

from conformance.cli import main
from conformance.gate.core import Finding, GateResult
from conformance.gate.render import markdown
from opdb import Store, schema


def _valid(path, *, build="b1", run_id="r1", rows=300):
    with Store.open(path) as st:
        rid = st.start_run(target="cpu", build=build, torch_version="2.13.0", config={}, run_id=run_id)
        st.insert("op_results", [{"run_id": rid, "item_key": f"abs|function|float32|{i}", "op": "abs",
                                  "variant": "function", "dtype": "float32", "sample": i, "status": "pass"}
                                 for i in range(rows)])
        st.finish_run(rid)
    return path


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _one_line_error(r, *names):
    assert r.exit_code == 2, r.output
    assert r.output.count("\n") == 1 and r.output.startswith("error: "), r.output
    assert "Traceback" not in r.output
    for n in names:
        assert str(n) in r.output, r.output


def test_merge_of_one_file_twice_or_into_itself_is_refused_at_once(tmp_path):
    a = _valid(tmp_path / "a.sqlite")
    before = _sha(a)
    (tmp_path / "link.sqlite").symlink_to(a)
    for args in ((tmp_path / "out.sqlite", a, a), (tmp_path / "out.sqlite", a, tmp_path / "link.sqlite"),
                 (a, a), (tmp_path / "link.sqlite", a)):
        r = _cli("merge", *args)
        _one_line_error(r, "a.sqlite" if args[0] != tmp_path / "link.sqlite" else "")
        assert "twice" in r.output or "also the merge output" in r.output
    assert not (tmp_path / "out.sqlite").exists()
    assert _sha(a) == before


def test_different_runs_merge_one_call_at_a_time_into_one_database(tmp_path):
    """Shards of different runs in one call are refused (a shard of another night is a mistake);
    runs swept apart (other targets, other machines) merge into one database call by call."""
    a = _valid(tmp_path / "a.sqlite", build="b1", run_id="r1")
    b = _valid(tmp_path / "b.sqlite", build="b2", run_id="r2", rows=10)
    r = _cli("merge", tmp_path / "out.sqlite", a, b)
    _one_line_error(r, "b.sqlite")
    assert "merge each into OUT in turn" in r.output and not (tmp_path / "out.sqlite").exists()
    for src in (a, b, a):  # the same run again adds nothing
        assert _cli("merge", tmp_path / "out.sqlite", src).exit_code == 0
    with Store.open(tmp_path / "out.sqlite", create=False) as st:
        assert sorted(r["id"] for r in st.runs()) == ["r1", "r2"]
        assert st.count("op_results") == 310


def _garbage(p):
    p.write_bytes(bytes(range(256)) * 40)
    return p


def _truncated(p):
    _valid(p)
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    return p


def _damaged_inside(p):
    _valid(p)
    data = bytearray(p.read_bytes())
    for i in range(4096, len(data), 7):  # every page after the first: headers and cells garbled
        data[i] = 0xA5
    p.write_bytes(bytes(data))
    return p


def _newer(p):
    _valid(p)
    conn = sqlite3.connect(p)
    conn.execute("PRAGMA journal_mode = DELETE")
    conn.execute(f"PRAGMA user_version = {schema.SCHEMA_VERSION + 5}")
    conn.close()
    return p


def _damaged_deep(p):
    _valid(p, rows=3000)  # the schema pages stay sound: the damage is found mid-query
    data = bytearray(p.read_bytes())
    for i in range(len(data) * 2 // 3, len(data), 5):
        data[i] = 0xA5
    p.write_bytes(bytes(data))
    return p


BAD = {"garbage": _garbage, "truncated": _truncated, "damaged": _damaged_inside, "damaged_deep": _damaged_deep,
       "newer": _newer}


@pytest.mark.parametrize("kind", sorted(BAD))
def test_bad_database_gives_one_line_and_stays_byte_identical(tmp_path, kind):
    """report, gate and merge (as input) on a damaged or newer-schema database: one line naming
    the file, exit 2, the file unchanged, no merge output left behind."""
    bad = BAD[kind](tmp_path / f"{kind}.sqlite")
    before = _sha(bad)
    good = _valid(tmp_path / "good.sqlite", run_id="r1")
    commands = [("report", "--db", bad, "--out", tmp_path / "site"),
                ("gate", "--db", bad, "--baseline", "r0", "--candidate", "r1", "--reruns", "0"),
                ("merge", tmp_path / "merged.sqlite", bad),
                ("merge", tmp_path / "merged.sqlite", good, bad)]
    for cmd in commands:
        r = _cli(*cmd)
        _one_line_error(r, bad)
        assert _sha(bad) == before, cmd
        assert not (tmp_path / "merged.sqlite").exists(), cmd
        assert not (tmp_path / "site").exists(), cmd


def test_run_into_a_garbage_database_is_one_line(tmp_path):
    bad = _garbage(tmp_path / "g.sqlite")
    before = _sha(bad)
    r = _cli("run", "--target", "cpu", "--ops", "abs", "--dtypes", "float32", "--max-samples", "1", "-n", "1",
             "--quiet", "--db", bad)
    _one_line_error(r, bad)
    assert _sha(bad) == before


def test_read_commands_do_not_switch_journal_mode_or_migrate(tmp_path):
    """report/gate/merge inputs open read-only: a rollback-journal database stays one, and an
    older-schema one is read (through a migrated private copy) without being migrated."""
    cur = _valid(tmp_path / "cur.sqlite")
    conn = sqlite3.connect(cur)
    conn.execute("PRAGMA journal_mode = DELETE")
    conn.close()
    old = tmp_path / "old.sqlite"
    db = sqlite_utils.Database(old)
    schema.MIGRATIONS[0](db)
    db.execute("PRAGMA user_version = 1")
    db["runs"].insert({"id": "r1", "target": "cpu", "build": "b", "torch_version": "2.13.0", "status": "finished",
                       "kind": "ops", "config": "{}", "started_at": "2026-01-01T00:00:00"})
    db["op_results"].insert({"run_id": "r1", "item_key": "abs|function|float32|0", "op": "abs",
                             "variant": "function", "dtype": "float32", "sample": 0, "status": "pass"})
    db.conn.close()
    for path in (cur, old):
        before = _sha(path)
        r = _cli("report", "--db", path, "--out", tmp_path / f"site-{path.stem}")
        assert r.exit_code == 0, r.output
        r = _cli("merge", tmp_path / f"m-{path.stem}.sqlite", path)
        assert r.exit_code == 0, r.output
        assert _sha(path) == before
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == (1 if path == old else schema.SCHEMA_VERSION)
        conn.close()
    with Store.open(tmp_path / "m-old.sqlite", create=False) as st:  # the older input merged in full
        assert st.count("op_results") == 1 and st.get_run("r1")["build"] == "b"


def test_report_out_refuses_a_user_folder_and_replaces_its_own(tmp_path):
    db = _valid(tmp_path / "a.sqlite")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("precious")
    r = _cli("report", "--db", db, "--out", mine)
    _one_line_error(r, mine)
    assert sorted(p.name for p in mine.iterdir()) == ["thesis.tex"]
    site = tmp_path / "site"
    site.mkdir()  # empty: accepted
    assert _cli("report", "--db", db, "--out", site).exit_code == 0
    assert (site / "index.html").is_file() and (site / ".conformance-report").is_file()
    (site / "b-old-build").mkdir()
    (site / "b-old-build" / "stale.html").write_text("stale")
    r = _cli("report", "--db", db, "--out", site)
    assert r.exit_code == 0, r.output
    assert not (site / "b-old-build").exists() and (site / "index.html").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".site.")]  # no staging left


def test_gate_markdown_escapes_build_names_and_ops():
    hostile = '<img src=x onerror=alert(1)> | **b** [x](javascript:alert(1))\n# h'
    result = GateResult({"id": "r0", "build": hostile}, {"id": "r1", "build": "<script>alert(1)</script>"},
                        [Finding("regression", "op", "k", "mul`<b>|x", "function", "float32|<i>", "pass",
                                 "mismatch<script>")], "fail")
    md = markdown(result)
    assert "`mul'<b>\\|x`" in md  # a code span shows HTML literally; its backtick and pipe are defused
    # Outside code spans (whose text is literal) and the comment's own <details> markup, every tag
    # or markup character of stored text is backslash-escaped.
    outside = re.sub(r"`[^`\n]*`", "", md).replace("**fail**", "")
    for tag in ("<details><summary>Regressions: evidence, repro commands, items</summary>", "</details>"):
        outside = outside.replace(tag, "")
    assert not re.findall(r"(?<!\\)[<>\[\]*`]", outside), md
    assert not [line for line in md.splitlines() if line.startswith("# ")]
    table_rows = [line for line in md.splitlines() if line.startswith("| op |")]
    assert len(table_rows) == 1 and len(re.findall(r"(?<!\\)\|", table_rows[0])) == 8  # 7 cells, none split


def test_fresh_checkout_creates_the_results_folder(tmp_path, monkeypatch):
    src = _valid(tmp_path / "a.sqlite")
    monkeypatch.chdir(tmp_path)
    r = _cli("merge", "results/opdb.sqlite", src)
    assert r.exit_code == 0, r.output
    assert (tmp_path / "results" / "opdb.sqlite").is_file()


@pytest.mark.parametrize("kind", sorted(BAD))
def test_writing_open_of_a_bad_database_refuses_before_touching_it(tmp_path, kind):
    """What `run` and `merge` (output) open for writing: damage anywhere in the file is found by
    the read-only check first, so the refused file is left byte-identical (no WAL switch)."""
    from opdb import OpdbError

    bad = BAD[kind](tmp_path / f"{kind}.sqlite")
    before = _sha(bad)
    with pytest.raises(OpdbError, match=str(bad)) as err:
        Store.open(bad)
    assert "\n" not in str(err.value)
    assert _sha(bad) == before
