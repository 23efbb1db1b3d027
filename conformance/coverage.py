"""Coverage: every ATen overload ends in exactly one state for a run.

``exercised`` (with counts of samples that reached it, natively or through fallback, their
statuses and dtypes), or not exercised with a reason from a fixed vocabulary. Computed from the
run's stored results (what the target actually dispatched) and the registry's classes — never
from a build manifest.

Example (shell): ``conformance ops --coverage RUN_ID --db results/opdb.sqlite``
"""

from __future__ import annotations

import collections
import json
from collections.abc import Iterable
from dataclasses import dataclass, field

import click

from opdb import Store

from . import catalog
from .verdict import FAILING, Status

# The fixed vocabulary, in the order a reason is chosen.
STATES = {
    "exercised": "reached by at least one sample on the target",
    "composite_implicit": "never reaches a backend: it decomposes first (its decomposition's ops are covered instead)",
    "no_cpu_kernel": "no CPU (or composite) kernel, so there is no reference to compare with",
    "layout": "needs a layout the target lacks (sparse, quantized, nested, mkldnn)",
    "random": "random op with no distribution check reaching it yet",
    "ledger": "excluded by the ledger",
    "no_valid_input": "no valid input found",
}
LAYOUTS = ("sparse", "quantized", "nested", "mkldnn")


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
    return {"backward": "backward", "schema": "schema"}.get(variant, "opinfo")


def _accumulate(rows: Iterable[dict]) -> tuple[dict[str, _Acc], dict[str, str]]:
    acc: dict[str, _Acc] = collections.defaultdict(_Acc)
    tried: dict[str, str] = {}
    for r in rows:
        if r["variant"] == "schema" and r["status"] == Status.SKIP.value:
            tried[r["op"]] = r["error"] or ""
        native = set(json.loads(r["native_ops"] or "[]"))
        fallback = set(json.loads(r["fallback_ops"] or "[]"))
        reached = set(json.loads(r["reached_ops"] or "[]")) | native | fallback
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


def classify_unreached(o: catalog.Overload, tried: dict[str, str], excluded: dict[str, str]) -> tuple[str, str]:
    if o.has("composite_implicit"):
        return "composite_implicit", ""
    if o.has("no_cpu_kernel"):
        return "no_cpu_kernel", ""
    layouts = [c for c in LAYOUTS if o.has(c)]
    if layouts:
        return "layout", ", ".join(layouts)
    if o.name in excluded:
        return "ledger", excluded[o.name]
    if o.has("random"):
        return "random", ""
    if o.name in tried:
        detail = tried[o.name]
        if "Could not run" in detail and "'CPU' backend" in detail:
            # the CPU has no dense kernel after all (only sparse/quantized/... ones)
            return "no_cpu_kernel", detail
        return "no_valid_input", detail
    return "no_valid_input", "no OpInfo sample reaches it and schema-driven generation did not run in this run"


def compute(store: Store, run_id: str, excluded: dict[str, str] | None = None) -> dict[str, int]:
    """Write the run's coverage table; returns counts per state."""
    rows = store.db.query(
        "select variant, dtype, status, native_ops, fallback_ops, reached_ops, op, error "
        "from op_results where run_id = ?", [run_id])
    acc, tried = _accumulate(rows)
    out = []
    counts: collections.Counter[str] = collections.Counter()
    for o in catalog.overloads():
        a = acc.get(o.name)
        if a is not None:
            state, detail = "exercised", ""
        else:
            state, detail = classify_unreached(o, tried, excluded or {})
        counts[state] += 1
        a = a or _Acc()
        out.append({"run_id": run_id, "name": o.name, "state": state, "detail": detail, "samples": a.samples,
                    "native_samples": a.native, "fallback_samples": a.fallback, "failing_samples": a.failing,
                    "statuses": dict(a.statuses), "dtypes": sorted(a.dtypes), "sources": sorted(a.sources)})
    store.insert("coverage", out, replace=True)
    return dict(counts)


def backend_reachable(o: catalog.Overload) -> bool:
    return not (o.has("composite_implicit") or o.has("no_cpu_kernel"))


def print_table(store: Store, run_id: str) -> int:
    """Print the coverage table of a stored run; returns an exit code."""
    from opdb.queries import coverage_rows

    run = store.get_run(run_id)
    if run is None:
        raise click.UsageError(f"{store.path}: no run with id {run_id!r}")
    rows = coverage_rows(store, run_id)
    if not rows:
        compute(store, run_id)
        rows = coverage_rows(store, run_id)
    by_name = {o.name: o for o in catalog.overloads()}
    state_counts = collections.Counter(r["state"] for r in rows)
    click.echo(f"coverage of run {run_id} ({run['target']} build {run['build']}): {len(rows)} overloads")
    click.echo(f"{'state':<22}{'overloads':>10}  meaning")
    for state, meaning in STATES.items():
        click.echo(f"{state:<22}{state_counts.get(state, 0):>10}  {meaning}")
    reach = [r for r in rows if r["state"] not in ("composite_implicit", "no_cpu_kernel")]
    ex = sum(r["state"] == "exercised" for r in reach)
    no_layout = [r for r in reach if not any(by_name[r["name"]].has(c) for c in LAYOUTS)]
    ex2 = sum(r["state"] == "exercised" for r in no_layout)
    click.echo(f"backend-reachable overloads exercised: {ex}/{len(reach)} ({100 * ex / max(1, len(reach)):.1f}%); "
               f"excluding layout-specific: {ex2}/{len(no_layout)} ({100 * ex2 / max(1, len(no_layout)):.1f}%)")
    click.echo(f"{'class':<20}{'overloads':>10}{'exercised':>10}{'native':>8}{'fallback':>9}{'failing':>8}")
    for cls in catalog.CLASSES:
        members = [r for r in rows if r["name"] in by_name and by_name[r["name"]].has(cls)]
        exercised = [r for r in members if r["state"] == "exercised"]
        click.echo(f"{cls:<20}{len(members):>10}{len(exercised):>10}"
                   f"{sum(r['native_samples'] > 0 for r in exercised):>8}"
                   f"{sum(r['fallback_samples'] > 0 for r in exercised):>9}"
                   f"{sum(r['failing_samples'] > 0 for r in exercised):>8}")
    return 0
