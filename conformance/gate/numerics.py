"""The gate's numerics test: did the errors of items whose status did not change move beyond noise?

Per op x variant x dtype, from the items' error fingerprints (:mod:`conformance.check.fingerprint`;
against the CPU's result where the values pass, the float64 arbiter where they fail; paired sign tests over fixed element probes of every sample,
with minimum effects on the RMS error and the bias over all elements): ``drift`` when the group
passed and its error grew, ``worsened`` when it was already failing and got worse. Runs stored
without fingerprints fall back to a sign test on the samples' max errors (passing items only).
A model drifts when its output fingerprint or its loss gap to the CPU grows beyond the target's
own run-to-run noise. The gate (:mod:`conformance.gate`) and the first-bad-build search
(:mod:`conformance.gate.first_bad`) both ask this module, so both judge a build the same way.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from typing import Any

from conformance.check.fingerprint import shift, sign_test_p
from conformance.work import ItemKey
from opdb.status import PASSED

from .finding import Finding

_PASSED = PASSED

LOSS_GROWTH = 2.0  # a model's loss gap must grow this many times at every step ...
NOISE_K = 3.0  # ... and by more than this many times its run-to-run noise ...
LOSS_FLOOR = 1e-6  # ... plus this much of the loss (so rounding of a loss near 0 is no finding)
MIN_EFFECT = 2.0  # median error ratio that counts as drift
DRIFT_P = 0.01  # one-sided sign-test p-value
MIN_PAIRS = 5
ERR_FLOOR = 1e-12


def _drift_max_error(op: str, variant: str, dtype: str, pairs: list[tuple[dict[str, Any], dict[str, Any]]]
                     ) -> Finding | None:
    """The test for items stored without fingerprints (runs of older versions): the median ratio
    of the samples' max errors, with a sign test, on passing items."""
    ratios = [((c["max_rel_err"] + ERR_FLOOR) / (b["max_rel_err"] + ERR_FLOOR)) for b, c in pairs
              if b["status"] in _PASSED and b.get("max_rel_err") is not None and c.get("max_rel_err") is not None]
    changed = [r for r in ratios if r != 1.0]
    if len(changed) < MIN_PAIRS:
        return None
    med = statistics.median(ratios)
    greater = sum(r > 1 for r in changed)
    p = sign_test_p(greater, len(changed))
    if med < MIN_EFFECT or p >= DRIFT_P:
        return None
    return Finding("drift", "drift", str(ItemKey(op, variant, dtype, "*")), op, variant, dtype, "pass", "pass",
                   {"median_error_ratio": med, "p_value": p, "samples": len(ratios), "worse_samples": greater})


