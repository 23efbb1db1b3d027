"""Mixture-of-experts FFN block with top-k routing; three static-shape dispatch strategies:
``scatter`` (dense gates via ``scatter``, all experts on all tokens), ``capacity``
(GShard-style one-hot dispatch/combine tensors with a capacity limit, ``cumsum``) and
``loop`` (per-expert masked accumulation).

Example:
    >>> from conformance.models.registry import enumerate_graphs
    >>> spec = next(enumerate_graphs(["moe"]))
    >>> (x,) = spec.example_inputs()
    >>> spec.build()(x).shape == x.shape
    True
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from conformance.models.family import Family, Params, pick, randn

CAPACITY_FACTOR = 1.25
GRID = {
    "dim": [16, 32],
    "experts": [4, 8],
    "top_k": [1, 2],
    "routing": ["scatter", "capacity", "loop"],
    "act": ["gelu", "swiglu"],
    "seq": [8, 16],
}


class MoE(nn.Module):
    def __init__(self, p: Params):
        super().__init__()
        d, e = p["dim"], p["experts"]
        self.k, self.routing, self.swiglu = p["top_k"], p["routing"], p["act"] == "swiglu"
        hid = 2 * d
        self.norm, self.router = nn.LayerNorm(d), nn.Linear(d, e, bias=False)
        self.w1 = nn.Parameter(torch.randn(e, d, hid * (2 if self.swiglu else 1)) * d**-0.5)
        self.w2 = nn.Parameter(torch.randn(e, hid, d) * hid**-0.5)

    def act(self, h: Tensor) -> Tensor:
        if self.swiglu:
            a, g = h.chunk(2, dim=-1)
            return F.silu(a) * g
        return F.gelu(h)

    def route(self, x: Tensor) -> tuple[Tensor, Tensor]:
        probs = self.router(x).softmax(dim=-1)
        vals, idx = probs.topk(self.k, dim=-1)
        if self.k > 1:
            vals = vals / vals.sum(dim=-1, keepdim=True)
        return vals, idx

    def forward(self, x: Tensor) -> Tensor:
        b, s, d = x.shape
        tokens = self.norm(x).reshape(b * s, d)
        vals, idx = self.route(tokens)
        y = getattr(self, f"_{self.routing}")(tokens, vals, idx)
        return x + y.reshape(b, s, d)

    def _scatter(self, x: Tensor, vals: Tensor, idx: Tensor) -> Tensor:
        gates = torch.zeros(x.shape[0], self.w1.shape[0], dtype=x.dtype, device=x.device).scatter(
            1, idx, vals
        )
        h = self.act(torch.einsum("td,edh->eth", x, self.w1))
        out = torch.bmm(h, self.w2)  # (E, T, D)
        return torch.einsum("te,etd->td", gates, out)

    def _capacity(self, x: Tensor, vals: Tensor, idx: Tensor) -> Tensor:
        t, e = x.shape[0], self.w1.shape[0]
        cap = math.ceil(CAPACITY_FACTOR * self.k * t / e)
        experts = torch.arange(e, device=x.device)
        slots = torch.arange(cap, device=x.device)
        filled = torch.zeros(e, dtype=x.dtype, device=x.device)
        combine = torch.zeros(t, e, cap, dtype=x.dtype, device=x.device)
        for j in range(self.k):
            mask = (idx[:, j : j + 1] == experts).to(x.dtype)  # (T, E)
            pos = torch.cumsum(mask, dim=0) - 1 + filled
            keep = mask * (pos < cap).to(x.dtype)
            filled = filled + mask.sum(dim=0)
            slot = (pos.unsqueeze(-1) == slots).to(x.dtype)  # (T, E, C)
            combine = combine + (keep * vals[:, j : j + 1]).unsqueeze(-1) * slot
        dispatch = (combine > 0).to(x.dtype)
        expert_in = torch.einsum("tec,td->ecd", dispatch, x)
        out = torch.bmm(self.act(torch.bmm(expert_in, self.w1)), self.w2)
        return torch.einsum("tec,ecd->td", combine, out)

    def _loop(self, x: Tensor, vals: Tensor, idx: Tensor) -> Tensor:
        y = torch.zeros_like(x)
        for e in range(self.w1.shape[0]):
            gate = (vals * (idx == e).to(x.dtype)).sum(dim=-1, keepdim=True)
            y = y + gate * (self.act(x @ self.w1[e]) @ self.w2[e])
        return y


def inputs(p: Params, variant: int, gen: torch.Generator) -> tuple:
    return (randn(gen, 2, pick(variant, (p["seq"], p["seq"] // 2, p["seq"] * 2)), p["dim"]),)


FAMILY = Family(
    name="moe",
    description="Mixture-of-experts FFN with top-k routing (scatter, capacity, loop dispatch)",
    grid=GRID,
    id_fmt="d{dim}e{experts}k{top_k}.{routing}.{act}.s{seq}",
    build=MoE,
    inputs=inputs,
)
