"""The references of custom ops, in code: for an op's overload name, a CPU function that computes
what the op should (from plain PyTorch) and a seeded generator of its inputs.

A custom op found on a target (:mod:`conformance.customops.discovery`) whose name is here has its
values checked against the reference, forward and backward, eager and compiled; one that is not
here is checked structurally only (``torch.library.opcheck`` on inputs generated from its schema),
and never reported as passing values.

A reference takes the op's own arguments (CPU tensors of the item's dtype, or float64 copies for
the arbiter) and returns what the op returns. Its samples are plain data: the arguments, and which
of them the backward items differentiate (``wrt``). A device package, or a test, adds its own
with :func:`register`.

Example::

    >>> import torch
    >>> ref = reference_for("neuron::rms_norm.default")
    >>> s = ref.samples(torch.float32, 0)[0]
    >>> ref.fn(*s.args, **s.kwargs).shape, s.wrt
    (torch.Size([2, 3, 16]), (0, 1))
    >>> reference_for("neuron::rms_norm_backward.default") is None
    True
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Sample:
    """One call of a custom op: its arguments (CPU tensors) and the positions of the positional
    arguments whose gradients the backward items compare (empty: no backward item)."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    wrt: tuple[int, ...] = ()


@dataclass(frozen=True)
class Reference:
    """What a custom op should compute. ``fn``: the CPU reference, called with the op's arguments;
    ``samples(dtype, seed)``: the seeded samples its items run (the same for every build and
    target); ``source``: the reference in words, shown with the results."""

    op: str  # the overload name, e.g. neuron::flash_attention.default
    fn: Callable[..., Any]
    samples: Callable[[torch.dtype, int], list[Sample]]
    source: str

    def __post_init__(self) -> None:
        if "::" not in self.op or "." not in self.op.split("::", 1)[1]:
            raise ValueError(f"Reference op {self.op!r}: expected an overload name like 'ns::op.default'")


REFERENCES: dict[str, Reference] = {}


def register(ref: Reference) -> Reference:
    """Declare (or replace) the reference of ``ref.op``."""
    REFERENCES[ref.op] = ref
    return ref


def reference_for(op: str) -> Reference | None:
    """The reference declared for the overload ``op``, or None (then: structural checks only)."""
    return REFERENCES.get(op)


def randn(gen: torch.Generator, *shape: int, dtype: torch.dtype) -> torch.Tensor:
    """Seeded normal values drawn in float32 and rounded to ``dtype`` (the same draw for every dtype)."""
    return torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype)


def _gen(seed: int, op: str) -> torch.Generator:
    # each op its own stream: adding a reference leaves the other ops' samples as they were
    return torch.Generator().manual_seed((seed * 1_000_003 + sum(map(ord, op))) % 2**63)


# -- the emulated neuron device's custom ops (neuron_emu/custom_ops.py); TorchNeuron's own ---------
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _rms_norm_samples(dtype: torch.dtype, seed: int) -> list[Sample]:
    g = _gen(seed, "rms_norm")
    return [Sample((randn(g, 2, 3, 16, dtype=dtype), randn(g, 16, dtype=dtype), 1e-6), wrt=(0, 1)),
            Sample((randn(g, 4, 32, dtype=dtype), randn(g, 32, dtype=dtype), 1e-5), wrt=(0, 1))]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding, Llama's rotate-half convention."""
    return x * cos + rotate_half(x) * sin


def rope_tables(seq: int, dim: int, dtype: torch.dtype, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) of shape [seq, dim] as a Llama model builds them."""
    inv = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = torch.outer(torch.arange(seq, dtype=torch.float64), inv)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _rope_samples(dtype: torch.dtype, seed: int) -> list[Sample]:
    g = _gen(seed, "rope")
    return [Sample((randn(g, 1, 2, 4, 8, dtype=dtype), *rope_tables(4, 8, dtype)), wrt=(0,)),
            Sample((randn(g, 2, 3, 5, 16, dtype=dtype), *rope_tables(5, 16, dtype)), wrt=(0,))]


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
                    scale: float | None = None) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale)


def _attention_samples(dtype: torch.dtype, seed: int) -> list[Sample]:
    g = _gen(seed, "flash_attention")
    qkv = [randn(g, 1, 2, 8, 16, dtype=dtype) for _ in range(3)]
    causal = [randn(g, 2, 3, 6, 8, dtype=dtype) for _ in range(3)]
    return [Sample(tuple(qkv), wrt=(0, 1, 2)),
            Sample(tuple(causal), {"is_causal": True, "scale": 1 / math.sqrt(8) * 0.8}, wrt=(0, 1, 2))]


register(Reference("neuron::rms_norm.default", rms_norm, _rms_norm_samples,
                   "x * rsqrt(mean(x^2, -1) + eps) * weight (plain PyTorch on the CPU)"))
register(Reference("neuron::rope.default", rope, _rope_samples,
                   "x * cos + rotate_half(x) * sin, Llama's rotate-half convention (plain PyTorch on the CPU)"))
register(Reference("neuron::flash_attention.default", flash_attention, _attention_samples,
                   "torch.nn.functional.scaled_dot_product_attention on the CPU"))
