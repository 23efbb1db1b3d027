"""MLP classifier: Linear -> norm -> activation stacks.

Example:
    >>> from conformance.models.registry import enumerate_graphs
    >>> spec = next(enumerate_graphs(["mlp"]))
    >>> spec.model_id
    'mlp.d1w16.relu.none.bias'
    >>> spec.build()(*spec.example_inputs()).shape
    torch.Size([2, 10])
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from conformance.models.family import Family, Params, ce_loss, pick, randn
from conformance.models.layers import make_act, make_norm

IN_FEATURES, CLASSES = 12, 10
GRID = {
    "depth": [1, 2, 3],
    "width": [16, 32, 64],
    "act": ["relu", "gelu", "silu", "tanh"],
    "norm": ["none", "ln", "bn"],
    "bias": ["bias", "nobias"],
}


class MLP(nn.Module):
    def __init__(self, p: Params):
        super().__init__()
        layers: list[nn.Module] = []
        dim = IN_FEATURES
        for _ in range(p["depth"]):
            layers += [
                nn.Linear(dim, p["width"], bias=p["bias"] == "bias"),
                make_norm(p["norm"], p["width"]),
                make_act(p["act"]),
            ]
            dim = p["width"]
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(dim, CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.body(x))


def inputs(p: Params, variant: int, gen: torch.Generator) -> tuple:
    return (randn(gen, pick(variant, (2, 3, 4)), IN_FEATURES),)


FAMILY = Family(
    name="mlp",
    description="MLP classifier (Linear/norm/activation stacks)",
    grid=GRID,
    id_fmt="d{depth}w{width}.{act}.{norm}.{bias}",
    build=MLP,
    inputs=inputs,
    loss=ce_loss,
)
