"""The numerics gate: error fingerprints against the float64 arbiter, a paired noise-calibrated
test on them, ``worsened`` for a failing op that got worse, and a flaky group reported once.

The end-to-end case is issue #16's "done when": a 0.2% systematic scale error in float32 ``mm`` on
top of 2.33.0 (whose matmul already rounds inputs to bf16, so ``mm`` already mismatches) is
flagged at ``mm``/float32, while two identical runs give no finding."""

from __future__ import annotations

import math

import pytest
import torch

from conformance.check.fingerprint import MIN_PAIRS, P_MAX, fingerprint, probes, shift
from conformance.gate.core import Finding, _fold_flaky, model_numerics, run_gate
from conformance.run.runner import RunSpec, execute_run
from opdb import Store

CLEAN = '[build]\nname = "numerics-clean"\ninherits = "2.33.0"\n'
SEEDED = """[build]
name = "numerics-mm-{m}"
inherits = "2.33.0"

[[defects]]
op = "aten::mm.default"
dtypes = ["float32"]
kind = "wrong_result"
magnitude = {m}
note = "seeded: float32 mm results scaled by 1 + {m}"
"""


def _bf16_mm(seed: int, scale: float = 0.0) -> tuple[dict, dict]:
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(20, 30, generator=g), torch.randn(30, 25, generator=g)
    ref = a.double() @ b.double()
    base = a.bfloat16().float() @ b.bfloat16().float()
    return (fingerprint(base, ref, ref_kind="float64"),
            fingerprint(base * (1 + scale), ref, ref_kind="float64"))


def test_fingerprint_measures_every_element_signed_along_the_reference():
    ref = torch.tensor([2.0, -2.0, 4.0, 0.0, 8.0, 0.5], dtype=torch.float64)
    fp = fingerprint((ref * 1.5).float(), ref, ref_kind="float64")
    eps = torch.finfo(torch.float32).eps
    # a scale error reads positive on negative values too; references below the median magnitude
    # (2) are measured against it: 0.5 is off by 0.25 of 2, and 0 has no error
    assert fp["n"] == 6 and fp["nonfinite"] == 0 and fp["ref"] == "float64"
    want = [0.5 / eps] * 3 + [0.0, 0.5 / eps, 0.125 / eps]
    assert probes(fp).tolist() == pytest.approx(want)
    assert fp["bias"] == pytest.approx(sum(want) / 6) and fp["max"] == pytest.approx(0.5 / eps)
    nan = fingerprint(torch.tensor([1.0, float("nan")]), torch.tensor([1.0, 2.0], dtype=torch.float64),
                      ref_kind="cpu")
    assert nan["n"] == 1 and nan["nonfinite"] == 1 and math.isnan(probes(nan)[1])
    assert fingerprint(torch.tensor([1, 2]), torch.tensor([1, 2]), ref_kind="cpu") is None  # nothing floating
    big = fingerprint(torch.zeros(10_000), torch.zeros(10_000, dtype=torch.float64), ref_kind="cpu")
    assert probes(big).numel() == 64 and big["n"] == 10_000


def test_an_exact_result_takes_the_short_path_to_the_same_fingerprint():
    """Most items on a device match their reference bit for bit: their fingerprint skips the
    float64 passes, and stores what the full measurement stores (every error a zero signed as the
    reference: stored results stay byte-identical, tests/test_identity.py)."""
    g = torch.Generator().manual_seed(0)
    outs = (torch.randn(3, 4, generator=g), torch.randn(1000, generator=g), torch.tensor([0.0, -0.0]))
    exact = fingerprint(outs, tuple(o.clone() for o in outs), ref_kind="cpu")
    full = fingerprint(outs, tuple(o.double() for o in outs), ref_kind="cpu")  # another dtype: the full path
    assert exact == full and probes(exact).numel() == 12 + 64 + 2  # probes too, bit for bit (signed zeros)
    inf = torch.tensor([1.0, float("inf")])  # a non-finite value is not an error of 0: the full path
    assert fingerprint(inf, inf.clone(), ref_kind="cpu")["n"] == 1


def test_identical_runs_change_no_probe():
    pairs = [_bf16_mm(s) for s in range(3)]
    s = shift([b for b, _ in pairs], [b for b, _ in pairs])
    assert not s.found and s.changed == 0 and s.pairs == 3 * 64


