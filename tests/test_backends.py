"""The backends nobody here wrote: ``onnxruntime`` (torch.onnx's dynamo exporter + ONNX Runtime's
CPU provider) and ``openvino`` (``torch.compile(backend="openvino")``). Each item proves that the
backend ran it; an export failure is ``unsupported`` with the exporter's reason; a path that
silently runs eager or hands the work back to PyTorch (or to inductor) never passes.

The backend tests skip without the optional extra (``pip install -e '.[backends]' -c
constraints.txt``); the verdict rule runs everywhere. Float32, one sample per op."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

import pytest
import torch

from conformance.check.execute import err
from conformance.check.verdict import NOT_COMPILED, REFUSED_PREFIX, Status, decide
from conformance.run.runner import RunSpec, execute_run
from conformance.select import Group
from conformance.sweep.opinfo import SweepConfig, run_group
from conformance.targets import REGISTRY, get_target
from conformance.targets.base import TargetUnsupported


def _ort() -> None:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")


def _openvino() -> None:
    pytest.importorskip("openvino")


def _sweep(target, op, variants=("function",), samples=1):
    return list(run_group(target, Group(op, "float32"), SweepConfig(variants=variants, max_samples=samples)))


def _stored(db):
    rows = sqlite3.connect(db).execute("select op, variant, status, error, proof from op_results").fetchall()
    return [(op, v, s, e, json.loads(p)) for op, v, s, e, p in rows]


# -- the verdict (no backend needed) ---------------------------------------------------------------

def test_a_refusal_before_running_is_unsupported_not_an_error():
    message = err(TargetUnsupported("torch.onnx: DispatchError: No ONNX function found for aten.linalg_eig"))
    assert message.startswith(REFUSED_PREFIX)
    assert decide(cpu_error=None, target_error=message, close=False, graphs=0) is Status.UNSUPPORTED
    # a reason that names a dtype or a layout is still the refusal, not unsupported_dtype/layout
    dtype = err(TargetUnsupported("torch.onnx: complex128 is not supported"))
    assert decide(cpu_error=None, target_error=dtype, close=False, graphs=0) is Status.UNSUPPORTED
    assert decide(cpu_error=None, target_error="RuntimeError: ONNX Runtime failed", close=False) is Status.ERROR
    assert Status.UNSUPPORTED.failed


# -- onnxruntime -----------------------------------------------------------------------------------

def test_an_onnxruntime_item_through_the_workers_stores_its_proof(tmp_path):
    _ort()
    db = tmp_path / "ort.sqlite"
    spec = RunSpec(target="onnxruntime", ops=("neg",), dtypes=("float32",), workers=1, max_samples=1,
                   variants=("function",))
    summary = execute_run(spec, db)
    assert summary.infra is None and summary.uncompiled == 0 and summary.graphs >= 1
    rows = _stored(db)
    assert {(op, v) for op, v, *_ in rows if v != "canary"} == {("neg", "function")}
    for op, variant, status, error, proof in rows:  # canaries (add, mul, abs, sum) included
        assert status == "pass", (op, variant, error)
        assert proof["backend"] == "onnxruntime" and proof["graphs"] == proof["ort_runs"] == 1, proof
        assert proof["provider"] == "CPUExecutionProvider" and proof["onnx_nodes"] >= 1
    (neg,) = [p for op, v, *_, p in rows if op == "neg"]
    assert "Neg" in neg["onnx_ops"] and "aten::neg.default" in neg["graph_ops"]


def test_an_export_failure_is_unsupported_with_the_exporters_reason():
    _ort()
    (row,) = _sweep(get_target("onnxruntime"), "linalg.eig")
    assert row["status"] == "unsupported", row
    assert "No ONNX function found" in row["error"] and "linalg_eig" in row["error"], row["error"]
    assert row["proof"]["graphs"] == 0


def test_backward_is_refused_by_an_inference_runtime():
    _ort()
    (row,) = _sweep(get_target("onnxruntime"), "sin", variants=("backward",))
    assert row["status"] == "unsupported" and "inference only" in row["error"], row


def test_in_place_and_out_write_back_and_return_the_callers_tensor():
    _ort()
    t = get_target("onnxruntime")
    x, y = torch.ones(3), torch.arange(3.0)
    got = t.wrap(lambda a, b: a.add_(b))(x, y)
    assert got is x and torch.equal(x, torch.tensor([1.0, 2.0, 3.0]))
    out = torch.empty(3)
    got = t.wrap(lambda a, b, out: torch.mul(a, b, out=out))(x, y, out)
    assert got is out and torch.equal(out, torch.tensor([0.0, 2.0, 6.0]))
    spectrum = t.wrap(torch.fft.fft)(torch.arange(4.0))  # ONNX holds complex values as pairs of reals
    assert spectrum.dtype == torch.complex64 and torch.allclose(spectrum, torch.fft.fft(torch.arange(4.0)))


def test_a_python_scalar_result_comes_back_as_that_scalar():
    """ONNX has tensors only: ``Tensor.item()`` is a 0-d tensor in the model. The exported program
    says it was a SymFloat / SymInt / SymBool, so the result is the float / int / bool eager gives,
    and the ``item`` OpInfo passes (it was a "Tensor vs float" mismatch)."""
    _ort()
    t = get_target("onnxruntime")
    for x in (torch.tensor(2.5), torch.tensor(3), torch.tensor(True)):
        got, want = t.wrap(lambda a: a.item())(x), x.item()
        assert type(got) is type(want) and got == want, (x, got)
    assert t.wrap(lambda a: (a.sum().item() > 1, a * 2))(torch.ones(3))[0] is True
    # only the value's own kind comes back as a scalar: a model that returned a float where the
    # program traced an int would stay a tensor, and the comparison says so
    from conformance.targets.onnx_runtime import _sample_module, _sample_result

    module, tensors = _sample_module(lambda a: a.item(), (torch.tensor(3),), {})

    class Program:  # what _sample_result reads of an ONNXProgram
        exported_program = torch.export.export(module, tensors, strict=False)

    assert type(_sample_result(Program(), tensors, [torch.tensor(3), tensors[0]])) is int
    assert isinstance(_sample_result(Program(), tensors, [torch.tensor(3.0), tensors[0]]), torch.Tensor)
    assert all(row["status"] == "pass" for row in _sweep(t, "item", samples=3)), _sweep(t, "item")


# Put first on sys.path in a script's interpreter: the harness cannot be imported there.
NO_HARNESS = """
import sys


