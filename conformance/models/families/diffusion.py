"""Diffusion denoiser block: GroupNorm/SiLU resblocks conditioned on a timestep embedding,
optional spatial self-attention.

Example:
    >>> from conformance.models.registry import enumerate_graphs
    >>> spec = next(enumerate_graphs(["diffusion"]))
    >>> x, t = spec.example_inputs()
    >>> spec.build()(x, t).shape == x.shape
    True
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from conformance.models.family import Family, Params, pick, randint, randn
from conformance.models.layers import attend, sinusoidal

LATENT_CH, TIMESTEPS = 4, 1000
GRID = {
    "ch": [16, 32],
    "groups": [4, 8],
    "attn": ["none", "sdpa", "math"],
    "nres": [1, 2],
    "cond": ["add", "film"],
    "temb": [32, 64],
    "res": [8, 16],
}


class ResBlock(nn.Module):
    def __init__(self, ch: int, temb: int, p: Params):
        super().__init__()
        self.film = p["cond"] == "film"
        self.n1, self.c1 = nn.GroupNorm(p["groups"], ch), nn.Conv2d(ch, ch, 3, padding=1)
        self.t = nn.Linear(temb, ch * (2 if self.film else 1))
        self.n2, self.c2 = nn.GroupNorm(p["groups"], ch), nn.Conv2d(ch, ch, 3, padding=1)
        self.act = nn.SiLU()

    def forward(self, x: Tensor, emb: Tensor) -> Tensor:
        h = self.c1(self.act(self.n1(x)))
        e = self.t(self.act(emb))[:, :, None, None]
        if self.film:
            scale, shift = e.chunk(2, dim=1)
            h = self.n2(h) * (1 + scale) + shift
        else:
            h = self.n2(h + e)
        return x + self.c2(self.act(h))


class AttnBlock(nn.Module):
    def __init__(self, ch: int, p: Params):
        super().__init__()
        self.impl = p["attn"]
        self.norm, self.qkv, self.proj = (
            nn.GroupNorm(p["groups"], ch),
            nn.Conv2d(ch, 3 * ch, 1),
            nn.Conv2d(ch, ch, 1),
        )

    def forward(self, x: Tensor) -> Tensor:
        b, c, h, w = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(b, 3, 1, c, h * w).transpose(-1, -2).unbind(1)
        out = attend(q, k, v, self.impl).transpose(-1, -2).reshape(b, c, h, w)
        return x + self.proj(out)


class Denoiser(nn.Module):
    def __init__(self, p: Params):
        super().__init__()
        ch, temb = p["ch"], p["temb"]
        self.temb_dim = temb
        self.time = nn.Sequential(nn.Linear(temb, temb), nn.SiLU(), nn.Linear(temb, temb))
        self.inp = nn.Conv2d(LATENT_CH, ch, 3, padding=1)
        self.res = nn.ModuleList(ResBlock(ch, temb, p) for _ in range(p["nres"]))
        self.attn = AttnBlock(ch, p) if p["attn"] != "none" else None
        self.out = nn.Sequential(
            nn.GroupNorm(p["groups"], ch), nn.SiLU(), nn.Conv2d(ch, LATENT_CH, 3, padding=1)
        )

    def forward(self, x: Tensor, t: Tensor) -> Tensor:
        emb = self.time(sinusoidal(t, self.temb_dim).to(x.dtype))
        h = self.inp(x)
        for i, block in enumerate(self.res):
            h = block(h, emb)
            if i == 0 and self.attn is not None:
                h = self.attn(h)
        return self.out(h)


def inputs(p: Params, variant: int, gen: torch.Generator) -> tuple:
    res = pick(variant, (p["res"], p["res"] * 2, p["res"] + 4))
    return randn(gen, 2, LATENT_CH, res, res), randint(gen, TIMESTEPS, 2)


FAMILY = Family(
    name="diffusion",
    description="Diffusion UNet block (GroupNorm, SiLU, timestep embedding, spatial attention)",
    grid=GRID,
    id_fmt="c{ch}g{groups}.{attn}.r{nres}.{cond}.t{temb}.s{res}",
    build=Denoiser,
    inputs=inputs,
)
