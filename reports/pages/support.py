"""``<build>/support.html``: will my model run on this build? One support class per model x dtype,
by library and architecture family, every model with its fallback ops and first divergent op
(a JS table: filter, sort, search), and the models whose support changed since the previous build.

A model's support class comes from its items (eager and compile), the worst first:

- ``blocked``: an item raised, crashed, hung or was refused on the target (error, crash, timeout,
  unsupported*);
- ``mismatch``: an item ran but disagreed with the CPU (mismatch, contract, xpass);
- ``expected``: an item fails as a ledger entry expects (xfail);
- ``fallbacks``: every item matched the CPU, some op fell back to the CPU (pass_fallback);
- ``ready``: every item matched the CPU with every op native (pass);
- ``skipped``: every item was a skip: the library could not give the architecture here (over the
  parameter budget, failed to build, inputs not buildable) or it failed on the CPU itself; the
  reason is the library's own.

The library is the model id's prefix for the zoo (``hf``, ``timm``, ``tv``) and ``harness`` for the
families the harness writes itself; the architecture family is the zoo spec's ``arch_family`` (the
harness family's name otherwise). Distinct graphs count the distinct structural hashes of the ATen
graph; distinct architectures count them with sizes blanked (``tracing.topology_hash``: variants
that differ only in width or image size are one); a model make_fx could not trace counts as its own.

Example::

    >>> support_of(["pass", "pass_fallback"]), support_of(["pass", "mismatch"]), support_of(["skip", "skip"])
    ('fallbacks', 'mismatch', 'skipped')
    >>> worse("ready", "mismatch"), worse("skipped", "blocked"), worse("blocked", "ready")
    (True, False, False)
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from typing import Any

from ..contexts import Link, SupportPage, SupportRow
from ..html import dumps, table_spec
from ..scope import BuildScope
from .family import families

TEMPLATE = "support.html"
CONTEXT = SupportPage
PER_BUILD = True
NAV = ("support.html", "Model support")

# support classes, best first; `skipped` says nothing about the target and ranks apart
SUPPORT = ("ready", "fallbacks", "expected", "mismatch", "blocked", "skipped")
_RANK = {"ready": 0, "fallbacks": 1, "expected": 2, "mismatch": 3, "blocked": 4}
_OF_STATUS = {"pass": "ready", "pass_fallback": "fallbacks", "xfail": "expected", "mismatch": "mismatch",
              "contract": "mismatch", "xpass": "mismatch", "structural": "ready"}
ZOO_LIBRARIES = ("hf", "timm", "tv")
HARNESS = "harness"


def support_of(statuses: Iterable[str]) -> str:
    """The support class of one model x dtype from its items' statuses (module doc)."""
    return worst([_OF_STATUS.get(s, "skipped" if s == "skip" else "blocked") for s in statuses if s])


def worst(classes: Iterable[str]) -> str:
    """The worst support class (``skipped`` only when every one is)."""
    ranked = [c for c in classes if c != "skipped"]
    return max(ranked, key=_RANK.__getitem__) if ranked else "skipped"


def worse(before: str, after: str) -> bool:
    """Whether support got worse (a skip on either side is no comparison)."""
    return before in _RANK and after in _RANK and _RANK[after] > _RANK[before]


def library_of(model_id: str) -> str:
    lib = model_id.split(".", 1)[0]
    return lib if lib in ZOO_LIBRARIES else HARNESS


def _params(row: dict[str, Any]) -> dict[str, Any]:
    try:
        return json.loads(row.get("params") or "{}") or {}
    except ValueError:
        return {}


def _json_list(text: str | None) -> list[str]:
    try:
        value = json.loads(text or "[]")
    except ValueError:
        return []
    return [str(v) for v in value] if isinstance(value, list) else []


