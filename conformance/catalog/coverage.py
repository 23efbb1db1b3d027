"""Coverage: every ATen overload ends in exactly one state for a run.

``exercised`` (with counts of samples that reached it, natively or through fallback, their
statuses and dtypes), or not exercised with a reason from a fixed vocabulary. Computed from the
run's stored results (what the target actually dispatched) and the catalog's classes — never
from a build manifest.

The denominator, the backend-reachable overloads (every state but :data:`UNREACHABLE`), is a
fact of the torch build alone: ``composite_implicit`` and ``no_cpu_kernel`` come from the
catalog's classes (the registry, and the CPU-reference facts shipped per torch release), before
anything a run reached or searched, so a run with the schema search, one without it and the
nightly count the same overloads and differ only in how many of them they exercised.

Example (shell): ``conformance ops --coverage RUN_ID --db results/opdb.sqlite``
"""

from __future__ import annotations

import collections
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from opdb import Store
from opdb.queries import coverage_rows, op_evidence
from opdb.status import FAILING, Status

from . import overloads as catalog

# The fixed vocabulary, in the order a reason is chosen.
STATES = {
    "exercised": "reached by at least one sample on the target",
    "composite_implicit": "never reaches a backend: it decomposes first (its decomposition's ops are covered instead)",
    "no_cpu_kernel": "no CPU kernel (or a composite whose CPU path calls an op without one), so no reference",
    "layout": "needs a layout the target lacks (sparse, quantized, nested, mkldnn), as probed on the target",
    "random": "random op with no distribution check reaching it yet",
    "ledger": "excluded by the ledger",
    "no_valid_input": "no valid input found",
}
#: the states a backend cannot be asked for, decided by the catalog alone (opdb.queries_counts.UNREACHABLE)
UNREACHABLE = ("composite_implicit", "no_cpu_kernel")
LAYOUTS = ("sparse", "quantized", "nested", "mkldnn")
# what a CPU rejection of strided inputs says when the overload needs another layout
_NEEDS = (
    ("sparse_csr", re.compile(r"compressed|sparse ?csr|sparse_csr|bsr|bsc|csc", re.I)),
    ("sparse", re.compile(r"sparse", re.I)),
    ("quantized", re.compile(r"quantized|qint|quint|qscheme", re.I)),
    ("nested", re.compile(r"nested", re.I)),
    ("mkldnn", re.compile(r"mkldnn|onednn", re.I)),
)


@dataclass
class _Acc:
    samples: int = 0
    native: int = 0
    fallback: int = 0
    failing: int = 0
    statuses: collections.Counter[str] = field(default_factory=collections.Counter)
    dtypes: set[str] = field(default_factory=set)
    sources: set[str] = field(default_factory=set)


def _source(variant: str) -> str:
    return {"backward": "backward", "schema": "schema", "traced": "traced"}.get(variant, "opinfo")


def _accumulate(rows: Iterable[dict]) -> tuple[dict[str, _Acc], dict[str, str]]:
    acc: dict[str, _Acc] = collections.defaultdict(_Acc)
    tried: dict[str, str] = {}
    for r in rows:
        if r["variant"] == "schema" and r["status"] == Status.SKIP.value:
            tried[r["op"]] = r["error"] or ""
        native = set(json.loads(r["native_ops"] or "[]"))
        fallback = set(json.loads(r["fallback_ops"] or "[]"))
        reached = set(json.loads(r["reached_ops"] or "[]")) | native | fallback
        if r["variant"] == "schema" and r["status"] != Status.SKIP.value:
            # a schema-driven item calls exactly its overload with target tensors: it ran there
            # (or crashed or hung there) even when the device handled it above any dispatch mode
            reached.add(r["op"])
        failing = Status(r["status"]) in FAILING
        for name in reached:
            a = acc[name]
            a.samples += 1
            a.native += name in native
            a.fallback += name in fallback
            a.failing += failing
            a.statuses[r["status"]] += 1
            a.dtypes.add(r["dtype"])
            a.sources.add(_source(r["variant"]))
    return acc, tried


