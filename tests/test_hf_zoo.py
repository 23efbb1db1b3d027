"""The Hugging Face zoo: model types from transformers' auto mappings, tiny configs by rules, overrides as data."""

from __future__ import annotations

import functools
import time

import pytest
import torch

from conformance.datafiles import DataFileError
from conformance.models import hf
from conformance.models.hf import rules as hf_rules
from conformance.models.zoo import ZooSkip

needs_hf = pytest.mark.skipif(not hf.available(), reason=f"transformers not installed ({hf.INSTALL_HINT})")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning")


# -- the rules (plain dicts: no transformers needed) ----------------------------------------------
def test_shrink_rules_make_a_default_config_tiny():
    d = {"model_type": "x", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
         "num_key_value_heads": 8, "intermediate_size": 11008, "vocab_size": 32000, "max_position_embeddings": 4096,
         "head_dim": 128, "bos_token_id": 31999, "eos_token_id": [31998, 31999], "pad_token_id": 0,
         "attention_dropout": 0.1, "layer_types": ["full"] * 32, "use_cache": True, "hidden_act": "silu",
         "text_config": {"model_type": "y", "hidden_size": 1024, "depths": [3, 4, 6, 3],
                         "hidden_sizes": [256, 512, 1024, 2048]}}
    t = hf_rules.shrink(d)
    assert (t["hidden_size"], t["num_hidden_layers"], t["num_attention_heads"]) == (hf_rules.HIDDEN, hf_rules.LAYERS, hf_rules.HEADS)
    assert t["num_key_value_heads"] == 1  # grouped-query attention stays grouped
    assert t["head_dim"] == hf_rules.HIDDEN // hf_rules.HEADS and t["intermediate_size"] == hf_rules.FF
    assert t["vocab_size"] == hf_rules.VOCAB and t["max_position_embeddings"] == hf_rules.MAXPOS
    assert hf_rules.VOCAB - hf_rules.SPECIAL <= t["bos_token_id"] < hf_rules.VOCAB and t["pad_token_id"] == 0
    assert t["eos_token_id"][1] == t["bos_token_id"]  # one old id, one new id
    assert t["attention_dropout"] == 0.0 and t["use_cache"] is False and t["hidden_act"] == "silu"
    assert t["layer_types"] == ["full"] * hf_rules.LAYERS
    # stages shrink elementwise, except one as wide as a width (1024 = hidden_size): it is that width
    assert t["text_config"]["depths"] == [1, 1, 1, 1] and t["text_config"]["hidden_sizes"] == [16, 32, 32, 128]
    assert d["hidden_size"] == 4096  # the input is left alone


def test_layer_index_lists_follow_the_new_depth():
    t = hf_rules.shrink({"num_hidden_layers": 12, "global_attn_indexes": [2, 5, 8, 11], "mlp_only_layers": [0, 1]})
    assert t["global_attn_indexes"] == [1] and t["mlp_only_layers"] == [0, 1]


# -- the overrides file ---------------------------------------------------------------------------
def test_committed_overrides_load_and_each_has_a_reason():
    table = hf_rules.overrides()
    assert all(o.reason.strip() and o.config for o in table.values())


@pytest.mark.parametrize("body, needle", [
    ('[bert]\nconfig = { hidden_size = 8 }\n', "bert.reason is missing"),
    ('[bert]\nreason = " "\nconfig = { hidden_size = 8 }\n', "bert.reason = ' ' is not valid"),
    ('[bert]\nreason = "r"\nconfig = {}\n', "bert.config = {} is not valid"),
    ('[bert]\nreason = "r"\nconfig = { a = 1 }\nextra = 2\n', "bert.extra = 2 is not valid"),
    ('[Bert]\nreason = "r"\nconfig = { a = 1 }\n', "Bert = "),
    ('[bert]\nreason = "r"\nconfig = { "a b" = 1 }\n', "bert.config.a b = 1 is not valid"),
    ('[bert]\nreason = "r"\nconfig = { text_config = { a = 1 } }\n', "bert.config.text_config = {'a': 1}"),
    ("[bert\n", "not valid TOML"),
])
def test_bad_overrides_are_one_error_naming_file_field_and_value(tmp_path, body, needle):
    bad = tmp_path / "hf_overrides.toml"
    bad.write_text(body)
    with pytest.raises(DataFileError) as err:
        hf_rules.overrides(bad)
    assert str(err.value).startswith(f"{bad}: ") and needle in str(err.value)


