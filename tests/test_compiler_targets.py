"""Compiler targets prove they compiled: every item records the graphs its backend compiled, a
backend that gets an op wrong is caught by a sweep, and one that silently runs eager never
passes. Float32, a few ops, one or two samples each."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

import pytest
import torch

from conformance.check.verdict import NOT_COMPILED, Status, decide
from conformance.run.runner import RunSpec, execute_run
from conformance.select import Group
from conformance.sweep.opinfo import SweepConfig, run_group
from conformance.targets import REGISTRY, get_target
from conformance.targets.base import Compiled
from conformance.targets.inductor import CompilerTarget, aten_ops
from opdb import schema

SIN = torch.ops.aten.sin.default


class PerturbSin(CompilerTarget):
    """A broken compiler: AOT-traced graphs run as they are (``aot_eager``), except that every
    ``aten.sin`` result gets 1e-2 added."""

    name = "test-perturb-sin"
    backend_name = "aot_eager+sin"

    def compile_graph(self, gm, example_inputs, record: Compiled):
        from torch._dynamo.backends.common import aot_autograd

        def fw(graph: torch.fx.GraphModule, inputs):
            for node in list(graph.graph.nodes):
                if node.op == "call_function" and node.target is SIN:
                    with graph.graph.inserting_after(node):
                        bumped = graph.graph.call_function(torch.ops.aten.add.Scalar, (node, 1e-2))
                    node.replace_all_uses_with(bumped, delete_user_cb=lambda user, b=bumped: user is not b)
            graph.recompile()
            record.graph_ops |= aten_ops(graph)
            return graph

        return aot_autograd(fw_compiler=fw)(gm, example_inputs)


class SilentEager(CompilerTarget):
    """A compiler target whose calls never compile: dynamo is told to run them eager."""

    name = "test-silent-eager"
    backend_name = "aot_eager"

    def wrap(self, fn):
        compiled = super().wrap(fn)

        def run(*args, **kwargs):
            with torch.compiler.set_stance("force_eager"):
                return compiled(*args, **kwargs)

        return run


class _AotEager(CompilerTarget):
    name = "test-aot-eager"
    backend_name = "aot_eager"

    def __init__(self) -> None:
        super().__init__()
        self.setup()


class BrokenBackend(CompilerTarget):
    """A compiler that fails on every graph."""

    name = "test-broken-backend"
    backend_name = "broken"

    def compile_graph(self, gm, example_inputs, record: Compiled):
        raise RuntimeError("the backend broke")


class ColumnMajorOut(CompilerTarget):
    """Compiles right, then hands back its out= results in column-major layout."""

    name = "test-column-major-out"
    backend_name = "aot_eager"

    def wrap(self, fn):
        compiled = super().wrap(fn)

        def run(*args, **kwargs):
            got = compiled(*args, **kwargs)
            return got.mT.contiguous().mT if "out" in kwargs and isinstance(got, torch.Tensor) else got

        return run


@pytest.fixture
def registered(monkeypatch):
    for cls in (PerturbSin, SilentEager, BrokenBackend, ColumnMajorOut):
        monkeypatch.setitem(REGISTRY, cls.name, cls)


def _sweep(target, ops, variants=("function",), samples=1):
    config = SweepConfig(variants=variants, max_samples=samples)
    return [r for op in ops for r in run_group(target, Group(op, "float32"), config)]


def test_an_inductor_item_compiles_and_records_its_graphs():
    (row,) = _sweep(get_target("inductor"), ["sin"])
    assert row["status"] == "pass", row["error"]
    proof = row["proof"]
    assert proof["backend"] == "inductor" and proof["graphs"] >= 1 and proof["frames"] >= 1
    assert "aten::sin.default" in proof["graph_ops"] and proof["fallback_kernels"] == []
    assert proof["device"] == ["cpu"]
    assert "aten::sin.default" in row["reached_ops"]  # named by the eager trace beside the compiled run


def test_inductor_names_the_kernels_it_does_not_lower():
    (row,) = _sweep(get_target("inductor"), ["cumsum"])
    assert row["status"] == "pass" and row["proof"]["graphs"] >= 1
    assert row["proof"]["fallback_kernels"] == ["aten::cumsum.default"]


def test_inductor_strict_fails_where_inductor_falls_back_to_a_kernel():
    """upstream's setting (implicit_fallbacks=False): cholesky has no lowering (nor an explicit
    fallback, as cumsum has), so what the inductor target passes with a fallback kernel is a
    compile error naming the missing lowering, as upstream's expected-failure list says."""
    (row,) = _sweep(get_target("inductor-strict"), ["cholesky"])
    assert row["status"] == "error" and "MissingOperatorWithoutDecomp" in row["error"], row["error"]
    assert row["proof"]["graphs"] >= 1
    (fallback,) = _sweep(get_target("inductor"), ["cholesky"])
    assert fallback["status"] == "pass" and "aten::cholesky.default" in fallback["proof"]["fallback_kernels"]
    (ok,) = _sweep(get_target("inductor-strict"), ["sin"])
    assert ok["status"] == "pass" and ok["proof"]["backend"] == "inductor"


