"""A tampered database (or a hostile build name) never runs code: not in ``conformance repro``,
not in the script it writes. Stored inputs load only in the safe format; old pickles are refused."""

from __future__ import annotations

import io
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from conformance.cli import main
from opdb import Store
from opdb.blobs import MAGIC, UnsafeInputs, dump_inputs, load_inputs


class _Evil:
    """Unpickling this writes the marker file (what an attacker's blob would do)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _hostile(marker) -> list[str]:
    code = f"import pathlib;pathlib.Path({str(marker)!r}).write_text('pwned')"
    return [f'""";{code};"""', f"''';{code};'''", f'x\\"""\n{code}\n"""', f'"\n{code}\n#\\', f'{{0}}{{rid}}"""{code}',
            f"aten::abs.default\n{code}\nx = torch.ops.aten.abs.default"]  # the old script spliced op names in


def _db(tmp_path, *, build="-", status="mismatch", op="abs", variant="function", dtype="float32", inputs=None,
        error="boom", sample=0):
    db = tmp_path / "t.sqlite"
    with Store.open(db) as st:
        run = st.start_run(target="cpu", build=build, torch_version=torch.__version__, config={"seed": 0})
        st.insert("op_results", [{"run_id": run, "item_key": f"{op}|{variant}|{dtype}|{sample}", "op": op,
                                  "variant": variant, "dtype": dtype, "sample": sample, "status": status, "error": error,
                                  "inputs": inputs,
                                  "atol": 1e-5, "rtol": 1.3e-6}])
        rid = next(iter(st.db.query("select id from op_results")))["id"]
    return db, rid


def _repro(db, rid, out):
    return CliRunner().invoke(main, ["repro", str(rid), "--db", str(db), "--out", str(out)])


def test_hostile_build_status_and_error_stay_text(tmp_path):
    """Stored build name, status and error with quote-closing payloads: the script runs, prints
    the result, and its docstring holds the text verbatim; no marker."""
    marker = tmp_path / "pwned"
    payloads = _hostile(marker)
    db, rid = _db(tmp_path, build=payloads[0] + payloads[3], status=payloads[1] + payloads[4], error=payloads[2])
    r = _repro(db, rid, tmp_path / "repro")
    assert r.exit_code == 0, r.output
    script = tmp_path / "repro" / f"repro_{rid}.py"
    import ast

    doc = ast.get_docstring(ast.parse(script.read_text()), clean=False)
    assert payloads[0] + payloads[3] in doc and payloads[1] + payloads[4] in doc and payloads[2] in doc
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "within tolerance" in out.stdout
    assert not marker.exists()


@pytest.mark.parametrize("field", ["op", "variant", "dtype"])
def test_hostile_op_variant_dtype_are_refused(tmp_path, field):
    marker = tmp_path / "pwned"
    bad = _hostile(marker)[-1 if field == "op" else 0]
    kwargs = {field: bad}
    if field == "op":
        kwargs.update(variant="schema", inputs=dump_inputs({"args": [torch.ones(2)], "kwargs": {}}))
    db, rid = _db(tmp_path, **kwargs)
    r = _repro(db, rid, tmp_path / "repro")
    assert r.exit_code == 2, r.output
    assert r.output.count("\n") == 1 and f"result {rid}" in r.output and field in r.output
    assert not (tmp_path / "repro").exists() and not marker.exists()


def test_schema_op_must_be_a_dispatcher_overload(tmp_path):
    inputs = dump_inputs({"args": [torch.ones(2)], "kwargs": {}})
    for op in ("aten::__class__.default", "aten::abs.nosuch", "aten::abs.default.x"):
        db, rid = _db(tmp_path, op=op, variant="schema", inputs=inputs)
        r = _repro(db, rid, tmp_path / "repro")
        assert r.exit_code == 2 and "not an ATen overload" in r.output, (op, r.output)
        db.unlink()


def _evil_blobs(marker) -> dict[str, bytes]:
    evil = _Evil(str(marker))
    buf = io.BytesIO()
    torch.save({"args": [evil], "kwargs": {}}, buf)
    inner = io.BytesIO()
    torch.save({"format": "opdb-inputs/1", "structure": "[]", "tensors": [evil]}, inner)
    return {"raw pickle": pickle.dumps({"args": [evil], "kwargs": {}}), "torch.save pickle": buf.getvalue(),
            "magic + evil torch.save": MAGIC + inner.getvalue(), "magic + raw pickle": MAGIC + pickle.dumps(evil)}


