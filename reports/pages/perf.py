"""``<build>/perf.html``: the build's op, model-graph and decode-step latency against its baseline
build, from the latest finished perf run that measured it (``conformance perf``): the confirmed
regressions and improvements with their intervals and first bad build, each with its p50 across
every build the database measured; the slowest items; and p50/p99 of every item at every size (a
decode item's size is its prompt bucket, ``b32``), filterable.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

from opdb import perf as db

from ..charts import line_chart
from ..contexts import PerfPage, PerfRegression
from ..html import dumps, table_spec
from ..scope import BuildScope

TEMPLATE = "perf.html"
CONTEXT = PerfPage
PER_BUILD = True
NAV = ("perf.html", "Perf")
SLOWEST = 20
COLUMNS = (("kind", "kind", "text"), ("subject", "op / model", "text"), ("dtype", "dtype", "text"),
           ("shape", "size / bucket", "text"), ("signature", "inputs", "text"), ("p50", "p50 (us)", "num"),
           ("p99", "p99 (us)", "num"), ("base_p50", "baseline p50 (us)", "num"), ("ratio", "ratio", "num"),
           ("low", "low", "num"), ("high", "high", "num"), ("verdict", "verdict", "text"),
           ("status", "status", "text"), ("error", "error", "pre"))


def _us(v: float | None) -> float | None:
    return None if v is None else round(v * 1e6, 2)


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def _machine(run: dict[str, Any]) -> str:
    try:
        m = json.loads(run.get("machine") or "{}")
    except ValueError:
        return ""
    start, end = m.get("start", {}), m.get("end", {})
    return (f"{start.get('cpu', '?')}, {start.get('cores', '?')} cores, load {start.get('load', '?')} at the start"
            + (f" and {end.get('load')} at the end" if end else ""))


def pages(b: BuildScope) -> Iterator[tuple[str, PerfPage]]:
    info = b.info
    build = info.run_build or info.build
    run = db.latest(b.store, info.target, build)
    base = b.base(f"Performance: {info.build}", "../", "perf.html")
    if run is None:
        yield f"{info.slug}/perf.html", PerfPage(**base, info=info, run=None, machine="", confidence="", counts=[], regressions=[],
                                                 improvements=[], slowest=table_spec([], "[]"),
                                                 items=table_spec([], "[]"))
        return
    rows = db.results(b.store, run["id"])
    counts = Counter(r["verdict"] if r["status"] == "ok" else r["status"] for r in rows)
    found = [r for r in rows if r["status"] == "ok" and r["verdict"] in ("regression", "improvement")
             and r.get("confirmed") != 0]
    history = db.p50_history(b.store, info.target, [r["item_key"] for r in found])
    builds = sorted({bb for h in history.values() for bb in h}, key=_version_key)
    chosen = {"regression": [], "improvement": []}
    for r in sorted(found, key=lambda r: -abs(r["ratio"] - 1)):
        h = history.get(r["item_key"], {})
        chart = line_chart([("p50 (us)", [_us(h.get(x)) for x in builds])], builds,
                           title=f"{r['subject']} {r['dtype']} {r['shape']}: p50 per build", y_label="us", y_min=0,
                           highlight=builds.index(build) if build in builds else None, width=420, height=180)
        chosen[r["verdict"]].append(PerfRegression(
            item=f"{r['kind']} {r['subject']} {r['dtype']} {r['shape']}", signature=r["signature"] or "",
            ratio=r["ratio"], low=r["low"], high=r["high"], base_p50_us=_us(r["base_p50"]) or 0.0,
            p50_us=_us(r["p50"]) or 0.0, first_bad=_first_bad(b, info.target, run, r), chart=chart))
    columns = [{"key": k, "label": label, "kind": kind} for k, label, kind in COLUMNS]
    table = [[r["kind"], r["subject"], r["dtype"], r["shape"], r["signature"] or "", _us(r["p50"]), _us(r["p99"]),
              _us(r["base_p50"]), _r(r["ratio"]), _r(r["low"]), _r(r["high"]), r["verdict"] or "", r["status"],
              r["error"] or ""] for r in rows]
    slow = sorted((t for t in table if t[5] is not None), key=lambda t: -t[5])[:SLOWEST]
    filters = [{"col": 0, "label": "kind", "mode": "eq"}, {"col": 2, "label": "dtype", "mode": "eq"},
               {"col": 3, "label": "size", "mode": "eq"}, {"col": 11, "label": "verdict", "mode": "eq"}]
    yield f"{info.slug}/perf.html", PerfPage(
        **base, info=info, run=run, machine=_machine(run), confidence=_confidence(run),
        counts=sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])),
        regressions=chosen["regression"], improvements=chosen["improvement"],
        slowest=table_spec(columns, dumps(slow), id="perf-slowest"),
        items=table_spec(columns, dumps(table), id="perf-items", filters=filters))


def _confidence(run: dict[str, Any]) -> str:
    try:
        return f"{100 * float(json.loads(run.get('config') or '{}').get('confidence', 0.95)):.0f}%"
    except (ValueError, TypeError):
        return "95%"


def _version_key(name: str) -> tuple[Any, ...]:
    from packaging.version import InvalidVersion, Version

    try:
        return (0, Version(name), name)
    except InvalidVersion:
        return (1, name, name)


def _first_bad(b: BuildScope, target: str, run: dict[str, Any], row: dict[str, Any]) -> str:
    if row["verdict"] != "regression":
        return ""
    sections = b.memo(f"perf-section:{run['id']}", lambda: _section(b, target, run))
    f = sections.get(row["item_key"], {})
    return f.get("first_bad_build") or f.get("first_bad_unknown") or ""


def _section(b: BuildScope, target: str, run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    from opdb.perf import first_bad

    regs = [dict(r) for r in db.findings(b.store, run["id"]) if r["verdict"] == "regression"]
    first_bad(b.store, target, run["baseline_build"], run["build"], regs)
    return {r["item_key"]: r for r in regs}
