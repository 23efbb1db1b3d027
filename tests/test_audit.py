"""conformance audit: readiness verdicts, risks, recompiles, export fallback, bad input."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

import conformance.cli.audit  # noqa: F401  (attaches `audit` to the CLI)
from conformance.cli import main
from opdb import Store

DEFECT = """
[build]
name = "audit-defect"
inherits = "2.33.0"
[ops]
native = ["aten::gelu.default"]
[[defects]]
op = "aten::gelu.default"
kind = "wrong_result"
magnitude = 0.2
"""


@pytest.fixture(autouse=True)
def _restore_emulator():
    """The audit activates builds and sets one intra-op thread: put both back."""
    import neuron_emu

    build, threads = neuron_emu.active_build(), torch.get_num_threads()
    yield
    neuron_emu.use_build(build)
    torch.set_num_threads(threads)


def audit(*args: str, tmp_path=None):  # noqa: ANN001, ANN201
    out = tmp_path / "audit.json" if tmp_path else None
    extra = ["--json", str(out)] if out else []
    r = CliRunner().invoke(main, ["audit", *args, "--timed-iters", "2", *extra])
    data = json.loads(out.read_text()) if out and out.exists() else None
    return r, data


def test_native_model_is_ready(tmp_path):
    r, data = audit("audit_models:native", tmp_path=tmp_path)
    assert r.exit_code == 0, r.output
    assert "verdict: ready" in r.output and "fallbacks" not in r.output.splitlines()[-2]
    assert data["verdict"] == "ready" and data["exit_code"] == 0
    assert data["capture"]["method"] == "torch.export"
    ops = {o["name"]: o for o in data["ops"]}
    assert ops["aten::addmm.default"]["eager_calls"] == 2 and ops["aten::addmm.default"]["marked"] == "native"
    assert all(o["ok"] for o in data["outputs"])
    assert data["shapes"][0]["p50_ms"] is not None


def test_fallback_op_is_named(tmp_path):
    r, data = audit("audit_models:cumprod", "--input-shape", "2,8", "--build", "2.31.0", tmp_path=tmp_path)
    assert r.exit_code == 0, r.output
    assert "verdict: ready with fallbacks (1 op falls back to the CPU: aten::cumprod.default)" in r.output
    assert data["fallbacks"] == ["aten::cumprod.default"]
    assert {o["name"]: o["marked"] for o in data["ops"]}["aten::cumprod.default"] == "fallback"


def test_defect_blocks_and_names_first_divergent_op(tmp_path):
    manifest = tmp_path / "defect.toml"
    manifest.write_text(DEFECT)
    r, data = audit("audit_models:gelu", "--build", str(manifest), "--train", tmp_path=tmp_path)
    assert r.exit_code == 1, r.output
    assert "verdict: blocked" in r.output
    assert data["first_divergent_op"] == "aten::gelu.default"
    assert "first divergent op aten::gelu.default" in data["blockers"][0]
    assert not data["outputs"][0]["ok"] and not data["gradients"]["ok"] and not data["training"]["ok"]
    assert {o["name"]: o["marked"] for o in data["ops"]}["aten::gelu.default"] == "failing"


def test_float64_buffer_and_recompiles(tmp_path):
    r, data = audit("audit_models:f64seq", "--input-shape", "2,6:int64", "--shapes", "2,9:int64",
                    "--shapes", "2,12:int64", tmp_path=tmp_path)
    assert r.exit_code == 0, r.output
    assert "float64: buffer scale [8] float64" in r.output
    assert any(k["kind"] == "float64" for k in data["risks"])
    assert data["compile"]["recompiles"] == 2
    assert data["compile"]["recompiled_shapes"] == ["[2,9] int64", "[2,12] int64"]
    assert [s["recompiled"] for s in data["shapes"]] == [False, True, True]


def test_export_failure_falls_back_to_eager_tracing(tmp_path):
    r, data = audit("audit_models:data_dependent", tmp_path=tmp_path)
    assert r.exit_code == 0, r.output
    assert "torch.export cannot capture the model" in r.output
    assert "falling back to eager tracing with a dispatch mode" in r.output
    assert data["capture"]["ok"] is False
    assert all(o["export_calls"] is None for o in data["ops"])
    assert "aten::addmm.default" in {o["name"] for o in data["ops"]}


def test_sweep_results_from_db(tmp_path):
    db = tmp_path / "opdb.sqlite"
    with Store.open(db) as st:
        run = st.start_run(target="neuron-emu", build="2.31.0", torch_version=torch.__version__, config={})
        st.insert("coverage", [
            {"run_id": run, "name": "aten::cumprod.default", "state": "exercised", "samples": 10,
             "native_samples": 0, "fallback_samples": 10, "failing_samples": 9, "statuses": "{}"},
            {"run_id": run, "name": "aten::addmm.default", "state": "exercised", "samples": 10,
             "native_samples": 10, "fallback_samples": 0, "failing_samples": 0, "statuses": "{}"}])
        st.finish_run(run)
    r, data = audit("audit_models:cumprod", "--input-shape", "2,8", "--build", "2.31.0", "--db", str(db),
                    tmp_path=tmp_path)
    assert r.exit_code == 1, r.output
    ops = {o["name"]: o for o in data["ops"]}
    assert ops["aten::cumprod.default"]["source"] == f"sweep {run}"
    assert ops["aten::cumprod.default"]["marked"] == "failing"
    assert ops["aten::addmm.default"]["source"] == f"sweep {run}"
    assert ops["aten::sigmoid.default"]["source"] == "isolated check"
    assert data["db"]["run"] == run


def test_html_page(tmp_path):
    r, _ = audit("audit_models:native", "--html", str(tmp_path / "site"))
    assert r.exit_code == 0, r.output
    page = (tmp_path / "site" / "index.html").read_text()
    assert "verdict: ready" in page and "aten::addmm.default" in page
    assert (tmp_path / "site" / "assets" / "report.css").exists()


@pytest.mark.parametrize("args, message", [
    (["no_such_module_xyz:build"], "does not import"),
    (["audit_models:missing"], "has no attribute"),
    (["audit_models"], "is not MODULE:CALLABLE"),
    (["audit_models:raises"], "raised RuntimeError: cannot build"),
    (["audit_models:not_a_module"], "expected an nn.Module"),
    (["audit_models:cumprod", "--input-shape", "2,x"], "does not parse"),
    (["audit_models:cumprod", "--input-shape", "2,8:float99"], "unknown dtype"),
    (["audit_models:cumprod"], "no example inputs"),
    (["audit_models:native", "--shapes", "3;"], "does not parse"),
    (["audit_models:cpu_fails"], "fails on the CPU"),
    (["audit_models:native", "--shapes", "2,5"], "fails on the CPU"),
])
def test_bad_input_exits_2(args, message):
    r = CliRunner().invoke(main, ["audit", *args])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], r.output


def test_custom_ops_are_risks(tmp_path):
    r, data = audit("audit_models:custom", "--inputs", "audit_models:custom_inputs", tmp_path=tmp_path)
    assert r.exit_code == 0, r.output
    risk = [k for k in data["risks"] if k["kind"] == "custom_op"]
    assert risk and "audit_models::scale.default" in risk[0]["what"]
    r, data = audit("audit_models:cpu_only", tmp_path=tmp_path)
    assert r.exit_code == 0, r.output
    risk = [k for k in data["risks"] if k["kind"] == "custom_op"]
    assert risk and "audit_cpp::shift.default" in risk[0]["what"], data["risks"]
    ops = {o["name"]: o for o in data["ops"]}
    assert ops["audit_cpp::shift.default"]["marked"] in ("fallback", "native")


def test_db_fallback_through_out_overload(tmp_path):
    """The sweep stores a functional overload's fallback under its out= overload (the device's
    fallback kernel is .out): the audit still marks the functional overload as falling back."""
    db = tmp_path / "opdb.sqlite"
    with Store.open(db) as st:
        run = st.start_run(target="neuron-emu", build="2.33.0", torch_version=torch.__version__, config={})
        st.insert("coverage", [
            {"run_id": run, "name": "aten::logical_not.default", "state": "exercised", "samples": 3,
             "native_samples": 0, "fallback_samples": 0, "failing_samples": 0, "statuses": "{}"},
            {"run_id": run, "name": "aten::logical_not.out", "state": "exercised", "samples": 9,
             "native_samples": 0, "fallback_samples": 9, "failing_samples": 0, "statuses": "{}"}])
        st.finish_run(run)
    r, data = audit("examples.audit_example:build", "--input-shape", "2,16:int64", "--build", "2.33.0",
                    "--db", str(db), tmp_path=tmp_path)
    assert r.exit_code == 0, r.output
    row = {o["name"]: o for o in data["ops"]}["aten::logical_not.default"]
    assert row["source"] == f"sweep {run}" and row["marked"] == "fallback", row
    assert "falls back through aten::logical_not.out" in row["detail"]
    assert "aten::logical_not.default" in data["fallbacks"]
