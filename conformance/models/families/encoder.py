"""Transformer encoder (BERT-like token classifier), pre- or post-norm, SDPA or math attention.

Example:
    >>> from conformance.models.registry import enumerate_graphs
    >>> spec = next(enumerate_graphs(["encoder"]))
    >>> spec.build()(*spec.example_inputs()).shape
    torch.Size([2, 8, 32])
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from conformance.models.family import Family, Params, ce_loss, pick, randint
from conformance.models.layers import TransformerLayer

VOCAB = 32
GRID = {
    "dim": [16, 32, 64],
    "layers": [1, 2],
    "heads": [2, 4],
    "norm": ["pre", "post"],
    "act": ["relu", "gelu"],
    "attn": ["sdpa", "math"],
    "seq": [8, 16],
}


class Encoder(nn.Module):
    def __init__(self, p: Params):
        super().__init__()
        d = p["dim"]
        self.tok, self.pos = nn.Embedding(VOCAB, d), nn.Embedding(2 * p["seq"], d)
        self.layers = nn.ModuleList(
            TransformerLayer(d, p["heads"], prenorm=p["norm"] == "pre", ff=p["act"], impl=p["attn"])
            for _ in range(p["layers"])
        )
        self.final = nn.LayerNorm(d) if p["norm"] == "pre" else nn.Identity()
        self.head = nn.Linear(d, VOCAB)

    def forward(self, tokens: Tensor) -> Tensor:
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for layer in self.layers:
            x = layer(x)
        return self.head(self.final(x))


def inputs(p: Params, variant: int, gen: torch.Generator) -> tuple:
    return (randint(gen, VOCAB, 2, pick(variant, (p["seq"], p["seq"] // 2, p["seq"] * 2))),)


FAMILY = Family(
    name="encoder",
    description="Transformer encoder (pre/post-norm, SDPA or explicit softmax attention)",
    grid=GRID,
    id_fmt="d{dim}l{layers}h{heads}.{norm}.{act}.{attn}.s{seq}",
    build=Encoder,
    inputs=inputs,
    loss=ce_loss,
)
