"""The report as a user sees it: headless Chromium over file:// pages of a small rendered DB.

Needs the Debian ``chromium`` package (/usr/bin/chromium) and the ``playwright`` Python package
(its own browser downloads are never used). Pages are looked at 1440×900; screenshots are test
artifacts, kept under the session's pytest tmp dir (``<basetemp>/screenshots0/``), never committed.
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest

from opdb import Store
from reports import render_site

pytestmark = pytest.mark.browser

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1440, "height": 900}
DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64",
          "complex64"]  # a full sweep's 11 dtype columns

if not CHROMIUM.exists():
    pytest.skip(f"{CHROMIUM} is missing (install the Debian package: apt-get install -y chromium)",
                allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright Python package is not installed")

from test_report import MODEL_A, MODEL_B, RUN_A, RUN_B, SCRIPT, _op_rows, db_counts, make_report_db  # noqa: E402


def rendered(tmp_path_factory, db: Path, name: str) -> tuple[Path, Path]:
    """The site of ``db`` rendered into a fresh folder ``name``: (the folder, the database)."""
    out = tmp_path_factory.mktemp(name)
    with Store.open(db) as st:
        render_site(st, out, db_label=str(db))
    return out, db


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    db = make_report_db(tmp_path_factory.mktemp("db") / "rep.sqlite")
    out = tmp_path_factory.mktemp("site")
    with Store.open(db) as st:
        render_site(st, out, db_label=str(db))
    return out, db


WIDE = "nn.functional.a_rather_long_operator_name"


@pytest.fixture(scope="module")
def gated_site(tmp_path_factory):
    """The report fixture plus an op swept in all 11 dtypes (half its samples fall back to the CPU)
    and the real gate's decisions for 2.31.0 -> 2.33.0."""
    from conformance.gate.core import run_gate

    db = make_report_db(tmp_path_factory.mktemp("gdb") / "rep.sqlite")
    with Store.open(db) as st:
        rows = _op_rows(RUN_B, {("add", d): ["pass_fallback", "mismatch"] for d in DTYPES})
        for r in rows:
            r.update(op=WIDE, item_key=r["item_key"].replace("add|", WIDE + "|"))
        st.insert("op_results", rows)
        for b, c in ((RUN_A, RUN_B), (MODEL_A, MODEL_B)):
            run_gate(st, b, c, attempts=0)
    out = tmp_path_factory.mktemp("gsite")
    with Store.open(db) as st:
        render_site(st, out, db_label=str(db))
    return out, db


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("screenshots")


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    ctx = browser.new_context(viewport=VIEWPORT)
    pg = ctx.new_page()
    problems: list[str] = []
    pg.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    pg.on("console", lambda m: problems.append(f"console: {m.text}") if m.type == "error" else None)
    pg.on("dialog", lambda d: (problems.append(f"dialog opened: {d.message}"), d.dismiss()))
    pg.on("request", lambda r: problems.append(f"network: {r.url}")
          if not r.url.startswith(("file://", "data:", "about:")) else None)
    yield pg
    ctx.close()
    assert not problems, problems


@pytest.fixture
def shot(shots):
    def take(pg, name: str) -> Path:
        path = shots / f"{name}.png"
        pg.screenshot(path=str(path), full_page=True)
        assert path.stat().st_size > 1000
        return path
    return take


def url(out: Path, rel: str) -> str:
    return (out / rel).as_uri()


def shown(pg, table: str = ".datatable") -> int:
    return int(pg.locator(f"{table} .dt-info").first.get_attribute("data-shown"))


def test_index_and_summary_numbers(site, page, shot):
    out, db = site
    page.goto(url(out, "index.html"))
    assert page.locator("#builds tbody tr").count() == 3
    counts = db_counts(db, RUN_B)
    row = page.locator('tr[data-build="2.33.0"]')
    assert row.locator('[data-k="op_total"]').inner_text() == str(sum(counts.values()))
    assert row.locator('[data-k="native_pass"]').inner_text() == str(counts["pass"])
    assert page.locator("svg.chart").count() == 1
    shot(page, "index")
    row.locator("a").first.click()
    assert page.url.endswith("2.33.0/index.html")
    for status, n in counts.items():
        assert page.locator(f'#statuses tr[data-status="{status}"] td.n').first.inner_text() == str(n)
    assert page.locator('.figure[data-k="exercised"] .v').inner_text() == "3"
    shot(page, "summary")
    page.get_by_role("link", name="Op × dtype matrix").click()
    assert page.url.endswith("2.33.0/matrix.html")


