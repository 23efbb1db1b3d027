"""Does PyTorch's own statement of an op's contract accept an input the CPU kernel accepted?

A CPU kernel does not check everything its op requires. ``_native_batch_norm_legit_functional``
with 4 channels and running statistics of 3 reads past them (and past a buffer of its own sized
from them) and returns heap garbage there, a different garbage on every call; no guard around
the inputs and no filled allocation reaches memory past a kernel's own small buffer, so the
reference can agree with itself while the target, with another heap, does not. PyTorch states
each op's shape and dtype contract a second time, in its meta kernel (what ``torch.compile``
traces with): that one refuses the input ("Attempting to broadcast a dimension of length 3").

:func:`meta_refusal` runs the call on fake tensors (:class:`FakeTensorMode`, no fallback to real
kernels) and says why the meta kernel refuses it, or None. Where the fake run cannot tell (no
meta kernel, an output shape or value that depends on the data, a tensor kind fakes cannot
hold) it says nothing: only a refusal of the contract counts. The schema search, whose inputs
are drawn from a schema and not written by an op's author, holds every input to it before the
target runs (:func:`conformance.check.execute.run_item` with ``check_first``).

An op named as another's helper (``_cholesky_solve_helper``, ``_X_impl``) is the kernel behind
its public namesake, which checks the inputs before it calls the helper; the helper's own meta
may check nothing (``_cholesky_solve_helper``'s only computes a shape, and its CPU kernel reads
past a non-square factor). :func:`contract_refusal` holds such a helper to its namesake's meta
as well, where the namesake has the helper's signature (:func:`public_namesake`): the naming
convention and the schemas say which op that is, no list does.

Example::

    >>> import torch
    >>> op = torch.ops.aten._native_batch_norm_legit_functional.default
    >>> x = torch.randn(3, 4, 1, 3)
    >>> stats = torch.zeros(3), torch.ones(3)
    >>> meta_refusal(op, x, None, None, *stats, False, 0.1, 1e-5)[:52]
    'RuntimeError: Attempting to broadcast a dimension of'
    >>> meta_refusal(op, x, None, None, torch.zeros(4), torch.ones(4), False, 0.1, 1e-5) is None
    True
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_leaves, tree_map

from .placement import storage_bytes

#: How an item whose input the op's meta kernel refuses is skipped (the schema search rejects it).
OUT_OF_CONTRACT = "outside the op's contract: its meta kernel refuses an input the CPU kernel accepts"


#: The exceptions a meta kernel refuses an input with (TORCH_CHECK's RuntimeError, an index or
#: value check); any other (a TypeError, an AssertionError inside the fake machinery) says nothing
#: of the input.
REFUSALS = (RuntimeError, IndexError, ValueError)
#: Messages by which a fake run says it cannot judge the input, not that it is wrong: its own
#: limits (a check of a CPU scalar tensor's device sees the meta device under the fake), and the argument parser refusing the call a decomposition made (``ones_like.out``'s
#: meta calls ``ones_like`` with the out argument: "expected at most 3 argument(s)").
_OWN_LIMITS = ("fake", "meta tensor", "data-dependent", "data dependent", "symbolic", "could not run",
               "not implemented", "dynamic output shape", "argument(s)", "expected a value of type",
               "keyword argument", "got meta", "meta instead", "device meta", "data is not allocated",
               # Python's own errors in a meta function written in Python: a bug there, not a check
               "list index out of range", "list assignment index out of range", "tuple index out of range",
               # a dtype rule: meta kernels often carry one backend's (``_grouped_mm``'s wants
               # bfloat16, its CPU kernel takes float32 too); what the CPU runs in a dtype is its own
               # contract, and a kernel does not read past its inputs for want of one
               "type")


def _cannot_tell() -> tuple[type[BaseException], ...]:
    """The exceptions by which a fake run says it cannot judge the input (not that it is wrong)."""
    from torch._subclasses import fake_tensor as ft
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    names = ("UnsupportedOperatorException", "DynamicOutputShapeException", "DataDependentOutputException",
             "UnsupportedFakeTensorException", "UnsupportedMutationAliasingException",
             "FakeTensorDeviceMismatchError")  # the last one is newer than torch 2.11
    return (*(getattr(ft, n) for n in names if hasattr(ft, n)), GuardOnDataDependentSymNode, NotImplementedError)


def meta_refusal(call: Callable[..., Any], /, *args: Any, **kwargs: Any) -> str | None:
    """``call(*args, **kwargs)`` with every tensor in the arguments made a fake tensor of the same
    metadata: the meta kernel's error ("Type: message", first line, at most 300 characters) when
    it refuses them, None when it accepts them or cannot tell. Never raises."""
    return _fake_run(call, args, kwargs)[1]


def _fake_run(call: Callable[..., Any], args: Any, kwargs: Any) -> tuple[list[tuple[int, ...]] | None, str | None]:
    """(the output shapes of the fake call, or None where it did not run or cannot tell; its
    refusal as :func:`meta_refusal` words it, or None)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_fallback_kernels=False)

    def fake(x: Any) -> Any:
        if isinstance(x, torch.UntypedStorage):  # a Storage argument: the storage of a fake over its bytes
            return mode.from_tensor(storage_bytes(x)).untyped_storage()
        return mode.from_tensor(x) if isinstance(x, torch.Tensor) else x

    try:
        fargs, fkwargs = tree_map(fake, (args, kwargs))
    except Exception:  # noqa: BLE001 - a tensor kind fakes cannot hold: nothing to say
        return None, None
    quiet = logging.getLogger("torch._subclasses.fake_tensor")  # it logs each refusal's traceback
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        with mode, torch.no_grad():
            result = call(*fargs, **fkwargs)
        shapes = [tuple(x.shape) for x in tree_leaves(result) if isinstance(x, torch.Tensor)]
    except _cannot_tell():
        return None, None
    except REFUSALS as exc:
        head = (str(exc).strip().splitlines() or [""])[0]
        if any(s in head.lower() for s in _OWN_LIMITS):
            return None, None
        return None, f"{type(exc).__name__}: {head}"[:300]
    except Exception:  # noqa: BLE001 - the fake machinery's own trouble (a TypeError calling
        return None, None  # the call the CPU took, an internal assert): nothing said of the input
    finally:
        quiet.setLevel(level)
    try:
        return [tuple(int(d) for d in s) for s in shapes], None
    except (TypeError, ValueError):  # a symbolic size: no shape to hold against another's
        return None, None


