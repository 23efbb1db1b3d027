"""Tiny configs for the Hugging Face zoo (:mod:`conformance.models.hf`): generic shrink rules over
config attribute names, and the per-model-type overrides file with its validated loader.

:func:`shrink` takes a config's ``to_dict()`` (plain data: no ``transformers`` needed) and gives
the tiny one: widths, layers, heads, feed-forward sizes, vocabulary, positions, image and patch
size, experts shrink to the sizes below; per-stage lists shrink elementwise; per-layer lists and
tables and lists of layer indices follow the new depth; sizes the config derives from each other
(head_dim, multi-head latent attention's parts, Mamba heads, the multimodal rotary split) stay
consistent; special token ids are renumbered into the top ``SPECIAL`` ids of the vocabulary;
dropout is off and ``use_cache`` False. Sub-config dicts (those with a ``model_type``) are shrunk
recursively.

Example::

    >>> t = shrink({"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
    ...             "layer_types": ["full_attention"] * 32, "vocab_size": 32000, "bos_token_id": 31999})
    >>> t["hidden_size"], t["num_hidden_layers"], len(t["layer_types"]), t["vocab_size"], t["bos_token_id"]
    (32, 2, 2, 128, 127)
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .relations import Depth, fill_unset, keep_relations, widths_of
from .sizes import (
    EXPERTS,
    EXPERTS_KEYS,
    EXPERTS_PER_TOKEN,
    EXPERTS_PER_TOKEN_KEYS,
    FF,
    FFN_KEYS,
    FRAMES,
    GROUP_KEY,
    HEAD_DIM,
    HEAD_DIM_KEYS,
    HEADS,
    HEADS_KEYS,
    HIDDEN,
    IMAGE,
    KV_HEADS_KEYS,
    LAYER_INDEX_LISTS,
    LAYERS,
    LAYERS_KEYS,
    MAXPOS,
    MOE_FFN_KEYS,
    NOT_WIDTH,
    PATCH,
    POSITIONS_KEYS,
    SAMPLES,
    SIZE_LIKE,
    SPECIAL,
    STAGE_DEPTHS_KEYS,
    STAGE_HEADS_KEYS,
    STAGE_WIDTHS_KEYS,
    TOKEN_ID,
    VIDEO_FRAMES,
    VOCAB,
    VOCABS_KEYS,
    WIDTH_KEYS,
    ZERO_FLOATS,
    is_config,
    is_ints,
    layers_of,
    shrink_int,
    stage_width,
    token,
)

__all__ = ["EXPERTS", "EXPERTS_PER_TOKEN", "FF", "FRAMES", "HEADS", "HEAD_DIM", "HIDDEN", "IMAGE", "LAYERS", "MAXPOS",
           "OVERRIDES", "PATCH", "SAMPLES", "SPECIAL", "VIDEO_FRAMES", "VOCAB", "Override", "apply_overrides",
           "overrides", "shrink"]

OVERRIDES = Path(__file__).resolve().parents[2] / "data" / "hf_overrides.toml"


def shrink(d: dict[str, Any], tokens: dict[int, int] | None = None,
           widths: dict[int, int] | None = None, backbone: bool = False, kinds: bool = True) -> dict[str, Any]:
    """A config's ``to_dict()`` made tiny by the rules (sub-config dicts recursively; ``backbone``:
    the config is another's ``backbone_config``; ``kinds=False``: the first layers, whatever their
    kinds, where keeping every kind breaks a config's own checks)."""
    tokens = {} if tokens is None else tokens
    widths = widths_of(d) if widths is None else widths
    old_layers, new_layers = layers_of(d)
    keep_stages = backbone and any(is_ints(v) and len(v) == old_layers for k, v in d.items() if k in STAGE_DEPTHS_KEYS)
    if keep_stages:  # a backbone whose layers are its stages: the model reads every stage's features
        new_layers = old_layers
    depth = Depth.of(d, old_layers, new_layers, kinds)
    out = dict(d)
    for key, v in d.items():
        if is_config(v):
            out[key] = shrink(v, tokens, widths, backbone=key == "backbone_config", kinds=kinds)
        elif keep_stages and key in LAYERS_KEYS:
            continue
        elif isinstance(v, bool) or v is None:
            continue
        elif isinstance(v, float) and ZERO_FLOATS.search(key):
            out[key] = 0.0
        elif isinstance(v, int):
            out[key] = _shrink_one(key, v, tokens)
            if out[key] == v and v in widths and SIZE_LIKE.search(key) and not NOT_WIDTH.search(key):
                out[key] = widths[v]  # a size no rule names that equals a width: it is that width
            elif out[key] == v and GROUP_KEY.search(key) and v > 0:
                # convolution or norm groups: a depthwise count (equal to a width) is that width,
                # others divide every width the rules make (multiples of 8)
                out[key] = widths.get(v, math.gcd(v, 8))
        elif is_ints(v):
            out[key] = _shrink_list(key, list(v), depth, tokens, widths)
        elif isinstance(v, list | tuple) and depth and len(v) == depth.old:
            out[key] = [v[i] for i in depth.kept]  # per-layer lists (layer_types...)
        elif isinstance(v, dict) and v and depth and all(str(k).isdigit() for k in v) and key != "id2label":
            # per-layer tables; a layer's own config values shrink like the config's
            out[key] = {k: shrink(x, tokens, widths, kinds=kinds) if isinstance(x, dict) else x
                        for k, x in depth.table(v).items()}
    if "use_cache" in out:
        out["use_cache"] = False
    fill_unset(out, tokens)
    if old_layers != new_layers and "stage_names" in d and out.get("out_features") is not None:
        out["out_features"] = out["out_indices"] = None  # a backbone's stages: the config picks its last
    # heads divide the width, kv heads divide the heads
    heads = out.get("num_attention_heads")
    if isinstance(heads, int) and not isinstance(heads, bool) and heads > 0:
        kv = out.get("num_key_value_heads")
        if isinstance(kv, int) and not isinstance(kv, bool) and kv > 0:
            old_heads = d.get("num_attention_heads", heads)
            out["num_key_value_heads"] = 1 if (d.get("num_key_value_heads") or old_heads) < old_heads else heads
        if (isinstance(out.get("head_dim"), int) or ("head_dim" in out and out["head_dim"] is None)) and \
                out.get("hidden_size") == HIDDEN:
            out["head_dim"] = HIDDEN // heads  # also where the config leaves it to be derived
    keep_relations(d, out)
    return out