def test_matrix_contract_filter_keeps_rows_and_dims_other_cells(site, page):
    out, _ = site
    page.goto(url(out, "2.33.0/matrix.html"))
    assert page.locator("#matrix td.cell.dim").count() == 0
    page.select_option('select[data-filter="fails contract"]', "aliasing")
    assert page.locator('#matrix tbody td[data-col="op"]').all_inner_texts() == ["sin"]
    row = page.locator("#matrix tbody tr").first
    failing = row.locator('td[data-col="dtype:bfloat16"]')
    assert "dim" not in failing.get_attribute("class") and "failed contracts: aliasing 1" in failing.get_attribute("title")
    assert "dim" in row.locator('td[data-col="dtype:float32"]').get_attribute("class")
    page.select_option('select[data-filter="fails contract"]', "")
    assert page.locator("#matrix td.cell.dim").count() == 0 and shown(page) > 5


def test_op_page_contract_table_and_failed_contract_filter(site, page):
    out, _ = site
    page.goto(url(out, "2.33.0/ops/sin.html"))
    assert page.locator("#contracts td.contract.ct-fail").all_inner_texts() == ["fail 1/2"]
    page.select_option('select[data-filter="failed contract"]', "aliasing")
    assert shown(page, "#samples .datatable") == 1


def test_matrix_filter_sort_and_follow_link(site, page, shot):
    out, db = site
    page.goto(url(out, "2.33.0/matrix.html"))
    total = shown(page)
    assert total == page.locator("#matrix tbody tr").count() > 5
    # cell colour is the worst status, counts in the tooltip
    conv = page.locator("#matrix tbody tr", has=page.get_by_role("link", name="nn.functional.conv2d", exact=True))
    cell = conv.locator('td[data-col="dtype:float32"]')
    assert cell.get_attribute("data-status") == "crash"
    assert "timeout 1" in cell.get_attribute("title") and cell.inner_text() == "4"
    shot(page, "matrix")
    # text filter
    page.fill(".dt-filter", "conv2d")
    assert shown(page) == 2  # the OpInfo op and aten::conv2d.default
    page.fill(".dt-filter", "")
    # status filter: rows holding an error sample
    page.select_option('select[data-filter="has status"]', "error")
    names = page.locator('#matrix tbody td[data-col="op"]').all_inner_texts()
    assert "cumsum" in names and "add" not in names
    page.select_option('select[data-filter="has status"]', "")
    # class filter
    page.select_option('select[data-filter="class"]', "random")
    assert page.locator('#matrix tbody td[data-col="op"]').all_inner_texts() == ["aten::bernoulli.p"]
    page.select_option('select[data-filter="class"]', "")
    # sort by samples, descending on second click
    page.click('#matrix th[data-col="samples"]')
    page.click('#matrix th[data-col="samples"]')
    samples = [int(x.replace(",", "") or 0) for x in page.locator('#matrix tbody td[data-col="samples"]').all_inner_texts()]
    assert samples == sorted(samples, reverse=True)
    assert samples[0] == sqlite3.connect(db).execute(
        "select max(n) from (select count(*) n from op_results where run_id = ? group by op)", [RUN_B]).fetchone()[0]
    # sort by worst status: crash first when descending
    page.click('#matrix th[data-col="worst"]')
    page.click('#matrix th[data-col="worst"]')
    assert page.locator('#matrix tbody td[data-col="worst"]').first.inner_text() == "crash"
    shot(page, "matrix-sorted")
    page.get_by_role("link", name="cumsum", exact=True).click()
    assert page.url.endswith("2.33.0/ops/cumsum.html")


