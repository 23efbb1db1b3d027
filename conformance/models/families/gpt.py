"""GPT-style decoder: causal SDPA, RoPE or learned positions, RMSNorm/LayerNorm, SwiGLU/GELU;
``mode="decode"`` is a single KV-cache decode step (fixed-size cache, ``index_copy`` update,
position mask).

Example:
    >>> from conformance.models.registry import enumerate_graphs
    >>> spec = next(s for s in enumerate_graphs(["gpt"]) if s.params["mode"] == "decode")
    >>> logits, k, v = spec.build()(*spec.example_inputs())
    >>> logits.shape, k.shape
    (torch.Size([2, 1, 32]), torch.Size([1, 2, 2, 8, 8]))
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from conformance.models.family import Family, Params, pick, randint, randn, sumsq_loss
from conformance.models.layers import FeedForward, apply_rope, attend, make_norm, rope_tables

VOCAB, HEAD_DIM = 32, 8
GRID = {
    "dim": [16, 32, 64],
    "layers": [1, 2],
    "pos": ["rope", "learned"],
    "norm": ["rms", "ln"],
    "mlp": ["swiglu", "gelu"],
    "mode": ["prefill", "decode"],
    "seq": [8, 16],
}


class Block(nn.Module):
    def __init__(self, p: Params):
        super().__init__()
        d = p["dim"]
        self.heads = d // HEAD_DIM
        self.n1, self.n2 = make_norm(p["norm"], d), make_norm(p["norm"], d)
        self.qkv, self.o = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.ff = FeedForward(d, 2 * d, p["mlp"])

    def qkv_heads(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        b, t, d = x.shape
        q, k, v = self.qkv(self.n1(x)).view(b, t, 3, self.heads, HEAD_DIM).permute(2, 0, 3, 1, 4).unbind(0)
        return q, k, v

    def finish(self, x: Tensor, attn: Tensor) -> Tensor:
        b, h, t, dh = attn.shape
        x = x + self.o(attn.transpose(1, 2).reshape(b, t, h * dh))
        return x + self.ff(self.n2(x))


class GPT(nn.Module):
    """Prefill: ``tokens (B, T) -> logits (B, T, V)``."""

    def __init__(self, p: Params):
        super().__init__()
        d, max_len = p["dim"], 2 * p["seq"]
        self.rope = p["pos"] == "rope"
        self.tok = nn.Embedding(VOCAB, d)
        if self.rope:
            cos, sin = rope_tables(max_len, HEAD_DIM)
            self.register_buffer("cos", cos)
            self.register_buffer("sin", sin)
        else:
            self.pos = nn.Embedding(max_len, d)
        self.blocks = nn.ModuleList(Block(p) for _ in range(p["layers"]))
        self.norm = make_norm(p["norm"], d)
        self.head = nn.Linear(d, VOCAB, bias=False)

    def embed(self, tokens: Tensor, positions: Tensor) -> Tensor:
        x = self.tok(tokens)
        return x if self.rope else x + self.pos(positions)

    def forward(self, tokens: Tensor) -> Tensor:
        t = tokens.shape[1]
        x = self.embed(tokens, torch.arange(t, device=tokens.device))
        for blk in self.blocks:
            q, k, v = blk.qkv_heads(x)
            if self.rope:
                q, k = apply_rope(q, self.cos[:t], self.sin[:t]), apply_rope(k, self.cos[:t], self.sin[:t])
            x = blk.finish(x, attend(q, k, v, "sdpa", causal=True))
        return self.head(self.norm(x))


class DecodeStep(GPT):
    """One decode step: ``(token (B, 1), k_cache, v_cache (L, B, H, S, Dh), pos (1,))``
    -> ``(logits (B, 1, V), k_cache', v_cache')``."""

    def forward(
        self, token: Tensor, k_cache: Tensor, v_cache: Tensor, pos: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        x = self.embed(token, pos)
        mask = (torch.arange(k_cache.shape[3], device=token.device) <= pos).unsqueeze(0)  # (1, S)
        new_k, new_v = [], []
        for i, blk in enumerate(self.blocks):
            q, k, v = blk.qkv_heads(x)
            if self.rope:
                cos, sin = self.cos[pos], self.sin[pos]
                q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            kc, vc = k_cache[i].index_copy(2, pos, k), v_cache[i].index_copy(2, pos, v)
            new_k.append(kc)
            new_v.append(vc)
            x = blk.finish(x, attend(q, kc, vc, "sdpa", mask=mask))
        return self.head(self.norm(x)), torch.stack(new_k), torch.stack(new_v)


def build(p: Params) -> nn.Module:
    return DecodeStep(p) if p["mode"] == "decode" else GPT(p)


def inputs(p: Params, variant: int, gen: torch.Generator) -> tuple:
    length = pick(variant, (p["seq"], p["seq"] // 2, p["seq"] * 2))
    if p["mode"] == "prefill":
        return (randint(gen, VOCAB, 2, length),)
    cache = (p["layers"], 2, p["dim"] // HEAD_DIM, length, HEAD_DIM)
    return randint(gen, VOCAB, 2, 1), randn(gen, *cache), randn(gen, *cache), torch.tensor([length // 2])


def loss(output: object, p: Params, gen: torch.Generator) -> torch.Tensor:
    from conformance.models.family import ce_loss

    return ce_loss(output, p, gen) if p["mode"] == "prefill" else sumsq_loss(output, p, gen)


FAMILY = Family(
    name="gpt",
    description="GPT-style decoder (causal SDPA, RoPE, RMSNorm, SwiGLU; prefill and KV-cache decode step)",
    grid=GRID,
    id_fmt="d{layers}w{dim}.{pos}.{norm}.{mlp}.{mode}.s{seq}",
    build=build,
    inputs=inputs,
    loss=loss,
)
