"""The backend's own custom ops (``neuron::``), registered for the device through ``torch.library``
as TorchNeuron registers NKI kernels (``@nki_op``): a kernel for the device key only (PrivateUse1;
none for the CPU), a fake implementation and autograd whose gradients come from a backward op of
the op's own::

    neuron::rms_norm(Tensor x, Tensor weight, float eps) -> Tensor
        x * rsqrt(mean(x^2, -1) + eps) * weight
    neuron::rope(Tensor x, Tensor cos, Tensor sin) -> Tensor
        x * cos + rotate_half(x) * sin (Llama's rotate-half convention; cos, sin broadcast to x)
    neuron::flash_attention(Tensor q, Tensor k, Tensor v, bool is_causal=False, float? scale=None) -> Tensor
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=..., scale=...)
        (no mask, no dropout; q, k, v of shape [B, H, L, E], one dtype)
    neuron::rms_norm_backward(Tensor grad, Tensor x, Tensor weight, float eps) -> (Tensor, Tensor)
    neuron::rope_backward(Tensor grad, Tensor cos, Tensor sin) -> Tensor
    neuron::flash_attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, bool is_causal=False,
                                     float? scale=None) -> (Tensor, Tensor, Tensor)

The device kernel computes on CPU copies of its inputs as Trainium does: bfloat16/float16 in
float32, rounded once at the end; its results are on the device.  Each call counts in the op
tracking as a native op named "neuron::<name>.default".  The active build's defects reach the ops
at call time (``use_build`` changes them; see :mod:`neuron_emu.manifest`): the kinds of ATen ops
act on the device kernel (an ``error`` is recovered where the runtime recovers, by re-running the
op's CPU reference -- the same math in the inputs' own dtypes -- counted as a fallback);
``wrong_fake_shape``/``wrong_fake_dtype`` on the fake implementation; ``wrong_backward`` on the
outputs of the op's backward op.

Example::

    >>> import torch, neuron_emu
    >>> x = torch.randn(2, 8, device="neuron")
    >>> torch.ops.neuron.rms_norm(x, torch.ones(8, device="neuron"), 1e-6).shape
    torch.Size([2, 8])
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch

from . import defects as _defects
from .defect_targets import CUSTOM_ONLY_KINDS, CUSTOM_OPS
from .dispatch import _recovering
from .output_defects import _apply_output_defects, _garbage
from .routing import S, _ext, plan_for
from .tracking import raw, record

_HALF = (torch.bfloat16, torch.float16)
_FAKE_KINDS = ("wrong_fake_shape", "wrong_fake_dtype")
Meta = list[tuple[tuple, torch.dtype]]   # (shape, dtype) of each result


# ------------------------------------------------------------------ the math (any CPU dtype)
def _rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _rms_norm_backward(grad, x, weight, eps):
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    u = grad * weight
    gx = r * u - x * r.pow(3) * (u * x).mean(-1, keepdim=True)
    return gx, (grad * x * r).sum_to_size(weight.shape)


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def _rope(x, cos, sin):
    return x * cos + _rotate_half(x) * sin


def _rope_backward(grad, cos, sin):
    # rotate_half is the linear map R(x) = [-x2, x1], whose transpose is -R.
    return grad * cos - _rotate_half(grad * sin)


def _probs(q, k, is_causal, scale):
    s = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    scores = (q @ k.transpose(-2, -1)) * s
    if is_causal:  # scaled_dot_product_attention's mask: the lower triangle, aligned top-left
        keep = torch.ones(scores.shape[-2:], dtype=torch.bool).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, -1), s


def _flash_attention(q, k, v, is_causal=False, scale=None):
    return _probs(q, k, is_causal, scale)[0] @ v


def _flash_attention_backward(grad_out, q, k, v, is_causal=False, scale=None):
    p, s = _probs(q, k, is_causal, scale)
    gp = grad_out @ v.transpose(-2, -1)
    gs = p * (gp - (gp * p).sum(-1, keepdim=True))
    return (gs @ k) * s, (gs.transpose(-2, -1) @ q) * s, p.transpose(-2, -1) @ grad_out


# ------------------------------------------------------------------ result shapes and dtypes
def _meta_rms_norm(x, weight, eps) -> Meta:
    return [(tuple(torch.broadcast_shapes(x.shape, weight.shape)), torch.promote_types(x.dtype, weight.dtype))]


def _meta_rms_norm_backward(grad, x, weight, eps) -> Meta:
    return [(tuple(x.shape), x.dtype), (tuple(weight.shape), weight.dtype)]


def _check_rope(x, cos, sin) -> None:
    torch._check(x.dim() >= 1 and x.shape[-1] % 2 == 0,
                 lambda: f"neuron::rope: x's last dim must be even (rotate-half), got shape {tuple(x.shape)}")
    torch._check(tuple(torch.broadcast_shapes(x.shape, cos.shape, sin.shape)) == tuple(x.shape),
                 lambda: f"neuron::rope: cos {tuple(cos.shape)} and sin {tuple(sin.shape)} must broadcast to "
                         f"x {tuple(x.shape)}")


def _meta_rope(x, cos, sin) -> Meta:
    _check_rope(x, cos, sin)
    return [(tuple(x.shape), torch.promote_types(torch.promote_types(x.dtype, cos.dtype), sin.dtype))]


def _meta_rope_backward(grad, cos, sin) -> Meta:
    _check_rope(grad, cos, sin)
    return [(tuple(grad.shape), grad.dtype)]


def _check_attention(q, k, v) -> None:
    torch._check(q.dtype == k.dtype == v.dtype,
                 lambda: f"neuron::flash_attention: expected q, k and v of one dtype, got {q.dtype}, {k.dtype}, "
                         f"{v.dtype}")
    torch._check(q.dim() >= 2 and q.dim() == k.dim() == v.dim() and q.shape[-1] == k.shape[-1]
                 and k.shape[-2] == v.shape[-2],
                 lambda: "neuron::flash_attention: expected q [..., L, E], k [..., S, E], v [..., S, Ev], got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")


def _meta_flash_attention(q, k, v, is_causal=False, scale=None) -> Meta:
    _check_attention(q, k, v)
    return [((*q.shape[:-1], v.shape[-1]), q.dtype)]


def _meta_flash_attention_backward(grad_out, q, k, v, is_causal=False, scale=None) -> Meta:
    _check_attention(q, k, v)
    return [(tuple(t.shape), t.dtype) for t in (q, k, v)]


# ------------------------------------------------------------------ the ops
_SCHEMAS = {
    "rms_norm": "(Tensor x, Tensor weight, float eps) -> Tensor",
    "rms_norm_backward": "(Tensor grad, Tensor x, Tensor weight, float eps) -> (Tensor, Tensor)",
    "rope": "(Tensor x, Tensor cos, Tensor sin) -> Tensor",
    "rope_backward": "(Tensor grad, Tensor cos, Tensor sin) -> Tensor",
    "flash_attention": "(Tensor q, Tensor k, Tensor v, bool is_causal=False, float? scale=None) -> Tensor",
    "flash_attention_backward": "(Tensor grad_out, Tensor q, Tensor k, Tensor v, bool is_causal=False, "
                                "float? scale=None) -> (Tensor, Tensor, Tensor)",
}
_MATH: dict[str, Callable] = {n: globals()[f"_{n}"] for n in _SCHEMAS}
_META: dict[str, Callable[..., Meta]] = {n: globals()[f"_meta_{n}"] for n in _SCHEMAS}


def _full(name: str) -> str:
    return f"neuron::{name}.default"


def reference(name: str, *args):
    """The CPU reference of custom op `name` ("rms_norm", "neuron::rope.default", ...): the op's
    math on CPU copies of `args`, in their own dtypes (what a recovered call runs)."""
    short = name.removeprefix("neuron::").removesuffix(".default")
    return _compute(short, args, upcast=False, device="cpu")


def _compute(name: str, args: tuple, upcast: bool, device: str = "neuron"):
    """`name`'s math on CPU copies of `args` (16-bit floats in float32 if `upcast`), each result
    rounded once to its dtype, contiguous, on `device`."""
    cpu = [a.detach().cpu() if isinstance(a, torch.Tensor) else a for a in args]
    metas = _META[name](*cpu)
    if upcast:
        cpu = [a.float() if isinstance(a, torch.Tensor) and a.dtype in _HALF else a for a in cpu]
    outs = _MATH[name](*cpu)
    outs = outs if isinstance(outs, tuple) else (outs,)
    res = tuple(o.to(dt).contiguous().to(device) for o, (_, dt) in zip(outs, metas, strict=True))
    return res if len(res) > 1 else res[0]


def _check_devices(name: str, args: tuple) -> None:
    schema = _SCHEMAS[name]
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor) and a.device.type != "neuron":
            raise RuntimeError(f"neuron::{name}{schema}: expected every tensor on the neuron device, "
                               f"argument {i} is on {a.device}")


def _kernel(name: str, args: tuple):
    """The device kernel of custom op `name`, with the active build's defects on it (see the
    module doc) and, for a backward op, the ``wrong_backward`` defects of its forward op."""
    _check_devices(name, args)
    if _ext().get_raw():  # the emulator's own call: untracked, no defects
        return _compute(name, args, upcast=True)
    full, ds = _full(name), S.defect_state
    plan = plan_for(full)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    fired = ds.firing([i for i in plan.defects if ds.defects[i].kind not in CUSTOM_ONLY_KINDS], tensors)
    bad_grads = []
    if name.endswith("_backward"):
        fwd = plan_for(_full(name.removesuffix("_backward")))
        bad_grads = ds.firing([i for i in fwd.defects if ds.defects[i].kind == "wrong_backward"], tensors)
    slow = math.prod(d.magnitude for d in ds.firing(plan.slow, tensors)) if plan.slow else 1.0
    t0 = time.perf_counter()
    fallback = False
    try:
        for d in fired:
            if d.kind in ("error", "crash", "hang"):
                _defects.raise_now(d, full, S.build.name)
            fallback = fallback or d.kind == "fallback"
    except RuntimeError as failed:
        return _recover(name, args, failed)
    record(full, fallback)
    try:
        with raw(2):
            out = _compute(name, args, upcast=not fallback)
    except Exception as err:
        if any(d.kind == "accepts_invalid" for d in fired):
            with raw(2):
                return _garbage(plan, args, {}, err)
        if fallback:
            raise
        return _recover(name, args, err)
    with raw(2):
        if fired:
            out = _apply_output_defects(plan, fired, out, args, {})
        for d in bad_grads:
            _defects.perturb_outputs(d, list(out) if isinstance(out, tuple) else [out], "wrong_result")
    if slow > 1.0:  # proportional extra work, as the C++ fallback does for ATen ops
        until = t0 + (time.perf_counter() - t0) * slow
        while time.perf_counter() < until:
            pass
    return out


def _recover(name: str, args: tuple, failed: Exception):
    """A failed device execution re-run on the op's CPU reference where the runtime recovers
    (counted and warned once as a fallback), as :func:`neuron_emu.dispatch._recover` does for ATen."""
    if not _recovering():
        raise failed
    try:
        with raw(2):
            out = _compute(name, args, upcast=False)
    except Exception as cpu_error:
        raise cpu_error from failed
    first = str(failed).strip().splitlines()[0] if str(failed).strip() else ""
    record(_full(name), True, recovered=f"{type(failed).__name__}: {first}")
    return out


def _fake(name: str, args: tuple):
    """The fake implementation of `name`: its results' shapes and dtypes, with the active build's
    ``wrong_fake_shape`` (last dim + 1) and ``wrong_fake_dtype`` defects on them."""
    metas = _META[name](*args)
    ds, like = S.defect_state, args[0]
    idx = [i for i in plan_for(_full(name)).defects if ds.defects[i].kind in _FAKE_KINDS]
    for d in ds.firing(idx, [a for a in args if isinstance(a, torch.Tensor)]) if idx else []:
        if d.kind == "wrong_fake_shape":
            metas = [((*s[:-1], s[-1] + 1) if len(s) else (2,), dt) for s, dt in metas]
        else:
            metas = [(s, _defects.wrong_dtype_of(dt)) for s, dt in metas]
    res = tuple(like.new_empty(s, dtype=dt) for s, dt in metas)
    return res if len(res) > 1 else res[0]


def _define(name: str):
    def kernel(*args):
        return _kernel(name, args)

    def fake(*args):
        return _fake(name, args)

    op = torch.library.custom_op(f"neuron::{name}", kernel, mutates_args=(), device_types="neuron",
                                 schema=_SCHEMAS[name])
    op.register_fake(fake)
    return op


rms_norm = _define("rms_norm")
rms_norm_backward = _define("rms_norm_backward")
rope = _define("rope")
rope_backward = _define("rope_backward")
flash_attention = _define("flash_attention")
flash_attention_backward = _define("flash_attention_backward")


def _save(ctx, inputs, output):
    ctx.save_for_backward(*(t for t in inputs if isinstance(t, torch.Tensor)))
    ctx.scalars = [a for a in inputs if not isinstance(a, torch.Tensor)]


def _rms_norm_grad(ctx, grad):
    x, weight = ctx.saved_tensors
    return (*torch.ops.neuron.rms_norm_backward(grad, x, weight, *ctx.scalars), None)


def _rope_grad(ctx, grad):
    _, cos, sin = ctx.saved_tensors
    return torch.ops.neuron.rope_backward(grad, cos, sin), None, None


def _flash_attention_grad(ctx, grad_out):
    q, k, v = ctx.saved_tensors
    return (*torch.ops.neuron.flash_attention_backward(grad_out, q, k, v, *ctx.scalars), None, None)


rms_norm.register_autograd(_rms_norm_grad, setup_context=_save)
rope.register_autograd(_rope_grad, setup_context=_save)
flash_attention.register_autograd(_flash_attention_grad, setup_context=_save)

#: Every custom op's OpOverload by its name in op tracking and defect globs ("neuron::rope.default").
OPS = {_full(n): getattr(torch.ops.neuron, n).default for n in _SCHEMAS}
assert tuple(sorted(OPS)) == CUSTOM_OPS, "defect_targets.CUSTOM_OPS must list the ops defined here"
