"""The Hugging Face zoo: model types from transformers' auto mappings, tiny configs by rules, overrides as data."""

from __future__ import annotations

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
    assert t["text_config"]["depths"] == [1, 1, 1, 1] and t["text_config"]["hidden_sizes"] == [16, 32, 64, 128]
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
