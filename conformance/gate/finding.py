"""A gate finding: one item (or one op x variant x dtype group) that got worse, better, flaky,
new or removed between two runs, with its evidence. A leaf the gate, its numerics test and the
first-bad-build search share.

    >>> from conformance.gate.finding import Finding
    >>> Finding("regression", "op", "abs|function|float32|0", "abs", "function", "float32", "pass", "mismatch").as_json()["op"]
    'abs'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Finding:
    category: str  # regression | drift | worsened | improvement | flaky | new | removed
    kind: str  # op | model | drift
    item_key: str
    name: str
    variant: str
    dtype: str
    baseline: str
    candidate: str
    evidence: dict[str, Any] = field(default_factory=dict)
    duration_s: float | None = None  # the candidate item's recorded time: the confirmation's cost estimate

    def as_json(self) -> dict[str, Any]:
        key = "model" if self.kind in ("model", "generate") else "op"
        out = {"kind": self.kind, key: self.name, "variant": self.variant, "dtype": self.dtype,
               "baseline": self.baseline, "candidate": self.candidate, "evidence": self.evidence,
               "item_key": self.item_key}
        if "first_bad_build" in self.evidence:
            out["first_bad_build"] = self.evidence["first_bad_build"]
        return out
