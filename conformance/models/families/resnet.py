"""ResNet-style CNN with basic or bottleneck residual blocks.

Example:
    >>> from conformance.models.registry import enumerate_graphs
    >>> spec = next(enumerate_graphs(["resnet"]))
    >>> spec.build()(*spec.example_inputs()).shape
    torch.Size([2, 10])
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from conformance.models.family import Family, Params, ce_loss, pick, randn
from conformance.models.layers import make_act, make_norm2d

CLASSES = 10
GRID = {
    "block": ["basic", "bottleneck"],
    "stages": [1, 2],
    "width": [8, 16],
    "blocks": [1, 2],
    "norm": ["bn", "gn", "none"],
    "act": ["relu", "silu"],
    "res": [16, 32],
}


class Block(nn.Module):
    """Basic (3x3, 3x3) or bottleneck (1x1, 3x3, 1x1) residual block."""

    def __init__(self, cin: int, cout: int, stride: int, p: Params):
        super().__init__()
        norm, act = p["norm"], p["act"]
        if p["block"] == "basic":
            shapes = [(cin, cout, 3, stride), (cout, cout, 3, 1)]
        else:
            mid = max(cout // 4, 2)
            shapes = [(cin, mid, 1, 1), (mid, mid, 3, stride), (mid, cout, 1, 1)]
        layers: list[nn.Module] = []
        for i, (a, b, k, s) in enumerate(shapes):
            layers += [nn.Conv2d(a, b, k, s, k // 2, bias=norm == "none"), make_norm2d(norm, b)]
            if i < len(shapes) - 1:
                layers.append(make_act(act))
        self.body = nn.Sequential(*layers)
        self.short = (
            nn.Identity()
            if stride == 1 and cin == cout
            else nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), make_norm2d(norm, cout))
        )
        self.act = make_act(act)

    def forward(self, x: Tensor) -> Tensor:
        return self.act(self.body(x) + self.short(x))


class ResNet(nn.Module):
    def __init__(self, p: Params):
        super().__init__()
        w = p["width"]
        self.stem = nn.Sequential(
            nn.Conv2d(3, w, 3, 1, 1, bias=False), make_norm2d(p["norm"], w), make_act(p["act"])
        )
        blocks: list[nn.Module] = []
        cin = w
        for s in range(p["stages"]):
            cout = w * 2**s * (2 if p["block"] == "bottleneck" else 1)
            for b in range(p["blocks"]):
                blocks.append(Block(cin, cout, 2 if (s > 0 and b == 0) else 1, p))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(cin, CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.blocks(self.stem(x)).mean(dim=(2, 3)))


def inputs(p: Params, variant: int, gen: torch.Generator) -> tuple:
    res = pick(variant, (p["res"], p["res"] // 2, p["res"] + 8))
    return (randn(gen, 2, 3, res, res),)


FAMILY = Family(
    name="resnet",
    description="CNN with ResNet basic/bottleneck blocks",
    grid=GRID,
    id_fmt="{block}.s{stages}w{width}b{blocks}.{norm}.{act}.r{res}",
    build=ResNet,
    inputs=inputs,
    loss=ce_loss,
)