def test_dotted_override_keys_reach_sub_configs():
    d = hf_rules.apply_overrides({"text_config": {"a": 1}}, {"text_config.a": 2, "b": 3})
    assert d == {"text_config": {"a": 2}, "b": 3}


# -- the library ----------------------------------------------------------------------------------
@needs_hf
def test_enumeration_is_the_librarys_base_models_and_cheap():
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    t0 = time.perf_counter()
    specs = hf.enumerate_specs()
    assert time.perf_counter() - t0 < 30
    assert [s.model_type for s in specs] == list(MODEL_MAPPING_NAMES)
    assert len({s.model_id for s in specs}) == len(specs) and all(s.model_id == f"hf.{s.model_type}" for s in specs)
    assert hf.spec_by_id("hf.bert").model_type == "bert"
    with pytest.raises(KeyError):
        hf.spec_by_id("hf.no-such-model")


@needs_hf
def test_every_override_names_a_model_type_and_reaches_its_config():
    types = set(hf.base_models())
    for model_type, o in hf_rules.overrides().items():
        assert model_type in types, f"{model_type}: not a base model type of this transformers"
        config = hf.spec_by_id(f"hf.{model_type}").config()
        for dotted, value in o.config.items():
            node = config
            for part in dotted.split("."):
                node = node[part] if isinstance(node, dict) else getattr(node, part)
            assert node == value or list(node) == list(value), (model_type, dotted)


@needs_hf
@pytest.mark.parametrize("model_id, family, inputs", [
    ("hf.bert", "text-encoder", "input_ids"),
    ("hf.llama", "text-decoder", "input_ids"),
    ("hf.t5", "encoder-decoder", "input_ids,decoder_input_ids"),
    ("hf.vit", "vision", "pixel_values"),
    ("hf.wav2vec2", "audio", "input_values"),
    ("hf.whisper", "audio", "input_features,decoder_input_ids"),
    ("hf.clip", "multimodal", "input_ids,pixel_values"),
])
def test_models_build_run_backward_and_trace(model_id, family, inputs):
    from conformance.models.tracing import trace

    spec = hf.spec_by_id(model_id)
    assert spec.params == {"library": "hf", "arch_family": family, "model_type": model_id[3:], "inputs": inputs}
    model = spec.build()
    x = spec.example_inputs()
    out = model(*x)
    assert isinstance(out, tuple) and out and all(t.is_floating_point() for t in out)
    spec.loss(out).backward()
    assert any(p.grad is not None for p in model.parameters())
    assert trace(model, x) is not None
    # seeded: the same weights and inputs every time
    again = spec.build()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values(),
                                                  strict=True))
    assert all(torch.equal(a, b) for a, b in zip(x, spec.example_inputs(), strict=True))


@needs_hf
def test_a_type_that_cannot_be_given_is_a_zoo_skip_with_the_reason(monkeypatch):
    spec = hf.spec_by_id("hf.bert")
    monkeypatch.setenv("CONFORMANCE_ZOO_MAX_PARAMS", "1000")
    with pytest.raises(ZooSkip, match="over budget"):
        spec.build()
    bad = hf.HFSpec("hf.bert", "bert", overrides={"hidden_size": 30, "num_attention_heads": 4})
    monkeypatch.delenv("CONFORMANCE_ZOO_MAX_PARAMS")
    with pytest.raises(ZooSkip, match=r"^(config|build|cannot be built).*: \w+Error: "):
        bad.build()


