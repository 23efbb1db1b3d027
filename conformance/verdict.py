"""The one function that decides a status (the vocabulary itself is :mod:`opdb.status`).

Example::

    >>> from conformance.verdict import Status, decide
    >>> decide(cpu_error=None, target_error=None, close=True, fallback=("aten::cumsum.default",)).value
    'pass_fallback'
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from opdb.status import FAILING, SEVERITY, Status

__all__ = ["FAILING", "SEVERITY", "Status", "apply_expected", "decide", "decide_unrun", "is_unsupported_dtype"]

_DTYPE_WORDS = r"(float64|double|complex|ComplexFloat|ComplexDouble|ComplexHalf|Half|BFloat16|float16|bfloat16|" \
               r"Long|int64|Int|int32|Short|Char|Byte|Bool|channels_last|dtype)"
_UNSUPPORTED = [
    re.compile(r"not implemented for '" + _DTYPE_WORDS, re.I),
    re.compile(_DTYPE_WORDS + r".{0,80}(not supported|unsupported|is not available)", re.I),
    re.compile(r"(unsupported|not supported).{0,40}" + _DTYPE_WORDS, re.I),
]


def is_unsupported_dtype(message: str) -> bool:
    """Does a target's error message say the dtype (or memory format) is unsupported?"""
    return any(p.search(message) for p in _UNSUPPORTED)


NOT_COMPILED = ("infra: the compiler target compiled no graph for this item, so it ran eager; "
                "its result says nothing about the compiler")


def decide(*, cpu_error: str | None, target_error: str | None, close: bool,
           fallback: Sequence[str] = (), expected_failure: Sequence[str] | None = None,
           graphs: int | None = None, contracts_failed: Sequence[str] = ()) -> Status:
    """The verdict for one executed item.

    ``expected_failure`` is the list of failing statuses a ledger xfail entry accepts (None
    when no entry matches): a failure it names becomes ``xfail``, a pass becomes ``xpass``.
    ``graphs`` is how many graphs a compiler target compiled for the item (None for an eager
    target): a compiler target that compiled none ran eager, and that is an ``error`` of the
    infrastructure (:data:`NOT_COMPILED`) whatever the comparison said, never a pass and
    never an expected failure. ``contracts_failed`` names the contract checks that failed: an
    item whose values pass but whose contract fails is ``contract`` (values that fail are a
    ``mismatch`` whatever the contracts say).

        >>> decide(cpu_error=None, target_error=None, close=True, graphs=0).value
        'error'
        >>> decide(cpu_error=None, target_error=None, close=True, contracts_failed=["out"]).value
        'contract'
    """
    if cpu_error is not None:
        return Status.SKIP
    if target_error is None and graphs == 0:
        return Status.ERROR
    if target_error is not None:
        status = Status.UNSUPPORTED_DTYPE if is_unsupported_dtype(target_error) else Status.ERROR
    elif not close:
        status = Status.MISMATCH
    elif contracts_failed:
        status = Status.CONTRACT
    else:
        status = Status.PASS_FALLBACK if fallback else Status.PASS
    return apply_expected(status, expected_failure)


def apply_expected(status: Status, expected_failure: Sequence[str] | None) -> Status:
    if expected_failure is None:
        return status
    if status.passed:
        return Status.XPASS
    if status.value in expected_failure:
        return Status.XFAIL
    return status


def decide_unrun(where: Literal["cpu", "target", "harness"], *, timed_out: bool = False) -> Status:
    """The verdict for an item that never reached a comparison.

    ``cpu``: the CPU reference died, hung, or no valid input exists: nothing to say about the
    target (skip). ``target``: the worker died on the target (crash) or was killed after the
    timeout (timeout). ``harness``: the harness, or building the item (a model graph), raised (error).
    """
    if where == "cpu":
        return Status.SKIP
    if where == "target":
        return Status.TIMEOUT if timed_out else Status.CRASH
    return Status.ERROR
