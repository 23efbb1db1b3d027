"""``<build>/claims.html``: the vendor's published compatibility table for the build held against
what the build did (``conformance claims`` prints the same): each claim that disagrees, by kind
(claimed native but ran on the CPU fallback or fails on the device, claimed CPU_FALLBACK but
native, claimed not supported but works, a dtype claimed but refused), the unchecked claims (no
stored item reached them: never counted as kept) and the kept ones.

The table is the one the build's target publishes (the emulator ships one beside each build's
manifest); a build without one says how to check a table by hand. The page reads the run's
stored items only.
"""

from __future__ import annotations

from collections.abc import Iterator

from conformance.catalog import claims as cl
from conformance.datafiles import DataFileError

from ..contexts import ClaimsPage
from ..html import dumps, table_spec
from ..scope import BuildScope

TEMPLATE = "claims.html"
CONTEXT = ClaimsPage
PER_BUILD = True
NAV = ("claims.html", "Claims")
COLUMNS = (("kind", "kind", "text"), ("api", "API", "text"), ("dtype", "dtype", "text"),
           ("claimed", "claimed", "text"), ("measured", "measured (items of the run)", "pre"),
           ("example", "example failure", "pre"), ("line", "line", "int"))


def pages(b: BuildScope) -> Iterator[tuple[str, ClaimsPage]]:
    info = b.info
    run = info.op_run
    table = cl.published_table(info.target, info.run_build) if run else None
    problem, counts, rows = "", [], []
    if table is not None:
        try:
            report = cl.run_report(b.store, run["id"], table)
        except DataFileError as exc:
            problem = str(exc)
        else:
            order = [*cl.KINDS, "unchecked", "kept"]
            counts = [(k, cl.KINDS.get(k, k), report.count(k)) for k in order if report.count(k)]
            for f in sorted(report.findings, key=lambda f: (order.index(f.kind), f.claim.line, f.dtype)):
                rows.append([f.kind, f.claim.api, f.dtype, f.claim.status + (f" ({', '.join(f.claim.dtypes)})"
                                                                            if f.claim.dtypes else ""),
                             f.measured, f.example, f.claim.line])
    columns = [{"key": k, "label": label, "kind": kind} for k, label, kind in COLUMNS]
    filters = [{"col": 0, "label": "kind", "mode": "eq"}, {"col": 2, "label": "dtype", "mode": "eq"}]
    yield f"{info.slug}/claims.html", ClaimsPage(
        **b.base(f"Published claims: {info.build}", "../", "claims.html"), info=info,
        table_path=str(table) if table is not None else "", problem=problem, counts=counts,
        disagree=sum(n for k, _, n in counts if k in cl.KINDS),
        findings=table_spec(columns, dumps(rows), id="claims-table", filters=filters))