def test_op_page_shows_error_as_text_and_repro(site, page, shot):
    out, db = site
    page.goto(url(out, "2.33.0/ops/cumsum.html"))
    assert page.locator("#samples-data").count() == 1
    assert page.locator("#samples tbody tr").count() == 4
    err = page.locator('#samples td[data-col="error"]', has_text="alert")
    assert err.inner_text() == SCRIPT  # shown as text, not run (the fixture fails on any dialog)
    rid = sqlite3.connect(db).execute(
        "select id from op_results where run_id = ? and op = 'cumsum' and status = 'error'", [RUN_B]).fetchone()[0]
    assert f"conformance repro {rid} --db {db}" in page.locator("pre.repros").inner_text()
    row = page.locator("#samples tbody tr", has=page.locator('td[data-col="status"]', has_text="error"))
    assert row.locator('td[data-col="repro"]').inner_text() == f"conformance repro {rid} --db {db}"
    assert "ledger.toml:default[0]" in row.locator('td[data-col="tol_source"]').inner_text()
    assert page.locator("#errors svg rect.bar").count() >= 1
    page.select_option('#samples select[data-filter="status"]', "unsupported_dtype")
    assert shown(page) == 2
    shot(page, "op-cumsum")


def test_models_and_family_pages(site, page, shot):
    out, _ = site
    page.goto(url(out, "2.33.0/models.html"))
    assert "CPU time" in page.locator(".latency-note").inner_text()
    first = page.locator("#blocking tbody tr").first
    assert "aten::gelu.default" in first.inner_text() and first.locator("td.n").first.inner_text() == "2"
    assert shown(page, "#graphs") == 5
    page.select_option('#graphs select[data-filter="status"]', "mismatch")
    assert shown(page, "#graphs") == 2
    shot(page, "models")
    page.get_by_role("link", name="mlp", exact=True).click()
    assert page.url.endswith("models/mlp.html")
    assert page.locator("article.graph").count() == 3
    assert page.locator("article.graph svg polyline").count() >= 2
    assert page.get_by_text("<b>boom</b>").count() == 1
    shot(page, "family-mlp")


def test_model_support_page_filters_searches_and_names_what_broke(site, page, shot):
    out, _ = site
    page.goto(url(out, "2.33.0/support.html"))
    lib = page.locator('#libraries tr[data-library="harness"]')
    assert lib.locator("td.n").first.inner_text() == "5"
    assert "mismatch 2" in lib.inner_text() and "blocked 1" in lib.inner_text()
    # 2.31.0 -> 2.33.0: mlp-1 was ready and now mismatches at gelu; mlp-0 still ready
    assert "1 model broke in this build" in page.locator("#changes .support-changes").inner_text()
    row = page.locator("#changes tbody tr")
    assert row.count() == 1 and "mlp-1" in row.inner_text() and "aten::gelu.default" in row.inner_text()
    assert shown(page, "#models") == 5
    page.select_option('#models select[data-filter="support"]', "mismatch")
    assert shown(page, "#models") == 2
    page.select_option('#models select[data-filter="support"]', "")
    page.locator("#models input.dt-filter").fill("attention")
    assert shown(page, "#models") == 2
    shot(page, "support")
    page.get_by_role("link", name="attention-4", exact=True).click()
    assert re.search(r"models/attention\.html#g\d+$", page.url)


def test_diff_pages(site, page, shot):
    out, _ = site
    page.goto(url(out, "2.33.0/diff.html"))
    # the gate never judged 2.31.0 -> 2.33.0: the page says so and how, and shows no items of its own
    source = page.locator("#diff-ops .source").inner_text()
    assert "No gate decision stored" in source and "conformance gate --db" in source
    assert page.locator("#diff-ops .datatable").count() == 0
    shot(page, "diff-no-gate")
    page.goto(url(out, "2.34.0/diff.html"))
    assert "gate's decisions" in page.locator("#diff-ops .source").inner_text()
    assert page.locator("#diff-ops-items tbody tr").count() == 2
    page.select_option('#diff-ops select[data-filter="category"]', "flaky")
    assert shown(page, "#diff-ops") == 1
    assert page.locator('#diff-ops-items td[data-col="evidence"]', has_text="<script>").count() == 1
    shot(page, "diff-gate")
    page.get_by_role("link", name="2.33.0").first.click()
    assert re.search(r"2\.33\.0/index\.html$", page.url)


