"""Registry of model families and the deterministic enumeration of graph specs.

Example:
    >>> from conformance.models.registry import FAMILIES, enumerate_graphs
    >>> spec = next(enumerate_graphs(["gpt"]))
    >>> model = spec.build()
    >>> out = model(*spec.example_inputs())
    >>> spec.loss(out).backward()
    >>> len(spec.shape_variants())
    3
    >>> len(spec.graph_hash())
    20
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from .families import ALL_FAMILIES
from .family import N_SHAPE_VARIANTS, Family
from .tracing import Traceable, aten_histogram, graph_hash

__all__ = [
    "FAMILIES",
    "Family",
    "GraphSpec",
    "aten_histogram",
    "enumerate_graphs",
    "graph_hash",
    "spec_by_id",
]

FAMILIES: dict[str, Family] = {f.name: f for f in ALL_FAMILIES}


def _seed(*parts: Any) -> int:
    """Stable 32-bit seed from parts (independent of PYTHONHASHSEED)."""
    return zlib.crc32("|".join(map(str, parts)).encode())


@dataclass(frozen=True)
class GraphSpec(Traceable):
    """One point of a family's grid: a buildable, seeded, traceable model graph.

    ``seed`` only changes values (weights, inputs, targets), never the graph structure.
    """

    model_id: str
    family: str
    params: dict[str, Any] = field(hash=False)
    seed: int = 0
    supports_bf16: bool = True

    @property
    def family_def(self) -> Family:
        return FAMILIES[self.family]

    def build(self) -> nn.Module:
        """The model in train mode, float32 on CPU, weights drawn from a fixed seed.

        The global default generator is re-seeded for construction and restored afterwards.
        """
        gen = torch.default_generator
        saved = gen.get_state()
        gen.manual_seed(_seed(self.model_id, self.seed, "weights"))
        try:
            model = self.family_def.build(dict(self.params))
        finally:
            gen.set_state(saved)
        return model.float().train()

    def example_inputs(self, batch_shape_variant: int = 0) -> tuple:
        """Forward inputs (seeded) for shape variant ``batch_shape_variant`` (0 = canonical)."""
        gen = torch.Generator().manual_seed(_seed(self.model_id, self.seed, "inputs", batch_shape_variant))
        return self.family_def.inputs(dict(self.params), batch_shape_variant, gen)

    def shape_variants(self) -> list[tuple]:
        """``N_SHAPE_VARIANTS`` input tuples for a shape sweep; the first equals ``example_inputs()``."""
        return [self.example_inputs(v) for v in range(N_SHAPE_VARIANTS)]

    def loss(self, output: Any) -> Tensor:
        """Scalar training loss of ``output`` (targets, if any, are generated from the seed)."""
        gen = torch.Generator().manual_seed(_seed(self.model_id, self.seed, "targets"))
        return self.family_def.loss(output, dict(self.params), gen)



def _check_families(families: Sequence[str] | None) -> list[str]:
    if families is None:
        return list(FAMILIES)
    if isinstance(families, str):
        families = [families]
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        raise ValueError(
            f"unknown model famil{'y' if len(unknown) == 1 else 'ies'} {unknown}; known: {sorted(FAMILIES)}"
        )
    return list(families)


def enumerate_graphs(families: Sequence[str] | None = None, limit: int | None = None) -> Iterator[GraphSpec]:
    """Graph specs of the given families (all by default), family by family, grid order.

    Deterministic: the same arguments always yield the same specs in the same order.
    Raises ``ValueError`` (eagerly) for an unknown family name.
    """
    names = _check_families(families)

    def gen() -> Iterator[GraphSpec]:
        count = 0
        for name in names:
            fam = FAMILIES[name]
            for params in fam.points():
                if limit is not None and count >= limit:
                    return
                yield GraphSpec(fam.model_id(params), name, params, supports_bf16=fam.supports_bf16)
                count += 1

    return gen()


def spec_by_id(model_id: str) -> GraphSpec:
    """Look a spec up by its ``model_id``."""
    family = model_id.split(".", 1)[0]
    for spec in enumerate_graphs([family]):
        if spec.model_id == model_id:
            return spec
    raise KeyError(model_id)
