"""The gate's perf section: what the perf lane found between the gated builds, and each
regression's first bad build.

The section reads the latest finished perf run of the candidate's target that measured the
candidate build against the baseline build (``conformance perf --build C --baseline-build B``);
none is measured here. Only confirmed calls count (a call its re-measure did not repeat is
listed as unconfirmed). Whether perf regressions fail the gate is the caller's flag
(``conformance gate --perf-fails``): by default they are reported and the verdict is the
functional gate's.

**First bad build** of a perf regression between baseline A and candidate C: the perf runs stored
for the build steps in between (each build measured against the one before it, as the nightly's
``--perf`` does) are walked from A; the first step that calls the item a confirmed regression is
its first bad build. With no build between A and C that is C; a step with no stored run leaves it
``unknown`` from there (said, not guessed).

Example::

    >>> from opdb import Store
    >>> from opdb import perf as db
    >>> st = Store.memory()
    >>> db.start(st, {"id": "p", "target": "t", "build": "2", "baseline_build": "1", "config": "{}"})
    >>> _ = db.record(st, [{"run_id": "p", "item_key": "op|mm|float32|small", "kind": "op", "subject": "mm",
    ...                     "dtype": "float32", "shape": "small", "status": "ok", "ratio": 1.5, "low": 1.4,
    ...                     "high": 1.6, "verdict": "regression", "confirmed": 1, "p50": 3e-5, "base_p50": 2e-5}])
    >>> db.finish(st, "p", "finished")
    >>> s = perf_section(st, "t", "2", "1")
    >>> [(r["subject"], r["first_bad_build"]) for r in s.regressions]
    [('mm', '2')]
    >>> s.lines()[0]
    'perf (run p, t 2 against 1): 1 regression, 0 improvements'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from opdb import Store
from opdb import perf as db


@dataclass
class PerfSection:
    run: dict[str, Any]
    regressions: list[dict[str, Any]] = field(default_factory=list)
    improvements: list[dict[str, Any]] = field(default_factory=list)
    unconfirmed: list[dict[str, Any]] = field(default_factory=list)

    def lines(self) -> list[str]:
        r = self.run
        out = [f"perf (run {r['id']}, {r['target']} {r['build']} against {r['baseline_build']}): "
               f"{len(self.regressions)} regression{'s' * (len(self.regressions) != 1)}, "
               f"{len(self.improvements)} improvement{'s' * (len(self.improvements) != 1)}"
               + (f", {len(self.unconfirmed)} not confirmed by a re-measure" if self.unconfirmed else "")]
        for f in (*self.regressions, *self.improvements):
            out.append(f"  {f['verdict']:<11} {f['kind']} {f['subject']} {f['dtype']} {f['shape']}: x{f['ratio']:.2f} "
                       f"[{f['low']:.2f}, {f['high']:.2f}], p50 {f['base_p50'] * 1e6:.1f} -> {f['p50'] * 1e6:.1f} us"
                       + (f", first bad build {f['first_bad_build']}" if f.get("first_bad_build") else "")
                       + (f" ({f['first_bad_unknown']})" if f.get("first_bad_unknown") else ""))
        return out

    def as_json(self) -> dict[str, Any]:
        keep = ("item_key", "kind", "subject", "dtype", "shape", "signature", "ratio", "low", "high", "p50", "p99",
                "base_p50", "base_p99", "first_bad_build", "first_bad_unknown")
        return {"run": self.run["id"], "build": self.run["build"], "baseline_build": self.run["baseline_build"],
                "regressions": [{k: f.get(k) for k in keep} for f in self.regressions],
                "improvements": [{k: f.get(k) for k in keep} for f in self.improvements],
                "unconfirmed": [f["item_key"] for f in self.unconfirmed]}

    def markdown(self) -> str:
        r = self.run
        lines = [f"### Performance ({r['build']} against {r['baseline_build']}, run `{r['id']}`)", ""]
        if not (self.regressions or self.improvements):
            return "\n".join([*lines, "No confirmed perf change.", ""])
        lines += ["| | item | ratio | interval | p50 before → after | first bad |", "|---|---|---|---|---|---|"]
        for f in (*self.regressions, *self.improvements):
            lines.append(f"| {f['verdict']} | {f['kind']} {f['subject']} {f['dtype']} {f['shape']} | x{f['ratio']:.2f} | "
                         f"[{f['low']:.2f}, {f['high']:.2f}] | {f['base_p50'] * 1e6:.1f} → {f['p50'] * 1e6:.1f} us | "
                         f"{f.get('first_bad_build') or f.get('first_bad_unknown') or ''} |")
        return "\n".join([*lines, ""])


def perf_section(store: Store, target: str, build: str, baseline_build: str) -> PerfSection | None:
    """The perf section for gating ``build`` against ``baseline_build`` on ``target`` (None when no
    perf run measured that pair)."""
    run = db.latest(store, target, build, baseline_build)
    if run is None:
        return None
    section = PerfSection(run=run)
    for row in db.results(store, run["id"]):
        if row["status"] != "ok":
            continue
        if row.get("confirmed") == 0:
            section.unconfirmed.append(row)
        elif row["verdict"] == "regression":
            section.regressions.append(row)
        elif row["verdict"] == "improvement":
            section.improvements.append(row)
    section.regressions.sort(key=lambda r: -r["ratio"])
    section.improvements.sort(key=lambda r: r["ratio"])
    db.first_bad(store, target, baseline_build, build, section.regressions)
    return section
