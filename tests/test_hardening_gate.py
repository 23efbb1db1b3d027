"""The gate refuses what it cannot judge (empty, unfinished, differently selected runs) in one
line with exit 2, unless told to compare the common part; its flake confirmation is decided per
op x variant x dtype group from a few representatives, confirms a timeout once, stays within a
budget and says what it spent."""

from __future__ import annotations

import json
import textwrap

import pytest
from click.testing import CliRunner

from conformance.cli import main
from conformance.gate.core import run_gate
from conformance.gate.render import summary_lines
from conformance.run.runner import RunSpec, execute_run
from opdb import Store

CONFIG = {"ops": ["exp", "sin"], "dtypes": ["float32"], "variants": ["function"], "seed": 0, "max_samples": None,
          "thorough": False, "timeout_s": 2.0}


def _run(st: Store, rid: str, build: str, items: dict[str, str], *, config: dict | None = None,
         finish: str | None = "finished", shard: str = "1/1") -> str:
    st.start_run(target="neuron-emu", build=build, torch_version="2.13", config={**CONFIG, **(config or {})},
                 run_id=rid, shard=shard)
    rows = []
    for key, status in items.items():
        op, variant, dtype, sample = key.split("|")
        rows.append({"run_id": rid, "item_key": key, "op": op, "variant": variant, "dtype": dtype,
                     "sample": int(sample), "status": status, "duration_s": 0.01, "max_rel_err": 0.0})
    st.insert("op_results", rows)
    if finish:
        st.finish_run(rid, shard=shard, status=finish)
    return rid


def _items(op: str, n: int, status: str, dtype: str = "float32") -> dict[str, str]:
    return {f"{op}|function|{dtype}|{i}": status for i in range(n)}


CANARIES = {f"add|canary|float32|{i}": "pass" for i in range(2)}


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "g.sqlite"
    with Store.open(path) as st:
        _run(st, "base", "2.32.0", {**CANARIES, **_items("exp", 6, "pass"), **_items("sin", 6, "pass")})
    return path


def _gate(db, *args: str):
    return CliRunner().invoke(main, ["gate", "--db", str(db), "--baseline", "base", *args])


def _one_line(r) -> str:
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.output, r.output
    return lines[0]


# -- A. refusals ------------------------------------------------------------------------------
def test_empty_candidate_is_refused(db, tmp_path):
    with Store.open(db) as st:
        _run(st, "empty", "2.33.0", dict(CANARIES))  # finished, canaries only: it ran nothing
    r = _gate(db, "--candidate", "empty", "--json", str(tmp_path / "g.json"))
    assert r.exit_code == 2
    assert _one_line(r) == ("error: candidate run empty (build 2.33.0) is empty: it holds no result items "
                            "(canaries aside); refusing to gate it")
    assert json.loads((tmp_path / "g.json").read_text())["verdict"] == "infra"
    with Store.open(db) as st:
        assert st.count("gate_items") == 0


def test_empty_baseline_is_refused(db):
    with Store.open(db) as st:
        _run(st, "empty", "2.31.0", {})
        _run(st, "cand", "2.33.0", {**_items("exp", 6, "pass"), **_items("sin", 6, "pass")})
    r = CliRunner().invoke(main, ["gate", "--db", str(db), "--baseline", "empty", "--candidate", "cand"])
    assert r.exit_code == 2 and "baseline run empty (build 2.31.0) is empty" in _one_line(r)


@pytest.mark.parametrize("finish, shard, word", [
    (None, "1/1", "is running, not finished (interrupted, killed or still running)"),  # kill -9 leaves it running
    ("interrupted", "1/1", "is interrupted, not finished"),
    ("finished", "1/2", "is partial: some of its shards are missing"),
])
def test_unfinished_candidate_is_refused(db, finish, shard, word):
    with Store.open(db) as st:
        _run(st, "cut", "2.33.0", _items("exp", 3, "pass"), finish=finish, shard=shard)
    r = _gate(db, "--candidate", "cut")
    assert r.exit_code == 2
    line = _one_line(r)
    assert line.startswith("error: candidate run cut (build 2.33.0) ") and word in line


