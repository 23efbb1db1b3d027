"""``torch.library.opcheck`` on a target's device, each of its tests run and recorded by name.

The four tests (:data:`CHECKS`) are what PyTorch asks of a custom op registered through
``torch.library``: its schema matches what the kernel does (mutation, aliasing), its autograd
formula is registered at an autograd key, its fake (meta) implementation gives the real results'
metadata, and it works through AOT dispatch (``torch.compile``'s path) with dynamic shapes, its
gradients included. Each test runs on its own fresh copy of the sample, so one's failure cannot
disturb the next; a failure keeps the exception's first line as its detail.

PyTorch's own ``test_autograd_registration`` refuses devices other than CPU, CUDA and XPU
("NYI devices"); for any other device the same check runs here against the device's own autograd
key (``AutogradPrivateUse1`` for ``neuron``), and its detail says so.

Example::

    >>> CHECKS
    ('test_schema', 'test_autograd_registration', 'test_faketensor', 'test_aot_dispatch_dynamic')
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree

from conformance.check.contracts import PASS, Check, fail, na
from conformance.check.execute import err

CHECKS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
_TORCH_DEVICES = ("cpu", "cuda", "xpu")  # what torch's own autograd-registration check supports


def has_autograd(op: torch._ops.OpOverload, key: str) -> bool:
    """Whether ``op`` has a kernel at an autograd key for dispatch key ``key`` (or is composite)."""
    name = op.name()
    return any(torch._C._dispatch_has_kernel_for_dispatch_key(name, k)
               for k in ("Autograd", f"Autograd{key}", "CompositeImplicitAutograd"))


def differentiable(op: torch._ops.OpOverload, key: str) -> bool:
    """Whether ``op`` has an autograd formula: one given to ``register_autograd`` for an op of
    ``torch.library.custom_op`` (which puts a kernel at the Autograd key of every op it defines,
    one that raises on backward where no formula was given), else a kernel at an autograd key."""
    from torch._library.custom_ops import _maybe_get_opdef

    opdef = _maybe_get_opdef(op)
    if opdef is not None:
        return opdef._backward_fn is not None
    return has_autograd(op, key)


def autograd_registration(op: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any],
                          key: str) -> None:
    """``torch.testing._internal.optests.autograd_registration_check`` for any device: an op
    with no kernel at an autograd key must not return outputs that require grad (an
    ``autograd.Function`` registered at the backend key gives silently wrong gradients)."""
    from torch.testing._internal.optests.autograd_registration import set_autograd_fallback_mode

    flat = pytree.arg_tree_leaves(*args, **kwargs)
    if not any(isinstance(t, torch.Tensor) and t.requires_grad for t in flat):
        raise RuntimeError("no input requires grad")
    if has_autograd(op, key):
        return
    with set_autograd_fallback_mode("nothing"):
        outs = op(*args, **kwargs)
    inputs = {id(a) for a in flat}
    if pytree.tree_any_only(torch.Tensor, lambda t: t.requires_grad and id(t) not in inputs, outs):
        raise AssertionError(f"{op.name()}: an output requires grad, but the op has no kernel at an autograd key "
                             f"(Autograd, Autograd{key}): an autograd formula registered at the backend key "
                             "gives silently wrong gradients")


def run_checks(op: torch._ops.OpOverload, place: Callable[[bool], tuple[tuple[Any, ...], dict[str, Any]]],
               key: str, atol: float, rtol: float, checks: tuple[str, ...] = CHECKS) -> dict[str, Check]:
    """Each of ``checks`` on a fresh placement of the sample: ``place(grad)`` gives the op's device
    arguments, with ``grad``: its floating inputs requiring grad where the op can differentiate."""
    from torch.library import opcheck

    out: dict[str, Check] = {}
    for name in checks:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # once-per-op fallback and autograd-fallback warnings
            if name == "test_autograd_registration":
                out[name] = _registration(op, place, key)
                continue
            args, kwargs = place(False)
            try:
                got = opcheck(op, args, kwargs, test_utils=(name,), raise_exception=False, atol=atol, rtol=rtol)[name]
            except Exception as exc:  # noqa: BLE001 - opcheck refused the call itself
                got = exc
        out[name] = PASS if got == "SUCCESS" else fail(err(got) if isinstance(got, BaseException) else str(got))
    return out


def _registration(op: torch._ops.OpOverload, place: Callable[[bool], tuple[tuple[Any, ...], dict[str, Any]]],
                  key: str) -> Check:
    args, kwargs = place(True)
    flat = [t for t in pytree.arg_tree_leaves(*args, **kwargs) if isinstance(t, torch.Tensor)]
    if not any(t.requires_grad for t in flat):
        return na("no floating-point input to require grad")
    devices = {t.device.type for t in flat}
    try:
        if devices <= set(_TORCH_DEVICES):
            from torch.testing._internal.optests.autograd_registration import autograd_registration_check

            autograd_registration_check(op, args, kwargs)
            return PASS
        autograd_registration(op, args, kwargs, key)
        return Check("pass", f"torch's check supports {', '.join(_TORCH_DEVICES)} only: the same check at "
                             f"Autograd{key}")
    except Exception as exc:  # noqa: BLE001 - the check's finding
        return fail(err(exc))
