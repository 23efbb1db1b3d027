"""Audio encoder front ends: Whisper-like (conv1d stem + sinusoidal positions + pre-LN
transformer) or Conformer-like (conv subsampling, macaron FF, MHSA, depthwise conv module).

Example:
    >>> from conformance.models.registry import enumerate_graphs
    >>> spec = next(enumerate_graphs(["audio"]))
    >>> spec.build()(*spec.example_inputs()).shape
    torch.Size([2, 8, 32])
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from conformance.models.family import Family, Params, ce_loss, pick, randn
from conformance.models.layers import Attention, FeedForward, TransformerLayer, sinusoidal

TOKENS = 32
GRID = {
    "arch": ["whisper", "conformer"],
    "mels": [16, 32],
    "dim": [16, 32, 48],
    "layers": [1, 2],
    "kernel": [3, 5],
    "frames": [16, 32],
    "heads": [2, 4],
}


class ConvModule(nn.Module):
    """Conformer convolution module: pointwise + GLU, depthwise conv, BN, SiLU, pointwise."""

    def __init__(self, d: int, k: int):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.pw1, self.dw = nn.Conv1d(d, 2 * d, 1), nn.Conv1d(d, d, k, padding=k // 2, groups=d)
        self.bn, self.act, self.pw2 = nn.BatchNorm1d(d), nn.SiLU(), nn.Conv1d(d, d, 1)

    def forward(self, x: Tensor) -> Tensor:
        h = nn.functional.glu(self.pw1(self.norm(x).transpose(1, 2)), dim=1)
        return x + self.pw2(self.act(self.bn(self.dw(h)))).transpose(1, 2)


class ConformerBlock(nn.Module):
    def __init__(self, d: int, heads: int, k: int):
        super().__init__()
        self.ff1, self.ff2 = FeedForward(d, 2 * d, "silu"), FeedForward(d, 2 * d, "silu")
        self.n_ff1, self.n_ff2, self.n_att, self.n_out = (nn.LayerNorm(d) for _ in range(4))
        self.attn, self.conv = Attention(d, heads), ConvModule(d, k)

    def forward(self, x: Tensor) -> Tensor:
        x = x + 0.5 * self.ff1(self.n_ff1(x))
        x = x + self.attn(self.n_att(x))
        x = self.conv(x)
        x = x + 0.5 * self.ff2(self.n_ff2(x))
        return self.n_out(x)


class AudioEncoder(nn.Module):
    """``mel (B, n_mels, frames) -> token logits (B, frames // 2, TOKENS)``."""

    def __init__(self, p: Params):
        super().__init__()
        d, k = p["dim"], p["kernel"]
        self.whisper = p["arch"] == "whisper"
        if self.whisper:
            self.stem = nn.Sequential(
                nn.Conv1d(p["mels"], d, k, padding=k // 2), nn.GELU(),
                nn.Conv1d(d, d, k, stride=2, padding=k // 2), nn.GELU(),
            )  # fmt: skip
            self.blocks = nn.ModuleList(
                TransformerLayer(d, p["heads"], ff="gelu") for _ in range(p["layers"])
            )
            self.post = nn.LayerNorm(d)
        else:
            self.stem = nn.Sequential(nn.Conv1d(p["mels"], d, k, stride=2, padding=k // 2), nn.SiLU())
            self.blocks = nn.ModuleList(ConformerBlock(d, p["heads"], k) for _ in range(p["layers"]))
            self.post = nn.Linear(d, d)
        self.head = nn.Linear(d, TOKENS)

    def forward(self, mel: Tensor) -> Tensor:
        x = self.stem(mel).transpose(1, 2)
        if self.whisper:
            x = x + sinusoidal(torch.arange(x.shape[1], device=x.device), x.shape[2]).to(x.dtype)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.post(x))


def inputs(p: Params, variant: int, gen: torch.Generator) -> tuple:
    return (randn(gen, 2, p["mels"], pick(variant, (p["frames"], p["frames"] // 2, p["frames"] * 2))),)


FAMILY = Family(
    name="audio",
    description="Audio front end (conv1d + attention; Whisper- and Conformer-like encoders)",
    grid=GRID,
    id_fmt="{arch}.m{mels}d{dim}l{layers}k{kernel}h{heads}.f{frames}",
    build=AudioEncoder,
    inputs=inputs,
    loss=ce_loss,
)
