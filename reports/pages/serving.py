"""``<build>/serving.html``: will this build serve my causal LM? The generation lane's items
(``conformance run --generate hf``: greedy decoding on the target against the CPU, per model x
dtype x mode x prompt-length bucket) of the build's latest run holding any:

- a summary: models, buckets, items per status, and the near-tie flips counted over every item
  (a near tie does not fail an item, but it is counted, never hidden);
- per dtype and mode, a matrix of models x buckets: each cell coloured by the item's status, showing
  its agreement (share of sequences identical to the CPU's) and its flips, its tooltip every figure;
- every item with its figures (agreement, flips, the CPU's margin at the divergence and its bound,
  the log-likelihood shift and its bound, prefill and decode times beside the CPU's, recompiles,
  fallback ops, the first divergent op): a JS table, filterable and searchable;
- what changed for serving in this build: the items both builds decoded whose status got worse
  (a skip on either side is no comparison) or whose agreement dropped, with both builds' decode p99
  beside them for scale. The two runs were timed apart, on a machine that may have been loaded
  differently, so a p99 ratio here is no verdict: a slower decode step is the perf lane's to call,
  both builds timed paired and interleaved (``conformance perf --decode``, the Perf page).

Example::

    >>> before = [{"model_id": "hf.llama", "dtype": "float32", "mode": "eager", "bucket": 8, "status": "pass",
    ...            "agreement": 1.0, "decode_p99_ms": 2.0}]
    >>> after = [dict(before[0], status="mismatch", agreement=0.75, decode_p99_ms=9.0)]
    >>> [what for what, _, _ in changes(before, after)]
    [['status', 'agreement']]
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

from opdb import gen as db
from opdb.status import ordered, severity, worst

from ..contexts import Link
from ..contexts_serving import ServingMatrix, ServingPage
from ..html import dumps, table_spec
from ..scope import BuildScope

TEMPLATE = "serving.html"
CONTEXT = ServingPage
PER_BUILD = True
NAV = ("serving.html", "Serving")
Key = tuple[str, str, str, int]

ITEM_COLUMNS = (("model", "model", "text"), ("dtype", "dtype", "text"), ("mode", "mode", "text"),
                ("bucket", "bucket (tokens)", "int"), ("status", "status", "status"),
                ("agreement", "agreement %", "num"), ("near_tie_flips", "near-tie flips", "int"),
                ("wide_flips", "wide flips", "int"), ("first_divergence", "first divergent token", "int"),
                ("margin", "CPU margin there", "num"), ("margin_tol", "near-tie bound", "num"),
                ("loglik_shift", "log-lik. shift (nats/token)", "num"), ("loglik_tol", "its bound", "num"),
                ("prefill_ms", "prefill ms", "num"), ("decode_p50_ms", "decode p50 ms", "num"),
                ("decode_p99_ms", "decode p99 ms", "num"), ("cpu_decode_p50_ms", "CPU decode p50 ms", "num"),
                ("recompiles", "recompiles", "int"), ("fallback_ops", "CPU fallback ops", "list"),
                ("first_divergent_op", "first divergent op", "text"), ("error", "error", "pre"),
                ("item", "item", "text"))
ITEM_FILTERS = [{"col": 1, "label": "dtype", "mode": "eq"}, {"col": 2, "label": "mode", "mode": "eq"},
                {"col": 4, "label": "status", "mode": "eq"}, {"col": 3, "label": "bucket", "mode": "eq"},
                {"col": 18, "label": "fallback op", "mode": "has"}]
DIFF_COLUMNS = (("changes", "what got worse", "list"), ("model", "model", "text"), ("dtype", "dtype", "text"),
                ("mode", "mode", "text"), ("bucket", "bucket (tokens)", "int"),
                ("before", "previous build", "status"), ("after", "this build", "status"),
                ("agreement_before", "agreement % before", "num"), ("agreement", "agreement %", "num"),
                ("p99_before", "decode p99 ms before", "num"), ("p99", "decode p99 ms", "num"),
                ("p99_ratio", "p99 ratio", "num"), ("first_divergent_op", "first divergent op", "text"),
                ("error", "error", "pre"))


def key_of(row: dict[str, Any]) -> Key:
    return (row["model_id"], row["dtype"], row["mode"], int(row["bucket"] or 0))


def status_worse(before: str | None, after: str | None) -> bool:
    """Whether an item's status got worse (a skip on either side is no comparison)."""
    if not before or not after or "skip" in (before, after):
        return False
    return severity(after) > severity(before)