def test_different_selection_is_refused_unless_common_only(db, tmp_path):
    with Store.open(db) as st:
        _run(st, "wider", "2.33.0", {**_items("exp", 6, "pass"), **_items("sin", 5, "pass"),
                                     **_items("exp", 4, "pass", "bfloat16")},
             config={"dtypes": ["float32,bfloat16"], "max_samples": 6})
    r = _gate(db, "--candidate", "wider")
    assert r.exit_code == 2
    assert _one_line(r) == ("error: selections differ: baseline run base has dtypes=['float32'] but candidate run "
                            "wider has dtypes=['bfloat16', 'float32'] (and 1 more: max_samples); gate runs of the "
                            "same selection, or pass --common-only to compare the items both hold")
    out = tmp_path / "c.json"
    c = _gate(db, "--candidate", "wider", "--common-only", "--json", str(out))
    assert c.exit_code == 0, c.output
    assert "common-only: compared 11 items; ignored 1 only in the baseline, 4 only in the candidate" in c.output
    data = json.loads(out.read_text())
    assert data["common_only"] == {"compared": 11, "only_baseline": 1, "only_candidate": 4}
    assert not data["new"] and not data["removed"] and data["verdict"] == "pass"


def test_different_contract_checks_are_a_different_selection(db):
    """A run without contract checks has no 'contract' item to lose: gating it against one with
    them is refused; the same contracts spelled differently (or the default left out) gate."""
    with Store.open(db) as st:
        _run(st, "none", "2.33.0", {**_items("exp", 6, "pass"), **_items("sin", 6, "pass")},
             config={"contracts": ["none"]})
        _run(st, "spelled", "2.33.0", {**_items("exp", 6, "pass"), **_items("sin", 6, "pass")},
             config={"contracts": ["default,"]})
    r = _gate(db, "--candidate", "none")
    assert r.exit_code == 2
    assert _one_line(r).startswith("error: selections differ: baseline run base has contracts=['default'] but "
                                   "candidate run none has contracts=['none']")
    assert _gate(db, "--candidate", "spelled").exit_code == 0


def test_common_only_refuses_runs_that_share_only_their_canaries(db):
    with Store.open(db) as st:
        _run(st, "other", "2.33.0", {**CANARIES, **_items("exp", 3, "pass", "bfloat16")},
             config={"dtypes": ["bfloat16"]})
    r = _gate(db, "--candidate", "other", "--common-only")
    assert r.exit_code == 2
    assert _one_line(r) == ("error: baseline run base and candidate run other hold no item in common (12 only in the "
                            "baseline, 3 only in the candidate); nothing to compare")


def test_same_selection_spelled_differently_gates(db):
    with Store.open(db) as st:
        _run(st, "same", "2.33.0", {**_items("exp", 6, "pass"), **_items("sin", 6, "pass")},
             config={"ops": ["sin", "exp", "exp"], "dtypes": ["float32,"], "timeout_s": 9.0, "shard": "1/1"})
    assert _gate(db, "--candidate", "same").exit_code == 0


@pytest.mark.parametrize("args, needle", [
    (["--confirm-budget", "nan"], "confirm budget = nan s is not valid"),
    (["--confirm-budget", "inf"], "confirm budget = inf s is not valid"),
    (["--confirm-budget", "-1"], "confirm budget = -1.0 s is not valid"),
    (["--max-reruns", "-1"], "max reruns = -1 is not valid"),
    (["--reruns", "-2"], "reruns = -2 is not valid"),
])
def test_bad_confirmation_limits_are_refused_writing_nothing(db, tmp_path, args, needle):
    out = tmp_path / "g.json"
    r = _gate(db, "--candidate", "base", "--json", str(out), *args)
    assert r.exit_code == 2 and needle in _one_line(r)
    assert not out.exists()


