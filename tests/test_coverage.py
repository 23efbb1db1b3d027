"""Coverage states, the reason classifier, and backward comparison."""

from __future__ import annotations

import textwrap

import torch
from click.testing import CliRunner

from conformance.catalog import overloads as catalog
from conformance.catalog.coverage import STATES, classify_unreached, compute
from conformance.cli import main
from conformance.inputs.opinfo import by_name, samples
from conformance.sweep.opinfo import SweepConfig, evaluate
from conformance.targets import get_target


def _o(name):
    return {o.name: o for o in catalog.overloads()}[name]


def test_reason_classifier():
    assert classify_unreached(_o("aten::linear.default"), {}, {})[0] == "composite_implicit"
    no_cpu = next(o for o in catalog.overloads() if o.has("no_cpu_kernel") and not o.has("composite_implicit"))
    assert classify_unreached(no_cpu, {}, {})[0] == "no_cpu_kernel"
    state, detail = classify_unreached(_o("aten::_sparse_coo_tensor_unsafe.default"), {}, {})
    assert state in ("layout", "composite_implicit")
    assert classify_unreached(_o("aten::randn.default"), {}, {})[0] == "random"
    assert classify_unreached(_o("aten::cumsum.default"), {}, {"aten::cumsum.default": "slow"}) == ("ledger", "slow")
    tried = {"aten::cumsum.default": "no valid input: 120 generated calls rejected"}
    assert classify_unreached(_o("aten::cumsum.default"), tried, {}) == ("no_valid_input", tried["aten::cumsum.default"])
    assert "did not run" in classify_unreached(_o("aten::cumsum.default"), {}, {})[1]


def test_every_overload_ends_in_exactly_one_state(store):
    run = store.start_run(target="t", build="b", torch_version=torch.__version__, config={})
    store.insert("op_results", [
        {"run_id": run, "item_key": "cumsum|function|float32|0", "op": "cumsum", "variant": "function",
         "dtype": "float32", "status": "pass", "native_ops": ["aten::cumsum.default"], "fallback_ops": [],
         "reached_ops": ["aten::cumsum.default", "aten::empty.memory_format"]},
        {"run_id": run, "item_key": "cumsum|backward|float32|0", "op": "cumsum", "variant": "backward",
         "dtype": "float32", "status": "mismatch", "native_ops": [], "fallback_ops": ["aten::cumsum.default"],
         "reached_ops": []},
        {"run_id": run, "item_key": "aten::_foo.default|schema|any|0", "op": "aten::_cdist_forward.default",
         "variant": "schema", "dtype": "any", "status": "skip", "error": "no valid input: tried 120"},
    ])
    counts = compute(store, run)
    assert sum(counts.values()) == len(catalog.overloads())
    assert set(counts) <= set(STATES)
    rows = {r["name"]: r for r in store.db.query("select * from coverage where run_id = ?", [run])}
    cs = rows["aten::cumsum.default"]
    assert cs["state"] == "exercised" and cs["samples"] == 2 and cs["native_samples"] == 1
    assert cs["fallback_samples"] == 1 and cs["failing_samples"] == 1
    assert set(eval(cs["sources"].replace("null", "None"))) == {"opinfo", "backward"}
    assert rows["aten::empty.memory_format"]["state"] == "exercised"
    assert rows["aten::linear.default"]["state"] == "composite_implicit"
    assert rows["aten::_cdist_forward.default"]["state"] == "no_valid_input"
    assert rows["aten::_cdist_forward.default"]["detail"] == "no valid input: tried 120"


def test_coverage_cli_prints_the_table(tmp_path):
    from opdb import Store

    db = tmp_path / "c.sqlite"
    with Store.open(db) as st:
        run = st.start_run(target="t", build="b", torch_version=torch.__version__, config={})
    r = CliRunner().invoke(main, ["ops", "--coverage", run, "--db", str(db)])
    assert r.exit_code == 0, r.output
    assert "composite_implicit" in r.output and "backend-reachable overloads exercised" in r.output


