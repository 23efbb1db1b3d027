"""First bad build: each failing finding of the gate names the earliest build since which its item
has been bad without a break, from the stored runs of older builds of the candidate's target;
a gap (an older run lacking the item) is said, not guessed; builds are ordered by version (start
time when a name is not a version); the console, Markdown, JSON and the report show it."""

from __future__ import annotations

import json

from click.testing import CliRunner
from test_hardening_gate import CANARIES, CONFIG

import conformance.cli.report  # noqa: F401  (attaches `report` to the group)
from conformance.cli import main
from conformance.gate.core import compare_runs, run_gate
from conformance.gate.first_bad import annotate
from conformance.gate.render import markdown, summary_lines
from opdb import Store
from reports import render_site

PASS = "pass"


def _run(st: Store, rid: str, build: str, items: dict[str, str | tuple[str, str]], *, target: str = "neuron-emu",
         started: str | None = None, finish: str = "finished", error: float = 0.0) -> str:
    """A run of ``items`` (key -> status, or (status, failed contracts)), each item's relative error
    ``error``; ``started`` overrides its start time."""
    st.start_run(target=target, build=build, torch_version="2.13", config=CONFIG, run_id=rid)
    rows = []
    for key, v in {**CANARIES, **items}.items():
        status, failed = (v, None) if isinstance(v, str) else v
        op, variant, dtype, sample = key.split("|")
        rows.append({"run_id": rid, "item_key": key, "op": op, "variant": variant, "dtype": dtype,
                     "sample": int(sample), "status": status, "contract_failed": failed, "duration_s": 0.01,
                     "max_rel_err": error, "error": "values differ" if status == "mismatch" else None})
    st.insert("op_results", rows)
    st.finish_run(rid, status=finish)
    if started:
        st.db.execute("update runs set started_at = ? where id = ?", [started, rid])
        st.db.conn.commit()
    return rid


def _k(op: str, i: int, variant: str = "function") -> str:
    return f"{op}|{variant}|float32|{i}"


# item -> statuses in 2.31.0, 2.32.0, 2.33.0 (None: the run lacks it)
THREE = {
    _k("exp", 0): ("pass", "mismatch", "mismatch"),  # broke at the middle build and stayed broken
    _k("exp", 1): ("pass", "pass", "mismatch"),  # broke only in the newest
    _k("exp", 2): ("pass", None, "mismatch"),  # the middle run lacks it: unknown before the newest
    _k("sin", 0): ("pass", "error", "mismatch"),  # an error is at least as severe as a mismatch
    _k("sin", 1): ("pass", "pass_fallback", "mismatch"),  # a fallback is not
    _k("sin", 2): ("pass", "pass", "pass"),
}


def _three(tmp_path, table=THREE) -> tuple[Store, list[str]]:
    st = Store.open(tmp_path / "g.sqlite")
    ids = []
    for i, build in enumerate(("2.31.0", "2.32.0", "2.33.0")):
        ids.append(_run(st, f"r{i}", build, {k: v[i] for k, v in table.items() if v[i] is not None}))
    return st, ids


def _regressions(result) -> dict[str, dict]:
    return {f.item_key: f.evidence for f in result.of("regression")}


def test_first_bad_is_where_the_item_broke_and_stayed_broken(tmp_path):
    st, (old, mid, new) = _three(tmp_path)
    # noise that must not count: another target's run and an interrupted run of the middle build
    _run(st, "other-target", "2.32.0", {_k("exp", 1): "mismatch"}, target="cpu")
    _run(st, "interrupted", "2.32.0", {_k("exp", 1): "mismatch"}, finish="interrupted")
    ev = _regressions(run_gate(st, old, new, attempts=0))
    assert set(ev) == {_k("exp", 0), _k("exp", 1), _k("exp", 2), _k("sin", 0), _k("sin", 1)}
    first = {k: (e["first_bad_build"], e["first_bad_run"]) for k, e in ev.items()}
    assert first == {_k("exp", 0): ("2.32.0", mid), _k("exp", 1): ("2.33.0", new), _k("exp", 2): ("2.33.0", new),
                     _k("sin", 0): ("2.32.0", mid), _k("sin", 1): ("2.33.0", new)}
    assert ev[_k("exp", 0)]["history"] == [["2.31.0", "pass"], ["2.32.0", "mismatch"], ["2.33.0", "mismatch"]]
    assert ev[_k("exp", 0)]["first_bad_order"] == "version"
    # a gap is said, not guessed
    assert ev[_k("exp", 2)]["history"] == [["2.31.0", "pass"], ["2.32.0", None], ["2.33.0", "mismatch"]]
    assert ev[_k("exp", 2)]["first_bad_unknown"] == f"unknown before 2.33.0: run {mid} (build 2.32.0) lacks the item"
    assert all("first_bad_unknown" not in e for k, e in ev.items() if k != _k("exp", 2))
    # stored with the decision
    stored = {r["item_key"]: json.loads(r["evidence"]) for r in st.db.query(
        "select item_key, evidence from gate_items where candidate_run = ? and category = 'regression'", [new])}
    assert stored[_k("exp", 0)]["first_bad_build"] == "2.32.0"


