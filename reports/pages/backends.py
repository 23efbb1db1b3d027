"""``backends.html``: every target of the database side by side, written when there are two or more.

Each target is shown by its latest rendered build with an op run (a column). The matrix holds one
row per OpInfo op × dtype and one cell per backend: its pass and fail counts
(:func:`opdb.queries_report.matrix_cells`, the numbers of that build's own matrix), coloured by
the worst status, linking to the op's page in that build. "Fails only on X" lists, per backend,
the op × dtype groups whose samples fail there and pass on every other backend holding the same
seeded sample (:func:`opdb.queries_report.fails_only_on`): the findings that are that backend's,
each marked with what the backend's upstream project expects of it when the caller gave the
site those lists (``Site.upstream``: listed already, or new to them). A compiler target's column
says how many of its run's items its backend ran none of (:func:`opdb.queries_counts.backend_share`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from opdb import queries_counts as qc
from opdb import queries_report as q
from opdb.status import FAILING, PASSED, ordered, worst

from ..contexts import Backend, BackendsPage, BuildInfo, Link, OnlyRow, OnlySection
from ..html import Slugger, dumps, table_spec
from ..scope import BACKENDS_PAGE, Site

TEMPLATE = "backends.html"
CONTEXT = BackendsPage
PER_BUILD = False  # once per site
NAV = None  # linked from the index and each build's navigation when the site has two targets
ONLY_ROWS = 200  # op × dtype groups listed per backend (the matrix filter has them all)


def columns(site: Site) -> list[BuildInfo]:
    """Per target (in the order their first build started), its latest rendered build with an op run."""
    latest: dict[str, BuildInfo] = {}
    for info in site.rendered:
        if info.op_run:
            latest[info.target] = info
    return [latest[t] for t in site.targets if t in latest]


def _text(cnt: Counter) -> str:
    """A cell's words: its passing, failing and other samples (nonzero ones)."""
    p = sum(n for s, n in cnt.items() if s in PASSED)
    f = sum(n for s, n in cnt.items() if s in FAILING)
    o = sum(cnt.values()) - p - f
    parts = [f"{p} pass" if p else "", f"{f} fail" if f else "", f"{o} other" if o else ""]
    return " · ".join(x for x in parts if x)


def pages(site: Site) -> Iterator[tuple[str, BackendsPage]]:
    if not site.cross_backend:
        return
    infos = columns(site)
    cells: dict[tuple[str, str], dict[str, Counter]] = {}  # (op, dtype) -> backend build -> statuses
    for info in infos:
        for op, dtype, status, n in q.matrix_cells(site.store, info.op_run["id"]):
            cells.setdefault((op, dtype or "-"), {}).setdefault(info.build, Counter())[status or "?"] += n
    by_run = {info.op_run["id"]: info for info in infos}
    only = [o for o in q.fails_only_on(site.store, list(by_run)) if o.run_id in by_run]
    only_on: dict[tuple[str, str], list[str]] = {}
    for o in only:
        only_on.setdefault((o.op, o.dtype), []).append(by_run[o.run_id].target)
    anchor = Slugger()

    def href(info: BuildInfo, op: str) -> str | None:
        slug = site.op_slugs(info).get(op)
        return f"{info.slug}/ops/{slug}.html" if slug else None

    shares = qc.backend_share(site.store, [info.op_run["id"] for info in infos])
    backends = []
    for info in infos:
        mine = [o for o in only if o.run_id == info.op_run["id"]]
        counts = [per[info.build] for per in cells.values() if info.build in per]
        backends.append(Backend(
            target=info.target, info=info, href=f"{info.slug}/index.html", anchor="only-" + anchor(info.target),
            samples=sum(sum(c.values()) for c in counts),
            failing=sum(n for c in counts for s, n in c.items() if s in FAILING),
            only_items=sum(o.items for o in mine), only_groups=len(mine),
            ran_none=shares[info.op_run["id"]].none if info.op_run["id"] in shares else None))

    rows: list[list[Any]] = []
    disagree = 0
    for (op, dtype), per in sorted(cells.items()):
        row_cells: list[Any] = []
        fails_on, passes_on = [], []
        for info in infos:
            cnt = per.get(info.build)
            if not cnt:
                row_cells.append(None)
                continue
            tip = f"{info.build}: " + ", ".join(f"{s} {n}" for s, n in ordered(dict(cnt)))
            row_cells.append([worst(cnt), tip, sum(cnt.values()), [], href(info, op), _text(cnt)])
            if any(s in FAILING for s in cnt):
                fails_on.append(info.target)
            if any(s in PASSED for s in cnt):
                passes_on.append(info.target)
        # one backend failing some samples and passing others is no disagreement between backends
        disagree += any(f != p for f in fails_on for p in passes_on)
        rows.append([op, dtype, *row_cells, fails_on, only_on.get((op, dtype), [])])

    table_columns = [{"key": "op", "label": "op", "kind": "text"},
                     {"key": "dtype", "label": "dtype", "kind": "text"},
                     *({"key": f"backend:{i.target}", "label": i.target, "kind": "cell"} for i in infos),
                     {"key": "fails_on", "label": "fails on", "kind": "list"},
                     {"key": "only", "label": "fails only on", "kind": "list"}]
    filters = [{"col": 1, "label": "dtype", "mode": "eq"},
               {"col": len(table_columns) - 2, "label": "fails on", "mode": "has"},
               {"col": len(table_columns) - 1, "label": "fails only on", "mode": "has"}]

    sections = []
    for b in backends:
        mine = [o for o in only if o.run_id == b.info.op_run["id"]]
        shown = []
        for o in mine[:ONLY_ROWS]:
            per = cells.get((o.op, o.dtype), {})
            shown.append(OnlyRow(
                op=o.op, dtype=o.dtype, href=href(b.info, o.op) or b.href, items=o.items,
                samples=sum(per.get(b.info.build, Counter()).values()), statuses=list(o.statuses),
                passes_on=[i.target for i in infos if i is not b.info and per.get(i.build)],
                upstream=site.upstream.get(b.target, {}).get((o.op, o.dtype), "")))
        sections.append(OnlySection(backend=b, rows=shown, more=max(0, len(mine) - ONLY_ROWS)))

    yield BACKENDS_PAGE, BackendsPage(
        **site.base("Across backends", "", [Link("index.html", "All builds"), Link(BACKENDS_PAGE, "Across backends",
                                                                                    current=True)]),
        backends=backends, dtypes=sorted({d for _, d in cells}), n_ops=len({op for op, _ in cells}),
        n_rows=len(rows), n_disagree=disagree,
        table_json=table_spec(table_columns, dumps(rows), filters=filters, id="backends-matrix"),
        only=sections)
