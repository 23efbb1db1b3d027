"""One module per model family; each exposes ``FAMILY`` (a ``conformance.models.family.Family``)."""

from __future__ import annotations

from conformance.models.family import Family

from . import (
    audio,
    diffusion,
    dlrm,
    encoder,
    gnn,
    gpt,
    mlp,
    mobilenet,
    moe,
    resnet,
    rnn,
    seq2seq,
    unet,
    vae,
    vit,
)

ALL_FAMILIES: list[Family] = [
    mlp.FAMILY,
    resnet.FAMILY,
    mobilenet.FAMILY,
    unet.FAMILY,
    diffusion.FAMILY,
    encoder.FAMILY,
    gpt.FAMILY,
    vit.FAMILY,
    audio.FAMILY,
    rnn.FAMILY,
    moe.FAMILY,
    dlrm.FAMILY,
    gnn.FAMILY,
    vae.FAMILY,
    seq2seq.FAMILY,
]