# -- the three questions at 1440×900: what falls back, what regressed, the numbers behind a failure
def test_index_links_gate_verdict_and_counts_to_their_lists(gated_site, page, shot):
    from opdb.queries_counts import failing_overloads, fallback_overloads, gate_counts

    out, db = gated_site
    with Store.open(db) as st:
        fallback, failing = fallback_overloads(st, RUN_B, MODEL_B), failing_overloads(st, RUN_B, MODEL_B)
        regressions = gate_counts(st, RUN_A, RUN_B).of("regression") + gate_counts(st, MODEL_A, MODEL_B).of(
            "regression")
    assert fallback and failing and regressions
    page.goto(url(out, "index.html"))
    row = page.locator('tr[data-build="2.33.0"]')
    assert row.locator('[data-k="gate"] a').inner_text() == "FAIL"
    assert "not judged" in page.locator('tr[data-build="2.34.0"] [data-k="gate"]').inner_text()
    assert "first build" in page.locator('tr[data-build="2.31.0"] [data-k="gate"]').inner_text()
    shot(page, "index-1440")
    for key, n, target, table in (("regressions", regressions, "regressions.html", None),
                                  ("fallback_overloads", len(fallback), "fallbacks.html", "#fallback-overloads"),
                                  ("failing_overloads", len(failing), "failing.html", "#failing-overloads")):
        page.goto(url(out, "index.html"))
        link = page.locator(f'tr[data-build="2.33.0"] [data-k="{key}"] a')
        assert link.inner_text() == str(n), key
        link.click()
        assert page.url.endswith(f"2.33.0/{target}"), page.url
        if table:
            assert shown(page) == n  # the list holds exactly the overloads counted
    # the regressions page: the largest group first, each with its repro command
    page.goto(url(out, "2.33.0/regressions.html"))
    items = [int(x) for x in page.locator("#regression-groups [data-k=items]").all_inner_texts()]
    assert sum(items) == regressions and items == sorted(items, reverse=True)
    first = page.locator("#regression-groups tbody tr").first
    assert first.locator("td").nth(4).inner_text() == str(items[0]) and "conformance repro" in first.inner_text()
    shot(page, "regressions-1440")


def test_summary_cards_link_to_their_lists(gated_site, page, shot):
    out, _ = gated_site
    page.goto(url(out, "2.33.0/index.html"))
    shot(page, "summary-1440")
    for key, target in (("fallback", "fallbacks.html"), ("failing", "failing.html"),
                        ("regressions", "regressions.html"), ("exercised", "matrix.html")):
        page.goto(url(out, "2.33.0/index.html"))
        card = page.locator(f'a.figure[data-k="{key}"]')
        n = int(card.locator(".v").inner_text().replace(",", ""))
        card.click()
        assert page.url.endswith(f"2.33.0/{target}"), (key, page.url)
        if key in ("fallback", "failing"):
            assert shown(page) == n
            # ranked: the overload most model graphs reach first, then by samples
            ranks = [(int(g.replace(",", "") or 0), int(s.replace(",", "") or 0)) for g, s in zip(
                page.locator('td[data-col="graphs"]').all_inner_texts(),
                page.locator('td[data-col="samples"]').all_inner_texts(), strict=True)]
            assert ranks == sorted(ranks, reverse=True)
    page.goto(url(out, "2.33.0/fallbacks.html"))
    shot(page, "fallbacks-1440")


