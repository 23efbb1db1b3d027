"""`conformance run` tells the truth and refuses bad input: bad option values are one line and
exit 2 with nothing written; a resumed run's exit code and summary are about the whole run; a
run that ends with no item is an error; a reused --run-id cannot mix two runs."""

from __future__ import annotations

import re
import textwrap

import pytest
from click.testing import CliRunner

from conformance.check.verdict import FAILING, Status
from conformance.cli import main
from conformance.run.runner import RunSpec, execute_run
from conformance.select import RUNNABLE_DTYPES, SelectionError
from opdb import Store

TINY = ["--target", "cpu", "--ops", "abs", "--dtypes", "float32", "--variants", "function", "--quiet"]


@pytest.mark.parametrize(("args", "named"), [
    (["--timeout", "nan"], "--timeout nan"),
    (["--timeout", "0"], "--timeout 0"),
    (["--timeout", "-5"], "--timeout -5"),
    (["--timeout", "inf"], "--timeout inf"),
    (["--dtypes", "float"], "--dtypes 'float'"),
    (["--dtypes", "qint8"], "--dtypes 'qint8'"),
    (["--dtypes", ","], "--dtypes ','"),
    (["--dtypes", "float32,nope"], "--dtypes 'nope'"),  # one bad name among good ones
    (["--shard", "5/5"], "--shard 5/5"),
    (["--shard", "0/3"], "--shard '0/3'"),
    (["--shard", "3/2"], "--shard '3/2'"),
    (["--shard", "x/y"], "--shard 'x/y'"),
    (["--shard", "1/0"], "--shard '1/0'"),
    (["--max-samples", "0"], "--max-samples 0"),
    (["--max-samples", "-1"], "--max-samples -1"),
    (["--model-limit", "0"], "--model-limit 0"),
])
def test_bad_value_is_one_line_exit_2_nothing_written(tmp_path, args, named):
    db = tmp_path / "r.sqlite"
    base = TINY[:4] + TINY[6:] if args[0] == "--dtypes" else TINY
    r = CliRunner().invoke(main, ["run", *base, *args, "--db", str(db)])
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1, r.output
    assert lines[0].startswith("error: ") and named in lines[0], lines[0]
    assert r.exception is None or isinstance(r.exception, SystemExit)
    assert not db.exists()


def test_dtype_errors_list_what_is_accepted_and_point_aliases_to_their_name():
    for bad, hint in (("float", "torch.float is float32"), ("long", "torch.long is int64"),
                      ("qint8", "no OpInfo runs it"), ("nope", "")):
        with pytest.raises(SelectionError) as e:
            RunSpec(dtypes=(bad,))
        assert hint in str(e.value) and "accepted: " + ", ".join(RUNNABLE_DTYPES) in str(e.value)


def test_runnable_dtypes_are_those_some_opinfo_runs_on_the_cpu():
    from conformance.inputs.opinfo import by_name, cpu_dtypes

    live = {str(d).removeprefix("torch.") for info in by_name().values() for d in cpu_dtypes(info)}
    assert set(RUNNABLE_DTYPES) == live


def test_run_that_records_no_item_is_an_error(tmp_path):
    # a valid selection that runs nothing: conv2d has no in-place variant
    db = tmp_path / "r.sqlite"
    r = CliRunner().invoke(main, ["run", "--target", "cpu", "--ops", "nn.functional.conv2d", "--dtypes", "float32",
                                  "--variants", "inplace", "--quiet", "--db", str(db)])
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1, r.output
    assert "recorded no item" in lines[0] and "--variants inplace" in lines[0]


def _cpu(ops, **kw):
    return RunSpec(target="cpu", ops=ops, dtypes=("float32",), workers=1, max_samples=1, variants=("function",), **kw)


def test_reused_run_id_refuses_another_selection_seed_or_an_already_run_shard(tmp_path):
    db = tmp_path / "r.sqlite"
    execute_run(_cpu(("abs", "neg"), run_id="R", shard="1/2"), db)
    with Store.open(db) as st:
        before = st.count("op_results")
    for spec, why in ((_cpu(("abs", "sin"), run_id="R", shard="2/2"), "ops="),
                      (_cpu(("abs", "neg"), run_id="R", shard="2/2", seed=7), "seed="),
                      (_cpu(("abs", "neg"), run_id="R", shard="1/2"), "already holds shard 1/2")):
        with pytest.raises(SelectionError) as e:
            execute_run(spec, db)
        assert "--run-id R" in str(e.value) and why in str(e.value), str(e.value)
    with Store.open(db) as st:
        assert st.count("op_results") == before
        assert st.get_run("R")["status"] == "partial"
    # the same spec's other shard joins the run
    execute_run(_cpu(("abs", "neg"), run_id="R", shard="2/2"), db)
    with Store.open(db) as st:
        assert st.get_run("R")["status"] == "finished"
        assert {r["shard"] for r in st.db.query("select shard from op_results")} == {"1/2", "2/2"}


RESUME_MANIFEST = """
[build]
name = "resume-defect"
inherits = "2.33.0"
[ops]
native = ["aten::neg.default", "aten::reciprocal.default"]
[[defects]]
op = "aten::neg.default"
kind = "wrong_result"
magnitude = 0.5
"""
HANG = """
[[defects]]
op = "aten::reciprocal.default"
kind = "hang"
"""


def test_resumed_run_exit_code_and_summary_cover_the_part_before_the_interruption(tmp_path):
    manifest, db = tmp_path / "m.toml", tmp_path / "r.sqlite"
    # neg mismatches (its group runs first); reciprocal hangs, so the interruption lands there
    manifest.write_text(textwrap.dedent(RESUME_MANIFEST + HANG))

    def interrupt(line: str) -> None:
        # as a signal would, once neg's group is done and its mismatches are counted
        failing = re.search(r"([\d,]+) failing", line)
        if failing and int(failing.group(1).replace(",", "")) > 0:
            raise KeyboardInterrupt

    first = execute_run(RunSpec(target="neuron-emu", build=str(manifest), ops=("neg", "reciprocal"),
                                dtypes=("float32",), workers=1, timeout_s=300, variants=("function", "out")), db,
                        progress=interrupt)
    assert first.interrupted and first.counts["mismatch"] > 0, first.render()
    # the hang is gone by the time the run resumes: everything run now passes
    manifest.write_text(textwrap.dedent(RESUME_MANIFEST))
    r = CliRunner().invoke(main, ["run", "--resume", first.run_id, "--db", str(db), "--quiet", "-n", "1"])
    with Store.open(db) as st:
        mismatches = st.count("op_results", run_id=first.run_id, status="mismatch")
        total = st.count("op_results", run_id=first.run_id) - st.count("op_results", run_id=first.run_id,
                                                                          variant="canary")
        resumed = [r["status"] for r in st.db.query("select status from op_results where op = 'reciprocal'")]
    assert resumed and not any(Status(s) in FAILING for s in resumed), resumed
    assert r.exit_code == 1, r.output
    assert f"run {first.run_id}: {total} items" in r.output and "recorded by an earlier session" in r.output
    assert re.search(rf"^\s+mismatch\s+{mismatches}$", r.output, re.M), r.output
