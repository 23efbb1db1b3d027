"""Hugging Face ``transformers`` architectures as model graphs (optional extra).

Each architecture is built with ``AutoModel.from_config`` from a tiny config constructed in code
(random, seeded weights; no hub access: ``HF_HUB_OFFLINE=1``), dropout off, ``use_cache`` off, and
wrapped so that it takes positional tensors and returns a tuple of float tensors. The specs have
the ``GraphSpec`` interface the runner uses; model ids are ``hf.<model_type>``.

Requires ``transformers`` (``pip install transformers``); without it :func:`available` is False
and selecting ``hf`` raises a ``SelectionError`` that says so.

Example::

    >>> from conformance.models import hf
    >>> if hf.available():
    ...     spec = hf.spec_by_id("hf.bert")
    ...     out = spec.build()(*spec.example_inputs())
    ...     type(out).__name__, len(spec.shape_variants())
    ... else:
    ...     ("tuple", 3)
    ('tuple', 3)
"""

from __future__ import annotations

import importlib.util
import os
import warnings
import zlib
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from .family import N_SHAPE_VARIANTS, float_leaves, pick, sumsq_loss

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

INSTALL_HINT = "install the hf extra: pip install transformers"
VOCAB, HIDDEN, LAYERS, HEADS, FF, MAXPOS, IMAGE = 128, 32, 2, 2, 64, 64, 32

# Shared tiny text config; each architecture adds or overrides keys.
TEXT = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
            num_key_value_heads=HEADS, intermediate_size=FF, max_position_embeddings=MAXPOS, head_dim=HIDDEN // HEADS,
            pad_token_id=0, bos_token_id=1, eos_token_id=2, use_cache=False, tie_word_embeddings=False)
ENCDEC = dict(vocab_size=VOCAB, d_model=HIDDEN, encoder_layers=LAYERS, decoder_layers=LAYERS,
              encoder_attention_heads=HEADS, decoder_attention_heads=HEADS, encoder_ffn_dim=FF, decoder_ffn_dim=FF,
              max_position_embeddings=MAXPOS, pad_token_id=0, bos_token_id=1, eos_token_id=2,
              decoder_start_token_id=2, use_cache=False)
T5 = dict(vocab_size=VOCAB, d_model=HIDDEN, d_kv=HIDDEN // HEADS, d_ff=FF, num_layers=LAYERS, num_decoder_layers=LAYERS,
          num_heads=HEADS, decoder_start_token_id=0, pad_token_id=0, use_cache=False)
VIT = dict(image_size=IMAGE, patch_size=8, num_channels=3, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
           num_attention_heads=HEADS, intermediate_size=FF)
CNN = dict(num_channels=3, image_size=IMAGE)
AUDIO = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
             intermediate_size=FF, conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
             num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2, do_stable_layer_norm=False,
             mask_time_prob=0.0, mask_feature_prob=0.0)

