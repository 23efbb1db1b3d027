"""Numerics of the emulated NeuronCore, as pure functions on tensors (any device).

Each knob of a manifest's ``[numerics]`` table maps to one function here:

* ``matmul_inputs``       -> :func:`round_to_format` (operands rounded to bf16/fp16, fp32 accumulate)
* ``transcendental_bits`` -> :func:`round_mantissa` (results keep N mantissa bits)
* ``sin_range_reduction`` -> :func:`sin_no_range_reduction` / :func:`cos_no_range_reduction`
* ``flush_denormals``     -> :func:`flush_denormals` (the C++ native path sets FTZ/DAZ on every intra-op thread instead)
* ``rounding``            -> ``stochastic=True`` with a generator on the rounding functions

Example::

    >>> import torch
    >>> from neuron_emu.numerics import round_mantissa, sin_no_range_reduction
    >>> float(round_mantissa(torch.tensor([1.0 + 2**-10]), 7)[0])
    1.0
    >>> abs(float(sin_no_range_reduction(torch.tensor([9.0]))[0]) - 0.412) > 10
    True
"""

from __future__ import annotations

import torch

# Fixed minimax-style (least squares on Chebyshev nodes over [-pi, pi]) odd/even polynomials,
# evaluated without range reduction as the raw activation ISA does: accurate (< 1e-7) inside
# [-pi, pi], garbage outside (sin(9.0) ~ -161).
_SIN_COEFFS = (
    0.9999995998273281, -0.166665526141691, 0.00833240285111083, -0.00019808629757423534,
    2.69971060203655e-06, -2.036208137620136e-08,
)
_COS_COEFFS = (
    0.9999999889943568, -0.4999998909720602, 0.04166648918160148, -0.0013887803442032033,
    2.476988028149394e-05, -2.707899867019515e-07, 1.7244973261370797e-09,
)
_FORMAT_BITS = {"bf16": 7, "fp16": 10, "fp32": 23, torch.bfloat16: 7, torch.float16: 10, torch.float32: 23}
_TINY = torch.finfo(torch.float32).tiny


def round_mantissa(x: torch.Tensor, bits: int, stochastic: bool = False,
                   generator: torch.Generator | None = None) -> torch.Tensor:
    """Rounds float values to `bits` explicit mantissa bits (float32 exponent range).

    Round-to-nearest-even via integer bit operations on the float32 encoding, or stochastic
    rounding (add uniform random bits below the kept LSB, truncate) drawing from `generator`.
    Returns a tensor of x's dtype; inf/nan pass through.
    """
    drop = 23 - int(bits)
    if drop <= 0 or not x.is_floating_point():
        return x
    xf = x.float()
    i = xf.view(torch.int32)
    mask = (1 << drop) - 1
    if stochastic:
        noise = torch.randint(0, 1 << drop, xf.shape, generator=generator, dtype=torch.int32)
        r = (i + noise.to(x.device)) & ~mask
    else:
        lsb = (i >> drop) & 1
        r = (i + ((1 << (drop - 1)) - 1) + lsb) & ~mask
    out = torch.where(torch.isfinite(xf), r.view(torch.float32), xf)
    return out.to(x.dtype)


def round_to_format(x: torch.Tensor, fmt: str, stochastic: bool = False,
                    generator: torch.Generator | None = None) -> torch.Tensor:
    """Rounds float32 values to the precision of "bf16"/"fp16" (the dtype is kept)."""
    if fmt == "fp32" or not x.is_floating_point():
        return x
    target = torch.bfloat16 if fmt == "bf16" else torch.float16
    if not stochastic:
        return x.to(target).to(x.dtype)
    y = round_mantissa(x, _FORMAT_BITS[fmt], stochastic=True, generator=generator)
    return y.to(target).to(x.dtype)


def stochastic_cast(x: torch.Tensor, dtype: torch.dtype, generator: torch.Generator | None) -> torch.Tensor:
    """Casts float32 `x` to bfloat16/float16 with stochastic rounding."""
    return round_mantissa(x.float(), _FORMAT_BITS[dtype], stochastic=True, generator=generator).to(dtype)


def _horner_odd(x: torch.Tensor, coeffs) -> torch.Tensor:
    x2 = x * x
    acc = torch.full_like(x, coeffs[-1])
    for c in reversed(coeffs[:-1]):
        acc = acc * x2 + c
    return acc * x


def _horner_even(x: torch.Tensor, coeffs) -> torch.Tensor:
    x2 = x * x
    acc = torch.full_like(x, coeffs[-1])
    for c in reversed(coeffs[:-1]):
        acc = acc * x2 + c
    return acc


def sin_no_range_reduction(x: torch.Tensor) -> torch.Tensor:
    """sin as a fixed polynomial in x (no range reduction): right in [-pi, pi] only."""
    return _horner_odd(x.float(), _SIN_COEFFS).to(x.dtype)


def cos_no_range_reduction(x: torch.Tensor) -> torch.Tensor:
    """cos as a fixed polynomial in x (no range reduction): right in [-pi, pi] only."""
    return _horner_even(x.float(), _COS_COEFFS).to(x.dtype)


def flush_denormals(x: torch.Tensor) -> torch.Tensor:
    """Replaces float32-subnormal magnitudes by (signed) zero."""
    if not x.is_floating_point():
        return x
    return torch.where(x.abs() < _TINY, x * 0, x)