NO_CPU_FILE = "conformance/data/no_cpu_reference.toml"
_NO_CPU = re.compile(r"Could not run '(aten::[\w.]+)' with arguments from the 'CPU' backend")


def needed_layout(o: catalog.Overload, detail: str) -> str | None:
    """The layout an overload needs, from the CPU's rejections of strided inputs (or, with no
    rejections recorded, from the dispatch keys it has kernels for)."""
    if detail:
        text = re.sub(r"\(steered by[^)]*\)", "", detail)  # the rejections, not the generator's own notes
        for layout, pat in _NEEDS:
            if pat.search(text) and ("layout" in text or "tensor" in text or "backend" in text):
                return layout
        return None
    layouts = [c for c in LAYOUTS if o.has(c)]
    return layouts[0] if layouts else None


def unreachable(o: catalog.Overload) -> str | None:
    """``composite_implicit`` or ``no_cpu_kernel`` when the catalog says a backend cannot be asked
    for the overload (or compared on it), whatever a run reached: such an overload is outside
    every run's denominator, even where a sample happened to dispatch it on the target."""
    return next((state for state in UNREACHABLE if o.has(state)), None)


def classify_unreached(o: catalog.Overload, tried: dict[str, str], excluded: dict[str, str],
                       layouts: dict[str, str | None] | None = None) -> tuple[str, str]:
    """The reason an overload no sample reached, from the fixed vocabulary. ``layouts`` is the
    run's probe of the target (layout -> None when the target holds it, else its error)."""
    state = unreachable(o)
    if state is not None:
        return state, ""
    if o.name in excluded:
        return "ledger", excluded[o.name]
    if o.has("random"):
        return "random", ""
    detail = tried.get(o.name, "")
    need = None
    inner = _NO_CPU.search(detail)
    if inner:
        # the op it calls has no strided CPU kernel: it needs another layout if the CPU has a
        # kernel for one (a sparse-only op behind an out= wrapper), else there is no reference.
        # That is learned once per torch release into the catalog (no_cpu_kernel above), never
        # from this run's search: a run that did not search the overload would count it otherwise.
        need = catalog.cpu_layout_kernel(inner.group(1))
        if need is None:
            return "no_valid_input", (f"{detail} (the CPU has no kernel for {inner.group(1)}, and "
                                      f"{NO_CPU_FILE} does not list it for this torch: "
                                      "tools/no_cpu_reference.py makes it)")
    need = need or needed_layout(o, detail)
    if need is not None:
        if layouts is None:
            return "layout", f"{need} (the target's layouts were not probed in this run)"
        probe = layouts.get(need, layouts.get("sparse") if need == "sparse_csr" else None)
        if probe is not None:
            return "layout", f"{need}: the target could not hold one ({probe[:160]})"
        if need in layouts:
            return "no_valid_input", f"needs {need} inputs, which the target holds but the generator does not make"
    if o.name in tried:
        return "no_valid_input", detail
    return "no_valid_input", "no OpInfo sample reaches it and schema-driven generation did not run in this run"


def compute(store: Store, run_id: str, excluded: dict[str, str] | None = None) -> dict[str, int]:
    """Write the run's coverage table; returns counts per state."""
    rows = op_evidence(store, run_id)
    acc, tried = _accumulate(rows)
    run = store.get_run(run_id) or {}
    layouts = json.loads(run.get("config") or "{}").get("layouts")
    out = []
    counts: collections.Counter[str] = collections.Counter()
    for o in catalog.overloads():
        a = acc.get(o.name)
        if a is not None and unreachable(o) is None:
            state, detail = "exercised", ""
        else:
            state, detail = classify_unreached(o, tried, excluded or {}, layouts)
            if a is not None:  # e.g. the device's own _copy_from: its samples stay counted in the row
                detail = f"reached by {a.samples} samples, but outside the denominator: {STATES[state]}"
        counts[state] += 1
        a = a or _Acc()
        out.append({"run_id": run_id, "name": o.name, "state": state, "detail": detail, "samples": a.samples,
                    "native_samples": a.native, "fallback_samples": a.fallback, "failing_samples": a.failing,
                    "statuses": dict(a.statuses), "dtypes": sorted(a.dtypes), "sources": sorted(a.sources)})
    store.insert("coverage", out, replace=True)
    return dict(counts)