def test_malicious_inputs_blob_never_runs(tmp_path):
    """A pickle whose __reduce__ writes a marker, stored in the inputs column (bare, in a
    torch.save archive, behind the safe format's magic): repro refuses it in one line, exit 2,
    before and after `conformance merge`; the marker never appears."""
    marker = tmp_path / "pwned"
    for label, blob in _evil_blobs(marker).items():
        sub = tmp_path / label.replace(" ", "_").replace("+", "")
        sub.mkdir()
        db, rid = _db(sub, op="aten::abs.default", variant="schema", inputs=blob)
        merged = sub / "merged.sqlite"
        assert CliRunner().invoke(main, ["merge", str(merged), str(db)]).exit_code == 0
        for path in (db, merged):
            r = _repro(path, rid, sub / "repro")
            assert r.exit_code == 2, (label, r.output)
            assert r.output.count("\n") == 1 and f"result {rid}: column inputs" in r.output, (label, r.output)
        assert not marker.exists(), label
        assert not (sub / "repro").exists()


def test_old_pickle_format_is_refused_with_a_clear_message():
    buf = io.BytesIO()
    torch.save({"args": [torch.ones(2)], "kwargs": {}}, buf)
    with pytest.raises(UnsafeInputs, match="old pickle format"):
        load_inputs(buf.getvalue(), where="result 3: column inputs")


def test_blob_round_trip_keeps_values_strides_and_grad():
    x = torch.randn(3, 4).t().requires_grad_(True)
    value = {"args": [x, 1.5, float("nan"), -0.0, 2j, torch.Size([2]), torch.float16, torch.contiguous_format,
                      "<device>", None, (1, [2, slice(1, None)])], "kwargs": {"k": {1: "a"}}}
    back = load_inputs(dump_inputs(value))
    t = back["args"][0]
    assert torch.equal(t, x.detach()) and t.stride() == x.stride() and t.requires_grad
    assert back["args"][2] != back["args"][2] and str(back["args"][3]) == "-0.0"  # nan and -0.0 survive
    assert repr(back["args"][1:]) == repr(value["args"][1:]) and back["kwargs"] == value["kwargs"]
    with pytest.raises(ValueError, match="cannot be stored"):
        dump_inputs({"args": [object()]})


def test_schema_result_repro_round_trip_loads_weights_only(tmp_path):
    """A schema result stored in the safe format: the script (which loads with weights_only)
    reproduces it on the CPU target."""
    db, rid = _db(tmp_path, op="aten::add.Tensor", variant="schema",
                  inputs=dump_inputs({"args": [torch.ones(3), torch.arange(3.0)], "kwargs": {"alpha": 2}}))
    r = _repro(db, rid, tmp_path / "repro")
    assert r.exit_code == 0, r.output
    script = tmp_path / "repro" / f"repro_{rid}.py"
    assert "weights_only=True" in script.read_text() and "weights_only=False" not in script.read_text()
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "tensor([1., 3., 5.])" in out.stdout, out.stdout + out.stderr


def test_the_script_copies_inputs_in_their_layout_and_storage(tmp_path):
    """as_strided.partial_views' sample 2 is a view at offset 5 of a 20-element storage, and
    as_strided reads that storage beyond the view (storage_offset=10): the script moves the sample as the sweep does
    (execute.on_device), not as a compact copy of the view (``setStorage: ... out of bounds``)."""
    db, rid = _db(tmp_path, op="as_strided.partial_views", status="pass", sample=2)
    assert _repro(db, rid, tmp_path / "repro").exit_code == 0
    script = tmp_path / "repro" / f"repro_{rid}.py"
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "within tolerance" in out.stdout, out.stdout + out.stderr


# A device backend whose abs(out=) replaces the out tensor's storage: the values stay right, the
# out contract does not (an importable module, as `--import` names one).
BREAKS_OUT = '''
import torch
import neuron_emu  # noqa: F401

_lib = torch.library.Library("aten", "IMPL")


def _abs_out(self, *, out):
    out.set_(torch.ops.aten.abs.default(self.cpu()).to(self.device))
    return out


_lib.impl("abs.out", _abs_out, "PrivateUse1")
'''


def _contract_db(tmp_path, contract_failed: str):
    db = tmp_path / "c.sqlite"
    with Store.open(db) as st:
        run = st.start_run(target="device:neuron", build="-", torch_version=torch.__version__,
                           config={"seed": 0, "imports": ["neuron_emu", "repro_breaks_out"]})
        st.insert("op_results", [{"run_id": run, "item_key": "abs|out|float32|0", "op": "abs", "variant": "out",
                                  "dtype": "float32", "sample": 0, "seed": 0, "status": "contract",
                                  "contract_failed": contract_failed, "atol": 1e-5, "rtol": 1.3e-6,
                                  "error": "contract out: the target replaced the out tensor's storage"}])
        rid = next(iter(st.db.query("select id from op_results")))["id"]
    return db, rid


