"""Encoder-decoder transformer with cross-attention (translation-style), tied or untied output.

Example:
    >>> from conformance.models.registry import enumerate_graphs
    >>> spec = next(enumerate_graphs(["seq2seq"]))
    >>> src, tgt = spec.example_inputs()
    >>> spec.build()(src, tgt).shape
    torch.Size([2, 6, 48])
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from conformance.models.family import Family, Params, ce_loss, pick, randint
from conformance.models.layers import TransformerLayer

VOCAB, MAX_LEN = 48, 16
GRID = {
    "dim": [16, 32, 64],
    "enc": [1, 2],
    "dec": [1, 2],
    "heads": [2, 4],
    "norm": ["pre", "post"],
    "attn": ["sdpa", "math"],
    "out": ["tied", "untied"],
}


class Seq2Seq(nn.Module):
    def __init__(self, p: Params):
        super().__init__()
        d, pre, impl = p["dim"], p["norm"] == "pre", p["attn"]
        self.emb, self.pos = nn.Embedding(VOCAB, d), nn.Embedding(MAX_LEN, d)
        self.encoder = nn.ModuleList(
            TransformerLayer(d, p["heads"], prenorm=pre, impl=impl) for _ in range(p["enc"])
        )
        self.decoder = nn.ModuleList(
            TransformerLayer(d, p["heads"], prenorm=pre, impl=impl, causal=True, cross=True)
            for _ in range(p["dec"])
        )
        self.norm = nn.LayerNorm(d)
        self.out = None if p["out"] == "tied" else nn.Linear(d, VOCAB)

    def embed(self, tokens: Tensor) -> Tensor:
        return self.emb(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        memory = self.embed(src)
        for layer in self.encoder:
            memory = layer(memory)
        x = self.embed(tgt)
        for layer in self.decoder:
            x = layer(x, memory=memory)
        x = self.norm(x)
        return F.linear(x, self.emb.weight) if self.out is None else self.out(x)


def inputs(p: Params, variant: int, gen: torch.Generator) -> tuple:
    s, t = pick(variant, ((8, 6), (4, 3), (12, 9)))
    return randint(gen, VOCAB, 2, s), randint(gen, VOCAB, 2, t)


FAMILY = Family(
    name="seq2seq",
    description="Encoder-decoder transformer with cross-attention",
    grid=GRID,
    id_fmt="d{dim}e{enc}x{dec}h{heads}.{norm}.{attn}.{out}",
    build=Seq2Seq,
    inputs=inputs,
    loss=ce_loss,
)
