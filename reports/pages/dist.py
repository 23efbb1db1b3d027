"""``<build>/dist.html``: the build's collectives on its torch.distributed backend, from the latest
finished dist run (``conformance dist``): a matrix of collective (with reduce op) x dtype x world
size, each cell the worst status over its shapes, and every failing item with its rank, element
and error in eps.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterator

from opdb import dist as db
from opdb.status import ordered, worst

from ..contexts import DistCell, DistPage
from ..html import dumps, table_spec
from ..scope import BuildScope

TEMPLATE = "dist.html"
CONTEXT = DistPage
PER_BUILD = True
NAV = ("dist.html", "Distributed")
COLUMNS = (("collective", "collective", "text"), ("reduce_op", "reduce op", "text"), ("dtype", "dtype", "text"),
           ("world_size", "world size", "int"), ("shape", "shape", "text"), ("status", "status", "status"),
           ("rank", "rank", "int"), ("error_eps", "error (eps)", "num"), ("error", "error", "pre"))


def pages(b: BuildScope) -> Iterator[tuple[str, DistPage]]:
    info = b.info
    run = db.latest(b.store, info.target, info.run_build or info.build)
    base = b.base(f"Distributed: {info.build}", "../", "dist.html")
    if run is None:
        yield f"{info.slug}/dist.html", DistPage(**base, info=info, run=None, counts=[], columns=[], rows=[],
                                                 failing=table_spec([], "[]"))
        return
    rows = db.results(b.store, run["id"])
    columns = sorted({(r["dtype"], r["world_size"]) for r in rows}, key=lambda c: (c[1], c[0]))
    cells: dict[str, dict[tuple[str, int], list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        label = r["collective"] + (f" ({r['reduce_op']})" if r["reduce_op"] else "")
        cells[label][(r["dtype"], r["world_size"])].append(r)
    matrix = []
    for label in sorted(cells):
        line: list[DistCell | None] = []
        for col in columns:
            items = cells[label].get(col)
            if not items:
                line.append(None)
                continue
            n = Counter(i["status"] for i in items)
            title = ", ".join(f"{s} {k}" for s, k in ordered(dict(n)))
            bad = [f"{i['shape']}: {i['status']}" for i in items if i["status"] not in ("pass", "skip")]
            line.append(DistCell(worst(n) or "pass", title + ("; " + "; ".join(bad) if bad else "")))
        matrix.append((label, line))
    failing = []
    for r in rows:
        if r["status"] in ("pass", "skip"):
            continue
        ev = json.loads(r["evidence"] or "{}")
        failing.append([r["collective"], r["reduce_op"], r["dtype"], r["world_size"], r["shape"], r["status"],
                        ev.get("rank"), round(ev["error_eps"], 1) if ev.get("error_eps") is not None else None,
                        r["error"] or ""])
    spec_cols = [{"key": k, "label": label, "kind": kind} for k, label, kind in COLUMNS]
    filters = [{"col": 0, "label": "collective", "mode": "eq"}, {"col": 2, "label": "dtype", "mode": "eq"},
               {"col": 5, "label": "status", "mode": "eq"}]
    yield f"{info.slug}/dist.html", DistPage(
        **base, info=info, run=run, counts=ordered(dict(Counter(r["status"] for r in rows))), columns=columns,
        rows=matrix, failing=table_spec(spec_cols, dumps(failing), id="dist-failing", filters=filters))
