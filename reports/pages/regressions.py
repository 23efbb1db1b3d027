"""``<build>/regressions.html``: what the gate found worse than the previous build, grouped by
op × variant × dtype × transition, the largest group first (:func:`opdb.findings.group_findings`,
the grouping the console gate prints), each with the first bad build of its items. Only the
gate's stored decisions are read.
"""

from __future__ import annotations

from collections.abc import Iterator

from opdb import queries_counts as qc
from opdb.findings import CATEGORIES, FindingGroup, group_findings, numerics_line
from opdb.queries import result_ids
from opdb.status import FAILS_GATE, NUMERICS

from ..contexts import RegressionGroup, RegressionsPage
from ..scope import BuildScope

TEMPLATE = "regressions.html"
CONTEXT = RegressionsPage
PER_BUILD = True
NAV = ("regressions.html", "Regressions")


def pages(b: BuildScope) -> Iterator[tuple[str, RegressionsPage]]:
    info = b.info
    found: list[dict] = []
    ops = set(b.site.op_slugs(info))
    ids: dict[str, int] = {}
    for g in info.gates:
        rows = qc.gate_findings(b.store, g.baseline_run, g.candidate_run, (*FAILS_GATE, "flaky"))
        found += rows
        keys = [r["item_key"] for r in rows if r["kind"] == "op"]
        ids.update(result_ids(b.store, g.candidate_run, keys))

    def row(grp: FindingGroup) -> RegressionGroup:
        rid = ids.get(grp.first_key) if grp.kind == "op" else None
        return RegressionGroup(grp.category, grp.kind, grp.name,
                               f"ops/{b.op_slug(grp.name)}.html" if grp.kind != "model" and grp.name in ops else None,
                               grp.variant, grp.dtype, grp.transition, grp.size,
                               grp.fwd_rel_err if grp.fwd_rel_err is not None else grp.max_rel_err,
                               numerics_line(grp.drift) if grp.category in NUMERICS else grp.error,
                               f"conformance repro {rid} --db {b.db_label}" if rid is not None else "",
                               grp.first_bad_build)

    groups = group_findings(found)
    counts = [(c, info.gate_count(c)) for c in CATEGORIES if info.gate_count(c)]
    yield f"{info.slug}/regressions.html", RegressionsPage(
        **b.base(f"Regressions: {info.build}", "../", "regressions.html"), info=info, baseline=info.previous,
        judged=bool(info.gates) and not info.ungated,
        gate_commands=[f"conformance gate --db {b.db_label} --baseline {x} --candidate {y}" for x, y in info.ungated],
        counts=counts, groups=[row(g) for g in groups if g.category in FAILS_GATE],
        flaky=[row(g) for g in groups if g.category == "flaky"])
