"""Shared plain-``torch.nn`` building blocks for the model families.

Every block is small and selected by a string so that family grids stay pure data.

Example:
    >>> import torch
    >>> from conformance.models.layers import Attention, make_act
    >>> attn = Attention(16, heads=2, impl="math", causal=True)
    >>> attn(torch.randn(1, 4, 16)).shape
    torch.Size([1, 4, 16])
    >>> type(make_act("silu")).__name__
    'SiLU'
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
    "silu": nn.SiLU,
    "tanh": nn.Tanh,
    "relu6": nn.ReLU6,
    "hardswish": nn.Hardswish,
    "leaky_relu": lambda: nn.LeakyReLU(0.1),
    "elu": nn.ELU,
    "mish": nn.Mish,
    "sigmoid": nn.Sigmoid,
}


def make_act(name: str) -> nn.Module:
    """Activation module by name (see ``ACTIVATIONS``)."""
    return ACTIVATIONS[name]()


def make_norm(name: str, dim: int) -> nn.Module:
    """Feature norm over the last dim: ``ln`` | ``rms`` | ``bn`` (BatchNorm1d on 2-D input) | ``none``."""
    if name == "ln":
        return nn.LayerNorm(dim)
    if name == "rms":
        return nn.RMSNorm(dim, eps=1e-6)
    if name == "bn":
        return nn.BatchNorm1d(dim)
    if name == "none":
        return nn.Identity()
    raise ValueError(f"unknown norm {name!r}")


def make_norm2d(name: str, channels: int, groups: int = 4) -> nn.Module:
    """Channel norm for NCHW: ``bn`` | ``gn`` | ``in`` | ``none``."""
    if name == "bn":
        return nn.BatchNorm2d(channels)
    if name == "gn":
        return nn.GroupNorm(min(groups, channels), channels)
    if name == "in":
        return nn.InstanceNorm2d(channels, affine=True)
    if name == "none":
        return nn.Identity()
    raise ValueError(f"unknown norm2d {name!r}")


def rope_tables(max_len: int, head_dim: int, base: float = 10000.0) -> tuple[Tensor, Tensor]:
    """Rotary cos/sin tables of shape ``(max_len, head_dim)``."""
    inv = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    ang = torch.outer(torch.arange(max_len, dtype=torch.float32), inv)
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos(), ang.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate ``x`` (B, H, T, D) by tables broadcastable to (T, D)."""
    x1, x2 = x.chunk(2, dim=-1)
    rot = torch.cat([-x2, x1], dim=-1)
    return x * cos + rot * sin


def sinusoidal(positions: Tensor, dim: int) -> Tensor:
    """Sinusoidal embedding of float/int ``positions`` (...,) -> (..., dim)."""
    half = dim // 2
    freqs = torch.exp(
        -math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=positions.device) / half
    )
    ang = positions.float()[..., None] * freqs
    return torch.cat([ang.sin(), ang.cos()], dim=-1)


def attend(
    q: Tensor, k: Tensor, v: Tensor, impl: str, causal: bool = False, mask: Tensor | None = None
) -> Tensor:
    """Attention over (B, H, T, D): ``sdpa`` (fused op) or ``math`` (matmul + softmax)."""
    if impl == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None)
    scores = q @ k.transpose(-2, -1) * (q.shape[-1] ** -0.5)
    if causal and mask is None:
        t, s = q.shape[-2], k.shape[-2]
        mask = torch.ones(t, s, dtype=torch.bool, device=q.device).tril(s - t)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(dim=-1) @ v


class Attention(nn.Module):
    """Multi-head self/cross attention with separate q/k/v projections.

    ``impl``: ``sdpa`` | ``math``. ``kv`` (cross-attention source) defaults to ``x``.
    """

    def __init__(self, dim: int, heads: int, impl: str = "sdpa", causal: bool = False, bias: bool = True):
        super().__init__()
        self.heads, self.impl, self.causal = heads, impl, causal
        self.q = nn.Linear(dim, dim, bias=bias)
        self.k = nn.Linear(dim, dim, bias=bias)
        self.v = nn.Linear(dim, dim, bias=bias)
        self.o = nn.Linear(dim, dim, bias=bias)

    def split(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        return x.view(b, t, self.heads, d // self.heads).transpose(1, 2)

    def forward(
        self, x: Tensor, kv: Tensor | None = None, rope: tuple[Tensor, Tensor] | None = None
    ) -> Tensor:
        src = x if kv is None else kv
        q, k, v = self.split(self.q(x)), self.split(self.k(src)), self.split(self.v(src))
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        out = attend(q, k, v, self.impl, causal=self.causal)
        b, h, t, dh = out.shape
        return self.o(out.transpose(1, 2).reshape(b, t, h * dh))


class FeedForward(nn.Module):
    """Position-wise MLP; ``kind``: ``swiglu`` (gated SiLU) or any activation name."""

    def __init__(self, dim: int, hidden: int, kind: str = "gelu"):
        super().__init__()
        self.gated = kind == "swiglu"
        self.up = nn.Linear(dim, hidden * (2 if self.gated else 1))
        self.act = nn.SiLU() if self.gated else make_act(kind)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        h = self.up(x)
        if self.gated:
            a, g = h.chunk(2, dim=-1)
            return self.down(self.act(a) * g)
        return self.down(self.act(h))


class TransformerLayer(nn.Module):
    """Pre- or post-norm transformer layer with optional cross-attention."""

    def __init__(
        self,
        dim: int,
        heads: int,
        *,
        norm: str = "ln",
        prenorm: bool = True,
        ff: str = "gelu",
        impl: str = "sdpa",
        causal: bool = False,
        cross: bool = False,
        ff_mult: int = 2,
    ):
        super().__init__()
        self.prenorm = prenorm
        self.attn = Attention(dim, heads, impl, causal)
        self.n1 = make_norm(norm, dim)
        self.cross = Attention(dim, heads, impl) if cross else None
        self.nc = make_norm(norm, dim) if cross else None
        self.ff = FeedForward(dim, dim * ff_mult, ff)
        self.n2 = make_norm(norm, dim)

    def _sub(self, x: Tensor, norm: nn.Module, fn: Callable[[Tensor], Tensor]) -> Tensor:
        return x + fn(norm(x)) if self.prenorm else norm(x + fn(x))

    def forward(
        self, x: Tensor, memory: Tensor | None = None, rope: tuple[Tensor, Tensor] | None = None
    ) -> Tensor:
        x = self._sub(x, self.n1, lambda h: self.attn(h, rope=rope))
        if self.cross is not None:
            x = self._sub(x, self.nc, lambda h: self.cross(h, kv=memory))
        return self._sub(x, self.n2, self.ff)