def test_an_item_must_stay_bad_to_have_been_bad_since(tmp_path):
    # bad in the oldest, good in the middle, bad in the newest: it broke (again) in the newest
    st, (old, mid, new) = _three(tmp_path, {_k("exp", 0): ("mismatch", "pass", "mismatch")})
    ev = _regressions(run_gate(st, mid, new, attempts=0))
    assert ev[_k("exp", 0)]["first_bad_build"] == "2.33.0" and ev[_k("exp", 0)]["first_bad_run"] == new
    assert ev[_k("exp", 0)]["history"] == [["2.31.0", "mismatch"], ["2.32.0", "pass"], ["2.33.0", "mismatch"]]


def test_a_contract_regression_is_bad_where_the_new_contract_first_failed(tmp_path):
    table = {_k("add", 0, "out"): (("contract", "out"), ("contract", "aliasing,out"), ("contract", "aliasing,out")),
             _k("add", 1, "out"): (("contract", "out"), ("contract", "out"), ("contract", "aliasing,out"))}
    st, (old, mid, new) = _three(tmp_path, table)
    ev = _regressions(run_gate(st, old, new, attempts=0))
    assert ev[_k("add", 0, "out")]["new_contracts"] == ["aliasing"]
    assert ev[_k("add", 0, "out")]["first_bad_build"] == "2.32.0"
    assert ev[_k("add", 1, "out")]["first_bad_build"] == "2.33.0"


def test_drift_is_bad_where_the_errors_first_drifted_from_the_baseline(tmp_path):
    st = Store.open(tmp_path / "d.sqlite")
    items = {_k("exp", i): "pass" for i in range(8)}
    old = _run(st, "r0", "2.31.0", items, error=1e-6)
    mid = _run(st, "r1", "2.32.0", items, error=1e-3)
    new = _run(st, "r2", "2.33.0", items, error=1e-3)
    drift = run_gate(st, old, new, attempts=0).of("drift")
    assert len(drift) == 1
    ev = drift[0].evidence
    assert (ev["first_bad_build"], ev["first_bad_run"]) == ("2.32.0", mid)
    assert ev["history"] == [["2.31.0", "no change"], ["2.32.0", "drift"], ["2.33.0", "drift"]]
    # the middle build's errors back at the baseline's: the drift starts at the candidate
    st2 = Store.open(tmp_path / "d2.sqlite")
    old = _run(st2, "r0", "2.31.0", items, error=1e-6)
    _run(st2, "r1", "2.32.0", items, error=1e-6)
    new = _run(st2, "r2", "2.33.0", items, error=1e-3)
    assert run_gate(st2, old, new, attempts=0).of("drift")[0].evidence["first_bad_build"] == "2.33.0"


def test_builds_are_ordered_by_version_not_by_name_or_start_time(tmp_path):
    st = Store.open(tmp_path / "v.sqlite")
    base = _run(st, "a", "2.8.0", {_k("exp", 0): "pass"}, started="2026-11-01T00:00:00+00:00")
    cand = _run(st, "b", "2.10.0", {_k("exp", 0): "mismatch"}, started="2026-11-02T00:00:00+00:00")
    _run(st, "c", "2.9.0", {_k("exp", 0): "mismatch"}, started="2026-11-03T00:00:00+00:00")  # a late re-run of 2.9
    ev = _regressions(run_gate(st, base, cand, attempts=0))[_k("exp", 0)]
    assert (ev["first_bad_build"], ev["first_bad_run"], ev["first_bad_order"]) == ("2.9.0", "c", "version")


