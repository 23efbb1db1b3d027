"""Gate: did the candidate build get worse than the baseline?

A regression is an item whose status got worse (by :data:`~conformance.check.verdict.SEVERITY`,
e.g. pass -> mismatch, pass -> contract, or native pass -> pass_fallback), an item still at
``contract`` that now fails a contract it passed (its evidence names both sets), or a model whose
recompiles grew. Numerics are judged per op x variant x dtype on the items whose status did not
change, from their error fingerprints (:mod:`conformance.check.fingerprint`; against the CPU's result
where the values pass, the float64 arbiter where they fail:
paired sign tests over fixed element probes of every sample, noise-calibrated, with minimum
effects on the RMS error and the bias over all elements): ``drift`` when the group passed and its
error grew, ``worsened`` when it was already failing and got worse -- both fail the gate, one
finding per group. Runs stored without fingerprints fall back to a sign test on the samples' max
errors (passing items only).

Before status regressions are declared they are confirmed per op x variant x dtype group: up to
:data:`PER_GROUP` representative items of the group are re-run on the candidate with the same
seeds (K times each; once for a timeout or crash, whose re-run costs a whole timeout). A group
whose representatives do not fail every time is flaky as a whole (reported once, as a group);
otherwise all its items are regressions. The whole confirmation has a budget (seconds and
re-runs): a group it cannot afford stays a regression marked ``unconfirmed``. What it spent is
printed and stored with the decision.

Refused (:class:`GateError`, exit 2): a run whose canaries failed (``infra``), a run that never
finished (interrupted, killed, shards missing), a run holding no result items, and two runs whose
selections (ops, dtypes, variants, seed, sample limits, ...) differ, unless the caller asks to
compare only the items both hold (``common_only``). The reference inputs
(:mod:`conformance.sweep.reference`) are no part of the selection: their slice rotates from night
to night, so a ``reference`` item is compared where both runs hold it, and one held by a run whose
op the other run's slice leaves out is neither new nor removed but counted apart
(``GateResult.outside_slice``, "not in both runs' slices"). The dtype probe's items
(:mod:`conformance.sweep.dtypes`) are no part of it either: against a run that probed no dtypes
(stored before the probe, or ``--variants`` without it) they are counted apart too
(``GateResult.unprobed``). Each failing finding's evidence names its first
bad build, from the stored runs of older builds (:mod:`conformance.gate.first_bad`). Decisions are
stored in ``gate_items`` so the report's build diff shows exactly what the gate decided.

Example (shell): ``conformance gate --db results/opdb.sqlite --baseline 2.32.0 --candidate 2.33.0``
"""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from conformance.check.fingerprint import sign_test_p
from conformance.inputs.opinfo import REFERENCE
from conformance.select import DTYPE_PROBE, VARIANTS, in_reference_slice
from conformance.work import ItemKey
from opdb import Store
from opdb.queries import gate_pairs, latest_run, results_by_key
from opdb.status import FAILS_GATE, NUMERICS, PASSED, SEVERITY, UNREPRODUCIBLE, Status
from opdb.store import now

from .finding import Finding
from .limits import CONFIRM_BUDGET_S, MAX_RERUNS
from .numerics import model_numerics, numerics

_PASSED = PASSED
_SEV = SEVERITY

PER_GROUP = 2  # representative items re-run per op x variant x dtype group
_ONCE = (Status.TIMEOUT.value, Status.CRASH.value)  # re-run once: each re-run costs a timeout or a worker
# The run-config keys that say which items a run holds; two runs gate only when these agree.
# The contract checks count too: a run without them has no 'contract' items to lose; so does their
# budget (a run stored before there was one checked every sample: 0).
SELECTION = ("ops", "dtypes", "variants", "seed", "max_samples", "thorough", "opinfo", "schema", "models",
             "model_limit", "model_modes", "zoo_modes", "contracts", "contract_budget", "sizes", "generate",
             "gen_modes", "gen_buckets", "gen_new_tokens")
_SELECTION_DEFAULTS = {"opinfo": True, "schema": False, "thorough": False, "contracts": ["default"], "contract_budget": 0,
                       "sizes": "samples", "zoo_modes": [], "generate": [], "gen_modes": ["compile", "eager"], "gen_buckets": []}


