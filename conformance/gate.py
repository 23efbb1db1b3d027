"""Gate: did the candidate build get worse than the baseline?

A regression is an item whose status got worse (by :data:`~conformance.verdict.SEVERITY`,
e.g. pass -> mismatch, or native pass -> pass_fallback), an op x variant x dtype whose error grew
significantly while still inside tolerance (a one-sided sign test over its paired samples with a
minimum effect size, so noise does not trip it), or a model whose recompiles grew. Before a
status regression is declared its items are re-run K times on the candidate with the same seeds:
items that do not fail every time are reported as flaky (and stored as such), not as regressions.
Runs whose canaries failed (status ``infra``) are refused. Decisions are stored in
``gate_items`` so the report's build diff shows exactly what the gate decided.

Example (shell): ``conformance gate --db results/opdb.sqlite --baseline 2.32.0 --candidate 2.33.0``
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from opdb import Store
from opdb.queries import gate_pairs, latest_run, results_by_key
from opdb.store import now

from .verdict import SEVERITY, Status

MIN_EFFECT = 2.0  # median error ratio that counts as drift
DRIFT_P = 0.01  # one-sided sign-test p-value
MIN_PAIRS = 5
ERR_FLOOR = 1e-12
_PASSED = (Status.PASS.value, Status.PASS_FALLBACK.value)
_SEV = {s.value: v for s, v in SEVERITY.items()}


class GateError(ValueError):
    """The gate cannot compare (unknown run/build, unfinished or infra run)."""


@dataclass
class Finding:
    category: str  # regression | improvement | flaky | new | removed | drift
    kind: str  # op | model | drift
    item_key: str
    name: str
    variant: str
    dtype: str
    baseline: str
    candidate: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        key = "model" if self.kind == "model" else "op"
        return {"kind": self.kind, key: self.name, "variant": self.variant, "dtype": self.dtype,
                "baseline": self.baseline, "candidate": self.candidate, "evidence": self.evidence,
                "item_key": self.item_key}


@dataclass
class GateResult:
    baseline: dict[str, Any]
    candidate: dict[str, Any]
    findings: list[Finding] = field(default_factory=list)
    verdict: str = "pass"  # pass | fail | infra

    def of(self, category: str) -> list[Finding]:
        return [f for f in self.findings if f.category == category]

    def as_json(self) -> dict[str, Any]:
        return {"baseline": self.baseline["id"], "candidate": self.candidate["id"],
                "regressions": [f.as_json() for f in self.findings if f.category in ("regression", "drift")],
                "improvements": [f.as_json() for f in self.of("improvement")],
                "flaky": [f.as_json() for f in self.of("flaky")],
                "new": [f.as_json() for f in self.of("new")], "removed": [f.as_json() for f in self.of("removed")],
                "verdict": self.verdict}


def resolve(store: Store, ref: str, *, target: str | None = None) -> dict[str, Any]:
    """A run id, or a build name (its latest run)."""
    run = store.get_run(ref)
    if run is None:
        run = latest_run(store, build=ref, target=target)
    if run is None:
        known = sorted({r["build"] for r in store.runs()})
        raise GateError(f"{store.path}: {ref!r} is neither a run id nor a build with runs (builds: {', '.join(known)})")
    return run


def _check(run: dict[str, Any]) -> None:
    if run["status"] == "infra":
        raise GateError(f"run {run['id']} (build {run['build']}) failed its canaries (infra); refusing to compare it")
    if run["status"] not in ("finished",):
        raise GateError(f"run {run['id']} (build {run['build']}) is {run['status']}, not finished; resume or merge it first")


_COLUMNS = {
    "op_results": ("op", "variant", "dtype", "status", "error", "max_abs_err", "max_rel_err", "fallback_ops"),
    "model_results": ("model_id", "mode", "dtype", "status", "error", "max_abs_err", "max_rel_err",
                      "fallback_ops", "first_divergent_op", "recompiles"),
}


def _rows(store: Store, run_id: str, table: str) -> dict[str, dict[str, Any]]:
    return results_by_key(store, run_id, table, _COLUMNS[table])


def _sev(status: str) -> int:
    return _SEV[status]


def sign_test_p(greater: int, n: int) -> float:
    """One-sided binomial sign test: P(X >= greater) for X ~ Binomial(n, 1/2)."""
    return sum(math.comb(n, k) for k in range(greater, n + 1)) / 2**n


def _drift(base: dict[str, dict[str, Any]], cand: dict[str, dict[str, Any]]) -> list[Finding]:
    pairs: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for key, b in base.items():
        c = cand.get(key)
        if c is None or b["status"] != c["status"] or b["status"] not in _PASSED:
            continue
        be, ce = b.get("max_rel_err"), c.get("max_rel_err")
        if be is None or ce is None:
            continue
        pairs[(b["op"], b["variant"], b["dtype"])].append((ce + ERR_FLOOR) / (be + ERR_FLOOR))
    out = []
    for (op, variant, dtype), ratios in sorted(pairs.items()):
        changed = [r for r in ratios if r != 1.0]
        if len(changed) < MIN_PAIRS:
            continue
        med = statistics.median(ratios)
        greater = sum(r > 1 for r in changed)
        p = sign_test_p(greater, len(changed))
        if med >= MIN_EFFECT and p < DRIFT_P:
            out.append(Finding("drift", "drift", f"{op}|{variant}|{dtype}|*", op, variant, dtype, "pass", "pass",
                               {"median_error_ratio": med, "p_value": p, "samples": len(ratios),
                                "worse_samples": greater}))
    return out


def compare_runs(store: Store, baseline: dict[str, Any], candidate: dict[str, Any]) -> list[Finding]:
    """Findings before flake confirmation."""
    findings: list[Finding] = []
    for table, kind in (("op_results", "op"), ("model_results", "model")):
        base, cand = _rows(store, baseline["id"], table), _rows(store, candidate["id"], table)
        for key in sorted(set(base) | set(cand)):
            b, c = base.get(key), cand.get(key)
            ref = c or b
            assert ref is not None
            name = ref.get("op") or ref.get("model_id") or key.split("|")[0]
            variant = ref.get("variant") or ref.get("mode") or ""
            if b is None or c is None:
                cat = "new" if b is None else "removed"
                findings.append(Finding(cat, kind, key, name, variant, ref["dtype"], b["status"] if b else "",
                                        c["status"] if c else ""))
                continue
            if b["status"] == c["status"] and kind == "op":
                continue  # the common case, decided without building anything
            sb, sc = _sev(b["status"]), _sev(c["status"])
            if sc > sb:
                evidence = {k: c.get(k) for k in ("error", "max_abs_err", "max_rel_err", "fallback_ops",
                                                  "first_divergent_op") if c.get(k) not in (None, "", "[]")}
                findings.append(Finding("regression", kind, key, name, variant, c["dtype"], b["status"], c["status"],
                                        evidence))
            elif sc < sb:
                findings.append(Finding("improvement", kind, key, name, variant, c["dtype"], b["status"], c["status"]))
            elif kind == "model" and (c.get("recompiles") or 0) > (b.get("recompiles") or 0):
                findings.append(Finding("regression", kind, key, name, variant, c["dtype"], b["status"], c["status"],
                                        {"recompiles": [b.get("recompiles"), c.get("recompiles")]}))
        if kind == "op":
            findings.extend(_drift(base, cand))
    return findings


def confirm(findings: list[Finding], candidate: dict[str, Any], attempts: int,
            rerun: Callable[[dict[str, Any], list[str], int], dict[str, list[str]]] | None = None) -> None:
    """Re-run status regressions ``attempts`` times; those that do not fail every time become flaky."""
    todo = [f for f in findings if f.category == "regression" and "recompiles" not in f.evidence]
    if not todo or attempts <= 0:
        return
    rerun = rerun or _rerun
    statuses = rerun(candidate, [f.item_key for f in todo], attempts)
    for f in todo:
        seen = statuses.get(f.item_key, [])
        still_bad = [s for s in seen if _sev(s) > _sev(f.baseline)]
        f.evidence["reruns"] = seen
        if len(still_bad) < attempts:
            f.category = "flaky"


def _rerun(candidate: dict[str, Any], keys: list[str], attempts: int) -> dict[str, list[str]]:
    from .run import rerun_items, spec_from_run

    spec = spec_from_run(candidate, workers=2)
    return rerun_items(spec, candidate["id"], keys, attempts)


def run_gate(store: Store, baseline_ref: str, candidate_ref: str, *, attempts: int = 3,
             rerun: Callable[[dict[str, Any], list[str], int], dict[str, list[str]]] | None = None) -> GateResult:
    candidate = resolve(store, candidate_ref)
    baseline = resolve(store, baseline_ref, target=candidate["target"])
    for run in (baseline, candidate):
        _check(run)
    if baseline["id"] == candidate["id"]:
        raise GateError(f"baseline and candidate are the same run ({baseline['id']})")
    findings = compare_runs(store, baseline, candidate)
    confirm(findings, candidate, attempts, rerun)
    result = GateResult(baseline, candidate, findings)
    result.verdict = "fail" if any(f.category in ("regression", "drift") for f in findings) else "pass"
    _store(store, result)
    return result


def _store(store: Store, result: GateResult) -> None:
    b, c = result.baseline["id"], result.candidate["id"]
    decided = now()
    # One marker row says the gate judged this pair, even when it found nothing.
    marker = {"baseline_run": b, "candidate_run": c, "category": "verdict", "kind": "gate", "item_key": "*",
              "op": "", "variant": "", "dtype": "", "baseline": result.baseline["build"],
              "candidate": result.verdict, "evidence": {"counts": {cat: len(result.of(cat)) for cat in
                                                                   ("regression", "drift", "flaky", "improvement")}},
              "decided_at": decided}
    store.replace_gate_decisions(b, c, [marker] + [
        {"baseline_run": b, "candidate_run": c, "category": f.category, "kind": f.kind, "item_key": f.item_key,
         "op": f.name, "variant": f.variant, "dtype": f.dtype, "baseline": f.baseline, "candidate": f.candidate,
         "evidence": f.evidence, "decided_at": decided} for f in result.findings])
    flaky = [f for f in result.findings if "reruns" in f.evidence]
    store.insert("flakes", [{"run_id": c, "item_key": f.item_key, "kind": f.kind, "attempts": len(f.evidence["reruns"]),
                             "failures": sum(_sev(s) > _sev(f.baseline) for s in f.evidence["reruns"]),
                             "statuses": f.evidence["reruns"], "verdict": "flaky" if f.category == "flaky" else "confirmed",
                             "recorded_at": now()} for f in flaky], replace=True)


# -- renderings -------------------------------------------------------------------------
def summary_lines(result: GateResult) -> list[str]:
    b, c = result.baseline, result.candidate
    lines = [f"gate {b['build']} ({b['id']}) -> {c['build']} ({c['id']}): {result.verdict.upper()}"]
    for cat in ("regression", "drift", "flaky", "improvement", "new", "removed"):
        lines.append(f"  {cat:<12}{len(result.of(cat)):>7}")
    pairs = defaultdict(int)
    for f in result.findings:
        if f.category in ("regression", "drift"):
            pairs[(f.name, f.variant, f.dtype, f.baseline, f.candidate)] += 1
    for (name, variant, dtype, before, after), n in sorted(pairs.items())[:50]:
        lines.append(f"  REGRESSION {name} [{variant}, {dtype}] {before} -> {after} ({n} items)")
    return lines


def markdown(result: GateResult) -> str:
    b, c = result.baseline, result.candidate
    out = [f"## Gate: {_md(b['build'])} → {_md(c['build'])} — **{result.verdict}**", "",
           "| category | items |", "|---|---|"]
    out += [f"| {cat} | {len(result.of(cat))} |" for cat in ("regression", "drift", "flaky", "improvement", "new", "removed")]
    regs = [f for f in result.findings if f.category in ("regression", "drift")]
    if regs:
        out += ["", "| kind | op/model | variant | dtype | baseline | candidate |", "|---|---|---|---|---|---|"]
        out += [f"| {_md(f.kind)} | `{_md_code(f.name)}` | {_md(f.variant)} | {_md(f.dtype)} | {_md(f.baseline)} "
                f"| {_md(f.candidate)} |" for f in regs[:500]]
    return "\n".join(out) + "\n"


def _md(text: Any) -> str:
    """Stored text as inert Markdown: no HTML, no markup, no table-cell or line breaks."""
    return re.sub(r"([\\`*_{}\[\]()#+!|~<>&])", r"\\\1", " ".join(str(text).split()))


def _md_code(text: Any) -> str:
    # Inside a code span HTML and markup are literal; only a backtick (ends it) and a pipe (ends
    # the table cell) need care.
    return " ".join(str(text).split()).replace("`", "'").replace("|", "\\|")


def junit(result: GateResult) -> str:
    regs = [f for f in result.findings if f.category in ("regression", "drift")]
    flaky = result.of("flaky")
    cases = []
    for f in regs:
        msg = f"{f.baseline} -> {f.candidate}: {json.dumps(f.evidence, default=str)[:2000]}"
        cases.append(f'<testcase classname={quoteattr(f.kind + "." + f.name)} name={quoteattr(f.item_key)}>'
                     f'<failure message={quoteattr(f.baseline + " -> " + f.candidate)}>{escape(msg)}</failure></testcase>')
    for f in flaky:
        cases.append(f'<testcase classname={quoteattr(f.kind + "." + f.name)} name={quoteattr(f.item_key)}>'
                     f'<skipped message="flaky: {escape(str(f.evidence.get("reruns")))}"/></testcase>')
    cases.append('<testcase classname="gate" name="no-regressions"/>' if not regs else "")
    return (f'<?xml version="1.0" encoding="utf-8"?>\n<testsuite name="conformance-gate" tests="{len(cases)}" '
            f'failures="{len(regs)}" skipped="{len(flaky)}">{"".join(cases)}</testsuite>\n')


def nightly_gate(db_path: str, run_ids: Sequence[str], echo: Callable[[str], None]) -> int:
    """Gate each run against the previous one; returns the worst exit code."""
    worst = 0
    with Store.open(db_path) as store:
        for base, cand in zip(run_ids, run_ids[1:], strict=False):
            try:
                result = run_gate(store, base, cand)
            except GateError as exc:
                echo(f"gate {base} -> {cand}: INFRA: {exc}")
                worst = 2
                continue
            for line in summary_lines(result):
                echo(line)
            worst = max(worst, 1 if result.verdict == "fail" else 0)
    return worst


__all__ = ["GateError", "GateResult", "Finding", "run_gate", "resolve", "gate_pairs", "markdown", "junit",
           "nightly_gate", "summary_lines", "sign_test_p"]