def test_matrix_fits_every_dtype_and_keeps_the_op_column(gated_site, page, shot):
    out, _ = gated_site
    page.goto(url(out, "2.33.0/matrix.html"))
    heads = page.locator('#matrix th[data-col^="dtype:"]')
    assert heads.count() == len(DTYPES)
    wrap = page.locator(".dt-wrap").first
    box = wrap.bounding_box()
    assert box["x"] + box["width"] <= VIEWPORT["width"]
    for i in range(heads.count()):  # every dtype column is in view without scrolling right
        h = heads.nth(i).bounding_box()
        assert h["x"] + h["width"] <= box["x"] + box["width"], heads.nth(i).get_attribute("data-col")
    assert wrap.evaluate("e => e.scrollWidth <= e.clientWidth")
    shot(page, "matrix-1440")
    # the op column stays when the table scrolls right (a narrower window)
    page.set_viewport_size({"width": 640, "height": 900})
    assert wrap.evaluate("e => e.scrollWidth > e.clientWidth")
    op = page.locator('#matrix tbody td[data-col="op"]').first
    cell = page.locator('#matrix tbody tr').first.locator("td.cell").last
    before_op, before_cell = op.bounding_box()["x"], cell.bounding_box()["x"]
    wrap.evaluate("e => { e.scrollLeft = 400; }")
    page.wait_for_function("document.querySelector('.dt-wrap').scrollLeft > 0")
    assert op.bounding_box()["x"] == before_op and cell.bounding_box()["x"] < before_cell
    shot(page, "matrix-scrolled")
    # ATen rows are links: an overload of the fallback list opens the list, filtered to it
    page.set_viewport_size(VIEWPORT)
    page.select_option('select[data-filter="overload"]', "fallback")
    link = page.locator('#matrix tbody td[data-col="op"] a').first
    name = link.inner_text()
    assert name.startswith("aten::")
    link.click()
    assert page.url.endswith(f"2.33.0/fallbacks.html#{name}")
    assert shown(page) == 1 and page.locator('td[data-col="overload"]').inner_text() == name


def test_op_page_lists_failing_samples_first_with_their_repro(gated_site, page, shot):
    out, db = gated_site
    page.goto(url(out, f"2.33.0/ops/{WIDE}.html"))
    statuses = page.locator('#samples tbody td[data-col="status"]').all_inner_texts()
    n_failing = sum(s == "mismatch" for s in statuses)
    assert n_failing == len(DTYPES) and statuses[:n_failing] == ["mismatch"] * n_failing
    first = page.locator("#samples tbody tr").first
    cols = first.locator("td").evaluate_all("tds => tds.map(t => t.getAttribute('data-col'))")
    assert cols[cols.index("status") + 1] == "repro"  # the command beside the status it reproduces
    rid = int(first.locator('td[data-col="id"]').inner_text().replace(",", ""))
    assert first.locator('td[data-col="repro"]').inner_text() == f"conformance repro {rid} --db {db}"
    assert page.locator("#samples tbody tr").nth(n_failing).locator('td[data-col="repro"]').inner_text() == ""
    shot(page, "op-failing-first-1440")
    # the same op in the other builds
    page.goto(url(out, "2.33.0/ops/cumsum.html"))
    assert page.locator("#other-builds a").all_inner_texts() == ["2.31.0", "2.34.0"]
    page.locator("#other-builds a", has_text="2.34.0").click()
    assert page.url.endswith("2.34.0/ops/cumsum.html")


@pytest.fixture(scope="module")
def backends_site(tmp_path_factory):
    from test_report_backends import make_backends_db

    db = make_backends_db(tmp_path_factory.mktemp("bdb") / "backends.sqlite")
    return rendered(tmp_path_factory, db, "bsite")


