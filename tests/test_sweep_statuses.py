"""Each sweep status arises from a real cause: defects injected through a custom emulator
manifest, run through the real runner (worker processes, isolation, opdb)."""

from __future__ import annotations

import textwrap

import pytest

from conformance.run.runner import RunSpec, execute_run
from opdb import Store

# Every test reads the one run of the module fixture: keep them on one xdist worker, or each
# worker that gets one runs the whole sweep (hang included) again.
pytestmark = pytest.mark.xdist_group("sweep_statuses")
# What the hanging op costs (a worker killed after it); every other item here takes milliseconds,
# a fresh worker's first one well under a second on a loaded machine.
HANG_TIMEOUT_S = 3.0

MANIFEST = """
[build]
name = "test-defects"
inherits = "2.33.0"

[ops]
native = ["aten::mul.Tensor", "aten::neg.default", "aten::reciprocal.default"]

[[defects]]
op = "aten::mul.Tensor"
dtypes = ["bfloat16"]
kind = "wrong_result"
magnitude = 0.5

[[defects]]
op = "aten::neg.default"
kind = "crash"

[[defects]]
op = "aten::reciprocal.default"
kind = "hang"

[[defects]]
op = "aten::add.Tensor"
kind = "fallback"
"""


@pytest.fixture(scope="module")
def defect_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("defects")
    manifest = d / "defects.toml"
    manifest.write_text(textwrap.dedent(MANIFEST))
    db = d / "r.sqlite"
    spec = RunSpec(target="neuron-emu", build=str(manifest), ops=("mul", "neg", "reciprocal", "add", "sub"),
                   dtypes=("float32", "bfloat16"), workers=2, timeout_s=HANG_TIMEOUT_S, max_samples=1,
                   variants=("function",))
    summary = execute_run(spec, db)
    with Store.open(db) as st:
        rows = list(st.db.query("select * from op_results"))
        run = st.get_run(summary.run_id)
    return rows, run


def _statuses(rows, op, dtype=None):
    return {r["status"] for r in rows if r["op"] == op and (dtype is None or r["dtype"] == dtype)}


def test_wrong_result_is_mismatch_only_for_its_dtype(defect_run):
    rows, _ = defect_run
    assert _statuses(rows, "mul", "bfloat16") == {"mismatch"}
    assert _statuses(rows, "mul", "float32") <= {"pass", "pass_fallback"}


def test_crash_is_recorded_and_the_rest_is_unaffected(defect_run):
    rows, _ = defect_run
    crashes = [r for r in rows if r["op"] == "neg"]
    assert crashes and {r["status"] for r in crashes} == {"crash"}
    assert "SIGABRT" in crashes[0]["error"]
    assert _statuses(rows, "sub") <= {"pass", "pass_fallback"}


def test_hang_is_timeout(defect_run):
    rows, _ = defect_run
    assert _statuses(rows, "reciprocal") == {"timeout"}


def test_fallback_op_is_pass_fallback(defect_run):
    rows, _ = defect_run
    add = [r for r in rows if r["op"] == "add"]
    assert {r["status"] for r in add} == {"pass_fallback"}
    assert all("aten::add.Tensor" in r["fallback_ops"] for r in add)


def test_run_is_finished_and_rows_unique(defect_run):
    rows, run = defect_run
    assert run["status"] == "finished"
    keys = [r["item_key"] for r in rows]
    assert len(keys) == len(set(keys))