class _NoHarness:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("conformance", "opdb", "reports"):
            raise ImportError(f"{name}: a standalone repro script imports no harness module")


sys.meta_path.insert(0, _NoHarness())
"""

# (op, variant, sample, its status under onnxruntime 1.32.0 + onnxscript 0.7.2, constraints.txt)
ORT_ITEMS = [("prod", "function", 7, "error"),  # ONNX Runtime rejects the exported ReduceProd
             ("matmul", "out", 8, "mismatch"),  # every value wrong
             ("fft.fft", "function", 3, "mismatch"),  # complex: pairs of reals read back as complex
             ("add", "inplace", 0, "pass"),  # written back into the caller's tensor
             ("add", "out", 0, "pass")]


def test_an_onnxruntime_items_script_runs_without_the_harness_and_reaches_the_sweeps_verdict(tmp_path):
    """The script exports and runs the sample as the sweep did (the target's own functions, as
    source) with torch, onnxscript and onnxruntime only: the harness cannot even be imported."""
    _ort()
    from conformance.triage.repro import write_repro
    from opdb import Store

    db = tmp_path / "ort.sqlite"
    execute_run(RunSpec(target="onnxruntime", ops=("prod", "matmul", "fft.fft", "add"), dtypes=("float32",),
                        workers=1, max_samples=9, variants=("function", "inplace", "out")), db)
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "sitecustomize.py").write_text(NO_HARNESS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(mods), os.environ.get("PYTHONPATH", "")])}
    runs = []
    with Store.open(db, create=False) as st:
        for op, variant, index, status in ORT_ITEMS:
            (row,) = st.db.query("select id, status, error, contract_failed from op_results where op = ? and variant = ? "
                                 "and sample = ?", [op, variant, index])
            assert row["status"] == status, (op, variant, index, row)
            script = write_repro(st, row["id"], tmp_path / "repro")
            # its value part imports no harness; a failed contract is checked as the sweep checks it
            # (conformance.triage.repro: that part needs the harness), so only such a script may import it
            values = script.read_text().split('"""', 2)[2].split("# -- the contracts the stored item failed")[0]
            assert "conformance" not in values, ("the script imports the harness", row)
            runs.append((op, row, subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                                                   stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
                                                   env=None if row["contract_failed"] else env)))
    for op, row, proc in runs:
        out, _ = proc.communicate(timeout=300)
        assert "a standalone repro script imports no harness module" not in out, out[-3000:]
        assert proc.returncode == (0 if Status(row["status"]).passed else 1), (op, row, out[-3000:])
        if row["status"] == "error":
            assert "target raised:" in out and "ReduceProd" in out, out[-3000:]
        elif row["status"] == "mismatch":
            assert "MISMATCH:" in out, out[-3000:]