def test_cross_backend_page_matrix_and_fails_only_on(backends_site, page, shot):
    out, _ = backends_site
    page.goto(url(out, "index.html"))
    page.locator("#cross-backend a").click()
    assert page.url.endswith("/backends.html")
    # the matrix: a row per op x dtype, a cell per backend with its counts, coloured by the worst status
    assert shown(page) == 6
    heads = page.locator("#backends-matrix thead th").all_inner_texts()
    assert [h.strip() for h in heads][:5] == ["op", "dtype", "neuron-emu", "cpu", "inductor"]
    page.select_option('select[data-filter="dtype"]', "bfloat16")
    assert shown(page) == 3
    row = page.locator("#backends-matrix tbody tr", has=page.locator('td[data-col="op"]', has_text="cumsum"))
    emu = row.locator('td[data-col="backend:neuron-emu"]')
    assert emu.get_attribute("data-status") == "mismatch" and emu.inner_text() == "1 pass · 1 fail"
    assert row.locator('td[data-col="backend:cpu"]').inner_text() == "2 pass"
    shot(page, "backends-bfloat16-1440")
    # a cell links to the op page of that backend's build, which links the op on the other targets
    emu.locator("a").click()
    assert page.url.endswith("/2.33.0/ops/cumsum.html")
    assert page.locator("#other-targets a").all_inner_texts() == ["cpu", "inductor", "across backends"]
    page.go_back()
    page.select_option('select[data-filter="fails only on"]', "inductor")
    assert page.locator('#backends-matrix tbody td[data-col="op"]').all_inner_texts() == ["cumsum"]
    assert page.locator('#backends-matrix tbody td[data-col="dtype"]').all_inner_texts() == ["float32"]
    page.select_option('select[data-filter="fails only on"]', "")
    assert shown(page) == 6
    shot(page, "backends-1440")
    # "fails only on neuron-emu": its one entry links to neuron-emu's op page
    section = page.locator('section.only[data-target="neuron-emu"]')
    assert section.locator("tbody tr").count() == 1
    link = section.locator("tbody tr a")
    assert link.inner_text() == "cumsum"
    assert section.locator("tbody tr td").nth(1).inner_text() == "bfloat16"
    link.click()
    assert page.url.endswith("/2.33.0/ops/cumsum.html")
    assert page.locator("h1").inner_text().startswith("cumsum")
    assert "mismatch" in page.locator("#op-status").inner_text()


def test_top_causes_page_filters_to_a_cause_and_op_pages_link_theirs(gated_site, page, shot):
    out, db = gated_site
    page.goto(url(out, "2.33.0/causes.html"))
    n = int(page.locator('[data-k="causes"]').inner_text().replace(",", ""))
    assert n >= 1 and shown(page) == n
    key = page.locator("ol.causes li a").first.inner_text()
    page.locator("ol.causes li a").first.click()
    page.wait_for_function("() => document.querySelectorAll('tbody tr').length === 1")
    assert shown(page) == 1 and page.locator('tbody td[data-col="key"]').inner_text() == key
    shot(page, "causes-one-1440")
    # a failing sample's cause links to its row on the causes page
    page.goto(url(out, f"2.33.0/ops/{WIDE}.html"))
    link = page.locator('#samples tbody td[data-col="cause"] a').first
    cause = link.inner_text()
    assert cause.startswith("C") and len(cause) == 11
    link.click()
    page.wait_for_url(re.compile(r".*/2\.33\.0/causes\.html#C[0-9a-f]{10}$"))
    assert shown(page) == 1 and page.locator('tbody td[data-col="key"]').inner_text() == cause
    assert f"{WIDE}" in page.locator('tbody td[data-col="ops"]').inner_text()


@pytest.fixture(scope="module")
def perf_site(tmp_path_factory):
    """The report fixture plus perf runs: 2.31.0 against itself (A/A), 2.33.0 against 2.31.0 with
    two confirmed regressions (an op and a model graph), an improvement, an unconfirmed call and an
    item the candidate cannot run."""
    from opdb import perf as perfdb

    db = make_report_db(tmp_path_factory.mktemp("pdb") / "rep.sqlite")

    def row(run, subject, shape, ratio, verdict, kind="op", **kw):
        return {"run_id": run, "item_key": f"{kind}|{subject}|float32|{shape}", "kind": kind, "subject": subject,
                "dtype": "float32", "shape": shape, "signature": "f32[5,5]", "status": "ok", "p50": 1e-5 * ratio,
                "p99": 2e-5 * ratio, "base_p50": 1e-5, "base_p99": 2e-5, "ratio": ratio, "low": ratio * 0.95,
                "high": ratio * 1.05, "verdict": verdict, "confirmed": None if verdict == "same" else 1,
                "rounds": 10, "reps": 50, **kw}

    with Store.open(db) as st:
        for rid, build, base, rows in (
                ("p-aa", "2.31.0", "2.31.0", [row("p-aa", "mm", "small", 1.0, "same"),
                                              row("p-aa", "mlp.a", "v0", 1.0, "same", kind="model")]),
                ("p-33", "2.33.0", "2.31.0", [row("p-33", "mm", "small", 1.31, "regression"),
                                              row("p-33", "mlp.a", "v0", 1.8, "regression", kind="model"),
                                              row("p-33", "exp", "large", 0.5, "improvement"),
                                              row("p-33", "abs", "small", 1.25, "same", confirmed=0),
                                              row("p-33", "sin", "small", 1.0, "same"),
                                              {"run_id": "p-33", "item_key": "op|neg|float32|small", "kind": "op",
                                               "subject": "neg", "dtype": "float32", "shape": "small",
                                               "status": "error", "error": "RuntimeError: boom"}])):
            perfdb.start(st, {"id": rid, "target": "neuron-emu", "build": build, "baseline_build": base,
                              "config": json.dumps({"confidence": 0.95}),
                              "machine": json.dumps({"start": {"cpu": "test cpu", "cores": 2, "load": 0.5}})})
            perfdb.record(st, rows)
            perfdb.finish(st, rid, "finished")
    return rendered(tmp_path_factory, db, "psite")


