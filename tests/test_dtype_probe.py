"""The dtype probe (variant ``dtypes``, conformance.sweep.dtypes): which dtypes an op runs in on the
device against the CPU, forward and backward, claimed by the OpInfo or not; stored per run, shown on
the op page and marked in the matrix.

The defects are real: nn.functional.max_pool1d runs int64 on any PrivateUse1 device (its composite
takes max_pool1d_with_indices off the CPU) while the CPU's own kernel refuses it on some samples,
which PyTorch's TestCommon.test_dtypes fails on 2.33.0; a backward-only refusal is a seeded
emulator defect (tanh's backward kernel raises in float32, its forward runs); 2.33.0 holds no
sparse tensor, so to_sparse raises in every dtype there.
"""

from __future__ import annotations

import json
import re
import textwrap

import pytest

from conformance.gate.core import run_gate, selection
from conformance.gate.render import summary_lines
from conformance.run.runner import RunSpec, execute_run
from conformance.select import DTYPE_PROBE
from conformance.sweep.opinfo import OPINFO, SweepConfig, run_group
from conformance.work import Group, Selection
from opdb import Store
from reports import render_site

pytestmark = pytest.mark.xdist_group("dtype_probe")
TEXT = r'(?:[^"\\]|\\.)*'  # a JSON string's characters (escaped quotes included)

MANIFEST = """
[build]
name = "dtype-probe"
inherits = "2.33.0"

[[defects]]
op = "aten::tanh_backward.default"
dtypes = ["float32"]
kind = "error"
"""


@pytest.fixture(scope="module")
def probe_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("dtype_probe")
    (d / "b.toml").write_text(textwrap.dedent(MANIFEST))
    db = d / "r.sqlite"
    spec = RunSpec(target="neuron-emu", build=str(d / "b.toml"), ops=("nn.functional.max_pool1d", "tanh", "abs", "to_sparse"),
                   dtypes=("float32", "int64", "bool"), workers=1, variants=("function", DTYPE_PROBE),
                   max_samples=1)
    summary = execute_run(spec, db)
    with Store.open(db) as st:
        rows = {r["item_key"]: r for r in st.db.query("select * from op_results where variant = ?", [DTYPE_PROBE])}
    return db, summary.run_id, rows


def _probe(row):
    return json.loads(row["proof"])["dtypes"]


def test_the_variant_name_is_the_same_everywhere():
    from conformance.check.ledger import VARIANTS as LEDGER_VARIANTS
    from conformance.select import VARIANTS
    from opdb.queries_dtypes import DTYPE_PROBE as OPDB_NAME  # opdb imports nothing of the harness

    assert DTYPE_PROBE in VARIANTS and DTYPE_PROBE in LEDGER_VARIANTS and OPDB_NAME == DTYPE_PROBE


def test_groups_hold_the_probe_of_every_dtype_asked_for_claimed_or_not():
    # max_pool1d claims no integer dtype on the CPU: its int64 group holds the probe alone
    keys = [g.key for g in OPINFO.groups(Selection(ops=("nn.functional.max_pool1d",), dtypes=("float32", "int64")))]
    assert keys == ["nn.functional.max_pool1d|float32", "nn.functional.max_pool1d|int64"]
    # a run that does not ask for the probe plans no group for an unclaimed dtype
    assert [g.key for g in OPINFO.groups(Selection(ops=("nn.functional.max_pool1d",), dtypes=("float32", "int64"),
                                                   variants=("function",)))] == ["nn.functional.max_pool1d|float32"]


def test_the_probe_passes_on_the_ideal_build():
    from conformance.targets import get_target

    target = get_target("neuron-emu", "ideal")
    config = SweepConfig(variants=(DTYPE_PROBE,))
    rows = [r for d in ("float32", "bfloat16", "int64", "bool") for r in run_group(target, Group("tanh", d), config)]
    assert [r["item_key"] for r in rows] == [f"tanh|dtypes|{d}|0" for d in ("float32", "bfloat16", "int64", "bool")]
    assert {r["status"] for r in rows} == {"pass"}, [(r["item_key"], r["error"]) for r in rows]
    f32 = rows[0]["proof"]["dtypes"]  # as the worker yields it, before it is stored
    assert f32["claimed"] == {"forward": True, "backward": True}
    assert f32["cpu"] == f32["device"] == {"forward": "ok", "backward": "ok"}


def test_a_dtype_the_cpu_rejects_and_the_device_accepts_fails_naming_dtype_and_direction(probe_run):
    _, _, rows = probe_run
    row = rows["nn.functional.max_pool1d|dtypes|int64|0"]
    assert row["status"] == "contract"
    assert row["error"].startswith("the target accepts int64 forward where the CPU rejects it (sample 1: "
                                   "the CPU raises NotImplementedError"), row["error"]
    p = _probe(row)
    assert p["claimed"] == {"forward": False, "backward": False}
    assert p["cpu"]["forward"] == "mixed" and p["device"]["forward"] == "ok"
    # the claimed dtype agrees
    assert rows["nn.functional.max_pool1d|dtypes|float32|0"]["status"] == "pass"


def test_a_backward_only_refusal_is_caught(probe_run):
    _, _, rows = probe_run
    row = rows["tanh|dtypes|float32|0"]
    assert row["status"] == "unsupported_dtype"
    assert re.match(r"the target rejects float32 backward where the CPU runs it \(sample 0: the target raises ",
                    row["error"]), row["error"]
    p = _probe(row)
    assert p["cpu"] == {"forward": "ok", "backward": "ok"}
    assert p["device"] == {"forward": "ok", "backward": "raises"}


