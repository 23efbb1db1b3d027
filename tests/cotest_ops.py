"""Custom ops of a test device package, registered for the ``PrivateUse1`` key (the emulated
``neuron`` device) through ``torch.library.Library`` when imported, in the test process or in a
run's workers (``--import cotest_ops``): the custom-op lane must find and check them knowing
nothing of them, as it checks a real device's NKI kernels (tests/test_customops.py).

``cotest::rms_norm`` is right; each ``cotest::bad_*`` is wrong in one way the lane must name:
its fake implementation's shape, its backward, its bfloat16 values. ``cotest::scale`` declares no
reference (checked structurally only). ``cotest::victim`` kills its worker when the item in flight
is :data:`VICTIM` (read from the worker's shared in-flight slot, as tests/dying_targets.py does).
References of every op but ``scale`` are declared with the lane's registry.
"""

from __future__ import annotations

import os
import signal

import torch

from conformance.check import execute
from conformance.customops.references import Reference, Sample, randn, register, rms_norm

VICTIM = "cotest::victim.default|custom_fwd|float32|0"
RMS = ("rms_norm", "bad_fake", "bad_grad", "bad_bf16", "victim")

lib = torch.library.Library("cotest", "DEF")


def _math(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """On CPU copies in float32, rounded once (as a device kernel would), back on the device."""
    y = rms_norm(x.detach().cpu().float(), w.detach().cpu().float(), eps)
    return y.to(x.dtype).to(x.device)


def _kernel(name: str):
    def kernel(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        y = _math(x, w, eps)
        if name == "bad_bf16" and x.dtype == torch.bfloat16:
            y = y + 0.25
        if name == "victim":
            slot = getattr(execute._PHASE_HOOK, "__self__", None)  # conformance.run.isolation.Inflight
            if slot is not None and slot.read()[1] == VICTIM:
                os.kill(os.getpid(), signal.SIGSEGV)
        return y

    return kernel


def _fake(name: str):
    def fake(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        return x.new_empty((*x.shape[:-1], x.shape[-1] + 1)) if name == "bad_fake" else torch.empty_like(x)

    return fake


def _setup(ctx, inputs, output) -> None:  # noqa: ANN001
    ctx.save_for_backward(inputs[0], inputs[1])
    ctx.eps = inputs[2]


def _backward(name: str):
    def backward(ctx, grad: torch.Tensor):  # noqa: ANN001
        x, w = ctx.saved_tensors
        with torch.enable_grad():
            xc, wc = (t.detach().cpu().float().requires_grad_() for t in (x, w))
            gx, gw = torch.autograd.grad(rms_norm(xc, wc, ctx.eps), (xc, wc), grad.detach().cpu().float())
        if name == "bad_grad":
            gx = gx * 1.5
        return gx.to(x.dtype).to(x.device), gw.to(w.dtype).to(w.device), None

    return backward


def _samples(dtype: torch.dtype, seed: int) -> list[Sample]:
    g = torch.Generator().manual_seed(seed)
    return [Sample((randn(g, 2, 8, dtype=dtype), randn(g, 8, dtype=dtype), 1e-6), wrt=(0, 1))]


for _name in RMS:
    lib.define(f"{_name}(Tensor x, Tensor weight, float eps) -> Tensor")
    lib.impl(_name, _kernel(_name), "PrivateUse1")
    torch.library.register_fake(f"cotest::{_name}", _fake(_name), lib=lib)
    torch.library.register_autograd(f"cotest::{_name}", _backward(_name), setup_context=_setup, lib=lib)
    register(Reference(f"cotest::{_name}.default", rms_norm, _samples, "rms_norm (tests/cotest_ops.py)"))

lib.define("scale(Tensor x, float s) -> Tensor")
lib.impl("scale", lambda x, s: (x.detach().cpu() * s).to(x.device), "PrivateUse1")
torch.library.register_fake("cotest::scale", lambda x, s: torch.empty_like(x), lib=lib)
