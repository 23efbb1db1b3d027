"""The custom-op lane (conformance/customops): a target's own ops found by asking the dispatcher
(PyTorch's namespaces measured, not listed), each checked with opcheck on the device and, where a
reference is declared, for its values forward and backward, eager and compiled; an op with no
reference is checked structurally only. Device-generic: these tests use a test package's ops
(tests/cotest_ops.py, registered for PrivateUse1 through torch.library.Library) on the emulated
device; tests/test_customops_emu.py runs the emulator's own neuron:: ops end to end."""

from __future__ import annotations

import functools
import json

import cotest_ops  # registers the cotest:: ops and their references
import pytest
import torch

from conformance.customops import CUSTOM_OPS, discovery
from conformance.customops.references import reference_for
from conformance.customops.variants import VARIANTS
from conformance.run.kinds import kind_of_item, select_groups
from conformance.run.runner import RunSpec, _done_by_group, execute_run
from conformance.sweep.opinfo import SweepConfig
from conformance.targets import get_target
from conformance.work import Group, ItemKey, Selection
from opdb import Store
from opdb.queries_counts import CUSTOM_OP_VARIANTS

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.xdist_group("customops")]
CHECKS = ["test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"]


@pytest.fixture(scope="module")
def emu():
    return get_target("neuron-emu", "ideal")


@functools.cache
def _lane(dtype: str) -> dict[str, dict]:
    rows = CUSTOM_OPS.run(get_target("neuron-emu", "ideal"), Group("cotest::*", dtype, CUSTOM_OPS.name), SweepConfig())
    return {r["item_key"]: r for r in rows}


def lane(dtype: str, op: str) -> dict[str, dict]:
    """The lane's rows of ``cotest::op`` in ``dtype``, by variant|sample."""
    return {k.split("|", 1)[1].replace(f"|{dtype}|", "|"): r for k, r in _lane(dtype).items()
            if k.startswith(f"cotest::{op}.default|")}


# -- discovery -----------------------------------------------------------------------------
def test_discovery_finds_a_devices_ops_and_none_of_torchs(emu):
    found = discovery.discover("neuron")
    assert {f"cotest::{n}.default" for n in (*cotest_ops.RMS, "scale")} <= set(found)
    assert not [o for o in found if o.split("::")[0] in discovery.torch_namespaces()]
    assert discovery.discover("cpu") == []  # the cotest ops have no CPU kernel; torch's own are not custom


def test_torchs_own_lazily_imported_ops_are_not_taken_for_a_devices():
    """fsdp:: registers kernels for PrivateUse1 when torch.distributed.fsdp is first imported: its
    namespace is not in the torch-alone probe, but its ops are defined in torch's own files."""
    pytest.importorskip("torch.distributed.fsdp")
    assert torch._C._dispatch_has_kernel_for_dispatch_key("fsdp::all_gather_copy_in", "PrivateUse1")
    assert "fsdp" not in discovery.torch_namespaces() and discovery.defined_by_torch("fsdp::all_gather_copy_in")
    assert not discovery.defined_by_torch("cotest::rms_norm")
    assert not [o for o in discovery.discover("neuron") if o.startswith("fsdp::")]


def test_torchs_namespaces_are_measured_once_per_torch_version_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("CONFORMANCE_CACHE", str(tmp_path))
    discovery.torch_namespaces.cache_clear()
    try:
        measured = discovery.torch_namespaces()
        cached = tmp_path / f"torch-namespaces-{torch.__version__}.json"
        assert {"aten", "prims", "quantized", "c10d", "profiler"} <= measured and "cotest" not in measured
        assert set(json.loads(cached.read_text())) == measured
        discovery.torch_namespaces.cache_clear()
        monkeypatch.setattr(discovery.subprocess, "run", lambda *a, **k: pytest.fail("measured again"))
        assert discovery.torch_namespaces() == measured  # read back from the cache
    finally:
        discovery.torch_namespaces.cache_clear()


# -- selection -----------------------------------------------------------------------------
def test_custom_op_globs_select_the_lane_alone_and_plain_runs_include_it():
    assert [g.key for g in select_groups(["neuron::*"], ["float32", "bfloat16", "int64"])] == \
        ["neuron::*|float32", "neuron::*|bfloat16"]
    assert [g.key for g in select_groups(["abs", "cotest::rms*"], ["float32"])] == ["abs|float32", "cotest::rms*|float32"]
    assert [g.kind for g in select_groups(["aten::_foreach_abs.default", "neuron::*"], ["float32"])] == \
        ["schema", "custom_ops"]
    plain = select_groups(None, ["float32"])
    assert plain[-1] == Group("*::*", "float32", "custom_ops") and plain[0].kind == "opinfo"
    # existing selections are as they were
    assert [g.key for g in select_groups(["abs"], ["float32"])] == ["abs|float32"]
    assert select_groups(None, ["int64"])[-1].kind == "opinfo"
    assert select_groups(["abs"], ["float32"], models=["mlp"], model_limit=1)[-1].kind == "model"
    assert not Selection(ops=("neuron::*",)).opinfo and Selection(ops=("abs", "neuron::*")).opinfo


