"""The static report: contexts vs templates, numbers vs the DB, escaping, pagination, the CLI.

``make_report_db`` builds the small deterministic DB that ``test_report_browser.py`` uses too.
"""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
from pathlib import Path

import jinja2
import pytest
from click.testing import CliRunner
from jinja2 import meta

import conformance.cli.report  # noqa: F401  (attaches `report` to the group)
import reports.html as rhtml
import reports.pages.diff as diff_page
import reports.pages.family as family_page
import reports.pages.op as op_page
from conformance.cli import main
from opdb import Store
from opdb import queries_report as q
from opdb.status import FAILING, SEVERITY, severity, worst
from reports import charts, render_site
from reports.contexts import Page
from reports.pages import PAGES

TV = "2.13.0+cpu"
SCRIPT = "<script>alert('xss')</script>"
RUN_A, RUN_B, RUN_C, RUN_C_BAD = "run-a", "run-b", "run-c", "run-c-interrupted"
MODEL_A, MODEL_B = "models-a", "models-b"

CATALOG = [
    ("aten::add.Tensor", ["functional", "core"], ["add"]),
    ("aten::add_.Tensor", ["inplace"], []),
    ("aten::sin.default", ["functional", "core"], ["sin"]),
    ("aten::cumsum.default", ["functional", "core"], ["cumsum"]),
    ("aten::convolution.default", ["functional", "core"], ["nn.functional.conv2d"]),
    ("aten::conv2d.default", ["functional", "composite_implicit"], []),
    ("aten::bernoulli.p", ["functional", "random"], []),
]

# (op, dtype) -> statuses of samples 0..n-1, per build
OPS_A = {
    ("add", "float32"): ["pass", "pass", "pass"],
    ("add", "bfloat16"): ["pass_fallback", "pass_fallback", "pass_fallback"],
    ("sin", "float32"): ["pass", "mismatch"],
    ("sin", "bfloat16"): ["pass", "pass"],
    ("cumsum", "float32"): ["pass", "pass"],
    ("cumsum", "int64"): ["pass_fallback", "pass_fallback"],
    ("nn.functional.conv2d", "float32"): ["pass", "pass", "pass", "pass"],
    ("nn.functional.conv2d", "bfloat16"): ["xfail", "skip", "pass", "pass"],
}
OPS_B = {
    ("add", "float32"): ["pass", "pass", "pass"],
    ("add", "bfloat16"): ["pass", "pass", "pass"],  # 3 improvements (fallback -> native)
    ("sin", "float32"): ["pass", "pass"],  # 1 improvement (mismatch -> pass)
    ("sin", "bfloat16"): ["pass", "mismatch"],  # 1 regression
    ("cumsum", "float32"): ["pass", "error"],  # 1 regression (the <script> error)
    ("cumsum", "int64"): ["unsupported_dtype", "unsupported_dtype"],  # 2 regressions
    ("nn.functional.conv2d", "float32"): ["pass", "pass", "timeout", "crash"],  # 2 regressions
    ("nn.functional.conv2d", "bfloat16"): ["xfail", "skip", "pass", "xpass"],  # 1 regression
    ("nn.functional.relu", "float32"): ["pass"],  # new
}
OPS_C = {**OPS_B, ("sin", "bfloat16"): ["pass", "pass"]}

# (op, dtype, sample) -> the contract checks stored with that item of build 2.33.0 (statuses stay
# those of OPS_B: a failed contract on a mismatch item is still a mismatch)
_NA_OUT = {"outcome": "n/a", "detail": "no out= variant"}
CONTRACTS_B = {
    ("sin", "bfloat16", 0): {"metadata": {"outcome": "pass", "detail": ""}, "aliasing": {"outcome": "pass", "detail": ""},
                             "out": _NA_OUT},
    ("sin", "bfloat16", 1): {"metadata": {"outcome": "pass", "detail": ""},
                             "aliasing": {"outcome": "fail", "detail": "output 0 shares storage with input(s) [0] "
                                                                        "on the target, none on the CPU " + SCRIPT},
                             "out": _NA_OUT},
    ("sin", "float32", 0): {"metadata": {"outcome": "pass", "detail": ""}, "out": _NA_OUT},
}
NATIVE = {"add": ["aten::add.Tensor"], "sin": ["aten::sin.default"], "cumsum": ["aten::cumsum.default"],
          "nn.functional.conv2d": ["aten::convolution.default"], "nn.functional.relu": ["aten::relu.default"]}


def _op_rows(run_id: str, table: dict, contracts: dict | None = None) -> list[dict]:
    rows = []
    for (op, dtype), statuses in table.items():
        for i, status in enumerate(statuses):
            fallback = status == "pass_fallback"
            rel = {"pass": 0.0, "pass_fallback": 0.0, "mismatch": 0.25}.get(status)
            if status == "pass" and i == 1:
                rel = 1.5e-3
            rows.append({
                "run_id": run_id, "item_key": f"{op}|function|{dtype}|{i}", "op": op, "variant": "function",
                "dtype": dtype, "sample": i, "status": status,
                "error": SCRIPT if status == "error" else ("values differ" if status == "mismatch" else None),
                "max_abs_err": rel, "max_rel_err": rel, "ulp_err": 3.0 if rel else None,
                "mismatch_frac": 0.5 if status == "mismatch" else 0.0, "atol": 1e-5, "rtol": 1.3e-6,
                "tol_source": "ledger.toml:default[0] (bf16 rounding)", "comparator": "allclose",
                "native_ops": [] if fallback else NATIVE[op], "fallback_ops": NATIVE[op] if fallback else [],
                "signature": "f32[4,4]", "seed": 7, "duration_s": 0.5 if op == "nn.functional.conv2d" else 0.01,
                "nan_agree": 1, "dtype_ok": 1, "shape_ok": 0 if status == "crash" else 1, "stride_ok": 1,
                "worst": {"output": 0, "index": [1, 2], "target": 0.75, "cpu": 1.0, "arbiter": 0.9999999}
                if status == "mismatch" else None,
            })
            checks = (contracts or {}).get((op, dtype, i))
            if checks:
                rows[-1]["contracts"] = checks
                rows[-1]["contract_failed"] = ",".join(k for k, v in checks.items() if v["outcome"] == "fail") or None
    return rows