# key sets and the size each shrinks to, in the order _shrink_one asks them (the first that holds wins)
_CAPS: tuple[tuple[Any, int], ...] = (
    (WIDTH_KEYS, HIDDEN),
    (FFN_KEYS, FF),
    (MOE_FFN_KEYS, HIDDEN),
    (LAYERS_KEYS, LAYERS),
    (HEADS_KEYS, HEADS),
    (KV_HEADS_KEYS, HEADS),
    (HEAD_DIM_KEYS, HEAD_DIM),
    (("qk_rope_head_dim", "rotary_dim"), HEAD_DIM // 2),
    (POSITIONS_KEYS, MAXPOS),
    (("max_source_positions",), FRAMES // 2),
    (EXPERTS_KEYS, EXPERTS),
    (EXPERTS_PER_TOKEN_KEYS, EXPERTS_PER_TOKEN),
    (("n_group", "topk_group", "num_expert_groups", "num_expert_group"), 1),
    (VOCABS_KEYS, VOCAB),
    (("image_size", "pretrain_image_size", "max_img_size"), IMAGE),
    (("patch_size",), PATCH),
    (("num_frames", "frames_per_clip"), VIDEO_FRAMES),
    (("num_queries", "num_query_tokens"), 16),
    (("num_conv_pos_embeddings",), 16),
    (("num_conv_pos_embedding_groups",), 2),
    (("max_window_layers", "first_k_dense_replace"), 1),
)


def _shrink_one(key: str, v: int, tokens: dict[int, int]) -> int:
    if TOKEN_ID.search(key) or key in ("pad_token_id", "bos_token_id", "eos_token_id", "sep_token_id",
                                         "cls_token_id", "decoder_start_token_id", "mask_token_id"):
        return token(v, tokens)
    for keys, cap in _CAPS:
        if key in keys:
            return shrink_int(v, cap)
    if key == "window_size":
        return shrink_int(v, 4)
    if key in ("sliding_window", "sliding_window_size", "local_attention", "attention_window"):
        return shrink_int(v, 8)
    return v


def _shrink_list(key: str, v: list[int], depth: Depth | None, tokens: dict[int, int],
                 widths: dict[int, int] | None = None) -> list[int]:
    if TOKEN_ID.search(key) or key in ("eos_token_id", "bos_token_id", "pad_token_id"):
        return [token(x, tokens) for x in v]
    # a config whose layer count is its number of stages (Swin's num_layers = len(depths)) keeps
    # as many stages as layers
    stages = depth.new if depth and len(v) == depth.old else len(v)
    if key in STAGE_WIDTHS_KEYS:  # a stage as wide as a width the rules shrink is that width (the head it feeds)
        return [(widths or {}).get(x, stage_width(x)) for x in v][:stages]
    if key in STAGE_DEPTHS_KEYS:
        return [min(x, 1) for x in v][:stages]
    if key in STAGE_HEADS_KEYS:
        return [min(x, HEADS) for x in v][:stages]
    if key.removesuffix("_per_layer") in HEADS_KEYS | KV_HEADS_KEYS:
        v = [min(x, HEADS) for x in v]  # heads per layer: the layers kept follow below
    if key in ("image_size",):
        return [min(x, IMAGE) for x in v]
    if key in ("patch_size",):
        return [min(x, PATCH) for x in v]
    if key == "tubelet_size" and len(v) == 3:
        return [v[0], min(v[1], PATCH), min(v[2], PATCH)]  # (frames, height, width) of a video patch
    if depth:
        indices = LAYER_INDEX_LISTS.search(key) and all(0 <= x < depth.old for x in v)
        if len(v) == depth.old:  # one value per layer (a layer index per layer: kv_source_layers)
            per_layer = [v[i] for i in depth.kept]
            return [min(x, depth.new - 1) if depth.index(x) is None else depth.index(x)
                    for x in per_layer] if indices else per_layer
        if indices:  # layer indices
            kept = [depth.index(x) for x in v if depth.index(x) is not None]
            return kept or [depth.new - 1]
    return v


# -- overrides (conformance/data/hf_overrides.toml) -----------------------------------------------
@dataclass(frozen=True)
class Override:
    """Per-model-type config values the rules cannot derive, and why."""

    model_type: str
    config: dict[str, Any]
    reason: str


@functools.cache
def overrides(path: Path = OVERRIDES) -> dict[str, Override]:
    """The validated overrides file: ``[<model_type>]`` tables, each with a non-blank ``reason`` and
    a ``config`` table (dotted keys reach into sub-configs: ``"text_config.hidden_size"``); a bad
    entry is one ``DataFileError`` naming file, field and value."""
    from conformance.datafiles import DataFileError, read_toml

    def _bad(path: Path, key: str, value: Any, accepted: str) -> DataFileError:
        return DataFileError(f"{path}: {key} = {value!r} is not valid; expected {accepted}")

    out: dict[str, Override] = {}
    for model_type, raw in read_toml(path).items():
        if not re.fullmatch(r"[a-z0-9][a-z0-9_\-]*", model_type):
            raise _bad(path, model_type, raw, "a transformers model type (lower case, digits, '_' and '-')")
        if not isinstance(raw, dict):
            raise _bad(path, model_type, raw, "a table with 'reason' and 'config'")
        unknown = sorted(set(raw) - {"reason", "config"})
        if unknown:
            raise _bad(path, f"{model_type}.{unknown[0]}", raw[unknown[0]], "one of the keys config, reason")
        for key in ("reason", "config"):
            if key not in raw:
                raise DataFileError(f"{path}: {model_type}.{key} is missing")
        reason = raw["reason"]
        if not isinstance(reason, str) or not reason.strip():
            raise _bad(path, f"{model_type}.reason", reason, "a non-blank string")
        config = raw["config"]
        if not isinstance(config, dict) or not config:
            raise _bad(path, f"{model_type}.config", config, "a non-empty table of config values")
        for key, value in config.items():
            if not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*", key):
                raise _bad(path, f"{model_type}.config.{key}", value, "a config attribute name (dots for sub-configs)")
            if isinstance(value, dict):
                raise _bad(path, f"{model_type}.config.{key}", value,
                           "a value (use dotted keys for sub-config attributes)")
        out[model_type] = Override(model_type, dict(config), reason)
    return out


def apply_overrides(d: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    for dotted, value in values.items():
        *path, last = dotted.split(".")
        node = d
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return d