def test_perf_page_regressions_charts_and_filters(perf_site, page, shot):
    out, _ = perf_site
    page.goto(url(out, "2.33.0/index.html"))
    page.get_by_role("link", name="Perf", exact=True).click()
    assert page.url.endswith("2.33.0/perf.html")
    assert page.locator('[data-k="regressions"]').inner_text() == "2"
    first = page.locator("#regressions .perf-finding").first
    assert first.get_attribute("data-item") == "model mlp.a float32 v0"  # the largest change first
    assert first.locator(".first-bad").inner_text() == "2.33.0"
    assert first.locator("svg").count() == 1  # p50 per build: 2.31.0 and 2.33.0
    assert page.locator('[data-k="improvements"]').inner_text() == "1"
    assert page.locator('[data-verdict="error"]').inner_text() == "1"
    shot(page, "perf-1440")
    items = page.locator("#items")
    assert shown(page, "#items .datatable") == 6
    items.locator('select[data-filter="verdict"]').select_option("regression")
    assert shown(page, "#items .datatable") == 2
    assert sorted(items.locator('tbody td[data-col="subject"]').all_inner_texts()) == ["mlp.a", "mm"]
    # a build without a perf run says how to make one
    page.goto(url(out, "2.34.0/perf.html"))
    assert "conformance perf --db" in page.locator("p.empty").inner_text()


@pytest.fixture(scope="module")
def dist_site(tmp_path_factory):
    """The report fixture plus a dist run of 2.33.0: every collective passes but a bfloat16
    all-reduce at world size 3 (a wrong value on rank 2) and a hung all-to-all at world size 2."""
    from opdb import dist as distdb

    db = make_report_db(tmp_path_factory.mktemp("ddb") / "rep.sqlite")
    rows = []
    for coll, op in (("all_reduce", "sum"), ("all_reduce", "max"), ("broadcast", ""), ("all_to_all_single", "")):
        for dtype in ("float32", "bfloat16"):
            for ws in (2, 3):
                for shape in ("vector", "matrix"):
                    status, error, ev = "pass", None, {}
                    if coll == "all_reduce" and op == "sum" and dtype == "bfloat16" and ws == 3:
                        status, error = "mismatch", "rank 2: 3 of 7 elements wrong"
                        ev = {"rank": 2, "error_eps": 12.5}
                    if coll == "all_to_all_single" and ws == 2 and shape == "matrix":
                        status, error = "timeout", "ranks 1 of 2 did not finish within 30 s"
                    rows.append({"run_id": "d-33", "item_key": f"{coll}|{op or '-'}|{dtype}|{ws}|{shape}",
                                 "collective": coll, "reduce_op": op, "dtype": dtype, "world_size": ws,
                                 "shape": shape, "status": status, "error": error, "evidence": json.dumps(ev)})
    with Store.open(db) as st:
        distdb.start(st, {"id": "d-33", "target": "neuron-emu", "build": "2.33.0", "backend": "neuron",
                          "config": "{}"})
        distdb.record(st, rows)
        distdb.finish(st, "d-33", "finished")
    return rendered(tmp_path_factory, db, "dsite")