class GateError(ValueError):
    """The gate cannot compare (unknown run/build, unfinished or infra run)."""


@dataclass
class Confirmation:
    """What the flake confirmation did and spent."""

    attempts: int  # K: re-runs per representative (1 for timeouts and crashes)
    budget_s: float
    max_reruns: int
    groups: int = 0  # op x variant x dtype groups with status regressions
    confirmed: int = 0
    flaky: int = 0
    unreproducible: int = 0  # a re-run's CPU reference did not agree with itself: no verdict either way
    unconfirmed: int = 0  # left unconfirmed: the budget ran out (or a re-run returned nothing)
    reruns: int = 0
    timeouts: int = 0  # re-runs that timed out again
    seconds: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("attempts", "budget_s", "max_reruns", "groups", "confirmed", "flaky",
                                              "unreproducible", "unconfirmed", "reruns", "timeouts", "seconds")}

    def line(self) -> str:
        if self.attempts <= 0:
            return f"  confirmation off (--reruns 0): {self.groups} group(s) not re-run"
        return (f"  confirmation: {self.reruns} re-run(s) ({self.timeouts} timed out again) in {self.seconds:.1f} s "
                f"(budget {self.budget_s:g} s, {self.max_reruns} re-runs); groups: {self.confirmed} confirmed, "
                f"{self.flaky} flaky, {self.unreproducible} unreproducible, {self.unconfirmed} unconfirmed")


@dataclass
class GateResult:
    baseline: dict[str, Any]
    candidate: dict[str, Any]
    findings: list[Finding] = field(default_factory=list)
    verdict: str = "pass"  # pass | fail | infra
    confirmation: Confirmation | None = None
    common: dict[str, int] | None = None  # with common_only: compared / only_baseline / only_candidate
    # reference items held by one run only because the other's slice leaves their op out (the slice
    # rotates nightly): not compared, and neither new nor removed
    outside_slice: int = 0
    # dtype-probe items held by one run only because the other run probed no dtypes (stored before
    # the probe existed, or --variants without it): not compared, and neither new nor removed
    unprobed: int = 0
    # error causes (conformance/triage/causes.py): "new" (the candidate's causes the baseline does
    # not have, widest first: key, text, items, ops, dtypes, models, explanation), "gone" (keys)
    causes: dict[str, Any] | None = None

    def of(self, category: str) -> list[Finding]:
        return [f for f in self.findings if f.category == category]

    def flaky_groups(self) -> list[dict[str, Any]]:
        """One entry per flaky op x variant x dtype group (a flaky op is reported once)."""
        groups: dict[tuple[str, str, str, str], list[Finding]] = defaultdict(list)
        for f in self.of("flaky"):
            groups[(f.kind, f.name, f.variant, f.dtype)].append(f)
        out = []
        for (kind, name, variant, dtype), fs in sorted(groups.items()):
            reps = {f.item_key: f.evidence["reruns"] for f in fs if "reruns" in f.evidence}
            out.append({"kind": kind, "op" if kind not in ("model", "generate") else "model": name, "variant": variant,
                        "dtype": dtype, "items": len(fs), "reruns": reps})
        return out

    def as_json(self) -> dict[str, Any]:
        out = {"baseline": self.baseline["id"], "candidate": self.candidate["id"],
               "regressions": [f.as_json() for f in self.findings if f.category in FAILS_GATE],
               "improvements": [f.as_json() for f in self.of("improvement")],
               "flaky": [f.as_json() for f in self.of("flaky")], "flaky_groups": self.flaky_groups(),
               "unreproducible": [f.as_json() for f in self.of("unreproducible")],
               "new": [f.as_json() for f in self.of("new")], "removed": [f.as_json() for f in self.of("removed")],
               "confirmation": self.confirmation.as_json() if self.confirmation else None,
               "verdict": self.verdict}
        if self.common is not None:
            out["common_only"] = self.common
        if self.outside_slice:
            out["reference_outside_slice"] = self.outside_slice
        if self.unprobed:
            out["dtypes_unprobed"] = self.unprobed
        if self.causes is not None:
            out["causes"] = self.causes
        return out


