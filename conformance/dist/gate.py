"""The gate's distributed section: items of the latest dist runs of two builds compared, per
collective, with each regression's first bad build.

A **regression** is an item that passes on the baseline and fails on the candidate (mismatch,
error, crash, timeout); an **improvement** the other way round; an item the baseline lacks that
fails is **new failing**. Regressions fail the gate. The first bad build of a regression is the
earliest build, walking back from the candidate through the older builds' latest dist runs, from
which the item has failed without a break (a build with no dist run holding the item ends the walk
as ``unknown``).

Example::

    >>> from opdb import Store
    >>> from opdb import dist as db
    >>> st = Store.memory()
    >>> for rid, build, status in (("a", "2.32.0", "pass"), ("b", "2.33.0", "mismatch")):
    ...     db.start(st, {"id": rid, "target": "t", "build": build, "config": "{}"})
    ...     _ = db.record(st, [{"run_id": rid, "item_key": "all_reduce|sum|bfloat16|3|vector",
    ...                         "collective": "all_reduce", "status": status}])
    ...     db.finish(st, rid, "finished")
    >>> s = dist_section(st, "t", "2.33.0", "2.32.0")
    >>> s.lines()[0]
    'distributed (t 2.33.0 against 2.32.0): 1 regression in all_reduce (1), 0 improvements, 0 new failing'
    >>> s.regressions[0]["first_bad_build"]
    '2.33.0'
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from opdb import Store
from opdb import dist as db

PASSING = ("pass", "skip")


def _order(builds: set[str]) -> list[str]:
    from packaging.version import InvalidVersion, Version

    try:
        return sorted(builds, key=Version)
    except InvalidVersion:
        return sorted(builds)


@dataclass
class DistSection:
    baseline: dict[str, Any]
    candidate: dict[str, Any]
    regressions: list[dict[str, Any]] = field(default_factory=list)
    improvements: list[dict[str, Any]] = field(default_factory=list)
    new_failing: list[dict[str, Any]] = field(default_factory=list)

    def per_collective(self) -> Counter:
        return Counter(r["collective"] for r in self.regressions)

    def lines(self) -> list[str]:
        per = self.per_collective()
        n = len(self.regressions)
        out = [f"distributed ({self.candidate['target']} {self.candidate['build']} against {self.baseline['build']}): "
               f"{n} regression{'s' * (n != 1)}"
               + (" in " + ", ".join(f"{c} ({k})" for c, k in per.most_common()) if per else "")
               + f", {len(self.improvements)} improvements, {len(self.new_failing)} new failing"]
        for r in self.regressions[:20]:
            out.append(f"  regression  {r['item_key']}: pass -> {r['status']}"
                       + (f", first bad build {r['first_bad_build']}" if r.get("first_bad_build") else "")
                       + (f" ({r['first_bad_unknown']})" if r.get("first_bad_unknown") else "")
                       + (f": {r['error']}"[:200] if r.get("error") else ""))
        return out

    def as_json(self) -> dict[str, Any]:
        keep = ("item_key", "collective", "reduce_op", "dtype", "world_size", "shape", "status", "error",
                "first_bad_build", "first_bad_unknown")
        return {"baseline_run": self.baseline["id"], "candidate_run": self.candidate["id"],
                "per_collective": dict(self.per_collective()),
                "regressions": [{k: r.get(k) for k in keep} for r in self.regressions],
                "improvements": [r["item_key"] for r in self.improvements],
                "new_failing": [r["item_key"] for r in self.new_failing]}


def dist_section(store: Store, target: str, build: str, baseline_build: str) -> DistSection | None:
    """The section for gating ``build`` against ``baseline_build`` (None: either has no finished dist run)."""
    cand, base = db.latest(store, target, build), db.latest(store, target, baseline_build)
    if cand is None or base is None:
        return None
    before = db.statuses(store, [base["id"]])[base["id"]]
    section = DistSection(baseline=base, candidate=cand)
    for row in db.results(store, cand["id"]):
        was = before.get(row["item_key"])
        bad = row["status"] not in PASSING
        if was is None:
            if bad:
                section.new_failing.append(row)
        elif was in PASSING and bad:
            section.regressions.append(row)
        elif was not in PASSING and not bad:
            section.improvements.append(row)
    _first_bad(store, target, cand, section.regressions)
    return section


def _first_bad(store: Store, target: str, candidate: dict[str, Any], found: list[dict[str, Any]]) -> None:
    builds = _order({r["build"] for r in db.runs(store, target) if r["status"] == "finished"})
    older = builds[:builds.index(candidate["build"])] if candidate["build"] in builds else []
    runs = [db.latest(store, target, b) for b in older]
    states = db.statuses(store, [r["id"] for r in runs if r])
    for f in found:
        first = candidate["build"]
        for build, run in zip(reversed(older), reversed(runs), strict=True):
            status = states.get(run["id"], {}).get(f["item_key"]) if run else None
            if status is None:
                f["first_bad_unknown"] = f"unknown before {first}: no dist run of {build} holds the item"
                break
            if status in PASSING:
                break
            first = build
        f["first_bad_build"] = first