def models(rows: Iterable[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """(model id, dtype) -> its support record, from a model run's rows."""
    by: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by[(r["model_id"], r["dtype"])].append(r)
    out = {}
    for (mid, dtype), items in by.items():
        params = next((p for p in map(_params, items) if p), {})
        support = support_of(r["status"] for r in items)
        fallback = sorted({op for r in items for op in _json_list(r.get("fallback_ops"))})
        divergent = next((r["first_divergent_op"] for r in items if r.get("first_divergent_op")), None)
        reasons = [r["error"] for r in items if r.get("error") and r["status"] not in ("pass", "pass_fallback")]
        out[(mid, dtype)] = {
            "model_id": mid, "dtype": dtype, "library": library_of(mid), "support": support,
            "arch_family": str(params.get("arch_family") or items[0].get("family") or "-"),
            "modes": {r["mode"]: r["status"] for r in items}, "fallback_ops": fallback,
            "first_divergent_op": divergent, "reason": reasons[0][:300] if reasons else None,
            "graph_hash": next((r["graph_hash"] for r in items if r.get("graph_hash")), None),
            "topology": params.get("graph_topology"),
            "row_id": items[0]["id"]}
    return out


def summary(records: Iterable[dict[str, Any]]) -> list[SupportRow]:
    """Per library: models, distinct graphs and the support counts."""
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by[r["library"]].append(r)
    rows = []
    for lib in sorted(by, key=lambda x: (x == HARNESS, x)):
        recs = by[lib]
        ids = {r["model_id"] for r in recs}
        ran = [r for r in recs if r["support"] != "skipped"]
        hashes = {r["graph_hash"] or f"unhashed:{r['model_id']}" for r in ran}
        shapes = {r["topology"] or r["graph_hash"] or f"unhashed:{r['model_id']}" for r in ran}
        per_model: dict[str, list[str]] = defaultdict(list)
        for r in recs:  # a model's class over its dtypes: the worst
            per_model[r["model_id"]].append(r["support"])
        counts = Counter(worst(c) for c in per_model.values())
        rows.append(SupportRow(library=lib, models=len(ids), graphs=len(hashes), topologies=len(shapes),
                               counts=[(c, counts[c]) for c in SUPPORT if counts[c]]))
    return rows


MATRIX_COLUMNS = [{"key": "library", "label": "library", "kind": "text"},
                  {"key": "family", "label": "architecture family", "kind": "text"},
                  {"key": "models", "label": "models × dtypes", "kind": "int"},
                  *({"key": c, "label": c, "kind": "int"} for c in SUPPORT)]
MODEL_COLUMNS = [{"key": "model", "label": "model", "kind": "link"},
                 {"key": "library", "label": "library", "kind": "text"},
                 {"key": "family", "label": "architecture family", "kind": "text"},
                 {"key": "dtype", "label": "dtype", "kind": "text"},
                 {"key": "support", "label": "support", "kind": "text"},
                 {"key": "eager", "label": "eager", "kind": "status"},
                 {"key": "compile", "label": "compile", "kind": "status"},
                 {"key": "fallback_ops", "label": "CPU fallback ops", "kind": "text"},
                 {"key": "first_divergent_op", "label": "first divergent op", "kind": "text"},
                 {"key": "reason", "label": "reason", "kind": "text"},
                 {"key": "graph", "label": "graph", "kind": "text"}]
MODEL_FILTERS = [{"col": 4, "label": "support", "mode": "eq"}, {"col": 1, "label": "library", "mode": "eq"},
                 {"col": 2, "label": "family", "mode": "eq"}, {"col": 3, "label": "dtype", "mode": "eq"}]
DIFF_COLUMNS = [{"key": "change", "label": "change", "kind": "text"},
                {"key": "model", "label": "model", "kind": "link"},
                {"key": "library", "label": "library", "kind": "text"},
                {"key": "dtype", "label": "dtype", "kind": "text"},
                {"key": "before", "label": "previous build", "kind": "text"},
                {"key": "after", "label": "this build", "kind": "text"},
                {"key": "first_divergent_op", "label": "first divergent op", "kind": "text"},
                {"key": "reason", "label": "reason", "kind": "text"}]


def changes(before: dict[tuple[str, str], dict[str, Any]],
            after: dict[tuple[str, str], dict[str, Any]]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(``broke`` | ``fixed``, before, after) for the models both builds ran whose support changed."""
    out = []
    for key in sorted(set(before) & set(after)):
        b, a = before[key], after[key]
        if worse(b["support"], a["support"]):
            out.append(("broke", b, a))
        elif worse(a["support"], b["support"]):
            out.append(("fixed", b, a))
    return sorted(out, key=lambda t: (t[0] != "broke", t[2]["model_id"], t[2]["dtype"]))


def _links(b: BuildScope) -> dict[int, str]:
    """Model result row id -> the graph card's link (relative to the build folder)."""
    return {c.id: f"models/{name}#{c.anchor}" for fam in families(b) for name, chunk in fam.parts() for c in chunk}


def pages(b: BuildScope) -> Iterator[tuple[str, SupportPage]]:
    info = b.info
    records = models(b.model_rows())
    links = _links(b)
    cells: dict[tuple[str, str], Counter] = defaultdict(Counter)
    for r in records.values():
        cells[(r["library"], r["arch_family"])][r["support"]] += 1
    matrix = [[lib, fam, sum(c.values()), *(c[s] for s in SUPPORT)] for (lib, fam), c in sorted(cells.items())]
    table = [[[links.get(r["row_id"], ""), r["model_id"]], r["library"], r["arch_family"], r["dtype"], r["support"],
              r["modes"].get("eager"), r["modes"].get("compile"), ", ".join(r["fallback_ops"][:8])
              + (f" (+{len(r['fallback_ops']) - 8})" if len(r["fallback_ops"]) > 8 else ""),
              r["first_divergent_op"], r["reason"], (r["graph_hash"] or "")[:12]]
             for r in sorted(records.values(), key=lambda r: (r["library"], r["arch_family"], r["model_id"], r["dtype"]))]
    base, diff, diff_note = b.previous(), [], ""
    if base is None or not base.model_run:
        diff_note = "No previous build with a model run to compare with."
    elif not info.model_run:
        diff_note = "This build has no model run."
    else:
        before = models(_rows_of(b, base.model_run["id"]))
        for change, bef, aft in changes(before, records):
            diff.append([change, [links.get(aft["row_id"], ""), aft["model_id"]], aft["library"], aft["dtype"],
                         bef["support"], aft["support"], aft["first_divergent_op"], aft["reason"]])
    yield f"{info.slug}/support.html", SupportPage(
        **b.base(f"Model support: {info.build}", "../", "support.html"), info=info,
        summary=summary(records.values()), n_models=len({r["model_id"] for r in records.values()}),
        baseline=Link(f"../{base.slug}/support.html", base.build) if base and base.rendered else None,
        n_broke=sum(1 for d in diff if d[0] == "broke"), n_fixed=sum(1 for d in diff if d[0] == "fixed"),
        diff_note=diff_note,
        matrix_json=table_spec(MATRIX_COLUMNS, dumps(matrix), id="support-matrix",
                               filters=[{"col": 0, "label": "library", "mode": "eq"}]),
        models_json=table_spec(MODEL_COLUMNS, dumps(table), filters=MODEL_FILTERS, id="support-models"),
        diff_json=table_spec(DIFF_COLUMNS, dumps(diff), id="support-diff",
                             filters=[{"col": 0, "label": "change", "mode": "eq"}]))


def _rows_of(b: BuildScope, run_id: str) -> list[dict[str, Any]]:
    from opdb import queries_report as q

    return q.model_rows(b.store, run_id)