def resolve(store: Store, ref: str, *, target: str | None = None) -> dict[str, Any]:
    """A run id, or a build name (its latest run)."""
    run = store.get_run(ref)
    if run is None:
        run = latest_run(store, build=ref, target=target)
    if run is None:
        known = sorted({r["build"] for r in store.runs()})
        raise GateError(f"{store.path}: {ref!r} is neither a run id nor a build with runs (builds: {', '.join(known)})")
    return run


def _check(store: Store, run: dict[str, Any], role: str) -> None:
    """Refuse a run the gate cannot judge: infra, never finished, or holding no items."""
    what = f"{role} run {run['id']} (build {run['build']})"
    if run["status"] == "infra":
        raise GateError(f"{what} failed its canaries (infra); refusing to compare it")
    if run["status"] == "partial":
        raise GateError(f"{what} is partial: some of its shards are missing; merge all shard databases first")
    if run["status"] != "finished":
        # A killed run on this host reads 'interrupted' (its process is gone); one on another host stays 'running'.
        raise GateError(f"{what} is {run['status']}, not finished (interrupted, killed or still running); "
                        f"finish it with `conformance run --resume {run['id']}` first")
    items = (store.count("op_results", run_id=run["id"]) - store.count("op_results", run_id=run["id"], variant="canary")
             + store.count("model_results", run_id=run["id"]) + store.count("gen_results", run_id=run["id"]))
    if items == 0:
        raise GateError(f"{what} is empty: it holds no result items (canaries aside); refusing to gate it")


def selection(run: dict[str, Any]) -> dict[str, Any]:
    """The run's selection from its stored config, normalised (list order and spelling do not count)."""
    try:
        config = json.loads(run.get("config") or "{}")
    except ValueError:
        raise GateError(f"run {run['id']}: its stored config is not JSON; cannot tell what it selected") from None
    out: dict[str, Any] = {}
    for key in SELECTION:
        v = config.get(key, _SELECTION_DEFAULTS.get(key))
        if key in ("dtypes", "contracts") and v:
            v = [p.strip() for x in v for p in str(x).split(",")]
        if key == "variants" and v:  # the reference items rotate, a run stored before the dtype probe
            v = [x for x in v if x not in (REFERENCE, DTYPE_PROBE)]  # has none: compared per item (compare_runs)
        if isinstance(v, list):
            v = sorted({str(x) for x in v if str(x)}) or None
        out[key] = v
    return out


def _check_selection(baseline: dict[str, Any], candidate: dict[str, Any]) -> None:
    a, b = selection(baseline), selection(candidate)
    diff = [k for k in SELECTION if a[k] != b[k]]
    if not diff:
        return
    first = diff[0]
    more = f" (and {len(diff) - 1} more: {', '.join(diff[1:])})" if len(diff) > 1 else ""
    raise GateError(f"selections differ: baseline run {baseline['id']} has {first}={a[first]!r} but candidate run "
                    f"{candidate['id']} has {first}={b[first]!r}{more}; gate runs of the same selection, or pass "
                    f"--common-only to compare the items both hold")


_COLUMNS = {
    "op_results": ("op", "variant", "dtype", "status", "error", "max_abs_err", "max_rel_err", "fallback_ops",
                   "duration_s", "contract_failed", "fingerprint"),
    "model_results": ("model_id", "mode", "dtype", "status", "error", "max_abs_err", "max_rel_err", "fwd_rel_err",
                      "fallback_ops", "first_divergent_op", "recompiles", "duration_s", "loss_curve", "fingerprint",
                      "noise"),
    # a wide flip or a log-likelihood beyond its bound is a mismatch: lost agreement or quality is a regression
    "gen_results": ("model_id", "mode", "dtype", "status", "error", "fallback_ops", "first_divergent_op",
                    "recompiles", "duration_s", "agreement", "wide_flips", "near_tie_flips", "loglik_shift"),
}


def _rows(store: Store, run_id: str, table: str) -> dict[str, dict[str, Any]]:
    return results_by_key(store, run_id, table, _COLUMNS[table])


def _sev(status: str) -> int:
    return _SEV[status]


def _contracts(row: dict[str, Any]) -> list[str]:
    """The contracts a result row failed (its ``contract_failed``), in stored order."""
    return [n.strip() for n in str(row.get("contract_failed") or "").split(",") if n.strip()]


