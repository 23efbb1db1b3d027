"""``<build>/causes.html``: the build's failing items grouped into their error causes, the widest
reach first (``conformance errors`` prints the same list): each cause's kind, normalised message
and locus, its items, ops, dtypes and models, its trend over the target's builds, whether it is
new since the previous build, what the knowledge file says about it, and the repro command of
its item with the smallest input. ``causes.html#<key>`` shows that cause alone (op and model
pages link each failing item's cause there).

Causes are computed by ``conformance.triage.causes`` when a run finishes, is gated, or is
listed by ``conformance errors`` (the nightly's report stage computes any missing); the report
only reads, so a build whose runs have none says so and names the command.
"""

from __future__ import annotations

from collections.abc import Iterator

from opdb import queries_causes as qc

from ..contexts import CausesPage
from ..html import dumps, table_spec
from ..scope import BuildScope

TEMPLATE = "causes.html"
CONTEXT = CausesPage
PER_BUILD = True
NAV = ("causes.html", "Top causes")
COLUMNS = (("key", "cause", "text"), ("new", "new", "text"), ("kind", "kind", "text"), ("items", "items", "int"),
           ("what", "what (normalised; at: the overload blamed)", "pre"), ("ops", "ops", "list"),
           ("dtypes", "dtypes", "list"), ("models", "models", "list"), ("trend", "items per build", "text"),
           ("first", "first seen", "text"), ("explanation", "explanation", "pre"), ("workaround", "workaround", "pre"),
           ("upstream", "upstream", "link"), ("owner", "owner", "text"), ("repro", "repro (smallest input)", "pre"),
           ("example", "example (as stored)", "pre"))


def _runs(b: BuildScope) -> list[dict]:
    return [r for r in (b.info.op_run, b.info.model_run) if r]


def pages(b: BuildScope) -> Iterator[tuple[str, CausesPage]]:
    info = b.info
    runs = list({r["id"]: r for r in _runs(b)}.values())
    computed = [r for r in runs if qc.cause_run(b.store, r["id"]) is not None]
    found: dict[str, qc.CauseReach] = {}
    for r in computed:
        for c in qc.run_causes(b.store, r["id"]):
            have = found.get(c.key)
            if have is None:
                found[c.key] = c
            else:  # the same cause in the build's op run and model run
                have.items += c.items
                have.models = sorted(set(have.models) | set(c.models))
                have.ops = sorted(set(have.ops) | set(c.ops))
    causes = sorted(found.values(), key=lambda c: (-c.items, c.key))
    prev = b.previous()
    before: set[str] | None = None
    if prev is not None:
        prev_runs = [r for r in (prev.op_run, prev.model_run) if r and qc.cause_run(b.store, r["id"]) is not None]
        before = {k for r in prev_runs for k in qc.cause_keys(b.store, r["id"])} if prev_runs else None
    rows = []
    for c in causes:
        first = c.first_seen
        rows.append([
            c.key, "new" if before is not None and c.key not in before else "", c.kind, c.items,
            c.text(), c.ops, c.dtypes, c.models,
            " · ".join(f"{build}: {n}" for build, _, n in c.trend), first[0] if first else "",
            c.explanation or "", c.workaround or "", [c.upstream, c.upstream] if c.upstream else None, c.owner or "",
            f"conformance repro {c.repro_id} --db {b.db_label}" if c.repro_id is not None else "",
            c.example])
    columns = [{"key": k, "label": label, "kind": kind} for k, label, kind in COLUMNS]
    filters = [{"col": 1, "label": "new", "mode": "eq"}, {"col": 2, "label": "kind", "mode": "eq"}]
    failing = sum(c.items for c in causes)
    yield f"{info.slug}/causes.html", CausesPage(
        **b.base(f"Top causes: {info.build}", "../", "causes.html"), info=info, computed=bool(computed),
        n_causes=len(causes), n_failing=failing, n_new=sum(1 for r in rows if r[1]),
        n_explained=sum(1 for c in causes if c.explanation), baseline=prev.build if prev and before is not None else "",
        top=[(c.key, c.items, c.text()) for c in causes[:10]],
        table=table_spec(columns, dumps(rows), id="causes-table", hashFilter=True, filters=filters))