def test_a_groups_items_are_found_by_glob_for_resume():
    group = Group("cotest::rms*,cotest::bad_fake", "float32", "custom_ops")
    held = {"cotest::rms_norm.default|custom_fwd|float32|0", "cotest::bad_fake.default|opcheck|float32|1"}
    other = {"cotest::rms_norm.default|custom_fwd|bfloat16|0", "cotest::scale.default|opcheck|float32|0",
             "abs|function|float32|0"}
    done = _done_by_group(held | other, [group])
    assert done[group.key] == held and done["abs|float32"] == {"abs|function|float32|0"}
    assert {kind_of_item(k).name for k in held} == {"custom_ops"}
    assert CUSTOM_OPS.synthetic_row(ItemKey.parse("cotest::x.default|custom_bwd|float32|1")) == \
        {"op": "cotest::x.default", "variant": "custom_bwd", "dtype": "float32", "sample": 1}


def test_the_stored_variant_vocabulary_is_the_lanes():
    assert CUSTOM_OP_VARIANTS == VARIANTS


# -- the checks ------------------------------------------------------------------------------
def test_a_right_op_passes_every_check_in_both_dtypes():
    for dtype in ("float32", "bfloat16"):
        rows = lane(dtype, "rms_norm")
        assert sorted(rows) == ["custom_bwd|0", "custom_compile|0", "custom_fwd|0", "opcheck|0"]
        assert {k: r["status"] for k, r in rows.items()} == dict.fromkeys(rows, "pass"), rows
        assert {c: v["outcome"] for c, v in rows["opcheck|0"]["contracts"].items()} == dict.fromkeys(CHECKS, "pass")
        assert "AutogradPrivateUse1" in rows["opcheck|0"]["contracts"]["test_autograd_registration"]["detail"]
        assert rows["custom_fwd|0"]["proof"]["device"] == ["neuron:0"] and rows["custom_fwd|0"]["fallback_ops"] == []
        proof = rows["custom_compile|0"]["proof"]
        assert proof["graphs"] == 1 and proof["backend"] == "neuron" and "cotest.rms_norm.default" in proof["graph_ops"]
        assert rows["custom_fwd|0"]["op"] == "cotest::rms_norm.default"


def test_a_wrong_fake_shape_fails_opcheck_naming_its_tests_and_breaks_the_compiled_op():
    rows = lane("float32", "bad_fake")
    check = rows["opcheck|0"]
    assert check["status"] == "contract"
    failed = check["contract_failed"].split(",")
    assert "test_faketensor" in failed and "test_schema" not in failed
    assert "opcheck test_faketensor" in check["error"]
    assert rows["custom_fwd|0"]["status"] == rows["custom_bwd|0"]["status"] == "pass"  # eager values are right
    assert rows["custom_compile|0"]["status"] in ("error", "mismatch")


def test_a_wrong_backward_fails_the_gradient_items_only():
    rows = lane("float32", "bad_grad")
    assert rows["custom_bwd|0"]["status"] == "mismatch" and rows["custom_bwd|0"]["error"].startswith("gradients:")
    assert rows["custom_compile|0"]["status"] == "mismatch" and "compiled backward" in rows["custom_compile|0"]["error"]
    assert rows["custom_fwd|0"]["status"] == rows["opcheck|0"]["status"] == "pass"


def test_wrong_bfloat16_values_fail_in_bfloat16_only():
    assert {k: r["status"] for k, r in lane("float32", "bad_bf16").items()} == {
        "opcheck|0": "pass", "custom_fwd|0": "pass", "custom_bwd|0": "pass", "custom_compile|0": "pass"}
    bf16 = lane("bfloat16", "bad_bf16")
    assert bf16["custom_fwd|0"]["status"] == "mismatch" and bf16["custom_fwd|0"]["arbiter_err"] is not None
    assert bf16["custom_compile|0"]["status"] == "mismatch"


def test_an_op_without_a_reference_is_checked_structurally_only():
    assert reference_for("cotest::scale.default") is None
    rows = lane("float32", "scale")
    assert sorted(rows) == ["opcheck|0", "opcheck|1"]  # two inputs generated from its schema, no value items
    for r in rows.values():
        assert r["status"] == "structural" and "checked structurally only" in r["error"]
        assert "structural_only" in r["proof"] and r["signature"].startswith("f32[")
        # not differentiable: opcheck differentiates nothing, the registration check still runs
        assert r["contracts"]["test_autograd_registration"]["outcome"] == "pass"