def test_dropout_inside_a_deterministic_op_draws_what_eager_draws():
    """scaled_dot_product_attention's samples 2 and 3 apply dropout: Inductor's own RNG lowering
    drew another mask than eager from the same seed, and each was a false mismatch. Such ops are
    compiled with fallback_random and compared value by value; random OpInfos keep Inductor's
    own RNG (compared by distribution)."""
    target = get_target("inductor")
    rows = _sweep(target, ["nn.functional.scaled_dot_product_attention"], variants=("function", "backward"), samples=4)
    dropout = [r for r in rows if r["sample"] in (2, 3)]
    assert len(dropout) == 4 and any("native_dropout" in op or "bernoulli" in op for op in dropout[0]["reached_ops"])
    for r in rows:
        assert r["comparator"] == "allclose", r["item_key"]
        if r["variant"] == "function":
            assert r["status"] == "pass", (r["item_key"], r["error"])
        # backward: the same masks (errors of accumulation order, ~1e-5, not of another mask: ~7)
        assert r["max_abs_err"] < 1e-4, (r["item_key"], r["error"])
    (rnd,) = _sweep(target, ["nn.functional.dropout"])
    assert rnd["comparator"] == "random" and rnd["status"] == "pass" and target._own_rng


def test_a_backend_that_perturbs_sin_is_caught_as_a_mismatch(registered):
    rows = _sweep(get_target("test-perturb-sin"), ["sin", "cos", "abs"], variants=("function", "inplace"))
    by_op = {}
    for r in rows:
        assert r["proof"]["graphs"] >= 1, r
        by_op.setdefault(r["op"], set()).add(r["status"])
    assert by_op == {"sin": {"mismatch"}, "cos": {"pass"}, "abs": {"pass"}}
    sin = next(r for r in rows if r["op"] == "sin")
    assert 0.009 < sin["max_abs_err"] < 0.011
    assert "aten::add.Scalar" in sin["proof"]["graph_ops"]


def test_a_target_that_silently_runs_eager_never_passes(registered):
    rows = _sweep(get_target("test-silent-eager"), ["sin", "add"], variants=("function", "backward"))
    assert rows
    for r in rows:
        assert r["status"] == Status.ERROR.value and r["proof"]["graphs"] == 0, r
        assert r["error"].startswith(NOT_COMPILED)


def test_an_uncompiled_item_says_so_even_when_a_contract_fails(registered):
    """The status of an item that compiled nothing is error, and its text says why, whatever a
    contract of its eager run said: found on linalg.solve out= (dynamo refuses a non-contiguous
    out=, and the metadata contract's failure had become the item's message)."""
    (row,) = _sweep(get_target("test-silent-eager"), ["sin"], variants=("function",))
    assert row["status"] == "error" and row["error"].startswith(NOT_COMPILED)
    from conformance.check import contracts

    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(contracts._CHECKS, "metadata", lambda s: contracts.fail("strides differ"))
        (row,) = _sweep(get_target("test-silent-eager"), ["sin"], variants=("function",))
    assert row["contract_failed"] == "metadata"
    assert row["status"] == "error" and row["error"].startswith(NOT_COMPILED), row["error"]


def test_out_layouts_are_compared_with_the_cpus_call_on_the_same_out_tensors(registered):
    """A compiler target's out= tensors come sized (dynamo cannot resize them): an eager kernel
    keeps a sized out='s layout and restrides an empty one (linalg.inv's result is column-major),
    so the CPU side gets sized tensors too. aot_eager, which runs the ATen graph as it is, used to
    fail the metadata contract on linalg.inv and linalg.cholesky_ex out= (so did inductor); a
    result handed back in another layout than eager's is still caught."""
    rows = _sweep(get_target("test-perturb-sin"), ["linalg.inv", "linalg.cholesky_ex"], variants=("out",))
    assert [(r["op"], r["status"], r["contract_failed"]) for r in rows] == [
        ("linalg.inv", "pass", None), ("linalg.cholesky_ex", "pass", None)], [r["error"] for r in rows]
    (row,) = _sweep(get_target("test-column-major-out"), ["linalg.inv"], variants=("out",))
    assert row["status"] == "contract" and row["contract_failed"] == "metadata", row["error"]
    assert "strides [1, 5] vs [5, 1]" in row["error"], row["error"]


