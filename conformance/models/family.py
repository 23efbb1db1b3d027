"""``Family``: one model family as data (a parameter grid) plus build/input/loss callables.

A grid is an ordered mapping ``name -> list of values``; the family's specs are the
cartesian product in that order, filtered by ``valid``. ``id_fmt`` is a ``str.format``
template over the params that yields the stable, human-readable model id suffix.

Example:
    >>> import torch
    >>> from conformance.models.family import Family, grid_points
    >>> list(grid_points({"w": [8, 16], "act": ["relu"]}))
    [{'w': 8, 'act': 'relu'}, {'w': 16, 'act': 'relu'}]
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

Params = dict[str, Any]
InputsFn = Callable[[Params, int, torch.Generator], tuple]
LossFn = Callable[[Any, Params, torch.Generator], Tensor]

N_SHAPE_VARIANTS = 3


def grid_points(grid: Mapping[str, Sequence[Any]]) -> Iterator[Params]:
    """Cartesian product of ``grid`` in key order, last key varying fastest."""
    keys = list(grid)
    for values in itertools.product(*(grid[k] for k in keys)):
        yield dict(zip(keys, values, strict=True))


def float_leaves(output: Any) -> list[Tensor]:
    """Floating-point tensors in a (nested) output, in order."""
    if isinstance(output, Tensor):
        return [output] if output.is_floating_point() else []
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, list | tuple):
        return [t for o in output for t in float_leaves(o)]
    return []


def sumsq_loss(output: Any, params: Params, gen: torch.Generator) -> Tensor:
    """Mean of squares summed over every float tensor of the output (the default loss)."""
    return sum((t.float().square().mean() for t in float_leaves(output)), torch.zeros(()))


def pick(variant: int, values: Sequence[Any]) -> Any:
    """The value for shape variant ``variant`` (``values[0]`` is the canonical shape)."""
    return values[variant % len(values)]


def randn(gen: torch.Generator, *shape: int) -> Tensor:
    """Seeded standard-normal float32 tensor."""
    return torch.randn(*shape, generator=gen)


def randint(gen: torch.Generator, high: int, *shape: int) -> Tensor:
    """Seeded int64 tensor in ``[0, high)`` (valid indices for a size-``high`` table)."""
    return torch.randint(0, high, shape, generator=gen)


def ce_loss(output: Any, params: Params, gen: torch.Generator) -> Tensor:
    """Cross-entropy of the first output (logits, classes last) against generated targets."""
    logits = float_leaves(output)[0].float()
    flat = logits.reshape(-1, logits.shape[-1])
    target = torch.randint(0, flat.shape[-1], (flat.shape[0],), generator=gen)
    return F.cross_entropy(flat, target)


@dataclass(frozen=True)
class Family:
    """A model family: a parameter grid (data) and the callables that realise one point.

    ``inputs(params, variant, gen)`` returns the forward inputs for shape variant
    ``variant`` in ``range(N_SHAPE_VARIANTS)`` (variant 0 is the canonical one).
    """

    name: str
    description: str
    grid: Mapping[str, Sequence[Any]]
    id_fmt: str
    build: Callable[[Params], nn.Module]
    inputs: InputsFn
    loss: LossFn = sumsq_loss
    valid: Callable[[Params], bool] = field(default=lambda p: True)
    supports_bf16: bool = True

    def points(self) -> Iterator[Params]:
        """Valid grid points in deterministic order."""
        return (p for p in grid_points(self.grid) if self.valid(p))

    def model_id(self, params: Params) -> str:
        """Stable id: ``<family>.<id_fmt formatted with params>``."""
        return f"{self.name}.{self.id_fmt.format(**params)}"