def test_an_unexported_or_unrun_onnxruntime_path_is_infra(monkeypatch):
    _ort()
    from conformance.targets.onnx_runtime import OnnxRuntimeTarget

    class Unexported(OnnxRuntimeTarget):
        """Calls the function itself: nothing exported, nothing run by ONNX Runtime."""

        name = "test-ort-unexported"

        def wrap(self, fn):
            super().wrap(fn)
            return fn

    class ExportedButEager(OnnxRuntimeTarget):
        """Exports, then runs the exported program in PyTorch instead of ONNX Runtime."""

        name = "test-ort-eager"

        def _run(self, program, tensors, record):
            return program.exported_program.module()(*tensors)[0]

    for cls in (Unexported, ExportedButEager):
        monkeypatch.setitem(REGISTRY, cls.name, cls)
        (row,) = _sweep(get_target(cls.name), "sin")
        assert row["status"] == "error" and row["proof"]["graphs"] == 0, (cls.name, row)
        assert row["error"].startswith(NOT_COMPILED), row["error"]


# -- openvino --------------------------------------------------------------------------------------

def test_an_openvino_item_through_the_workers_stores_its_proof(tmp_path):
    _openvino()
    db = tmp_path / "ov.sqlite"
    spec = RunSpec(target="openvino", ops=("neg",), dtypes=("float32",), workers=1, max_samples=1,
                   variants=("function",))
    summary = execute_run(spec, db)
    assert summary.infra is None and summary.uncompiled == 0 and summary.graphs >= 1
    rows = _stored(db)
    assert {(op, v) for op, v, *_ in rows if v != "canary"} == {("neg", "function")}
    for op, variant, status, error, proof in rows:  # canaries: OpenVINO leaves sum(0-d, dim=0) to PyTorch
        assert Status(status).passed, (op, variant, error)
        assert proof["backend"] == "openvino" and proof["graphs"] >= 1 and proof["device"] == ["cpu"], proof
    (neg,) = [(s, p) for op, v, s, _, p in rows if op == "neg"]
    assert neg[0] == "pass" and neg[1]["openvino_subgraphs"] == neg[1]["backend_ran"] == 1
    assert neg[1]["fallback_kernels"] == []
    assert neg[1]["openvino_ops"] == ["aten::neg.default"]
    # the item's standalone script compiles it with OpenVINO's backend, with the sweep's options
    # (a dict: its braces once broke the script's template), and reproduces the pass
    from conformance.triage.repro import write_repro
    from opdb import Store

    with Store.open(db, create=False) as st:
        rid = next(iter(st.db.query("select id from op_results where op = 'neg'")))["id"]
        script = write_repro(st, rid, tmp_path / "repro")
    text = script.read_text()
    assert "OPTIONS = {'device': 'CPU', 'testing': True}" in text and "backend=_openvino, dynamic=False" in text
    ran = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr


def test_an_op_openvino_leaves_to_pytorch_is_a_fallback():
    _openvino()
    (row,) = _sweep(get_target("openvino"), "special.zeta")
    assert row["status"] == "pass_fallback", row
    assert row["proof"]["openvino_subgraphs"] == row["proof"]["backend_ran"] == 0 and row["proof"]["graphs"] == 1
    assert row["fallback_ops"] == row["proof"]["fallback_kernels"] == ["aten::special_zeta.default"]


def test_openvino_handing_a_graph_to_inductor_is_an_error_and_to_pytorch_a_fallback(monkeypatch):
    _openvino()
    from openvino.frontend.pytorch.torchdynamo import execute, partition

    target = get_target("openvino")

    def no_partitions(self, gm, options):
        raise RuntimeError("conversion broke")

    with monkeypatch.context() as m:  # its backend would compile the graph with inductor instead
        m.setattr(partition.Partitioner, "make_partitions", no_partitions)
        (row,) = _sweep(target, "sin")
    assert row["status"] == "error" and "inductor" in row["error"] and "conversion broke" in row["error"], row

    def no_compile(*args, **kwargs):
        raise RuntimeError("plugin broke")

    with monkeypatch.context() as m:  # its subgraph runs in PyTorch from then on: a fallback, with why
        m.setattr(execute, "openvino_compile", no_compile)
        (row,) = _sweep(target, "sin")
    assert row["status"] == "pass_fallback" and row["fallback_ops"] == ["aten::sin.default"], row
    assert row["proof"]["openvino_subgraphs"] == 0 and "plugin broke" in row["proof"]["openvino_failed"][0], row


BREAK_CONVERSION = """
from openvino.frontend.pytorch.torchdynamo import partition


def _no_partitions(self, gm, options):
    raise RuntimeError("conversion broke")


partition.Partitioner.make_partitions = _no_partitions
"""