# -- B. bounded confirmation (re-runs injected: what the confirmation decides and spends) ------
class FakeRerun:
    """Stands in for the re-run of items on the candidate: answers each key from ``outcome``."""

    def __init__(self, outcome):
        self.outcome, self.calls, self.keys = outcome, 0, []

    def __call__(self, candidate, keys, attempts):
        assert attempts == 1
        self.calls += 1
        self.keys += keys
        return {k: [self.outcome(k, self.keys.count(k))] for k in keys}


def _cand(db, items: dict[str, str]) -> None:
    with Store.open(db) as st:
        _run(st, "cand", "2.33.0", items)


def test_hanging_op_is_confirmed_once_per_representative(db):
    _cand(db, {**_items("exp", 6, "timeout"), **_items("sin", 6, "pass")})
    fake = FakeRerun(lambda key, n: "timeout")
    with Store.open(db) as st:
        result = run_gate(st, "base", "cand", rerun=fake)
    conf = result.confirmation
    assert (conf.reruns, conf.timeouts, conf.groups, conf.confirmed) == (2, 2, 1, 1)  # not 6 items x 3
    assert sorted(fake.keys) == ["exp|function|float32|0", "exp|function|float32|1"]
    assert len(result.of("regression")) == 6 and result.verdict == "fail"
    assert {f.evidence["confirmation"]["verdict"] for f in result.of("regression")} == {"confirmed"}


def test_mismatch_is_confirmed_k_times_and_a_flaky_op_is_one_flaky_group(db, tmp_path):
    _cand(db, {**_items("exp", 6, "mismatch"), **_items("sin", 6, "mismatch")})
    # exp always mismatches again; sin's second representative passes on its second re-run
    fake = FakeRerun(lambda key, n: "pass" if key == "sin|function|float32|1" and n == 2 else "mismatch")
    with Store.open(db) as st:
        result = run_gate(st, "base", "cand", rerun=fake)
        flakes = {r["item_key"]: r for r in st.db.query("select * from flakes where run_id = 'cand'")}
    conf = result.confirmation
    assert (conf.confirmed, conf.flaky, conf.unconfirmed) == (1, 1, 0)
    assert fake.keys.count("exp|function|float32|0") == 3 and fake.keys.count("sin|function|float32|0") == 2
    assert conf.reruns == 6 + 4  # sin was decided flaky after its second round
    assert {f.name for f in result.of("regression")} == {"exp"}
    assert {f.name for f in result.of("flaky")} == {"sin"} and len(result.of("flaky")) == 6
    assert [(g["op"], g["items"]) for g in result.flaky_groups()] == [("sin", 6)]
    lines = summary_lines(result)
    assert sum(line.startswith("  FLAKY sin [function, float32]") for line in lines) == 1
    assert not any("REGRESSION sin" in line for line in lines)
    assert {k: r["verdict"] for k, r in flakes.items()} == {
        "exp|function|float32|0": "confirmed", "exp|function|float32|1": "confirmed",
        "sin|function|float32|0": "flaky", "sin|function|float32|1": "flaky"}
    from conformance.gate.render import junit
    xml = junit(result)
    assert xml.count("<skipped") == 1 and 'skipped="1"' in xml


