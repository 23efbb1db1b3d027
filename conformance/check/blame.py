"""What an item's own localisation (:mod:`conformance.check.localize`, a ``locus``) blames: the
kernel that diverges alone, or nothing (the error accumulated, or single precision explains it).
The sweep's error causes (:mod:`conformance.triage.causes`) and the generation lane's first
divergent op both ask it. Imports no torch until a schema is looked up.

Example::

    >>> local_blame({"locus": {"scores": {"aten::exp.default": 40.0, "aten::mul.Tensor": 0.0}}})
    ('aten::exp.default', False)
    >>> local_blame({"locus": {"scores": {"aten::exp.default": 0.5}}})
    ('', None)
"""

from __future__ import annotations

import fnmatch
import functools
import json
from typing import Any

#: A kernel whose own output is this many times its dtype's default tolerance from the CPU's, on
#: the same inputs (:mod:`conformance.check.localize`), is wrong by itself: the item is blamed on
#: it. Below it, no kernel of the item diverges alone (its error accumulated) and the run-wide
#: :func:`conformance.triage.causes.blame` decides.
LOCAL_BLAME = 1.0
#: A double-precision kernel whose own error is at most this many times its single-precision
#: twin's (the same call computed in float32 on the CPU) is what computing it in single precision
#: gives: the device's single-precision rounding and the CPU's at most add up. (The whole-item
#: twin allows more, ``TWIN_FACTOR``: an item's error also grows along its chain of kernels.)
LOCAL_TWIN_FACTOR = 2.0


def local_blame(proof: Any, never: tuple[str, ...] = ()) -> tuple[str, bool | None]:
    """What a mismatching item's own localisation (``proof.locus``, stored by the sweep) says:
    (the overload to blame, whether single precision explains the item). Of the kernels that
    can change values and diverge alone (a score above :data:`LOCAL_BLAME`), the worst one that
    errs beyond what computing it in single precision gives (more than :data:`LOCAL_TWIN_FACTOR` times its
    ``single`` score, for a double-precision call) is blamed, and single precision does not
    explain the item; when every one of them errs as single precision does, the item is the
    dtype's (blamed on none, explained). ('', None): not localised, or no kernel diverges alone
    (its error accumulated), and the run-wide :func:`conformance.triage.causes.blame` decides."""
    if isinstance(proof, str):
        try:
            proof = json.loads(proof)
        except ValueError:
            return "", None
    locus = (proof or {}).get("locus") or {}
    scores, single = locus.get("scores") or {}, locus.get("single") or {}
    alone = sorted(((s, op) for op, s in scores.items()
                    if isinstance(s, (int, float)) and s > LOCAL_BLAME and not no_values(op, never)),
                   key=lambda x: (-x[0], x[1]))
    if not alone:
        return "", None
    for s, op in alone:
        twin = single.get(op)
        if not isinstance(twin, (int, float)) or s > LOCAL_TWIN_FACTOR * twin:
            return op, False
    return "", True


@functools.lru_cache(maxsize=4096)
def no_values(op: str, never: tuple[str, ...]) -> bool:
    """Whether an overload cannot change values: ``never`` names it, or its schema is a view's
    (it returns an alias of an input and writes none)."""
    if any(fnmatch.fnmatchcase(op, g) for g in never):
        return True
    import torch  # only for mismatches: listing causes otherwise needs no torch

    name, _, overload = op.removeprefix("aten::").partition(".")
    try:
        schema = getattr(getattr(torch.ops.aten, name), overload or "default")._schema
    except (AttributeError, RuntimeError):
        return False
    if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
        return False
    return bool(schema.returns) and all(r.alias_info is not None and not r.alias_info.is_write
                                        for r in schema.returns)
