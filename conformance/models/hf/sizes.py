"""The tiny sizes of the Hugging Face zoo's configs and the attribute names each applies to
(:mod:`conformance.models.hf.rules` shrinks by them, :mod:`~conformance.models.hf.relations`
keeps the sizes a config derives from each other consistent), with the special token renumbering.

Example::

    >>> "hidden_size" in WIDTH_KEYS, stage_width(2048), shrink_int(4096, HIDDEN)
    (True, 128, 32)
"""

from __future__ import annotations

import re
from typing import Any

# The tiny sizes the rules shrink to.
VOCAB, HIDDEN, LAYERS, HEADS, HEAD_DIM, FF, MAXPOS, IMAGE, PATCH = 128, 32, 2, 2, 16, 64, 64, 64, 8
SPECIAL = 32  # the top SPECIAL ids of the vocabulary hold the renumbered special tokens; inputs draw below
EXPERTS, EXPERTS_PER_TOKEN = 4, 2
SAMPLES = 3200  # raw audio samples (0.2 s at 16 kHz)
FRAMES = 32  # feature frames of a spectrogram input
VIDEO_FRAMES = 4  # frames of a video input (a multiple of the usual temporal patch, 2)
HORIZON = 8  # a forecast horizon the config leaves to the dataset (prediction_length = None)

# -- the shrink rules ----------------------------------------------------------------------------
# Each rule: attribute names (exact) -> the function of the default value that gives the tiny one.
# Integers only shrink (min with the tiny size); lists of per-stage sizes shrink elementwise.
WIDTH_KEYS = {"hidden_size", "d_model", "n_embd", "dim", "embed_dim", "word_embed_proj_dim", "embedding_size",
          "projection_dim", "text_hidden_size", "out_hidden_size", "encoder_hidden_size", "decoder_hidden_size",
          "hidden_dim", "projector_hidden_size", "output_hidden_size", "input_embedding_size",
          "output_embedding_size", "true_hidden_size", "intra_bottleneck_size", "d_embed", "n_embed",
          "embedding_dim", "audio_hidden_size", "vision_hidden_size", "pooler_output_size", "pooler_hidden_size",
          "fusion_hidden_size", "image_text_hidden_size", "hidden_size_per_layer_input", "latent_dim",
          "classifier_proj_size", "codevector_dim", "proj_codevector_dim", "xvector_output_dim", "d_inner_hid",
          "encoder_hidden_dim", "decoder_hidden_dim", "attention_hidden_size", "hidden_size_global",
          "fpn_hidden_size", "iou_head_hidden_dim", "output_channels",
          "memory_attention_hidden_size", "memory_encoder_hidden_size", "mask_downsampler_embed_dim",
          "memory_fuser_embed_dim", "num_pos_feats", "lqe_hidden_dim", "frequency_embedding_size",
          "vector_quantization_hidden_dimension", "num_filters", "subsampling_conv_channels",
          "speech_decoder_postnet_units", "upsample_initial_channel", "base_channels", "latent_channels",
          "codebook_dim", "d_latent", "d_head_ff", "text_embed_dim", "vision_embed_dim", "mlp_dim_text"}
FFN_KEYS = {"intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "d_ff", "n_inner", "dff", "mlp_dim",
        "decoder_intermediate_size", "ffn_hidden_size", "encoder_linear_units", "decoder_linear_units",
        "speech_encoder_intermediate_size", "memory_fuser_intermediate_dim", "projection_hidden_dim",
        "memory_attention_feed_forward_hidden_size", "encoder_intermediate_size", "hidden_dim_ffn",
        "d_inner"}
MOE_FFN_KEYS = {"moe_intermediate_size", "shared_expert_intermediate_size", "shared_intermediate_size",
            "shared_experts_intermediate_size", "expert_intermediate_size"}
LAYERS_KEYS = {"num_hidden_layers", "n_layer", "n_layers", "num_layers", "encoder_layers", "decoder_layers",
           "num_decoder_layers", "num_encoder_layers", "decoder_num_layers", "depth", "encoder_depth",
           "decoder_depth", "num_text_layers", "num_vision_layers", "speech_encoder_layers",
           "text_encoder_layers", "text_decoder_layers", "t2u_encoder_layers", "t2u_decoder_layers",
           "num_fusion_layers", "num_hidden_groups"}
HEADS_KEYS = {"num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads",
          "decoder_attention_heads", "attention_heads", "speech_encoder_attention_heads",
          "text_encoder_attention_heads", "text_decoder_attention_heads", "linear_num_key_heads",
          "linear_num_value_heads", "linear_num_heads", "swa_num_attention_heads", "index_n_heads", "mamba_n_heads",
          "index_num_heads", "n_mamba_heads",
          "decoder_num_attention_heads", "encoder_num_attention_heads", "t2u_encoder_attention_heads",
          "t2u_decoder_attention_heads"}
