"""Contract ``errors`` on schema-search items (the inputs the CPU rejects during the search must
raise on the target too) carries what an OpInfo item's does: the detail in the OpInfo check's
words (so one bug is one cause whichever kind of item meets it), every input that failed it, the
input itself stored as the row's ``inputs`` (replayed from the corpus), and a ``conformance
repro`` script that fails while the target still accepts that input. Shown on a seeded build
whose ``_add_relu`` (reached only by the schema search) returns zeros where the CPU raises."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import pytest
import torch
from click.testing import CliRunner

from conformance.cli import main
from conformance.sweep import schema as search
from conformance.sweep.opinfo import SweepConfig
from conformance.sweep.schema.rows import NO_REJECTED
from conformance.targets import get_target
from conformance.triage.signature import op_signature
from conformance.work import Group, Skip
from opdb import Store
from opdb.blobs import load_inputs
from opdb.corpus import corpus_entries

OP = "aten::_add_relu.Tensor"
GROUP = Group(OP, "any", "schema")
DEFECT = f"""
[build]
name = "accepts-invalid"
inherits = "2.33.0"
[ops]
native = ["{OP}"]
[[defects]]
op = "{OP}"
kind = "accepts_invalid"
"""


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    path = tmp_path_factory.mktemp("errors") / "accepts.toml"
    path.write_text(textwrap.dedent(DEFECT))
    return path


def _run(target, replay=None):
    side: list[dict] = []
    rows = list(search.run_schema_group(target, GROUP, SweepConfig(), skip=Skip(replay=replay), side=side))
    return rows[0], side[0]


@pytest.fixture(scope="module")
def found(manifest):
    return _run(get_target("neuron-emu", str(manifest)))


def test_the_failure_reads_as_the_opinfo_check_and_names_every_input(found):
    row, _ = found
    assert row["status"] == "contract" and row["contract_failed"] == "errors"
    detail = row["contracts"]["errors"]["detail"]
    # the OpInfo errors check's words (conformance.check.contracts.calls.check_errors), each input
    problems = re.findall(r"error input (\d+) \(([^)]*)\): the CPU raises (\w+Error: .*?); the target returns \[",
                          detail)
    assert problems and [int(k) for k, _, _ in problems] == sorted(int(k) for k, _, _ in problems)
    assert row["error"] == f"contract errors: {detail}"
    sig = op_signature(row)
    assert sig.kind == "contract:errors" and sig.pattern.startswith("error input <n> (")
    # the same bug met by an OpInfo item's check is the same cause
    # (other indices and shapes: what varies between the items of one cause)
    other = re.sub(r"error input \d+", "error input 3", re.sub(r"\[[\d,]*\]", "[7,2]", detail))
    opinfo = {**row, "op": "other", "contracts": json.dumps({"errors": {"outcome": "fail", "detail": other}})}
    assert op_signature(opinfo).key == sig.key


def test_the_rejected_input_is_the_rows_input_and_the_corpus_replays_it(found, manifest, monkeypatch):
    row, side = found
    saved = load_inputs(row["inputs"])
    assert saved["role"] == "rejected"
    # the row's signature (the op page's sample line) is that input's, the one the detail names first
    first_sig = re.match(r"error input \d+ \((.*?)\): the CPU raises", row["contracts"]["errors"]["detail"]).group(1)
    assert row["signature"] == first_sig
    shapes = [list(a.shape) for a in saved["args"] if isinstance(a, torch.Tensor)]
    assert all(f"[{','.join(map(str, s))}]" in first_sig for s in shapes if s)
    # replayed from the corpus without a search: the same row, the same input
    store = Store.memory()
    store.insert("schema_corpus", [side["entry"]], replace=True)
    entry = corpus_entries(store)[OP]
    monkeypatch.setattr(search, "_search", lambda *a, **k: pytest.fail("searched"))
    again, aside = _run(get_target("neuron-emu", str(manifest)), entry)
    assert aside == {"how": "replayed"} and again["status"] == "contract"
    assert again["contracts"]["errors"] == row["contracts"]["errors"]
    assert repr(load_inputs(again["inputs"])) == repr(saved)


def _db(tmp_path, name, build_spec, row):
    db = tmp_path / f"{name}.sqlite"
    with Store.open(db) as st:
        run = st.start_run(target="neuron-emu", build=name, torch_version=torch.__version__,
                           config={"seed": 0, "build_spec": str(build_spec)})
        st.insert("op_results", [{"run_id": run, "item_key": row["item_key"], "op": OP, "variant": "schema",
                                  "dtype": row["dtype"], "sample": 0, "status": row["status"], "error": row["error"],
                                  "contracts": row["contracts"], "contract_failed": row["contract_failed"],
                                  "inputs": row["inputs"], "atol": row["atol"], "rtol": row["rtol"]}])
        rid = next(iter(st.db.query("select id from op_results")))["id"]
    return db, rid


def _script(tmp_path, db, rid):
    r = CliRunner().invoke(main, ["repro", str(rid), "--db", str(db), "--out", str(tmp_path / db.stem)])
    assert r.exit_code == 0, r.output
    return subprocess.run([sys.executable, str(tmp_path / db.stem / f"repro_{rid}.py")], capture_output=True,
                          text=True, timeout=300)


def test_repro_reproduces_the_failure_and_passes_once_the_target_raises(found, manifest, tmp_path):
    """Before, a schema item failing only its errors contract kept no input ("a passing schema
    result keeps no input"): nothing to reproduce. Now its script runs the rejected input on both
    sides: on the seeded build the target returns (exit 1), on the clean build it raises (exit 0)."""
    row, _ = found
    db, rid = _db(tmp_path, "seeded", manifest, row)
    out = _script(tmp_path, db, rid)
    assert out.returncode == 1 and "CONTRACT FAILED: errors" in out.stdout, out.stdout + out.stderr
    assert re.search(r"^CPU: \w+Error: ", out.stdout, re.M) and "target: runs" in out.stdout
    db, rid = _db(tmp_path, "clean", "2.33.0", row)
    out = _script(tmp_path, db, rid)
    assert out.returncode == 0 and "CONTRACT FAILED" not in out.stdout, out.stdout + out.stderr
    assert re.search(r"^target: \w+Error: ", out.stdout, re.M)


def test_a_search_that_checked_no_rejected_input_says_so():
    """Not "the OpInfo has no error_inputs" (the first accepted input's own check): an overload
    has none; the search's own inputs are what the contract is checked on."""
    row = next(search.run_schema_group(get_target("cpu"), Group("aten::set_.source_Storage", "any", "schema"),
                                       SweepConfig()))
    assert row["contracts"]["errors"] == {"outcome": "n/a", "detail": NO_REJECTED}
