"""The ``reference`` variant (conformance/sweep/reference.py): an OpInfo's reference_inputs that its
sample_inputs lack, deduped by structure, keyed by their index within reference_inputs, decided as
function items; the rotating slice of OpInfos (--reference-inputs none|all|K/N), stored with the
run, kept by a resume, the night's in the nightly; the gate neither alarms on nor loses the items
a rotated slice leaves out."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from click.testing import CliRunner
from torch.testing._internal.opinfo.core import SampleInput

from conformance.check.ledger import Ledger
from conformance.check.verdict import Status
from conformance.cli import main
from conformance.gate.core import run_gate, selection
from conformance.gate.nightly import NightlySpec, sweep_parts, with_reference_slice
from conformance.gate.render import summary_lines
from conformance.inputs.opinfo import by_name, reference_only, samples, structure
from conformance.run.runner import execute_run
from conformance.run.spec import RunSpec
from conformance.select import (
    REFERENCE_NIGHTS,
    SelectionError,
    in_reference_slice,
    night_slice,
    parse_reference_slice,
    reference_hash,
)
from conformance.sweep.opinfo import SweepConfig, run_group
from conformance.targets import get_target
from conformance.work import Group
from opdb import Store

MVLGAMMA = "mvlgamma.mvlgamma_p_1"
BOTH = SweepConfig(variants=("function", "reference"), reference_inputs="all")


def _fake_info(sample_fn, reference_fn):
    return SimpleNamespace(sample_inputs_func=sample_fn, reference_inputs_func=reference_fn, name="fake",
                           variant_test_name="")


def test_reference_only_dedupes_by_structure_never_by_values():
    def sample_fn(info, device, dtype, requires_grad):
        yield SampleInput(torch.rand(3, 4), args=(1,))
        yield SampleInput(torch.rand(2), kwargs={"alpha": 2})

    def reference_fn(info, device, dtype, requires_grad):
        yield from sample_fn(info, device, dtype, requires_grad)          # 0, 1: the samples again
        yield SampleInput(torch.full((3, 4), float("inf")), args=(1,))    # 2: new values only: a sample's
        yield SampleInput(torch.rand(4, 3).t(), args=(1,))                # 3: other strides
        yield SampleInput(torch.rand(3, 4), args=(2,))                    # 4: another argument
        yield SampleInput(torch.rand(2), kwargs={"alpha": 3})             # 5: another keyword value
        yield SampleInput(torch.rand(2, dtype=torch.float64), kwargs={"alpha": 2})  # 6: another dtype
        yield SampleInput(torch.rand(5))                                  # 7: another shape

    info = _fake_info(sample_fn, reference_fn)
    assert [i for i, _ in reference_only(info, torch.float32)] == [3, 4, 5, 6, 7]
    assert list(reference_only(_fake_info(sample_fn, None), torch.float32)) == []  # no reference_inputs of its own
    a, b = SampleInput(torch.rand(4, 3).t(), args=(1,)), SampleInput(torch.zeros(4, 3).t(), args=(1,))
    assert structure(a) == structure(b) != structure(SampleInput(torch.rand(3, 4), args=(1,)))


def test_the_variant_runs_the_reference_inputs_the_samples_lack_keyed_by_their_index():
    info = by_name()[MVLGAMMA]
    rows = list(run_group(get_target("cpu"), Group(MVLGAMMA, "float32"), BOTH))
    ref = [r for r in rows if r["variant"] == "reference"]
    wanted = [i for i, _ in reference_only(info, torch.float32)]
    assert [r["sample"] for r in ref] == wanted and [r["item_key"] for r in ref][:1] == [f"{MVLGAMMA}|reference|float32|10"]
    assert {r["variant"] for r in rows} == {"function", "reference"}
    kept = {structure(s) for s in samples(info, torch.float32)}
    everything = list(samples(info, torch.float32, thorough=True))
    assert len(everything) > len(wanted) + len(kept)  # some reference inputs were the samples' structures
    assert not {structure(everything[i]) for i in wanted} & kept
    assert {i for i, s in enumerate(everything) if structure(s) not in kept} == set(wanted)  # none lost
    # decided as function items: the CPU's values, the function variant's tolerance, metadata only
    assert {r["status"] for r in ref} == {"pass"} and {r["comparator"] for r in ref} == {"allclose"}
    assert {tuple(r["contracts"] or ()) for r in ref} <= {("metadata",), ()}


def test_a_reference_item_fails_on_2_33_0_where_the_samples_pass():
    """mvlgamma's reference input 52 (an expanded, permuted f32[9,5,2]) is in no sample: on build
    2.33.0 its kernel refuses the channels_last-like layout, while every sample passes. (PyTorch's
    test_compare_cpu passes it: the runtime it runs under recovers the failed kernel on the CPU.)"""
    rows = list(run_group(get_target("neuron-emu", "2.33.0"), Group(MVLGAMMA, "float32"), BOTH))
    function = [r for r in rows if r["variant"] == "function"]
    failing = {r["item_key"]: r["status"] for r in rows if not Status(r["status"]).passed}
    assert function and all(Status(r["status"]).passed for r in function)
    assert failing == {f"{MVLGAMMA}|reference|float32|52": Status.UNSUPPORTED_LAYOUT.value}
    plain = list(run_group(get_target("neuron-emu", "2.33.0"), Group(MVLGAMMA, "float32"), SweepConfig()))
    assert all(Status(r["status"]).passed for r in plain)  # without the variant: nothing fails


def test_a_slice_is_a_stable_subset_and_the_slices_cover_every_op():
    ops = sorted(by_name())
    assert reference_hash(MVLGAMMA) == 9191834152383323701  # sha256: the same in every process
    for n in (1, 3, REFERENCE_NIGHTS):
        parts = [{op for op in ops if in_reference_slice(op, f"{k}/{n}")} for k in range(n)]
        assert set().union(*parts) == set(ops) and sum(map(len, parts)) == len(ops)
        assert all(parts) and max(map(len, parts)) < 2 * len(ops) / n  # roughly even
    assert all(in_reference_slice(op, "all") and not in_reference_slice(op, "none") for op in ops[:5])
    start = dt.date(2026, 12, 6)
    nights = {night_slice(start + dt.timedelta(days=d)) for d in range(REFERENCE_NIGHTS)}
    assert nights == {f"{k}/{REFERENCE_NIGHTS}" for k in range(REFERENCE_NIGHTS)}
    assert night_slice(start) == night_slice(start + dt.timedelta(days=REFERENCE_NIGHTS))
    k = reference_hash(MVLGAMMA) % 5
    group, target = Group(MVLGAMMA, "float32"), get_target("cpu")
    for spec, has in ((f"{k}/5", True), (f"{(k + 1) % 5}/5", False)):
        config = SweepConfig(variants=("function", "reference"), reference_inputs=spec, max_samples=2)
        assert any(r["variant"] == "reference" for r in run_group(target, group, config)) is has


@pytest.mark.parametrize("value", ["7/7", "-1/3", "1/0", "x", "1/2/3", "auto"])
def test_a_bad_slice_is_one_clear_error(tmp_path, value):
    db = tmp_path / "r.sqlite"
    r = CliRunner().invoke(main, ["run", "--target", "cpu", "--ops", "abs", "--reference-inputs", value,
                                  "--db", str(db), "--quiet"])
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and "Traceback" not in r.output, r.output
    assert f"--reference-inputs {value!r}" in lines[0] and not db.exists()
    with pytest.raises(SelectionError, match="--reference-inputs"):
        NightlySpec(reference_inputs=value if value != "auto" else "sometimes")
    assert parse_reference_slice(" 3 / 7") == "3/7" and parse_reference_slice("ALL") == "all"


def test_the_slice_is_stored_a_resume_sweeps_the_stored_one_and_repro_rebuilds_its_input(tmp_path):
    db = tmp_path / "r.sqlite"
    k = reference_hash("clamp") % 4
    spec = RunSpec(target="cpu", ops=("clamp",), dtypes=("float32",), variants=("function", "reference"),
                   reference_inputs=f"{k}/4", max_samples=3, workers=1, run_id="r1", refcache="none")
    assert RunSpec(target="cpu").to_config().get("reference_inputs") is None  # not stored unless set
    assert spec.to_config()["reference_inputs"] == f"{k}/4" and spec.sweep_config().reference_inputs == f"{k}/4"
    execute_run(spec, db)
    with Store.open(db) as st:
        first = {r["item_key"] for r in st.db.query("select item_key from op_results where variant = 'reference'")}
        assert first == {f"clamp|reference|float32|{i}" for i in (7, 8, 9)}
        st.db.execute("delete from op_results where variant = 'reference'")
        st.finish_run("r1", status="interrupted")
    execute_run(spec.replace(reference_inputs="none"), db, resume="r1")  # this command's slice is not the run's
    with Store.open(db) as st:
        again = {r["item_key"] for r in st.db.query("select item_key from op_results where variant = 'reference'")}
        assert again == first and json.loads(st.get_run("r1")["config"])["reference_inputs"] == f"{k}/4"
        rid = next(iter(st.db.query("select id from op_results where item_key = 'clamp|reference|float32|7'")))["id"]
    # the repro rebuilds reference input 7 (clamp has 7 samples: no sample 7)
    r = CliRunner().invoke(main, ["repro", str(rid), "--db", str(db), "--out", str(tmp_path / "repro")])
    assert r.exit_code == 0, r.output
    out = subprocess.run([sys.executable, str(tmp_path / "repro" / f"repro_{rid}.py")], capture_output=True,
                         text=True, timeout=900)
    assert out.returncode == 0 and "within tolerance" in out.stdout, out.stdout + out.stderr


def test_the_nightly_sweeps_the_nights_slice_and_a_resume_keeps_the_one_it_started_with():
    st = Store.memory()
    spec = NightlySpec(run=RunSpec(ops=("abs",), dtypes=("float32",)), builds=("2.33.0",), run_id_prefix="n",
                       reference_inputs="auto")
    tonight = with_reference_slice(spec, st, resume=False)
    assert tonight.run.reference_inputs == night_slice() and tonight.run_for(tonight.builds[0]).reference_inputs \
        == night_slice()
    assert f"reference inputs {night_slice()}" in sweep_parts(tonight.run)
    k = int(night_slice().split("/")[0])
    other = f"{(k + 1) % REFERENCE_NIGHTS}/{REFERENCE_NIGHTS}"  # another night's
    st.start_run(target="neuron-emu", build="2.33.0", torch_version="t", run_id="n-2.33.0",
                 config=RunSpec(ops=("abs",), dtypes=("float32",), reference_inputs=other).to_config())
    assert with_reference_slice(spec, st, resume=True).run.reference_inputs == other  # started on another night
    assert with_reference_slice(NightlySpec(reference_inputs="all"), st, resume=False).run.reference_inputs == "all"
    assert with_reference_slice(NightlySpec(), st, resume=False) == NightlySpec()  # a spec of its own: as it is
    assert sweep_parts(RunSpec(ops=("abs",))) == ["OpInfo sweep"]
    option = next(p for p in main.commands["nightly"].params if p.name == "reference_inputs")
    assert option.default == "auto" and f"N = {REFERENCE_NIGHTS}, so every OpInfo's within {REFERENCE_NIGHTS} " \
        "nights" in option.help  # the help names the constant (the CLI does not import torch to say it)


def _stored(st: Store, rid: str, config: dict, items: dict[str, str]) -> None:
    st.start_run(target="neuron-emu", build=rid, torch_version="2.13", run_id=rid,
                 config={"ops": ["exp", "sin"], "dtypes": ["float32"], "seed": 0, **config})
    st.insert("op_results", [{"run_id": rid, "item_key": k, "op": k.split("|")[0], "variant": k.split("|")[1],
                              "dtype": "float32", "sample": int(k.split("|")[3]), "status": s, "duration_s": 0.01,
                              "max_rel_err": 0.0} for k, s in items.items()])
    st.finish_run(rid)


def test_the_gate_compares_reference_items_where_both_slices_hold_them():
    n = next(n for n in range(2, 50) if reference_hash("exp") % n != reference_hash("sin") % n)
    mine = f"{reference_hash('exp') % n}/{n}"  # exp's slice, not sin's
    both = ["function", "reference"]
    items = lambda op, v, idx, s="pass": {f"{op}|{v}|float32|{i}": s for i in idx}  # noqa: E731
    st = Store.memory()
    _stored(st, "base", {"variants": both, "reference_inputs": "all"},
            {**items("exp", "function", [0]), **items("sin", "function", [0]), **items("exp", "reference", [3, 4, 5]),
             **items("sin", "reference", [1, 2])})
    _stored(st, "cand", {"variants": both, "reference_inputs": mine},
            {**items("exp", "function", [0]), **items("sin", "function", [0]), **items("exp", "reference", [3, 4]),
             **items("exp", "reference", [9], "mismatch")})
    assert selection(st.get_run("base")) == selection(st.get_run("cand"))  # the slice is no part of it
    result = run_gate(st, "base", "cand", attempts=0)
    got = {(f.category, f.item_key) for f in result.findings}
    # sin's reference items are outside the candidate's slice: neither removed nor compared; exp's
    # item 5 is in it and went missing, item 9 is new: said, as for any other item
    assert got == {("removed", "exp|reference|float32|5"), ("new", "exp|reference|float32|9")}
    assert result.outside_slice == 2 and result.as_json()["reference_outside_slice"] == 2
    assert any("2 items not in both runs' slices of reference inputs" in line for line in summary_lines(result))
    # a run stored before the variant existed (variants without it, no slice) gates against one with it
    _stored(st, "old", {"variants": ["function"]}, {**items("exp", "function", [0]), **items("sin", "function", [0])})
    result = run_gate(st, "old", "cand", attempts=0)
    assert result.outside_slice == 3 and not [f for f in result.findings if f.variant == "reference"]


def test_ledger_entries_of_the_function_variant_cover_reference_items():
    led = Ledger.from_toml('[[override]]\nop = "clamp"\nvariant = "function"\natol = 0.5\nrtol = 0.5\nreason = "r"\n'
                           '[[xfail]]\nop = "clamp"\nvariant = "reference"\nreason = "x"\n', source="l.toml")
    assert led.tolerance("clamp", "reference", "float32", "cpu").atol == 0.5
    assert led.expected_failure("clamp", "reference", "float32", "cpu") is not None
    assert led.expected_failure("clamp", "function", "float32", "cpu") is None  # a reference entry is its own