def test_a_compile_failure_is_an_error_not_an_eager_run(registered):
    (row,) = _sweep(get_target("test-broken-backend"), ["sin"])
    assert row["status"] == "error" and "the backend broke" in row["error"], row["error"]
    assert row["proof"]["graphs"] == 1  # handed a graph, which failed; nothing ran eager instead


def test_a_compiled_call_under_a_dispatch_mode_is_refused():
    from torch.utils._mode_utils import no_dispatch

    from conformance.targets import TargetError
    from conformance.targets.base import Dispatched, OpTrace

    run = get_target("inductor").wrap(torch.sin)
    with pytest.raises(TargetError, match="dispatch mode"), Dispatched(OpTrace()):
        run(torch.ones(3))
    with pytest.raises(TargetError, match="Python dispatch key"), no_dispatch():
        run(torch.ones(3))


def test_recompiles_across_items_never_drift_to_eager():
    """Builtin ops compiled one after another share dynamo's wrapper frame: without a fresh
    dynamo per item its recompile limit (8) is soon reached and every later op runs eager."""
    target = _AotEager()
    graphs = []
    for i in range(12):
        fn = target.wrap(torch.sin if i % 2 else torch.cos)
        fn(torch.ones(i + 2))
        graphs.append(target.compiled().graphs)
    assert graphs == [1] * 12


def test_eager_targets_prove_the_device_only():
    (row,) = _sweep(get_target("cpu"), ["abs"])
    assert row["proof"] == {"device": ["cpu"]} and row["status"] == "pass"


def test_no_graph_is_an_error_whatever_the_comparison_or_the_ledger_says():
    assert decide(cpu_error=None, target_error=None, close=True, graphs=0) is Status.ERROR
    assert decide(cpu_error=None, target_error=None, close=False, graphs=0,
                  expected_failure=["mismatch"]) is Status.ERROR
    assert decide(cpu_error=None, target_error=None, close=True, graphs=1) is Status.PASS
    assert decide(cpu_error=None, target_error=None, close=True) is Status.PASS
    assert decide(cpu_error="bad sample", target_error=None, close=False, graphs=0) is Status.SKIP


def test_inductor_workers_compile_and_the_proof_is_stored(tmp_path):
    """Through the real runner: worker processes, canaries, opdb."""
    db = tmp_path / "r.sqlite"
    spec = RunSpec(target="inductor", ops=("neg", "exp"), dtypes=("float32",), workers=1, max_samples=1,
                   variants=("function",))
    summary = execute_run(spec, db)
    assert summary.infra is None and summary.graphs >= 2 and summary.uncompiled == 0
    assert "compiled graphs:" in summary.render()
    conn = sqlite3.connect(db)
    rows = conn.execute("select op, variant, status, proof from op_results").fetchall()
    assert {(op, v) for op, v, _, _ in rows if v == "function"} == {("neg", "function"), ("exp", "function")}
    for op, variant, status, proof in rows:  # canaries included
        p = json.loads(proof)
        assert status == "pass" and p["backend"] == "inductor" and p["graphs"] >= 1, (op, variant, p)
    from opdb import Store
    from opdb.queries_report import SAMPLE_COLUMNS, op_sample_stream

    with Store.open(db, create=False) as st:  # the report's sample table shows it
        shown = {json.loads(r[5])[SAMPLE_COLUMNS.index("proof")] for r in op_sample_stream(st, summary.run_id)}
    assert shown == {"inductor: 1 graphs on cpu"}
    # the item's standalone script compiles it too, and says it passes
    from conformance.triage.repro import write_repro

    with Store.open(db, create=False) as st:
        rid = next(iter(st.db.query("select id from op_results where op = 'neg' and variant = 'function'")))["id"]
        script = write_repro(st, rid, tmp_path / "repro")
    ran = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert ran.returncode == 0 and "within tolerance" in ran.stdout, ran.stdout + ran.stderr


