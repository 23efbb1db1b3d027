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
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OVERRIDES = Path(__file__).resolve().parents[2] / "data" / "hf_overrides.toml"

# The tiny sizes the rules shrink to.
VOCAB, HIDDEN, LAYERS, HEADS, HEAD_DIM, FF, MAXPOS, IMAGE, PATCH = 128, 32, 2, 2, 16, 64, 64, 64, 8
SPECIAL = 32  # the top SPECIAL ids of the vocabulary hold the renumbered special tokens; inputs draw below
EXPERTS, EXPERTS_PER_TOKEN = 4, 2
SAMPLES = 3200  # raw audio samples (0.2 s at 16 kHz)
FRAMES = 32  # feature frames of a spectrogram input

# -- the shrink rules ----------------------------------------------------------------------------
# Each rule: attribute names (exact) -> the function of the default value that gives the tiny one.
# Integers only shrink (min with the tiny size); lists of per-stage sizes shrink elementwise.
_WIDTH = {"hidden_size", "d_model", "n_embd", "dim", "embed_dim", "word_embed_proj_dim", "embedding_size",
          "projection_dim", "text_hidden_size", "out_hidden_size", "encoder_hidden_size", "decoder_hidden_size",
          "hidden_dim", "projector_hidden_size", "output_hidden_size", "input_embedding_size",
          "output_embedding_size", "true_hidden_size", "intra_bottleneck_size", "d_embed", "n_embed",
          "embedding_dim", "audio_hidden_size", "vision_hidden_size", "pooler_output_size", "pooler_hidden_size",
          "fusion_hidden_size", "image_text_hidden_size", "hidden_size_per_layer_input", "latent_dim",
          "classifier_proj_size", "codevector_dim", "proj_codevector_dim", "xvector_output_dim", "d_inner_hid",
          "encoder_hidden_dim", "decoder_hidden_dim", "attention_hidden_size", "hidden_size_global",
          "fpn_hidden_size", "iou_head_hidden_dim", "output_channels", "feature_projection_input_dim",
          "memory_attention_hidden_size", "memory_encoder_hidden_size", "mask_downsampler_embed_dim",
          "memory_fuser_embed_dim", "num_pos_feats", "lqe_hidden_dim", "frequency_embedding_size",
          "vector_quantization_hidden_dimension", "num_filters", "subsampling_conv_channels",
          "speech_decoder_postnet_units", "upsample_initial_channel", "base_channels", "latent_channels",
          "codebook_dim", "d_latent", "d_head_ff", "text_embed_dim", "vision_embed_dim", "mlp_dim_text"}
_FFN = {"intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "d_ff", "n_inner", "dff", "mlp_dim",
        "decoder_intermediate_size", "ffn_hidden_size", "encoder_linear_units", "decoder_linear_units",
        "speech_encoder_intermediate_size", "memory_fuser_intermediate_dim", "projection_hidden_dim",
        "memory_attention_feed_forward_hidden_size", "encoder_intermediate_size", "hidden_dim_ffn"}
_MOE_FFN = {"moe_intermediate_size", "shared_expert_intermediate_size", "shared_intermediate_size",
            "shared_experts_intermediate_size", "expert_intermediate_size"}
_LAYERS = {"num_hidden_layers", "n_layer", "n_layers", "num_layers", "encoder_layers", "decoder_layers",
           "num_decoder_layers", "num_encoder_layers", "decoder_num_layers", "depth", "encoder_depth",
           "decoder_depth", "num_text_layers", "num_vision_layers", "speech_encoder_layers",
           "text_encoder_layers", "text_decoder_layers", "t2u_encoder_layers", "t2u_decoder_layers",
           "num_fusion_layers", "num_hidden_groups"}
_HEADS = {"num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads",
          "decoder_attention_heads", "attention_heads", "speech_encoder_attention_heads",
          "text_encoder_attention_heads", "text_decoder_attention_heads", "linear_num_key_heads",
          "linear_num_value_heads", "linear_num_heads", "swa_num_attention_heads", "index_n_heads", "mamba_n_heads",
          "decoder_num_attention_heads", "encoder_num_attention_heads", "t2u_encoder_attention_heads",
          "t2u_decoder_attention_heads"}