# model_type -> (input kind, config overrides). Input kinds: text | encdec | image | audio | features.
# Left out (transformers 5.24 / torch 2.13): MoE models whose experts use aten::_grouped_mm (its
# fake kernel wants bf16, so make_fx fails in fp32): mixtral, qwen2_moe, qwen3_moe; data-dependent
# guards under make_fx: ibert, led; tiny-config constraints: falcon, nystromformer, funnel, yolos,
# convnext(v2), bit, cvt.
ARCHS: dict[str, tuple[str, dict[str, Any]]] = {
    # decoder-only LMs
    "gpt2": ("text", {"n_positions": MAXPOS, "n_inner": FF}),
    "gpt_neo": ("text", {"attention_types": [[["global", "local"], 1]], "window_size": 8}),
    "gptj": ("text", {"n_positions": MAXPOS, "rotary_dim": 8, "n_inner": FF}),
    "gpt_neox": ("text", {"rotary_pct": 0.5}),
    "gpt_bigcode": ("text", {"n_positions": MAXPOS, "n_inner": FF}),
    "codegen": ("text", {"n_positions": MAXPOS, "n_ctx": MAXPOS, "rotary_dim": 8, "n_inner": FF}),
    "opt": ("text", {"ffn_dim": FF, "word_embed_proj_dim": HIDDEN}),
    "bloom": ("text", {"n_layer": LAYERS, "n_head": HEADS}),
    "mpt": ("text", {"d_model": HIDDEN, "n_heads": HEADS, "n_layers": LAYERS, "expansion_ratio": 2}),
    "biogpt": ("text", {}),
    "xglm": ("text", {"d_model": HIDDEN, "ffn_dim": FF, "attention_heads": HEADS, "num_layers": LAYERS}),
    "ctrl": ("text", {"n_positions": MAXPOS, "dff": FF}),
    "llama": ("text", {}),
    "mistral": ("text", {"sliding_window": None}),
    "qwen2": ("text", {}),
    "qwen3": ("text", {}),
    "gemma": ("text", {}),
    "gemma2": ("text", {"sliding_window": 8}),
    "gemma3_text": ("text", {"sliding_window": 8}),
    "phi": ("text", {"partial_rotary_factor": 0.5}),
    "phi3": ("text", {"pad_token_id": 0}),
    "stablelm": ("text", {"partial_rotary_factor": 0.5}),
    "starcoder2": ("text", {"sliding_window": None}),
    "olmo": ("text", {}),
    "olmo2": ("text", {}),
    "cohere": ("text", {}),
    "granite": ("text", {}),
    "persimmon": ("text", {}),
    "nemotron": ("text", {"partial_rotary_factor": 0.5}),
    "glm": ("text", {}),
    "helium": ("text", {}),
    "mamba": ("text", {"state_size": 4, "expand": 2, "conv_kernel": 4, "use_mambapy": True}),
    "modernbert-decoder": ("text", {"global_attn_every_n_layers": 1, "local_attention": 8}),
    # encoders
    "bert": ("text", {}),
    "roberta": ("text", {"max_position_embeddings": MAXPOS + 2}),
    "distilbert": ("text", {"dim": HIDDEN, "n_layers": LAYERS, "n_heads": HEADS, "hidden_dim": FF}),
    "albert": ("text", {"embedding_size": 16}),
    "electra": ("text", {"embedding_size": 16}),
    "deberta": ("text", {}),
    "deberta-v2": ("text", {}),
    "xlm-roberta": ("text", {"max_position_embeddings": MAXPOS + 2}),
    "camembert": ("text", {"max_position_embeddings": MAXPOS + 2}),
    "mpnet": ("text", {}),
    "squeezebert": ("text", {"embedding_size": HIDDEN, "q_groups": 2, "k_groups": 2, "v_groups": 2,
                             "post_attention_groups": 2, "intermediate_groups": 2, "output_groups": 2}),
    "convbert": ("text", {"embedding_size": HIDDEN, "conv_kernel_size": 3, "head_ratio": 2}),
    "mobilebert": ("text", {"embedding_size": 16, "intra_bottleneck_size": 16, "true_hidden_size": 16,
                            "num_feedforward_networks": 1}),
    "ernie": ("text", {}),
    "megatron-bert": ("text", {}),
    "rembert": ("text", {"input_embedding_size": 16, "output_embedding_size": 16}),
    "roformer": ("text", {"embedding_size": HIDDEN}),
    "data2vec-text": ("text", {"max_position_embeddings": MAXPOS + 2}),
    "esm": ("text", {"max_position_embeddings": MAXPOS + 2, "position_embedding_type": "rotary"}),
    "modernbert": ("text", {"global_attn_every_n_layers": 1, "local_attention": 8}),
    "fnet": ("text", {}),
    # encoder-decoders
    "t5": ("encdec", T5),
    "mt5": ("encdec", T5),
    "umt5": ("encdec", T5),
    "bart": ("encdec", ENCDEC),
    "mbart": ("encdec", ENCDEC),
    "pegasus": ("encdec", ENCDEC),
    "marian": ("encdec", ENCDEC),
    "blenderbot": ("encdec", ENCDEC),
    "blenderbot-small": ("encdec", ENCDEC),
    "m2m_100": ("encdec", ENCDEC),
    "plbart": ("encdec", ENCDEC),
    # vision
    "vit": ("image", VIT),
    "deit": ("image", VIT),
    "beit": ("image", {**VIT, "use_mask_token": False}),
    "dinov2": ("image", VIT),
    "data2vec-vision": ("image", VIT),
    "ijepa": ("image", VIT),
    "vit_msn": ("image", VIT),
    "swin": ("image", {**CNN, "patch_size": 4, "embed_dim": 16, "depths": [1, 1], "num_heads": [1, 2], "window_size": 4}),
    "resnet": ("image", {**CNN, "embedding_size": 8, "hidden_sizes": [8, 16], "depths": [1, 1]}),
    "regnet": ("image", {**CNN, "embedding_size": 8, "hidden_sizes": [8, 16], "depths": [1, 1], "groups_width": 8}),
    "mobilenet_v2": ("image", {**CNN, "depth_multiplier": 0.25}),
    "mobilevit": ("image", {**CNN, "hidden_sizes": [16, 16, 16], "neck_hidden_sizes": [8, 8, 16, 16, 16, 16, 32],
                            "patch_size": 2}),
    "levit": ("image", {**CNN, "hidden_sizes": [16, 32, 48], "num_attention_heads": [1, 2, 3], "depths": [1, 1, 1],
                        "key_dim": [8, 8, 8]}),
    "poolformer": ("image", {**CNN, "hidden_sizes": [8, 16, 16, 32], "depths": [1, 1, 1, 1]}),
    "segformer": ("image", {**CNN, "num_encoder_blocks": 2, "depths": [1, 1], "sr_ratios": [2, 1],
                            "hidden_sizes": [8, 16], "num_attention_heads": [1, 2], "decoder_hidden_size": 16,
                            "patch_sizes": [7, 3], "strides": [4, 2]}),
    "focalnet": ("image", {**CNN, "patch_size": 4, "embed_dim": 16, "depths": [1, 1]}),
    # audio
    "wav2vec2": ("audio", AUDIO),
    "hubert": ("audio", AUDIO),
    "data2vec-audio": ("audio", AUDIO),
    "whisper": ("features", {**ENCDEC, "num_mel_bins": 16, "max_source_positions": 16, "max_target_positions": MAXPOS}),
}