def test_coverage_cli_json_gives_every_overloads_state(tmp_path):
    """``ops --coverage RUN --json``: one JSON object per overload (the README promises every
    overload's state; the flag was ignored and the 28-line table printed)."""
    import json

    from opdb import Store

    db = tmp_path / "c.sqlite"
    with Store.open(db) as st:
        run = st.start_run(target="t", build="b", torch_version=torch.__version__, config={})
        st.insert("op_results", [{"run_id": run, "item_key": "cumsum|function|float32|0", "op": "cumsum",
                                  "variant": "function", "dtype": "float32", "status": "pass_fallback",
                                  "native_ops": [], "fallback_ops": ["aten::cumsum.default"],
                                  "reached_ops": ["aten::cumsum.default"]}])
    r = CliRunner().invoke(main, ["ops", "--coverage", run, "--db", str(db), "--json"])
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in r.output.splitlines()]
    assert len(rows) == len(catalog.overloads()) == len({x["name"] for x in rows})
    cs = next(x for x in rows if x["name"] == "aten::cumsum.default")
    assert cs["state"] == "exercised" and cs["fallback_samples"] == 1 and cs["dtypes"] == ["float32"]
    assert cs["statuses"] == {"pass_fallback": 1}
    assert {x["state"] for x in rows} <= set(STATES)


BACKWARD_DEFECT = """
[build]
name = "bwd-defect"
inherits = "2.33.0"
[ops]
native = ["aten::relu.default", "aten::threshold_backward.default"]
[[defects]]
op = "aten::threshold_backward.default"
kind = "wrong_result"
magnitude = 0.2
"""


def test_backward_is_compared_and_exercises_backward_overloads(tmp_path):
    info = by_name()["nn.functional.relu"]
    sample = next(s for s in samples(info, torch.float32, requires_grad=True) if s.input.numel() >= 8)
    cfg = SweepConfig()
    clean = evaluate(get_target("neuron-emu", "2.33.0"), info, "relu", "backward", "float32", 0, sample, cfg)
    assert clean["status"] in ("pass", "pass_fallback"), clean["error"]
    assert "aten::threshold_backward.default" in clean["native_ops"] + clean["fallback_ops"]
    path = tmp_path / "b.toml"
    path.write_text(textwrap.dedent(BACKWARD_DEFECT))
    target = get_target("neuron-emu", str(path))
    bad = evaluate(target, info, "relu", "backward", "float32", 0, sample, cfg)
    assert bad["status"] == "mismatch" and "aten::threshold_backward.default" in bad["native_ops"]
    fwd = evaluate(target, info, "relu", "function", "float32", 0, sample, cfg)
    assert fwd["status"] in ("pass", "pass_fallback")


def test_layout_reason_comes_from_the_cpu_rejections_and_the_target_probe():
    o = _o("aten::values_copy.default")
    tried = {o.name: "no valid input: 120 generated calls rejected by the CPU (120x CPU reference failed: "
                     "RuntimeError: values expected sparse tensor layout but got Strided)"}
    lacks = {"sparse": "NotImplementedError: Could not run 'aten::_to_copy' with arguments from the 'Sparseneuron'"}
    state, detail = classify_unreached(o, tried, {}, lacks)
    assert state == "layout" and detail.startswith("sparse: the target could not hold one")
    # a target that holds sparse tensors: the gap is the generator's, not the target's
    state, detail = classify_unreached(o, tried, {}, {"sparse": None})
    assert state == "no_valid_input" and "generator does not make" in detail
    # a run without a probe says so instead of guessing
    assert "not probed" in classify_unreached(o, tried, {}, None)[1]
    # strided rejections that do not mention a layout stay "no valid input"
    plain = {o.name: "no valid input: 120 generated calls rejected by the CPU (120x IndexError: bad dim)"}
    assert classify_unreached(o, plain, {}, lacks)[0] == "no_valid_input"


def test_probe_layouts_on_the_emulator_and_the_cpu():
    emu = get_target("neuron-emu", "2.33.0").probe_layouts()
    assert set(emu) == {"sparse", "sparse_csr", "quantized", "nested", "mkldnn"}
    assert emu["mkldnn"] and emu["quantized"] and emu["sparse"]  # the emulated device holds none of these
    assert all(v is None for v in get_target("cpu").probe_layouts().values())


def test_a_schema_item_that_ran_counts_its_own_overload(store):
    """Some overloads are handled above every dispatch mode (detach_, _fw_primal): a schema
    item that ran them on the target, or crashed there, still reached them."""
    run = store.start_run(target="t", build="b", torch_version=torch.__version__, config={})
    store.insert("op_results", [
        {"run_id": run, "item_key": "aten::detach_.default|schema|any|0", "op": "aten::detach_.default",
         "variant": "schema", "dtype": "float32", "status": "pass", "reached_ops": []},
        {"run_id": run, "item_key": "aten::_efficientzerotensor.default|schema|any|0",
         "op": "aten::_efficientzerotensor.default", "variant": "schema", "dtype": "any", "status": "crash",
         "error": "process died during the item on the target: signal 11 (SIGSEGV)"},
    ])
    compute(store, run)
    rows = {r["name"]: r for r in store.db.query("select * from coverage where run_id = ?", [run])}
    assert rows["aten::detach_.default"]["state"] == "exercised"
    ez = rows["aten::_efficientzerotensor.default"]
    assert ez["state"] == "exercised" and ez["failing_samples"] == 1