def test_a_regression_whose_reference_is_not_reproducible_is_neither_confirmed_nor_flaky(db):
    """Flaky means the target disagrees with itself while the CPU agrees with itself: a
    representative whose re-run finds the CPU reference not agreeing with itself (skip, "the CPU
    reference is not reproducible") makes its group unreproducible, which does not fail the gate."""
    from opdb.status import UNREPRODUCIBLE

    _cand(db, {**_items("exp", 4, "mismatch"), **_items("sin", 4, "mismatch")})
    fake = FakeRerun(lambda key, n: UNREPRODUCIBLE if key.startswith("sin") and n == 1 else "mismatch")
    with Store.open(db) as st:
        result = run_gate(st, "base", "cand", rerun=fake)
    conf = result.confirmation
    assert (conf.confirmed, conf.flaky, conf.unreproducible) == (1, 0, 1)
    assert {f.name for f in result.of("regression")} == {"exp"} and not result.of("flaky")
    assert {f.name for f in result.of("unreproducible")} == {"sin"} and len(result.of("unreproducible")) == 4
    lines = summary_lines(result)
    assert "0 flaky, 1 unreproducible" in next(line for line in lines if line.startswith("  confirmation:"))
    assert any(line.startswith("  UNREPRODUCIBLE sin [function, float32]") for line in lines)
    _cand(db, _items("sin", 4, "mismatch"))
    with Store.open(db) as st:  # alone, it does not fail the gate
        assert run_gate(st, "base", "cand", rerun=FakeRerun(lambda key, n: UNREPRODUCIBLE)).verdict == "pass"


def test_a_rerun_is_unreproducible_when_the_cpu_did_not_agree_with_itself():
    """Also a schema item's re-run, which searches again and finds no input it can keep because
    the CPU did not reproduce them."""
    from conformance.check.selfcheck import NOT_REPRODUCIBLE
    from conformance.run.runner import _rerun_status
    from opdb.status import UNREPRODUCIBLE

    assert _rerun_status({"status": "skip", "error": f"{NOT_REPRODUCIBLE}: 3 of 4 elements differ"}) == UNREPRODUCIBLE
    assert _rerun_status({"status": "skip", "error": f"no valid input: 80 generated calls rejected by the CPU "
                                                     f"(50x {NOT_REPRODUCIBLE}: 1 of 1 result elements differ)"}) \
        == UNREPRODUCIBLE
    assert _rerun_status({"status": "skip", "error": "CPU reference crashed (signal 6 (SIGABRT)); no verdict for "
                                                     "the target"}) == UNREPRODUCIBLE  # it ran before
    assert _rerun_status({"status": "skip", "error": "no valid input: 80x CPU reference failed: IndexError"}) == "skip"
    assert _rerun_status({"status": "mismatch", "error": "output 0 differs"}) == "mismatch"


def test_budget_leaves_groups_unconfirmed_and_reports_what_it_spent(db, tmp_path):
    ops = ("exp", "sin")
    _cand(db, {**_items("exp", 6, "timeout"), **_items("sin", 6, "timeout")})
    fake = FakeRerun(lambda key, n: "timeout")
    out = tmp_path / "g.json"
    with Store.open(db) as st:
        # timeout_s is 2 s: one hanging group costs two timeouts (4 s), more than a 3 s budget
        result = run_gate(st, "base", "cand", rerun=fake, budget_s=3.0)
        marker = next(st.db.query("select evidence from gate_items where category = 'verdict'"))
    conf = result.confirmation
    assert (conf.reruns, conf.unconfirmed, conf.groups) == (0, 2, 2) and fake.calls == 0
    assert result.verdict == "fail" and {f.name for f in result.of("regression")} == set(ops)
    assert all(f.evidence["confirmation"]["verdict"] == "unconfirmed" for f in result.of("regression"))
    assert "budget spent" in result.of("regression")[0].evidence["confirmation"]["why"]
    assert json.loads(marker["evidence"])["confirmation"]["unconfirmed"] == 2
    lines = summary_lines(result)
    assert any(line.startswith("  confirmation: 0 re-run(s)") and "2 unconfirmed" in line for line in lines)
    assert "  REGRESSION exp [function, float32] pass -> timeout (6 items, unconfirmed)" in lines
    # a count budget: one group's two re-runs fit, the other's do not
    fake = FakeRerun(lambda key, n: "timeout")
    with Store.open(db) as st:
        result = run_gate(st, "base", "cand", rerun=fake, max_reruns=3)
    assert (result.confirmation.reruns, result.confirmation.confirmed, result.confirmation.unconfirmed) == (2, 1, 1)
    # the CLI prints and stores the same
    r = CliRunner().invoke(main, ["gate", "--db", str(db), "--baseline", "base", "--candidate", "cand",
                                  "--confirm-budget", "0", "--json", str(out)])
    assert r.exit_code == 1 and "confirmation: 0 re-run(s)" in r.output
    assert json.loads(out.read_text())["confirmation"]["unconfirmed"] == 2


