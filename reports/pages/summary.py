"""``<build>/index.html``: coverage by class and dtype, status counts, slowest ops, the trend."""

from __future__ import annotations

from collections.abc import Iterator

from opdb import queries_counts as qc
from opdb import queries_report as q

from ..contexts import CountRow, Link, SlowOp, SummaryPage
from ..scope import BuildScope

TEMPLATE = "summary.html"
CONTEXT = SummaryPage
PER_BUILD = True
NAV = ("index.html", "Summary")


def pages(b: BuildScope) -> Iterator[tuple[str, SummaryPage]]:
    info, store = b.info, b.store
    run = info.op_run
    by_class: list[CountRow] = []
    by_dtype: list[CountRow] = []
    states: list[tuple[str, int]] = []
    coverage_all = None
    source = ""
    catalog_total = q.catalog_total(store, info.torch_version) if info.torch_version else 0
    slowest: list[SlowOp] = []
    reachable = 0
    if run:
        rid = run["id"]
        if q.coverage_count(store, rid):
            source = "coverage"
            t = q.coverage_totals(store, rid)
            share = qc.coverage_share(store, rid)
            reachable = share["reachable"]
            coverage_all = CountRow("all overloads", share["exercised"], t["native"],
                                    len(b.overloads("fallback")), len(b.overloads("failing")), reachable)
            by_class = [CountRow(r["class"], r["exercised"] or 0, r["native"] or 0, r["fallback"] or 0,
                                 r["failing"] or 0, r["total"])
                        for r in q.coverage_by_class(store, rid, info.torch_version)]
            states = list(q.coverage_states(store, rid).items())
        elif info.op_total:
            source = "op_results"
            reached = b.reached().totals(catalog_total or None)
            coverage_all = CountRow(reached.label, reached.exercised, reached.native, len(b.overloads("fallback")),
                                    len(b.overloads("failing")), reached.total)
            if catalog_total:
                by_class = b.reached().by_class(b.classes("overload"))
        if info.op_total:
            by_dtype = b.reached().by_dtype()
            slowest = [SlowOp(r["op"], f"ops/{b.op_slug(r['op'])}.html", r["samples"],
                              r["total_s"] or 0.0, r["max_s"] or 0.0)
                       for r in q.slowest_ops(store, rid)]
    prev = b.previous()
    links = [Link("matrix.html", "Op × dtype matrix"), Link("fallbacks.html", "Overloads that fall back to the CPU"),
             Link("failing.html", "Overloads failing samples reach"),
             Link("regressions.html", "Regressions against the previous build"), Link("models.html", "Models"),
             Link("diff.html", "Diff against the previous build"), Link("../index.html", "All builds")]
    yield f"{info.slug}/index.html", SummaryPage(
        **b.base(f"Build {info.build}", "../", "index.html"), info=info,
        coverage_source=source, coverage_all=coverage_all, catalog_total=catalog_total, reachable=reachable,
        by_class=by_class, by_dtype=by_dtype, states=states, slowest=slowest,
        trend_svg=b.site.trend_svg(highlight=info.build),
        prev=Link(f"../{prev.slug}/index.html", prev.build) if prev and prev.rendered else None,
        links=links, traced_calls=q.traced_share(store, run["id"]) if run else (0, 0))