# -- the rules keep the config's own invariants ---------------------------------------------------
def test_a_size_equal_to_a_width_shrinks_with_it():
    t = hf_rules.shrink({"model_type": "x", "d_model": 256, "decoder_in_channels": [256, 256, 256],
                         "encoder_in_channels": [512, 1024], "x4_feat_dim": 512,
                         "flow_head_config": {"model_type": "y", "condition_dim": 256, "hidden_size": 64}})
    assert t["decoder_in_channels"] == [hf_rules.HIDDEN] * 3  # a neck reading d_model-wide features
    assert t["x4_feat_dim"] == t["encoder_in_channels"][0]  # a head reading a backbone stage
    assert t["flow_head_config"]["condition_dim"] == t["d_model"]  # a sub-config conditioned on the width


def test_group_counts_divide_what_they_group():
    t = hf_rules.shrink({"hidden_size": 512, "upsample_groups": 512, "num_groups": 32, "hidden_sizes": [256, 512]})
    assert t["upsample_groups"] == t["hidden_size"]  # depthwise: one group per channel
    assert all(w % t["num_groups"] == 0 for w in t["hidden_sizes"])  # GroupNorm over the stages
    m = hf_rules.shrink({"hidden_size": 768, "expand": 2, "num_heads": 24, "head_dim": 64, "n_groups": 8})
    assert m["num_heads"] % m["n_groups"] == 0  # Mamba-2: groups of heads
    assert m["num_heads"] * m["head_dim"] == m["expand"] * m["hidden_size"]


def test_the_layers_kept_keep_every_kind_and_everything_per_layer_follows():
    kinds = ["sliding"] * 4 + ["full"] + ["sliding"] * 4 + ["full"]
    t = hf_rules.shrink({"num_hidden_layers": 10, "layer_types": kinds, "full_layers": [4, 9],
                         "kv_source_layers": [0, 1, 2, 3, 4, 5, 6, 7, 8, 4],
                         "per_layer_config": {"04": {"rope_theta": 1e6, "head_dim": 512}},
                         "id2label": {"0": "LABEL_0", "1": "LABEL_1"}})
    assert t["layer_types"] == ["sliding", "full"] and t["full_layers"] == [1]
    assert t["kv_source_layers"] == [0, 1]  # layer 4's source is itself, now layer 1
    assert t["id2label"] == {"0": "LABEL_0", "1": "LABEL_1"}  # labels, not layers
    assert t["per_layer_config"] == {"01": {"rope_theta": 1e6, "head_dim": hf_rules.HEAD_DIM}}  # its own values, shrunk
    plain = hf_rules.shrink({"num_hidden_layers": 10, "layer_types": kinds}, kinds=False)
    assert plain["layer_types"] == ["sliding", "sliding"]


def test_stages_follow_a_layer_count_that_counts_them_except_in_a_backbone():
    swin = {"model_type": "swin", "num_layers": 4, "depths": [2, 2, 6, 2], "num_heads": [3, 6, 12, 24],
            "stage_names": ["stem", "stage1", "stage2", "stage3", "stage4"]}
    assert hf_rules.shrink(swin)["depths"] == [1, 1]
    t = hf_rules.shrink({"model_type": "maskformer", "backbone_config": swin})["backbone_config"]
    assert t["depths"] == [1, 1, 1, 1] and t["num_layers"] == 4  # a detector reads all four stages


def test_sizes_in_patches_follow_the_patch_grid_and_unset_sizes_get_values():
    t = hf_rules.shrink({"model_type": "sam", "prompt_encoder_config": {
        "model_type": "p", "image_size": 1024, "patch_size": 16, "image_embedding_size": 64},
        "vision_config": {"model_type": "v", "backbone_feature_sizes": [[256, 256], [128, 128], [64, 64]],
                          "backbone_config": {"model_type": "b", "image_size": 1024, "patch_stride": 4}}})
    assert t["prompt_encoder_config"]["image_embedding_size"] == hf_rules.IMAGE // hf_rules.PATCH
    assert t["vision_config"]["backbone_feature_sizes"] == [[16, 16], [8, 8], [4, 4]]
    u = hf_rules.shrink({"prediction_length": None, "lags_sequence": [1, 2], "num_attention_heads": 8,
                         "num_key_value_heads": None, "moe_intermediate_size": 512, "n_routed_experts": None,
                         "num_experts_per_tok": None, "window_size": 112, "patch_size": 14})
    assert u["prediction_length"] == 8 and u["num_key_value_heads"] == u["num_attention_heads"]
    assert (u["n_routed_experts"], u["num_experts_per_tok"]) == (hf_rules.EXPERTS, hf_rules.EXPERTS_PER_TOKEN)
    assert u["window_size"] // u["patch_size"] == 112 // 14  # a window in pixels keeps its patches


