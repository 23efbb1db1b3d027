"""Gate findings grouped the way a reader scans them: one group per op (or model) × variant ×
dtype × transition (baseline status -> candidate status), the largest first. The console gate, its
Markdown and JUnit, and the report's regressions page all group with :func:`group_findings`.

A finding is any mapping with ``category``, ``kind``, ``name`` (or ``op``), ``variant``, ``dtype``,
``baseline``, ``candidate``, ``item_key`` and ``evidence`` (a dict): a stored ``gate_items`` row
or a :class:`conformance.gate.Finding` as a dict.

Example::

    >>> from opdb.findings import group_findings
    >>> f = dict(category="regression", kind="op", op="abs", variant="function", dtype="float32",
    ...          baseline="pass", candidate="mismatch", evidence={"max_rel_err": 0.5})
    >>> [(g.name, g.transition, g.size, g.max_rel_err) for g in group_findings(
    ...     [{**f, "item_key": "a|function|float32|0"}, {**f, "item_key": "a|function|float32|1"}])]
    [('abs', 'pass -> mismatch', 2, 0.5)]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .queries_contracts import ordered_contracts

ERROR_CHARS = 240  # of a group's first error message
#: Display order of the categories (worst first).
CATEGORIES = ("regression", "worsened", "drift", "flaky", "unreproducible", "improvement", "new", "removed")


def _num(v: Any) -> float | None:
    try:
        return float(v) if v is not None and not isinstance(v, bool) else None
    except (TypeError, ValueError):
        return None


def _max(a: float | None, b: float | None) -> float | None:
    return b if a is None else (a if b is None else max(a, b))


@dataclass
class FindingGroup:
    """The findings of one op × variant × dtype × transition."""

    category: str
    kind: str  # op | model | drift
    name: str
    variant: str
    dtype: str
    baseline: str
    candidate: str
    item_keys: list[str] = field(default_factory=list)
    max_rel_err: float | None = None  # the worst of the candidate's items (their evidence)
    max_abs_err: float | None = None
    baseline_rel_err: float | None = None  # the worst of the same items in the baseline (element-wise)
    fwd_rel_err: float | None = None  # models: the normwise forward error the model tolerance judges
    baseline_fwd_rel_err: float | None = None
    error: str = ""  # the first candidate error message
    unconfirmed: int = 0  # items the flake confirmation could not afford
    reruns: dict[str, list[str]] = field(default_factory=dict)  # flaky: representative -> re-run statuses
    drift: dict[str, Any] = field(default_factory=dict)  # drift: median_error_ratio, p_value, samples, ...
    recompiles: list[Any] = field(default_factory=list)  # a model's recompiles, baseline and candidate
    contracts: list[str] = field(default_factory=list)  # the contracts the candidate's items failed
    baseline_contracts: list[str] = field(default_factory=list)  # ... and the baseline's, where they failed some
    first_bad: dict[str, int] = field(default_factory=dict)  # first bad build -> items (failing findings)
    first_bad_unknown: list[str] = field(default_factory=list)  # "unknown before X: run R lacks the item"

    def _status(self, status: str, contracts: list[str]) -> str:
        """A status, with the failed contracts named when it is ``contract``."""
        return f"{status} ({', '.join(contracts)})" if status == "contract" and contracts else status

    @property
    def size(self) -> int:
        return len(self.item_keys)

    @property
    def transition(self) -> str:
        """What changed, said as what it is: a status change, or an error that grew while passing."""
        if self.category in ("drift", "worsened"):
            while_ = "while passing" if self.category == "drift" else f"while failing ({self.candidate})"
            ratio = self.drift.get("median_error_ratio")
            if isinstance(ratio, (int, float)):
                return f"error grew {ratio:.3g}x {while_}"
            test = str(self.drift.get("test") or "")
            what = {"magnitude": "error grew", "bias": "error biased", "magnitude+bias": "error grew and biased",
                    "output": "output error grew", "loss": "loss gap grew",
                    "output+loss": "output error and loss gap grew"}.get(test, "error changed")
            return f"{what} {while_}"
        before = self._status(self.baseline, self.baseline_contracts)
        after = self._status(self.candidate, self.contracts)
        if self.category == "flaky":
            return f"{before} -> {after}, not reproduced on every re-run"
        if self.category == "new":
            return f"new: {after}"
        if self.category == "removed":
            return f"removed (was {before})"
        if self.baseline == self.candidate:  # worse at the same status: more recompiles, another contract
            if len(self.recompiles) == 2:
                return f"recompiles {self.recompiles[0]} -> {self.recompiles[1]} (still {self.candidate})"
            if before != after:
                return f"{before} -> {after}"
            return f"worse at the same status ({self.candidate})"
        return f"{before} -> {after}"

    @property
    def first_bad_build(self) -> str:
        """Since when the group's items have been bad: one build, or each build with its items
        (most items first), and the first gap that kept the search from going further back;
        '' when the gate did not say (flaky, improvements, decisions stored before it did)."""
        if not self.first_bad:
            return ""
        if len(self.first_bad) == 1:
            text = next(iter(self.first_bad))
        else:
            text = ", ".join(f"{b} ({n} item{'s' if n != 1 else ''})"
                             for b, n in sorted(self.first_bad.items(), key=lambda x: (-x[1], x[0])))
        if self.first_bad_unknown:
            more = len(self.first_bad_unknown) - 1
            text += f"; {self.first_bad_unknown[0]}" + (f" (and {more} more item{'s' if more != 1 else ''})"
                                                         if more else "")
        return text

    @property
    def first_key(self) -> str:
        return self.item_keys[0] if self.item_keys else ""


def _g(v: Any) -> str:
    return "?" if _num(v) is None else f"{float(v):.3g}"


def numerics_line(ev: Mapping[str, Any]) -> str:
    """The numbers behind a drift/worsened finding, in one line: the error fingerprints of the
    two runs (RMS, bias, p99 in eps of the dtype) and the paired test that decided."""
    if "median_error_ratio" in ev:  # a run without fingerprints: the max-error sign test
        return (f"median error ratio {_g(ev.get('median_error_ratio'))} over {ev.get('samples')} samples "
                f"({ev.get('worse_samples')} worse, sign-test p={_g(ev.get('p_value'))})")
    parts = []
    gaps = ev.get("loss_gap") or {}
    if gaps:
        parts.append(f"loss gap per step {', '.join(_g(x) for x in gaps.get('baseline') or [])} -> "
                     f"{', '.join(_g(x) for x in gaps.get('candidate') or [])}")
    if "noise" in ev:
        parts.append(f"run-to-run noise {_g(ev.get('noise'))}")
    if "probe_pairs" not in ev:
        return "; ".join(parts)
    b, c = ev.get("baseline") or {}, ev.get("candidate") or {}
    ratio = ev.get("rms_ratio")
    return "; ".join(parts + [_fingerprint_line(ev, b, c, ratio)])


def _fingerprint_line(ev: Mapping[str, Any], b: Mapping[str, Any], c: Mapping[str, Any], ratio: Any) -> str:
    return (f"RMS error {_g(b.get('rms_eps'))} -> {_g(c.get('rms_eps'))} eps"
            + (f" (x{_g(ratio)})" if ratio is not None else "")
            + f", bias {_g(b.get('bias_eps'))} -> {_g(c.get('bias_eps'))} eps, p99 {_g(b.get('p99_eps'))} -> "
            f"{_g(c.get('p99_eps'))} eps over {c.get('elements')} elements{_of_samples(ev.get('samples'))}; "
            f"{ev.get('changed_pairs')} of {ev.get('probe_pairs')} probe pairs changed ({ev.get('worse_pairs')} "
            f"larger, {ev.get('up_pairs')} up; sign-test p={_g(ev.get('p_magnitude'))} magnitude, "
            f"{_g(ev.get('p_bias'))} bias)")


def _of_samples(n: Any) -> str:
    """' of 3 samples' (an op group's), '' where the item is one graph (a model's: no samples)."""
    if not isinstance(n, int):
        return ""
    return f" of {n} sample{'' if n == 1 else 's'}"


def group_findings(findings: Iterable[Mapping[str, Any]]) -> list[FindingGroup]:
    """Findings grouped by category × kind × name × variant × dtype × transition; by category
    (:data:`CATEGORIES` order), then the largest group first, then by name."""
    groups: dict[tuple[str, ...], FindingGroup] = {}
    for f in findings:
        name = f.get("name") or f.get("op") or f.get("model") or ""
        key = (f["category"], f.get("kind") or "op", name, f.get("variant") or "", f.get("dtype") or "",
               f.get("baseline") or "", f.get("candidate") or "")
        g = groups.get(key)
        if g is None:
            g = groups[key] = FindingGroup(*key)
        g.item_keys.append(f.get("item_key") or "")
        ev = f.get("evidence") or {}
        if not isinstance(ev, Mapping):
            continue
        g.max_rel_err = _max(g.max_rel_err, _num(ev.get("max_rel_err")))
        g.max_abs_err = _max(g.max_abs_err, _num(ev.get("max_abs_err")))
        g.baseline_rel_err = _max(g.baseline_rel_err, _num(ev.get("baseline_max_rel_err")))
        g.fwd_rel_err = _max(g.fwd_rel_err, _num(ev.get("fwd_rel_err")))
        g.baseline_fwd_rel_err = _max(g.baseline_fwd_rel_err, _num(ev.get("baseline_fwd_rel_err")))
        if not g.error and ev.get("error"):
            text = " ".join(str(ev["error"]).split())
            g.error = text if len(text) <= ERROR_CHARS else text[:ERROR_CHARS - 1] + "…"
        if (ev.get("confirmation") or {}).get("verdict") == "unconfirmed":
            g.unconfirmed += 1
        if "reruns" in ev:
            g.reruns[f.get("item_key") or ""] = list(ev["reruns"])
        if g.category in ("drift", "worsened"):
            g.drift = dict(ev)
        if isinstance(ev.get("recompiles"), list) and not g.recompiles:
            g.recompiles = list(ev["recompiles"])
        if ev.get("first_bad_build"):
            fb = str(ev["first_bad_build"])
            g.first_bad[fb] = g.first_bad.get(fb, 0) + 1
            if ev.get("first_bad_unknown"):
                g.first_bad_unknown.append(str(ev["first_bad_unknown"]))
        for attr, name in (("contracts", "contract_failed"), ("baseline_contracts", "baseline_contract_failed")):
            names = [n.strip() for n in str(ev.get(name) or "").split(",") if n.strip()]
            if names:
                setattr(g, attr, ordered_contracts([*getattr(g, attr), *names]))
    rank = {c: i for i, c in enumerate(CATEGORIES)}
    return sorted(groups.values(), key=lambda g: (rank.get(g.category, len(rank)), -g.size, g.name, g.variant,
                                                  g.dtype, g.baseline, g.candidate))
