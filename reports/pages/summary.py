"""``<build>/index.html``: coverage by class and dtype, status counts, slowest ops, the trend."""

from __future__ import annotations

from collections.abc import Iterator

from opdb import queries_counts as qc
from opdb import queries_customops as qo
from opdb import queries_report as q

from ..contexts import CountRow, CustomOpCell, CustomOpRow, Link, SlowOp, SummaryPage
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
        links=links, traced_calls=q.traced_share(store, run["id"]) if run else (0, 0),
        custom_checks=list(CUSTOM_CHECKS.values()), custom_ops=_custom_ops(b, run["id"]) if run else [],
        backend_share=qc.backend_share(store, [run["id"]]).get(run["id"]) if run else None)


#: The custom-op lane's checks, as the build page heads them.
CUSTOM_CHECKS = {"opcheck": "opcheck", "custom_fwd": "eager forward", "custom_bwd": "eager backward",
                 "custom_compile": "compiled"}


def _custom_ops(b: BuildScope, run_id: str) -> list[CustomOpRow]:
    """A row per custom op x dtype of the run's custom-op lane, a cell per check."""
    by: dict[tuple[str, str], dict[str, qo.CustomOpCheck]] = {}
    for c in qo.custom_op_checks(b.store, run_id):
        by.setdefault((c.op, c.dtype), {})[c.variant] = c
    rows = []
    for (op, dtype), checks in by.items():
        structural = set(checks) == {"opcheck"}
        cells = []
        for variant, label in CUSTOM_CHECKS.items():
            c = checks.get(variant)
            if c is None:
                why = " (no reference is declared for this op)" if structural else ""
                cells.append(CustomOpCell("", "", f"{label}: no item{why}"))
                continue
            failed = f" {', '.join(c.failed_checks)}" if c.failed_checks else ""
            first = f"; first: {' '.join(c.error.split())[:300]}" if c.error else ""
            cells.append(CustomOpCell(c.status, f"{c.status}{failed}",
                                      f"{label}: {c.items} items, {c.failing} failing{first}"))
        rows.append(CustomOpRow(op, f"ops/{b.op_slug(op)}.html", dtype, cells, structural))
    return rows