def test_symmetric_noise_is_not_a_finding():
    # A nondeterministic device: each run's elements land a few ulps off, in no preferred
    # direction, and differently in each run (the same build run twice).
    def noisy(t: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        return t + torch.randint(-3, 4, t.shape, generator=g).float() * torch.finfo(torch.float32).eps * t.abs()

    for seed in range(40):
        g = torch.Generator().manual_seed(seed)
        ref = torch.randn(3, 500, generator=g, dtype=torch.float64)
        base = [fingerprint(noisy(row.float(), g), row, ref_kind="float64") for row in ref]
        cand = [fingerprint(noisy(row.float(), g), row, ref_kind="float64") for row in ref]
        s = shift(base, cand)
        assert s.changed >= MIN_PAIRS and not s.found, (seed, s.evidence())


@pytest.mark.parametrize("scale", [0.001, 0.002, 0.005])
def test_small_scale_error_on_an_already_inaccurate_matmul_is_found(scale):
    pairs = [_bf16_mm(s, scale) for s in range(3)]
    s = shift([b for b, _ in pairs], [c for _, c in pairs])
    assert s.found and "bias" in s.kind and s.p_bias < P_MAX, s.evidence()
    assert s.evidence()["candidate"]["bias_eps"] > s.evidence()["baseline"]["bias_eps"]


def test_an_error_that_shrinks_is_not_worse():
    pairs = [_bf16_mm(s) for s in range(3)]
    exact = [fingerprint(torch.zeros(20, 25), torch.zeros(20, 25, dtype=torch.float64), ref_kind="float64")] * 3
    assert not shift([b for b, _ in pairs], exact).found


def _finding(category: str, kind: str, key: str, base: str = "pass", cand: str = "mismatch") -> Finding:
    return Finding(category, kind, key, "sum", "function", "float32", base, cand, {})


def test_a_flaky_group_is_reported_once_as_flaky():
    findings = [_finding("flaky", "op", "sum|function|float32|0"), _finding("flaky", "op", "sum|function|float32|1"),
                _finding("worsened", "drift", "sum|function|float32|*", "mismatch", "mismatch"),
                _finding("regression", "op", "abs|function|float32|0")]
    findings[3].name = "abs"
    folded = _fold_flaky(findings)
    assert [f.category for f in folded] == ["flaky", "flaky", "regression"]
    assert all(f.evidence["numerics"]["category"] == "worsened" for f in folded[:2])


def _run(db, build: str, run_id: str) -> str:
    spec = RunSpec(target="neuron-emu", build=build, ops=("mm", "exp"), dtypes=("float32",), workers=2,
                   timeout_s=60.0, variants=("function", "out"), contracts=("none",), run_id=run_id)
    return execute_run(spec, db).run_id


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    d = tmp_path_factory.mktemp("numerics")
    (d / "clean.toml").write_text(CLEAN)
    (d / "mm002.toml").write_text(SEEDED.format(m=0.002))
    db = d / "n.sqlite"
    _run(db, str(d / "clean.toml"), "clean-1")
    _run(db, str(d / "clean.toml"), "clean-2")
    _run(db, str(d / "mm002.toml"), "mm002")
    with Store.open(db) as st:
        yield st


# The two tests of the module fixture's runs share one xdist worker, which runs them once.
@pytest.mark.xdist_group("numerics_gate_store")
def test_identical_runs_give_no_finding(store):
    result = run_gate(store, "clean-1", "clean-2")
    assert result.verdict == "pass" and not result.findings, [f.as_json() for f in result.findings]


@pytest.mark.xdist_group("numerics_gate_store")
def test_a_0_2_percent_error_on_float32_mm_is_flagged_at_mm_float32(store):
    result = run_gate(store, "clean-1", "mm002")
    assert result.verdict == "fail"
    flagged = {(f.category, f.name, f.variant, f.dtype) for f in result.findings}
    # mm already mismatches on 2.33.0 (bf16-rounded inputs): no status changes, it got worse.
    # The seeded defect is in mm.default only; mm's out= variant runs mm.out and is untouched.
    assert flagged == {("worsened", "mm", "function", "float32")}, [f.as_json() for f in result.findings]
    (f,) = result.findings
    assert f.baseline == f.candidate == "mismatch" and "bias" in f.evidence["test"]
    assert f.evidence["p_bias"] < P_MAX and f.evidence["samples"] >= 2


def _model_row(status: str, target: list[float], noise: float = 0.0, fp: dict | None = None) -> dict:
    return {"model_id": "mlp.m0", "mode": "eager", "dtype": "float32", "status": status, "noise": noise,
            "loss_curve": {"target": target, "cpu": [2.0, 1.5, 1.0]}, "fingerprint": fp}


def test_a_model_whose_loss_gap_grows_beyond_its_noise_drifts_inside_its_tolerance():
    key = "mlp.m0|eager|float32"
    base = _model_row("pass", [2.0 + 1e-5, 1.5 + 1e-5, 1.0 + 1e-5])
    worse = _model_row("pass", [2.0 + 1e-4, 1.5 - 1e-4, 1.0 + 1e-4])  # 10x the gap, still a pass
    f = model_numerics(key, base, worse)
    assert f is not None and f.category == "drift" and f.kind == "model" and f.evidence["test"] == "loss"
    assert model_numerics(key, base, base) is None
    # the same growth inside the target's own run-to-run noise is no finding
    assert model_numerics(key, {**base, "noise": 1e-4}, {**worse, "noise": 1e-4}) is None
    # a gap that grew at one step only is no finding
    assert model_numerics(key, base, _model_row("pass", [2.0 + 1e-4, 1.5 + 1e-5, 1.0 + 1e-5])) is None
    failing = model_numerics(key, {**base, "status": "mismatch"}, {**worse, "status": "mismatch"})
    assert failing is not None and failing.category == "worsened"


def test_a_model_whose_output_error_grows_is_flagged_by_its_fingerprint():
    key = "mlp.m0|eager|float32"
    b_fp, c_fp = _bf16_mm(0, 0.005)
    f = model_numerics(key, _model_row("pass", [2.0, 1.5, 1.0], fp=b_fp), _model_row("pass", [2.0, 1.5, 1.0], fp=c_fp))
    assert f is not None and f.evidence["test"] == "output" and f.evidence["p_bias"] < P_MAX
    # ... unless the target's own noise is as large as the growth
    noisy = model_numerics(key, _model_row("pass", [2.0, 1.5, 1.0], 0.01, b_fp),
                           _model_row("pass", [2.0, 1.5, 1.0], 0.01, c_fp))
    assert noisy is None
