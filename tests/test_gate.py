"""The gate: injected defects of every kind are listed exactly, same-build runs gate clean
(also with stochastic rounding), flaky defects are reported as flaky, canary failures are infra."""

from __future__ import annotations

import json
import textwrap

import pytest
from click.testing import CliRunner

from conformance.cli import main
from conformance.gate.core import run_gate, sign_test_p
from conformance.run.runner import RunSpec, execute_run
from opdb import Store

OPS = ("mul", "sub", "neg", "exp", "tanh", "sigmoid", "cos", "sqrt", "floor")
DEFECTS = """
[build]
name = "{name}"
inherits = "2.33.0"

[ops]
native = ["aten::mul.Tensor", "aten::sub.Tensor", "aten::neg.default", "aten::exp.default", "aten::tanh.default",
          "aten::sigmoid.default", "aten::cos.default", "aten::sqrt.default", "aten::floor.default"]
{defects}
"""
EVERY_KIND = """
[[defects]]
op = "aten::mul.Tensor"
dtypes = ["bfloat16"]
kind = "wrong_result"
magnitude = 0.5

[[defects]]
op = "aten::sub.Tensor"
dtypes = ["float32"]
kind = "nan"

[[defects]]
op = "aten::neg.default"
kind = "wrong_dtype"

[[defects]]
op = "aten::exp.default"
kind = "error"

[[defects]]
op = "aten::tanh.default"
kind = "crash"

[[defects]]
op = "aten::sigmoid.default"
dtypes = ["float32"]
kind = "hang"

[[defects]]
op = "aten::cos.default"
kind = "fallback"
"""
# The defective build's sigmoid hangs: its two items and their re-runs cost this each. Every
# other item takes milliseconds; the runs without a hang keep the default (a loaded machine must
# not turn a slow canary into an infra run).
HANG_TIMEOUT_S = 3.0
EXPECTED = {("mul", "bfloat16"), ("sub", "float32"), ("neg", "float32"), ("neg", "bfloat16"), ("exp", "float32"),
            ("exp", "bfloat16"), ("tanh", "float32"), ("tanh", "bfloat16"), ("sigmoid", "float32"),
            ("cos", "float32"), ("cos", "bfloat16")}


def _manifest(tmp_path, name: str, defects: str) -> str:
    p = tmp_path / f"{name}.toml"
    p.write_text(textwrap.dedent(DEFECTS.format(name=name, defects=defects)))
    return str(p)


def _run(db, build: str, **kw) -> str:
    spec = RunSpec(target="neuron-emu", build=build, ops=kw.pop("ops", OPS), dtypes=("float32", "bfloat16"),
                   workers=2, max_samples=kw.pop("max_samples", 2), variants=("function",), **kw)
    return execute_run(spec, db).run_id


@pytest.fixture(scope="module")
def clean_and_defective(tmp_path_factory):
    d = tmp_path_factory.mktemp("gate")
    db = d / "g.sqlite"
    base = _run(db, _manifest(d, "clean", ""))
    cand = _run(db, _manifest(d, "defective", EVERY_KIND), timeout_s=HANG_TIMEOUT_S)
    return db, base, cand


def test_every_defect_kind_fails_the_gate_with_exactly_its_pairs(clean_and_defective, tmp_path):
    db, base, cand = clean_and_defective
    out = tmp_path / "gate.json"
    r = CliRunner().invoke(main, ["gate", "--db", str(db), "--baseline", base, "--candidate", cand,
                                  "--json", str(out), "--junit", str(tmp_path / "g.xml"),
                                  "--markdown", str(tmp_path / "g.md")])
    assert r.exit_code == 1, r.output
    data = json.loads(out.read_text())
    assert data["verdict"] == "fail"
    pairs = {(x["op"], x["dtype"]) for x in data["regressions"]}
    assert pairs == EXPECTED
    by_op = {x["op"]: x["candidate"] for x in data["regressions"]}
    assert by_op["tanh"] == "crash" and by_op["sigmoid"] == "timeout" and by_op["cos"] == "pass_fallback"
    assert by_op["exp"] == "error" and by_op["mul"] == "mismatch"
    assert not data["flaky"]
    # max_samples=2: every item is one of its group's two representatives; a timeout or crash is re-run once
    assert all(len(x["evidence"]["reruns"]) == (1 if x["candidate"] in ("timeout", "crash") else 3)
               for x in data["regressions"])
    assert {x["evidence"]["confirmation"]["verdict"] for x in data["regressions"]} == {"confirmed"}
    assert "<failure" in (tmp_path / "g.xml").read_text()
    assert "| op | `mul` |" in (tmp_path / "g.md").read_text()
    with Store.open(db) as st:
        stored = list(st.db.query("select category, op, dtype from gate_items where candidate_run = ?", [cand]))
    assert {(r["op"], r["dtype"]) for r in stored if r["category"] == "regression"} == EXPECTED


def test_same_build_twice_gates_clean(tmp_path):
    db = tmp_path / "same.sqlite"
    a = _run(db, "2.33.0", ops=("mul", "exp", "cumsum", "sum"))
    b = _run(db, "2.33.0", ops=("mul", "exp", "cumsum", "sum"))
    with Store.open(db) as st:
        result = run_gate(st, a, b)
    assert result.verdict == "pass" and not result.of("regression") and not result.of("drift")


