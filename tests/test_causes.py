"""Error causes (conformance/triage): the normaliser's rules and their validation, signatures of
real stored messages, blame of a mismatch, computing and storing a run's causes (recomputed when
the rules change), the knowledge file, the ``errors`` command and the report's Top causes page."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from conformance.cli import main
from conformance.datafiles import DataFileError
from conformance.triage import causes as ca
from conformance.triage import knowledge as kn
from conformance.triage.signature import CAUSE_RULES, model_signature, normalise, op_signature, rules
from opdb import Store
from opdb import queries_causes as qc

# Real messages the sweeps stored (nightly of the shipped builds, schema lane, models), grouped:
# the messages of one group are one cause; two groups are never one.
SAME_CAUSE = [
    [("unsupported_layout", "NotImplementedError: Could not run 'aten::dense_dim.default' on the neuron device with "
      "sparse tensors: the neuron device of Neuron SDK build 2.33.0 supports only strided tensors"),
     ("unsupported_layout", "NotImplementedError: Could not run 'aten::_to_sparse.default' on the neuron device with "
      "sparse tensors: the neuron device of Neuron SDK build 2.31.0 supports only strided tensors")],
    [("unsupported_layout", "RuntimeError: neuron: channels_last inputs are not supported by "
      "aten::max_pool2d_with_indices.default on Neuron SDK build 2.33.0 (manifest rule dtypes.channels_last = 'error')"),
     ("unsupported_layout", "RuntimeError: neuron: channels_last inputs are not supported by aten::cat.default on "
      "Neuron SDK build 2.32.0 (manifest rule dtypes.channels_last = 'error')"),
     # a contract check that failed because the target raised the same: the same cause
     ("contract", "contract noncontiguous: channels_last inputs: on the target they raise RuntimeError: neuron: "
      "channels_last inputs are not supported by aten::index.Tensor on Neuron SDK build 2.33.0 (manifest rule "
      "dtypes.channels_last = 'error')")],
    [("unsupported_dtype", "NotImplementedError: \"avg_pool2d\" not implemented for 'Int'"),
     ("unsupported_dtype", "NotImplementedError: \"slow_conv_dilated<>\" not implemented for 'Int'"),
     ("unsupported_dtype", "minimal failing input after shrinking: b8[]; NotImplementedError: \"neg_cpu\" not "
      "implemented for 'Bool'")],
    [("error", "minimal failing input after shrinking: f32[1], f32[1], f32[1], f32[1]; RuntimeError: Expected scalars "
      "to be on CPU, got neuron:0 instead."),
     ("error", "minimal failing input after shrinking: f32[1], f32[1], f32[1], f32[1]; out=(f32[1]); RuntimeError: "
      "Expected scalars to be on CPU, got neuron:0 instead.")],
    [("error", "minimal failing input after shrinking: f32[], f32[]; memory_format=torch.contiguous_format, out=f32[0]; "
      "RuntimeError: high must be a scalar tensor and on CPU"),
     ("error", "minimal failing input after shrinking: f32[], f32[]; generator=None, dtype=torch.float32, "
      "layout=torch.strided, device=<device>, pin_memory=False, memory_format=torch.contiguous_format; RuntimeError: "
      "high must be a scalar tensor and on CPU")],
    [("error", "RuntimeError: neuron: internal compiler/runtime error in aten::upsample_nearest2d.default (injected "
      "defect 2.33.0.toml:defects[1] of Neuron SDK build 2.33.0: regression: NCC_EVRF009 unsupported bf16 resize in "
      "the new upsample kernel)"),
     ("error", "RuntimeError: neuron: internal compiler/runtime error in aten::upsample_nearest2d.vec (injected "
      "defect 2.34.0.toml:defects[1] of Neuron SDK build 2.34.0: regression: NCC_EVRF009 unsupported bf16 resize in "
      "the new upsample kernel)")],
    [("contract", "contract metadata: output 0 (strides [36, 1, 12, 2]) is rejected by the target's own ops: "
      "torch.eq(output, output) raises RuntimeError: neuron: channels_last inputs are not supported by "
      "aten::eq.Tensor on Neuron SDK build 2.33.0 (manifest rule dtypes.channels_last = 'error')"),
     ("unsupported_layout", "RuntimeError: neuron: channels_last inputs are not supported by aten::eq.Tensor on "
      "Neuron SDK build 2.30.0 (manifest rule dtypes.channels_last = 'error')"),
     ("contract", "contract metadata: output 0 (strides [36, 1, 12, 2]) is rejected by the target's own ops: "
      "torch.eq(output, output) raises RuntimeError: neuron: channels_last inputs are not supported by "
      "aten::eq.Tensor on Neuron SDK build 2.33.0 (manifest rule dtypes.channels_last = 'error')"),
     ("contract", "contract metadata: output 0 (strides [125, 1, 25, 5]) is rejected by the target's own ops: "
      "torch.eq(output, output) raises RuntimeError: neuron: channels_last inputs are not supported by "
      "aten::eq.Tensor on Neuron SDK build 2.31.0 (manifest rule dtypes.channels_last = 'error')")],
    [("error", "RuntimeError: Expected storage != nullptr to be true, but got false.  (Could this error message be "
      "improved?  If so, please report an enhancement request to PyTorch.)"),
     ("error", "minimal failing input after shrinking: f32[]; RuntimeError: Expected storage != nullptr to be true, "
      "but got false.  (Could this error message be improved?  If so, please report an enhancement request to "
      "PyTorch.)")],
]
# The same, from the other targets' stored runs (onnxruntime, openvino, inductor)
SAME_CAUSE += [
    [("unsupported", "TargetUnsupported: torch.onnx: DispatchError: No ONNX function found for "
      "<OpOverload(op='aten.special_zeta', overload='x_scalar')>. Failure message: No decompositions registered"),
     ("unsupported", "minimal failing input after shrinking: f32[2], 3; out=f32[0]; TargetUnsupported: torch.onnx: "
      "DispatchError: No ONNX function found for <OpOverload(op='prims.zeta', overload='default')>. Failure message: "
      "No decompositions registered")],
    [("error", "NotImplemented: [ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an implementation for "
      "Mul(14) node with name 'node_mul'"),
     ("error", "NotImplemented: [ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an implementation for "
      "Mul(13) node with name ''")],
    [("error", "AssertionError: sources must not be empty for symbol s96"),
     ("error", "AssertionError: sources must not be empty for symbol s7")],
]
APART = [
    ("error", "NotImplemented: [ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an implementation for "
     "Sub(14) node with name 'node_sub'"),
    ("error", "TargetError: backend 'inductor' failed to compile a graph: MissingOperatorWithoutDecomp: missing lowering"),
    ("error", "TargetError: backend 'inductor' failed to compile a graph: RuntimeError: expand: the requested shape has "
     "too few dimensions!"),
    ("error", "RuntimeError: tensor_split expected tensor_indices_or_sections to be on cpu, but it's on neuron:0"),
    ("error", "RuntimeError: invalid gradient at index 0 - expected device cpu but got neuron:0"),
    ("error", "RuntimeError: neuron: internal compiler/runtime error in aten::topk.default (injected defect "
     "2.32.0.toml:defects[0] of Neuron SDK build 2.32.0: NCC_ITOPK: intermittent sorting-network failure in float16)"),
    ("error", "minimal failing input after shrinking: i32[], 0.0, 0; RuntimeError: empty_strided not supported on "
     "quantized tensors yet see https://github.com/pytorch/pytorch/issues/74540"),
    ("error", "NotImplementedError: Could not run 'aten::_thnn_fused_lstm_cell' with arguments from the 'CPU' backend."),
]


def _row(status, error, **kw):
    row = {"status": status, "error": error, "op": kw.pop("op", "someop")}
    if status == "contract":
        row["contract_failed"] = error.split(":")[0].split()[-1]
    row.update(kw)
    return row


def test_every_rule_loads_and_changes_its_example():
    rx = rules()
    assert rx.strips and rx.replaces and len(rx.version) == 12


@pytest.mark.parametrize("group", SAME_CAUSE, ids=lambda g: g[0][1][:40])
def test_real_messages_of_one_cause_share_it(group):
    keys = {op_signature(_row(s, e)).key for s, e in group}
    assert len(keys) == 1, [op_signature(_row(s, e)).text() for s, e in group]


def test_different_causes_stay_apart():
    groups = [g for g in SAME_CAUSE if not g[0][1].startswith("contract metadata")]  # one cause with channels_last
    sigs = [op_signature(_row(s, e)) for s, e in APART] + [op_signature(_row(*g[0])) for g in groups]
    assert len({s.key for s in sigs}) == len(sigs), [s.text() for s in sigs]


def test_normalise_keeps_error_codes_and_drops_what_varies():
    text = normalise("RuntimeError: bad shape [2, 3] at 0x7f00aa in /usr/lib/x/torch/_ops.py:42 (NCC_EVRF009, 1.5e-3)")
    assert text == "RuntimeError: bad shape <shape> at <addr> in <path> (NCC_EVRF009, <n>)"
    assert normalise("a; a; b") == "a; b"  # a repeated clause is said once


def test_mismatch_signature_is_its_class_at_the_blamed_overload():
    row = {"status": "mismatch", "error": "output 0: 3 of 8 values outside atol=1e-05 rtol=1e-05", "op": "addmm",
           "dtype_ok": 1, "shape_ok": 1, "nan_agree": 1, "comparator": "allclose"}
    assert op_signature(row, blamed="aten::mm.default").text() == "mismatch at aten::mm.default: values differ"
    assert op_signature({**row, "nan_agree": 0}).text() == "mismatch at addmm: NaN/inf differ"
    assert op_signature({**row, "dtype_ok": 0}).pattern == "wrong dtype"
    model = {"status": "mismatch", "error": "forward: ||t - c|| / ||c|| = inf > fwd_rtol=0.015 (max abs err 0)",
             "first_divergent_op": "aten::sin.default", "family": "mlp"}
    assert model_signature(model).text() == "mismatch at aten::sin.default: forward NaN/inf differ"


def test_a_contract_that_describes_the_op_is_the_ops_own():
    variants = "contract variants: the out variant differs from the function variant on the target (output 0: 1 of 25 values outside atol=1e-07 rtol=1e-07)"
    a = op_signature(_row("contract", variants, op="mvlgamma"))
    b = op_signature(_row("contract", variants.replace("1 of 25", "4 of 25"), op="mvlgamma"))
    c = op_signature(_row("contract", variants, op="cumsum"))
    assert a.key == b.key != c.key and a.kind == "contract:variants" and a.locus == "mvlgamma"


def test_blame_takes_the_overload_whose_items_fail_most():
    counts = {"aten::mm.default": (40, 50), "aten::empty.memory_format": (40, 4000), "aten::view.default": (3, 900)}
    assert ca.blame('["aten::empty.memory_format", "aten::mm.default", "aten::view.default"]', counts) == "aten::mm.default"
    assert ca.blame("[]", counts) == "" and ca.blame(None, counts) == ""
    assert ca.input_size("f32[2,3], i64[], 4; out=f32[0]") == 7


def _store(tmp_path):
    st = Store.open(tmp_path / "c.sqlite")
    a = st.start_run(target="t", build="1.0", torch_version="x", config={})
    b = st.start_run(target="t", build="2.0", torch_version="x", config={})
    rows = []
    for rid, extra in ((a, 0), (b, 1)):
        for i in range(4):
            rows.append({"run_id": rid, "item_key": f"cat|function|float32|{i}", "op": "cat", "variant": "function",
                         "dtype": "float32", "status": "unsupported_layout", "signature": f"f32[{4 - i},2]",
                         "error": f"RuntimeError: neuron: channels_last inputs are not supported by aten::cat.default "
                                  f"on Neuron SDK build {extra + 1}.0.0 (manifest rule dtypes.channels_last = 'error')"})
        rows.append({"run_id": rid, "item_key": "abs|function|float32|0", "op": "abs", "variant": "function",
                     "dtype": "float32", "status": "pass"})
    rows.append({"run_id": b, "item_key": "exp|function|bfloat16|0", "op": "exp", "variant": "function",
                 "dtype": "bfloat16", "status": "error", "signature": "bf16[3]",
                 "error": "RuntimeError: neuron: internal compiler/runtime error NCC_X123 in aten::exp.default"})
    st.insert("op_results", rows)
    for rid in (a, b):
        st.finish_run(rid)
    return st, a, b


def test_a_runs_causes_are_stored_with_reach_repro_and_history(tmp_path):
    st, a, b = _store(tmp_path)
    with st:
        assert ca.ensure(st, a).causes == 1 and ca.ensure(st, b).failing == 5
        assert not ca.ensure(st, b).computed  # stored by the current rules: read back
        found = qc.run_causes(st, b)
        assert [(c.items, c.ops) for c in found] == [(4, ["cat"]), (1, ["exp"])]
        layout = found[0]
        assert layout.repro_signature == "f32[1,2]"  # the item with the smallest input
        assert layout.trend == [("1.0", a, 4), ("2.0", b, 4)] and layout.first_seen == ("1.0", a)
        assert layout.explanation and layout.knowledge.startswith("causes.toml:")  # the shipped knowledge file
        assert st.count("op_results", run_id=b, cause=layout.key) == 4
        new, gone = ca.new_causes(st, a, b)
        assert [c.ops for c in new] == [["exp"]] and gone == []


def test_new_rules_recompute_the_causes(tmp_path, monkeypatch):
    st, a, _ = _store(tmp_path)
    with st:
        ca.ensure(st, a)
        other = tmp_path / "rules.toml"
        shutil.copy(CAUSE_RULES, other)
        other.write_text(other.read_text() + "\n# edited\n")
        monkeypatch.setattr(ca, "rules", lambda: rules(other))
        assert ca.ensure(st, a).computed
        assert qc.cause_run(st, a)["rules"] == rules(other).version != rules().version


@pytest.mark.parametrize(("text", "where"), [
    ('[[cause]]\nexplanation = "x"\n', "exactly one of key"),
    ('[[cause]]\nkey = "C0123456789"\nmatch = "a"\nexplanation = "x"\n', "it has both"),
    ('[[cause]]\nkey = "X1"\nexplanation = "x"\n', "cause[0].key = 'X1'"),
    ('[[cause]]\nmatch = "("\nexplanation = "x"\n', "cause[0].match = '('"),
    ('[[cause]]\nmatch = "a"\nexplanation = "x"\nupstream = "gh#1"\n', "cause[0].upstream"),
    ('[[cause]]\nmatch = "a"\nexplanation = "x"\nseverity = 1\n', "cause[0].severity"),
    ('[[cause]]\nmatch = "a"\n', "cause[0].explanation is missing"),
    ('[[cause]]\nmatch = "a"\nexplanation = "x"\nkind = "Error!"\n', "cause[0].kind"),
    ('[[cause]]\nmatch = "a"\nexplanation = "x"\nops = "exp"\n', "cause[0].ops = 'exp'"),
    ('[[cause]]\nmatch = "a"\nexplanation = "x"\nops = []\n', "cause[0].ops = []"),
])
def test_a_bad_knowledge_entry_is_one_clear_error(tmp_path, text, where):
    p = tmp_path / "k.toml"
    p.write_text(text)
    with pytest.raises(DataFileError) as e:
        kn.load(p)
    assert str(p) in str(e.value) and where in str(e.value)


def test_a_bad_rule_is_one_clear_error(tmp_path):
    p = tmp_path / "r.toml"
    p.write_text(CAUSE_RULES.read_text().replace("placeholder = \"<addr>\"", "placeholder = \"<addr>\"\nexample2 = 1", 1))
    with pytest.raises(DataFileError, match=r"replace\[0\]\.example2"):
        rules(p)
    p.write_text('[[strip]]\npattern = "zzz"\nwhy = "w"\nexample = "abc"\n[[replace]]\npattern = "a"\nplaceholder = "b"\nexample = "a"\n')
    with pytest.raises(DataFileError, match=r"strip\[0\]\.example = 'abc'.*a text the rule changes"):
        rules(p)


def test_the_errors_command(tmp_path):
    st, a, b = _store(tmp_path)
    st.close()
    db = str(tmp_path / "c.sqlite")
    r = CliRunner().invoke(main, ["errors", "--db", db, "--build", "2.0"])
    assert r.exit_code == 0, r.output
    assert "5 failing items in 2 causes" in r.output and "workaround:" in r.output
    r = CliRunner().invoke(main, ["errors", "--db", db, "--build", "2.0", "--new-since", "1.0"])
    assert r.exit_code == 1 and "1 new cause (1 item), 0 gone" in r.output
    first = r.output.splitlines()[3]
    assert "NEW" in first and "NCC_X<n>" not in first and "NCC_X123" in first
    r = CliRunner().invoke(main, ["errors", "--db", db, "--build", b, "--new-since", a, "--json"])
    data = json.loads(r.output)
    assert [(c["items"], c["new"], c["first_build"]) for c in data] == [(4, False, "1.0"), (1, True, "2.0")]
    assert data[0]["reach"] == {"1.0": {"run": a, "items": 4}, "2.0": {"run": b, "items": 4}}
    r = CliRunner().invoke(main, ["errors", "--db", db, "--build", "9.9"])
    assert r.exit_code == 2 and "--build '9.9': no run" in r.output and "t 1.0" in r.output


def test_the_report_has_a_top_causes_page(tmp_path):
    st, a, b = _store(tmp_path)
    st.close()
    db = str(tmp_path / "c.sqlite")
    r = CliRunner().invoke(main, ["report", "--db", db, "--out", str(tmp_path / "site")])
    assert "No error causes computed" in (tmp_path / "site" / "2.0" / "causes.html").read_text()
    for build in ("1.0", "2.0"):  # the report only reads: `errors` (or run, gate, nightly) computes them
        assert CliRunner().invoke(main, ["errors", "--db", db, "--build", build]).exit_code == 0
    r = CliRunner().invoke(main, ["report", "--db", db, "--out", str(tmp_path / "site")])
    assert r.exit_code == 0, r.output
    page = (tmp_path / "site" / "2.0" / "causes.html").read_text()
    assert "5</span> failing items in <span data-k=\"causes\">2</span> causes" in page
    assert "1</span> new since 1.0" in page and "Top causes" in page


def test_a_teams_knowledge_file_explains_by_key_and_replaces_the_shipped_one(tmp_path, monkeypatch):
    st, a, b = _store(tmp_path)
    with st:
        ca.ensure(st, b)
        exp = next(c for c in qc.run_causes(st, b) if c.ops == ["exp"])
        team = tmp_path / "team.toml"
        team.write_text(f'[[cause]]\nkey = "{exp.key}"\nexplanation = "known compiler bug"\n'
                        'upstream = "https://example.invalid/issues/7"\nowner = "compiler team"\n')
        monkeypatch.setenv(kn.ENV, str(team))
        ca.ensure(st, b)
        got = {c.ops[0]: c for c in qc.run_causes(st, b)}
        assert (got["exp"].explanation, got["exp"].owner, got["exp"].knowledge) == (
            "known compiler bug", "compiler team", "team.toml:[[cause]] 1")
        assert got["cat"].explanation is None  # the shipped entries are not read any more


def test_a_knowledge_entry_scoped_to_ops_explains_only_their_causes(tmp_path, monkeypatch):
    """``ops`` scopes an entry: it explains a cause only while every item of it, in every stored
    run, is an op item of those ops (what a team knows of one op's failure need not hold for the
    same signature elsewhere)."""
    st, a, b = _store(tmp_path)
    with st:
        ca.ensure(st, b)
        team = tmp_path / "team.toml"
        team.write_text('[[cause]]\nmatch = "."\nops = ["ex*"]\nexplanation = "upstream exp"\n')
        monkeypatch.setenv(kn.ENV, str(team))
        ca.ensure(st, b)
        got = {c.ops[0]: c for c in qc.run_causes(st, b)}
        assert got["exp"].explanation == "upstream exp" and got["cat"].explanation is None
    k = kn.load(team)
    assert k.find("C0000000000", "mismatch at x: values differ", ["exp", "exp2"]) is not None
    assert k.find("C0000000000", "mismatch at x: values differ", ["exp", "cat"]) is None
    assert k.find("C0000000000", "mismatch at x: values differ", None) is None  # a model's, or unknown


def test_a_crash_is_named_by_its_native_frames_when_the_worker_printed_them():
    from conformance.triage.signature import crash_report

    error = "the worker died (signal SIGABRT) while running this item"
    stack = ("noise\nterminate called after throwing an instance of 'c10::Error'\n"
             "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x8b (0x7f1 in /x/libc10.so)\n"
             "frame #1: at::native::index_kernel(at::TensorIterator&) + 0x3c2 (0x7f2 in /x/libtorch_cpu.so)\n"
             "frame #2: f3 + 0x1 (0x7f3 in /x/a.so)\nframe #3: f4 + 0x1 (0x7f4 in /x/a.so)\n")
    frames, abort = crash_report(stack)
    assert frames == ["c10::Error::Error", "at::native::index_kernel", "f3"]
    assert abort == "terminate called after throwing an instance of 'c10::Error'"
    a = op_signature({"status": "crash", "error": error, "op": "index", "output": stack})
    b = op_signature({"status": "crash", "error": error, "op": "gather", "output": stack.replace("0x7f2", "0x9")})
    assert a.key == b.key and a.locus == "" and "at c10::Error::Error < at::native::index_kernel < f3" in a.pattern
    heap = op_signature({"status": "crash", "error": error, "op": "index", "output": "munmap_chunk(): invalid pointer"})
    assert heap.locus == "index" and heap.pattern.endswith("| munmap_chunk(): invalid pointer")
    assert op_signature({"status": "crash", "error": error, "op": "index"}).key != heap.key


def _mismatch(rid, op, dtype, sample, native, variant="function", rms=None, status="mismatch"):
    fp = json.dumps({"rms": rms, "nonfinite": 0}) if rms is not None else None
    return {"run_id": rid, "item_key": f"{op}|{variant}|{dtype}|{sample}", "op": op, "variant": variant,
            "dtype": dtype, "sample": sample, "status": status, "native_ops": json.dumps(native),
            "dtype_ok": 1, "shape_ok": 1, "nan_agree": 1, "comparator": "allclose", "fingerprint": fp,
            "error": "output 0: 1 of 4 values outside atol=1e-05 rtol=1e-05" if status == "mismatch" else None}


def test_mismatches_are_blamed_split_by_precision_merged_by_sample_and_by_dtype(tmp_path):
    st = Store.open(tmp_path / "m.sqlite")
    rid = st.start_run(target="t", build="1", torch_version="x", config={})
    rows = [
        # mm is wrong in single precision (float32 fails) and its double-precision items fail too
        _mismatch(rid, "matmul", "float32", 0, ["aten::mm.default", "aten::view.default"]),
        _mismatch(rid, "matmul", "float32", 0, ["aten::mm.out"], variant="out"),  # the same wrong value, met again
        _mismatch(rid, "matmul", "float64", 0, ["aten::mm.default", "aten::view.default"]),
        _mismatch(rid, "addmm", "float32", 0, ["aten::mm.default", "aten::add.Tensor"]),
        # only a view and an allocation ran natively: nothing to blame, the op is the locus
        _mismatch(rid, "unfold", "float32", 0, ["aten::unfold.default", "aten::empty.memory_format"]),
    ]
    # float64 fails where float32 passes exactly, over five overloads: the dtype's own cause
    for op in ("exp", "log", "sin", "cos", "tanh"):
        rows.append(_mismatch(rid, op, "float64", 0, [f"aten::{op}.default"]))
        rows.append(_mismatch(rid, op, "float32", 0, [f"aten::{op}.default"], rms=0.5, status="pass"))
    # ... but not where float32 passes only within its tolerance (a kernel of reduced precision)
    rows.append(_mismatch(rid, "erf", "float64", 0, ["aten::erf.default"]))
    rows.append(_mismatch(rid, "erf", "float32", 0, ["aten::erf.default"], rms=300.0, status="pass"))
    # ... nor where the item's own localisation found a kernel wrong beyond single precision:
    # that evidence is the item's own, the float32 item's only a neighbour's
    own = _mismatch(rid, "expm1", "float64", 0, ["aten::expm1.default"])
    own["proof"] = json.dumps({"locus": {"scores": {"aten::expm1.default": 900.0}, "single": {"aten::expm1.default": 0.5}}})
    rows += [own, _mismatch(rid, "expm1", "float32", 0, ["aten::expm1.default"], rms=0.5, status="pass")]
    st.insert("op_results", rows)
    with st:
        ca.compute(st, rid)
        got = {r["item_key"]: r["text"] for r in st.db.query(
            "select o.item_key, c.kind || coalesce(' at ' || nullif(c.locus, ''), '') || ': ' || c.pattern as text "
            "from op_results o join causes c on c.key = o.cause where o.run_id = ?", [rid])}
    assert got["matmul|function|float32|0"] == "mismatch at aten::mm.default: values differ"
    assert got["matmul|out|float32|0"] == got["matmul|function|float32|0"]
    assert got["addmm|function|float32|0"] == got["matmul|function|float32|0"]
    assert got["matmul|function|float64|0"] == "mismatch at aten::mm.default: values differ in double precision"
    assert got["unfold|function|float32|0"] == "mismatch at unfold: values differ"
    assert {got[f"{op}|function|float64|0"] for op in ("exp", "log", "sin", "cos", "tanh")} == {
        "mismatch: values differ in float64 only (float32 passes exactly)"}
    assert got["erf|function|float64|0"] == "mismatch at aten::erf.default: values differ in double precision"
    assert got["expm1|function|float64|0"] == "mismatch at aten::expm1.default: values differ in double precision"


def test_a_double_precision_error_of_single_precision_is_the_dtypes_cause():
    import torch

    from conformance.check.compare import TWIN_FACTOR, twin_errors

    x = torch.linspace(0.1, 3, 64, dtype=torch.float64)
    cpu, twin = x.exp(), x.float().exp()
    downcast = x.float().exp().double()  # a device computing float64 in float32
    t_err, w_err = twin_errors(cpu, downcast, twin)
    assert 0 < t_err <= TWIN_FACTOR * w_err
    rounded = (x.exp() * (1 + 2.0 ** -16))  # a 16-bit kernel: far worse than single precision
    t_err, w_err = twin_errors(cpu, rounded, twin)
    assert t_err > TWIN_FACTOR * w_err
    assert twin_errors(cpu, downcast, (twin, twin)) is None  # another structure: no evidence
    row = {"status": "mismatch", "op": "exp", "dtype_ok": 1, "shape_ok": 1, "nan_agree": 1, "comparator": "allclose",
           "error": "output 0: 3 of 64 values outside atol=1e-07 rtol=1e-07",
           "proof": json.dumps({"single_precision": {"target_err": 1e-8, "twin_err": 1e-8, "explains": True}})}
    sig = op_signature(row, blamed="aten::exp.default")
    assert sig.text() == "mismatch: values of single precision in double precision" and sig.locus == ""
    sig = op_signature({**row, "proof": None}, blamed="aten::exp.default")
    assert sig.text() == "mismatch at aten::exp.default: values differ"