def test_a_graph_openvino_fails_to_convert_fails_its_repro_script_too(tmp_path):
    """The sweep calls a graph OpenVINO cannot convert an error (its backend would compile it with
    inductor); the item's standalone script must not pass it off as OpenVINO's result either."""
    _openvino()
    from conformance.triage.repro import write_repro
    from opdb import Store

    db = tmp_path / "ov.sqlite"
    with Store.open(db) as st:
        run = st.start_run(target="openvino", build="-", torch_version=torch.__version__, config={"seed": 0})
        st.insert("op_results", [{"run_id": run, "item_key": "sin|function|float32|0", "op": "sin",
                                  "variant": "function", "dtype": "float32", "sample": 0, "seed": 0, "status": "error",
                                  "atol": 1e-5, "rtol": 1.3e-6, "error": "TargetError: OpenVINO failed to convert"}])
        rid = next(iter(st.db.query("select id from op_results")))["id"]
        script = write_repro(st, rid, tmp_path / "repro")
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "sitecustomize.py").write_text(BREAK_CONVERSION)  # in the script's interpreter only
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(mods), os.environ.get("PYTHONPATH", "")])}
    ran = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env=env)
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert "OpenVINO failed to convert the graph" in ran.stdout and "conversion broke" in ran.stdout, ran.stdout
    # and a graph it converts passes as before
    ok = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert ok.returncode == 0 and "within tolerance" in ok.stdout, ok.stdout + ok.stderr


@pytest.mark.parametrize(("op", "variant", "index"), [
    # the OpInfo calls the op through wrapper_set_seed, which the sweep swaps for a plain call
    # around the compiled call; a script that compiled the wrapper (a graph break at its seeding,
    # then another graph) passed where the sweep's compile failed in dynamo's shape guards
    ("nn.functional.multi_head_attention_forward", "function", 0),
    # gradients: the sweep gives OpenVINO aot_autograd (forward and backward graphs compiled); a
    # script without it left the backward to PyTorch and passed where the sweep's worker died
    ("complex", "backward", 8),
])
def test_a_compiled_items_script_reaches_the_sweeps_verdict(tmp_path, op, variant, index):
    """The script compiles and calls the item as the sweep did, so it ends as the item did (0 for
    a pass, 1 for a failure, a signal for a crash), whatever OpenVINO makes of the graph."""
    _openvino()
    from conformance.triage.repro import write_repro
    from opdb import Store

    db = tmp_path / "ov.sqlite"
    execute_run(RunSpec(target="openvino", ops=(op,), dtypes=("float32",), workers=1, max_samples=index + 1,
                        variants=(variant,)), db)
    with Store.open(db, create=False) as st:
        row = next(iter(st.db.query("select id, status, error from op_results where variant = ? and sample = ?",
                                    [variant, index])))
        script = write_repro(st, row["id"], tmp_path / "repro")
    assert "_seeded_outside(torch.compile(fn, backend=_openvino, dynamic=False)" in script.read_text()
    ran = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    said = (row, ran.returncode, ran.stdout[-2000:], ran.stderr[-2000:])
    if row["status"] == "crash":
        assert ran.returncode < 0, said
    else:
        assert ran.returncode == (0 if Status(row["status"]).passed else 1), said


def test_openvino_silently_running_eager_is_infra(monkeypatch):
    _openvino()
    from conformance.targets.openvino_compile import OpenVinoTarget

    class SilentEager(OpenVinoTarget):
        name = "test-openvino-silent-eager"

        def wrap(self, fn):
            compiled = super().wrap(fn)

            def run(*args, **kwargs):
                with torch.compiler.set_stance("force_eager"):
                    return compiled(*args, **kwargs)

            return run

    monkeypatch.setitem(REGISTRY, SilentEager.name, SilentEager)
    rows = _sweep(get_target(SilentEager.name), "sin", variants=("function", "backward"))
    assert rows
    for r in rows:
        assert r["status"] == "error" and r["proof"]["graphs"] == 0, r
        assert r["error"].startswith(NOT_COMPILED)