def test_contract_failure_is_reproduced_by_the_script(tmp_path, monkeypatch):
    """An item whose values pass but whose out contract failed: the script's value check passes,
    then it evaluates the item as the sweep does, prints the out contract's failure and exits 1."""
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "repro_breaks_out.py").write_text(BREAKS_OUT)
    import os

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(mods), os.environ.get("PYTHONPATH", "")])}
    db, rid = _contract_db(tmp_path, "out")
    # write_repro resolves the run's target in this process: run it in a child, so the broken
    # kernel never reaches this one
    made = subprocess.run([sys.executable, "-m", "conformance", "repro", str(rid), "--db", str(db), "--out",
                           str(tmp_path / "repro")], capture_output=True, text=True, timeout=300, env=env)
    assert made.returncode == 0, made.stdout + made.stderr
    script = tmp_path / "repro" / f"repro_{rid}.py"
    text = script.read_text()
    assert "evaluate(target, info" in text and "'contracts': ['out']" in text
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env=env)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "within tolerance" in out.stdout  # the values pass ...
    assert "sweep status: contract" in out.stdout  # ... the contract does not
    assert "contract out: fail: " in out.stdout and "replaced the out tensor's storage" in out.stdout
    assert "CONTRACT FAILED: out" in out.stdout
    # the same item on a backend that keeps the contract: the script says so and exits 0
    (mods / "repro_breaks_out.py").write_text("import neuron_emu  # noqa: F401\n")
    ok = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                        env=env)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "contract out: pass" in ok.stdout and "CONTRACT FAILED" not in ok.stdout


@pytest.mark.parametrize("stored", ["strides", "out,\nimport os", "out'); import os; ('"])
def test_unknown_contract_names_are_refused(tmp_path, stored):
    db, rid = _db(tmp_path)
    import sqlite3

    with sqlite3.connect(db) as con:
        con.execute("update op_results set contract_failed = ? where id = ?", [stored, rid])
    r = _repro(db, rid, tmp_path / "repro")
    assert r.exit_code == 2, r.output
    assert r.output.count("\n") == 1 and f"result {rid}: field contract_failed" in r.output, r.output


def test_the_printed_run_command_works_outside_the_virtual_environment(tmp_path):
    """The hint names the interpreter that wrote the script (a bare `python`, the system's,
    lacks torch): run as printed, from another folder, with the venv off PATH, it works."""
    import os
    import shlex

    db, rid = _db(tmp_path)
    r = _repro(db, rid, tmp_path / "repro")
    assert r.exit_code == 0, r.output
    script = tmp_path / "repro" / f"repro_{rid}.py"
    assert r.output.strip() == f"wrote {script} (run: {shlex.join([sys.executable, str(script)])})"
    command = r.output.strip().split("(run: ", 1)[1][:-1]
    assert f"  {shlex.join([sys.executable, str(script.resolve())])}" in script.read_text()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")} | {"PATH": "/usr/bin:/bin"}
    out = subprocess.run(shlex.split(command), capture_output=True, text=True, timeout=300, cwd=elsewhere, env=env)
    assert out.returncode == 0 and "within tolerance" in out.stdout, out.stdout + out.stderr