def test_builds_without_version_names_are_ordered_by_start_time(tmp_path):
    st = Store.open(tmp_path / "t.sqlite")
    base = _run(st, "a", "nightly-a", {_k("exp", 0): "pass"}, started="2026-11-01T00:00:00+00:00")
    _run(st, "c", "nightly-c", {_k("exp", 0): "mismatch"}, started="2026-11-02T00:00:00+00:00")
    cand = _run(st, "b", "nightly-b", {_k("exp", 0): "mismatch"}, started="2026-11-03T00:00:00+00:00")
    _run(st, "d", "nightly-d", {_k("exp", 0): "pass"}, started="2026-11-04T00:00:00+00:00")  # newer: not looked at
    ev = _regressions(run_gate(st, base, cand, attempts=0))[_k("exp", 0)]
    assert (ev["first_bad_build"], ev["first_bad_order"]) == ("nightly-c", "start time")
    assert [h[0] for h in ev["history"]] == ["nightly-a", "nightly-c", "nightly-b"]


def test_a_build_is_stood_for_by_its_latest_run_holding_the_item(tmp_path):
    st, (old, mid, new) = _three(tmp_path, {_k("exp", 0): ("pass", "pass", "mismatch")})
    # a later run of the middle build (start times have one-second steps: set them)
    _run(st, "mid-again", "2.32.0", {_k("exp", 0): "mismatch"}, started="2999-01-01T00:00:00+00:00")
    ev = _regressions(run_gate(st, old, new, attempts=0))[_k("exp", 0)]
    assert (ev["first_bad_build"], ev["first_bad_run"]) == ("2.32.0", "mid-again")


def test_the_history_is_read_in_a_fixed_number_of_queries_whatever_the_findings(tmp_path):
    n = 60
    table = {_k("exp", i): ("pass", "mismatch", "mismatch") for i in range(n)}
    st, (old, mid, new) = _three(tmp_path, table)
    base, cand = st.get_run(old), st.get_run(new)
    findings = compare_runs(st, base, cand)
    assert len(findings) == n
    statements: list[str] = []
    st.db.conn.set_trace_callback(statements.append)
    try:
        annotate(st, base, cand, findings)
    finally:
        st.db.conn.set_trace_callback(None)
    assert len([s for s in statements if s.lstrip().lower().startswith("select")]) == 2, statements
    assert {f.evidence["first_bad_build"] for f in findings} == {"2.32.0"}


def test_console_markdown_json_and_report_show_the_first_bad_build(tmp_path):
    st, (old, mid, new) = _three(tmp_path)
    st.close()
    db = tmp_path / "g.sqlite"
    out = tmp_path / "gate.json"
    r = CliRunner().invoke(main, ["gate", "--db", str(db), "--baseline", old, "--candidate", new, "--reruns", "0",
                                  "--json", str(out), "--markdown", str(tmp_path / "g.md")])
    assert r.exit_code == 1, r.output
    lines = r.output.splitlines()
    exp = lines.index("  REGRESSION exp [function, float32] pass -> mismatch (3 items)")
    assert lines[exp + 1].startswith(
        f"      first bad: 2.33.0 (2 items), 2.32.0 (1 item); unknown before 2.33.0: run {mid} (build 2.32.0) "
        "lacks the item; ")
    sin = lines.index("  REGRESSION sin [function, float32] pass -> mismatch (2 items)")
    assert lines[sin + 1].startswith("      first bad: 2.32.0 (1 item), 2.33.0 (1 item); ")
    data = json.loads(out.read_text())
    assert {x["item_key"]: x["first_bad_build"] for x in data["regressions"]}[_k("exp", 0)] == "2.32.0"
    md = (tmp_path / "g.md").read_text()
    assert "| kind | op/model | variant | dtype | change | items | first bad build |" in md
    assert "| op | `sin` | function | float32 | pass → mismatch | 2 | 2.32.0 \\(1 item\\), 2.33.0 \\(1 item\\) |" in md

    # the report: the gate of the previous build (2.32.0 -> 2.33.0) on its regressions and diff pages
    with Store.open(db) as st:
        result = run_gate(st, mid, new, attempts=0)
        assert "first bad: 2.33.0" in "\n".join(summary_lines(result)) and "first bad build" in markdown(result)
        render_site(st, tmp_path / "site", builds=["2.33.0"])
    page = (tmp_path / "site/2.33.0/regressions.html").read_text()
    assert "<th>first bad build</th>" in page
    assert '<td data-k="first-bad">2.33.0</td>' in page
    diff = (tmp_path / "site/2.33.0/diff.html").read_text()
    from test_report import data_block

    spec = data_block(diff, "diff-ops-data")
    assert [c["label"] for c in spec["columns"]][-2:] == ["first bad build", "evidence"]
    rows = {r[7]: r for r in spec["rows"]}
    assert rows[_k("exp", 1)][8] == "2.33.0"
    assert "history: 2.31.0 pass, 2.32.0 pass, 2.33.0 mismatch" in rows[_k("exp", 1)][9]
