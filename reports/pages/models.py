"""``<build>/models.html``: model families, the blocking-ops ranking and every graph (a JS table)."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterator
from typing import Any

from opdb import queries_report as q
from opdb.status import FAILING, PASSED, ordered

from ..contexts import FamilyRow, ModelsPage
from ..html import dumps, table_spec
from ..scope import BuildScope
from .family import Family, families, latency_note

TEMPLATE = "models.html"
CONTEXT = ModelsPage
PER_BUILD = True
NAV = ("models.html", "Models")

COLUMNS = [{"key": "model", "label": "model", "kind": "link"},
           {"key": "family", "label": "family", "kind": "text"},
           {"key": "dtype", "label": "dtype", "kind": "text"},
           {"key": "mode", "label": "mode", "kind": "text"},
           {"key": "status", "label": "status", "kind": "status"},
           {"key": "fwd_rel_err", "label": "fwd rel err ‖t−c‖/‖c‖", "kind": "num"},
           {"key": "grad", "label": "grad rel err (normwise)", "kind": "num"},
           {"key": "first_divergent_op", "label": "first divergent op", "kind": "text"},
           {"key": "compiles", "label": "compiles", "kind": "int"},
           {"key": "recompiles", "label": "recompiles", "kind": "int"},
           {"key": "p50_ms", "label": "p50 ms", "kind": "num"},
           {"key": "p99_ms", "label": "p99 ms", "kind": "num"},
           {"key": "graph", "label": "graph", "kind": "text"},
           {"key": "cause", "label": "cause", "kind": "link"}]
FILTERS = [{"col": 4, "label": "status", "mode": "eq"}, {"col": 1, "label": "family", "mode": "eq"},
           {"col": 3, "label": "mode", "mode": "eq"}]


def _family_row(fam: Family) -> FamilyRow:
    graphs = fam.graphs
    counts = Counter(g["status"] or "?" for g in graphs)
    p50s = [g["p50_ms"] for g in graphs if g["p50_ms"] is not None]
    rels = [g["fwd_rel_err"] for g in graphs if g["fwd_rel_err"] is not None]
    grads = [g["grad_max_rel_err"] for g in graphs if g["grad_max_rel_err"] is not None]
    return FamilyRow(
        family=fam.name, href=f"models/{fam.files[0]}", graphs=len(graphs), counts=ordered(dict(counts)),
        passing=sum(n for s, n in counts.items() if s in PASSED),
        failing=sum(n for s, n in counts.items() if s in FAILING),
        worst_fwd=max(rels) if rels else None, worst_grad=max(grads) if grads else None,
        compiled=sum(1 for g in graphs if g["mode"] == "compile"),
        recompiles=sum(g["recompiles"] or 0 for g in graphs),
        median_p50_ms=statistics.median(p50s) if p50s else None)


def pages(b: BuildScope) -> Iterator[tuple[str, ModelsPage]]:
    info, run = b.info, b.info.model_run
    table: list[list[Any]] = []
    for fam in families(b):
        for name, chunk in fam.parts():
            for c in chunk:
                table.append([[f"models/{name}#{c.anchor}", c.model_id], fam.name, c.dtype, c.mode,
                              c.status, c.fwd_rel_err, c.grad_max_rel_err, c.first_divergent_op,
                              c.compiles, c.recompiles, c.p50_ms, c.p99_ms, c.graph_hash[:12],
                              [f"causes.html#{c.cause}", c.cause] if c.cause else None])
    n_failing, n_localized = q.localized_counts(b.store, run["id"]) if run else (0, 0)
    yield f"{info.slug}/models.html", ModelsPage(
        **b.base(f"Models: {info.build}", "../", "models.html"), info=info, latency_note=latency_note(b),
        families=[_family_row(f) for f in families(b)],
        blocking=q.blocking_ops(b.store, run["id"]) if run else [], n_failing=n_failing, n_localized=n_localized,
        n_graphs=len(b.model_rows()),
        graphs_json=table_spec(COLUMNS, dumps(table), filters=FILTERS, id="graphs-table"))
