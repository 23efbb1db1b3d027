"""UNet encoder/decoder with skip connections (concat or add) and three upsampling modes.

Example:
    >>> from conformance.models.registry import enumerate_graphs
    >>> spec = next(enumerate_graphs(["unet"]))
    >>> spec.build()(*spec.example_inputs()).shape
    torch.Size([2, 2, 16, 16])
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from conformance.models.family import Family, Params, pick, randn
from conformance.models.layers import make_norm2d

IN_CH, OUT_CH = 3, 2
GRID = {
    "depth": [1, 2, 3],
    "width": [8, 16],
    "up": ["convT", "nearest", "bilinear"],
    "skip": ["cat", "add"],
    "norm": ["bn", "gn", "none"],
    "res": [16, 32],
}


def conv_block(cin: int, cout: int, norm: str) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1), make_norm2d(norm, cout), nn.ReLU(),
        nn.Conv2d(cout, cout, 3, padding=1), make_norm2d(norm, cout), nn.ReLU(),
    )  # fmt: skip


class Up(nn.Module):
    def __init__(self, cin: int, cout: int, p: Params):
        super().__init__()
        self.mode, self.skip = p["up"], p["skip"]
        self.up = nn.ConvTranspose2d(cin, cout, 2, 2) if self.mode == "convT" else nn.Conv2d(cin, cout, 1)
        self.conv = conv_block(cout * 2 if self.skip == "cat" else cout, cout, p["norm"])

    def forward(self, x: Tensor, skip: Tensor) -> Tensor:
        if self.mode == "convT":
            x = self.up(x)
        else:
            align = {"align_corners": False} if self.mode == "bilinear" else {}
            x = self.up(F.interpolate(x, scale_factor=2.0, mode=self.mode, **align))
        x = torch.cat([x, skip], dim=1) if self.skip == "cat" else x + skip
        return self.conv(x)


class UNet(nn.Module):
    def __init__(self, p: Params):
        super().__init__()
        chans = [p["width"] * 2**i for i in range(p["depth"] + 1)]
        self.inc = conv_block(IN_CH, chans[0], p["norm"])
        self.downs = nn.ModuleList(conv_block(chans[i], chans[i + 1], p["norm"]) for i in range(p["depth"]))
        self.ups = nn.ModuleList(Up(chans[i + 1], chans[i], p) for i in reversed(range(p["depth"])))
        self.out = nn.Conv2d(chans[0], OUT_CH, 1)

    def forward(self, x: Tensor) -> Tensor:
        skips = [self.inc(x)]
        for down in self.downs:
            skips.append(down(F.max_pool2d(skips[-1], 2)))
        x = skips.pop()
        for up in self.ups:
            x = up(x, skips.pop())
        return self.out(x)


def inputs(p: Params, variant: int, gen: torch.Generator) -> tuple:
    res = pick(variant, (p["res"], p["res"] * 2, p["res"] + 2 ** p["depth"]))
    return (randn(gen, 2, IN_CH, res, res),)


FAMILY = Family(
    name="unet",
    description="UNet (down/up paths, cat/add skips, transposed-conv or interpolation upsampling)",
    grid=GRID,
    id_fmt="d{depth}w{width}.{up}.{skip}.{norm}.r{res}",
    build=UNet,
    inputs=inputs,
)