_KV_HEADS = {"num_key_value_heads", "swa_num_key_value_heads", "num_kv_heads", "multi_query_group_num"}
_HEAD_DIM = {"head_dim", "d_kv", "v_head_dim", "qk_nope_head_dim", "linear_key_head_dim",
             "linear_value_head_dim", "linear_head_dim", "swa_head_dim", "dim_head", "index_head_dim",
             "kv_lora_rank", "q_lora_rank", "attention_head_dim", "mamba_d_head", "kv_channels"}
_POSITIONS = {"max_position_embeddings", "n_positions", "n_ctx", "max_target_positions", "max_seq_len",
              "max_sequence_length", "t2u_max_position_embeddings", "text_max_position_embeddings",
              "max_2d_position_embeddings", "position_embedding_size", "max_length", "block_size"}
_EXPERTS = {"num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts", "num_experts_per_layer"}
_EXPERTS_PER_TOKEN = {"num_experts_per_tok", "num_experts_per_token", "moe_topk", "top_k", "moe_k"}
_VOCABS = {"vocab_size", "input_vocab_size", "output_vocab_size", "t2u_vocab_size", "unit_hifi_gan_vocab_size",
           "codebook_size", "num_embeddings", "text_vocab_size", "vocab_size_per_layer_input", "unpadded_vocab_size"}
_STAGE_WIDTHS = {"hidden_sizes", "embed_dim", "embed_dims", "neck_hidden_sizes", "stage_out_channels",
                 "stage_in_channels", "stage_mid_channels", "encoder_in_channels", "conv_dim", "tdnn_dim",
                 "embed_dim_per_stage", "encoder_hidden_sizes", "out_features", "decoder_in_channels",
                 "backbone_channel_list", "in_channels", "out_channels", "downsample_channels",
                 "intermediate_feature_dims", "vision_features_channels", "base_attn_unit_dims", "stem_channels"}
_STAGE_DEPTHS = {"depths", "stage_num_blocks", "blocks_per_stage", "num_block_repeats", "block_repeats",
                 "stage_numb_of_layers", "n_attn_blocks"}
_STAGE_HEADS = {"num_heads", "num_attention_heads", "num_attention_heads_per_stage", "key_dim"}
_ZERO_FLOATS = re.compile(r"(dropout|_pdrop|drop_prob|layerdrop|^mask_.*_prob$|drop_path_rate)")
_TOKEN_ID = re.compile(r"(_token_id|_token_index|_token_ids)$")
_LAYER_INDEX_LISTS = re.compile(r"(_indexes|_indices|_idxs|_index|_layers|_layer_ids|_hook_ids|_layers_indices)$")


def _shrink_int(value: int, tiny: int) -> int:
    return min(value, tiny) if value > 0 else value


