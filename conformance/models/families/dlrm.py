"""DLRM-style recommender: bottom MLP on dense features, ``nn.EmbeddingBag`` tables on sparse
ids (fixed-length 2-D bags or flat ids + offsets), dot or concat interaction, top MLP.

Example:
    >>> from conformance.models.registry import enumerate_graphs
    >>> spec = next(enumerate_graphs(["dlrm"]))
    >>> spec.build()(*spec.example_inputs()).shape
    torch.Size([4, 1])
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from conformance.models.family import Family, Params, pick, randint, randn

DENSE, BATCH, MIN_ROWS = 13, 4, 40
GRID = {
    "tables": [2, 3, 4],
    "dim": [8, 16, 32],
    "mode": ["sum", "mean", "max"],
    "bottom": [1, 2],
    "inter": ["dot", "cat"],
    "bags": ["2d", "offsets"],
}


def mlp(sizes: list[int], final_act: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:], strict=False)):
        layers.append(nn.Linear(a, b))
        if final_act or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    def __init__(self, p: Params):
        super().__init__()
        d, n = p["dim"], p["tables"]
        self.dot = p["inter"] == "dot"
        self.bottom = mlp([DENSE] + [32] * (p["bottom"] - 1) + [d])
        self.tables = nn.ModuleList(nn.EmbeddingBag(MIN_ROWS + 10 * i, d, mode=p["mode"]) for i in range(n))
        feats = n + 1
        inter = feats * (feats - 1) // 2 + d if self.dot else feats * d
        self.top = mlp([inter, 32, 1], final_act=False)

    def forward(self, dense: Tensor, ids: Tensor, offsets: Tensor | None = None) -> Tensor:
        x = self.bottom(dense)
        embs = [table(ids[i], offsets) for i, table in enumerate(self.tables)]
        if self.dot:
            z = torch.stack([x, *embs], dim=1)
            scores = torch.bmm(z, z.transpose(1, 2))
            i, j = torch.triu_indices(z.shape[1], z.shape[1], offset=1, device=z.device)
            feats = torch.cat([x, scores[:, i, j]], dim=1)
        else:
            feats = torch.cat([x, *embs], dim=1)
        return self.top(feats)


def inputs(p: Params, variant: int, gen: torch.Generator) -> tuple:
    bag = pick(variant, (3, 2, 5))
    dense = randn(gen, BATCH, DENSE)
    if p["bags"] == "2d":
        return dense, randint(gen, MIN_ROWS, p["tables"], BATCH, bag)
    lengths = 1 + torch.arange(BATCH) % (2 * bag - 1)  # 1..2*bag-1, every bag non-empty
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
    return dense, randint(gen, MIN_ROWS, p["tables"], int(lengths.sum())), offsets


def loss(output: Tensor, p: Params, gen: torch.Generator) -> Tensor:
    """Binary cross-entropy (click prediction) against generated 0/1 labels."""
    target = torch.randint(0, 2, output.shape, generator=gen).float()
    return F.binary_cross_entropy_with_logits(output.float(), target)


FAMILY = Family(
    name="dlrm",
    description="DLRM-style embedding bags + MLPs with dot/concat feature interaction",
    grid=GRID,
    id_fmt="t{tables}d{dim}.{mode}.b{bottom}.{inter}.{bags}",
    build=DLRM,
    inputs=inputs,
    loss=loss,
)