def _evidence(b: dict[str, Any], c: dict[str, Any]) -> dict[str, Any]:
    """What a regression's finding carries: the candidate's error, magnitudes (a model's normwise
    forward error too), fallbacks, first divergent op and failed contracts, and the baseline's
    magnitudes and failed contracts, so a reader sees how far the error moved."""
    ev = {k: c.get(k) for k in ("error", "max_abs_err", "max_rel_err", "fwd_rel_err", "fallback_ops", "first_divergent_op",
                                "contract_failed", "agreement", "wide_flips", "loglik_shift") if c.get(k) not in (None, "", "[]")}
    for k in ("max_rel_err", "fwd_rel_err", "contract_failed", "agreement", "loglik_shift"):
        if b.get(k) not in (None, ""):
            ev[f"baseline_{k}"] = b[k]
    return ev


def compare_runs(store: Store, baseline: dict[str, Any], candidate: dict[str, Any], *,
                 common_only: bool = False, counts: dict[str, int] | None = None) -> list[Finding]:
    """Findings before flake confirmation. With ``common_only`` items held by one run only are
    ignored (not new/removed); ``counts`` receives compared / only_baseline / only_candidate
    (canary items aside) and outside_slice: the ``reference`` items held by one run whose op the
    other run's slice of reference inputs leaves out (never new or removed)."""
    findings: list[Finding] = []
    tally = counts if counts is not None else {}
    for k in ("compared", "only_baseline", "only_candidate", "outside_slice", "unprobed"):
        tally.setdefault(k, 0)
    for table, kind in (("op_results", "op"), ("model_results", "model"), ("gen_results", "generate")):
        base, cand = _rows(store, baseline["id"], table), _rows(store, candidate["id"], table)
        for key in sorted(set(base) | set(cand)):
            b, c = base.get(key), cand.get(key)
            ref = c or b
            assert ref is not None
            name = ref.get("op") or ref.get("model_id") or ItemKey.parse(key).name
            variant = ref.get("variant") or ref.get("mode") or ""
            if variant == REFERENCE and (b is None or c is None) and not _sweeps_reference(
                    candidate if c is None else baseline, name):
                tally["outside_slice"] += 1  # not in the other run's slice: nothing to compare it with
                continue
            if variant == DTYPE_PROBE and (b is None or c is None) and not _probes_dtypes(
                    candidate if c is None else baseline):
                tally["unprobed"] += 1  # the other run probed no dtype at all
                continue
            if variant != "canary":  # canaries are compared too, but they are no part of the selection
                tally["compared" if b and c else ("only_baseline" if b else "only_candidate")] += 1
            if (b is None or c is None) and common_only:
                continue
            if b is None or c is None:
                cat = "new" if b is None else "removed"
                findings.append(Finding(cat, kind, key, name, variant, ref["dtype"], b["status"] if b else "",
                                        c["status"] if c else ""))
                continue
            if b["status"] == c["status"] and kind == "op":
                # the common case, decided without building anything; an item still at 'contract'
                # that now fails a contract it passed got worse all the same
                if b["status"] == Status.CONTRACT.value and set(_contracts(c)) - set(_contracts(b)):
                    findings.append(Finding("regression", kind, key, name, variant, c["dtype"], b["status"],
                                            c["status"], {**_evidence(b, c), "new_contracts": sorted(
                                                set(_contracts(c)) - set(_contracts(b)))}, c.get("duration_s")))
                continue
            sb, sc = _sev(b["status"]), _sev(c["status"])
            if sc > sb:
                findings.append(Finding("regression", kind, key, name, variant, c["dtype"], b["status"], c["status"],
                                        _evidence(b, c), c.get("duration_s")))
            elif sc < sb:
                findings.append(Finding("improvement", kind, key, name, variant, c["dtype"], b["status"], c["status"]))
            elif kind in ("model", "generate") and (c.get("recompiles") or 0) > (b.get("recompiles") or 0):
                findings.append(Finding("regression", kind, key, name, variant, c["dtype"], b["status"], c["status"],
                                        {"recompiles": [b.get("recompiles"), c.get("recompiles")]}))
            elif kind == "model" and b["status"] == c["status"]:
                f = model_numerics(key, b, c)
                if f is not None:
                    findings.append(f)
        if kind == "op":
            findings.extend(numerics(base, cand))
    return findings


