"""MobileNet-style depthwise-separable CNN (V1 blocks or V2 inverted residuals, optional SE).

Example:
    >>> from conformance.models.registry import enumerate_graphs
    >>> spec = next(enumerate_graphs(["mobilenet"]))
    >>> spec.build()(*spec.example_inputs()).shape
    torch.Size([2, 10])
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from conformance.models.family import Family, Params, ce_loss, pick, randn
from conformance.models.layers import make_act

CLASSES = 10
GRID = {
    "width": [8, 16, 32],
    "blocks": [1, 2, 3],
    "expand": [1, 4],
    "act": ["relu6", "hardswish", "silu"],
    "se": ["se", "nose"],
    "res": [16, 24],
}


class SqueezeExcite(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(c, max(c // 4, 2), 1), nn.Conv2d(max(c // 4, 2), c, 1)

    def forward(self, x: Tensor) -> Tensor:
        s = x.mean(dim=(2, 3), keepdim=True)
        return x * torch.nn.functional.hardsigmoid(self.fc2(torch.relu(self.fc1(s))))


class Separable(nn.Module):
    """[1x1 expand] -> depthwise 3x3 -> [SE] -> 1x1 project, residual when shapes match."""

    def __init__(self, cin: int, cout: int, stride: int, p: Params):
        super().__init__()
        hid = cin * p["expand"]
        layers: list[nn.Module] = []
        if p["expand"] > 1:
            layers += [nn.Conv2d(cin, hid, 1, bias=False), nn.BatchNorm2d(hid), make_act(p["act"])]
        layers += [
            nn.Conv2d(hid, hid, 3, stride, 1, groups=hid, bias=False),
            nn.BatchNorm2d(hid),
            make_act(p["act"]),
        ]
        if p["se"] == "se":
            layers.append(SqueezeExcite(hid))
        layers += [nn.Conv2d(hid, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: Tensor) -> Tensor:
        y = self.body(x)
        return x + y if self.residual else y


class MobileNet(nn.Module):
    def __init__(self, p: Params):
        super().__init__()
        w = p["width"]
        self.stem = nn.Sequential(nn.Conv2d(3, w, 3, 2, 1, bias=False), nn.BatchNorm2d(w), make_act(p["act"]))
        self.blocks = nn.Sequential(*(Separable(w, w, 2 if i == 0 else 1, p) for i in range(p["blocks"])))
        self.head = nn.Linear(w, CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.blocks(self.stem(x)).mean(dim=(2, 3)))


def inputs(p: Params, variant: int, gen: torch.Generator) -> tuple:
    res = pick(variant, (p["res"], p["res"] + 8, p["res"] * 2))
    return (randn(gen, 2, 3, res, res),)


FAMILY = Family(
    name="mobilenet",
    description="Depthwise-separable CNN (MobileNet V1/V2 blocks, squeeze-excite)",
    grid=GRID,
    id_fmt="w{width}b{blocks}e{expand}.{act}.{se}.r{res}",
    build=MobileNet,
    inputs=inputs,
    loss=ce_loss,
)
