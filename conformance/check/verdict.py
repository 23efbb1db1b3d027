"""The one function that decides a status (the vocabulary itself is :mod:`opdb.status`).

Example::

    >>> from conformance.check.verdict import Status, decide
    >>> decide(cpu_error=None, target_error=None, close=True, fallback=("aten::cumsum.default",)).value
    'pass_fallback'
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from opdb.status import FAILING, SEVERITY, Status

__all__ = ["FAILING", "SEVERITY", "Status", "apply_expected", "decide", "decide_dtypes", "decide_opcheck", "decide_unrun",
           "is_unsupported_dtype", "is_refused", "is_unsupported_layout"]

# whole words: "Int" must not match "internal" (an internal error is no refused dtype)
_DTYPE_WORDS = r"(?<![A-Za-z])(float64|double|complex|ComplexFloat|ComplexDouble|ComplexHalf|Half|BFloat16|float16|bfloat16|" \
               r"Long|int64|Int|int32|Short|Char|Byte|Bool|dtype)(?![a-z])"
_UNSUPPORTED = [
    re.compile(r"not implemented for '" + _DTYPE_WORDS, re.I),
    re.compile(_DTYPE_WORDS + r".{0,80}(not supported|unsupported|is not available)", re.I),
    re.compile(r"(unsupported|not supported).{0,40}" + _DTYPE_WORDS, re.I),
]


def is_unsupported_dtype(message: str) -> bool:
    """Does a target's error message say the dtype is unsupported?"""
    return any(p.search(message) for p in _UNSUPPORTED)


# A memory format or layout as a word of its own (not inside an op name: ``aten::to_sparse``,
# ``aten::empty.memory_format`` name ops, not what the target refused).
_LAYOUT_WORDS = r"(?<![\w.:])(channels_last(?:_3d)?|memory[ _]format|(?:tensor )?layout|sparse|mkldnn|nested)(?!\w)"
_REFUSED = r"(not supported|unsupported|is not available|does not support|doesn't support|supports only)"
_UNSUPPORTED_LAYOUT = [
    re.compile(_LAYOUT_WORDS + r".{0,80}?" + _REFUSED, re.I),
    re.compile(r"(unsupported|not supported|does not support|doesn't support).{0,40}?" + _LAYOUT_WORDS, re.I),
    re.compile(r"supports only strided tensors", re.I),
    # the dispatcher's own refusal: no kernel of this op for a sparse/mkldnn/nested/quantized tensor
    # on the device (quantized tensors are a layout of their own to the harness, as its layout probe
    # and the coverage's "layout" state have them)
    re.compile(r"with arguments from the '(Sparse|SparseCsr|Mkldnn|Nested|Quantized)\w*' backend"),
    # dynamo's refusal to trace a sparse input (a graph break: the call then runs eager)
    re.compile(r"Attempted to wrap sparse Tensor", re.I),
]


def is_unsupported_layout(message: str) -> bool:
    """Does a target's error message say an input's memory format or layout is unsupported?

        >>> is_unsupported_layout("neuron: channels_last inputs are not supported by aten::convolution.default")
        True
        >>> is_unsupported_layout("internal compiler error in aten::to_sparse.default: unsupported resize")
        False
    """
    return any(p.search(message) for p in _UNSUPPORTED_LAYOUT)


# How an item the target refused before running it begins (``conformance.check.execute.err`` of a
# ``conformance.targets.base.TargetUnsupported``: an exporter that cannot convert the sample).
REFUSED_PREFIX = "TargetUnsupported: "


def is_refused(message: str) -> bool:
    """Did the target refuse the item before running it (rather than fail while running it)?

        >>> is_refused("TargetUnsupported: torch.onnx: DispatchError: No ONNX function found for aten.linalg_eig")
        True
        >>> is_refused("RuntimeError: ONNX Runtime: NOT_IMPLEMENTED")
        False
    """
    return message.startswith(REFUSED_PREFIX)


NOT_COMPILED = ("infra: the compiler target compiled no graph for this item, so it ran eager; "
                "its result says nothing about the compiler")