def _sweeps_reference(run: dict[str, Any], op: str) -> bool:
    """Whether ``run`` swept ``op``'s reference inputs: the variant among its variants and the op
    in its slice (a run stored before there were reference items swept none)."""
    try:
        config = json.loads(run.get("config") or "{}")
    except ValueError:
        return False
    variants = config.get("variants") or VARIANTS
    try:
        return REFERENCE in variants and in_reference_slice(op, config.get("reference_inputs"))
    except ValueError:  # a slice this version cannot read: no reference item of it is compared
        return False


def _probes_dtypes(run: dict[str, Any]) -> bool:
    """Whether ``run`` probed dtypes: the probe among its variants (a run stored before the probe
    existed lists its variants without it)."""
    try:
        config = json.loads(run.get("config") or "{}")
    except ValueError:
        return False
    return DTYPE_PROBE in (config.get("variants") or VARIANTS)


Rerun = Callable[[dict[str, Any], list[str], int], dict[str, list[str]]]


def _sample(f: Finding) -> tuple[int, str]:
    sample = ItemKey.parse(f.item_key).sample  # representatives: the lowest samples first
    return (sample, "") if isinstance(sample, int) and sample >= 0 else (1 << 62, str(sample))


def confirm(findings: list[Finding], candidate: dict[str, Any], attempts: int, rerun: Rerun | None = None, *,
            budget_s: float = CONFIRM_BUDGET_S, max_reruns: int = MAX_RERUNS, per_group: int = PER_GROUP,
            workers: int = 2) -> Confirmation:
    """Confirm status regressions per op x variant x dtype group from up to ``per_group``
    representatives, within a budget; a flaky group's findings all become ``flaky``. A
    regression at an unchanged status (more recompiles, a newly failed contract) is not re-run:
    the re-runs' statuses cannot tell it from a flake.

    Representatives are re-run in rounds of one attempt each (a group is decided as soon as one
    re-run no longer fails), ``attempts`` times, once for a timeout or crash. A round starts only
    the groups whose estimated cost (a timeout for a timed-out item, its recorded duration
    otherwise) fits what is left of the budget; a group it cannot afford stays a regression
    marked ``unconfirmed``. A round already started runs to its end: it can overrun the budget
    by its workers' start-up time and by items that now hang although they did not before (each
    at most one timeout).
    """
    conf = Confirmation(attempts=attempts, budget_s=budget_s, max_reruns=max_reruns)
    groups: dict[tuple[str, str, str, str], list[Finding]] = defaultdict(list)
    for f in findings:
        if f.category == "regression" and "recompiles" not in f.evidence and "new_contracts" not in f.evidence:
            groups[(f.kind, f.name, f.variant, f.dtype)].append(f)
    conf.groups = len(groups)
    if not groups or attempts <= 0:
        return conf
    rerun = rerun or _rerun
    timeout_s = float(json.loads(candidate.get("config") or "{}").get("timeout_s") or 60.0)
    reps = {g: sorted(fs, key=_sample)[:per_group] for g, fs in groups.items()}
    need = {f.item_key: 1 if f.candidate in _ONCE else attempts for fs in reps.values() for f in fs}
    seen: dict[str, list[str]] = {f.item_key: [] for fs in reps.values() for f in fs}
    verdict: dict[tuple[str, str, str, str], str] = {}
    why: dict[tuple[str, str, str, str], str] = {}

    def cost(f: Finding) -> float:
        if f.candidate == Status.TIMEOUT.value:
            return timeout_s
        return min(timeout_s, max(float(f.duration_s or 0.0), 0.01))

    start = time.monotonic()
    while True:
        batch: list[Finding] = []
        planned_s = longest = 0.0
        for g in sorted(groups):
            if g in verdict:
                continue
            todo = [f for f in reps[g] if len(seen[f.item_key]) < need[f.item_key]]
            c = sum(cost(f) for f in todo)  # a group's items run one after the other in one worker
            wall = max(longest, c, (planned_s + c) / workers)
            spent = time.monotonic() - start
            if conf.reruns + len(batch) + len(todo) > max_reruns or spent + wall > budget_s:
                verdict[g] = "unconfirmed"
                why[g] = (f"confirmation budget spent ({conf.reruns + len(batch)} of {max_reruns} re-runs, "
                          f"{spent:.1f} of {budget_s:g} s; this group needed ~{c:.1f} s more)")
                continue
            batch += todo
            planned_s, longest = planned_s + c, max(longest, c)
        if not batch:
            break
        statuses = rerun(candidate, [f.item_key for f in batch], 1)
        conf.reruns += len(batch)
        for f in batch:
            got = statuses.get(f.item_key) or ["missing"]
            seen[f.item_key].append(got[0])
            conf.timeouts += got[0] == Status.TIMEOUT.value
        for g in {(f.kind, f.name, f.variant, f.dtype) for f in batch}:
            runs = [(f, s) for f in reps[g] for s in seen[f.item_key]]
            if any(s == "missing" for _, s in runs):
                verdict[g], why[g] = "unconfirmed", "a re-run returned no result for a representative"
            elif any(s == UNREPRODUCIBLE for _, s in runs):
                # the CPU did not agree with itself on a representative: the regression was the
                # reference's, and the target is not shown to disagree with itself either
                verdict[g] = "unreproducible"
            elif any(_sev(s) <= _sev(f.baseline) for f, s in runs):
                verdict[g] = "flaky"
            elif all(len(seen[f.item_key]) >= need[f.item_key] for f in reps[g]):
                verdict[g] = "confirmed"
    conf.seconds = round(time.monotonic() - start, 3)
    for g, fs in groups.items():
        v = verdict.get(g, "unconfirmed")
        setattr(conf, v, getattr(conf, v) + 1)
        record = {"group": "|".join(g[1:]), "verdict": v,
                  "representatives": {f.item_key: seen[f.item_key] for f in reps[g]}}
        if v == "unconfirmed":
            record["why"] = why.get(g, "")
        for f in fs:
            f.evidence["confirmation"] = record
            if f.item_key in seen and seen[f.item_key]:
                f.evidence["reruns"] = seen[f.item_key]
            if v in ("flaky", "unreproducible"):
                f.category = v
    return conf


