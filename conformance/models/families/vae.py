"""Variational autoencoder (MLP or conv encoder/decoder); the reparameterisation noise is an
explicit input so the graph is deterministic. Loss: reconstruction + KL.

Example:
    >>> from conformance.models.registry import enumerate_graphs
    >>> spec = next(enumerate_graphs(["vae"]))
    >>> x, eps = spec.example_inputs()
    >>> recon, mu, logvar = spec.build()(x, eps)
    >>> recon.shape == x.shape
    True
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from conformance.models.family import Family, Params, pick, randn
from conformance.models.layers import make_act

GRID = {
    "arch": ["mlp", "conv"],
    "latent": [4, 8, 16],
    "hidden": [16, 32],
    "depth": [1, 2],
    "act": ["relu", "silu"],
    "size": [8, 16],
}


def mlp_coders(p: Params) -> tuple[nn.Module, nn.Module, int]:
    pixels, h, act = p["size"] ** 2, p["hidden"], p["act"]
    dims = [pixels] + [h] * p["depth"]
    enc: list[nn.Module] = [nn.Flatten()]
    for a, b in zip(dims, dims[1:], strict=False):
        enc += [nn.Linear(a, b), make_act(act)]
    up = [p["latent"], *dims[::-1]]
    dec: list[nn.Module] = []
    for a, b in zip(up, up[1:], strict=False):
        dec += [nn.Linear(a, b), make_act(act)]
    dec[-1] = nn.Unflatten(1, (1, p["size"], p["size"]))
    return nn.Sequential(*enc), nn.Sequential(*dec), h


def conv_coders(p: Params) -> tuple[nn.Module, nn.Module, int]:
    h, side = p["hidden"], p["size"] // 2 ** p["depth"]
    enc: list[nn.Module] = []
    dec: list[nn.Module] = [nn.Linear(p["latent"], h * side * side), nn.Unflatten(1, (h, side, side))]
    for i in range(p["depth"]):
        enc += [nn.Conv2d(1 if i == 0 else h, h, 3, 2, 1), make_act(p["act"])]
        dec += [make_act(p["act"]), nn.ConvTranspose2d(h, 1 if i == p["depth"] - 1 else h, 4, 2, 1)]
    enc.append(nn.Flatten())
    return nn.Sequential(*enc), nn.Sequential(*dec), h * side * side


class VAE(nn.Module):
    def __init__(self, p: Params):
        super().__init__()
        self.enc, self.dec, feat = (mlp_coders if p["arch"] == "mlp" else conv_coders)(p)
        self.mu, self.logvar = nn.Linear(feat, p["latent"]), nn.Linear(feat, p["latent"])

    def forward(self, x: Tensor, eps: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        h = self.enc(x)
        mu, logvar = self.mu(h), self.logvar(h)
        z = mu + eps * (0.5 * logvar).exp()
        return self.dec(z), mu, logvar


def inputs(p: Params, variant: int, gen: torch.Generator) -> tuple:
    b = pick(variant, (2, 1, 4))
    return torch.rand(b, 1, p["size"], p["size"], generator=gen), randn(gen, b, p["latent"])


def loss(output: tuple[Tensor, Tensor, Tensor], p: Params, gen: torch.Generator) -> Tensor:
    """Bernoulli reconstruction (against generated binary pixels) + KL(q(z|x) || N(0, I))."""
    recon, mu, logvar = (t.float() for t in output)
    target = torch.randint(0, 2, recon.shape, generator=gen).float()
    kl = -0.5 * (1 + logvar - mu.square() - logvar.exp()).sum(dim=1).mean()
    return F.binary_cross_entropy_with_logits(recon, target) + kl


FAMILY = Family(
    name="vae",
    description="Variational autoencoder (MLP or conv), explicit reparameterisation noise",
    grid=GRID,
    id_fmt="{arch}.z{latent}h{hidden}d{depth}.{act}.s{size}",
    build=VAE,
    inputs=inputs,
    loss=loss,
)