def test_the_hand_check_counts_a_script_that_fails_another_way_apart():
    """tools/findings_repro.py: a script reproduces an error only with the item's exception
    class, and a mismatch only with a value difference; a script that dies of its own NameError
    reproduces nothing."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    from findings_repro import _same_failure

    error = {"status": "error", "error": "InvalidArgument: [ONNXRuntimeError] : 2 : Non-zero status"}
    assert _same_failure(error, "target raised: InvalidArgument [ONNXRuntimeError] : 2") == "reproduced"
    assert _same_failure(error, "target raised: NameError name '_session_options' is not defined") == "other failure"
    assert _same_failure(error, "MISMATCH: Tensor-likes are not close!") == "other failure"
    mismatch = {"status": "mismatch", "error": "output 0: 3 of 4 values outside atol"}
    assert _same_failure(mismatch, "MISMATCH: Tensor-likes are not close!") == "reproduced"
    assert _same_failure(mismatch, "target raised: RuntimeError boom") == "other failure"
    # the sweep's wording of a compiler failure, and torch's in the script, around the same cause
    compile_error = {"status": "error", "error": "TargetError: backend 'inductor' failed to compile a graph: "
                                                "GuardOnDataDependentSymNode: Could not extract"}
    said = "target raised: BackendCompilerFailed backend='inductor' raised:"
    text = said + "\nGuardOnDataDependentSymNode: Could not extract specialized integer\n"
    assert _same_failure(compile_error, said, text) == "reproduced"
    assert _same_failure(compile_error, said, said + "\nRuntimeError: other\n") == "other failure"
    # a target's own wrapper of the backend's failure: the script raises it as a RuntimeError
    wrapped = {"status": "error", "error": "TargetError: backend 'openvino' failed to compile a graph: TargetError: "
                                           "OpenVINO failed to convert the graph (its backend would compile it)"}
    said = "target raised: BackendCompilerFailed backend='_openvino' raised:"
    text = said + "\nRuntimeError: OpenVINO failed to convert the graph (its backend would compile it)\n"
    assert _same_failure(wrapped, said, text) == "reproduced"


# -- custom-op lane items (conformance/triage/repro_customops.py) --------------------------------------
def test_a_custom_op_items_script_keeps_stored_text_out_of_its_code(tmp_path):
    """A custom_fwd result with quote-closing payloads as build, status and error: the script is
    written (no inputs file: the lane makes its sample again from code), parses, holds the text
    in its docstring and record only; nothing runs."""
    import ast

    marker = tmp_path / "pwned"
    payloads = _hostile(marker)
    db, rid = _db(tmp_path, op="neuron::rms_norm.default", variant="custom_fwd", build=payloads[0] + payloads[3],
                  status=payloads[1], error=payloads[2] + payloads[4])
    r = _repro(db, rid, tmp_path / "repro")
    assert r.exit_code == 0, r.output
    script = tmp_path / "repro" / f"repro_{rid}.py"
    assert sorted(p.name for p in (tmp_path / "repro").iterdir()) == [script.name]
    tree = ast.parse(script.read_text())
    doc = ast.get_docstring(tree, clean=False)
    assert payloads[0] + payloads[3] in doc and payloads[1] in doc and payloads[2] + payloads[4] in doc
    (record,) = [ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "RECORD"]
    assert record["item"] == "neuron::rms_norm.default|custom_fwd|float32|0" and record["status"] == payloads[1]
    assert record["seed"] == 0 and record["target"] == "cpu" and (record["atol"], record["rtol"]) == (1e-5, 1.3e-6)
    assert not marker.exists()


@pytest.mark.parametrize("op, variant, sample, needle", [
    ("neuron::rms_norm\nimport os", "opcheck", 0, "is not a custom op's overload name"),
    ("neuron::rms_norm", "custom_fwd", 0, "is not a custom op's overload name"),  # no overload
    ("neuron::*", "opcheck", -1, "could not be made"),  # the row of a lane that could not look
    ("neuron::rms_norm.default", "custom_fwd", -1, "could not be made"),
])
def test_a_custom_op_item_that_is_no_item_is_refused_in_one_line(tmp_path, op, variant, sample, needle):
    db, rid = _db(tmp_path, op=op, variant=variant, sample=sample)
    r = _repro(db, rid, tmp_path / "repro")
    assert r.exit_code == 2, r.output
    assert r.output.count("\n") == 1 and f"result {rid}: " in r.output and needle in r.output, r.output
    assert not (tmp_path / "repro").exists()


def test_an_emulated_device_item_is_reproduced_without_the_devices_silent_recovery(tmp_path):
    """The sweep surfaces a failed device execution (neuron_emu's switch, as the real device's
    TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS); a script that let the device recover on the
    CPU unseen would pass where the item failed. cat's sample 8 in int64 is channels_last, which
    build 2.33.0 refuses."""
    import os

    from conformance.targets.neuron_emu import SURFACE_ERRORS

    db = tmp_path / "e.sqlite"
    r = CliRunner().invoke(main, ["run", "--build", "2.33.0", "--ops", "cat", "--dtypes", "int64", "--variants",
                                  "function", "--no-schema", "--sizes", "samples", "--contracts", "none", "--quiet",
                                  "--exit-zero", "--db", str(db), "-n", "1"])
    assert r.exit_code == 0, r.output
    with Store.open(db) as st:
        row = next(iter(st.db.query("select id, status from op_results where item_key = 'cat|function|int64|8'")))
    assert row["status"] == "unsupported_layout"
    assert _repro(db, row["id"], tmp_path / "repro").exit_code == 0
    env = {k: v for k, v in os.environ.items() if k != SURFACE_ERRORS}  # a user's shell: recovery is the default
    out = subprocess.run([sys.executable, str(tmp_path / "repro" / f"repro_{row['id']}.py")], capture_output=True,
                         text=True, timeout=600, env=env)
    assert out.returncode == 1 and "target raised: RuntimeError" in out.stdout and "channels_last" in out.stdout, \
        out.stdout[-2000:] + out.stderr[-2000:]


def test_a_factory_items_script_creates_the_targets_tensors_on_the_target(tmp_path):
    """A factory sample names the device it was generated for (``device='cpu'``); the sweep makes
    the target's call create its tensors on the target, and so must the script, or it compares the
    CPU with itself (signal.windows.hann's cosines on build 2.31.0 read 'not reproduced')."""
    db = tmp_path / "f.sqlite"
    r = CliRunner().invoke(main, ["run", "--build", "2.31.0", "--ops", "signal.windows.hann", "--dtypes", "float32",
                                  "--variants", "function", "--no-schema", "--sizes", "samples", "--contracts", "none",
                                  "--quiet", "--exit-zero", "--db", str(db), "-n", "1"])
    assert r.exit_code == 0, r.output
    with Store.open(db) as st:
        row = next(iter(st.db.query("select id, status from op_results where item_key = "
                                    "'signal.windows.hann|function|float32|7'")))
    assert row["status"] == "mismatch"
    assert _repro(db, row["id"], tmp_path / "repro").exit_code == 0
    out = subprocess.run([sys.executable, str(tmp_path / "repro" / f"repro_{row['id']}.py")], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 1 and "MISMATCH:" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]


def test_a_layout_or_variant_contracts_finding_is_shown_with_torch_alone_and_not_on_a_build_without_it(tmp_path):
    """2.31.0 rejects channels_last tensors (its manifest's layout rule): amax refuses channels_last
    inputs the CPU accepts (the noncontiguous contract), and ``to`` returns a channels_last tensor
    that the device's own ``torch.eq`` then refuses (the metadata contract); rsqrt's out= variant
    of an int64 input gives other values than its function (the variants contract); abs returns a
    contiguous result for an input the CPU and the meta kernels keep in its own layout (metadata).
    The script shows each
    with torch calls alone (``STANDALONE:``), which the hand check counts as reproduced; the same
    script on ``ideal`` shows nothing."""
    from conformance.run.runner import RunSpec, execute_run

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    from findings_repro import run_script

    db = tmp_path / "r.sqlite"
    execute_run(RunSpec(target="neuron-emu", build="2.31.0", ops=("amax", "to"), dtypes=("bfloat16",),
                        variants=("function",), workers=1, schema=False, sizes="samples"), db)
    execute_run(RunSpec(target="neuron-emu", build="2.31.0", ops=("rsqrt",), dtypes=("int64",), variants=("out",),
                        workers=1, max_samples=1, run_id="out-variant"), db)
    execute_run(RunSpec(target="neuron-emu", build="2.31.0", ops=("abs",), dtypes=("int64",),
                        variants=("reference",), reference_inputs="all", workers=1, run_id="reference"), db)
    with Store.open(db) as st:
        rows = {}
        for r in st.db.query("select id, op, variant, dtype, sample, status, error, contract_failed "
                             "from op_results where status = 'contract' order by id"):
            rows.setdefault((r["op"], r["contract_failed"]), dict(r))
    picked = [("noncontiguous", "channels_last inputs", rows[("amax", "noncontiguous")]),
              ("metadata", "is rejected by the target's own torch.eq", rows[("to", "metadata")]),
              ("metadata", ") on the target, ", rows[("abs", "metadata")]),
              ("variants", "the out variant differs", rows[("rsqrt", "variants")])]
    made = subprocess.run([sys.executable, "-m", "conformance", "repro", *(str(r["id"]) for _, _, r in picked),
                           "--db", str(db), "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    for contract, words, row in picked:
        script = tmp_path / f"repro_{row['id']}.py"
        outcome, said = run_script(row, script, tmp_path)
        assert outcome == "reproduced" and said.startswith(f"STANDALONE: contract {contract}:"), (outcome, said)
        assert words in said, said
        # the same script against a build that keeps the contract: torch alone shows nothing
        clean = tmp_path / f"clean_{row['id']}.py"
        clean.write_text(script.read_text().replace("'2.31.0'", "'ideal'"))
        ran = subprocess.run([sys.executable, str(clean)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert ran.returncode == 0 and "STANDALONE" not in ran.stdout, ran.stdout[-2000:] + ran.stderr[-2000:]
