"""``<build>/diff.html``: regressions and fixes against the previous build, as the gate decided them.
Each failing item shows its first bad build (the build since which it has been bad, as the gate
found it in the stored runs of older builds).

The page only reads the gate's stored decisions (``gate_items``): what counts as a regression,
a flake or drift is the gate's call, made once. For a pair of runs the gate has not judged, the
page says so and gives the command that judges it.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

from opdb import queries_report as q
from opdb.findings import numerics_line
from opdb.status import NUMERICS

from ..contexts import DiffOp, DiffPage, DiffSection, Link
from ..html import dumps, parse_json, table_spec
from ..scope import BuildScope

TEMPLATE = "diff.html"
CONTEXT = DiffPage
PER_BUILD = True
NAV = ("diff.html", "Diff")
DIFF_ROWS = 10_000  # items of one diff section embedded in the page (worst categories first)
DIFF_OPS = 200  # rows of the per-op roll-up of a diff section
NO_GATE = "no gate decision"  # a section's source when the gate has not judged the pair of runs


def pages(b: BuildScope) -> Iterator[tuple[str, DiffPage]]:
    info = b.info
    base = b.previous()
    sections = []
    if base:
        for kind, brun, crun in (("ops", base.op_run, info.op_run), ("models", base.model_run, info.model_run)):
            if not brun or not crun:
                sections.append(DiffSection(kind, "", (brun or {}).get("id", ""), (crun or {}).get("id", ""),
                                            [], 0, table_spec([], "[]"),
                                            note=f"no {kind} run in one of the two builds"))
                continue
            sections.append(_section(b, kind, brun["id"], crun["id"]))
    yield f"{info.slug}/diff.html", DiffPage(
        **b.base(f"Diff: {info.build}", "../", "diff.html"), info=info, baseline=base,
        baseline_link=Link(f"../{base.slug}/index.html", base.build) if base and base.rendered else None,
        sections=sections, totals=[(c, info.gate_count(c)) for c in CATEGORIES if info.gate_count(c)])


COLUMNS = [{"key": "category", "label": "category", "kind": "text"},
           {"key": "kind", "label": "kind", "kind": "text"},
           {"key": "op", "label": "op / model", "kind": "link"},
           {"key": "variant", "label": "variant / mode", "kind": "text"},
           {"key": "dtype", "label": "dtype", "kind": "text"},
           {"key": "baseline", "label": "baseline", "kind": "status"},
           {"key": "candidate", "label": "candidate", "kind": "status"},
           {"key": "item_key", "label": "item", "kind": "text"},
           {"key": "first_bad", "label": "first bad build", "kind": "text"},
           {"key": "evidence", "label": "evidence", "kind": "pre"}]
FILTERS = [{"col": 0, "label": "category", "mode": "eq"}, {"col": 4, "label": "dtype", "mode": "eq"}]
CATEGORIES = ["regression", "worsened", "improvement", "flaky", "drift", "changed", "new", "removed"]  # display order


def _section(b: BuildScope, kind: str, brun: str, crun: str) -> DiffSection:
    """The gate's stored decisions for the pair of runs; the page never decides a regression itself."""
    decided = q.gate_items(b.store, brun, crun)
    if not decided:
        return DiffSection(kind, NO_GATE, brun, crun, [], 0, table_spec([], "[]"),
                           gate_command=f"conformance gate --db {b.db_label} --baseline {brun} --candidate {crun}")
    # The gate judged this pair when it stored any decision for it; a mixed run's pair holds op,
    # drift and model decisions together, so each section keeps its own kinds.
    kinds = ("model",) if kind == "models" else ("op", "drift")

    def op_link(op: str | None) -> list[Any]:
        if kind == "ops" and op and op in b.op_pages:
            return [f"ops/{b.op_slug(op)}.html", op]
        return [None, op or ""]

    rows = [[g["category"], g["kind"], op_link(g["op"]), g["variant"], g["dtype"], g["baseline"],
             g["candidate"], g["item_key"], *_evidence(g["evidence"], g["category"])]
            for g in decided if (g["kind"] or "op") in kinds]
    rank = {c: i for i, c in enumerate(CATEGORIES)}
    rows.sort(key=lambda r: rank.get(r[0], len(rank)))  # worst first; the gate's order within a category
    counts = Counter(r[0] for r in rows)
    counts_list = [(c, counts[c]) for c in CATEGORIES if counts.get(c)] + \
                  sorted((c, n) for c, n in counts.items() if c not in CATEGORIES)
    per_op: dict[str, Counter] = {}
    links: dict[str, Any] = {}
    for r in rows:
        name = r[2][1] or ""
        per_op.setdefault(name, Counter())[r[0]] += 1
        links[name] = r[2][0]
    by_op = [DiffOp(name, links[name], c.get("regression", 0), c.get("improvement", 0),
                    sum(n for k, n in c.items() if k not in ("regression", "improvement")))
             for name, c in per_op.items()]
    by_op.sort(key=lambda d: (-d.regressions, -d.improvements, d.op))
    shown = rows[:DIFF_ROWS]
    return DiffSection(kind, "gate", brun, crun, counts_list, len(rows),
                       table_spec(COLUMNS, dumps(shown), filters=FILTERS, id=f"diff-{kind}-items"),
                       by_op=by_op[:DIFF_OPS], n_ops=len(by_op), n_shown=len(shown))


FIRST_BAD = ("first_bad_build", "first_bad_run", "first_bad_unknown", "first_bad_order")  # the column's, not the text's


def _evidence(text: str | None, category: str = "") -> tuple[str, str]:
    """A stored decision's evidence as (first bad build, the rest as text). The first bad build
    carries the gap that stopped its search ("unknown before X: ..."); its history reads
    ``build status, ...``, oldest first; a numerics finding's fingerprints read as the console
    says them."""
    data = parse_json(text, text)
    if isinstance(data, dict) and category in NUMERICS:
        first_bad, _ = _evidence(json.dumps({k: v for k, v in data.items() if k in FIRST_BAD}))
        return first_bad, numerics_line(data)
    if isinstance(data, dict):
        first_bad = str(data.get("first_bad_build") or "")
        if first_bad and data.get("first_bad_unknown"):
            first_bad += f" ({data['first_bad_unknown']})"
        parts = []
        for k, v in data.items():
            if k in FIRST_BAD:
                continue
            if k == "history" and isinstance(v, list):
                v = ", ".join(f"{h[0]} {h[1] or '(no result)'}" for h in v if isinstance(h, list) and len(h) == 2)
            parts.append(f"{k}: {v}")
        return first_bad, "; ".join(parts)
    if data is None:
        return "", ""
    return "", str(data) if not isinstance(data, str) else data