#: The name endings by which an internal op says it is the kernel behind a public one.
HELPER_SUFFIXES = ("_helper", "_impl")


def _signature(schema: Any) -> tuple[list[str], list[str], list[str]]:
    args = schema.arguments
    return ([str(a.type) for a in args if not a.kwarg_only], [str(a.type) for a in args if a.kwarg_only],
            [str(r.type) for r in schema.returns])


def public_namesake(op: Any) -> Any | None:
    """The public op an internal helper is the kernel of: for ``aten::_X_helper.overload`` (or
    ``_X_impl``), ``aten::X.overload`` when it takes and returns the same types; else None."""
    schema = getattr(op, "_schema", None)
    if schema is None or "::" not in schema.name:
        return None
    namespace, name = schema.name.split("::", 1)
    if not name.startswith("_"):
        return None
    base = name.lstrip("_")
    for suffix in HELPER_SUFFIXES:
        if not base.endswith(suffix) or len(base) == len(suffix):
            continue
        packet = getattr(getattr(torch.ops, namespace), base[: -len(suffix)], None)
        overload = schema.overload_name or "default"
        if packet is None or overload not in packet.overloads():
            continue
        public = getattr(packet, overload)
        if _signature(public._schema) == _signature(schema):
            return public
    return None


def contract_refusal(op: Any, /, *args: Any, overload_: Any = None, **kwargs: Any) -> str | None:
    """:func:`meta_refusal` of ``op`` on the arguments, then, for an internal helper, of its
    :func:`public_namesake` (its refusal names that op); None when both accept or cannot tell.
    ``overload_``: the OpOverload ``op`` calls, where ``op`` wraps it (the schema search's call)."""
    own, refused = _fake_run(op, args, kwargs)
    public = public_namesake(overload_ if overload_ is not None else op) if refused is None else None
    if public is None:
        return refused
    name = f"{public._schema.name}.{public._overloadname}"
    theirs, refused = _fake_run(public, args, kwargs)
    if refused:
        return f"{name}'s meta, {refused}"[:300]
    if own is not None and theirs is not None and own != theirs:
        # the public op makes its inputs agree (broadcasts the batch dimensions) before it calls
        # its helper, whose kernel then indexes them alike: inputs that need that are not the helper's
        return (f"{name}'s meta gives outputs of shapes {theirs} where the helper's gives {own}: the public op "
                "makes such inputs agree before it calls its helper")[:300]
    return None


__all__ = ["HELPER_SUFFIXES", "OUT_OF_CONTRACT", "contract_refusal", "meta_refusal", "public_namesake"]