def changes(before: Iterable[dict[str, Any]], after: Iterable[dict[str, Any]]) \
        -> list[tuple[list[str], dict[str, Any], dict[str, Any]]]:
    """(what got worse, before, after) for the items both builds decoded that got worse: ``status``,
    ``agreement`` (dropped). Timings are no reason (see the module doc)."""
    old = {key_of(r): r for r in before}
    out = []
    for a in sorted(after, key=key_of):
        b = old.get(key_of(a))
        if b is None:
            continue
        what = []
        if status_worse(b["status"], a["status"]):
            what.append("status")
        if b.get("agreement") is not None and a.get("agreement") is not None and a["agreement"] < b["agreement"]:
            what.append("agreement")
        if what:
            out.append((what, b, a))
    return out


def _pct(share: float | None) -> float | None:
    return None if share is None else round(100.0 * share, 1)


def _g(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _list(text: str | None) -> list[str]:
    try:
        value = json.loads(text or "[]")
    except ValueError:
        return []
    return [str(v) for v in value] if isinstance(value, list) else []


def _parameters(row: dict[str, Any]) -> int | None:
    try:
        n = (json.loads(row.get("params") or "{}") or {}).get("parameters")
    except (ValueError, AttributeError):
        return None
    return n if isinstance(n, int) else None


def cell_text(r: dict[str, Any]) -> str:
    """What a matrix cell says: the agreement and the flips; an item that decoded nothing, its status."""
    if r.get("agreement") is None:
        return r["status"]
    flips = [f"{n} {what}" for n, what in ((r.get("wide_flips"), "wide"), (r.get("near_tie_flips"), "near-tie")) if n]
    return " · ".join([f"{_pct(r['agreement']):g}%", *flips])


def describe(r: dict[str, Any]) -> str:
    """A matrix cell's tooltip: every figure of the item."""
    parts = [f"{r['model_id']} {r['dtype']} {r['mode']}, {r['bucket']} tokens: {r['status']}"]
    if r.get("agreement") is not None:
        parts.append(f"agreement {_pct(r['agreement']):g}% of {r.get('prompts') or '?'} sequences; "
                     f"{r.get('near_tie_flips') or 0} near-tie flips, {r.get('wide_flips') or 0} wide")
    if r.get("first_divergence") is not None:
        parts.append(f"first divergence at new token {r['first_divergence']}"
                     + (f": CPU margin {_g(r['margin'])} vs near-tie bound {_g(r['margin_tol'])}"
                        if r.get("margin") is not None else ""))
    if r.get("loglik_shift") is not None:
        parts.append(f"log-likelihood shift {_g(r['loglik_shift'])} nats/token (bound {_g(r.get('loglik_tol'))})")
    if r.get("decode_p50_ms") is not None:
        parts.append(f"prefill {_g(r.get('prefill_ms'))} ms; decode p50 {_g(r['decode_p50_ms'])} ms, "
                     f"p99 {_g(r.get('decode_p99_ms'))} ms (CPU p50 {_g(r.get('cpu_decode_p50_ms'))} ms)")
    if r.get("recompiles") is not None:
        parts.append(f"{r['recompiles']} recompiles ({r.get('graphs')} graphs so far)")
    if fallback := _list(r.get("fallback_ops")):
        parts.append("CPU fallback: " + ", ".join(fallback))
    if r.get("first_divergent_op"):
        parts.append(f"first divergent op {r['first_divergent_op']}")
    if r.get("error"):
        parts.append(str(r["error"])[:300])
    return "\n".join(parts)


def matrices(rows: list[dict[str, Any]]) -> list[ServingMatrix]:
    """One matrix per dtype x mode: a row per model, a cell per bucket (its status, tooltip, sequences,
    ``[status]`` for the status filter, the link that shows the item in the items table, its text)."""
    out = []
    for dtype, mode in sorted({(r["dtype"], r["mode"]) for r in rows}, key=lambda dm: (dm[0], dm[1] != "eager")):
        mine = [r for r in rows if (r["dtype"], r["mode"]) == (dtype, mode)]
        buckets = sorted({int(r["bucket"] or 0) for r in mine})
        by_model: dict[str, dict[int, dict[str, Any]]] = {}
        for r in mine:
            by_model.setdefault(r["model_id"], {})[int(r["bucket"] or 0)] = r
        table = []
        for model in sorted(by_model):
            cells = by_model[model]
            first = next(iter(cells.values()))
            line = [[cells[b]["status"], describe(cells[b]), cells[b].get("prompts"), [cells[b]["status"]],
                     f"#{cells[b]['item_key']}", cell_text(cells[b])] if b in cells else None for b in buckets]
            statuses = sorted({c["status"] for c in cells.values()})
            table.append([model, _parameters(first), first.get("cache") or "", worst(statuses), *line, statuses])
        columns = [{"key": "model", "label": "model", "kind": "text"},
                   {"key": "parameters", "label": "parameters", "kind": "int"},
                   {"key": "cache", "label": "KV cache", "kind": "text"},
                   {"key": "worst", "label": "worst", "kind": "status"},
                   *({"key": f"bucket:{b}", "label": f"{b} tokens", "kind": "cell"} for b in buckets),
                   {"key": "statuses", "label": "statuses", "kind": "list", "hidden": True}]
        anchor = f"m-{dtype}-{mode}"
        filters = [{"col": len(columns) - 1, "label": "has status", "mode": "has", "cells": 3}]
        out.append(ServingMatrix(dtype, mode, anchor, ordered(dict(Counter(r["status"] for r in mine))),
                                 table_spec(columns, dumps(table), id=anchor, filters=filters)))
    return out


def _item_row(r: dict[str, Any]) -> list[Any]:
    return [r["model_id"], r["dtype"], r["mode"], r["bucket"], r["status"], _pct(r.get("agreement")),
            r.get("near_tie_flips"), r.get("wide_flips"), r.get("first_divergence"), r.get("margin"),
            r.get("margin_tol"), r.get("loglik_shift"), r.get("loglik_tol"), r.get("prefill_ms"),
            r.get("decode_p50_ms"), r.get("decode_p99_ms"), r.get("cpu_decode_p50_ms"), r.get("recompiles"),
            _list(r.get("fallback_ops")), r.get("first_divergent_op"), r.get("error"), r["item_key"]]


def _diff_row(what: list[str], b: dict[str, Any], a: dict[str, Any]) -> list[Any]:
    p0, p1 = b.get("decode_p99_ms"), a.get("decode_p99_ms")
    return [what, a["model_id"], a["dtype"], a["mode"], a["bucket"], b["status"], a["status"],
            _pct(b.get("agreement")), _pct(a.get("agreement")), p0, p1,
            round(p1 / p0, 3) if p0 and p1 is not None else None, a.get("first_divergent_op"), a.get("error")]


def _spec(columns: tuple[tuple[str, str, str], ...], rows: list[list[Any]], **extra: Any) -> Any:
    return table_spec([{"key": k, "label": label, "kind": kind} for k, label, kind in columns], dumps(rows), **extra)


def pages(b: BuildScope) -> Iterator[tuple[str, ServingPage]]:
    info = b.info
    base = b.base(f"Serving: {info.build}", "../", "serving.html")
    run = db.build_run(b.store, info.target, info.run_build or info.build)
    rows = db.results(b.store, run["id"]) if run else []
    prev = b.previous()
    diff: list[list[Any]] = []
    if run is None:
        note = ""
    elif prev is None:
        note = "This is the target's first build: no previous build to compare with."
    elif (prev_run := db.build_run(b.store, prev.target, prev.run_build or prev.build)) is None:
        note = f"The previous build ({prev.build}) has no generation run to compare with."
    else:
        note = ""
        diff = [_diff_row(*c) for c in changes(db.results(b.store, prev_run["id"]), rows)]
    decoded = [r for r in rows if r.get("agreement") is not None]
    yield f"{info.slug}/serving.html", ServingPage(
        **base, info=info, run=run, n_models=len({r["model_id"] for r in rows}),
        buckets=sorted({int(r["bucket"] or 0) for r in rows}), n_items=len(rows),
        sequences=sum(r.get("prompts") or 0 for r in decoded),
        counts=ordered(dict(Counter(r["status"] for r in rows))),
        near_tie=sum(r.get("near_tie_flips") or 0 for r in rows),
        near_tie_items=sum(1 for r in rows if r.get("near_tie_flips")),
        wide=sum(r.get("wide_flips") or 0 for r in rows), matrices=matrices(rows),
        items=_spec(ITEM_COLUMNS, [_item_row(r) for r in rows], id="serving-items", filters=ITEM_FILTERS,
                    hashFilter=True),
        baseline=Link(f"../{prev.slug}/serving.html", prev.build) if prev and prev.rendered and run else None,
        diff_note=note, n_changed=len(diff),
        diff=_spec(DIFF_COLUMNS, diff, id="serving-diff",
                   filters=[{"col": 0, "label": "what got worse", "mode": "has"},
                            {"col": 2, "label": "dtype", "mode": "eq"}, {"col": 3, "label": "mode", "mode": "eq"}]))
