"""Work kinds, item keys and the run spec's stored config: fast unit tests (no worker starts)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from conformance.run.kinds import KINDS, kind, kind_of_item, select_groups
from conformance.run.spec import RunSpec
from conformance.select import VARIANTS, SelectionError
from conformance.targets import BuildRef, get_target
from conformance.work import Group, ItemKey, Skip

# A runs row as main stored it before the spec's config was generated (tests/data/identity.json).
OLD_RUN = {"id": "identity-2.32.0", "target": "neuron-emu", "build": "2.32.0", "config": json.dumps({
    "build_spec": "2.32.0", "dtypes": ["float32,bfloat16,int64"], "layouts": {"sparse": "NotImplementedError"},
    "ledger": None, "max_samples": None, "model_limit": 1, "model_modes": ["eager", "compile"], "models": ["mlp"],
    "opinfo": True, "ops": ["abs", "aten::_foreach_abs*"], "schema": False, "seed": 20261130, "shard": "1/1",
    "thorough": False, "timeout_s": 60.0, "variants": ["function", "inplace", "out", "backward"]})}


@pytest.mark.parametrize("text", ["abs|function|float32|3", "abs|function|float32|-1", "aten::abs.out|schema|any|0",
                                  "mlp.d1w16.relu.none.bias|compile|bfloat16|0", "cumsum|function|int64|*"])
def test_item_keys_round_trip(text):
    assert str(ItemKey.parse(text)) == text


@pytest.mark.parametrize("text", ["abs|function|float32", "a|b|c|d|e", "|function|float32|0", ""])
def test_a_malformed_item_key_is_refused_naming_it(text):
    with pytest.raises(ValueError, match="expected name|variant|dtype|sample"):
        ItemKey.parse(text)


def test_item_key_parts():
    key = ItemKey.parse("index_select|out|float32|12")
    assert (key.name, key.variant, key.dtype, key.sample) == ("index_select", "out", "float32", 12)
    assert key.group_key == Group("index_select", "float32").key
    assert str(key.with_variant("canary")) == "index_select|canary|float32|12"
    assert Group("abs", "float32").item("backward", 2) == ItemKey("abs", "backward", "float32", 2)


def test_skip_leaves_out_done_items_and_everything_outside_only():
    assert "a|function|float32|0" in Skip(frozenset({"a|function|float32|0"}))
    assert "a|function|float32|1" not in Skip(frozenset({"a|function|float32|0"}))
    only = Skip(frozenset({"a|function|float32|0"}), only=frozenset({"a|function|float32|0", "a|out|float32|0"}))
    assert "a|out|float32|0" not in only  # chosen and not yet run
    assert "a|function|float32|0" in only  # chosen, but run already
    assert "a|inplace|float32|0" in only  # not chosen
    assert not Skip().crash_safe and Skip(crash_safe=True).crash_safe


def test_every_item_variant_belongs_to_exactly_one_kind():
    variants = [v for k in KINDS for v in k.variants]
    assert len(variants) == len(set(variants))
    assert [kind_of_item(f"x|{v}|float32|0").name for v in ("function", "canary", "schema", "traced", "eager",
                                                            "compile", "opcheck", "custom_fwd", "gen_eager",
                                                            "gen_compile")] \
        == ["opinfo", "opinfo", "schema", "traced", "model", "model", "custom_ops", "custom_ops", "generate", "generate"]
    assert {k.name: k.table for k in KINDS} == {"opinfo": "op_results", "schema": "op_results",
                                                 "traced": "op_results", "model": "model_results",
                                                 "custom_ops": "op_results", "generate": "gen_results"}
    with pytest.raises(SelectionError, match="no work kind has variant 'nope'"):
        kind_of_item("x|nope|float32|0")
    with pytest.raises(SelectionError, match="unknown work kind 'nope'"):
        kind("nope")


def test_synthetic_rows_name_the_item_in_the_kinds_columns():
    assert kind("opinfo").synthetic_row(ItemKey.parse("abs|out|float32|4")) == \
        {"op": "abs", "variant": "out", "dtype": "float32", "sample": 4}
    assert kind("model").synthetic_row(ItemKey.parse("mlp.x|eager|float32|0")) == \
        {"model_id": "mlp.x", "mode": "eager", "dtype": "float32", "family": "mlp"}
    assert kind("generate").synthetic_row(ItemKey.parse("gen:hf.llama|gen_compile|bfloat16|128")) == \
        {"model_id": "hf.llama", "mode": "compile", "dtype": "bfloat16", "bucket": 128}


def test_selection_expands_kind_by_kind():
    groups = select_groups(["abs", "aten::_foreach_abs.default"], ["float32"], models=["mlp"], model_limit=1)
    assert [g.kind for g in groups] == ["opinfo", "schema", "model"]
    assert groups[1] == Group("aten::_foreach_abs.default", "any", "schema")


def test_run_spec_config_round_trips_through_a_runs_row():
    spec = RunSpec(target="cpu", build="2.33.0", ops=("abs", "aten::x*"), dtypes=("float32",), thorough=True,
                   shard="2/3", timeout_s=7.5, seed=3, max_samples=2, ledger="l.toml", variants=("out",),
                   opinfo=False, schema=True, models=("mlp",), model_limit=4, model_modes=("eager",), workers=5,
                   imports=("json",), env=("X_SWITCH=1",), contracts=("out", "errors"), corpus=False, compile_batch=4,
                   refcache="refs.sqlite", contract_budget=3, executor="ray", ray_address="auto",
                   task_resources=("neuron_cores=1",), sizes="ladder", reference_inputs="1/3", zoo_modes=("eager",),
                   generate=("hf.llama",), gen_modes=("eager",), gen_buckets=(8, 32), gen_new_tokens=4)
    # every field away from its default (a new field must join this test), the run id aside
    assert [f.name for f in dataclasses.fields(RunSpec) if getattr(spec, f.name) == f.default] == ["run_id"]
    config = spec.to_config()
    # what is not the run's (the session's worker count) or lives in a column of runs is not stored
    assert "workers" not in config and "target" not in config and "run_id" not in config
    assert "refcache" not in config  # where references come from, not what the run is
    assert not {"executor", "ray_address", "task_resources"} & set(config)  # where it runs, the same
    assert config["build_spec"] == "2.33.0" and config["ops"] == ["abs", "aten::x*"] and config["contract_budget"] == 3
    back = RunSpec.from_run({"id": "r", "target": "cpu", "build": "2.33.0", "config": json.dumps(config)}, workers=5,
                            refcache="refs.sqlite", executor="ray", ray_address="auto",
                            task_resources=("neuron_cores=1",))
    assert back == dataclasses.replace(spec, run_id="r")


def test_an_old_runs_config_is_read_back():
    spec = RunSpec.from_run(OLD_RUN, workers=1)
    assert spec == RunSpec(target="neuron-emu", build="2.32.0", ops=("abs", "aten::_foreach_abs*"),
                           dtypes=("float32,bfloat16,int64",), seed=20261130, run_id="identity-2.32.0",
                           models=("mlp",), model_limit=1, workers=1,
                           variants=("function", "inplace", "out", "backward"))  # stored: before the sparse ones


def test_keys_an_older_run_lacks_take_the_defaults():
    run = {"id": "r", "target": "cpu", "build": "-",
           "config": json.dumps({"ops": ["abs"], "dtypes": [], "variants": [], "seed": 0, "thorough": None})}
    spec = RunSpec.from_run(run, workers=2)
    assert spec.build.is_default and spec.variants == VARIANTS and spec.opinfo and not spec.schema
    assert spec.model_modes == ("eager", "compile") and spec.timeout_s == 60.0 and spec.seed == 0
    assert RunSpec.from_run({"id": "r", "target": "cpu", "build": "-"}, workers=1).ops == ()


def test_build_refs():
    assert BuildRef.parse(None) == BuildRef.parse("-") == BuildRef.parse("") == BuildRef()
    assert str(BuildRef()) == "-" and BuildRef.parse("2.33.0").spec == "2.33.0"
    assert BuildRef.parse("x.toml").resolved().spec.endswith("/x.toml")
    assert RunSpec(build="2.33.0").build == BuildRef("2.33.0") and RunSpec().build.is_default
    cpu = get_target("cpu")
    assert cpu.build == "-" and cpu.ref.is_default


def test_the_cli_default_variants_are_the_harness_variants():
    from conformance.cli import main

    option = next(p for p in main.commands["run"].params if p.name == "variants")
    assert tuple(option.default.split(",")) == VARIANTS


def test_the_opinfo_kind_itself_selects_no_opinfo_for_custom_op_globs():
    """Custom-op globs are no OpInfo names: alone they select no OpInfo group, even in a selection
    whose ``opinfo`` flag was left on (Selection.__post_init__ turns it off; OPINFO does not rely
    on that), and beside OpInfo globs they leave those as they are."""
    from conformance.sweep.opinfo import OPINFO
    from conformance.work import Selection

    alone = Selection(ops=("neuron::*",), dtypes=("float32",))
    object.__setattr__(alone, "opinfo", True)  # as a selection made without __post_init__ would be
    assert OPINFO.groups(alone) == []
    assert [g.key for g in OPINFO.groups(Selection(ops=("abs", "neuron::*"), dtypes=("float32",)))] == ["abs|float32"]
    assert [g.key for g in OPINFO.groups(Selection(ops=("abs",), dtypes=("float32",)))] == ["abs|float32"]
    assert OPINFO.groups(Selection(ops=("aten::abs.default",), dtypes=("float32",))) == []
    assert len(OPINFO.groups(Selection(dtypes=("float32",)))) > 500  # no --ops: every OpInfo
