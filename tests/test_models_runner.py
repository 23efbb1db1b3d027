"""Model groups: selection, parity on a clean build, an injected defect localized to its op,
recompiles over the shape sweep, error rows for broken specs, and a run end to end."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

import neuron_emu  # register the device before autograd first runs (the engine sizes per-device queues once)
from conformance.models import registry
from conformance.models.family import Family
from conformance.models.localize import localize
from conformance.models.runner import run_model_group
from conformance.models.selection import model_groups, model_key
from conformance.models.timing import symbolic
from conformance.run.kinds import select_groups
from conformance.select import SelectionError
from conformance.sweep.opinfo import SweepConfig
from conformance.targets import get_target
from conformance.targets.cpu import CpuTarget
from conformance.work import Group
from opdb import Store

pytestmark = pytest.mark.filterwarnings("ignore:neuron. operator", "ignore::UserWarning")

GELU_MLP = "mlp.d1w16.gelu.none.bias"
RELU_MLP = "mlp.d1w16.relu.none.bias"
MANIFEST = """
[build]
name = "test-models"
inherits = "2.33.0"
[ops]
native = ["aten::gelu.default"]
[[defects]]
op = "aten::gelu.default"
kind = "wrong_result"
magnitude = 0.05
"""


@pytest.fixture(scope="module")
def config():
    return SweepConfig()


@pytest.fixture(scope="module")
def emu():
    return get_target("neuron-emu", "2.33.0")


@pytest.fixture(scope="module")
def defective(tmp_path_factory):
    path = tmp_path_factory.mktemp("manifest") / "test-models.toml"
    path.write_text(MANIFEST)
    return get_target("neuron-emu", str(path))


def _rows(target, model_id, dtype, config, modes=("eager",)):
    return list(run_model_group(target, Group(model_id, dtype, "model"), config, modes=modes))


# -- selection -----------------------------------------------------------------------------
def test_model_groups_selection():
    groups = model_groups(["mlp", "gnn"], limit=2)
    assert [g.key for g in groups[:2]] == [f"{RELU_MLP}|float32", f"{RELU_MLP}|bfloat16"]
    assert len(groups) == 8 and {g.kind for g in groups} == {"model"}
    assert {g.dtype for g in model_groups(["mlp"], ["float32", "int64"], limit=3)} == {"float32"}
    assert len(model_groups(["all"], ["float32"], limit=1)) == len(registry.FAMILIES)
    assert [g.op for g in model_groups([GELU_MLP], ["bfloat16"])] == [GELU_MLP]
    with pytest.raises(SelectionError, match=r"unknown model family 'nope'.*mlp"):
        model_groups(["nope"])
    # through the run's selection
    assert [g.key for g in select_groups(dtypes=["float32"], opinfo=False, models=[RELU_MLP])] == [f"{RELU_MLP}|float32"]


# -- parity on clean builds ------------------------------------------------------------------
@pytest.mark.parametrize("target_name", ["cpu", "neuron-emu"])
def test_clean_build_passes_with_matching_loss_curves(target_name, emu, config):
    target = emu if target_name == "neuron-emu" else get_target("cpu")
    for dtype in ("float32", "bfloat16"):
        (row,) = _rows(target, GELU_MLP, dtype, config)
        assert row["item_key"] == model_key(GELU_MLP, "eager", dtype) == f"{GELU_MLP}|eager|{dtype}|0"
        assert row["status"] == "pass", row["error"]
        curves = row["loss_curve"]
        assert len(curves["cpu"]) == len(curves["target"]) == 3
        assert curves["cpu"][-1] < curves["cpu"][0]  # it trains
        for a, b in zip(curves["target"], curves["cpu"], strict=True):
            assert abs(a - b) <= 1e-2 * abs(b)
        assert row["aten_ops"]["aten::gelu.default"] == 1 and len(row["graph_hash"]) == 20
        assert row["grad_max_rel_err"] < 0.05 and row["p50_ms"] > 0
        if target_name == "cpu":
            assert curves["target"] == curves["cpu"] and row["max_abs_err"] == 0
        else:
            assert "aten::addmm.default" in row["native_ops"]


# -- an injected defect -----------------------------------------------------------------------
def test_defective_op_fails_and_is_localized(defective, config):
    (bad,) = _rows(defective, GELU_MLP, "float32", config)
    assert bad["status"] == "mismatch"
    assert bad["first_divergent_op"] == "aten::gelu.default"
    assert "local error 0.05" in bad["first_divergent_detail"]
    assert "[2, 16]" in bad["first_divergent_detail"]
    assert "aten::gelu.default" in bad["native_ops"]
    (ok,) = _rows(defective, RELU_MLP, "float32", config)  # no gelu: unaffected
    assert ok["status"] == "pass" and ok["first_divergent_op"] is None if "first_divergent_op" in ok else True


def test_localize_separates_local_from_propagated(defective):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 4), torch.nn.Tanh())
    div = localize(model, (torch.randn(3, 8),), defective, torch.float32, tol=0.015)
    assert div is not None and div.op == "aten::gelu.default"
    assert math.isclose(div.local_err, 0.05, rel_tol=0.05)
    div_b = localize(model, (torch.randn(3, 8),), defective, torch.float32, tol=0.015, backward=True)
    assert div_b is not None and div_b.op == "aten::gelu.default"  # the forward gelu comes first
    assert localize(model, (torch.randn(3, 8),), get_target("cpu"), torch.float32, tol=1e-6) is None


# -- compile: counts and shape sweep -------------------------------------------------------
class _AotEagerCpu(CpuTarget):
    """The CPU compiled with ``aot_eager``: a backend that runs a dynamic graph as it is."""

    def compile_backend(self):
        return "aot_eager"


def test_shape_sweep_compiles_one_dynamic_graph(config):
    """Automatic dynamic shapes, as a user compiles: the canonical shape is static, the first new
    shape recompiles once with its changed sizes symbolic, and that graph serves every later shape
    (never a compile per shape variant)."""
    target = _AotEagerCpu()
    target.setup()
    (row,) = _rows(target, RELU_MLP, "float32", config, modes=("compile",))
    assert row["status"] == "pass", row["error"]
    shapes = row["shapes"]
    assert len(shapes) >= 3 and [s["shape"] for s in shapes] == [[[2, 12]], [[3, 12]], [[4, 12]]]
    assert [s["dynamo_graphs"] for s in shapes] == [1, 1, 0]
    assert [s["lowerings"] for s in shapes] == [1, 1, 0]
    assert [s["compiles"] for s in shapes] == [1, 1, 0]
    assert [s["dynamic"] for s in shapes] == [False, True, True]
    assert [s["recompiled"] for s in shapes] == [False, True, False] and row["recompiles"] == 1
    assert all(s["first_ms"] > 0 and s["p99_ms"] >= s["p50_ms"] > 0 for s in shapes)


def _static_only(gm, example_inputs):
    if symbolic(example_inputs):
        raise RuntimeError("this backend compiles static shapes only")
    return gm.forward


class _StaticOnlyCpu(CpuTarget):
    """A backend that refuses a dynamic graph (what a user meets at a new shape: an error)."""

    def compile_backend(self):
        return _static_only


def test_a_backend_that_refuses_dynamic_graphs_fails_at_each_new_shape(config):
    target = _StaticOnlyCpu()
    target.setup()
    (row,) = _rows(target, RELU_MLP, "float32", config, modes=("compile",))
    assert row["status"] == "pass"  # training and parity ran at the canonical shape, on a static graph
    shapes = row["shapes"]
    assert "error" not in shapes[0] and shapes[0]["dynamic"] is False and shapes[0]["p50_ms"] > 0
    assert all("static shapes only" in s["error"] and s["p50_ms"] is None for s in shapes[1:])
    assert "shape sweep failed at 2 of 3 shapes (first [[3, 12]]: " in row["error"]


def test_shape_sweep_recompiles_on_emulator(emu, config):
    """The emulated Neuron compiler takes the one dynamic graph too, but lowers it for every
    concrete shape (it compiles static shapes only): what a user of the device meets is a
    recompile at each new shape, one lowering each, with Dynamo's recompile paid once. The
    training steps ran on the canonical shape's static graphs, as before. The item says the same
    when the same graph ran before it in the process (dynamo's reset clears the backend's cache)."""
    for _ in range(2):
        neuron_emu.reset_compile_stats()
        (row,) = _rows(emu, RELU_MLP, "float32", config, modes=("compile",))
        assert row["item_key"] == f"{RELU_MLP}|compile|float32|0"
        assert row["status"] == "pass", row["error"]
        shapes = row["shapes"]
        assert [s["shape"] for s in shapes] == [[[2, 12]], [[3, 12]], [[4, 12]]]
        assert [s["dynamo_graphs"] for s in shapes] == [1, 1, 0]  # one dynamic recompile, not one per shape
        assert [s["dynamic"] for s in shapes] == [False, True, True]
        assert [s["lowerings"] for s in shapes] == [1, 1, 1]
        assert [s["compiles"] for s in shapes] == [1, 1, 1]
        assert [s["recompiled"] for s in shapes] == [False, True, True] and row["recompiles"] == 2
        assert row["compile_s"] > 0 and all(s["first_ms"] > 0 and s["p99_ms"] >= s["p50_ms"] > 0 for s in shapes)
        graphs = neuron_emu.compile_stats()["graphs"]
        assert [g["kind"] for g in graphs] == ["forward", "backward", "inference", "inference", "inference"]
        inputs = [{d[1] for d in g["signature"] if d[0] == "T"} & {(2, 12), (3, 12), (4, 12)} for g in graphs]
        assert inputs[0] == {(2, 12)} and not inputs[1] - {(2, 12)}  # training: the canonical shape's
        assert inputs[2:] == [{(2, 12)}, {(3, 12)}, {(4, 12)}]  # each shape's inference graph, lowered on its own


# -- broken specs ------------------------------------------------------------------------------
def _boom(params):
    raise RuntimeError("constructor exploded")


def test_constructor_that_raises_is_an_error_row(monkeypatch, emu, config):
    fam = Family(name="boom", description="raises", grid={"w": [4]}, id_fmt="w{w}", build=_boom,
                 inputs=lambda p, v, g: (torch.randn(2, 4, generator=g),))
    monkeypatch.setitem(registry.FAMILIES, "boom", fam)
    started: list[str] = []
    rows = list(run_model_group(emu, Group("boom.w4", "float32", "model"), config, on_start=started.append))
    assert [r["item_key"] for r in rows] == started == ["boom.w4|eager|float32|0", "boom.w4|compile|float32|0"]
    assert {r["status"] for r in rows} == {"error"}
    assert "model construction failed: RuntimeError: constructor exploded" in rows[0]["error"]
    unknown = list(run_model_group(emu, Group("nofamily.x", "float32", "model"), config, modes=("eager",)))
    assert unknown[0]["status"] == "error" and "unknown model" in unknown[0]["error"]
    # resume: recorded items are skipped
    assert list(run_model_group(emu, Group("boom.w4", "float32", "model"), config,
                                skip={"boom.w4|eager|float32|0", "boom.w4|compile|float32|0"})) == []


# -- end to end --------------------------------------------------------------------------------
E2E = """
import sys
from conformance.run import RunSpec, execute_run
spec = RunSpec(target="neuron-emu", build="2.33.0", opinfo=False, models=(sys.argv[2],), dtypes=("float32",),
               workers=1, timeout_s=120)
