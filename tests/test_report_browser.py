"""The report as a user sees it: headless Chromium over file:// pages of a small rendered DB.

Needs the Debian ``chromium`` package (/usr/bin/chromium) and the ``playwright`` Python package
(its own browser downloads are never used). Screenshots land in ``artifacts/screenshots/``.
"""

from __future__ import annotations

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
SHOTS = Path(__file__).resolve().parent.parent / "artifacts" / "screenshots"

if not CHROMIUM.exists():
    pytest.skip(f"{CHROMIUM} is missing (install the Debian package: apt-get install -y chromium)",
                allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright Python package is not installed")

from test_report import RUN_B, SCRIPT, db_counts, make_report_db  # noqa: E402


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    db = make_report_db(tmp_path_factory.mktemp("db") / "rep.sqlite")
    out = tmp_path_factory.mktemp("site")
    with Store.open(db) as st:
        render_site(st, out, db_label=str(db))
    return out, db


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    ctx = browser.new_context(viewport={"width": 1400, "height": 900})
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


def shot(pg, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def url(out: Path, rel: str) -> str:
    return (out / rel).as_uri()


def shown(pg, table: str = ".datatable") -> int:
    return int(pg.locator(f"{table} .dt-info").first.get_attribute("data-shown"))


def test_index_and_summary_numbers(site, page):
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


def test_matrix_filter_sort_and_follow_link(site, page):
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


def test_op_page_shows_error_as_text_and_repro(site, page):
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


def test_models_and_family_pages(site, page):
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


def test_diff_pages(site, page):
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
