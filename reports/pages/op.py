"""``<build>/ops/<op>.html``: every sample of one OpInfo op, split in parts above OP_PART_ROWS."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator

from opdb import queries_contracts as qk
from opdb import queries_dtypes as qd
from opdb import queries_report as q
from opdb.status import FAILING, ordered

from .. import charts
from ..contexts import ContractCell, ContractRow, Link, OpPage
from ..html import table_spec
from ..scope import BuildScope

TEMPLATE = "op.html"
CONTEXT = OpPage
PER_BUILD = True
NAV = None
OP_PART_ROWS = 2000  # samples per op page part
REPRO_LIST = 50  # repro commands listed in the page itself (the table has all)
SAMPLE_KINDS = {"id": "int", "sample": "int", "status": "status", "max_abs_err": "num", "max_rel_err": "num",
                "ulp_err": "num", "mismatch_frac": "num", "arbiter_err": "num", "cpu_arbiter_err": "num",
                "atol": "num", "rtol": "num", "native_ops": "list", "fallback_ops": "list", "error": "pre",
                "duration_s": "num", "seed": "text", "tol_source": "pre", "worst": "pre",  # a seed is an id: no digit grouping
                "contracts": "list", "cause": "linkto"}
SAMPLE_LABELS = {"worst": "worst element (target, CPU, float64)"}
DETAIL_CHARS = 300  # of a contract's first detail, in its cell's tooltip
REASON_CHARS = 80  # of an n/a contract's reason, in its cell


def pages(b: BuildScope) -> Iterator[tuple[str, OpPage]]:
    if not b.info.op_run:
        return
    op_classes = b.classes("opinfo")
    outcomes: dict[str, list[qk.ContractOutcome]] = {}
    for o in qk.contract_outcomes(b.store, b.info.op_run["id"]):
        outcomes.setdefault(o.op, []).append(o)
    ladders: dict[str, list[q.LadderSizes]] = {}
    for (op, _), sizes in sorted(q.ladder_sizes(b.store, b.info.op_run["id"]).items()):
        ladders.setdefault(op, []).append(sizes)
    traced: dict[str, list[q.TracedSizes]] = {}  # by the overload's name ("cumsum"), and by the overload
    for (overload, _), sizes in sorted(q.traced_sizes(b.store, b.info.op_run["id"]).items()):
        traced.setdefault(overload, []).append(sizes)
        traced.setdefault(overload.split("::", 1)[-1].split(".", 1)[0], []).append(sizes)
    probes: dict[str, list[qd.DtypeProbe]] = {}
    for p in qd.dtype_probes(b.store, b.info.op_run["id"]):
        probes.setdefault(p.op, []).append(p)
    for op, group in itertools.groupby(q.op_sample_stream(b.store, b.info.op_run["id"]), key=lambda r: r[0]):
        yield from _op_pages(b, op, list(group), op_classes.get(op, []), outcomes.get(op, []), ladders.get(op, []),
                             traced.get(op, []), probes.get(op, []))


def _clip(text: str, chars: int = DETAIL_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= chars else text[:chars - 1] + "…"


def contract_table(outcomes: list[qk.ContractOutcome]) -> tuple[list[str], list[ContractRow]]:
    """The op's contract table: its columns (the contracts any item checked) and one row per
    dtype, each cell the contract's aggregate outcome over the dtype's items (blank: not checked)."""
    names = qk.ordered_contracts(o.contract for o in outcomes)
    by = {(o.dtype, o.contract): o for o in outcomes}
    rows = []
    for dtype in sorted({o.dtype for o in outcomes}):
        cells = []
        for name in names:
            o = by.get((dtype, name))
            if o is None:
                cells.append(ContractCell("", "", f"{name}: no {dtype} item checked it"))
            elif o.outcome == "fail":
                cells.append(ContractCell("fail", f"fail {o.items}/{o.checked}",
                                          f"{name}: {o.items} of {o.checked} items fail; first: {_clip(o.detail)}"))
            elif o.outcome == "pass":
                cells.append(ContractCell("pass", f"pass {o.items}/{o.checked}",
                                          f"{name}: {o.items} of {o.checked} items pass"
                                          + (f"; {o.checked - o.items} n/a" if o.checked > o.items else "")))
            else:
                cells.append(ContractCell(o.outcome, f"{o.outcome}: {_clip(o.detail, REASON_CHARS)}" if o.detail else o.outcome,
                                          f"{name}: {o.outcome} for all {o.checked} items"
                                          + (f"; first reason: {_clip(o.detail)}" if o.detail else "")))
        rows.append(ContractRow(dtype, cells))
    return names, rows


def _op_pages(b: BuildScope, op: str, rows: list[tuple], classes: list[str],
              outcomes: list[qk.ContractOutcome], ladder: list[q.LadderSizes] = (),
              traced: list[q.TracedSizes] = (), probes: list[qd.DtypeProbe] = ()) -> Iterator[tuple[str, OpPage]]:
    info = b.info
    b.op_pages.add(op)
    slug = b.op_slug(op)
    by_dtype: dict[str, Counter] = {}
    status_counts: Counter = Counter()
    for _, _, dtype, status, _, _ in rows:
        by_dtype.setdefault(dtype or "-", Counter())[status] += 1
        status_counts[status] += 1
    failing_ids = [r[1] for r in rows if r[3] in FAILING][:REPRO_LIST]
    n_failing = sum(n for s, n in status_counts.items() if s in FAILING)
    hist = charts.histogram(charts.log10_bins([r[4] for r in rows]),
                            title=f"max relative error of {op} (log10 bins, {len(rows)} samples)",
                            x_label="max_rel_err decade (0: exact, n/a: not measured)")
    dtype_counts = [(d, ordered(dict(c))) for d, c in sorted(by_dtype.items())]
    columns = [{"key": k, "label": SAMPLE_LABELS.get(k, k), "kind": SAMPLE_KINDS.get(k, "text")} for k in q.SAMPLE_COLUMNS]
    columns[q.SAMPLE_COLUMNS.index("cause")].update(href="../causes.html#{}", after=q.SAMPLE_COLUMNS.index("error"))
    # the repro command beside the status it reproduces, not at the far end of a wide table
    columns.append({"key": "repro", "label": "repro", "kind": "repro", "ref": 0,
                    "after": q.SAMPLE_COLUMNS.index("status")})
    filters = [{"col": q.SAMPLE_COLUMNS.index("status"), "label": "status", "mode": "eq"},
               {"col": q.SAMPLE_COLUMNS.index("dtype"), "label": "dtype", "mode": "eq"},
               {"col": q.SAMPLE_COLUMNS.index("variant"), "label": "variant", "mode": "eq"},
               {"col": q.SAMPLE_COLUMNS.index("contracts"), "label": "failed contract", "mode": "has"}]
    contracts, contract_rows = contract_table(outcomes)
    nparts = max(1, -(-len(rows) // OP_PART_ROWS))
    names = [f"{slug}.html"] + [f"{slug}.{k}.html" for k in range(2, nparts + 1)]
    parts = [Link(n, f"part {k + 1}") for k, n in enumerate(names)] if nparts > 1 else []
    repros = [f"conformance repro {i} --db {b.db_label}" for i in failing_ids]
    elsewhere = [o for o in b.site.infos if o is not info and o.rendered and op in b.site.op_slugs(o)]
    builds = [Link(f"../../{o.slug}/ops/{b.site.op_slugs(o)[op]}.html", o.build)
              for o in elsewhere if o.target == info.target]
    targets = [Link(f"../../{o.slug}/ops/{b.site.op_slugs(o)[op]}.html",
                    o.build if o.build.startswith(o.target) else f"{o.target} {o.build}")
               for o in elsewhere if o.target != info.target]
    for k in range(nparts):
        chunk = rows[k * OP_PART_ROWS:(k + 1) * OP_PART_ROWS]
        rows_json = "[" + ",".join(r[5] for r in chunk) + "]"
        yield f"{info.slug}/ops/{names[k]}", OpPage(
            **b.base(f"{op} — {info.build}", "../../"), info=info, op=op,
            classes=classes, n_samples=len(rows), dtype_counts=dtype_counts,
            status_counts=ordered(dict(status_counts)), hist_svg=hist, repros=repros,
            n_failing=n_failing,
            samples_json=table_spec(columns, rows_json, filters=filters, id="samples-table",
                                    failing=sorted(FAILING), db=b.db_label),
            part=k + 1, parts=parts, other_builds=builds, other_targets=targets, contracts=contracts,
            contract_rows=contract_rows, ladder=list(ladder), traced=list(traced),
            traced_links={t.overload: f"{b.op_slug(t.overload)}.html" for t in traced if t.overload in b.site.op_slugs(info)},
            dtype_probes=list(probes))