def _denominator(store, run):
    from opdb.queries_counts import coverage_share

    compute(store, run)
    return coverage_share(store, run)["reachable"]


def test_the_denominator_does_not_depend_on_what_a_run_searched(store):
    """One selection, run with the schema search and without it: the backend-reachable overloads
    are the same. The search's CPU error for cudnn_grid_sampler.out (its out= wrapper calls an op
    with no CPU kernel) made it no_cpu_kernel only in the run that searched it, and the device's
    own _copy_from, reached by some samples, counted as reachable only where a sample reached it:
    a plain run and the nightly of 2.33.0 had denominators 43 overloads apart."""
    from conformance.sweep.schema import run_schema_group
    from conformance.work import Group

    name = "aten::cudnn_grid_sampler.out"
    searched = next(run_schema_group(get_target("cpu"), Group(name, "any", "schema"), SweepConfig()))
    assert searched["status"] == "skip" and "Could not run 'aten::cudnn_grid_sampler'" in searched["error"]
    sample = {"item_key": "cumsum|function|float32|0", "op": "cumsum", "variant": "function", "dtype": "float32",
              "status": "pass", "native_ops": ["aten::cumsum.default"], "fallback_ops": [],
              "reached_ops": ["aten::cumsum.default"]}
    copying = {**sample, "item_key": "cumsum|function|float32|1",
               "reached_ops": ["aten::cumsum.default", "aten::_copy_from.default"]}
    runs = {}
    for label, results in (("plain", [sample]), ("searched", [sample, searched]), ("copied", [sample, copying])):
        runs[label] = store.start_run(target="t", build="b", torch_version=torch.__version__, config={})
        store.insert("op_results", [{**r, "run_id": runs[label]} for r in results])
    plain = _denominator(store, runs["plain"])
    assert _denominator(store, runs["searched"]) == plain
    assert _denominator(store, runs["copied"]) == plain
    rows = {(r["run_id"], r["name"]): r for r in store.db.query("select * from coverage")}
    for run in runs.values():
        assert rows[run, name]["state"] == "no_cpu_kernel"
        assert rows[run, "aten::_copy_from.default"]["state"] == "no_cpu_kernel"
    copied = rows[runs["copied"], "aten::_copy_from.default"]
    assert copied["samples"] == 1 and "outside the denominator" in copied["detail"]  # still counted in its row


def test_a_cpu_error_the_catalog_does_not_know_leaves_the_overload_reachable(monkeypatch):
    """Where the shipped CPU-reference file says nothing (another torch), the search's CPU error
    is shown, not turned into no_cpu_kernel for this run alone."""
    o = _o("aten::cudnn_grid_sampler.out")
    bare = catalog.Overload(**{**o.__dict__, "classes": tuple(c for c in o.classes if c != "no_cpu_kernel")})
    detail = ("no valid input: 120 generated calls rejected by the CPU (120x CPU reference failed: NotImplementedError: "
              "Could not run 'aten::cudnn_grid_sampler' with arguments from the 'CPU' backend.)")
    state, why = classify_unreached(bare, {o.name: detail}, {})
    assert state == "no_valid_input" and "no_cpu_reference.toml" in why and "aten::cudnn_grid_sampler" in why


def test_stored_coverage_of_another_classification_is_recomputed(store):
    from conformance.catalog.coverage import stored_rows

    run = store.start_run(target="t", build="b", torch_version=torch.__version__, config={})
    compute(store, run)
    store.db.execute("update coverage set state = 'no_valid_input' where run_id = ? and name = ?",
                     [run, "aten::cudnn_grid_sampler.out"])
    _, rows = stored_rows(store, run)
    assert {r["name"]: r for r in rows}["aten::cudnn_grid_sampler.out"]["state"] == "no_cpu_kernel"


def test_the_store_and_the_catalog_name_the_same_unreachable_states():
    from conformance.catalog import coverage
    from opdb import queries_counts

    assert coverage.UNREACHABLE == queries_counts.UNREACHABLE
