"""Vision Transformer: conv or linear patch embedding, CLS or mean pooling.

Position table covers 1.5x the canonical resolution; smaller grids use a prefix slice.

Example:
    >>> from conformance.models.registry import enumerate_graphs
    >>> spec = next(enumerate_graphs(["vit"]))
    >>> [spec.build()(*x).shape[-1] for x in spec.shape_variants()]
    [10, 10, 10]
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from conformance.models.family import Family, Params, ce_loss, pick, randn
from conformance.models.layers import TransformerLayer

CLASSES = 10
GRID = {
    "patch": [4, 8],
    "dim": [16, 32, 64],
    "depth": [1, 2],
    "heads": [2, 4],
    "pool": ["cls", "mean"],
    "embed": ["conv", "linear"],
    "res": [16, 32],
}


class ViT(nn.Module):
    def __init__(self, p: Params):
        super().__init__()
        d, ps = p["dim"], p["patch"]
        self.patch, self.conv, self.cls_pool = ps, p["embed"] == "conv", p["pool"] == "cls"
        self.embed = nn.Conv2d(3, d, ps, ps) if self.conv else nn.Linear(3 * ps * ps, d)
        self.cls = nn.Parameter(torch.zeros(1, 1, d)) if self.cls_pool else None
        max_patches = (p["res"] * 3 // 2 // ps) ** 2 + 1
        self.pos = nn.Parameter(torch.randn(1, max_patches, d) * 0.02)
        self.layers = nn.ModuleList(TransformerLayer(d, p["heads"], ff="gelu") for _ in range(p["depth"]))
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, CLASSES)

    def patches(self, x: Tensor) -> Tensor:
        if self.conv:
            return self.embed(x).flatten(2).transpose(1, 2)
        b, c, h, w = x.shape
        ps = self.patch
        x = x.reshape(b, c, h // ps, ps, w // ps, ps).permute(0, 2, 4, 1, 3, 5).reshape(b, -1, c * ps * ps)
        return self.embed(x)

    def forward(self, x: Tensor) -> Tensor:
        x = self.patches(x)
        if self.cls is not None:
            x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1)
        x = x + self.pos[:, : x.shape[1]]
        for layer in self.layers:
            x = layer(x)
        x = self.norm(x)
        return self.head(x[:, 0] if self.cls_pool else x.mean(dim=1))


def inputs(p: Params, variant: int, gen: torch.Generator) -> tuple:
    res = pick(variant, (p["res"], p["res"] // 2, p["res"] * 3 // 2))
    res -= res % p["patch"]
    return (randn(gen, 2, 3, res, res),)


FAMILY = Family(
    name="vit",
    description="Vision Transformer (patch embedding, CLS/mean pooling)",
    grid=GRID,
    id_fmt="p{patch}d{dim}l{depth}h{heads}.{pool}.{embed}.r{res}",
    build=ViT,
    inputs=inputs,
    loss=ce_loss,
)