s = execute_run(spec, sys.argv[1])
assert s.items == 2 and s.failures == 0, s.render()
"""


def test_execute_run_records_model_rows(tmp_path):
    # A fresh process: workers are forked, and a parent that already ran autograd on a device
    # (the tests above) cannot fork autograd users.
    db = tmp_path / "models.sqlite"
    r = subprocess.run([sys.executable, "-c", E2E, str(db), RELU_MLP], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    with Store.open(db) as st:
        rows = {r["mode"]: r for r in st.db.query("select * from model_results")}
    assert set(rows) == {"eager", "compile"}
    assert {r["status"] for r in rows.values()} == {"pass"}
    assert rows["compile"]["recompiles"] == 2
    assert len(json.loads(rows["eager"]["loss_curve"])["target"]) == 3
    assert json.loads(rows["eager"]["params"])["act"] == "relu"


# -- what a row says about its failure -------------------------------------------------------
ERROR_MANIFEST = """
[build]
name = "test-models-error"
inherits = "2.33.0"
[ops]
native = ["aten::gelu.default"]
[[defects]]
op = "aten::gelu.default"
kind = "error"
"""


def test_forward_error_is_stored_as_the_tolerance_judges_it(defective, config):
    """fwd_rel_err is the normwise ||t - c|| / ||c|| that fwd_rtol bounds, not the element-wise
    max_rel_err (which a near-zero output inflates)."""
    (bad,) = _rows(defective, GELU_MLP, "float32", config)
    assert bad["status"] == "mismatch" and 0.015 < bad["fwd_rel_err"] < 0.06  # a 5 % gelu defect, diluted
    assert f"||t - c|| / ||c|| = {bad['fwd_rel_err']:.3g}" in bad["error"]
    (ok,) = _rows(get_target("neuron-emu", "2.33.0"), GELU_MLP, "float32", config)  # the build made active again
    assert ok["status"] == "pass" and ok["fwd_rel_err"] <= 0.015
    # the first target switches its build back before it runs again (it had run on 2.33.0, a
    # pass, whenever another test of the same worker had made another build active)
    (again,) = _rows(defective, GELU_MLP, "float32", config)
    assert again["status"] == "mismatch" and again["fwd_rel_err"] == pytest.approx(bad["fwd_rel_err"])


def test_an_error_the_target_raises_is_localized_to_the_op_that_raised(tmp_path, config):
    path = tmp_path / "test-models-error.toml"
    path.write_text(ERROR_MANIFEST)
    (row,) = _rows(get_target("neuron-emu", str(path)), GELU_MLP, "float32", config)
    assert row["status"] == "error"
    assert row["first_divergent_op"] == "aten::gelu.default"
    assert "raises on the target" in row["first_divergent_detail"] and "[2, 16]" in row["first_divergent_detail"]


def test_a_kernel_only_an_accelerator_is_handed_is_named(config):
    """An LSTM cell decomposes to aten::_thnn_fused_lstm_cell only on an accelerator (a graph traced
    on the CPU never holds it): the op that raised is read from the target's own run."""
    (row,) = _rows(get_target("neuron-emu", "2.33.0"), "rnn.lstm.h8l1.uni.s4.last", "float32", config)
    assert row["status"] == "error"
    assert row["first_divergent_op"] == "aten::_thnn_fused_lstm_cell.default", row.get("first_divergent_detail")


class _EmptyThenPool(torch.nn.Module):
    """An uninitialised buffer filled in place, then a max pool over rounded values (ties)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = torch.empty_like(x)
        y.copy_(x * 2)
        return torch.nn.functional.max_pool1d(torch.round(self.lin(y)), 2).sum(-1)


@pytest.mark.parametrize("backward", [False, True])
def test_localize_never_blames_uninitialised_values_or_tied_indices(emu, backward):
    # empty_like's values are undefined (the target's garbage is not the CPU's): timm models were
    # localized to it; a pool's indices may differ where values tie, its values may not
    torch.manual_seed(0)
    assert localize(_EmptyThenPool(), (torch.randn(4, 8),), emu, torch.float32, tol=0.05, backward=backward) is None


def test_values_and_indices_are_judged_by_their_values():
    from conformance.models.localize import _float_leaves, _values_and_indices

    vals, idx = torch.tensor([1.0, 2.0]), torch.tensor([0, 1])
    assert _values_and_indices((vals, idx)) and not _values_and_indices((vals, vals)) and not _values_and_indices(idx)
    assert _float_leaves((vals, idx)) == [vals]