def _run(run_id: str, build: str, kind: str, started: str, status: str = "finished") -> dict:
    return {"id": run_id, "target": "neuron-emu", "build": build, "torch_version": TV, "host": "h",
            "git_sha": "abc", "started_at": started, "finished_at": started if status == "finished" else None,
            "status": status, "kind": kind, "config": "{}"}


def _model(run_id: str, i: int, family: str, status: str, fdo: str | None = None, **kw) -> dict:
    row = {"run_id": run_id, "item_key": f"{family}-{i}|float32|compile", "model_id": f"{family}-{i}",
           "family": family, "params": {"layers": i}, "graph_hash": f"{i:04d}deadbeefcafe", "dtype": "float32",
           "mode": "compile" if i % 2 == 0 else "eager", "status": status, "max_abs_err": 1e-4 * (i + 1),
           "max_rel_err": 1e-3 * (i + 1), "grad_max_rel_err": 2e-3 * (i + 1),
           "loss_curve": {"target": [1.0, 0.8, 0.6, 0.5], "cpu": [1.0, 0.79, 0.58, 0.47]},
           "native_ops": ["aten::mm.default"], "fallback_ops": ["aten::gelu.default"] if i == 1 else [],
           "aten_ops": {"aten::mm.default": 3}, "first_divergent_op": fdo,
           "first_divergent_detail": "rel err 0.3 at output 0" if fdo else None, "recompiles": i,
           "compile_s": 1.5, "p50_ms": 2.0 + i, "p99_ms": 5.0 + i,
           # the runner's per-shape records: the canonical shape, then each variant
           "shapes": [{"shape": [[2, 8]], "recompiled": False, "compiles": 1, "p50_ms": 2.0, "p99_ms": 4.0},
                      {"shape": [[4, 8], [8]], "recompiled": i > 0, "compiles": i, "p50_ms": 3.0,
                       "p99_ms": 6.0}],
           "duration_s": 1.0}
    row.update(kw)
    return row


def make_report_db(path: Path) -> Path:
    """A small opdb with three builds (2.31.0, 2.33.0, 2.34.0), models, coverage and gate items."""
    with Store.open(path) as st:
        st.insert("ops", [{"torch_version": TV, "name": n, "op": n.split(".")[0], "overload": n.split(".")[1],
                           "schema": "", "tags": [], "classes": c, "opinfos": o} for n, c, o in CATALOG])
        st.insert("runs", [
            _run(RUN_A, "2.31.0", "ops", "2026-11-01T10:00:00+00:00"),
            _run(MODEL_A, "2.31.0", "models", "2026-11-01T11:00:00+00:00"),
            _run(RUN_B, "2.33.0", "ops", "2026-11-02T10:00:00+00:00"),
            _run(MODEL_B, "2.33.0", "models", "2026-11-02T11:00:00+00:00"),
            _run(RUN_C, "2.34.0", "ops", "2026-11-03T10:00:00+00:00"),
            _run(RUN_C_BAD, "2.34.0", "ops", "2026-11-03T12:00:00+00:00", status="interrupted"),
        ])
        st.insert("op_results", _op_rows(RUN_A, OPS_A) + _op_rows(RUN_B, OPS_B, CONTRACTS_B) + _op_rows(RUN_C, OPS_C)
                  + [{"run_id": RUN_C_BAD, "item_key": "add|function|float32|0", "op": "add",
                      "variant": "function", "dtype": "float32", "sample": 0, "status": "crash"}])
        st.insert("model_results", [
            _model(MODEL_A, 0, "mlp", "pass"), _model(MODEL_A, 1, "mlp", "pass"),
            _model(MODEL_B, 0, "mlp", "pass"),
            _model(MODEL_B, 1, "mlp", "mismatch", "aten::gelu.default"),
            _model(MODEL_B, 2, "mlp", "error", "aten::gelu.default", error="<b>boom</b>"),
            _model(MODEL_B, 3, "attention", "mismatch", "aten::softmax.int"),
            _model(MODEL_B, 4, "attention", "pass_fallback"),
        ])
        # coverage for build 2.33.0 only (2.31.0 falls back to the op results' overload lists)
        st.insert("coverage", [
            {"run_id": RUN_B, "name": "aten::add.Tensor", "state": "exercised", "samples": 6,
             "native_samples": 6, "fallback_samples": 0, "failing_samples": 0, "statuses": {"pass": 6},
             "dtypes": ["float32", "bfloat16"], "sources": ["opinfo"]},
            {"run_id": RUN_B, "name": "aten::sin.default", "state": "exercised", "samples": 4,
             "native_samples": 4, "fallback_samples": 0, "failing_samples": 1,
             "statuses": {"pass": 3, "mismatch": 1}, "dtypes": ["float32", "bfloat16"], "sources": ["opinfo"]},
            {"run_id": RUN_B, "name": "aten::cumsum.default", "state": "exercised", "samples": 4,
             "native_samples": 2, "fallback_samples": 2, "failing_samples": 1,
             "statuses": {"pass": 1, "error": 1, "unsupported_dtype": 2}, "dtypes": ["float32", "int64"],
             "sources": ["opinfo"]},
            {"run_id": RUN_B, "name": "aten::conv2d.default", "state": "composite_implicit", "samples": 0,
             "native_samples": 0, "fallback_samples": 0, "failing_samples": 0},
            {"run_id": RUN_B, "name": "aten::bernoulli.p", "state": "random", "detail": SCRIPT, "samples": 0,
             "native_samples": 0, "fallback_samples": 0, "failing_samples": 0},
        ])
        # the gate judged 2.33.0 -> 2.34.0
        st.insert("gate_items", [
            {"baseline_run": RUN_B, "candidate_run": RUN_C, "category": "improvement", "kind": "op",
             "item_key": "sin|function|bfloat16|1", "op": "sin", "variant": "function", "dtype": "bfloat16",
             "baseline": "mismatch", "candidate": "pass", "evidence": {"max_rel_err": 0.25},
             "decided_at": "2026-11-03T13:00:00+00:00"},
            {"baseline_run": RUN_B, "candidate_run": RUN_C, "category": "flaky", "kind": "op",
             "item_key": "cumsum|function|float32|1", "op": "cumsum", "variant": "function",
             "dtype": "float32", "baseline": "error", "candidate": "error",
             "evidence": {"attempts": 3, "failures": 1, "note": SCRIPT}, "decided_at": "2026-11-03T13:00:00+00:00"},
        ])
    return path


