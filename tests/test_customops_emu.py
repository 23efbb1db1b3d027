"""The custom-op lane end to end on the emulated device's own ops (neuron_emu/custom_ops.py):
found by discovery on the neuron target and absent on the CPU's, clean on a shipped build, and on
a build seeding the faults only a custom op has (a wrong fake shape, a wrong fake dtype, a wrong
backward, wrong bfloat16 values) each flagged naming the check that failed, and by the gate against
the clean build; `conformance repro` of a flagged item reproduces it, of a clean one passes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from conformance.customops import CUSTOM_OPS
from conformance.run.runner import RunSpec, execute_run
from conformance.sweep.opinfo import SweepConfig
from conformance.targets import get_target
from conformance.work import Group
from opdb import Store

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.xdist_group("customops_emu")]
VALUED = ("neuron::flash_attention.default", "neuron::rms_norm.default", "neuron::rope.default")
UNVALUED = ("neuron::flash_attention_backward.default", "neuron::rms_norm_backward.default",
            "neuron::rope_backward.default")
BUILD = """
[build]
name = "{name}"
inherits = "2.33.0"
{defects}
"""
DEFECTS = """
[[defects]]
op = "neuron::rms_norm.default"
kind = "wrong_fake_shape"

[[defects]]
op = "neuron::rope.default"
kind = "wrong_backward"
magnitude = 0.5

[[defects]]
op = "neuron::flash_attention.default"
kind = "wrong_result"
dtypes = ["bfloat16"]
magnitude = 0.25

[[defects]]
op = "neuron::flash_attention.default"
kind = "wrong_fake_dtype"
dtypes = ["float32"]
"""
# (op, variant, dtype) of every item the seeded build gets wrong
FLAGGED = {("neuron::rms_norm.default", v, d) for v in ("opcheck", "custom_compile") for d in ("float32", "bfloat16")} \
    | {("neuron::rope.default", v, d) for v in ("custom_bwd", "custom_compile") for d in ("float32", "bfloat16")} \
    | {("neuron::flash_attention.default", v, "bfloat16") for v in ("custom_fwd", "custom_compile")} \
    | {("neuron::flash_attention.default", "opcheck", "float32")}


def _manifest(tmp_path, name: str, defects: str = "") -> str:
    p = tmp_path / f"{name}.toml"
    p.write_text(textwrap.dedent(BUILD.format(name=name, defects=defects)))
    return str(p)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("customops")
    db = d / "c.sqlite"

    def run(build: str) -> str:
        spec = RunSpec(target="neuron-emu", build=build, ops=("neuron::*",), dtypes=("float32", "bfloat16"), workers=2)
        return execute_run(spec, db).run_id

    return db, run(_manifest(d, "clean")), run(_manifest(d, "seeded", DEFECTS))


def _rows(db, run_id: str) -> dict[tuple[str, str, str], list[dict]]:
    out: dict[tuple[str, str, str], list[dict]] = {}
    with Store.open(db) as st:
        for r in st.db.query("select * from op_results where run_id = ? and variant != 'canary'", [run_id]):
            out.setdefault((r["op"], r["variant"], r["dtype"]), []).append(r)
    return out


def test_the_emulators_custom_ops_are_found_on_its_device_and_not_on_the_cpu():
    from conformance.customops.discovery import discover

    get_target("neuron-emu")
    # (another test module's own PrivateUse1 ops, cotest::, may be registered in this process too)
    assert {o for o in discover("neuron") if o.startswith("neuron::")} == set(VALUED) | set(UNVALUED)
    assert discover("cpu") == []
    assert list(CUSTOM_OPS.run(get_target("cpu"), Group("*::*", "float32", CUSTOM_OPS.name), SweepConfig())) == []


def test_a_shipped_builds_custom_ops_are_clean(runs):
    db, clean, _ = runs
    rows = _rows(db, clean)
    assert {op for op, _, _ in rows} == set(VALUED) | set(UNVALUED)
    for (op, variant, dtype), items in rows.items():
        want = "structural" if op in UNVALUED else "pass"
        assert {r["status"] for r in items} == {want}, (op, variant, dtype, [r["error"] for r in items])
        assert variant == "opcheck" or op in VALUED  # an op without a reference has no value items
    for op in VALUED:
        assert {v for o, v, _ in rows if o == op} == {"opcheck", "custom_fwd", "custom_bwd", "custom_compile"}
        fwd = rows[(op, "custom_fwd", "float32")][0]
        assert op in fwd["native_ops"] and fwd["fallback_ops"] == "[]"


def test_each_seeded_fault_is_flagged_naming_the_check_that_failed(runs):
    db, _, seeded = runs
    rows = _rows(db, seeded)
    failing = {k for k, items in rows.items() if any(r["status"] not in ("pass", "structural") for r in items)}
    assert failing == FLAGGED
    for dtype in ("float32", "bfloat16"):
        check = rows[("neuron::rms_norm.default", "opcheck", dtype)][0]
        assert check["status"] == "contract" and "test_faketensor" in check["contract_failed"].split(",")
        assert "opcheck test_faketensor" in check["error"] and "test_schema" not in check["contract_failed"]
        assert rows[("neuron::rms_norm.default", "custom_fwd", dtype)][0]["status"] == "pass"
        bwd = rows[("neuron::rope.default", "custom_bwd", dtype)]
        assert {r["status"] for r in bwd} == {"mismatch"} and all(r["error"].startswith("gradients:") for r in bwd)
        assert {r["status"] for r in rows[("neuron::rope.default", "custom_fwd", dtype)]} == {"pass"}
    fwd = rows[("neuron::flash_attention.default", "custom_fwd", "bfloat16")]
    assert {r["status"] for r in fwd} == {"mismatch"} and all(r["arbiter_err"] is not None for r in fwd)
    assert {r["status"] for r in rows[("neuron::flash_attention.default", "custom_fwd", "float32")]} == {"pass"}


def test_the_gate_flags_the_seeded_faults_against_the_clean_build(runs):
    from conformance.gate.core import run_gate

    db, clean, seeded = runs
    with Store.open(db) as st:
        result = run_gate(st, clean, seeded, attempts=2)
    assert result.verdict == "fail"
    assert {(f.name, f.variant, f.dtype) for f in result.of("regression")} == FLAGGED
    assert {f.evidence["confirmation"]["verdict"] for f in result.of("regression")
            if "confirmation" in f.evidence} == {"confirmed"}
    assert not result.of("flaky")


def test_the_build_page_lists_each_custom_op_with_its_checks_and_each_has_an_op_page(runs, tmp_path):
    from reports import render_site

    db, _, seeded = runs
    with Store.open(db) as st:
        render_site(st, tmp_path / "site", db_label="c.sqlite")
        build = next(r["build"] for r in st.runs() if r["id"] == seeded)
    page = next((tmp_path / "site").glob(f"*{build}*/index.html")).read_text()
    section = page[page.index('<section id="custom-ops">'):page.index('<section id="slowest">')]
    for op in VALUED + UNVALUED:
        assert section.count(f">{op}</a>") == 2  # float32 and bfloat16
    assert section.count("checked structurally only</td>") == 6
    assert 'st-contract">contract test_faketensor' in section and 'st-mismatch">mismatch<' in section
    op_page = next((tmp_path / "site").glob(f"*{build}*/ops/*rms_norm.default*.html")).read_text()
    assert "test_faketensor" in op_page and "custom_compile" in op_page


def test_a_wrong_fake_dtype_is_flagged_naming_the_opcheck_test_that_failed(runs):
    """The fake implementation gives float16 for a float32 result (the device kernel is right):
    opcheck's fake-tensor test fails, naming both dtypes; the values and the other dtype are clean."""
    db, _, seeded = runs
    rows = _rows(db, seeded)
    checks = rows[("neuron::flash_attention.default", "opcheck", "float32")]
    assert len(checks) == 2
    for check in checks:
        assert check["status"] == "contract" and check["contract_failed"] == "test_faketensor"
        assert check["error"].startswith("opcheck test_faketensor: ")
        assert "torch.float32" in check["error"] and "torch.float16" in check["error"]
        contracts = json.loads(check["contracts"])
        assert contracts["test_faketensor"]["outcome"] == "fail" and contracts["test_schema"]["outcome"] == "pass"
    assert {r["status"] for r in rows[("neuron::flash_attention.default", "opcheck", "bfloat16")]} == {"pass"}
    for variant in ("custom_fwd", "custom_bwd"):
        assert {r["status"] for r in rows[("neuron::flash_attention.default", variant, "float32")]} == {"pass"}