def reachable_share(counts: dict[str, int]) -> str:
    """'exercised/backend-reachable (pct)' from a run's state counts (reachable: every state but
    composite_implicit and no_cpu_kernel)."""
    reach = sum(counts.values()) - sum(counts.get(s, 0) for s in UNREACHABLE)
    ex = counts.get("exercised", 0)
    return f"{ex}/{reach} ({100 * ex / max(1, reach):.1f}%)"


def stored_rows(store: Store, run_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A stored run and its coverage rows, one per overload (computed first if the run has none)."""
    run = store.get_run(run_id)
    if run is None:
        raise ValueError(f"{store.path}: no run with id {run_id!r}")
    rows = coverage_rows(store, run_id)
    if not rows or _stale(rows):
        compute(store, run_id)
        rows = coverage_rows(store, run_id)
    return run, rows


def _stale(rows: list[dict[str, Any]]) -> bool:
    """Whether stored coverage rows were classified with another catalog (an older harness or
    CPU-reference file): their unreachable overloads, the denominator's complement, differ."""
    now = {o.name for o in catalog.overloads() if unreachable(o)}
    return {r["name"] for r in rows if r["state"] in UNREACHABLE} != now


def json_lines(store: Store, run_id: str) -> Iterator[str]:
    """Every overload's coverage state in a stored run, one JSON object a line: name, state,
    detail, sample counts (all / native / fallback / failing), statuses, dtypes and sources."""
    _, rows = stored_rows(store, run_id)
    for r in rows:
        out = {k: r[k] for k in ("name", "state", "detail", "samples", "native_samples", "fallback_samples",
                                 "failing_samples")}
        out.update({k: json.loads(r[k] or ("{}" if k == "statuses" else "[]"))
                    for k in ("statuses", "dtypes", "sources")})
        yield json.dumps(out, sort_keys=False)


def table_lines(store: Store, run_id: str) -> list[str]:
    """The coverage table of a stored run, as text lines (computed first if the run has none)."""
    run, rows = stored_rows(store, run_id)
    by_name = {o.name: o for o in catalog.overloads()}
    lines: list[str] = []
    state_counts = collections.Counter(r["state"] for r in rows)
    lines.append(f"coverage of run {run_id} ({run['target']} build {run['build']}): {len(rows)} overloads")
    lines.append(f"{'state':<22}{'overloads':>10}  meaning")
    for state, meaning in STATES.items():
        lines.append(f"{state:<22}{state_counts.get(state, 0):>10}  {meaning}")
    reach = [r for r in rows if r["state"] not in UNREACHABLE]
    no_layout = [r for r in reach if not any(by_name[r["name"]].has(c) for c in LAYOUTS)]
    ex2 = sum(r["state"] == "exercised" for r in no_layout)
    lines.append(f"backend-reachable overloads exercised: {reachable_share(dict(state_counts))}; "
               f"excluding layout-specific: {ex2}/{len(no_layout)} ({100 * ex2 / max(1, len(no_layout)):.1f}%)")
    lines.append(f"{'class':<20}{'overloads':>10}{'exercised':>10}{'native':>8}{'fallback':>9}{'failing':>8}")
    for cls in catalog.CLASSES:
        members = [r for r in rows if r["name"] in by_name and by_name[r["name"]].has(cls)]
        exercised = [r for r in members if r["state"] == "exercised"]
        lines.append(f"{cls:<20}{len(members):>10}{len(exercised):>10}"
                   f"{sum(r['native_samples'] > 0 for r in exercised):>8}"
                   f"{sum(r['fallback_samples'] > 0 for r in exercised):>9}"
                   f"{sum(r['failing_samples'] > 0 for r in exercised):>8}")
    return lines
