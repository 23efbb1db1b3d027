"""The report over a database holding several targets: each (target, build) rendered apart, the
cross-backend page (its op × backend matrix and "fails only on X"), op pages linking the same op
on other targets; a single-target site has none of it.

``make_backends_db`` builds the small deterministic DB that ``test_report_browser.py`` uses too.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest
from test_report import TV, _op_rows, data_block, make_report_db, read

from opdb import Store
from opdb import queries_report as q
from opdb.status import FAILING, PASSED
from reports import render_site
from reports.pages import backends as backends_page
from reports.scope import build_labels

# (target, build, run id, started) of the fixture's op runs
RUNS = [
    ("neuron-emu", "2.32.0", "emu-32", "2026-11-01T10:00:00+00:00"),
    ("cpu", "-", "cpu-1", "2026-11-01T11:00:00+00:00"),
    ("neuron-emu", "2.33.0", "emu-33", "2026-11-02T10:00:00+00:00"),
    ("inductor", "-", "ind-1", "2026-11-02T11:00:00+00:00"),
]
_ALL = {(op, d): ["pass", "pass"] for op in ("add", "sin", "cumsum") for d in ("float32", "bfloat16")}
OPS = {
    "cpu-1": dict(_ALL),
    "emu-32": dict(_ALL),
    "emu-33": {**_ALL,
               ("cumsum", "bfloat16"): ["pass", "mismatch"],  # fails on neuron-emu only
               ("sin", "float32"): ["error", "pass"],  # fails on inductor too: nobody's own
               ("add", "bfloat16"): ["mismatch", "pass_fallback"]},  # inductor skips sample 0: not "only"
    "ind-1": {**_ALL,
              ("cumsum", "float32"): ["pass", "error"],  # fails on inductor only
              ("sin", "float32"): ["mismatch", "pass"],
              ("add", "bfloat16"): ["skip", "pass"]},
}


def make_backends_db(path: Path) -> Path:
    """Two neuron-emu builds, a cpu run and an inductor run (both of build '-') over the same
    seeded samples, plus a schema-driven item failing on 2.33.0 alone (no OpInfo sample)."""
    with Store.open(path) as st:
        st.insert("runs", [{"id": rid, "target": target, "build": build, "torch_version": TV, "host": "h",
                            "git_sha": "abc", "started_at": started, "finished_at": started, "status": "finished",
                            "kind": "ops", "config": "{}"} for target, build, rid, started in RUNS])
        rows = [r for rid, table in OPS.items() for r in _op_rows(rid, table)]
        schema = _op_rows("emu-33", {("sin", "float32"): ["error"]})[0]
        schema.update(variant="schema", item_key="aten::sin.default|schema|float32|0", op="aten::sin.default")
        st.insert("op_results", [*rows, schema])
    return path


@pytest.fixture(scope="module")
def backends_db(tmp_path_factory) -> Path:
    return make_backends_db(tmp_path_factory.mktemp("bdb") / "backends.sqlite")


@pytest.fixture(scope="module")
def backends_site(backends_db, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bsite")
    with Store.open(backends_db) as st:
        render_site(st, out, db_label=str(backends_db))
    return out


def test_each_target_and_build_is_rendered_apart(backends_site):
    html = read(backends_site, "index.html")
    assert re.findall(r'<tr data-build="([^"]+)">', html) == ["2.32.0", "cpu", "2.33.0", "inductor"]
    for folder in ("2.32.0", "2.33.0", "cpu", "inductor"):
        assert (backends_site / folder / "ops/cumsum.html").is_file(), folder
    assert not (backends_site / "-").exists()  # cpu and inductor both store build '-': never one folder
    cpu = read(backends_site, "cpu/index.html")
    assert "cpu-1" in cpu and "ind-1" not in cpu
    # a build's previous build is its own target's: 2.33.0 against 2.32.0, never against cpu
    row = re.search(r'<tr data-build="2.33.0">(.*?)</tr>', html, re.S).group(1)
    assert "vs 2.32.0" in row
    for first in ("cpu", "inductor", "2.32.0"):
        row = re.search(rf'<tr data-build="{first}">(.*?)</tr>', html, re.S).group(1)
        assert "first build" in row, first
    assert "No earlier build" in read(backends_site, "inductor/diff.html")
    # one trend per target: two targets' builds are no sequence
    assert html.count("<svg") == 3 and "Trend across builds of inductor" in html


def test_labels_keep_single_target_names_and_tell_shared_builds_apart():
    B = q.BuildRuns
    assert build_labels([B("2.31.0", None, None, "neuron-emu"), B("2.33.0", None, None, "neuron-emu")]) == \
        ["2.31.0", "2.33.0"]
    assert build_labels([B("-", None, None, "cpu")]) == ["-"]  # a single-target site stays as it was
    assert build_labels([B("2.33.0", None, None, "neuron-emu"), B("2.33.0", None, None, "device:neuron"),
                         B("-", None, None, "cpu"), B("inductor-2.13.0", None, None, "inductor")]) == \
        ["neuron-emu 2.33.0", "device:neuron 2.33.0", "cpu", "inductor-2.13.0"]


def _brute_only(db: Path, runs: list[str]) -> dict[tuple[str, str, str], int]:
    """(run, op, dtype) -> items failing in that run only, passing in every other run holding them."""
    con = sqlite3.connect(db)
    by_key: dict[str, list[tuple[str, str, str, str]]] = {}
    for rid, key, op, dtype, status, variant in con.execute(
            "select run_id, item_key, op, dtype, status, variant from op_results"):
        if rid in runs and variant not in ("schema", "canary"):
            by_key.setdefault(key, []).append((rid, op, dtype, status))
    out: dict[tuple[str, str, str], int] = {}
    for items in by_key.values():
        bad = [i for i in items if i[3] in FAILING]
        if len(items) >= 2 and len(bad) == 1 and all(i[3] in PASSED for i in items if i is not bad[0]):
            k = bad[0][:3]
            out[k] = out.get(k, 0) + 1
    return out


def test_fails_only_on_agrees_with_a_brute_force_count(backends_db):
    runs = ["cpu-1", "emu-33", "ind-1"]
    with Store.open(backends_db) as st:
        got = {(o.run_id, o.op, o.dtype): o.items for o in q.fails_only_on(st, runs)}
        assert q.fails_only_on(st, ["cpu-1"]) == []
    assert got == _brute_only(backends_db, runs) == {("emu-33", "cumsum", "bfloat16"): 1,
                                                      ("ind-1", "cumsum", "float32"): 1}


def test_cross_backend_matrix_cells(backends_site):
    html = read(backends_site, "backends.html")
    spec = data_block(html, "backends-data")
    cols = [c["label"] for c in spec["columns"]]
    assert cols == ["op", "dtype", "neuron-emu", "cpu", "inductor", "fails on", "fails only on"]
    rows = {(r[0], r[1]): r for r in spec["rows"]}
    assert len(rows) == 6  # 3 OpInfo ops x 2 dtypes; the schema-driven item is no OpInfo row
    emu, cpu, ind = rows[("cumsum", "bfloat16")][2:5]
    assert emu == ["mismatch", "2.33.0: pass 1, mismatch 1", 2, [], "2.33.0/ops/cumsum.html", "1 pass · 1 fail"]
    assert cpu[0] == "pass" and cpu[4:] == ["cpu/ops/cumsum.html", "2 pass"]
    assert ind[4] == "inductor/ops/cumsum.html"
    assert rows[("cumsum", "bfloat16")][5:] == [["neuron-emu"], ["neuron-emu"]]
    assert rows[("sin", "float32")][5:] == [["neuron-emu", "inductor"], []]
    assert rows[("add", "bfloat16")][4][5] == "1 pass · 1 other"
    assert rows[("add", "bfloat16")][5:] == [["neuron-emu"], []]  # inductor skipped the failing sample
    assert rows[("cumsum", "float32")][5:] == [["inductor"], ["inductor"]]
    # the latest build of each target is its column: 2.32.0 is not compared
    assert "emu-32" not in html and "emu-33" in html
    assert re.search(r'failing on some backend and passing on another', html)
    n_disagree = int(re.search(r"rows, (\d+) of them failing on some backend", html).group(1))
    assert n_disagree == 4


def test_a_row_disagrees_only_when_another_backend_passes_it(tmp_path):
    """"Failing on some backend and passing on another": a backend's own passing samples of an op
    it also fails (and nobody else ran) are no disagreement between backends."""
    runs = [("cpu", "-", "c1", "2026-11-01T10:00:00+00:00"), ("inductor", "-", "i1", "2026-11-01T11:00:00+00:00")]
    ops = {"c1": {("sin", "float32"): ["pass", "mismatch"],  # cpu alone ran it: its own mixed verdict
                  ("cumsum", "float32"): ["pass", "pass"]},
           "i1": {("cumsum", "float32"): ["error", "pass"],  # fails on inductor, passes on cpu
                  ("add", "float32"): ["pass"]}}
    with Store.open(tmp_path / "two.sqlite") as st:
        st.insert("runs", [{"id": rid, "target": target, "build": build, "torch_version": TV, "host": "h",
                            "git_sha": "abc", "started_at": started, "finished_at": started, "status": "finished",
                            "kind": "ops", "config": "{}"} for target, build, rid, started in runs])
        st.insert("op_results", [r for rid, table in ops.items() for r in _op_rows(rid, table)])
        render_site(st, tmp_path / "site")
    html = (tmp_path / "site/backends.html").read_text()
    assert re.search(r"3 op × dtype rows, 1 of them failing on some backend and passing on another", html), html[:3000]


def test_fails_only_on_lists_each_backends_own_failures(backends_site):
    html = read(backends_site, "backends.html")
    sections = dict(re.findall(r'<section class="only" id="[^"]+" data-target="([^"]+)">(.*?)</section>', html, re.S))
    assert list(sections) == ["neuron-emu", "cpu", "inductor"]
    emu = re.findall(r'<tr data-op="([^"]+)" data-dtype="([^"]+)">\s*<td><a href="([^"]+)">', sections["neuron-emu"])
    assert emu == [("cumsum", "bfloat16", "2.33.0/ops/cumsum.html")]
    assert "passing on" in sections["neuron-emu"] and "<td>cpu, inductor</td>" in sections["neuron-emu"]
    assert re.findall(r'<tr data-op="([^"]+)" data-dtype="([^"]+)">', sections["inductor"]) == [("cumsum", "float32")]
    assert "None:" in sections["cpu"]
    listed = re.search(r'<tr data-target="neuron-emu">(.*?)</tr>', html, re.S).group(1)
    assert 'data-k="only_items"><a href="#only-neuron-emu">1<' in listed
    assert 'data-k="failing">3<' in listed  # OpInfo samples: the schema-driven item is not in the matrix


def test_a_backends_own_findings_say_whether_its_upstream_lists_them(backends_db, tmp_path):
    """Given the upstream lists (target -> (op, dtype) -> expectation), each "fails only on"
    row says what that backend's own project expects of it, and "no" for a finding new to them;
    a list about another target never marks it."""
    lists = {"inductor": {("cumsum", "float32"): "xfail (newest)"},
             "neuron-emu": {("cumsum", "float32"): "skip (elsewhere)"}}
    with Store.open(backends_db) as st:
        render_site(st, tmp_path / "site", upstream=lists)
    html = (tmp_path / "site/backends.html").read_text()
    sections = dict(re.findall(r'<section class="only" id="[^"]+" data-target="([^"]+)">(.*?)</section>', html, re.S))
    assert re.findall(r'<td class="upstream">([^<]*)</td>', sections["inductor"]) == ["xfail (newest)"]
    assert re.findall(r'<td class="upstream">([^<]*)</td>', sections["neuron-emu"]) == ["no"]  # cumsum bfloat16


def test_the_shipped_lists_mark_each_target_by_its_own_project():
    from conformance.triage.upstream import known_by_target

    known = known_by_target()
    assert set(known) == {"inductor", "inductor-strict", "onnxruntime"}
    assert known["inductor"][("cholesky", "float32")] == "xfail (newest); xfail (late2023)"
    assert known["onnxruntime"][("scatter_add", "float32")] == "xfail (onnxscript, some samples)"
    assert ("scatter_add", "float32") not in known["inductor"]


def test_op_page_links_the_same_op_on_other_targets(backends_site):
    html = read(backends_site, "2.33.0/ops/cumsum.html")
    builds = re.search(r'<p class="others" id="other-builds">(.*?)</p>', html, re.S).group(1)
    targets = re.search(r'<p class="others" id="other-targets">(.*?)</p>', html, re.S).group(1)
    assert re.findall(r'href="([^"]+)">([^<]+)<', builds) == [("../../2.32.0/ops/cumsum.html", "2.32.0")]
    assert re.findall(r'href="([^"]+)">([^<]+)<', targets) == [
        ("../../cpu/ops/cumsum.html", "cpu"), ("../../inductor/ops/cumsum.html", "inductor"),
        ("../../backends.html", "across backends")]
    cpu = read(backends_site, "cpu/ops/cumsum.html")
    assert 'id="other-builds"' not in cpu
    assert re.findall(r'href="\.\./\.\./([^"]+)/ops/cumsum.html">([^<]+)<', cpu) == [
        ("2.32.0", "neuron-emu 2.32.0"), ("2.33.0", "neuron-emu 2.33.0"), ("inductor", "inductor")]


def test_navigation_and_index_link_the_cross_backend_page(backends_site):
    assert 'href="backends.html">Across backends</a>' in read(backends_site, "index.html")
    assert 'href="../backends.html">Across backends</a>' in read(backends_site, "inductor/matrix.html")


def test_a_single_target_site_has_no_cross_backend_page(tmp_path):
    db = make_report_db(tmp_path / "one.sqlite")
    with Store.open(db) as st:
        render_site(st, tmp_path / "site")
    assert not (tmp_path / "site/backends.html").exists()
    for rel in ("index.html", "2.33.0/index.html", "2.33.0/ops/sin.html"):
        text = (tmp_path / "site" / rel).read_text()
        assert "Across backends" not in text and "other-targets" not in text, rel
    assert "Trend across builds (share of results)" in (tmp_path / "site/index.html").read_text()


def test_long_lists_say_how_many_more(backends_db, tmp_path, monkeypatch):
    monkeypatch.setattr(backends_page, "ONLY_ROWS", 0)
    with Store.open(backends_db) as st:
        render_site(st, tmp_path / "site")
    assert "and 1 more op × dtype groups" in (tmp_path / "site/backends.html").read_text()


def test_the_gate_links_the_page_the_site_renders_for_its_target(backends_db, backends_site):
    """Beside other targets a build's folder is named by its label (``cpu`` for the cpu run's
    build '-'): the gate's report link names that folder, one the site has."""
    from conformance.cli.gate import _report_page

    with Store.open(backends_db, create=False) as st:
        for target, build, folder in (("cpu", "-", "cpu"), ("inductor", "-", "inductor"),
                                      ("neuron-emu", "2.33.0", "2.33.0")):
            link = _report_page(str(backends_site), st, {"target": target, "build": build})
            assert link == f"{backends_site}/{folder}/regressions.html" and Path(link).is_file(), link
        assert _report_page("", st, {"target": "cpu", "build": "-"}) == ""