@pytest.mark.parametrize(("key", "said"), [
    ("nn.functional.max_pool1d|dtypes|int64|0", "MISMATCH: the target runs int64 function where the CPU raises"),
    ("tanh|dtypes|float32|0", "target raised: "),
])
def test_a_failing_probe_is_reproduced_by_a_standalone_script(probe_run, tmp_path, key, said):
    """``conformance repro`` of a probe item: the sample the sides first differed on, in that
    direction (max_pool1d's sample 1 forward, tanh's sample 0 backward); the script fails as the
    probe did (exit 1, in the words tools/findings_repro.py reads)."""
    import subprocess
    import sys

    from click.testing import CliRunner

    from conformance.cli import main

    db, _, rows = probe_run
    r = CliRunner().invoke(main, ["repro", str(rows[key]["id"]), "--db", str(db), "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    out = subprocess.run([sys.executable, str(tmp_path / f"repro_{rows[key]['id']}.py")], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 1 and said in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]


def test_a_device_that_refuses_a_layout_in_every_dtype_is_unsupported_layout(probe_run):
    # 2.33.0 holds no sparse tensor: to_sparse raises in every dtype, and that is no dtype finding
    _, _, rows = probe_run
    row = rows["to_sparse|dtypes|float32|0"]
    assert row["status"] == "unsupported_layout"
    assert "the target rejects float32 forward where the CPU runs it" in row["error"]
    assert "supports only strided tensors" in row["error"]


def test_a_dtype_both_sides_reject_passes_and_is_recorded_unclaimed(probe_run):
    _, _, rows = probe_run
    row = rows["abs|dtypes|bool|0"]
    assert row["status"] == "pass" and row["error"] is None
    p = _probe(row)
    assert p["claimed"]["forward"] is False and p["cpu"]["forward"] == p["device"]["forward"] == "raises"


def test_the_op_page_shows_the_dtype_table_and_the_matrix_marks_the_cell(probe_run, tmp_path):
    db, run_id, _ = probe_run
    with Store.open(db) as st:
        render_site(st, tmp_path)
    page = next(tmp_path.glob("*/ops/nn.functional.max_pool1d.html")).read_text()
    table = page[page.index('<section id="dtypes">'):]
    table = table[:table.index("</section>")]
    rows = dict(re.findall(r'<tr data-dtype="(\w+)" data-status="(\w+)"', table))
    assert rows == {"bool": "pass", "float32": "pass", "int64": "contract"}
    int64 = re.search(r'<tr data-dtype="int64".*?</tr>', table, re.S).group(0)
    assert "<td>no / no</td><td>mixed / n/a</td><td>ok / n/a</td>" in int64
    assert "accepts int64 forward where the CPU rejects it" in int64
    matrix = next(tmp_path.glob("*/matrix.html")).read_text()
    # the unclaimed int64 cell: no samples, the probe's status, its mark and a link to the table
    assert re.search(r'\["contract","int64: no samples \(the OpInfo does not claim it\); \\u2260 dtype probe contract: '
                     rf'{TEXT}",0,\["dtypes"\],"ops/nn\.functional\.max_pool1d\.html#dtypes","\\u2260"\]', matrix)
    # the claimed float32 cell of tanh: its sample's count with the mark
    assert re.search(rf'\["unsupported_dtype","float32: {TEXT}dtype probe unsupported_dtype{TEXT}",1,\["dtypes"\],'
                     r'"ops/tanh\.html#dtypes","1 \\u2260"\]', matrix)


def test_the_gate_compares_a_run_stored_before_the_probe_with_one_after():
    """A run stored before the dtype probe existed lists its variants without it: the gate neither
    refuses the pair nor calls the newer run's probe items new; it counts them apart and says so."""
    st = Store.memory()

    def stored(rid: str, variants: list[str], items: dict[str, str]) -> None:
        st.start_run(target="neuron-emu", build=rid, torch_version="2.13", run_id=rid,
                     config={"ops": ["exp"], "dtypes": ["float32", "int64"], "seed": 0, "variants": variants})
        st.insert("op_results", [{"run_id": rid, "item_key": k, "op": "exp", "variant": k.split("|")[1],
                                  "dtype": k.split("|")[2], "sample": 0, "status": v, "duration_s": 0.01,
                                  "max_rel_err": 0.0} for k, v in items.items()])
        st.finish_run(rid)

    stored("old", ["function"], {"exp|function|float32|0": "pass"})
    stored("new", ["function", DTYPE_PROBE], {"exp|function|float32|0": "pass", "exp|dtypes|float32|0": "pass",
                                              "exp|dtypes|int64|0": "contract"})
    assert selection(st.get_run("old")) == selection(st.get_run("new"))
    result = run_gate(st, "old", "new", attempts=0)
    assert not result.findings and result.unprobed == 2 and result.as_json()["dtypes_unprobed"] == 2
    assert any("2 probe items held by one run only" in line for line in summary_lines(result))
    # between two runs that both probe, a probe item that appears or goes is said, as any item
    stored("newer", ["function", DTYPE_PROBE], {"exp|function|float32|0": "pass", "exp|dtypes|float32|0": "pass"})
    result = run_gate(st, "new", "newer", attempts=0)
    assert {(f.category, f.item_key) for f in result.findings} == {("removed", "exp|dtypes|int64|0")}
    assert result.unprobed == 0
