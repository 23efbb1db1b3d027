"""The size ladder (issue #47): an op's sample grown across kernel size boundaries, the first
failing size bisected, flagged by the gate; and nothing flagged where no size-dependent defect is."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.testing._internal.opinfo.core import SampleInput

from conformance.gate.core import run_gate
from conformance.run.runner import RunSpec, execute_run
from conformance.sweep import ladder
from opdb import Store
from opdb.queries_report import ladder_sizes

pytestmark = pytest.mark.xdist_group("ladder")
SEEDED = Path(__file__).parent / "data" / "size_defects.toml"
OPS = ("amax", "mul", "cumsum", "abs", "exp", "softmax")
# (op, dtype) -> the threshold the seeded build's defect fires from (tests/data/size_defects.toml)
THRESHOLDS = {("amax", "float32"): 3000, ("mul", "bfloat16"): 300_000, ("cumsum", "float32"): 100_000}


def test_a_sample_grows_along_the_dimension_the_op_runs_along():
    s = SampleInput(torch.rand(5, 5, 5) + 2.0, args=(1,))
    g = ladder.grow(s, 4097, seed=0)
    assert g.input.shape == (5, 164, 5) and g.args == (1,)
    assert float(g.input.min()) >= 2.0 and float(g.input.max()) <= 3.0  # the sample's own range
    assert ladder.grow(s, 4095, seed=0).input.numel() == 4075  # below a power of two stays below
    # an argument of the input's shape grows with it; one broadcasting along the axis stays 1;
    # one of another shape (a weight, an index) stays as it is
    x, same, bcast, other = torch.ones(4, 3), torch.ones(4, 3), torch.ones(4, 1), torch.ones(2, 2)
    g = ladder.grow(SampleInput(x, args=(same, bcast), kwargs={"w": other}), 2000, seed=0)
    assert g.input.shape == (4, 500) and g.args[0].shape == (4, 500) and g.args[1].shape == (4, 1)
    assert g.kwargs["w"] is other
    ints = ladder.grow(SampleInput(torch.randint(3, 9, (6,))), 1025, seed=0).input
    assert ints.dtype == torch.int64 and int(ints.min()) >= 3 and int(ints.max()) <= 8
    assert ladder.grow(SampleInput(torch.tensor(1.0)), 1025, seed=0) is None  # 0-d: nothing grows
    assert ladder.grow(s, 100, seed=0) is None  # already that large


def _run(db: Path, build: str, run_id: str, ops=OPS) -> str:
    spec = RunSpec(target="neuron-emu", build=build, ops=ops, dtypes=("float32", "bfloat16"), workers=2,
                   timeout_s=60.0, sizes="ladder", run_id=run_id)
    return execute_run(spec, db).run_id


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    db = tmp_path_factory.mktemp("ladder") / "l.sqlite"
    clean = _run(db, "2.32.0", "clean")
    seeded = _run(db, str(SEEDED), "seeded")
    shipped = _run(db, "2.33.0", "shipped")
    return db, clean, seeded, shipped


def test_each_size_defect_is_named_at_its_threshold_and_nothing_else(runs):
    db, clean, seeded, _ = runs
    with Store.open(db) as st:
        sizes = ladder_sizes(st, seeded)
        assert not [s for s in ladder_sizes(st, clean).values() if s.first_failing]
    failing = {k: s for k, s in sizes.items() if s.first_failing}
    assert set(failing) == set(THRESHOLDS), {k: s.describe() for k, s in sizes.items()}
    for key, threshold in THRESHOLDS.items():
        s = failing[key]
        # at the threshold, or above it by less than one slice of the grown dimension (the other
        # dimensions' product, 25 at most for these samples); the size below it passed
        assert threshold <= s.first_failing <= threshold + 25, (key, s)
        assert s.largest_passing is not None and s.largest_passing < threshold <= s.first_failing
        assert s.describe() == f"mismatch from {s.first_failing:,} elements"
    assert all(s.sizes >= 10 for k, s in sizes.items() if k not in THRESHOLDS)  # every rung ran


def test_the_gate_names_the_rung_that_regressed(runs):
    db, clean, seeded, _ = runs
    with Store.open(db) as st:
        result = run_gate(st, clean, seeded)
    flagged = {(f.name, f.dtype) for f in result.of("regression")}
    assert flagged == set(THRESHOLDS), [f.as_json() for f in result.findings]
    assert not result.of("flaky")


def test_the_shipped_bf16_cumsum_regression_is_found_at_op_level(runs):
    db, clean, _, shipped = runs
    with Store.open(db) as st:
        s = ladder_sizes(st, shipped)["cumsum", "bfloat16"]
        assert 4097 <= s.first_failing <= 4097 + 25 and s.largest_passing < 4097, s
        assert ladder_sizes(st, shipped)["cumsum", "float32"].first_failing is None
        assert ladder_sizes(st, clean)["cumsum", "bfloat16"].first_failing is None
        result = run_gate(st, clean, shipped)
    assert ("cumsum", "bfloat16") in {(f.name, f.dtype) for f in result.of("regression")}


def test_a_rung_whose_output_would_not_fit_is_not_run():
    """``diag`` of a vector is a square matrix: its output grows as the square of its input, so
    the ladder stops where the output would pass the memory budget (16,383 elements: 1 GiB)."""
    from conformance.inputs.opinfo import by_name, samples

    info = by_name()["diag"]
    seed = ladder.seed_sample(info, enumerate(samples(info, torch.float32)), "diag", "float32", 0)
    assert isinstance(seed, ladder.Seed) and seed.sample.input.ndim == 1
    assert seed.power == pytest.approx(2.0, abs=0.05)
    assert seed.out_bytes(4095) < ladder.MAX_BYTES < seed.out_bytes(16_383)


def test_a_resumed_walk_takes_the_steps_an_uninterrupted_one_took():
    """Cut the walk after each of its items (a kill -9, a worker restart) and resume it with what
    the run recorded (``Skip.done``, ``Skip.failed``): the items and verdicts are the same."""
    from conformance.sweep.opinfo import SweepConfig, run_group
    from conformance.targets import get_target
    from conformance.work import Group, Skip

    target, cfg = get_target("neuron-emu", str(SEEDED)), SweepConfig(sizes="ladder")
    group = Group("amax", "float32")  # wrong from 3,000 elements: climbs, fails, bisects
    full = [(r["item_key"], r["status"]) for r in run_group(target, group, cfg)]
    failing = {k for k, s in full if s == "mismatch"}
    assert len(full) > 6 and failing
    for cut in range(1, len(full)):
        done = frozenset(k for k, _ in full[:cut])
        rest = [(r["item_key"], r["status"]) for r in
                run_group(target, group, cfg, skip=Skip(done, failed=done & failing))]
        assert full[:cut] + rest == full, cut