def test_items_nothing_of_which_ran_on_a_compiler_backend_have_a_count_of_their_own(tmp_path):
    """An openvino item that ran no OpenVINO subgraph is ``pass_fallback`` by the harness's rule,
    and its build page and the cross-backend page count it apart: from the proof's generic
    ``backend_ran`` where the target keeps it, else from every graph op being a fallback kernel
    (an inductor item, or an openvino row stored before ``backend_ran``). Canaries aside."""
    from conformance.targets.base import Compiled

    assert "backend_ran" not in Compiled("inductor").evidence()  # an eager-whole-graph backend's proof is unchanged
    assert Compiled("openvino", backend_ran=0).evidence()["backend_ran"] == 0
    runs = [("cpu", "-", "c1", "2026-11-01T10:00:00+00:00"), ("openvino", "-", "ov1", "2026-11-01T11:00:00+00:00"),
            ("inductor", "-", "in1", "2026-11-01T12:00:00+00:00")]

    def ov(ran, ops, fallback, **more):
        return {"device": ["cpu"], "backend": "openvino", "graphs": 1, "graph_ops": ops, "fallback_kernels": fallback,
                **({} if ran is None else {"backend_ran": ran}), **more}

    zeta, add, mul = "aten::special_zeta.default", "aten::add.Tensor", "aten::mul.Tensor"
    proofs = {  # (run, op) -> one proof per sample, in the order of the statuses below
        ("ov1", "add"): [ov(1, [add], []),  # ran on OpenVINO
                         ov(0, [add, mul], [add, mul]),  # nothing on OpenVINO
                         ov(1, [add, zeta], [zeta]),  # partly
                         ov(1, [add], [add])],  # add in a subgraph that ran and outside it: backend_ran decides
        ("ov1", "sin"): [ov(None, [zeta], [zeta], openvino_subgraphs=0),  # stored before backend_ran
                         ov(0, [zeta], [zeta])],
        ("in1", "sin"): [{"backend": "inductor", "graphs": 1, "graph_ops": ["aten::cholesky.default"],
                          "fallback_kernels": ["aten::cholesky.default"]},
                         {"backend": "inductor", "graphs": 1, "graph_ops": [add], "fallback_kernels": []}],
    }
    ops = {"c1": {("add", "float32"): ["pass"] * 4, ("sin", "float32"): ["pass", "pass"]},
           "ov1": {("add", "float32"): ["pass", "pass_fallback", "pass_fallback", "pass_fallback"],
                   ("sin", "float32"): ["pass_fallback", "mismatch"]},
           "in1": {("sin", "float32"): ["pass_fallback", "pass"]}}
    with Store.open(tmp_path / "ov.sqlite") as st:
        st.insert("runs", [{"id": rid, "target": target, "build": build, "torch_version": TV, "host": "h",
                            "git_sha": "abc", "started_at": started, "finished_at": started, "status": "finished",
                            "kind": "ops", "config": "{}"} for target, build, rid, started in runs])
        rows = []
        for rid, table in ops.items():
            for r in _op_rows(rid, table):
                made = proofs.get((rid, r["op"]))
                if made:
                    r["proof"] = made[r["sample"]]
                rows.append(r)
        canary = _op_rows("ov1", {("add", "float32"): ["pass_fallback"]})[0]
        canary.update(item_key="add|canary|float32|0", variant="canary", proof=ov(0, [add], [add]))
        st.insert("op_results", [*rows, canary])
        render_site(st, tmp_path / "site")
    site = tmp_path / "site"

    def share(folder: str) -> dict[str, tuple[str, str]]:
        html = read(site, f"{folder}/index.html")
        table = re.search(r'<table class="counts backend-share">(.*?)</table>', html, re.S)
        if table is None:
            return {}
        rows = re.findall(r'<tr data-status="([^"]+)">.*?<td class="n">([\d,]+)</td><td class="n" data-k="ran_none">'
                          r'([\d,]+)</td>', table.group(1), re.S)
        total = re.search(r"data-total-ran-none>([\d,]+)<", table.group(1)).group(1)
        return {**{s: (n, none) for s, n, none in rows}, "total": total}

    assert share("openvino") == {"pass": ("1", "0"), "pass_fallback": ("4", "2"), "mismatch": ("1", "1"), "total": "3"}
    assert share("inductor") == {"pass": ("1", "0"), "pass_fallback": ("1", "1"), "total": "1"}
    assert share("cpu") == {} and "What the backend ran" not in read(site, "cpu/index.html")
    listed = read(site, "backends.html")
    cells = {t: re.search(rf'<tr data-target="{t}">.*?data-k="ran_none">([^<]*)</td>', listed, re.S).group(1)
             for t in ("cpu", "openvino", "inductor")}
    assert cells == {"cpu": "—", "openvino": "3", "inductor": "1"}