@pytest.fixture(scope="module")
def report_db(tmp_path_factory) -> Path:
    return make_report_db(tmp_path_factory.mktemp("db") / "rep.sqlite")


@pytest.fixture(scope="module")
def site_dir(report_db, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    with Store.open(report_db) as st:
        render_site(st, out, db_label=str(report_db))
    return out


def data_block(html: str, block_id: str) -> dict:
    m = re.search(rf'<script type="application/json" id="{re.escape(block_id)}">(.*?)</script>', html, re.S)
    assert m, f"no JSON block {block_id}"
    return json.loads(m.group(1))


def read(site_dir: Path, rel: str) -> str:
    return (site_dir / rel).read_text(encoding="utf-8")


def db_counts(db: Path, run_id: str, table: str = "op_results") -> dict[str, int]:
    con = sqlite3.connect(db)
    try:
        return dict(con.execute(f"select status, count(*) from {table} where run_id = ? group by status",
                                [run_id]).fetchall())
    finally:
        con.close()


# -- contexts and templates -------------------------------------------------------------------
PARTIAL_PARAMS = {
    "_status_counts.html": {"counts", "total"},
    "_coverage_table.html": {"rows", "first"},
    "_datatable.html": {"spec_id", "spec"},
    "_build_header.html": {"info"},
    "_nav.html": {"nav", "root"},
}


def _names(env: jinja2.Environment, name: str) -> set[str]:
    source = env.loader.get_source(env, name)[0]
    return meta.find_undeclared_variables(env.parse(source))


@pytest.mark.parametrize("module", PAGES, ids=lambda m: m.__name__)
def test_templates_use_only_their_dataclass_fields(module):
    page_cls = module.CONTEXT
    env = rhtml.make_environment()
    allowed = {f for f in page_cls.__dataclass_fields__} | set(env.globals) | {"page"}
    used = _names(env, module.TEMPLATE) | _names(env, "base.html")
    assert used <= allowed, f"{page_cls.__name__} lacks {sorted(used - allowed)}"
    assert issubclass(page_cls, Page)
    assert page_cls.__doc__, "every page context is documented"


def test_partials_use_only_their_parameters():
    env = rhtml.make_environment()
    partials = sorted(p.name for p in rhtml.TEMPLATES.glob("_*.html"))
    assert set(partials) == set(PARTIAL_PARAMS)
    for name in partials:
        extra = _names(env, name) - PARTIAL_PARAMS[name] - set(env.globals)
        assert not extra, f"{name} uses {sorted(extra)}"


def test_environment_autoescapes_and_is_strict():
    env = rhtml.make_environment()
    assert env.from_string("{{ x }}").render(x=SCRIPT) == "&lt;script&gt;alert(&#39;xss&#39;)&lt;/script&gt;"
    with pytest.raises(jinja2.UndefinedError):
        env.from_string("{{ missing.attr }}").render()


# -- what the site holds ---------------------------------------------------------------------------
def test_site_layout(site_dir):
    for rel in ["index.html", "assets/report.css", "assets/report.js"]:
        assert (site_dir / rel).is_file(), rel
    for build in ("2.31.0", "2.33.0", "2.34.0"):
        for page in ("index.html", "matrix.html", "models.html", "diff.html", "ops/add.html",
                     "ops/nn.functional.conv2d.html"):
            assert (site_dir / build / page).is_file(), f"{build}/{page}"
    assert (site_dir / "2.33.0/models/mlp.html").is_file()
    # self-contained: no absolute or remote URLs
    for f in site_dir.rglob("*.html"):
        text = f.read_text()
        assert not re.search(r'(src|href)="(https?:)?//', text), f
        assert "cdn" not in text.lower(), f


def test_index_numbers_match_db(site_dir, report_db):
    html = read(site_dir, "index.html")
    for build, run in (("2.31.0", RUN_A), ("2.33.0", RUN_B), ("2.34.0", RUN_C)):
        row = re.search(rf'<tr data-build="{re.escape(build)}">(.*?)</tr>', html, re.S).group(1)
        counts = db_counts(report_db, run)
        assert f'data-k="op_total">{sum(counts.values())}<' in row
        assert f'data-k="native_pass">{counts.get("pass", 0)}<' in row
        # the harness's failing set (console, gate, coverage): unsupported_dtype and xpass included
        failing = sum(n for s, n in counts.items() if s in FAILING)
        assert f'data-k="failing">{failing}<' in row
    assert "<svg" in html and "Trend across builds" in html


def test_latest_finished_run_is_shown(site_dir):
    html = read(site_dir, "2.34.0/index.html")
    assert RUN_C in html and RUN_C_BAD not in html


def test_summary_counts_coverage_and_slowest(site_dir, report_db):
    html = read(site_dir, "2.33.0/index.html")
    for status, n in db_counts(report_db, RUN_B).items():
        assert re.search(rf'<tr data-status="{status}">.*?<td class="n">{n}</td>', html), status
    # coverage from the coverage table: 3 exercised, 2 with failing samples, 1 with fallback
    assert "the run's <code>coverage</code> table" in html
    # over the backend-reachable overloads, as the console's coverage line: 5 listed, 1 composite_implicit
    assert re.search(r'data-k="exercised"><span class="v">3</span><span class="of"> / 4</span>'
                     r'<span class="l">overloads exercised of the backend-reachable \(7 in the catalog\)', html)
    assert re.search(r'href="failing.html" data-k="failing"><span class="v">2</span>', html)
    assert re.search(r'href="fallbacks.html" data-k="fallback"><span class="v">1</span>', html)
    core = re.search(r'<tr data-label="core">(.*?)</tr>', html).group(1)
    assert '<td class="n">4</td><td class="n" data-k="exercised">3</td>' in core
    assert "composite_implicit" in html and "random" in html
    # slowest op first, linked to its page
    slow = html[html.index('id="slowest"'):]
    assert slow.index("nn.functional.conv2d") < slow.index(">add<")
    assert 'href="ops/nn.functional.conv2d.html"' in slow
    # no coverage rows for 2.31.0: figures come from native/fallback lists
    html_a = read(site_dir, "2.31.0/index.html")
    assert "native and fallback overload lists" in html_a
    assert re.search(r'data-k="exercised"><span class="v">4</span>', html_a)
    assert re.search(r'data-k="fallback"><span class="v">2</span>', html_a)


def test_matrix_rows_and_worst_cells(site_dir):
    spec = data_block(read(site_dir, "2.33.0/matrix.html"), "matrix-data")
    keys = [c["key"] for c in spec["columns"]]
    rows = {r[0][1]: r for r in spec["rows"]}
    # OpInfo ops and catalog overloads (coverage rows and overloads reached without coverage)
    assert {"add", "sin", "cumsum", "nn.functional.conv2d", "nn.functional.relu"} <= set(rows)
    assert {"aten::conv2d.default", "aten::bernoulli.p", "aten::relu.default"} <= set(rows)
    conv = rows["nn.functional.conv2d"]
    f32 = conv[keys.index("dtype:float32")]
    assert f32[0] == "crash" and f32[2] == 4 and "timeout 1" in f32[1] and "pass 2" in f32[1]
    assert conv[keys.index("dtype:bfloat16")][0] == "xpass"
    assert conv[keys.index("dtype:int64")] is None
    assert rows["aten::conv2d.default"][keys.index("state")] == "composite_implicit"
    assert set(rows["add"][keys.index("classes")]) == {"functional", "core"}
    assert rows["add"][0][0] == "ops/add.html"
    assert {f["label"] for f in spec["filters"]} >= {"has status", "class", "kind"}


def test_contract_outcomes_aggregate_per_op_and_dtype(report_db, tmp_path):
    """fail beats pass beats n/a, with the count and the first item's detail; an unchecked
    contract is absent; rows of other runs and unreadable JSON are left out."""
    from opdb import queries_contracts as qk
    from opdb.store import now

    db = shutil.copy(report_db, tmp_path / "rep.sqlite")  # it adds a run: the module's sites stay one target's
    with Store.open(db) as st:
        got = {(o.op, o.dtype, o.contract): o for o in qk.contract_outcomes(st, RUN_B)}
        assert set(got) == {("sin", "bfloat16", c) for c in ("metadata", "aliasing", "out")} | {
            ("sin", "float32", "metadata"), ("sin", "float32", "out")}
        alias = got[("sin", "bfloat16", "aliasing")]
        assert (alias.outcome, alias.items, alias.checked) == ("fail", 1, 2) and alias.detail.startswith("output 0")
        assert (got[("sin", "bfloat16", "metadata")].outcome, got[("sin", "bfloat16", "metadata")].items) == ("pass", 2)
        out = got[("sin", "bfloat16", "out")]
        assert (out.outcome, out.items, out.detail) == ("n/a", 2, "no out= variant")
        assert qk.contract_outcomes(st, RUN_A) == []
        assert [o.op for o in qk.contract_outcomes(st, RUN_B, op="add")] == []
        assert qk.matrix_contract_failures(st, RUN_B) == [("sin", "bfloat16", "aliasing", 1)]
        # a row whose contracts column is not a JSON object is left out, not an SQL error
        run = st.start_run(target="cpu", build="junk", torch_version=TV, config={})
        st.insert("op_results", [{"run_id": run, "item_key": "abs|function|float32|0", "op": "abs",
                                  "variant": "function", "dtype": "float32", "sample": 0, "status": "pass",
                                  "contracts": "not json", "recorded_at": now()},
                                 {"run_id": run, "item_key": "abs|function|float32|1", "op": "abs",
                                  "variant": "function", "dtype": "float32", "sample": 1, "status": "pass",
                                  "contracts": '{"out": "fail"}'}])
        assert qk.contract_outcomes(st, run) == []
        rows = [json.loads(r[5]) for r in q.op_sample_stream(st, run)]
        assert [r[q.SAMPLE_COLUMNS.index("contracts")] for r in rows] == [[], []]


def test_contract_names_match_the_harness():
    from conformance.check.contracts import CONTRACTS
    from opdb.queries_contracts import CONTRACTS as STORED

    assert STORED == CONTRACTS


def test_op_page_contract_table_and_sample_column(site_dir):
    html = read(site_dir, "2.33.0/ops/sin.html")
    table = html[html.index('<section id="contracts">'):html.index('<section id="errors">')]
    heads = re.findall(r"<th>([^<]*)</th>", table)
    assert heads == ["op × dtype", "metadata", "aliasing", "out", "sin bfloat16", "sin float32"]
    rows = {dtype: re.findall(r'<td class="contract([^"]*)" title="([^"]*)">([^<]*)</td>', body)
            for dtype, body in re.findall(r'<tr data-dtype="([^"]+)">(.*?)</tr>', table)}
    bf = rows["bfloat16"]
    assert [c[0] for c in bf] == [" ct-pass", " ct-fail", " ct-na"]
    assert bf[1][2] == "fail 1/2" and "1 of 2 items fail; first: output 0 shares storage" in bf[1][1]
    assert "&lt;script&gt;" in bf[1][1] and SCRIPT not in table  # the stored detail is escaped
    assert bf[2][2] == "n/a: no out= variant"
    f32 = rows["float32"]
    assert [c[0] for c in f32] == [" ct-pass", "", " ct-na"]  # aliasing: no float32 item checked it
    assert "no float32 item checked it" in f32[1][1]
    spec = data_block(html, "samples-data")
    keys = [c["key"] for c in spec["columns"]]
    failed = {(r[keys.index("dtype")], r[keys.index("sample")]): r[keys.index("contracts")] for r in spec["rows"]}
    assert failed == {("bfloat16", 0): [], ("bfloat16", 1): ["aliasing"], ("float32", 0): [], ("float32", 1): []}
    assert {"col": keys.index("contracts"), "label": "failed contract", "mode": "has"} in spec["filters"]
    # the failing sample shows its worst element: where, the target's and the CPU's values, the arbiter's
    worst = {(r[keys.index("dtype")], r[keys.index("sample")]): r[keys.index("worst")] for r in spec["rows"]}
    assert worst[("bfloat16", 1)] == "out 0 [1, 2]: target 0.75, CPU 1, float64 0.9999999"
    assert worst[("bfloat16", 0)] is None
    assert spec["columns"][keys.index("worst")]["label"] == "worst element (target, CPU, float64)"
    # an op no contract was checked for has no contract table
    assert 'id="contracts"' not in read(site_dir, "2.33.0/ops/add.html")


def test_matrix_contract_filter_and_tooltip(site_dir):
    spec = data_block(read(site_dir, "2.33.0/matrix.html"), "matrix-data")
    keys = [c["key"] for c in spec["columns"]]
    rows = {r[0][1]: r for r in spec["rows"]}
    assert rows["sin"][keys.index("contracts")] == ["aliasing"]
    assert rows["add"][keys.index("contracts")] == [] and rows["aten::conv2d.default"][keys.index("contracts")] == []
    failing = rows["sin"][keys.index("dtype:bfloat16")]
    assert failing[1].endswith("; failed contracts: aliasing 1") and failing[3] == ["aliasing"]
    assert "contract" not in rows["sin"][keys.index("dtype:float32")][1]
    assert len(rows["sin"][keys.index("dtype:float32")]) == 3  # no failed contract: no list
    filt = next(f for f in spec["filters"] if f["label"] == "fails contract")
    # the filter keeps the rows holding the contract and marks the cells (element 3) that fail it
    assert (filt["col"], filt["mode"], filt["cells"]) == (keys.index("contracts"), "has", 3)
    assert {f["label"]: f["col"] for f in spec["filters"]}["has status"] == keys.index("statuses")


def test_op_page_samples_histogram_and_repro(site_dir, report_db):
    html = read(site_dir, "2.33.0/ops/cumsum.html")
    spec = data_block(html, "samples-data")
    keys = [c["key"] for c in spec["columns"]]
    assert len(spec["rows"]) == 4
    err = next(r for r in spec["rows"] if r[keys.index("status")] == "error")
    assert err[keys.index("error")] == SCRIPT
    assert err[keys.index("tol_source")].startswith("ledger.toml:default[0]")
    con = sqlite3.connect(report_db)
    rid = con.execute("select id from op_results where run_id = ? and status = 'error'", [RUN_B]).fetchone()[0]
    assert err[0] == rid
    assert f"conformance repro {rid} --db {report_db}" in html
    assert spec["db"] == str(report_db)
    fb = next(r for r in spec["rows"] if r[keys.index("status")] == "unsupported_dtype")
    assert fb[keys.index("native_ops")] == ["aten::cumsum.default"]
    assert "<svg" in html and "log10" in html
    conv = read(site_dir, "2.33.0/ops/nn.functional.conv2d.html")
    rows = data_block(conv, "samples-data")["rows"]
    assert any(r[keys.index("checks")] == "shape" for r in rows)


def test_error_text_is_escaped_everywhere(site_dir):
    for f in site_dir.rglob("*.html"):
        text = f.read_text()
        assert "<script>alert" not in text, f
        assert "<b>boom</b>" not in text, f
        # a JSON block can never be closed by data
        for block in re.findall(r'<script type="application/json"[^>]*>(.*?)</script>', text, re.S):
            assert "<" not in block
    assert "&lt;b&gt;boom&lt;/b&gt;" in read(site_dir, "2.33.0/models/mlp.html")


def test_script_json_cannot_break_out():
    out = rhtml.script_json(json.dumps({"e": "</script><script>alert(1)</script>&\u2028"}))
    assert "</" not in out and "&" not in out.replace("\\u0026", "")
    assert json.loads(str(out)) == {"e": "</script><script>alert(1)</script>&\u2028"}


def test_models_page(site_dir, report_db):
    html = read(site_dir, "2.33.0/models.html")
    assert "CPU time" in html and "neuron-emu" in html
    fam = re.search(r'<tr data-family="mlp">(.*?)</tr>', html, re.S).group(1)
    assert '<td class="n">3</td><td class="n">1</td><td class="n">2</td>' in fam  # graphs, passing, failing
    blocking = html[html.index('id="blocking"'):]
    assert re.search(r"aten::gelu.default</code></td><td class=\"n\">2</td>", blocking)
    assert blocking.index("aten::gelu.default") < blocking.index("aten::softmax.int")
    spec = data_block(html, "graphs-data")
    assert len(spec["rows"]) == sum(db_counts(report_db, MODEL_B, "model_results").values())
    page = read(site_dir, "2.33.0/models/mlp.html")
    assert page.count('<article class="graph"') == 3
    assert "loss curve" in page and "<polyline" in page
    assert "<code>[4, 8], [8]</code>" in page and "recompiled" in page
    assert "<dt>compiles</dt><dd>3 (2 recompiles" in page  # mlp-2: compile mode, 1 + 2 shape compiles
    assert "rel err 0.3 at output 0" in page
    # 2.34.0 has no model run
    assert "No model run for this build yet" in read(site_dir, "2.34.0/models.html")


def test_diff_without_gate_decisions_says_so_and_how_to_get_them(site_dir, report_db):
    # the gate never judged 2.31.0 -> 2.33.0: the page decides nothing itself
    html = read(site_dir, "2.33.0/diff.html")
    assert html.count('data-source="no gate decision"') == 2 and 'data-source="gate"' not in html
    assert f"<code>conformance gate --db {report_db} --baseline {RUN_A} --candidate {RUN_B}</code>" in html
    assert f"--baseline {MODEL_A} --candidate {MODEL_B}</code>" in html
    assert "diff-ops-data" not in html and 'data-category="regression"' not in html
    assert 'href="../2.31.0/index.html"' in html


@pytest.fixture(scope="module")
def gated_db(report_db, tmp_path_factory) -> Path:
    """The report DB after the real gate judged 2.31.0 -> 2.33.0 (no re-runs)."""
    from conformance.gate.core import run_gate

    db = tmp_path_factory.mktemp("gated") / "rep.sqlite"
    shutil.copyfile(report_db, db)
    with Store.open(db) as st:
        for b, c in ((RUN_A, RUN_B), (MODEL_A, MODEL_B)):
            assert run_gate(st, b, c, attempts=0).verdict == "fail"
    return db


def test_diff_shows_exactly_what_the_gate_stored(gated_db, tmp_path):
    with Store.open(gated_db) as st:
        render_site(st, tmp_path, builds=["2.33.0"])
        stored = [g for g in q.gate_items(st, RUN_A, RUN_B) if g["kind"] == "op"]
    html = (tmp_path / "2.33.0/diff.html").read_text()
    assert html.count('data-source="gate"') == 2
    rows = data_block(html, "diff-ops-data")["rows"]
    assert sorted((r[0], r[7], r[5], r[6]) for r in rows) == \
        sorted((g["category"], g["item_key"], g["baseline"], g["candidate"]) for g in stored)
    cats = [r[0] for r in rows]
    assert cats == sorted(cats, key=["regression", "improvement", "new"].index)  # worst first
    assert {c: cats.count(c) for c in cats} == {"regression": 7, "improvement": 4, "new": 1}
    assert re.search(r'data-category="regression"><span class="cat cat-regression">regression</span> '
                     r'<span class="v">7</span>', html)
    models = data_block(html, "diff-models-data")
    assert sorted(r[0] for r in models["rows"]) == ["new", "new", "new", "regression"]


def test_diff_reads_gate_items_when_present(site_dir):
    html = read(site_dir, "2.34.0/diff.html")
    assert 'data-source="gate"' in html
    spec = data_block(html, "diff-ops-data")
    assert sorted(r[0] for r in spec["rows"]) == ["flaky", "improvement"]
    flaky = next(r for r in spec["rows"] if r[0] == "flaky")
    assert SCRIPT in flaky[-1]
    # the first build has nothing to compare with
    assert "No earlier build" in read(site_dir, "2.31.0/diff.html")


def test_pagination_splits_large_ops_and_families(report_db, tmp_path, monkeypatch):
    monkeypatch.setattr(op_page, "OP_PART_ROWS", 3)
    monkeypatch.setattr(family_page, "FAMILY_PART_GRAPHS", 2)
    with Store.open(report_db) as st:
        render_site(st, tmp_path, builds=["2.33.0"])
    ops = tmp_path / "2.33.0/ops"
    assert (ops / "add.html").is_file() and (ops / "add.2.html").is_file() and not (ops / "add.3.html").exists()
    first = (ops / "add.html").read_text()
    assert len(data_block(first, "samples-data")["rows"]) == 3
    assert len(data_block((ops / "add.2.html").read_text(), "samples-data")["rows"]) == 3
    assert 'href="add.2.html"' in first and "6 samples" in first
    assert (tmp_path / "2.33.0/models/mlp.2.html").is_file()
    graphs = data_block((tmp_path / "2.33.0/models.html").read_text(), "graphs-data")["rows"]
    assert any(r[0][0].startswith("models/mlp.2.html#g") for r in graphs)
    # only the requested build is rendered, and the index links only to it
    assert not (tmp_path / "2.31.0").exists()
    assert 'href="2.31.0/' not in (tmp_path / "index.html").read_text()
    assert data_block(first, "samples-data")["pageSize"] == rhtml.TABLE_PAGE_SIZE


def test_empty_db_renders_no_data_yet(tmp_path):
    with Store.open(tmp_path / "e.sqlite") as st:
        result = render_site(st, tmp_path / "site")
    assert result.builds == [] and "No runs in this database yet" in (tmp_path / "site/index.html").read_text()


def test_build_without_anything_else(tmp_path):
    """A build with op results but no catalog, models, coverage or gate renders 'no data' sections."""
    with Store.open(tmp_path / "b.sqlite") as st:
        st.insert("runs", [_run("r1", "x/y", "ops", "2026-01-01T00:00:00+00:00")])
        st.insert("op_results", _op_rows("r1", {("add", "float32"): ["pass", "error"]}))
        render_site(st, tmp_path / "site")
    b = tmp_path / "site/x_y"
    assert "No ATen catalog" in (b / "index.html").read_text()
    assert "No model run" in (b / "models.html").read_text()
    assert "No earlier build" in (b / "diff.html").read_text()


def test_slugs_are_unique_on_case_insensitive_disks():
    slug = rhtml.Slugger()
    names = [slug(n) for n in ("T", "t", "a/b", "a_b", "..", "assets")]
    assert len({n.lower() for n in names}) == len(names)
    assert all("/" not in n and not n.startswith(".") for n in names)
    assert slug("T") == names[0]


def test_status_order():
    assert worst(["pass", "skip"]) == "pass"
    assert worst(["pass", "pass_fallback", "mismatch", "error"]) == "error"
    assert worst(["timeout", "crash"]) == "crash"
    assert [severity(s) for s in ("pass", "xfail", "skip", "pass_fallback", "xpass", "unsupported_dtype",
                                  "mismatch", "error", "timeout", "crash")] == [0, 0, 0, 1, 2, 3, 4, 4, 5, 5]
    assert set(SEVERITY) == set(rhtml.STATUSES)


def test_charts_escape_and_bin():
    assert charts.log10_bins([0.0, 1e-3, 2e-3, 0.5, None, float("inf")]) == [
        ("0", 1), ("1e-3", 2), ("1e-2", 0), ("1e-1", 1), ("inf", 1), ("n/a", 1)]
    svg = charts.line_chart([("a<b>", [1.0, None, 3.0])], ["x", "<y>", "z"], title="t&t")
    assert "<b>" not in svg and "&lt;y&gt;" in svg and "t&amp;t" in svg and svg.count("<polyline") == 2
    assert "no data yet" in charts.line_chart([("a", [None])], ["x"], title="t")


# -- the CLI ----------------------------------------------------------------------------------------
def cli(*args: str):
    return CliRunner().invoke(main, ["report", *args])


def test_cli_renders(report_db, tmp_path):
    r = cli("--db", str(report_db), "--out", str(tmp_path / "s"), "--build", "2.33.0")
    assert r.exit_code == 0, r.output
    assert "wrote" in r.output and (tmp_path / "s/2.33.0/index.html").is_file()
    assert "Example:" in main.commands["report"].help


@pytest.mark.parametrize("make", ["missing", "not_sqlite", "directory"])
def test_cli_bad_db_exits_2_with_one_line(tmp_path, make):
    p = tmp_path / "x.sqlite"
    if make == "not_sqlite":
        p.write_text("hello")
    elif make == "directory":
        p.mkdir()
    r = cli("--db", str(p), "--out", str(tmp_path / "s"))
    assert r.exit_code == 2
    lines = r.output.strip().splitlines()
    if make == "directory":  # click's own path check (shared --db option) says it
        assert "is a directory" in lines[-1]
    else:
        assert len(lines) == 1 and lines[0].startswith("error: ") and str(p) in lines[0]
    assert not (tmp_path / "s").exists()


def test_cli_unknown_build_exits_2(report_db, tmp_path):
    r = cli("--db", str(report_db), "--out", str(tmp_path / "s"), "--build", "9.9.9")
    assert r.exit_code == 2
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and "unknown build '9.9.9'" in lines[0] and "2.31.0" in lines[0]


def test_cli_out_is_a_file_exits_2(report_db, tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    r = cli("--db", str(report_db), "--out", str(f))
    assert r.exit_code == 2 and "is a file" in r.output


def test_parallel_render_writes_the_same_site(report_db, tmp_path):
    with Store.open(report_db) as st:
        serial = render_site(st, tmp_path / "a", jobs=1)
        parallel = render_site(st, tmp_path / "b", jobs=2)
    assert (serial.pages, serial.bytes, serial.builds) == (parallel.pages, parallel.bytes, parallel.builds)
    stamp = re.compile(r"Generated [0-9T:+-]+")
    for f in (tmp_path / "a").rglob("*.html"):
        other = tmp_path / "b" / f.relative_to(tmp_path / "a")
        assert stamp.sub("", f.read_text()) == stamp.sub("", other.read_text()), f


def test_diff_rolls_up_by_op_and_caps_items(gated_db, tmp_path, monkeypatch):
    monkeypatch.setattr(diff_page, "DIFF_ROWS", 2)
    with Store.open(gated_db) as st:
        render_site(st, tmp_path, builds=["2.33.0"])
    html = (tmp_path / "2.33.0/diff.html").read_text()
    conv = re.search(r'<tr data-op="nn.functional.conv2d">(.*?)</tr>', html).group(1)
    assert '<td class="n">3</td><td class="n">0</td><td class="n">0</td>' in conv
    assert 'href="ops/nn.functional.conv2d.html"' in conv
    assert "The first 2 of 12 items" in html
    spec = data_block(html, "diff-ops-data")
    assert [r[0] for r in spec["rows"]] == ["regression", "regression"]
    assert re.search(r'<span class="v">7</span>', html)  # counts still cover every item


def test_element_ids_are_unique_per_page(site_dir):
    for f in site_dir.rglob("*.html"):
        ids = re.findall(r'\bid="([^"]+)"', f.read_text())
        assert len(ids) == len(set(ids)), (f, sorted({i for i in ids if ids.count(i) > 1}))
        # tables made by report.js get their id from the spec: it must not collide either
        specs = [json.loads(m)["id"] for m in re.findall(
            r'<script type="application/json" id="[^"]+">(.*?)</script>', f.read_text(), re.S)]
        assert not set(specs) & set(ids), f


def test_cli_jobs(report_db, tmp_path):
    r = cli("--db", str(report_db), "--out", str(tmp_path / "s"), "--jobs", "0")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "s/2.34.0/diff.html").is_file()


def test_mixed_run_gate_items_split_by_kind(tmp_path):
    with Store.open(tmp_path / "m.sqlite") as st:
        st.insert("runs", [{**_run("m1", "1.0", "mixed", "2026-01-01T00:00:00+00:00")},
                           {**_run("m2", "1.1", "mixed", "2026-01-02T00:00:00+00:00")}])
        st.insert("op_results", _op_rows("m1", {("add", "float32"): ["pass"]})
                  + _op_rows("m2", {("add", "float32"): ["mismatch"]}))
        st.insert("model_results", [_model("m1", 0, "mlp", "pass"), _model("m2", 0, "mlp", "pass")])
        st.insert("gate_items", [
            {"baseline_run": "m1", "candidate_run": "m2", "category": "regression", "kind": "op",
             "item_key": "add|function|float32|0", "op": "add", "variant": "function", "dtype": "float32",
             "baseline": "pass", "candidate": "mismatch", "evidence": "{}", "decided_at": "x"}])
        render_site(st, tmp_path / "site")
    html = (tmp_path / "site/1.1/diff.html").read_text()
    assert html.count('data-source="gate"') == 2  # the gate judged the pair: both sections say so
    assert [r[0] for r in data_block(html, "diff-ops-data")["rows"]] == ["regression"]
    models = html[html.index('id="diff-models"'):]
    assert "No differences." in models and "diff-models-data" not in models


def test_the_page_list_drives_rendering(report_db, tmp_path):
    """The renderer writes what the page modules of its list make, and nothing else; the build
    navigation is the list's NAV entries."""
    from reports.pages import index, summary
    from reports.site import SiteRenderer

    with Store.open(report_db) as st:
        result = SiteRenderer(st, tmp_path, db_label="x", pages=[index, summary]).render(["2.33.0"])
    written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.html"))
    assert written == ["2.33.0/index.html", "index.html"] and result.pages == 2
    assert set(result.timings) == {"index", "summary"}
    nav = re.search(r'<nav class="top">(.*?)</nav>', (tmp_path / "2.33.0/index.html").read_text(), re.S).group(1)
    assert re.findall(r">([^<]+)</a>", nav) == ["conformance report", "All builds", "Summary"]


def test_a_page_module_must_make_its_own_context(report_db, tmp_path):
    import types

    from reports.pages import index
    from reports.site import SiteRenderer

    wrong = types.ModuleType("reports.pages.wrong")
    wrong.TEMPLATE, wrong.CONTEXT, wrong.PER_BUILD, wrong.NAV = "index.html", type(None), False, None
    wrong.pages = index.pages
    with Store.open(report_db) as st, pytest.raises(TypeError, match="made a IndexPage, not its NoneType"):
        SiteRenderer(st, tmp_path, db_label="x", pages=[wrong]).render(None)


# -- the models pages say what the model tolerance judges ----------------------------------------
def _models_site(tmp_path: Path) -> Path:
    with Store.open(tmp_path / "models.sqlite") as st:
        st.insert("runs", [_run("mm", "1.0", "models", "2026-01-01T00:00:00+00:00")])
        st.insert("model_results", [
            # a pass whose element-wise relative error is large on near-zero values
            _model("mm", 0, "rnn", "pass", max_rel_err=73.5, fwd_rel_err=0.004, grad_max_rel_err=0.01),
            _model("mm", 1, "rnn", "error", "aten::_thnn_fused_lstm_cell.default", fwd_rel_err=None,
                   max_abs_err=None, max_rel_err=None, grad_max_rel_err=None, p50_ms=None, p99_ms=None,
                   loss_curve=None, shapes=None),
            _model("mm", 2, "rnn", "error", None, fwd_rel_err=None, max_abs_err=None, max_rel_err=None,
                   p50_ms=None, p99_ms=None, loss_curve=None),
            # target and CPU losses identical, at values 3 significant digits cannot tell apart
            _model("mm", 3, "rnn", "pass", fwd_rel_err=0.0, loss_curve={"target": [0.69312, 0.69313, 0.69314],
                                                                          "cpu": [0.69312, 0.69313, 0.69314]}),
        ])
        render_site(st, tmp_path / "site")
    return tmp_path / "site"


def test_models_pages_show_the_normwise_error_the_tolerance_judges(tmp_path):
    site = _models_site(tmp_path)
    html = (site / "1.0/models.html").read_text()
    fam = re.search(r'<tr data-family="rnn">(.*?)</tr>', html, re.S).group(1)
    assert "73.5" not in fam and "0.004" in fam  # worst forward error: normwise, not element-wise
    assert "worst fwd rel err ‖t−c‖/‖c‖" in html
    spec = data_block(html, "graphs-data")
    keys = [c["key"] for c in spec["columns"]]
    assert "fwd_rel_err" in keys and "max_rel_err" not in keys
    assert 73.5 not in [v for row in spec["rows"] for v in row]
    card = (site / "1.0/models/rnn.html").read_text()
    assert "forward rel err ‖t−c‖/‖c‖</dt><dd>0.004</dd>" in card
    assert "element-wise max abs / rel err</dt><dd>1.00e-04 / 73.5</dd>" in card  # kept, labelled as such


def test_models_page_counts_localized_failures(tmp_path):
    html = (_models_site(tmp_path) / "1.0/models.html").read_text()
    blocking = html[html.index('id="blocking"'):html.index('id="graphs"')]
    assert "1 of 2 failing graph results localized to a first divergent op" in blocking
    assert "<code>aten::_thnn_fused_lstm_cell.default</code>" in blocking
    assert "No failing graph names a first divergent op" not in blocking


def test_empty_values_render_as_a_dash_never_a_bare_unit(tmp_path):
    card = (_models_site(tmp_path) / "1.0/models/rnn.html").read_text()
    assert "<dd> / </dd>" not in card and "<dd> /  ms</dd>" not in card and not re.search(r"<dd>\s*/\s*(ms)?</dd>", card)
    assert "latency p50 / p99</dt><dd>—</dd>" in card and "element-wise max abs / rel err</dt><dd>—</dd>" in card
    assert "forward rel err ‖t−c‖/‖c‖</dt><dd>—</dd>" in card


def test_loss_chart_labels_are_distinct_and_the_target_line_shows_over_the_cpu_line(tmp_path):
    card = (_models_site(tmp_path) / "1.0/models/rnn.html").read_text()
    svg = card[card.index('id="g4"'):]
    svg = svg[svg.index("<svg"):svg.index("</svg>")]
    labels = re.findall(r'class="yl">([^<]+)</text>', svg)
    assert len(labels) >= 2 and len(set(labels)) == len(labels), labels
    lines = re.findall(r'<polyline fill="none" stroke="(#[0-9a-f]+)" stroke-width="2"( stroke-dasharray="[^"]+")?', svg)
    assert len(lines) == 2 and not lines[0][1] and lines[1][1]  # the CPU's first, the target's dashed on top
    assert svg.index(">cpu</text>") < svg.index(">target</text>")  # both in the legend
    assert charts.tick_labels([0.69312, 0.69313, 0.69314]) == ["0.69312", "0.69313", "0.69314"]
