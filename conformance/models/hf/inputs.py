"""The inputs of a Hugging Face zoo model (:mod:`conformance.models.hf`), built from its config.

One builder per ``forward`` argument name, or per family of names (``*_input_ids`` with its
sub-config's vocabulary, ``*_mask`` over its partner input); :func:`builder_for` says whether a
name can be built, :func:`build` builds a model's arguments in order. Inputs that belong together
are built together: a Qwen-VL-style vision tower's flattened patches follow the ``grid_thw`` it
also gets (patch size, temporal patch size, spatial merge size), a mask covers the input it masks,
a time series is ``context_length`` plus its largest lag long.

Example::

    >>> import torch
    >>> from types import SimpleNamespace
    >>> cfg = SimpleNamespace(patch_size=8, temporal_patch_size=2, spatial_merge_size=2, in_channels=3)
    >>> x, grid = build(("hidden_states", "grid_thw"), cfg, 2, 0, torch.Generator().manual_seed(0))
    >>> tuple(x.shape), grid.tolist()
    ((32, 384), [[1, 4, 4], [1, 4, 4]])
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from ..family import pick
from .sizes import FRAMES, IMAGE, SAMPLES, SPECIAL, VOCAB

GRIDS = ("grid_thw", "image_grid_thw")  # a Qwen-VL-style vision tower's (frames, rows, columns) per image
VIDEO_FRAMES = ("num_frames", "frames_per_clip")


@dataclass
class Ctx:
    """What a builder sees: the config, batch, shape variant, generator, the names the model gets
    and the inputs built so far (a mask follows its partner)."""

    config: Any
    b: int
    v: int
    gen: torch.Generator
    names: tuple[str, ...] = ()
    built: dict[str, Tensor] = field(default_factory=dict)
    doc: str = ""  # the docstring of the model's forward: the shapes it declares

    def get(self, key: str, default: Any = None) -> Any:
        return _get(self.config, key, default)

    def declared(self, name: str) -> list[str] | None:
        """The dimensions ``forward``'s docstring declares for ``name``: ``(batch_size, 1, time_steps)``
        -> ``["batch_size", "1", "time_steps"]``."""
        m = re.search(rf"\b{re.escape(name)} \([^\n]*?of shape `?\(([^)]*)\)", self.doc)
        return [d.strip() for d in m.group(1).split(",")] if m else None


def _sub(config: Any, *names: str) -> Any:
    for name in names:
        sub = getattr(config, name, None)
        if sub is not None and hasattr(sub, "to_dict"):
            return sub
    return None


def _get(config: Any, key: str, default: Any = None) -> Any:
    """``key`` of the config, else of its vision/audio/encoder sub-config."""
    for c in (config, _sub(config, "vision_config", "encoder_config", "encoder", "backbone_config"),
              _sub(config, "audio_config", "speech_config", "semantic_model_config", "asr_config")):
        if c is not None and getattr(c, key, None) is not None:
            return getattr(c, key)
    return default


def _size(value: Any) -> tuple[int, int]:
    if isinstance(value, list | tuple):
        return int(value[0]), int(value[-1])
    if isinstance(value, dict):
        h = value.get("height", value.get("shortest_edge", IMAGE))
        return int(h), int(value.get("width", h))
    return int(value), int(value)


def _int(value: Any, default: int) -> int:
    if isinstance(value, list | tuple) and value:
        value = value[-1]
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default


# -- tokens -------------------------------------------------------------------------------------
def _vocab(config: Any) -> int:
    text = _sub(config, "text_config", "decoder", "text_encoder") or config
    vocab = getattr(text, "vocab_size", None) or getattr(config, "vocab_size", None) or VOCAB
    return int(vocab)


def _token_ids(vocab: int, b: int, n: int, gen: torch.Generator) -> Tensor:
    high = vocab - SPECIAL if vocab > 2 * SPECIAL else vocab
    return torch.randint(3 if high > 3 else 0, high, (b, n), generator=gen)


def _tokens(c: Ctx, lengths: tuple[int, ...] = (8, 12, 16)) -> Tensor:
    return _token_ids(_vocab(c.config), c.b, pick(c.v, lengths), c.gen)


def _prefixed_tokens(prefix: str) -> Callable[[Ctx], Tensor] | None:
    """``<prefix>_input_ids`` of a model with a ``<prefix>_config`` (InstructBLIP's Q-Former text)."""
    def build(c: Ctx) -> Tensor:
        sub = _sub(c.config, f"{prefix}_config")
        return _token_ids(int(getattr(sub, "vocab_size", None) or VOCAB), c.b, pick(c.v, (8, 12, 16)), c.gen)
    return build


# -- images and video ---------------------------------------------------------------------------
def _image_size(c: Ctx) -> tuple[int, int, int]:
    h, w = _size(c.get("image_size", IMAGE))
    return int(c.get("num_channels", c.get("in_channels", 3))), h, w


def _frames(c: Ctx) -> int | None:
    for key in VIDEO_FRAMES:
        n = c.get(key)
        if isinstance(n, int) and n > 0:
            return n
    return None


def _pixels(c: Ctx) -> Tensor:
    if any(g in c.names for g in GRIDS):
        return _patches(c)
    if "spatial_shapes" in c.names or "pixel_position_ids" in c.names:
        # NaFlex (SigLIP 2, Gemma 4): a sequence of flattened patches with their grid or positions
        p = _int(c.get("patch_size"), 16)
        _, h, w = _image_size(c)
        n = int(c.built["spatial_shapes"][0].prod()) if "spatial_shapes" in c.built else (h // p) * (w // p)
        return torch.randn(c.b, n, int(c.get("num_channels", 3)) * p * p, generator=c.gen)
    if _frames(c) is not None:  # a video model (TimeSformer, VideoMAE, ViViT, X-CLIP)
        return _video(c)
    ch, h, w = _image_size(c)
    if _matches_keypoints(c.get("model_type")):  # a keypoint matcher: pairs of images
        return torch.randn(c.b, 2, ch, h, w, generator=c.gen)
    return torch.randn(c.b, ch, h, w, generator=c.gen)


def _matches_keypoints(model_type: Any) -> bool:
    """Does the library list ``model_type`` as a keypoint matcher (LightGlue, EfficientLoFTR)?"""
    try:
        from transformers.models.auto.modeling_auto import MODEL_FOR_KEYPOINT_MATCHING_MAPPING_NAMES
    except ImportError:  # an older transformers: no such task
        return False
    return model_type in MODEL_FOR_KEYPOINT_MATCHING_MAPPING_NAMES


def _spatial_shapes(c: Ctx) -> Tensor:
    side = pick(c.v, (4, 6, 8))
    return torch.tensor([[side, side]] * c.b)


def _patch_positions(c: Ctx) -> Tensor:
    """``(batch, patches, 2)`` (x, y) positions of an image's patches, row by row."""
    _, h, w = _image_size(c)
    p = _int(c.get("patch_size"), 16)
    ys, xs = torch.meshgrid(torch.arange(h // p), torch.arange(w // p), indexing="ij")
    return torch.stack([xs.flatten(), ys.flatten()], dim=-1).expand(c.b, -1, -1).clone()


def _video(c: Ctx) -> Tensor:
    """``(batch, frames, channels, height, width)``: the config's frame count (the rules keep it small)."""
    ch, h, w = _image_size(c)
    return torch.randn(c.b, _frames(c) or 4, ch, h, w, generator=c.gen)


def _first(c: Ctx, *keys: str) -> Any:
    """The first of ``keys`` the config (or its vision sub-config) sets."""
    for key in keys:
        value = c.get(key)
        if value is not None:
            return value
    return None


def _merge(c: Ctx) -> int:
    return _int(_first(c, "spatial_merge_size", "merge_size", "merge_kernel_size"), 1)


def _grid(c: Ctx) -> Tensor:
    """One ``(frames, rows, columns)`` patch grid per image: rows and columns a multiple of the
    spatial merge size, one temporal patch."""
    side = _merge(c) * pick(c.v, (2, 3, 4))
    return torch.tensor([[1, side, side]] * c.b)


def _patches(c: Ctx) -> Tensor:
    """The flattened patches a grid stands for: ``(sum(t*h*w), channels*temporal*patch*patch)``."""
    grid = c.built.get("grid_thw", c.built.get("image_grid_thw"))
    grid = _grid(c) if grid is None else grid
    p = _int(c.get("patch_size"), 14)
    ch = int(c.get("in_channels", c.get("num_channels", 3)))
    dim = ch * _int(_first(c, "temporal_patch_size", "patch_temporal"), 1) * p * p
    return torch.randn(int(grid.prod(dim=1).sum()), dim, generator=c.gen)


# -- audio --------------------------------------------------------------------------------------
def _audio(c: Ctx) -> Tensor:
    mel = c.get("num_mel_bins")
    if mel is not None:  # a spectrogram (audio-spectrogram-transformer): frames x mel bins
        return torch.randn(c.b, int(c.get("max_length", FRAMES)), int(mel), generator=c.gen)
    channels = c.get("audio_channels")
    dims = c.declared("input_values") or []
    if channels is None and len(dims) == 3 and dims[1] in ("1", "channels", "num_channels"):
        channels = 1  # a codec that declares its mono channel: (batch_size, 1, time_steps)
    if channels is not None:  # an audio codec: channels x samples
        return torch.randn(c.b, int(channels), pick(c.v, (SAMPLES, SAMPLES + 320, SAMPLES + 640)), generator=c.gen)
    return torch.randn(c.b, pick(c.v, (SAMPLES, SAMPLES + 320, SAMPLES + 640)), generator=c.gen)


def _features(c: Ctx) -> Tensor:
    b, v, gen = c.b, c.v, c.gen
    mel = c.get("num_mel_bins")
    src = c.get("max_source_positions")
    if mel is not None and src is not None and c.get("model_type") in ("whisper",):
        return torch.randn(b, int(mel), 2 * int(src), generator=gen)  # whisper wants exactly 2 x positions
    frames = pick(v, (FRAMES, FRAMES + 8, FRAMES + 16))
    feat = c.get("input_feat_per_channel")
    if feat is not None:
        return torch.randn(b, frames, int(feat) * int(c.get("input_channels", 1)), generator=gen)
    stacked = _int(c.get("num_stacked_frames"), 1)  # low frame rate features: frames stacked per step
    if mel is not None:
        return torch.randn(b, int(mel), frames, generator=gen) if src is not None else \
            torch.randn(b, frames, int(mel) * stacked, generator=gen)
    size = c.get("feature_projection_input_dim") or c.get("feature_size") or c.get("input_feat_size") or \
        c.get("num_mel_bins", 80)
    return torch.randn(b, frames, int(size) * stacked, generator=gen)


def _latents(c: Ctx) -> Tensor:
    """A codec decoder's continuous latents: ``(batch, latent width, frames)``."""
    dim = c.get("latent_dim") or c.get("hidden_size")
    return torch.randn(c.b, int(dim), pick(c.v, (8, 12, 16)), generator=c.gen)


# -- time series --------------------------------------------------------------------------------
def _past_length(c: Ctx) -> int:
    context = _int(c.get("context_length"), 0) or _int(c.get("prediction_length"), 8)
    lags = c.get("lags_sequence") or [0]
    return context + max(lags)


def _past_values(c: Ctx) -> Tensor:
    n = _past_length(c)
    channels = c.get("num_input_channels")
    if channels is not None:  # PatchTST, PatchTSMixer: (batch, context, channels)
        return torch.randn(c.b, n, int(channels), generator=c.gen)
    size = int(c.get("input_size", 1) or 1)
    return torch.randn(c.b, n, generator=c.gen) if size == 1 else torch.randn(c.b, n, size, generator=c.gen)


def _past_time_features(c: Ctx) -> Tensor:
    return torch.randn(c.b, _past_length(c), int(c.get("num_time_features", 0) or 0), generator=c.gen)


def _freq(c: Ctx) -> Tensor:
    return torch.zeros(c.b, 1, dtype=torch.long)


# -- masks and embeddings -----------------------------------------------------------------------
def _partner(name: str, names: tuple[str, ...]) -> str | None:
    """The input a mask covers: ``input_features_mask`` -> ``input_features``,
    ``classes_attention_mask`` -> ``classes_input_ids``, ``past_observed_mask`` -> ``past_values``."""
    stem = name.removesuffix("_mask").removesuffix("_attention").removesuffix("_observed")
    stem = stem.removesuffix("_padding")
    for cand in (stem, f"{stem}_input_ids", f"{stem}_values", "past_values" if stem == "past" else ""):
        if cand and cand in names and cand != name:
            return cand
    return None


def _mask(name: str) -> Callable[[Ctx], Tensor]:
    """All ones over the batch and sequence (or time) axes of the input the mask covers; a padding
    mask is all zeros (nothing padded)."""
    def build(c: Ctx) -> Tensor:
        partner = _partner(name, c.names)
        x = c.built[partner] if partner in c.built else None
        if x is None:
            raise KeyError(f"{name}: its input is built after it")
        shape = (x.shape[0], x.shape[1]) if x.dim() >= 2 else tuple(x.shape)
        if x.dim() == 3 and x.is_floating_point() and partner != "past_values":
            feat = c.get("num_mel_bins") or c.get("input_feat_size") or c.get("feature_size")
            shape = (x.shape[0], x.shape[2] if x.shape[1] == feat else x.shape[1])  # the time axis
        if x.is_floating_point() and not partner.startswith("past"):
            return torch.ones(shape, dtype=torch.long)
        return torch.zeros(shape) if name.endswith("_padding") else torch.ones(shape)
    return build


def _embeds(c: Ctx) -> Tensor:
    """``(batch, tokens, hidden_size)`` embeddings (a Q-Former's query tokens, a decoder's inputs)."""
    text = _sub(c.config, "text_config") or c.config
    n = _int(c.get("num_query_tokens"), 0) or pick(c.v, (8, 12, 16))
    return torch.randn(c.b, n, int(getattr(text, "hidden_size", None) or c.get("hidden_size")), generator=c.gen)


BUILDERS: dict[str, Callable[[Ctx], Tensor]] = {
    "input_ids": _tokens,
    "decoder_input_ids": lambda c: _tokens(c, (6, 4, 8)),
    "task_inputs": lambda c: _token_ids(_vocab(c.config), c.b, _int(c.get("task_seq_len"), 8), c.gen),  # OneFormer
    "pixel_values": _pixels,
    "pixel_values_videos": _video,
    "prompt_pixel_values": _pixels,
    "prompt_masks": _pixels,
    "input_values": _audio,
    "audio_values": _audio,
    "input_features": _features,
    "audio_mel": _features,
    "latents": _latents,
    "grid_thw": _grid,
    "image_grid_thw": _grid,
    "spatial_shapes": _spatial_shapes,
    "pixel_position_ids": _patch_positions,
    "merge_sizes": lambda c: torch.full((c.b,), _merge(c), dtype=torch.long),
    "past_values": _past_values,
    "past_time_features": _past_time_features,
    "freq": _freq,
    "query_embeds": _embeds,
    "inputs_embeds": _embeds,
}
# built before the names that follow them (a grid before its patches, an input before its mask)
_FIRST = ("grid_thw", "image_grid_thw", "spatial_shapes")


def builder_for(name: str, names: tuple[str, ...] = ()) -> Callable[[Ctx], Tensor] | None:
    """The builder of forward argument ``name`` (None: no builder for it)."""
    if name in BUILDERS:
        return BUILDERS[name]
    if name == "hidden_states" and any(g in names for g in GRIDS):
        return _patches  # a Qwen-VL-style vision tower's patches
    if name.endswith("_input_ids"):
        return _prefixed_tokens(name.removesuffix("_input_ids"))
    if name.endswith(("_mask", "_padding")) and _partner(name, names) is not None:
        return _mask(name)
    return None


def build(names: tuple[str, ...], config: Any, b: int, v: int, gen: torch.Generator,
          doc: str = "") -> tuple[Tensor, ...]:
    """The tensors of ``names`` in order (a grid is built before its patches, an input before its
    mask); ``doc``: the docstring of the model's ``forward``, whose declared shapes some follow."""
    c = Ctx(config, b, v, gen, tuple(names), doc=doc)
    order = sorted(names, key=lambda n: (n not in _FIRST, n.endswith(("_mask", "_padding"))))
    for name in order:
        fn = builder_for(name, c.names)
        if fn is None:
            raise KeyError(f"no builder for {name!r}")
        c.built[name] = fn(c)
    return tuple(c.built[n] for n in names)