def test_a_refused_layouts_script_says_the_compiler_compiled_nothing(tmp_path):
    """Dynamo refuses a sparse input and runs the call eager: the sweep's verdict is
    unsupported_layout, and the item's standalone script must not pass the eager result off as
    the compiler's (it printed the CPU's own values and exited 0)."""
    from conformance.triage.repro import write_repro
    from opdb import Store

    db = tmp_path / "r.sqlite"
    execute_run(RunSpec(target="inductor", ops=("sum",), dtypes=("float32",), workers=1, max_samples=1,
                        variants=("sparse_coo",)), db)
    with Store.open(db, create=False) as st:
        row = next(iter(st.db.query("select id, status from op_results where variant = 'sparse_coo'")))
        assert row["status"] == "unsupported_layout", row
        script = write_repro(st, row["id"], tmp_path / "repro")
    ran = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert "compiled no graph" in ran.stdout and "Attempted to wrap sparse Tensor" in ran.stdout, ran.stdout


def test_a_v3_database_gains_the_proof_column(tmp_path):
    import sqlite_utils

    path = tmp_path / "old.sqlite"
    db = sqlite_utils.Database(path)
    for step in schema.MIGRATIONS[:3]:
        step(db)
    db.execute("PRAGMA user_version = 3")
    db["op_results"].insert({"run_id": "r", "item_key": "abs|function|float32|0", "status": "pass"})
    db.conn.close()
    from opdb import Store

    with Store.open(path, create=False) as st:  # read-only: migrated in memory, file untouched
        (row,) = st.db.query("select status, proof from op_results")
        assert row == {"status": "pass", "proof": None}
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == 3


def test_random_opinfos_compile_beside_the_emulator():
    """freeze_rng_state (around OpInfo's random ops) reads the accelerator's RNG state inside
    no_dispatch(); with the emulator imported that is torch.neuron's, which dynamo traced there
    and failed with "you set no_dispatch()". Its RNG functions are now never traced."""
    import neuron_emu  # noqa: F401

    assert torch.accelerator.current_accelerator().type == "neuron"  # the condition of the bug
    rows = _sweep(get_target("inductor"), ["nn.functional.dropout"])
    assert rows
    for r in rows:
        assert "no_dispatch" not in (r["error"] or ""), r["error"]
        # OpInfo's wrapper_set_seed seeds around the compiled call, not inside it (dynamo skips
        # torch.manual_seed: traced inside, no graph compiled and every random op was an error)
        assert r["status"] == "pass", (r["status"], r["error"])
        assert (r["proof"] or {}).get("graphs", 0) >= 1, r["proof"]


def test_model_groups_on_a_compiler_target_hold_compile_items_only(registered):
    """An eager model item on a compiler target ran the model as it is on the CPU and compared
    the CPU with itself (every one passed, error exactly 0): no such item is planned."""
    from conformance.models.runner import run_model_group

    group = Group("mlp.d1w16.relu.none.bias", "float32", "model")
    rows = list(run_model_group(_AotEager(), group, SweepConfig(), timed_iters=0))
    assert [r["mode"] for r in rows] == ["compile"], [(r["mode"], r["status"]) for r in rows]
    assert rows[0]["status"] == "pass" and rows[0]["shapes"][0]["compiles"] >= 1, rows[0]
    eager = list(run_model_group(get_target("cpu"), group, SweepConfig(), timed_iters=0))
    assert [r["mode"] for r in eager] == ["eager", "compile"]


def test_ops_with_data_dependent_outputs_are_compiled_and_their_scripts_compile_them_too(tmp_path):
    """Dynamo's defaults break the graph at an op whose output shape depends on the data (nonzero)
    and at Tensor.item(): such an item compiled no graph, so every one was an infrastructure error
    and the compiler was never tested on the op. With the capture settings (inductor.CAPTURE) they
    compile; the standalone script sets them too (without them it compiles nothing and exits 1).
    A break dynamo's counters miss (a guard on a data-dependent value) still gives its reason."""
    from conformance.triage.repro import write_repro
    from opdb import Store

    for row in _sweep(get_target("inductor"), ["item"]):
        assert row["status"] == "pass" and row["proof"]["graphs"] >= 1, row
    (nll,) = _sweep(get_target("inductor"), ["nn.functional.gaussian_nll_loss"])
    assert nll["status"] == "error" and nll["proof"]["graphs"] == 0, nll
    assert any("data-dependent" in r for r in nll["proof"]["break_reasons"]), nll["proof"]
    db = tmp_path / "r.sqlite"
    execute_run(RunSpec(target="inductor", ops=("nonzero",), dtypes=("float32",), workers=1, max_samples=1,
                        variants=("function",)), db)
    with Store.open(db, create=False) as st:
        row = next(iter(st.db.query("select id, status, proof from op_results where op = 'nonzero'")))
        assert row["status"] == "pass" and '"graphs": 0' not in row["proof"], row
        script = write_repro(st, row["id"], tmp_path / "repro")
    ran = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