def _stage_width(x: int) -> int:
    return max(8, (x // 16 + 7) // 8 * 8) if x >= 8 else x


def _is_ints(value: Any) -> bool:
    return isinstance(value, list | tuple) and bool(value) and all(
        isinstance(x, int) and not isinstance(x, bool) for x in value)


def _is_config(value: Any) -> bool:
    return isinstance(value, dict) and "model_type" in value


def _layers_of(d: dict[str, Any]) -> tuple[int | None, int | None]:
    """The layer count of a config dict and what the rules make of it."""
    for key in ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "decoder_layers", "encoder_layers"):
        v = d.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v, min(v, LAYERS)
    return None, None


def shrink(d: dict[str, Any], tokens: dict[int, int] | None = None) -> dict[str, Any]:
    """A config's ``to_dict()`` made tiny by the rules (sub-config dicts recursively)."""
    tokens = {} if tokens is None else tokens
    old_layers, new_layers = _layers_of(d)
    out = dict(d)
    for key, v in d.items():
        if _is_config(v):
            out[key] = shrink(v, tokens)
        elif isinstance(v, bool) or v is None:
            continue
        elif isinstance(v, float) and _ZERO_FLOATS.search(key):
            out[key] = 0.0
        elif isinstance(v, int):
            out[key] = _shrink_one(key, v, tokens)
        elif _is_ints(v):
            out[key] = _shrink_list(key, list(v), old_layers, new_layers, tokens)
        elif isinstance(v, list | tuple) and old_layers and len(v) == old_layers and old_layers != new_layers:
            out[key] = list(v)[:new_layers]  # per-layer lists (layer_types...)
        elif isinstance(v, dict) and v and new_layers and all(str(k).isdigit() for k in v):
            out[key] = {k: x for k, x in v.items() if int(k) < new_layers}  # per-layer tables
    if "use_cache" in out:
        out["use_cache"] = False
    if old_layers != new_layers and "stage_names" in d and out.get("out_features") is not None:
        out["out_features"] = out["out_indices"] = None  # a backbone's stages: the config picks its last
    # heads divide the width, kv heads divide the heads
    heads = out.get("num_attention_heads")
    if isinstance(heads, int) and not isinstance(heads, bool) and heads > 0:
        kv = out.get("num_key_value_heads")
        if isinstance(kv, int) and not isinstance(kv, bool) and kv > 0:
            out["num_key_value_heads"] = 1 if d.get("num_key_value_heads", heads) < d.get("num_attention_heads",
                                                                                            heads) else heads
        if (isinstance(out.get("head_dim"), int) or ("head_dim" in out and out["head_dim"] is None)) and \
                out.get("hidden_size") == HIDDEN:
            out["head_dim"] = HIDDEN // heads  # also where the config leaves it to be derived
    _keep_relations(d, out)
    return out


def _keep_relations(d: dict[str, Any], out: dict[str, Any]) -> None:
    """Sizes the config derives from each other stay consistent after the rules."""
    rope = out.get("qk_rope_head_dim")
    if isinstance(d.get("head_dim"), int) and d.get("head_dim") == d.get("qk_rope_head_dim"):
        out["head_dim"] = rope  # multi-head latent attention: head_dim is the rotary part
    if isinstance(d.get("qk_head_dim"), int) and d["qk_head_dim"] == d.get("qk_nope_head_dim", 0) + (
            d.get("qk_rope_head_dim") or 0):
        out["qk_head_dim"] = out.get("qk_nope_head_dim", 0) + (rope or 0)
    if isinstance(d.get("mamba_d_head"), int) and isinstance(out.get("mamba_n_heads"), int):
        width = int(out.get("mamba_expand", 2) * out.get("hidden_size", HIDDEN))
        out["mamba_d_head"] = max(1, width // out["mamba_n_heads"])
    for rk in ("rope_parameters", "rope_scaling"):
        rp = out.get(rk)
        if isinstance(rp, dict) and "mrope_section" not in rp and _declares_mrope(out.get("model_type")):
            rp = {**rp, "mrope_section": [16, 24, 24]}  # the modeling code's default, split below
        if isinstance(rp, dict) and _is_ints(rp.get("mrope_section")):
            head = out.get("head_dim") or out.get("qk_rope_head_dim") or (
                out.get("hidden_size", HIDDEN) // max(1, out.get("num_attention_heads", HEADS) or HEADS))
            factor = rp.get("partial_rotary_factor", out.get("partial_rotary_factor", 1.0)) or 1.0
            if "qk_rope_head_dim" in out and out.get("qk_rope_head_dim"):
                head, factor = out["qk_rope_head_dim"], 1.0
            out[rk] = {**rp, "mrope_section": _split(list(rp["mrope_section"]), int(head * factor) // 2)}


def _declares_mrope(model_type: Any) -> bool:
    """Does the config class of ``model_type`` take a multimodal rotary split (``mrope_section``)?"""
    try:
        from transformers import CONFIG_MAPPING

        cls = CONFIG_MAPPING[model_type]
    except Exception:  # noqa: BLE001 - no such class here
        return False
    return "mrope_section" in (getattr(cls, "ignore_keys_at_rope_validation", None) or ())


def _split(parts: list[int], total: int) -> list[int]:
    """``parts`` scaled to sum to ``total`` (each at least 1 where possible)."""
    old = sum(parts) or 1
    new = [max(1, p * total // old) for p in parts]
    new[-1] += total - sum(new)
    return new if new[-1] >= 1 else parts


def _shrink_one(key: str, v: int, tokens: dict[int, int]) -> int:
    if _TOKEN_ID.search(key) or key in ("pad_token_id", "bos_token_id", "eos_token_id", "sep_token_id",
                                         "cls_token_id", "decoder_start_token_id", "mask_token_id"):
        return _token(v, tokens)
    if key in _WIDTH:
        return _shrink_int(v, HIDDEN)
    if key in _FFN:
        return _shrink_int(v, FF)
    if key in _MOE_FFN:
        return _shrink_int(v, HIDDEN)
    if key in _LAYERS:
        return _shrink_int(v, LAYERS)
    if key in _HEADS:
        return _shrink_int(v, HEADS)
    if key in _KV_HEADS:
        return _shrink_int(v, HEADS)
    if key in _HEAD_DIM:
        return _shrink_int(v, HEAD_DIM)
    if key in ("qk_rope_head_dim", "rotary_dim"):
        return _shrink_int(v, HEAD_DIM // 2)
    if key in _POSITIONS:
        return _shrink_int(v, MAXPOS)
    if key == "max_source_positions":
        return _shrink_int(v, FRAMES // 2)
    if key in _EXPERTS:
        return _shrink_int(v, EXPERTS)
    if key in _EXPERTS_PER_TOKEN:
        return _shrink_int(v, EXPERTS_PER_TOKEN)
    if key in ("n_group", "topk_group", "num_expert_groups"):
        return _shrink_int(v, 1)
    if key in _VOCABS:
        return _shrink_int(v, VOCAB)
    if key in ("image_size", "pretrain_image_size"):
        return _shrink_int(v, IMAGE)
    if key == "patch_size":
        return _shrink_int(v, PATCH)
    if key in ("num_queries", "num_query_tokens"):
        return _shrink_int(v, 16)
    if key in ("num_conv_pos_embeddings",):
        return _shrink_int(v, 16)
    if key in ("num_conv_pos_embedding_groups",):
        return _shrink_int(v, 2)
    if key in ("max_window_layers", "first_k_dense_replace"):
        return _shrink_int(v, 1)
    if key == "window_size":
        return _shrink_int(v, 4)
    if key in ("sliding_window", "sliding_window_size", "local_attention", "attention_window"):
        return _shrink_int(v, 8)
    return v


def _token(v: int, tokens: dict[int, int]) -> int:
    if v < 0 or v < VOCAB - SPECIAL:
        return v if v < VOCAB else _new_token(v, tokens)
    return _new_token(v, tokens)


def _new_token(v: int, tokens: dict[int, int]) -> int:
    if v not in tokens:
        tokens[v] = VOCAB - 1 - len(tokens) % SPECIAL
    return tokens[v]


def _shrink_list(key: str, v: list[int], old_layers: int | None, new_layers: int | None,
                 tokens: dict[int, int]) -> list[int]:
    if _TOKEN_ID.search(key) or key in ("eos_token_id", "bos_token_id", "pad_token_id"):
        return [_token(x, tokens) for x in v]
    if key in _STAGE_WIDTHS:
        return [_stage_width(x) for x in v]
    if key in _STAGE_DEPTHS:
        return [min(x, 1) for x in v]
    if key in _STAGE_HEADS:
        return [min(x, HEADS) for x in v]
    if key in ("image_size",):
        return [min(x, IMAGE) for x in v]
    if key in ("patch_size",):
        return [min(x, PATCH) for x in v]
    if old_layers and new_layers and old_layers != new_layers:
        if len(v) == old_layers:
            return v[:new_layers]  # one value per layer
        if _LAYER_INDEX_LISTS.search(key) and all(0 <= x < old_layers for x in v):
            kept = [x for x in v if x < new_layers]
            return kept or [new_layers - 1]  # layer indices
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