# -- conformance repro of the lane's items ----------------------------------------------------------------
def _result_id(db, run_id: str, item: str) -> int:
    with Store.open(db) as st:
        (row,) = st.db.query("select id from op_results where run_id = ? and item_key = ?", [run_id, item])
    return row["id"]


def test_repro_of_a_custom_op_item_reproduces_a_failure_and_passes_a_clean_item(runs, tmp_path):
    """`conformance repro N` of a custom-op item writes a script that sets up the run's target and
    build, makes the sample again (the reference's seeded generator; the schema's walk for an op
    without a reference) and runs the same check: it exits 1 and says what differs while the item
    fails (an opcheck test, the gradients, the compiled op's error), 0 on an item that passes or is
    checked structurally only."""
    from click.testing import CliRunner

    from conformance.cli import main

    db, _, seeded = runs
    cases = {  # item -> (exit code, what the script prints)
        "neuron::rms_norm.default|opcheck|float32|0": (1, ["status now: contract", "OPCHECK FAILED: test_faketensor",
                                                           "opcheck test_schema: pass"]),
        "neuron::rope.default|custom_bwd|float32|1": (1, ["status now: mismatch", "MISMATCH: gradients:",
                                                          "FAILS: neuron::rope.default|custom_bwd|float32|1"]),
        "neuron::rms_norm.default|custom_compile|float32|0": (1, ["status now: error",
                                                                  "target raised: RuntimeError The size of tensor a (17)"]),
        "neuron::rope.default|custom_fwd|float32|1": (0, ["status now: pass", "does not fail now"]),
        "neuron::rope_backward.default|opcheck|float32|0": (0, ["status now: structural", "opcheck test_faketensor: pass"]),
    }
    procs = {}
    for item in cases:
        rid = _result_id(db, seeded, item)
        made = CliRunner().invoke(main, ["repro", str(rid), "--db", str(db), "--out", str(tmp_path / "repro")])
        assert made.exit_code == 0, made.output
        script = tmp_path / "repro" / f"repro_{rid}.py"
        assert f"{item!r}" in script.read_text()
        procs[item] = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       text=True, cwd=tmp_path)
    for item, proc in procs.items():
        out, _ = proc.communicate(timeout=300)
        code, said = cases[item]
        assert proc.returncode == code, (item, out[-3000:])
        assert f"{item} on neuron-emu (build seeded)" in out, out[-3000:]
        for line in said:
            assert line in out, (item, line, out[-3000:])