def _fold_flaky(findings: list[Finding]) -> list[Finding]:
    """A flaky op x variant x dtype is reported once, as flaky: the numerics finding of a group
    whose status changes the re-runs judged flaky goes into the flaky findings' evidence."""
    flaky = {(f.name, f.variant, f.dtype) for f in findings if f.category == "flaky"}
    folded = {(f.name, f.variant, f.dtype): f for f in findings
              if f.category in NUMERICS and (f.name, f.variant, f.dtype) in flaky}
    for f in findings:
        if f.category == "flaky" and (f.name, f.variant, f.dtype) in folded:
            g = folded[(f.name, f.variant, f.dtype)]
            f.evidence["numerics"] = {"category": g.category, **g.evidence}
    return [f for f in findings if f not in folded.values()]


def _rerun(candidate: dict[str, Any], keys: list[str], attempts: int, store: Store | None = None) -> dict[str, list[str]]:
    from conformance.run.runner import rerun_items, traced_replays
    from conformance.run.spec import RunSpec

    spec = RunSpec.from_run(candidate, workers=2)
    # a traced item's input is its stored signature: the re-run replays it from the database
    replay = traced_replays(spec, store, keys) if store is not None else None
    return rerun_items(spec, candidate["id"], keys, attempts, replay=replay)


def check_limits(attempts: int, budget_s: float, max_reruns: int) -> None:
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 0:
        raise GateError(f"reruns = {attempts!r} is not valid; expected an integer >= 0")
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or not math.isfinite(budget_s) \
            or budget_s < 0:
        raise GateError(f"confirm budget = {budget_s!r} s is not valid; expected a finite number of seconds >= 0")
    if isinstance(max_reruns, bool) or not isinstance(max_reruns, int) or max_reruns < 0:
        raise GateError(f"max reruns = {max_reruns!r} is not valid; expected an integer >= 0")