# -- inputs from the config -----------------------------------------------------------------------
def _cfg(**kw):
    from types import SimpleNamespace

    return SimpleNamespace(**kw)


def test_inputs_that_belong_together_are_built_together():
    from conformance.models.hf import inputs

    gen = torch.Generator().manual_seed(0)
    qwen = _cfg(patch_size=8, temporal_patch_size=2, spatial_merge_size=2, in_channels=3)
    x, grid = inputs.build(("hidden_states", "grid_thw"), qwen, 2, 1, gen)
    assert int(grid.prod(dim=1).sum()) == x.shape[0] and x.shape[1] == 3 * 2 * 8 * 8
    assert (grid[:, 1:] % 2 == 0).all()  # whole merge windows
    ts = _cfg(context_length=24, lags_sequence=[1, 7], num_time_features=2, input_size=1)
    v, t, m = inputs.build(("past_values", "past_time_features", "past_observed_mask"), ts, 2, 0, gen)
    assert v.shape == (2, 31) and t.shape == (2, 31, 2) and m.shape == v.shape
    asr = _cfg(num_mel_bins=80, num_stacked_frames=7)
    f, mask = inputs.build(("input_features", "input_features_mask"), asr, 2, 0, gen)
    assert f.shape[-1] == 560 and mask.shape == f.shape[:2] and mask.dtype == torch.long
    assert inputs.build(("pixel_values",), _cfg(num_frames=4, image_size=32), 2, 0, gen)[0].shape == (2, 4, 3, 32, 32)
    assert inputs.builder_for("no_such_input") is None and inputs.builder_for("hidden_states") is None


# -- tracing never leaks a fake tensor into a real run ---------------------------------------------
@functools.lru_cache(maxsize=4)
def _anchors(n: int, dtype: torch.dtype) -> torch.Tensor:  # a library's cache keyed by sizes (RT-DETR's anchors)
    return torch.arange(n, dtype=dtype)


class _Anchored(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x) + _anchors(x.shape[-1], x.dtype)


def test_a_fake_trace_leaves_no_fake_tensor_in_a_librarys_cache():
    from conformance.models.tracing import trace

    model, x = _Anchored(), torch.randn(2, 4)
    model(x)  # a real run first: the trace must not be handed its real tensor either
    assert trace(model, (x,)) is not None
    assert torch.equal(model(x), model.lin(x) + torch.arange(4.0))  # no "convert all Tensors to FakeTensors"


# -- types the rules and builders now give (formerly skipped) --------------------------------------
@needs_hf
@pytest.mark.parametrize("model_id", [
    "hf.rt_detr",  # anchors cached by an lru_cache; decoder_in_channels equal to d_model
    "hf.qwen2_5_vl_vision",  # flattened patches and their grid_thw; a window in pixels
    "hf.time_series_transformer",  # past values, time features, observed mask; a horizon the config leaves unset
    "hf.mamba2",  # heads x head size = expand x hidden size; groups divide heads
    "hf.videomae",  # a video: (batch, frames, channels, height, width)
])
def test_formerly_skipped_types_trace_run_and_backward(model_id):
    from conformance.models.tracing import trace

    spec = hf.spec_by_id(model_id)
    model, x = spec.build(), spec.example_inputs()
    try:
        trace(model, x)
    except Exception:  # noqa: BLE001 - a data-dependent graph: the lane runs it untraced
        pass
    out = model(*x)
    spec.loss(out).backward()
    assert any(p.grad is not None for p in model.parameters())