def test_stochastic_rounding_build_gates_clean(tmp_path):
    sr = _manifest(tmp_path, "stochastic", "[numerics]\nrounding = \"stochastic\"\n")
    db = tmp_path / "sr.sqlite"
    a = _run(db, sr, ops=("mul", "add", "exp", "sum", "mean"), max_samples=4)
    b = _run(db, sr, ops=("mul", "add", "exp", "sum", "mean"), max_samples=4)
    with Store.open(db) as st:
        result = run_gate(st, a, b)
    assert not result.of("regression") and not result.of("drift"), [f.as_json() for f in result.findings]
    assert result.verdict == "pass"


def test_flaky_defect_is_reported_as_flaky(tmp_path):
    flaky = "[[defects]]\nop = \"aten::exp.default\"\nkind = \"wrong_result\"\nmagnitude = 0.5\nprobability = 0.5\n"
    db = tmp_path / "f.sqlite"
    # Without contracts: determinism and variants call the op again within the item, so a defect
    # that strikes every other call is 'contract' on every re-run (confirmed, rightly); the flake
    # confirmation of the values is what is under test here.
    a = _run(db, _manifest(tmp_path, "clean", ""), ops=("exp",), max_samples=None, contracts=("none",))
    b = _run(db, _manifest(tmp_path, "flaky", flaky), ops=("exp",), max_samples=None, contracts=("none",))
    with Store.open(db) as st:
        result = run_gate(st, a, b)
        flakes = list(st.db.query("select * from flakes where run_id = ?", [b]))
    assert result.of("flaky"), [f.as_json() for f in result.findings]
    flaky_keys = {f.item_key for f in result.of("flaky")}
    assert not flaky_keys & {f.item_key for f in result.of("regression")}
    # the flakes table holds the representatives that were re-run (up to two per op x variant x dtype)
    stored = {f["item_key"] for f in flakes if f["verdict"] == "flaky"}
    assert stored and stored <= flaky_keys
    assert {k.rsplit("|", 1)[0] for k in stored} == {k.rsplit("|", 1)[0] for k in flaky_keys}


def test_canary_failure_is_infra_and_gate_refuses(tmp_path):
    broken = "[[defects]]\nop = \"aten::add.Tensor\"\nkind = \"error\"\n"
    db = tmp_path / "c.sqlite"
    good = _run(db, "2.33.0", ops=("neg",))
    r = CliRunner().invoke(main, ["run", "--target", "neuron-emu", "--build", _manifest(tmp_path, "broken", broken),
                                  "--ops", "neg", "--db", str(db), "--quiet"])
    assert r.exit_code == 2 and "INFRA" in r.output
    with Store.open(db) as st:
        bad = [x for x in st.runs() if x["status"] == "infra"]
        assert len(bad) == 1
        assert st.count("op_results", run_id=bad[0]["id"], variant="function") == 0  # stopped before the sweep
    g = CliRunner().invoke(main, ["gate", "--db", str(db), "--baseline", good, "--candidate", bad[0]["id"],
                                  "--json", str(tmp_path / "i.json")])
    assert g.exit_code == 2 and "canaries" in g.output
    assert json.loads((tmp_path / "i.json").read_text())["verdict"] == "infra"


def test_sign_test():
    assert sign_test_p(10, 10) == pytest.approx(1 / 1024)
    assert sign_test_p(0, 10) == 1.0


def test_each_seeded_defect_is_one_new_cause_named_first(clean_and_defective):
    """Every defect kind that fails items appears as one new error cause whose reach is exactly
    the items it broke, and the gate's console names the new causes before its counts."""
    db, base, cand = clean_and_defective
    r = CliRunner().invoke(main, ["gate", "--db", str(db), "--baseline", base, "--candidate", cand])
    lines = r.output.splitlines()
    assert lines[1].startswith("  causes: 6 new causes"), r.output
    with Store.open(db) as st:
        result = run_gate(st, base, cand)
        failing = {}
        for row in st.db.query("select op, status, cause from op_results where run_id = ? and cause is not null", [cand]):
            failing.setdefault(row["op"], set()).add(row["cause"])
        broken = {row["op"]: row["n"] for row in st.db.query(
            "select op, count(*) as n from op_results where run_id = ? and cause is not null group by op", [cand])}
    new = result.causes["new"]
    assert sorted(c["ops"][0] for c in new) == ["exp", "mul", "neg", "sigmoid", "sub", "tanh"]
    assert all(len(c["ops"]) == 1 and c["items"] == broken[c["ops"][0]] for c in new), new
    assert all(len(keys) == 1 for keys in failing.values()), failing  # one cause per broken op
    texts = {c["ops"][0]: c["text"] for c in new}
    assert texts["mul"] == "mismatch at aten::mul.Tensor: values differ"
    assert texts["sub"] == "mismatch at aten::sub.Tensor: NaN/inf differ"
    assert texts["neg"] == "mismatch at aten::neg.default: wrong dtype"
    assert texts["tanh"].startswith("crash at tanh: ") and texts["sigmoid"].startswith("timeout at sigmoid: ")
    assert texts["exp"].startswith("error: ") and "<op>" in texts["exp"]
    assert result.causes["gone"] == []