def available() -> bool:
    """Is ``transformers`` importable?"""
    return importlib.util.find_spec("transformers") is not None


def unavailable_reason() -> str:
    return f"Hugging Face transformers is not installed; {INSTALL_HINT}"


def _seed(*parts: Any) -> int:
    return zlib.crc32("|".join(map(str, parts)).encode())


class HFWrapper(nn.Module):
    """Positional tensors in (named ``names``), a tuple of the float output tensors out."""

    def __init__(self, model: nn.Module, names: tuple[str, ...]):
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *args: Tensor) -> tuple[Tensor, ...]:
        out = self.model(**dict(zip(self.names, args, strict=True)), return_dict=True)
        first = out.get("last_hidden_state", None) if hasattr(out, "get") else None
        leaves = [first] if isinstance(first, Tensor) else float_leaves(out.to_tuple())[:1]
        return tuple(leaves)


def _no_dropout(config: Any) -> None:
    for key, value in list(vars(config).items()):
        if isinstance(value, float) and ("dropout" in key or key.endswith("_pdrop") or "drop_prob" in key
                                         or key == "layerdrop" or key.endswith("_layerdrop")):
            setattr(config, key, 0.0)


@dataclass(frozen=True)
class HFSpec:
    """A Hugging Face architecture with the ``GraphSpec`` interface."""

    model_id: str
    model_type: str
    kind: str
    overrides: dict[str, Any] = field(hash=False, default_factory=dict)
    seed: int = 0
    supports_bf16: bool = True
    family: str = "hf"

    @property
    def params(self) -> dict[str, Any]:
        return {"model_type": self.model_type, "inputs": self.kind}

    def config(self) -> Any:
        from transformers import AutoConfig

        kw = {**(TEXT if self.kind == "text" else {}), **self.overrides}
        config = AutoConfig.for_model(self.model_type, **kw)
        _no_dropout(config)
        if hasattr(config, "use_cache"):
            config.use_cache = False
        return config

    def names(self) -> tuple[str, ...]:
        return {"text": ("input_ids",), "encdec": ("input_ids", "decoder_input_ids"), "image": ("pixel_values",),
                "audio": ("input_values",), "features": ("input_features", "decoder_input_ids")}[self.kind]

    def build(self) -> nn.Module:
        from transformers import AutoModel

        gen = torch.default_generator
        saved = gen.get_state()
        gen.manual_seed(_seed(self.model_id, self.seed, "weights"))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = AutoModel.from_config(self.config())
        finally:
            gen.set_state(saved)
        return HFWrapper(model, self.names()).float().train()

    def example_inputs(self, batch_shape_variant: int = 0) -> tuple:
        v = batch_shape_variant
        gen = torch.Generator().manual_seed(_seed(self.model_id, self.seed, "inputs", v))
        b = pick(v, (2, 3, 4))  # train-mode BatchNorm needs a batch > 1
        if self.kind == "text":
            return (torch.randint(3, VOCAB, (b, pick(v, (8, 12, 16))), generator=gen),)
        if self.kind == "encdec":
            return (torch.randint(3, VOCAB, (b, pick(v, (8, 12, 16))), generator=gen),
                    torch.randint(3, VOCAB, (b, pick(v, (6, 4, 8))), generator=gen))
        if self.kind == "image":
            return (torch.randn(b, 3, IMAGE, IMAGE, generator=gen),)
        if self.kind == "audio":
            return (torch.randn(b, pick(v, (400, 480, 560)), generator=gen),)
        return (torch.randn(b, 16, 32, generator=gen), torch.randint(3, VOCAB, (b, pick(v, (6, 4, 8))), generator=gen))

    def shape_variants(self) -> list[tuple]:
        return [self.example_inputs(v) for v in range(N_SHAPE_VARIANTS)]

    def loss(self, output: Any) -> Tensor:
        gen = torch.Generator().manual_seed(_seed(self.model_id, self.seed, "targets"))
        return sumsq_loss(output, self.params, gen)

    def trace(self, method: str = "make_fx", batch_shape_variant: int = 0) -> Any:
        from .tracing import trace

        return trace(self.build(), self.example_inputs(batch_shape_variant), method=method)

    def graph_hash(self, method: str = "make_fx") -> str:
        from .tracing import hash_graph

        return hash_graph(self.trace(method))

    def aten_histogram(self, method: str = "make_fx") -> dict[str, int]:
        from .tracing import histogram

        return histogram(self.trace(method))


def _supported(model_type: str) -> bool:
    from transformers import CONFIG_MAPPING

    return model_type in CONFIG_MAPPING


def enumerate_specs(limit: int | None = None) -> list[HFSpec]:
    """The architectures this ``transformers`` version knows, in table order."""
    if not available():
        raise RuntimeError(unavailable_reason())
    specs = [HFSpec(f"hf.{t}", t, kind, dict(kw)) for t, (kind, kw) in ARCHS.items() if _supported(t)]
    return specs[:limit] if limit is not None else specs


def spec_by_id(model_id: str) -> HFSpec:
    if not available():
        raise KeyError(f"{model_id}: {unavailable_reason()}")
    for spec in enumerate_specs():
        if spec.model_id == model_id:
            return spec
    raise KeyError(model_id)