KV_HEADS_KEYS = {"num_key_value_heads", "swa_num_key_value_heads", "num_kv_heads", "multi_query_group_num",
             "encoder_num_key_value_heads", "decoder_num_key_value_heads", "cross_num_key_value_heads"}
HEAD_DIM_KEYS = {"head_dim", "d_kv", "v_head_dim", "qk_nope_head_dim", "linear_key_head_dim",
             "linear_value_head_dim", "linear_head_dim", "swa_head_dim", "dim_head", "index_head_dim",
             "kv_lora_rank", "q_lora_rank", "attention_head_dim", "mamba_d_head", "kv_channels", "d_head",
             "mamba_headdim"}
POSITIONS_KEYS = {"max_position_embeddings", "n_positions", "n_ctx", "max_target_positions", "max_seq_len",
              "max_sequence_length", "t2u_max_position_embeddings", "text_max_position_embeddings",
              "max_2d_position_embeddings", "position_embedding_size", "max_length", "block_size", "context_length",
              "context_size"}
EXPERTS_KEYS = {"num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts", "num_experts_per_layer"}
EXPERTS_PER_TOKEN_KEYS = {"num_experts_per_tok", "num_experts_per_token", "moe_topk", "top_k", "moe_k", "top_k_experts",
                      "moe_top_k"}
VOCABS_KEYS = {"vocab_size", "input_vocab_size", "output_vocab_size", "t2u_vocab_size", "unit_hifi_gan_vocab_size",
           "codebook_size", "num_embeddings", "text_vocab_size", "vocab_size_per_layer_input", "unpadded_vocab_size"}
STAGE_WIDTHS_KEYS = {"hidden_sizes", "embed_dim", "embed_dims", "neck_hidden_sizes", "stage_out_channels",
                 "stage_in_channels", "stage_mid_channels", "encoder_in_channels", "conv_dim", "tdnn_dim",
                 "embed_dim_per_stage", "encoder_hidden_sizes", "out_features", "decoder_in_channels",
                 "backbone_channel_list", "in_channels", "out_channels", "downsample_channels",
                 "intermediate_feature_dims", "vision_features_channels", "base_attn_unit_dims", "stem_channels"}
STAGE_DEPTHS_KEYS = {"depths", "stage_num_blocks", "blocks_per_stage", "num_block_repeats", "block_repeats",
                 "stage_numb_of_layers", "n_attn_blocks"}
STAGE_HEADS_KEYS = {"num_heads", "num_attention_heads", "num_attention_heads_per_stage", "key_dim"}
# A size no rule names that equals a width (or stage width) the rules shrink is that width (a head's
# condition_dim, an adapter's input, the channels of a backbone stage a head reads): equal values
# stay equal. Not the sizes of other things.
SIZE_LIKE = re.compile(r"(_dim|_size|_channels|_width|_features)$")
NOT_WIDTH = re.compile(r"(vocab|image|patch|kernel|window|chunk|block|pool|sampl|max_|position|crop|stride|rate)")
GROUP_KEY = re.compile(r"(^|_)groups$")
ZERO_FLOATS = re.compile(r"(dropout|_pdrop|drop_prob|layerdrop|^mask_.*_prob$|drop_path_rate)")
TOKEN_ID = re.compile(r"(_token_id|_token_index|_token_ids)$")
LAYER_INDEX_LISTS = re.compile(r"(_indexes|_indices|_idxs|_index|_layers|_layer_ids|_hook_ids|_layers_indices)$")


def shrink_int(value: int, tiny: int) -> int:
    return min(value, tiny) if value > 0 else value


def stage_width(x: int) -> int:
    return max(8, (x // 16 + 7) // 8 * 8) if x >= 8 else x


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_ints(value: Any) -> bool:
    return isinstance(value, list | tuple) and bool(value) and all(
        isinstance(x, int) and not isinstance(x, bool) for x in value)


def is_config(value: Any) -> bool:
    return isinstance(value, dict) and "model_type" in value


def layers_of(d: dict[str, Any]) -> tuple[int | None, int | None]:
    """The layer count of a config dict and what the rules make of it."""
    for key in ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "decoder_layers", "encoder_layers"):
        v = d.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v, min(v, LAYERS)
    return None, None


def token(v: int, tokens: dict[int, int]) -> int:
    if v < 0 or v < VOCAB - SPECIAL:
        return v if v < VOCAB else new_token(v, tokens)
    return new_token(v, tokens)


def new_token(v: Any, tokens: dict[Any, int]) -> int:
    if v not in tokens:
        tokens[v] = VOCAB - 1 - len(tokens) % SPECIAL
    return tokens[v]
