"""Upstream expectations as data (PyTorch's Inductor CPU expected failures and skips), their
validated loader, the triage against a run, and the ``conformance upstream`` command."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from conformance.cli import main
from conformance.datafiles import DataFileError
from conformance.triage import upstream
from opdb import Store

NEWEST_F32 = {"_upsample_bilinear2d_aa", "cholesky", "linalg.ldl_factor", "multinomial", "nonzero_static", "normal",
              "normal.in_place", "normal.number_mean", "resize_", "resize_as_", "sparse.mm.reduce",
              "sparse.sampled_addmm", "to_sparse"}


def test_shipped_expectations_load_with_their_sources():
    facts = upstream.expectations()
    newest = {e.op: e for e in facts if e.source.name == "newest" and e.dtype == "float32"}
    assert set(newest) == NEWEST_F32
    assert newest["linalg.ldl_factor"].expectation == "skip" and newest["cholesky"].expectation == "xfail"
    assert str(newest["cholesky"].source).endswith(" test/inductor/test_torchinductor_opinfo.py")
    assert all(e.device == "cpu" for e in facts)
    # the late-2023 list issue #17 first checked: 17 expected failures in float32
    late = [e for e in facts if e.source.name == "late2023" and e.dtype == "float32" and e.expectation == "xfail"]
    assert len(late) == 17
    assert {k[0] for k in upstream.checked()} == {"newest", "late2023", "onnxscript"}
    # ONNX Script's list: float32 facts of the full-graph test, some of matched samples only
    onnx = {e.op: e for e in facts if e.source.name == "onnxscript"}
    assert {e.dtype for e in onnx.values()} == {"float32"} and len(onnx) == 79
    assert onnx["scatter_add"].samples == "some" and onnx["special.erfcx"].samples == "all"
    assert onnx["div.no_rounding_mode"].expectation == "skip"  # a name upstream copied from div's OpInfo
    assert upstream.checked()[("onnxscript", "special.erfcx", "float32")].outcome == "holds"


FACTS = """[source.s]
repo = "o/r"
commit = "0123456789abcdef0123456789abcdef01234567"
path = "t.py"
"""


@pytest.mark.parametrize(("text", "names"), [
    (FACTS + '[[xfail]]\nsource = "x"\ndevice = "cpu"\nops = ["a"]\ndtypes = ["float32"]\n', ["xfail[0].source", "'x'"]),
    (FACTS + '[[xfail]]\nsource = "s"\ndevice = "cpu"\nops = ["a"]\ndtypes = ["f32"]\n', ["xfail[0].dtypes", "'f32'"]),
    (FACTS + '[[xfail]]\nsource = "s"\ndevice = "tpu"\nops = ["a"]\ndtypes = ["float32"]\n', ["xfail[0].device", "tpu"]),
    (FACTS + '[[xfail]]\nsource = "s"\ndevice = "cpu"\nops = ["a", "a"]\ndtypes = ["float32"]\n',
     ["xfail[0].ops", "listed twice"]),
    (FACTS + '[[xfail]]\nsource = "s"\ndevice = "cpu"\nops = []\ndtypes = ["float32"]\n', ["xfail[0].ops", "[]"]),
    (FACTS + '[[xfails]]\nsource = "s"\n', ["xfails"]),
    (FACTS.replace("0123456789abcdef0123456789abcdef01234567", "abc123"), ["source.s.commit", "abc123"]),
    (FACTS.replace('path = "t.py"\n', ""), ["source.s.path is missing"]),
    (FACTS + '[[xfail]]\nsource = "s"\ndevice = "cpu"\nops = ["a"]\ndtypes = ["float32"]\nsamples = "few"\n',
     ["xfail[0].samples", "'few'"]),
    (FACTS + 'targets = "inductor"\n', ["source.s.targets", "'inductor'"]),
    (FACTS + 'variants = "function"\n', ["source.s.variants", "'function'"]),
    (FACTS + '[[xfail]]\nsource = "s"\ndevice = "cpu"\nops = ["a"]\ndtypes = ["float32"]\nmatchers = ["x > 0"]\n',
     ["xfail[0].matchers", 'samples = "some"']),
    (FACTS + '[[xfail]]\nsource = "s"\ndevice = "cpu"\nops = ["a"]\ndtypes = ["float32"]\nsamples = "some"\n'
     'matchers = ["sample.input.dim( == 0"]\n', ["xfail[0].matchers", "'sample.input.dim( == 0'", "expression"]),
    (FACTS + '[[xfail]]\nsource = "s"\ndevice = "cpu"\nops = ["a"]\ndtypes = ["float32"]\nsamples = "some"\n'
     'matchers = "len(sample.args) > 1"\n', ["xfail[0].matchers", "non-empty list"]),
])
def test_bad_expectations_are_one_error_naming_file_key_and_value(tmp_path, text, names):
    path = tmp_path / "u.toml"
    path.write_text(text)
    with pytest.raises(DataFileError) as exc:
        upstream.expectations(path)
    msg = str(exc.value)
    assert msg.startswith(f"{path}:") and "\n" not in msg and all(n in msg for n in names), msg


def test_a_source_name_is_one_list_across_files(tmp_path):
    a, b = tmp_path / "a.toml", tmp_path / "b.toml"
    a.write_text(FACTS + '[[xfail]]\nsource = "s"\ndevice = "cpu"\nops = ["a"]\ndtypes = ["float32"]\n')
    b.write_text(FACTS + '[[skip]]\nsource = "s"\ndevice = "cpu"\nops = ["b"]\ndtypes = ["float32"]\n')
    with pytest.raises(DataFileError) as exc:
        upstream.expectations((a, b))
    assert str(exc.value).startswith(f"{b}: source.s") and str(a) in str(exc.value)
    one = upstream.expectations((a,))
    assert [(e.op, e.samples, e.source.targets) for e in one] == [("a", "all", ())]


def test_a_runs_default_list_is_the_first_about_its_target():
    assert upstream.default_source("inductor") == upstream.default_source("inductor-strict") == "newest"
    assert upstream.default_source("onnxruntime") == "onnxscript"
    onnx = upstream.sources()["onnxscript"]
    assert onnx.repo == "microsoft/onnxscript" and onnx.path == "tests/function_libs/torch_lib/ops_test_data.py"
    with pytest.raises(DataFileError, match=r"no upstream list is about target 'openvino'.*newest \(inductor"):
        upstream.default_source("openvino")


@pytest.mark.parametrize(("text", "names"), [
    ('[[check]]\nsource = "newest"\nops = ["cholesky"]\ndtype = "float32"\noutcome = "gone"\nreason = "r"\n'
     'evidence = "e"\n', ["check[0].outcome", "'gone'"]),
    ('[[check]]\nsource = "newest"\nops = ["abs"]\ndtype = "float32"\noutcome = "stale"\nreason = "r"\n'
     'evidence = "e"\n', ["check[0].ops", "'abs'"]),
    ('[[check]]\nsource = "newest"\nops = ["cholesky"]\ndtype = "float32"\noutcome = "stale"\nreason = ""\n'
     'evidence = "e"\n', ["check[0].reason", "''"]),
    ('[[check]]\nsource = "newest"\nops = ["cholesky"]\ndtype = "float32"\noutcome = "holds"\nreason = "r"\n'
     'evidence = "e"\nchecked_on = "some"\n', ["check[0].checked_on", "'some'", "every, matched"]),
    # the shipped list records no matchers for scatter_add: no check can have run only its matched samples
    ('[[check]]\nsource = "onnxscript"\nops = ["scatter_add"]\ndtype = "float32"\noutcome = "holds"\nreason = "r"\n'
     'evidence = "e"\nchecked_on = "matched"\n', ["check[0].checked_on", "'matched'", "no matchers"]),
])
def test_bad_triage_notes_are_one_error(tmp_path, text, names):
    path = tmp_path / "t.toml"
    path.write_text(text)
    with pytest.raises(DataFileError) as exc:
        upstream.checked(path)
    msg = str(exc.value)
    assert msg.startswith(f"{path}:") and all(n in msg for n in names), msg


def test_triage_outcomes_and_recall():
    pairs = {("sparse.sampled_addmm", "float32"): {"pass": 10, "mismatch": 1},   # re-found
             ("to_sparse", "float32"): {"error": 2},                  # re-found
             ("multinomial", "float32"): {"error": 7},                # stale: a failure here has another cause
             ("cholesky", "float32"): {"pass": 16},                   # untestable (implicit_fallbacks=False only)
             ("abs", "float32"): {"mismatch": 3},                     # a finding upstream does not list
             ("abs", "float64"): {"pass": 3}}
    rows = {r.op: r for r in upstream.triage(pairs, source="newest", dtype="float32")}
    assert set(rows) == NEWEST_F32
    assert rows["sparse.sampled_addmm"].outcome == rows["to_sparse"].outcome == "re-found"
    assert rows["multinomial"].outcome == "stale" and rows["multinomial"].statuses == {"error": 7}
    assert rows["cholesky"].outcome == "untestable" and "implicit_fallbacks=False" in rows["cholesky"].why
    assert rows["resize_"].outcome == "not swept"
    found, of = upstream.recall(rows.values())
    assert found == 2 and of == sum(r.outcome not in ("stale", "not swept") for r in rows.values())
    assert upstream.unknown_findings(pairs, source="newest") == [("abs", "float32", {"mismatch": 3})]
    assert upstream.checked()[("newest", "to_sparse", "float32")].outcome == "holds"
    with pytest.raises(DataFileError, match="no source 'nope'"):
        upstream.triage(pairs, source="nope")


def test_a_note_scoped_to_a_target_leaves_other_targets_to_their_statuses():
    """'Missing lowering' failures are untestable on the inductor target (implicit fallbacks
    on), and re-found or missed by the statuses of an inductor-strict run."""
    pairs = {("cholesky", "float32"): {"error": 4}, ("normal", "float32"): {"pass": 3}}
    on = {r.op: r for r in upstream.triage(pairs, source="newest", dtype="float32", target="inductor")}
    assert on["cholesky"].outcome == on["normal"].outcome == "untestable"
    strict = {r.op: r for r in upstream.triage(pairs, source="newest", dtype="float32", target="inductor-strict")}
    assert strict["cholesky"].outcome == "re-found" and strict["normal"].outcome == "missed"
    assert strict["multinomial"].outcome == "stale"  # unscoped notes hold for every target
    assert upstream.checked()[("newest", "cholesky", "float32")].targets == ("inductor",)


def test_bad_note_targets_are_one_error(tmp_path):
    path = tmp_path / "t.toml"
    path.write_text('[[check]]\nsource = "newest"\nops = ["cholesky"]\ndtype = "float32"\noutcome = "untestable"\n'
                    'reason = "r"\nevidence = "e"\ntargets = "inductor"\n')
    with pytest.raises(DataFileError, match=r"check\[0\]\.targets.*'inductor'"):
        upstream.checked(path)


def _db(tmp_path):
    path = tmp_path / "u.sqlite"
    with Store.open(path) as st:
        run = st.start_run(target="inductor", build="inductor", torch_version="2.13.0", config={}, run_id="r1")
        rows = [("sparse.sampled_addmm", "mismatch"), ("sparse.sampled_addmm", "pass"), ("to_sparse", "error"),
                ("abs", "mismatch"), ("multinomial", "pass")]
        st.insert("op_results", [{"run_id": run, "item_key": f"{op}|function|float32|{i}", "op": op,
                                  "variant": "function", "dtype": "float32", "sample": i, "status": status}
                                 for i, (op, status) in enumerate(rows)])
        st.finish_run(run)
    return path


def test_upstream_command_lists_refound_and_unknown_findings(tmp_path):
    db = _db(tmp_path)
    r = CliRunner().invoke(main, ["upstream", "--db", str(db), "--run", "r1"])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0].startswith("run r1 (inductor) against r266-tech/pytorch@332bcc3")
    assert "re-found (2):" in lines
    assert any(line.split()[:5] == ["sparse.sampled_addmm", "upstream", "xfail", "harness:", "1"] for line in lines)
    assert "harness findings upstream does not list (1):" in lines and lines[-1].split() == ["abs", "1", "mismatch"]
    assert any(line.startswith("recall of upstream-known failures among the swept ops: 2/") for line in lines)
    out = json.loads(CliRunner().invoke(main, ["upstream", "--db", str(db), "--run", "r1", "--json"]).output)
    assert out["recall"]["re_found"] == 2 and out["unknown_to_upstream"] == [
        {"op": "abs", "dtype": "float32", "statuses": {"mismatch": 1}}]
    bad = CliRunner().invoke(main, ["upstream", "--db", str(db), "--run", "nope"])
    assert bad.exit_code == 2 and "no run 'nope'" in bad.output


def test_an_onnxruntime_run_is_triaged_against_onnx_scripts_list(tmp_path):
    """A run of --target onnxruntime gets ONNX Script's list by default; an entry upstream
    expects of some samples only says so."""
    path = tmp_path / "o.sqlite"
    with Store.open(path) as st:
        run = st.start_run(target="onnxruntime", build="onnxruntime", torch_version="2.13.0", config={},
                           run_id="o1")
        rows = [("scatter_add", "function", "mismatch"), ("scatter_add", "function", "pass"),
                ("special.erfcx", "function", "pass"), ("abs", "function", "error"),
                ("special.erfcx", "backward", "unsupported")]  # inference only: no gradients to run
        st.insert("op_results", [{"run_id": run, "item_key": f"{op}|{variant}|float32|{i}", "op": op,
                                  "variant": variant, "dtype": "float32", "sample": i, "status": status}
                                 for i, (op, variant, status) in enumerate(rows)])
        st.finish_run(run)
    r = CliRunner().invoke(main, ["upstream", "--db", str(path), "--run", "o1"])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0].startswith("run o1 (onnxruntime) against microsoft/onnxscript@86e57ef")
    assert "(statuses of function items)" in lines[0]
    scatter = next(line for line in lines if line.split()[:1] == ["scatter_add"])
    assert scatter.split()[1:6] == ["upstream", "xfail", "(some", "samples)", "harness:"]
    assert "; standalone: holds on some sample - standalone sample 6:" in scatter  # no claim on upstream's samples
    assert lines[-2:] == ["harness findings upstream does not list (1):", lines[-1]]
    assert lines[-1].split() == ["abs", "1", "error"]
    out = json.loads(CliRunner().invoke(main, ["upstream", "--db", str(path), "--run", "o1", "--json"]).output)
    rows = {r["op"]: r for r in out["triage"]}
    assert rows["scatter_add"]["samples"] == "some" and rows["scatter_add"]["outcome"] == "re-found"
    assert rows["special.erfcx"]["samples"] == "all"
    assert rows["scatter_add"]["standalone"] == "holds on some sample" and rows["special.erfcx"]["standalone"] == "holds"
    # it still fails standalone; the run passed its forward sample (a refused backward re-finds nothing)
    assert rows["special.erfcx"]["outcome"] == "missed" and rows["special.erfcx"]["statuses"] == {"pass": 1}
    assert out["variants"] == ["function"]
    inductor = CliRunner().invoke(main, ["upstream", "--db", str(path), "--run", "o1", "--source", "newest"])
    assert inductor.exit_code == 0 and "against r266-tech/pytorch" in inductor.output


def test_a_fact_of_some_samples_claims_no_more_than_its_check_ran():
    """ONNX Script skips ``all`` of the samples its matcher picks; the stored list records no
    matcher, so the standalone check ran every sample and its failure (a rank-0 input, sample 1)
    may be another sample's: shown "holds on some sample", never as holding on upstream's."""
    rows = {r.op: r for r in upstream.triage({("all", "float32"): {"pass": 3}}, source="onnxscript", dtype="float32")}
    assert rows["all"].samples == "some" and rows["all"].standalone == "holds on some sample"
    assert rows["special.erfcx"].samples == "all" and rows["special.erfcx"].standalone == "holds"
    assert rows["addmm.decomposed"].standalone == "stale"  # every sample passed: the matched ones too
    facts = {e.op: e for e in upstream.expectations() if e.source.name == "onnxscript"}
    assert not any(e.matchers for e in facts.values())  # what the shipped list can say of its samples
    assert all(n.checked_on == "every" for n in upstream.checked().values())
    assert upstream.claim(facts["all"], "holds", "matched") == "holds on the matched samples"
    assert upstream.claim(facts["all"], "untestable") == "untestable"
    assert upstream.sample_picker(facts["all"]) is None and upstream.sample_picker(facts["special.erfcx"]) is None


def test_the_standalone_check_runs_the_samples_a_facts_matchers_pick(capsys):
    """tools/upstream_check_common: a fact of some samples with matchers is checked on the
    samples they pick only, so "holds" comes from one of them; without matchers every sample
    runs and the line says "holds on some sample". A fake check fails as ONNX Runtime did on
    ``all`` (a rank-0 input reduced over a dim)."""
    import dataclasses
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    import torch
    import upstream_check_common as common

    def check(fn, sample):  # noqa: ANN001, ANN202
        rank0 = sample.input.dim() == 0 and isinstance(sample.kwargs.get("dim"), int)
        return "axis must be in [-rank, rank-1]. Input rank was 0" if rank0 else ""

    (shipped,) = common.listed_facts("onnxscript", "float32", ["all"])
    tuples = dataclasses.replace(shipped, matchers=("isinstance(sample.kwargs.get('dim'), tuple)",))
    rank0 = dataclasses.replace(shipped, matchers=("sample.input.dim() == 0 and 'dim' in sample.kwargs",
                                                   "sample.args[5]"))  # raises on every sample: picks none
    nothing = dataclasses.replace(shipped, matchers=("sample.input.dim() > 8",))
    every = common.check_op("all", torch.float32, check, None, picks=upstream.sample_picker(shipped))
    assert every[:3] == ("holds", "sample 1: axis must be in [-rank, rank-1]. Input rank was 0", 2)
    assert every.checked_on == "every" and upstream.claim(shipped, every.outcome, every.checked_on) == \
        "holds on some sample"
    matched = common.check_op("all", torch.float32, check, None, picks=upstream.sample_picker(tuples))
    assert (matched.outcome, matched.checked_on, matched.samples, matched.passed_over) == ("stale", "matched", 7, 13)
    held = common.check_op("all", torch.float32, check, None, picks=upstream.sample_picker(rank0))
    assert held[:3] == ("holds", "sample 1: axis must be in [-rank, rank-1]. Input rank was 0", 1)
    assert upstream.claim(rank0, held.outcome, held.checked_on) == "holds on the matched samples"
    none = common.check_op("all", torch.float32, check, None, picks=upstream.sample_picker(nothing))
    assert none.outcome == "absent" and "none of its 20 samples" in none.why
    common.run([shipped, tuples], torch.float32, check, None)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:5] == ["all", "holds", "on", "some", "sample"] and "2 all samples" in lines[0]
    assert lines[1].split()[:2] == ["all", "stale"] and "7 matched samples" in lines[1]


ONNX_DATA = '''
TESTED_TORCHLIB_OPS: tuple[TorchLibOpInfo, ...] = (
    TorchLibOpInfo("abs", core_ops.aten_abs),
    TorchLibOpInfo("abs", core_ops.aten_abs_complex, complex=True).xfail(reason="complex only"),
    TorchLibOpInfo("addmm", core_ops.aten_addmm)
    .xfail(dtypes=(torch.int64,), reason="int Gemm")
    .xfail("decomposed", matcher=lambda sample: torch.numel(sample.input) == 0, reason="zero sized"),
    TorchLibOpInfo("all_dim", core_ops.aten_all_dim).skip(
        matcher=lambda sample: not sample.kwargs, reason="one " "overload"
    ),
    TorchLibOpInfo("all", core_ops.aten_all).xfail(reason="rank 0"),
    TorchLibOpInfo("any_dim", core_ops.aten_any_dim).skip(reason="a copy's entry without a matcher"),
    TorchLibOpInfo("cat", core_ops.aten_cat).skip(matcher=lambda s: s.input[0].numel() == 0, reason="empty")
    .xfail(matcher=lambda sample: len(sample.args) > 1, reason="dim given"),
    TorchLibOpInfo("relu6", nn_ops.aten_relu6).xfail(reason="eager only", test_class_name="TestOutputConsistencyEager"),
    TorchLibOpInfo("gelu", nn_ops.aten_gelu).xfail(reason="old ort", enabled_if=version_utils.onnxruntime_older_than("1.17"))
    .skip(reason="new torch", enabled_if=not version_utils.torch_older_than("2.4"), dtypes=(torch.float32,))
    .xfail(reason="cuda", device_type="cuda"),
)
ops_test_common.duplicate_opinfo(OPS_DB, "all", ("all_dim", "all_dims"))
ops_test_common.duplicate_opinfo(OPS_DB, "any", ("any_dim",))
'''


def test_onnx_scripts_test_data_becomes_float32_facts_of_the_export_path():
    """The converter behind upstream_onnxruntime.toml: the full-graph test's entries whose
    enabled_if holds here, in float32, named by the OpInfo (a copy upstream made is its original,
    of some samples), one fact per op with every reason."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    from upstream_onnx_facts import facts

    found, left = facts(ONNX_DATA, "2.13.0+cpu", "1.32.0")
    assert sorted(found) == ["addmm.decomposed", "all", "any", "cat", "gelu"]
    assert found["addmm.decomposed"].some and found["addmm.decomposed"].kinds == {"xfail"}
    # a fact of some samples keeps what picks them (its matchers' expressions of `sample`), when it can
    assert found["addmm.decomposed"].matchers == ["torch.numel(sample.input) == 0"]
    assert found["cat"].some and found["cat"].matchers == ["(lambda s: s.input[0].numel() == 0)(sample)",
                                                           "len(sample.args) > 1"]
    assert found["any"].some and found["any"].matchers is None  # a copy's entry says no more: every sample
    # all: its own entry covers every sample; all_dim's (a copy of all's OpInfo) adds a reason
    assert not found["all"].some and found["all"].kinds == {"xfail", "skip"}
    assert found["all"].reasons == ["[upstream all_dim] one overload", "rank 0"]
    assert found["gelu"].kinds == {"skip"} and found["gelu"].reasons == ["new torch"]
    assert left == {"eager test class only": 1, "cuda only": 1, "enabled_if false here": 1, "other dtypes": 1,
                    "complex functions": 1, "prims copies": 0}
    older, _ = facts(ONNX_DATA, "2.3.0", "1.16.0")  # the versions upstream's entries were written for
    assert older["gelu"].kinds == {"xfail"} and older["gelu"].reasons == ["old ort"]
