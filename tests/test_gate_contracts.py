"""A build seeded with one defect of each contract kind, gated against its clean twin: each
defect is flagged at its op and dtype with its contract named, and nothing else is flagged."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance.gate.core import run_gate
from conformance.run.runner import RunSpec, execute_run
from opdb import Store

# Both tests read the module fixture's two runs: one xdist worker runs them, once.
pytestmark = pytest.mark.xdist_group("gate_contracts")
SEEDED = Path(__file__).parent / "data" / "contract_defects.toml"
CLEAN = '[build]\nname = "contract-clean"\ninherits = "2.33.0"\n'
OPS = ("mul", "transpose", "add", "gather", "sum", "exp", "abs", "neg")
# defect kind -> (OpInfo, the contract it must fail)
EXPECTED = {
    "wrong_strides": ("mul", "metadata"),
    "view_as_copy": ("transpose", "aliasing"),
    "out_reallocates": ("add", "out"),
    "accepts_invalid": ("gather", "errors"),
    "nondeterministic": ("sum", "determinism"),
    "noncontiguous_wrong": ("exp", "noncontiguous"),
}


def _run(db: Path, build: str, run_id: str) -> str:
    spec = RunSpec(target="neuron-emu", build=build, ops=OPS, dtypes=("float32", "bfloat16"), workers=2,
                   timeout_s=30.0, max_samples=2, variants=("function", "out"), run_id=run_id)
    return execute_run(spec, db).run_id


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    d = tmp_path_factory.mktemp("contracts")
    (d / "clean.toml").write_text(CLEAN)
    db = d / "g.sqlite"
    base = _run(db, str(d / "clean.toml"), "clean")
    cand = _run(db, str(SEEDED), "seeded")
    with Store.open(db) as st:
        return run_gate(st, base, cand)


def test_each_seeded_contract_defect_is_flagged_at_its_op_and_dtype(gated):
    regressions = gated.of("regression")
    assert gated.verdict == "fail"
    flagged = {(f.name, f.dtype) for f in regressions}
    assert flagged == {(op, "float32") for op, _ in EXPECTED.values()}, [f.as_json() for f in regressions]
    for kind, (op, contract) in EXPECTED.items():
        found = [f for f in regressions if f.name == op]
        assert all(f.candidate == "contract" for f in found), (kind, [f.as_json() for f in found])
        named = {c for f in found for c in (f.evidence.get("contract_failed") or "").split(",") if c}
        assert contract in named, (kind, contract, named)


def test_nothing_else_is_flagged(gated):
    assert not gated.of("flaky") and not gated.of("drift"), [f.as_json() for f in gated.findings]
    assert {f.category for f in gated.findings} <= {"regression"}, [f.as_json() for f in gated.findings]