def decide(*, cpu_error: str | None, target_error: str | None, close: bool,
           fallback: Sequence[str] = (), expected_failure: Sequence[str] | None = None,
           graphs: int | None = None, contracts_failed: Sequence[str] = (), eager_reason: str = "") -> Status:
    """The verdict for one executed item.

    ``expected_failure`` is the list of failing statuses a ledger xfail entry accepts (None
    when no entry matches): a failure it names becomes ``xfail``, a pass becomes ``xpass``.
    ``graphs`` is how many graphs a compiler target compiled for the item (None for an eager
    target): a compiler target that compiled none ran eager, and that is an ``error`` of the
    infrastructure (:data:`NOT_COMPILED`) whatever the comparison said, never a pass and
    never an expected failure, unless ``eager_reason`` (why it compiled none: its graph-break
    reasons) says the compiler refused an input's layout: that is ``unsupported_layout``, a
    statement about the compiler, as a device's refusal is. ``contracts_failed`` names the
    contract checks that failed: an item whose values pass but whose contract fails is
    ``contract`` (values that fail are a ``mismatch`` whatever the contracts say).

        >>> decide(cpu_error=None, target_error=None, close=True, graphs=0).value
        'error'
        >>> decide(cpu_error=None, target_error=None, close=True, graphs=0,
        ...        eager_reason="Attempted to wrap sparse Tensor").value
        'unsupported_layout'
        >>> decide(cpu_error=None, target_error=None, close=True, contracts_failed=["out"]).value
        'contract'
    """
    if cpu_error is not None:
        return Status.SKIP
    if target_error is None and graphs == 0:
        return apply_expected(Status.UNSUPPORTED_LAYOUT, expected_failure) if is_unsupported_layout(eager_reason) \
            else Status.ERROR
    if target_error is not None:
        # from the error the target raised (never from what a device's manifest says): a refusal
        # before running first (an export failure, whatever its reason names), then a refused
        # memory format or layout (its message may name a dtype too)
        status = (Status.UNSUPPORTED if is_refused(target_error) else
                  Status.UNSUPPORTED_LAYOUT if is_unsupported_layout(target_error) else
                  Status.UNSUPPORTED_DTYPE if is_unsupported_dtype(target_error) else Status.ERROR)
    elif not close:
        status = Status.MISMATCH
    elif contracts_failed:
        status = Status.CONTRACT
    else:
        status = Status.PASS_FALLBACK if fallback else Status.PASS
    return apply_expected(status, expected_failure)


def decide_opcheck(failed: Sequence[str], *, has_reference: bool,
                   expected_failure: Sequence[str] | None = None) -> Status:
    """The verdict for a custom op's ``torch.library.opcheck`` item (:mod:`conformance.customops`):
    a failed test is ``contract`` (the op breaks what ``torch.library`` asks of it); all passed is
    ``pass`` for an op whose values are checked against a declared reference, and ``structural``
    for one with none: its structure is right, and nothing is known of its values.

        >>> decide_opcheck(["test_faketensor"], has_reference=True).value
        'contract'
        >>> decide_opcheck([], has_reference=False).value
        'structural'
    """
    if failed:
        status = Status.CONTRACT
    else:
        status = Status.PASS if has_reference else Status.STRUCTURAL
    return apply_expected(status, expected_failure) if status is not Status.STRUCTURAL else status


def decide_dtypes(how: Literal["accepts", "rejects"] | None, *, error: str = "",
                  expected_failure: Sequence[str] | None = None) -> Status:
    """The verdict of a dtype probe (:mod:`conformance.check.dtypeprobe`): the target ``accepts`` a
    dtype in a direction the CPU rejects (``contract``: PyTorch's dtype contract is the CPU's), or
    ``rejects`` one the CPU runs, ``error`` saying how: ``unsupported_dtype`` whatever its words,
    unless they refuse an input's layout (``unsupported_layout``: a device without sparse tensors
    rejects every dtype of a sparse op) or the item before running it (``unsupported``); or neither.

        >>> decide_dtypes("accepts").value, decide_dtypes("rejects").value, decide_dtypes(None).value
        ('contract', 'unsupported_dtype', 'pass')
        >>> decide_dtypes("rejects", error="RuntimeError: channels_last inputs are not supported").value
        'unsupported_layout'
    """
    status = (Status.PASS if how is None else Status.CONTRACT if how == "accepts" else
              Status.UNSUPPORTED if is_refused(error) else
              Status.UNSUPPORTED_LAYOUT if is_unsupported_layout(error) else Status.UNSUPPORTED_DTYPE)
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