def test_an_openvino_batch_with_a_sample_left_to_pytorch_is_bisected_to_it(monkeypatch):
    """OpenVINO hands a subgraph it cannot compile to PyTorch: in a batch, one sample's fallback
    would be every sample's. Such a batch is not kept; bisection keeps the halves OpenVINO ran
    whole, and only the sample it failed on reports the fallback (as when run alone). The kept
    items name their ops from their own batch, not from a later attempt that fell back."""
    _openvino()
    from openvino.frontend.pytorch.torchdynamo import execute

    target = get_target("openvino")
    config = SweepConfig(variants=("function",), max_samples=4, compile_batch=4)
    alone = list(run_group(target, Group("nn.functional.relu", "float32"), SweepConfig(variants=("function",), max_samples=4,
                                                                         compile_batch=1)))
    shapes = [r["signature"].split("[", 1)[1].split("]", 1)[0] for r in alone]  # "f32[5,5]" -> "5,5"
    bad = shapes[-1]  # the last sample: its failing batch is the latest attempt
    assert shapes.count(bad) == 1, shapes
    compile_ = execute.openvino_compile

    def fails_on_one_shape(gm, *args, **kwargs):
        if any(isinstance(a, torch.Tensor) and ",".join(map(str, a.shape)) == bad for a in args):
            raise RuntimeError("plugin broke on this shape")
        return compile_(gm, *args, **kwargs)

    monkeypatch.setattr(execute, "openvino_compile", fails_on_one_shape)
    batched = list(run_group(target, Group("nn.functional.relu", "float32"), config))
    alone = list(run_group(target, Group("nn.functional.relu", "float32"), SweepConfig(variants=("function",), max_samples=4,
                                                                         compile_batch=1)))
    assert [(r["status"], r["fallback_ops"]) for r in batched] == [(r["status"], r["fallback_ops"]) for r in alone]
    assert [r["status"] for r in batched] == ["pass"] * 3 + ["pass_fallback"], batched
    assert batched[-1]["fallback_ops"] == ["aten::relu.default"]
    kept = [r for r in batched if (r["proof"].get("batch") or {}).get("samples", 0) > 1]
    assert len(kept) == 2 and all(r["fallback_ops"] == [] and r["proof"]["openvino_subgraphs"] >= 1 for r in kept)


def test_onnxruntime_batches_give_the_verdicts_of_one_model_per_sample():
    """One exported model per batch of samples (conformance.check.batching): the same statuses as one
    model per item, an export the exporter refuses (linalg.eig) bisected to unsupported items."""
    _ort()
    target = get_target("onnxruntime")

    def rows(batch):
        config = SweepConfig(variants=("function", "out"), max_samples=4, compile_batch=batch)
        return [r for op in ("add", "topk", "linalg.eig") for r in run_group(target, Group(op, "float32"), config)]

    batched, alone = rows(4), rows(1)
    assert {r["item_key"]: r["status"] for r in batched} == {r["item_key"]: r["status"] for r in alone}
    assert any((r["proof"].get("batch") or {}).get("samples", 0) > 1 for r in batched if r["op"] == "add")
    assert {r["status"] for r in batched if r["op"] == "linalg.eig" and r["variant"] == "function"} == {"unsupported"}


def test_sparse_inputs_are_refused_by_onnxruntime_and_openvino_with_the_reason():
    # torch.export takes a sparse sample, but ONNX Runtime's session is fed dense arrays only;
    # dynamo (openvino's torch.compile) refuses to trace a sparse input
    _ort()
    rows = _sweep(get_target("onnxruntime"), "mul", variants=("sparse_csr",), samples=1)
    assert [r["status"] for r in rows] == ["unsupported"], rows
    assert "ONNX Runtime takes dense inputs only (input 0 is sparse_csr)" in rows[0]["error"]
    _openvino()
    rows = _sweep(get_target("openvino"), "mul", variants=("sparse_coo",), samples=1)
    assert [r["status"] for r in rows] == ["unsupported_layout"], rows
    assert "Attempted to wrap sparse Tensor" in rows[0]["error"]


def test_a_model_on_onnxruntime_is_exported_and_its_inference_forward_compared():
    # ONNX Runtime is inference only: the model item exports the model in eval mode and compares
    # the forward with the CPU's; there is no eager item (that would be the CPU against itself)
    _ort()
    from conformance.models.runner import run_model_group

    group = Group("mlp.d1w16.relu.none.bias", "float32", "model")
    rows = list(run_model_group(get_target("onnxruntime"), group, SweepConfig(), timed_iters=0))
    assert [(r["mode"], r["status"]) for r in rows] == [("compile", "pass")], rows
    assert 0 < rows[0]["fwd_rel_err"] < 1e-5 and rows[0]["compile_s"] > 0
    assert rows[0].get("loss_curve") is None  # nothing trained
    bf16 = list(run_model_group(get_target("onnxruntime"), Group(group.op, "bfloat16", "model"), SweepConfig(),
                                timed_iters=0))
    assert [r["status"] for r in bf16] == ["error"] and "ONNXRuntimeError" in bf16[0]["error"], bf16