# -- B. on the emulator: a hanging op with many samples, a probability-flaky op -----------------
BUILD = """
[build]
name = "{name}"
inherits = "2.33.0"
{defects}
"""


def _manifest(tmp_path, name: str, defects: str) -> str:
    p = tmp_path / f"{name}.toml"
    p.write_text(textwrap.dedent(BUILD.format(name=name, defects=defects)))
    return str(p)


def _emu_run(db, build: str, ops: tuple[str, ...], max_samples: int | None, timeout_s: float = 60.0,
             contracts: tuple[str, ...] = ("default",)) -> str:
    # only the hang test needs a short timeout; elsewhere a loaded machine must not turn a slow
    # canary into an infra run
    spec = RunSpec(target="neuron-emu", build=build, ops=ops, dtypes=("float32",), workers=2, timeout_s=timeout_s,
                   max_samples=max_samples, variants=("function",), contracts=contracts)
    return execute_run(spec, db).run_id


def test_hang_build_confirmation_costs_two_timeouts_not_samples_times_three(tmp_path):
    hang = '[[defects]]\nop = "aten::sub.Tensor"\ndtypes = ["float32"]\nkind = "hang"\n'
    db = tmp_path / "h.sqlite"
    # 4 samples: each hang costs the candidate's 3 s timeout, one after another (one op x dtype is
    # one group), and so does each re-run; the clean baseline hangs nowhere and keeps the default
    base = _emu_run(db, _manifest(tmp_path, "clean", ""), ("sub",), 4)
    cand = _emu_run(db, _manifest(tmp_path, "hangs", hang), ("sub",), 4, timeout_s=3.0)
    with Store.open(db) as st:
        result = run_gate(st, base, cand)
    timeouts = [f for f in result.of("regression") if f.candidate == "timeout"]
    assert len(timeouts) >= 3, [f.as_json() for f in result.findings]  # many hanging samples ...
    conf = result.confirmation
    assert (conf.reruns, conf.timeouts) == (2, 2)  # ... confirmed by two re-runs (was one per sample x 3: 12)
    assert conf.confirmed == conf.groups and not result.of("flaky")


def test_probability_flaky_op_is_one_flaky_group_never_also_a_regression(tmp_path):
    flaky = '[[defects]]\nop = "aten::exp.default"\nkind = "wrong_result"\nmagnitude = 0.5\nprobability = 0.5\n'
    db = tmp_path / "f.sqlite"
    # Without contracts: the determinism and variants contracts call the op again within the item,
    # so a defect that strikes every other call makes the item 'contract' on every re-run (a
    # confirmed regression, rightly); the flake confirmation of the values is what is under test.
    base = _emu_run(db, _manifest(tmp_path, "clean", ""), ("exp",), None, contracts=("none",))
    cand = _emu_run(db, _manifest(tmp_path, "flaky", flaky), ("exp",), None, contracts=("none",))
    with Store.open(db) as st:
        result = run_gate(st, base, cand)
    assert result.of("flaky"), [f.as_json() for f in result.findings]
    groups = {(f.name, f.variant, f.dtype) for f in result.of("flaky")}
    assert not groups & {(f.name, f.variant, f.dtype) for f in result.of("regression")}
    assert len(result.flaky_groups()) == len(groups) == result.confirmation.flaky
    assert result.confirmation.reruns <= 2 * 3 * result.confirmation.groups
