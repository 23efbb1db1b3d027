"""``<build>/claims.html``: a published compatibility table for the build held against what the
build did (``conformance claims`` prints the same): each claim that disagrees, by kind (claimed
native but ran on the CPU fallback or fails on the device, claimed CPU_FALLBACK but native,
claimed not supported but works, a dtype claimed but refused), the unchecked claims (no stored
item reached them: never counted as kept) and the kept ones.

The nightly stores the check of the table the build's target publishes (the emulator ships one
beside each build's manifest, ``conformance.catalog.claims``); the page reads what is stored, and
says how to check a table by hand where nothing is.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from opdb import queries_report as q

from ..contexts import ClaimsPage
from ..html import dumps, table_spec
from ..scope import BuildScope

TEMPLATE = "claims.html"
CONTEXT = ClaimsPage
PER_BUILD = True
NAV = ("claims.html", "Claims")
#: The kinds of finding, disagreements first (conformance.catalog.claims.KINDS, in its order).
KINDS = {
    "not_native": "claimed native (Y); ran on the CPU fallback",
    "fails": "claimed to run; fails on the device (with the device's silent recovery a user sees it run on the CPU)",
    "dtype_not_delivered": "claimed for this dtype; the device refuses the dtype",
    "native_not_claimed": "claimed CPU_FALLBACK; ran natively",
    "works_not_claimed": "claimed not supported (N); works",
    "unchecked": "no stored item reached it: never counted as kept",
    "kept": "the run agrees",
}
COLUMNS = (("kind", "kind", "text"), ("api", "API", "text"), ("dtype", "dtype", "text"),
           ("claimed", "claimed", "text"), ("measured", "measured (items of the run)", "pre"),
           ("example", "example failure", "pre"), ("line", "line", "int"))


def pages(b: BuildScope) -> Iterator[tuple[str, ClaimsPage]]:
    info = b.info
    stored = q.claim_rows(b.store, info.op_run["id"]) if info.op_run else []
    order = list(KINDS)
    stored.sort(key=lambda r: (order.index(r["kind"]) if r["kind"] in order else 99, r["line"], r["dtype"]))
    n = Counter(r["kind"] for r in stored)
    counts = [(k, what, n[k]) for k, what in KINDS.items() if n[k]]
    rows = [[r["kind"], r["api"], r["dtype"], r["claimed"], r["measured"], r["example"] or "", r["line"]]
            for r in stored]
    columns = [{"key": k, "label": label, "kind": kind} for k, label, kind in COLUMNS]
    filters = [{"col": 0, "label": "kind", "mode": "eq"}, {"col": 2, "label": "dtype", "mode": "eq"}]
    yield f"{info.slug}/claims.html", ClaimsPage(
        **b.base(f"Published claims: {info.build}", "../", "claims.html"), info=info,
        table_path=stored[0]["tbl"] if stored else "", problem="", counts=counts,
        disagree=sum(n[k] for k in KINDS if k not in ("unchecked", "kept")),
        findings=table_spec(columns, dumps(rows), id="claims-table", filters=filters))