def _json(value: Any) -> Any:
    """A stored JSON column's value (None when it does not parse)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value


def _fingerprint(row: dict[str, Any]) -> dict[str, Any] | None:
    fp = _json(row.get("fingerprint"))
    return fp if isinstance(fp, dict) else None


def numerics(base: dict[str, dict[str, Any]], cand: dict[str, dict[str, Any]]) -> list[Finding]:
    """One finding per op x variant x dtype whose errors moved beyond noise, among the items whose
    status did not change (a changed status is a regression of its own): ``drift`` when all of
    them passed on the baseline, ``worsened`` when some were already failing and got worse.
    Tested on the items' error fingerprints (:func:`conformance.check.fingerprint.shift`); a group
    without fingerprints on both sides falls back to the max-error test on passing items."""
    pairs: dict[tuple[str, str, str], list[tuple[str, dict[str, Any], dict[str, Any]]]] = defaultdict(list)
    for key, b in base.items():
        c = cand.get(key)
        if c is None or b["status"] != c["status"] or b.get("variant") == "canary":
            continue
        pairs[(b["op"], b["variant"], b["dtype"])].append((key, b, c))
    out = []
    for (op, variant, dtype), items in sorted(pairs.items()):
        fps = [(key, b, c, _fingerprint(b), _fingerprint(c)) for key, b, c in items]
        fps = [x for x in fps if x[3] is not None and x[4] is not None and x[3].get("ref") == x[4].get("ref")]
        if not fps:
            f = _drift_max_error(op, variant, dtype, [(b, c) for _, b, c in items])
            if f is not None:
                out.append(f)
            continue
        sh = shift([x[3] for x in fps], [x[4] for x in fps])
        if not sh.found:
            continue
        failing = sorted({x[1]["status"] for x in fps if x[1]["status"] not in _PASSED})
        cat = "worsened" if failing else "drift"
        status = failing[0] if failing else "pass"
        out.append(Finding(cat, "drift", str(ItemKey(op, variant, dtype, "*")), op, variant, dtype, status, status,
                           {**sh.evidence(), "samples": len(fps), "items": [x[0] for x in fps],
                            "statuses": sorted({x[1]["status"] for x in fps})}))
    return out


def model_numerics(key: str, b: dict[str, Any], c: dict[str, Any]) -> Finding | None:
    """A model item at an unchanged status whose error grew beyond the target's run-to-run noise
    (``noise``: max |second forward - first| / max |first|, measured in each run): ``drift`` when
    it passes, ``worsened`` when it already failed.

    - output: the error fingerprint of the first forward's output and first step's gradients
      (against the CPU's) moved, by the paired test of :func:`conformance.check.fingerprint.shift`, and
      its RMS or its |bias| grew by more than ``NOISE_K`` times the noise (in eps of the dtype);
    - loss: the gap between the target's and the CPU's loss curve grew at every training step by
      ``LOSS_GROWTH`` times and by more than ``NOISE_K`` times the noise (relative to the CPU's
      loss), however small both gaps are against the model tolerance.
    """
    noise = max(float(b.get("noise") or 0.0), float(c.get("noise") or 0.0))
    try:
        eps = _eps(c["dtype"])
    except (AttributeError, TypeError):
        return None
    ev: dict[str, Any] = {"noise": noise}
    tests = []
    fb, fc = _fingerprint(b), _fingerprint(c)
    if fb is not None and fc is not None and fb.get("ref") == fc.get("ref"):
        sh = shift([fb], [fc])
        grew = max(sh.candidate[2] - sh.baseline[2], abs(sh.candidate[1]) - abs(sh.baseline[1]))  # RMS, |bias|
        if sh.found and grew > NOISE_K * noise / eps:
            tests.append("output")
            ev.update(sh.evidence())
    lb, lc = _json(b.get("loss_curve")) or {}, _json(c.get("loss_curve")) or {}
    steps = [lb.get("target"), lb.get("cpu"), lc.get("target"), lc.get("cpu")]
    if all(isinstance(x, list) and x for x in steps) and len({len(x) for x in steps}) == 1:
        gb = [abs(t - r) for t, r in zip(lb["target"], lb["cpu"], strict=True)]
        gc = [abs(t - r) for t, r in zip(lc["target"], lc["cpu"], strict=True)]
        floor = [(NOISE_K * noise + LOSS_FLOOR) * abs(r) for r in lc["cpu"]]
        if all(y > LOSS_GROWTH * x and y - x > f for x, y, f in zip(gb, gc, floor, strict=True)):
            tests.append("loss")
            ev["loss_gap"] = {"baseline": gb, "candidate": gc}
    if not tests:
        return None
    ev["test"] = "+".join(tests)
    cat = "drift" if b["status"] in _PASSED else "worsened"
    return Finding(cat, "model", key, c.get("model_id") or ItemKey.parse(key).name, c.get("mode") or "", c["dtype"],
                   b["status"], c["status"], ev)


def _eps(dtype: str) -> float:
    import torch  # the gate itself runs nothing: torch only for a dtype's epsilon

    return float(torch.finfo(getattr(torch, dtype)).eps)
