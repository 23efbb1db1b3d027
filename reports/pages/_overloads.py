"""What the fallback and failing list pages share: one JS table of overloads, the most reached first.

The rows are :func:`opdb.queries_counts.fallback_overloads` / ``failing_overloads`` as the build
scope holds them, the same lists the index, the summary and the matrix count.
"""

from __future__ import annotations

from collections.abc import Iterator

from opdb import queries_report as q
from opdb.status import ordered

from ..contexts import OverloadsPage
from ..html import dumps, table_spec
from ..scope import BuildScope

TITLES = {"fallback": "Overloads that fall back to the CPU", "failing": "Overloads failing samples reach"}
FILES = {"fallback": "fallbacks.html", "failing": "failing.html"}


def overload_pages(b: BuildScope, how: str) -> Iterator[tuple[str, OverloadsPage]]:
    info = b.info
    rows = b.overloads(how)
    ops = set(b.site.op_slugs(info))

    def link(name: str) -> list[str | None]:
        return [f"ops/{b.op_slug(name)}.html" if name in ops else None, name]

    table = [[link(r.name), r.graphs, r.samples, len(r.ops), r.ops[:20], r.dtypes,
              [f"{s} {n}" for s, n in ordered(r.statuses)]] for r in rows]
    what = "falling back" if how == "fallback" else "failing"
    columns = [{"key": "overload", "label": "overload", "kind": "link"},
               {"key": "graphs", "label": f"model graphs {'naming it' if how == 'fallback' else 'diverging at it'}",
                "kind": "int"},
               {"key": "samples", "label": f"samples {what}", "kind": "int"},
               {"key": "n_ops", "label": "ops", "kind": "int"},
               {"key": "ops", "label": "ops reaching it (first 20)", "kind": "list"},
               {"key": "dtypes", "label": "dtypes", "kind": "list"},
               {"key": "statuses", "label": "statuses", "kind": "list"}]
    filters = [{"col": 5, "label": "dtype", "mode": "has"}]
    source = "coverage" if info.op_run and q.coverage_count(b.store, info.op_run["id"]) else "op_results"
    yield f"{info.slug}/{FILES[how]}", OverloadsPage(
        **b.base(f"{TITLES[how]}: {info.build}", "../", FILES[how]), info=info, how=how, source=source,
        n=len(rows), samples=sum(r.samples for r in rows), graphs=sum(1 for r in rows if r.graphs),
        table_json=table_spec(columns, dumps(table), filters=filters, id=f"{how}-overloads", hashFilter=True))

