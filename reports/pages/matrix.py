"""``<build>/matrix.html``: op × dtype, one row per OpInfo op and per catalog overload (a JS table)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

from opdb import queries_contracts as qk
from opdb import queries_counts as qc
from opdb import queries_dtypes as qd
from opdb import queries_report as q
from opdb.status import WORST_RANK, ordered, worst

from ..contexts import MatrixPage
from ..html import dumps, table_spec
from ..scope import BuildScope

TEMPLATE = "matrix.html"
CONTEXT = MatrixPage
PER_BUILD = True
NAV = ("matrix.html", "Op × dtype")

Cells = Iterable[tuple[str, str, str, int]]


def _grouped(items: Cells) -> dict[str, dict[str, Counter]]:
    out: dict[str, dict[str, Counter]] = {}
    for name, dtype, status, n in items:
        out.setdefault(name, {}).setdefault(dtype or "-", Counter())[status or "?"] += n
    return out


Failures = dict[str, dict[str, int]]  # dtype -> failed contract -> items
#: What a cell whose dtype probe disagrees with the CPU shows after its count (and alone, for a
#: dtype the OpInfo does not claim: no samples); its 'fails contract' name is the probe's variant.
PROBE_MARK = "≠"


def _row_cells(by_dtype: dict[str, Counter], col: dict[str, int], failures: Failures | None = None,
               probes: dict[str, qd.DtypeProbe] | None = None, href: str | None = None,
               ) -> tuple[list[Any], list[str], int, str | None]:
    """One row's dtype cells ([worst, tooltip, samples] or None), its statuses, samples and worst;
    a cell whose items failed contracts names them, with their counts, in its tooltip, and lists
    them as a fourth element (the 'fails contract' filter dims the other cells). A cell whose dtype
    probe fails (``probes``: the failing ones by dtype) is marked :data:`PROBE_MARK`, links to the
    op page's dtype table (``href``) and lists the probe's variant among its failed contracts; the
    probe counts in its worst status, not among its samples."""
    cells_out: list[Any] = [None] * len(col)
    present: set[str] = set()
    total = 0
    for d in sorted(set(by_dtype) | set(probes or {}), key=lambda d: col[d]):
        cnt = by_dtype.get(d, Counter())
        probe = (probes or {}).get(d)
        n = sum(cnt.values())
        total += n
        present.update(cnt)
        tip = f"{d}: " + (", ".join(f"{s} {k}" for s, k in ordered(dict(cnt))) or "no samples (the OpInfo does not claim it)")
        failed = (failures or {}).get(d)
        names = qk.ordered_contracts(failed or ())
        if names:
            tip += "; failed contracts: " + ", ".join(f"{c} {failed[c]}" for c in names)
        if probe is None:
            cells_out[col[d]] = [worst(cnt), tip, n, names] if names else [worst(cnt), tip, n]
            continue
        present.add(probe.status)
        tip += f"; {PROBE_MARK} dtype probe {probe.status}: {probe.error}"
        cells_out[col[d]] = [worst([*cnt, probe.status]), tip, n, [*names, qd.DTYPE_PROBE],
                             f"{href}#dtypes" if href else None, f"{n:,} {PROBE_MARK}" if n else PROBE_MARK]
    return cells_out, sorted(present, key=lambda s: WORST_RANK.get(s, 99)), total, worst(present)


def _rows(b: BuildScope) -> tuple[list[list[Any]], list[str], int, int]:
    """Table rows, dtype columns, and the numbers of OpInfo and ATen rows."""
    rows: list[list[Any]] = []
    if not b.info.op_run:
        return rows, [], 0, 0
    rid = b.info.op_run["id"]
    op_classes, ov_classes = b.classes("opinfo"), b.classes("overload")
    pages = b.site.op_slugs(b.info)
    lists = {how: {r.name for r in b.overloads(how)} for how in ("fallback", "failing")}

    def aten(name: str) -> list[Any]:
        """An ATen row: its link (the op page of its schema-driven samples, else its place in a list)
        and its flags (in the fallback / failing lists the summary counts)."""
        flags = [how for how in ("fallback", "failing") if name in lists[how]]
        if name in pages:
            href = f"ops/{b.op_slug(name)}.html"
        elif flags:
            href = ("fallbacks.html" if flags[0] == "fallback" else "failing.html") + "#" + name
        else:
            href = None
        return [[href, name], flags]

    cells = q.matrix_cells(b.store, rid)
    failures: dict[str, Failures] = {}
    for op, dtype, contract, n in qk.matrix_contract_failures(b.store, rid):
        failures.setdefault(op, {}).setdefault(dtype, {})[contract] = n
    probes: dict[str, dict[str, qd.DtypeProbe]] = {}
    for p in qd.dtype_probes(b.store, rid):
        if p.failing:
            probes.setdefault(p.op, {})[p.dtype] = p
    ov_cells = b.reached().cells()
    dtypes = sorted({c[1] or "-" for c in cells} | {c[1] or "-" for c in ov_cells}
                    | {d for by in probes.values() for d in by})
    col = {d: i for i, d in enumerate(dtypes)}
    n_op = n_aten = 0
    grouped = _grouped(cells)
    for name in sorted(set(grouped) | set(probes)):
        c, present, total, w = _row_cells(grouped.get(name, {}), col, failures.get(name), probes.get(name),
                                          f"ops/{b.op_slug(name)}.html")
        failed = qk.ordered_contracts([*(k for d in failures.get(name, {}).values() for k in d),
                                       *([qd.DTYPE_PROBE] if name in probes else [])])
        rows.append([[f"ops/{b.op_slug(name)}.html", name], "OpInfo", op_classes.get(name, []),
                     "sampled", total, w, *c, failed, present, []])
        n_op += 1
    by_overload = _grouped(ov_cells)
    seen = set()
    for r in q.coverage_rows(b.store, rid):
        seen.add(r["name"])
        c, present, total, w = _row_cells(by_overload.get(r["name"], {}), col)
        link, flags = aten(r["name"])
        rows.append([link, "ATen", ov_classes.get(r["name"], []), r["state"] or "",
                     total or (r["samples"] or 0), w, *c, [], present, flags])
        n_aten += 1
    for name in sorted(set(by_overload) - seen):
        c, present, total, w = _row_cells(by_overload[name], col)
        link, flags = aten(name)
        rows.append([link, "ATen", ov_classes.get(name, []), "exercised", total, w, *c, [], present, flags])
        n_aten += 1
    return rows, dtypes, n_op, n_aten


def pages(b: BuildScope) -> Iterator[tuple[str, MatrixPage]]:
    rows, dtypes, _, n_aten = _rows(b)
    n_op = qc.opinfo_ops(b.store, b.info.op_run["id"]) if b.info.op_run else 0
    columns = [{"key": "op", "label": "op", "kind": "link"},
               {"key": "kind", "label": "kind", "kind": "text"},
               {"key": "classes", "label": "classes", "kind": "list"},
               {"key": "state", "label": "coverage", "kind": "text"},
               {"key": "samples", "label": "samples", "kind": "int"},
               {"key": "worst", "label": "worst", "kind": "status"},
               *({"key": f"dtype:{d}", "label": d, "kind": "cell"} for d in dtypes),
               {"key": "contracts", "label": "failed contracts", "kind": "list", "hidden": True},
               {"key": "statuses", "label": "statuses", "kind": "list", "hidden": True},
               {"key": "lists", "label": "lists", "kind": "list", "hidden": True}]
    filters = [{"col": 1, "label": "kind", "mode": "eq"},
               {"col": len(columns) - 2, "label": "has status", "mode": "has"},
               {"col": len(columns) - 1, "label": "overload", "mode": "has"},
               {"col": len(columns) - 3, "label": "fails contract", "mode": "has", "cells": 3},
               {"col": 2, "label": "class", "mode": "has"},
               {"col": 3, "label": "coverage", "mode": "eq"}]
    info = b.info
    yield f"{info.slug}/matrix.html", MatrixPage(
        **b.base(f"Op × dtype: {info.build}", "../", "matrix.html"), info=info, dtypes=dtypes,
        n_opinfo=n_op, n_aten=n_aten, table_json=table_spec(columns, dumps(rows), filters=filters, id="matrix", sticky=True),
        n_fallback=len(b.overloads("fallback")), n_failing=len(b.overloads("failing")))