# -- through the workers: stored like op results, resume and crash isolation per item ------------
def test_a_run_stores_the_lanes_items_resumes_them_and_isolates_a_crash(tmp_path):
    db = tmp_path / "c.sqlite"
    spec = RunSpec(target="neuron-emu", build="ideal", imports=("cotest_ops",), ops=("cotest::*",),
                   dtypes=("float32",), workers=1, timeout_s=120)
    summary = execute_run(spec, db)
    with Store.open(db) as st:
        rows = {r["item_key"]: r for r in st.db.query("select * from op_results where variant != 'canary'")}
        assert set(kind_of_item(k).name for k in rows) == {"custom_ops"}
        assert rows[cotest_ops.VICTIM]["status"] == "crash"
        assert "process died during the item on the target" in rows[cotest_ops.VICTIM]["error"]
        others = {k: r["status"] for k, r in rows.items() if k.startswith("cotest::victim.") and k != cotest_ops.VICTIM}
        assert others and set(others.values()) == {"pass"}  # the worker restarted after the victim
        assert rows["cotest::scale.default|opcheck|float32|0"]["status"] == "structural"
        assert rows["cotest::bad_fake.default|opcheck|float32|0"]["contract_failed"]
        assert summary.counts["crash"] == 1 and summary.counts["structural"] == 2
        # resume: the run interrupted with two of its items lost; only those two run again
        lost = ["cotest::rms_norm.default|custom_bwd|float32|0", "cotest::scale.default|opcheck|float32|1"]
        st.db.execute(f"delete from op_results where item_key in ({', '.join('?' for _ in lost)})", lost)
        st.db.execute("update op_results set error = 'kept' where item_key = ?", ["cotest::rms_norm.default|opcheck|float32|0"])
        st.db.execute("update runs set status = 'interrupted' where id = ?", [summary.run_id])
        st.db.execute("update run_shards set status = 'interrupted' where run_id = ?", [summary.run_id])
        st.db.conn.commit()
    execute_run(spec.replace(), db, resume=summary.run_id)
    with Store.open(db) as st:
        again = [r["item_key"] for r in st.db.query("select item_key from op_results where variant != 'canary'")]
        assert sorted(again) == sorted(rows) and len(again) == len(set(again))  # nothing lost, nothing doubled
        kept = st.db.query("select error from op_results where item_key = ?", ["cotest::rms_norm.default|opcheck|float32|0"])
        assert [r["error"] for r in kept] == ["kept"]  # a recorded item was not run again


# -- the ledger: tolerances and expected failures naming custom ops -------------------------------------
LANE_LEDGER = """
[[override]]
op = "cotest::bad_grad.default"
variant = "custom_bwd"
atol = 10
rtol = 10
reason = "a gradient scaled by 1.5 is within this"

[[xfail]]
op = "cotest::bad_fake.default"
variant = "opcheck"
status = "contract"
reason = "its fake gives the wrong shape"

[[xfail]]
op = "cotest::rms*"
variant = "custom_fwd"
reason = "expected to fail, yet right"

[[xfail]]
op = "cotest::bad_grad.default"
variant = "custom_compile"
status = "error"
reason = "expects an error, gets a mismatch"
"""


def test_the_lane_honours_the_ledgers_tolerances_and_expected_failures_of_custom_ops():
    """As the OpInfo lane: an override's tolerance holds the item (named as its source), an
    expected failure that fails so is ``xfail``, one that passes is ``xpass``, one that fails
    otherwise keeps its status; the items the ledger names nothing of are as they were."""
    from conformance.check.ledger import Ledger

    config = SweepConfig(ledger=Ledger.from_toml(LANE_LEDGER, source="lane.toml"))
    group = Group("cotest::bad_grad,cotest::bad_fake,cotest::rms_norm", "float32", CUSTOM_OPS.name)
    rows = {r["item_key"].replace("|float32|0", "").removeprefix("cotest::"): r
            for r in CUSTOM_OPS.run(get_target("neuron-emu", "ideal"), group, config)}
    bwd = rows["bad_grad.default|custom_bwd"]
    assert bwd["status"] == "pass" and (bwd["atol"], bwd["rtol"]) == (10.0, 10.0)
    assert bwd["tol_source"] == "lane.toml:override[0] (a gradient scaled by 1.5 is within this)"
    fake = rows["bad_fake.default|opcheck"]
    assert fake["status"] == "xfail" and fake["contract_failed"].startswith("test_faketensor")
    assert "[expected failure: lane.toml:xfail[0]: its fake gives the wrong shape]" in fake["error"]
    right = rows["rms_norm.default|custom_fwd"]
    assert right["status"] == "xpass" and "[expected failure: lane.toml:xfail[1]" in right["error"]
    assert rows["bad_grad.default|custom_compile"]["status"] == "mismatch"  # not the status it expected
    unnamed = {k: r["status"] for k, r in rows.items() if k in ("rms_norm.default|opcheck", "bad_fake.default|custom_fwd",
                                                                "rms_norm.default|custom_bwd")}
    assert unnamed == dict.fromkeys(unnamed, "pass") and len(unnamed) == 3
    assert rows["bad_grad.default|custom_fwd"]["tol_source"] != bwd["tol_source"]
