"""Contracts: what a green cell promises beyond close values, each a named check with its evidence.

A value comparison says the numbers are close to the CPU's. A backend can still break what code
relies on: an ``out=`` tensor whose storage is replaced, a view that is a copy, outputs with other
strides, an input the CPU rejects that the device accepts, two identical calls that differ. Each
such promise is a *contract*, checked next to the value comparison on the same item, always
against what the CPU does with the same input (the harness knows nothing of the device):

==============  ===========================================  ===============================
contract        what the target must do                      items
==============  ===========================================  ===============================
metadata        outputs with the CPU's strides and storage   every item
                offset (or the meta kernels' prediction),
                in a layout the target's own ops accept
aliasing        outputs share storage with the inputs the    function, inplace
                CPU's share it with (views stay views, an
                in-place op returns ``self``), and inputs
                are changed only as the CPU changes them
noncontiguous   the same values for non-contiguous and       function; backward (non-
                channels_last copies of the inputs (the      contiguous inputs and upstream
                same gradients for non-contiguous ones)      gradients)
variants        in-place and ``out=`` variants, the method   function (method, aliases),
                and the OpInfo's aliases agree with the      inplace, out; backward (the
                function on the target (and their gradients  method, aliases, in-place on a
                with the function's)                         clone)
out             ``out=``: a sized out keeps its storage and  out
                strides, a non-contiguous out is honoured,
                a pre-filled out is overwritten, a wrong
                shape is resized with the CPU's warning, an
                unsafe dtype and an out on another device
                raise
errors          every OpInfo ``error_input`` the CPU rejects  function, first sample
                raises on the target too
determinism     two identical calls are bitwise identical    function, first two samples
                (where two calls on the CPU are)
==============  ===========================================  ===============================

Each check ends ``pass``, ``fail`` or ``n/a`` (with the reason it cannot be checked: no ``out=``
variant, no error inputs of the dtype, a random op...), never a silent pass. The verdict
(:func:`conformance.check.verdict.decide`) turns an item whose values pass and whose contract fails
into ``contract``.

The names, ``--contracts`` parsing, :class:`Check` and the :class:`Subject` the checks look at are
in :mod:`~conformance.check.contracts.terms`; the metadata, aliasing and noncontiguous checks (and
the non-contiguous copies) in :mod:`~conformance.check.contracts.layout`; variants, out, errors and
determinism in :mod:`~conformance.check.contracts.calls`. This module holds the table of checks
and :func:`check`, and names everything callers use.

Example::

    >>> from conformance.check.contracts import CONTRACTS, Check, summary
    >>> CONTRACTS[:3]
    ('metadata', 'aliasing', 'noncontiguous')
    >>> summary({"out": Check("fail", "data_ptr changed"), "errors": Check("n/a", "no error_inputs")})
    'contract out: data_ptr changed'
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import torch

from conformance.check.compare import leaves
from conformance.check.execute import err

from .calls import (
    check_determinism,
    check_errors,
    check_out,
    check_variants,
    gradient_variants,
    other_callables,
)
from .layout import check_aliasing, check_metadata, check_noncontiguous, noncontiguous_copy
from .terms import (
    BUDGETED,
    COMPILER_DEFAULT,
    CONTRACTS,
    CPU_DETERMINISM_TRIES,
    DEFAULT_BUDGET,
    DETERMINISM_SAMPLES,
    PASS,
    SAMPLED_OUT,
    Budget,
    Check,
    Outcome_,
    Subject,
    default_for,
    fail,
    failed,
    na,
    parse_contracts,
    shape_class,
    summary,
)

__all__ = [
    "BUDGETED", "Budget", "DEFAULT_BUDGET", "SAMPLED_OUT", "shape_class", "COMPILER_DEFAULT", "CONTRACTS", "CPU_DETERMINISM_TRIES", "DETERMINISM_SAMPLES", "PASS", "Check",
    "Outcome_", "Subject", "check", "default_for", "fail", "failed", "na", "noncontiguous_copy",
    "parse_contracts", "summary",
]


def check(subject: Subject, wanted: Collection[str]) -> dict[str, Check]:
    """Every contract in ``wanted`` that applies to the subject's variant, checked."""
    out: dict[str, Check] = {}
    for name in CONTRACTS:
        if name not in wanted:
            continue
        fn = _CHECKS[name]
        if subject.budget is not None and name in BUDGETED:
            # asked only where the check applies (it says so without a call when it does not)
            applies = _APPLIES.get(name, lambda s: True)(subject)
            if applies and not subject.budget.wants(name, subject.variant, subject.index, subject.signature):
                out[name] = Check("n/a", SAMPLED_OUT)
                continue
        try:
            result = fn(subject)
        except Exception as exc:  # noqa: BLE001 - a check that cannot run is not a pass
            result = na(f"the check itself failed: {err(exc)}")
        if result is not None:
            out[name] = result
    return out


def _noncontiguous_applies(s: Subject) -> bool:
    return s.variant in ("function", "backward") and any(
        isinstance(x, torch.Tensor) and x.layout == torch.strided and x.numel() > 1
        for x in leaves((s.sample.input, s.sample.args, s.sample.kwargs)))


def _variants_applies(s: Subject) -> bool:
    # in-place and out= items compare with the function's result the sweep already holds: free
    if s.variant == "backward":
        return bool(gradient_variants(s.info))
    return s.variant == "function" and next(iter(other_callables(s.info)), None) is not None


def _out_applies(s: Subject) -> bool:
    return s.variant == "out"


#: Whether a budgeted contract would call anything on the item (where not, it is not counted).
_APPLIES: dict[str, Callable[[Subject], bool]] = {"noncontiguous": _noncontiguous_applies,
                                                  "variants": _variants_applies, "out": _out_applies}

#: The check of each contract, by name (a test may swap one for another).
_CHECKS: dict[str, Callable[[Subject], Check | None]] = {
    "metadata": check_metadata, "aliasing": check_aliasing, "noncontiguous": check_noncontiguous,
    "variants": check_variants, "out": check_out, "errors": check_errors, "determinism": check_determinism,
}
assert tuple(_CHECKS) == CONTRACTS
