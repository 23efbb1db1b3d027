"""First bad build: for each finding the gate counts as failing (``regression``, ``worsened``,
``drift``), the
earliest build from which the item has been in the candidate's bad state without a break.

Only stored runs are read: nothing is re-run. An older build whose runs lack the item leaves its
state unknown, and the evidence says so ("unknown before X: run R lacks the item") instead of
guessing; re-running older builds to fill such a gap is not done here.

**Which runs.** The finished runs of the candidate's target whose build is older than the
candidate's. Builds are ordered by their names' version order (:class:`packaging.version.Version`)
when every build name of the target parses as a version, otherwise by start time (each build's
earliest finished run of the target); ``evidence["first_bad_order"]`` says which. The baseline
run stands for its own build; any other build is stood for by its latest finished run holding
the item (op runs and model runs of a build hold different items).

**Bad state** (the candidate's):

* a status regression: a status at least as severe as the candidate's (:func:`opdb.status.severity`);
* a contract regression (still ``contract``, failing contracts it passed): a more severe status,
  or ``contract`` failing every contract the candidate newly failed;
* a model whose recompiles grew: a status at least as severe with at least as many recompiles;
* drift / worsened: the build's errors of the op x variant x dtype (of the model item) already
  moved from the baseline's, by the gate's own numerics test (:func:`conformance.gate.numerics.numerics`,
  :func:`conformance.gate.numerics.model_numerics`; the same category).

**The walk.** From the candidate back through the older builds, newest first: a bad build extends
the streak, the first build that is not bad ends it, and so does a build with no run holding the
item (then ``first_bad_unknown`` says so). The first bad build is the earliest build of the
streak (the candidate's own build when the build before it is not bad). A baseline of the
candidate's own build (the same build gated twice) had the item good, so it ends the walk at once.

**Evidence** added to each failing finding: ``first_bad_build``, ``first_bad_run`` (the run that
stands for it), ``history`` (``[build, status]`` oldest first, the candidate last, at most
:data:`HISTORY` builds; ``None``: no run of that build holds the item; for drift the status is
the category or ``no change``), ``first_bad_order`` and, where the walk hit a gap,
``first_bad_unknown``.

The store is read with two queries per gate (its runs, then the statuses of every failing item in
them, :func:`opdb.queries.item_history`), plus one for numerics findings; never one per finding.

Example::

    >>> from conformance.gate.first_bad import order_builds
    >>> order_builds({"2.9.0": "2026-12-02", "2.10.0": "2026-12-01"})
    (['2.9.0', '2.10.0'], 'version')
    >>> order_builds({"nightly-b": "2026-12-02", "nightly-a": "2026-12-03"})
    (['nightly-b', 'nightly-a'], 'start time')
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

from packaging.version import InvalidVersion, Version

from opdb import Store
from opdb.queries import finished_runs, group_errors, item_history
from opdb.status import FAILS_GATE, NUMERICS, Status, severity

from .numerics import model_numerics, numerics

if TYPE_CHECKING:
    from .finding import Finding

HISTORY = 12  # builds kept in a finding's history (the newest, the candidate last)


def order_builds(starts: dict[str, str]) -> tuple[list[str], str]:
    """Build names oldest first, by version when every name parses as one, else by start time
    (``starts``: each build's earliest start); and which of the two orders was used."""
    try:
        versions = {b: Version(b) for b in starts}
    except InvalidVersion:
        return sorted(starts, key=lambda b: (starts[b], b)), "start time"
    return sorted(starts, key=lambda b: (versions[b], b)), "version"


def _contracts(text: Any) -> set[str]:
    return {n.strip() for n in str(text or "").split(",") if n.strip()}


def _bad(f: Finding, row: dict[str, Any]) -> bool:
    """Whether a stored row of the finding's item is already in the candidate's bad state."""
    sev, want = severity(row["status"]), severity(f.candidate)
    if sev > want:
        return True
    if sev < want:
        return False
    if "new_contracts" in f.evidence and row["status"] == Status.CONTRACT.value:
        return set(f.evidence["new_contracts"]) <= _contracts(row.get("contract_failed"))
    if "recompiles" in f.evidence:
        return (row.get("recompiles") or 0) >= (f.evidence["recompiles"][1] or 0)
    return True


def _last(history: list[list[Any]]) -> list[list[Any]]:
    """The newest :data:`HISTORY` entries (the walk itself reads every older build)."""
    return history[-HISTORY:]


def _walk(states: list[tuple[str, str, bool | None]], candidate: dict[str, Any]) -> dict[str, Any]:
    """``states``: (build, run id, bad?) oldest first, ``None`` for unknown; the candidate not included."""
    first_build, first_run, unknown = candidate["build"], candidate["id"], None
    for build, run_id, bad in reversed(states):
        if bad is None:
            unknown = f"unknown before {first_build}: run {run_id} (build {build}) lacks the item"
            break
        if not bad:
            break
        first_build, first_run = build, run_id
    out = {"first_bad_build": first_build, "first_bad_run": first_run}
    if unknown:
        out["first_bad_unknown"] = unknown
    return out


def annotate(store: Store, baseline: dict[str, Any], candidate: dict[str, Any], findings: list[Finding]) -> None:
    """Add the first bad build to the evidence of every failing finding (see the module docstring)."""
    failing = [f for f in findings if f.category in FAILS_GATE]
    if not failing:
        return
    runs = finished_runs(store, target=candidate["target"])  # newest first
    starts: dict[str, str] = {}
    for r in runs:
        starts[r["build"]] = min(starts.get(r["build"], r["started_at"] or ""), r["started_at"] or "")
    starts.setdefault(candidate["build"], candidate["started_at"] or "")
    builds, how = order_builds(starts)
    older = builds[:builds.index(candidate["build"])]
    if baseline["build"] == candidate["build"]:
        older = []  # a run of the candidate's own build had the item good: the streak starts at the candidate
    by_build: dict[str, list[dict[str, Any]]] = defaultdict(list)  # latest run first
    before = set(older)
    for r in runs:
        if r["build"] in before and r["id"] != candidate["id"]:
            by_build[r["build"]].append(r)
    if baseline["build"] in by_build and baseline["target"] == candidate["target"]:
        by_build[baseline["build"]] = [baseline]
    older = [b for b in older if by_build.get(b)]
    run_ids = [r["id"] for b in older for r in by_build[b]]

    items = [f for f in failing if f.category not in NUMERICS or f.kind == "model"]
    rows = {(r["run_id"], r["item_key"]): r for r in item_history(store, run_ids, [f.item_key for f in items])}
    for f in items:
        states, history = [], []
        for b in older:
            hit = next((r for r in by_build[b] if (r["id"], f.item_key) in rows), None)
            if hit is None:
                states.append((b, by_build[b][0]["id"], None))
                history.append([b, None])
                continue
            row = rows[(hit["id"], f.item_key)]
            if f.category in NUMERICS:  # a model's error growth: the gate's own test against the baseline
                base = rows.get((baseline["id"], f.item_key))
                states.append((b, hit["id"], hit["id"] != baseline["id"] and base is not None and any(
                    x.category == f.category for x in [model_numerics(f.item_key, base, row)] if x is not None)))
                history.append([b, row["status"]])
                continue
            states.append((b, hit["id"], _bad(f, row)))
            history.append([b, row["status"]])
        f.evidence.update(_walk(states, candidate), history=_last([*history, [candidate["build"], f.candidate]]),
                          first_bad_order=how)

    numerics = [f for f in failing if f.category in NUMERICS and f.kind != "model"]
    if numerics:
        _numerics_history(store, baseline, candidate, numerics, older, by_build, how)


def _numerics_history(store: Store, baseline: dict[str, Any], candidate: dict[str, Any], drifts: list[Finding],
                      older: list[str], by_build: dict[str, list[dict[str, Any]]], how: str) -> None:
    """Drift and worsening are properties of a group's errors: a build is bad when the gate's
    numerics test finds its errors moved from the baseline's the same way (the baseline itself
    never is)."""
    groups = {(f.name, f.variant, f.dtype) for f in drifts}
    grouped: dict[str, dict[tuple[str, str, str], dict[str, dict[str, Any]]]] = defaultdict(lambda: defaultdict(dict))
    ids = [r["id"] for b in older for r in by_build[b]] + [baseline["id"]]
    for r in group_errors(store, ids, [g[0] for g in groups]):
        g = (r["op"], r["variant"], r["dtype"])
        if g in groups:
            grouped[r["run_id"]][g][r["item_key"]] = r
    for f in drifts:
        g = (f.name, f.variant, f.dtype)
        base = grouped[baseline["id"]][g]
        states, history = [], []
        for b in older:
            hit = next((r for r in by_build[b] if grouped[r["id"]][g]), None)
            if hit is None:
                states.append((b, by_build[b][0]["id"], None))
                history.append([b, None])
                continue
            bad = hit["id"] != baseline["id"] and any(
                x.category == f.category for x in numerics(base, grouped[hit["id"]][g]))
            states.append((b, hit["id"], bad))
            history.append([b, f.category if bad else "no change"])
        f.evidence.update(_walk(states, candidate), history=_last([*history, [candidate["build"], f.category]]),
                          first_bad_order=how)