def test_dist_page_matrix_and_failing_items(dist_site, page, shot):
    out, _ = dist_site
    page.goto(url(out, "2.33.0/index.html"))
    page.get_by_role("link", name="Distributed", exact=True).click()
    assert page.url.endswith("2.33.0/dist.html")
    row = page.locator('tr[data-collective="all_reduce (sum)"]')
    assert row.locator('td[data-status="mismatch"]').count() == 1  # bfloat16 at world size 3 only
    assert "matrix: mismatch" in row.locator('td[data-status="mismatch"]').get_attribute("title")
    assert page.locator('tr[data-collective="all_to_all_single"] td[data-status="timeout"]').count() == 2
    assert page.locator('tr[data-collective="broadcast"] td[data-status="pass"]').count() == 4
    shot(page, "dist-1440")
    assert shown(page, "#failing .datatable") == 4
    page.locator('#failing select[data-filter="status"]').select_option("mismatch")
    assert shown(page, "#failing .datatable") == 2
    assert set(page.locator('#failing tbody td[data-col="rank"]').all_inner_texts()) == {"2"}


@pytest.fixture(scope="module")
def serving_site(tmp_path_factory):
    """The report fixture plus generation rows in the op runs of 2.31.0 and 2.33.0 (as a run with
    both --ops and --generate stores them): the builds of tests/test_report_serving.py."""
    from test_report_serving import AFTER, BEFORE

    db = make_report_db(tmp_path_factory.mktemp("sdb") / "rep.sqlite")
    with Store.open(db) as st:
        st.insert("gen_results", [{**r, "run_id": RUN_A} for r in BEFORE] + [{**r, "run_id": RUN_B} for r in AFTER])
    return rendered(tmp_path_factory, db, "ssite")


def test_serving_page_summary_diff_matrix_and_items(serving_site, page, shot):
    out, _ = serving_site
    page.goto(url(out, "2.33.0/index.html"))
    page.get_by_role("link", name="Serving", exact=True).click()
    assert page.url.endswith("2.33.0/serving.html")
    assert page.locator('#summary [data-k="near_tie"]').inner_text() == "2"  # counted, never hidden
    assert page.locator('#summary [data-status="mismatch"]').inner_text() == "1"
    # what got worse since 2.31.0: exactly the three items, filterable by why
    assert "3 items got worse" in page.locator("#changes .serving-changes").inner_text()
    assert shown(page, "#changes") == 3
    page.locator('#changes select[data-filter="what got worse"]').select_option("status")
    assert shown(page, "#changes") == 2
    page.locator('#changes select[data-filter="what got worse"]').select_option("")
    # the float32 eager matrix: a cell per bucket, coloured by status, every figure in its tooltip
    m = page.locator("#m-float32-eager")
    bad = m.locator('td.cell[data-status="mismatch"]')
    assert bad.count() == 1 and bad.inner_text() == "75% · 1 wide"
    assert "CPU margin 0.9 vs near-tie bound 0.02" in bad.get_attribute("title")
    assert bad.evaluate("e => getComputedStyle(e).backgroundColor") != "rgba(0, 0, 0, 0)"
    m.locator('select[data-filter="has status"]').select_option("error")
    assert shown(page, "#m-float32-eager") == 1
    m.locator('select[data-filter="has status"]').select_option("")
    shot(page, "serving-1440")
    # a cell's click shows its item in the items table
    bad.locator("a").click()
    page.wait_for_function("document.querySelector('#items .dt-info').getAttribute('data-shown') === '1'")
    assert page.locator('#items tbody td[data-col="first_divergent_op"]').inner_text() == "aten::mm"
    page.locator("#items input.dt-filter").fill("")
    page.locator("#items input.dt-filter").dispatch_event("input")
    assert shown(page, "#items") == 9
    page.locator('#items select[data-filter="status"]').select_option("pass_fallback")
    assert page.locator('#items tbody td[data-col="fallback_ops"]').inner_text() == "aten::cumsum.default"
    # a build without a generation run says how to make one
    page.goto(url(out, "2.34.0/serving.html"))
    assert "--generate hf" in page.locator("p.empty").inner_text()