def run_gate(store: Store, baseline_ref: str, candidate_ref: str, *, attempts: int = 3, rerun: Rerun | None = None,
             budget_s: float = CONFIRM_BUDGET_S, max_reruns: int = MAX_RERUNS,
             common_only: bool = False) -> GateResult:
    check_limits(attempts, budget_s, max_reruns)
    candidate = resolve(store, candidate_ref)
    baseline = resolve(store, baseline_ref, target=candidate["target"])
    if baseline["id"] == candidate["id"]:
        raise GateError(f"baseline and candidate are the same run ({baseline['id']})")
    for run, role in ((baseline, "baseline"), (candidate, "candidate")):
        _check(store, run, role)
    if not common_only:
        _check_selection(baseline, candidate)
    counts: dict[str, int] = {}
    findings = compare_runs(store, baseline, candidate, common_only=common_only, counts=counts)
    if common_only and not counts["compared"]:
        raise GateError(f"baseline run {baseline['id']} and candidate run {candidate['id']} hold no item in common "
                        f"({counts['only_baseline']} only in the baseline, {counts['only_candidate']} only in the "
                        f"candidate); nothing to compare")
    outside, unprobed = counts.pop("outside_slice"), counts.pop("unprobed")
    result = GateResult(baseline, candidate, findings, common=counts if common_only else None, outside_slice=outside,
                        unprobed=unprobed)
    if rerun is None:
        def rerun(c: dict[str, Any], keys: list[str], n: int) -> dict[str, list[str]]:
            return _rerun(c, keys, n, store)
    result.confirmation = confirm(findings, candidate, attempts, rerun, budget_s=budget_s, max_reruns=max_reruns)
    result.findings = findings = _fold_flaky(findings)
    from .first_bad import annotate  # imports this module (the numerics test)

    annotate(store, baseline, candidate, findings)
    result.verdict = "fail" if any(f.category in FAILS_GATE for f in findings) else "pass"
    result.causes = new_causes(store, baseline, candidate)
    _store(store, result)
    return result


def new_causes(store: Store, baseline: dict[str, Any], candidate: dict[str, Any]) -> dict[str, Any]:
    """The error causes the candidate has and the baseline does not (and the reverse): a new
    cause is usually one new bug, however many items it reaches, so the gate names them first."""
    from conformance.triage.causes import new_causes as diff

    new, gone = diff(store, baseline["id"], candidate["id"])
    return {"new": [{"key": c.key, "text": c.text(), "items": c.items, "ops": c.ops, "dtypes": c.dtypes,
                     "models": c.models, "explanation": c.explanation, "repro": c.repro_id} for c in new],
            "new_items": sum(c.items for c in new), "gone": gone}


def _store(store: Store, result: GateResult) -> None:
    b, c = result.baseline["id"], result.candidate["id"]
    decided = now()
    # One marker row says the gate judged this pair, even when it found nothing.
    marker = {"baseline_run": b, "candidate_run": c, "category": "verdict", "kind": "gate", "item_key": "*",
              "op": "", "variant": "", "dtype": "", "baseline": result.baseline["build"],
              "candidate": result.verdict, "evidence": {
                  "counts": {cat: len(result.of(cat)) for cat in (*FAILS_GATE, "flaky", "unreproducible", "improvement")},
                  "confirmation": result.confirmation.as_json() if result.confirmation else None,
                  **({"common_only": result.common} if result.common is not None else {}),
                  **({"reference_outside_slice": result.outside_slice} if result.outside_slice else {}),
                  **({"dtypes_unprobed": result.unprobed} if result.unprobed else {})},
              "decided_at": decided}
    store.replace_gate_decisions(b, c, [marker] + [
        {"baseline_run": b, "candidate_run": c, "category": f.category, "kind": f.kind, "item_key": f.item_key,
         "op": f.name, "variant": f.variant, "dtype": f.dtype, "baseline": f.baseline, "candidate": f.candidate,
         "evidence": f.evidence, "decided_at": decided} for f in result.findings])
    # The representatives that were re-run, each with its group's verdict (flaky | confirmed | unconfirmed).
    rerun = [f for f in result.findings if "reruns" in f.evidence]
    store.insert("flakes", [{"run_id": c, "item_key": f.item_key, "kind": f.kind, "attempts": len(f.evidence["reruns"]),
                             "failures": sum(s in _SEV and _sev(s) > _sev(f.baseline) for s in f.evidence["reruns"]),
                             "statuses": f.evidence["reruns"], "verdict": f.evidence["confirmation"]["verdict"],
                             "recorded_at": now()} for f in rerun], replace=True)


__all__ = ["GateError", "GateResult", "Finding", "Confirmation", "run_gate", "resolve", "gate_pairs", "sign_test_p",
           "selection", "check_limits", "CONFIRM_BUDGET_S", "MAX_RERUNS",
           "PER_GROUP", "model_numerics", "numerics"]
