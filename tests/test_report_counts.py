"""One source for every count: a site rendered from one database says the same numbers on the index,
the build summary, the matrix, the lists and the diff, and they are the numbers the console prints
(the run summary, the gate summary, the coverage line).

The database is the report fixture plus what made the pages disagree before: a canary item (the
console leaves canaries out), a schema-driven item (not an OpInfo op), and the real gate's decisions.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from test_report import MODEL_A, MODEL_B, RUN_A, RUN_B, RUN_C, _op_rows, data_block, make_report_db

from conformance.catalog.coverage import reachable_share
from conformance.gate.core import run_gate
from conformance.gate.render import summary_lines
from conformance.run.runner import Summary, _whole_run
from opdb import Store
from opdb import queries_report as q
from opdb.queries import status_counts
from reports import render_site

BUILD = "2.33.0"


@pytest.fixture(scope="module")
def counted(tmp_path_factory) -> tuple[Path, Path, list[str], dict[str, str]]:
    tmp = tmp_path_factory.mktemp("counts")
    db = make_report_db(tmp / "rep.sqlite")
    with Store.open(db) as st:
        canary = _op_rows(RUN_B, {("add", "float32"): ["pass_fallback"]})
        canary[0].update(item_key="add|canary|float32|0", variant="canary")
        schema = _op_rows(RUN_B, {("sin", "float32"): ["mismatch"]})
        schema[0].update(item_key="aten::sin.default|schema|any|0", op="aten::sin.default", variant="schema",
                         dtype="any")
        st.insert("op_results", canary + schema)
        console_gate = {}
        for b, c in ((RUN_A, RUN_B), (MODEL_A, MODEL_B), (RUN_B, RUN_C)):
            console_gate[c] = "\n".join(summary_lines(run_gate(st, b, c, attempts=0)))
        console_run = Summary(RUN_B)
        _whole_run(st, RUN_B, None, console_run)
        states = q.coverage_states(st, RUN_B)
    out = tmp / "site"
    with Store.open(db) as st:
        render_site(st, out, db_label=str(db))
    return db, out, [console_run.render(), reachable_share(states)], console_gate


def _console_counts(text: str) -> dict[str, int]:
    return {m[1]: int(m[2]) for m in re.finditer(r"^  (\w+)\s+(\d+)(?:\s+\(\d+ groups?\))?$", text, re.M)}


def _html(out: Path, rel: str) -> str:
    return (out / rel).read_text(encoding="utf-8")


def _k(html: str, key: str) -> int:
    """The number an element marked data-k=key shows (inside a link or a value span, if any)."""
    m = re.search(rf'data-k="{key}"[^>]*>(?:<a [^>]*>|<span class="v">)?([\d,]+)', html)
    assert m, f"no data-k={key}"
    return int(m.group(1).replace(",", ""))


def test_result_counts_agree_with_the_console_run_summary(counted):
    db, out, (run_text, _), _ = counted
    console = _console_counts(run_text)
    items = int(re.match(r"run \S+: (\d+) items", run_text).group(1))
    failing = sum(n for s, n in console.items() if s not in ("pass", "pass_fallback", "skip", "xfail"))
    index = _html(out, "index.html")
    row = re.search(rf'<tr data-build="{re.escape(BUILD)}">(.*?)</tr>', index, re.S).group(1)
    assert _k(row, "op_total") == items == sum(console.values())
    assert _k(row, "failing") == failing and _k(row, "native_pass") == console["pass"]
    summary = _html(out, f"{BUILD}/index.html")
    statuses = summary[summary.index('id="statuses"'):summary.index("Model results by status")]
    shown = {m[1]: int(m[2]) for m in re.finditer(r'<tr data-status="(\w+)">.*?<td class="n">([\d,]+)</td>',
                                                  statuses, re.S)}
    assert shown == console  # the canary item is in the database, and in neither


def test_coverage_figure_is_the_console_coverage_line(counted):
    _, out, (_, share), _ = counted
    exercised, reachable = map(int, re.match(r"(\d+)/(\d+)", share).groups())
    summary = _html(out, f"{BUILD}/index.html")
    assert re.search(rf'data-k="exercised"><span class="v">{exercised}</span><span class="of"> / {reachable}</span>',
                     summary), share


@pytest.mark.parametrize("how", ["fallback", "failing"])
def test_overload_lists_agree_on_every_page(counted, how):
    _, out, _, _ = counted
    index = _html(out, "index.html")
    row = re.search(rf'<tr data-build="{re.escape(BUILD)}">(.*?)</tr>', index, re.S).group(1)
    listed = _html(out, f"{BUILD}/{'fallbacks' if how == 'fallback' else 'failing'}.html")
    rows = data_block(listed, f"{how}-data")["rows"]
    matrix = _html(out, f"{BUILD}/matrix.html")
    spec = data_block(matrix, "matrix-data")
    flagged = [r[0][1] for r in spec["rows"] if how in r[-1]]
    n = len(rows)
    assert n > 0
    assert _k(row, f"{how}_overloads") == n
    assert _k(_html(out, f"{BUILD}/index.html"), how) == n
    assert _k(matrix, how) == n == len(flagged)
    assert sorted(flagged) == sorted(r[0][1] for r in rows)
    assert _k(listed, how) == n


def test_matrix_counts_opinfo_ops_only(counted):
    db, out, _, _ = counted
    matrix = _html(out, f"{BUILD}/matrix.html")
    spec = data_block(matrix, "matrix-data")
    opinfo = [r[0][1] for r in spec["rows"] if r[1] == "OpInfo"]
    assert "aten::sin.default" not in opinfo  # a schema-driven item is no OpInfo op
    n = int(re.search(r"<p>([\d,]+) OpInfo ops", matrix).group(1))
    assert n == len(opinfo) == 5
    # the ATen row of an overload with schema-driven samples links to their op page
    sin = next(r for r in spec["rows"] if r[0][1] == "aten::sin.default")
    assert sin[0][0] == "ops/aten_sin.default.html" and (out / BUILD / sin[0][0]).is_file()


@pytest.mark.parametrize("build", [BUILD, "2.34.0"])
def test_gate_counts_agree_with_the_console_gate(counted, build):
    db, out, _, console_gate = counted
    run = {BUILD: RUN_B, "2.34.0": RUN_C}[build]
    console = _console_counts(console_gate[run])
    if build == BUILD:  # the op and the model pair of runs, both judged
        model = _console_counts(console_gate[MODEL_B])
        console = {k: console[k] + model[k] for k in console}
    verdict = "FAIL" if "FAIL" in console_gate[run] + console_gate.get(MODEL_B if build == BUILD else run, "") \
        else "PASS"
    index = _html(out, "index.html")
    row = re.search(rf'<tr data-build="{re.escape(build)}">(.*?)</tr>', index, re.S).group(1)
    assert re.search(rf'data-k="gate"><a class="verdict verdict-{verdict.lower()}"[^>]*>{verdict}<', row)
    if console["regression"]:
        assert _k(row, "regressions") == console["regression"]
    summary = _html(out, f"{build}/index.html")
    assert _k(summary, "regressions") == console["regression"]
    regs = _html(out, f"{build}/regressions.html")
    cats = {m[1]: int(m[2].replace(",", "")) for m in re.finditer(
        r'<li data-category="(\w+)">.*?<span class="v">([\d,]+)</span>', regs)}
    assert cats == {k: v for k, v in console.items() if v}
    grouped = sum(int(m) for m in re.findall(r'data-category="regression".*?data-k="items">(\d+)<', regs))
    assert grouped == console["regression"]
    diff = _html(out, f"{build}/diff.html")
    in_diff = sum(int(n.replace(",", "")) for n in re.findall(
        r'<li data-category="regression">.*?<span class="v">([\d,]+)</span>', diff))
    assert in_diff == console["regression"]
    totals = diff[diff.index('id="diff-totals"'):]
    totals = {m[1]: int(m[2].replace(",", "")) for m in re.finditer(
        r'<span data-category="(\w+)">\w+ <span class="v">([\d,]+)</span>', totals[:totals.index("</p>")])}
    assert totals == {k: v for k, v in console.items() if v}


def test_counting_the_canary_would_disagree(counted, tmp_path):
    """The check above can fail: the canary is in the database, so a page counting every stored
    op result shows one more than the console."""
    db, _, (run_text, _), _ = counted
    copy = tmp_path / "c.sqlite"
    shutil.copyfile(db, copy)
    with Store.open(copy) as st:
        every = sum(status_counts(st, RUN_B).values())
    assert every == int(re.match(r"run \S+: (\d+) items", run_text).group(1)) + 1
