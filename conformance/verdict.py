"""The verdict vocabulary and the one function that decides a status.

Example::

    >>> from conformance.verdict import Status, decide
    >>> decide(cpu_error=None, target_error=None, close=True, fallback=("aten::cumsum.default",)).value
    'pass_fallback'
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from enum import StrEnum


class Status(StrEnum):
    PASS = "pass"
    PASS_FALLBACK = "pass_fallback"  # correct, but some overload fell back to the CPU
    MISMATCH = "mismatch"
    ERROR = "error"
    UNSUPPORTED_DTYPE = "unsupported_dtype"
    CRASH = "crash"
    TIMEOUT = "timeout"
    SKIP = "skip"  # the CPU reference itself failed, or the sample is undefined
    XFAIL = "xfail"
    XPASS = "xpass"

    @property
    def passed(self) -> bool:
        return self in (Status.PASS, Status.PASS_FALLBACK)

    @property
    def failed(self) -> bool:
        return self in FAILING


FAILING = frozenset({Status.MISMATCH, Status.ERROR, Status.UNSUPPORTED_DTYPE, Status.CRASH,
                     Status.TIMEOUT, Status.XPASS})
# How bad a status is, for "got worse" comparisons by the gate (higher is worse).
SEVERITY = {Status.PASS: 0, Status.XFAIL: 0, Status.SKIP: 0, Status.PASS_FALLBACK: 1,
            Status.XPASS: 2, Status.UNSUPPORTED_DTYPE: 3, Status.MISMATCH: 4, Status.ERROR: 4,
            Status.TIMEOUT: 5, Status.CRASH: 5}

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
           graphs: int | None = None) -> Status:
    """The verdict for one executed item.

    ``expected_failure`` is the list of failing statuses a ledger xfail entry accepts (None
    when no entry matches): a failure it names becomes ``xfail``, a pass becomes ``xpass``.
    ``graphs`` is how many graphs a compiler target compiled for the item (None for an eager
    target): a compiler target that compiled none ran eager, and that is an ``error`` of the
    infrastructure (:data:`NOT_COMPILED`) whatever the comparison said, never a pass and
    never an expected failure.

        >>> decide(cpu_error=None, target_error=None, close=True, graphs=0).value
        'error'
    """
    if cpu_error is not None:
        return Status.SKIP
    if target_error is None and graphs == 0:
        return Status.ERROR
    if target_error is not None:
        status = Status.UNSUPPORTED_DTYPE if is_unsupported_dtype(target_error) else Status.ERROR
    elif not close:
        status = Status.MISMATCH
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
