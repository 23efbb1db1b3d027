"""kill -9 in the middle of a run, then --resume: the run completes with no row lost or doubled;
shards merge to the unsharded result; the repro script reproduces a stored result."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from conformance.cli import main
from conformance.run.runner import CodeChangedWarning, KilledRunResumed, RunSpec, _git_sha, execute_run
from opdb import Store

# Enough work (conv2d and sort have many samples) that the kill always lands mid-run: the canaries'
# rows land first, the sweep's after them. Not mul: building its sparse samples took most of each run.
OPS = ("abs", "add", "sub", "neg", "exp", "sin", "cos", "sort", "sum", "mean", "clamp", "nn.functional.conv2d")


def _keys(db, run_id=None):
    with Store.open(db) as st:
        q = "select item_key, status from op_results" + (" where run_id = ?" if run_id else "")
        return [(r["item_key"], r["status"]) for r in st.db.query(q, [run_id] if run_id else [])]


def test_kill_9_then_resume_completes_exactly(tmp_path):
    ref_db, db = tmp_path / "ref.sqlite", tmp_path / "killed.sqlite"
    spec = RunSpec(target="cpu", ops=OPS, dtypes=("float32", "int64"), workers=1, sizes="auto")  # as the CLI
    execute_run(spec, ref_db)
    expected = _keys(ref_db)
    cmd = [sys.executable, "-m", "conformance", "run", "--target", "cpu", "-n", "1", "--quiet",
           "--dtypes", "float32,int64", "--db", str(db)] + [a for op in OPS for a in ("--ops", op)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    # Poll until the first row lands. The bound only guards against a hang: on a loaded 2-core
    # machine the start-up (op_db, fork server) alone can take minutes.
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.3)
        if db.exists():
            try:
                if len(_keys(db)) >= 1:
                    break
            except Exception:  # noqa: BLE001 - the DB may be mid-creation
                pass
    os.killpg(proc.pid, signal.SIGKILL)  # the supervisor and its workers, no clean-up
    proc.wait()
    partial = _keys(db)
    assert 0 < len(partial) < len(expected)
    with Store.open(db, create=False) as st:  # a reader (the site, the listing) sees it killed
        run_id = st.runs()[0]["id"]
        assert st.get_run(run_id)["status"] == "interrupted"
    with Store.open(db) as st:  # a writer marks it so
        assert st.get_run(run_id)["status"] == "interrupted" and st.killed(run_id)
        assert st.shard_status(run_id) == "interrupted"
    with pytest.warns(KilledRunResumed, match=f"run {run_id} was killed"):
        r = CliRunner().invoke(main, ["run", "--resume", run_id, "--db", str(db), "--quiet", "-n", "1"])
    assert r.exit_code == 0, r.output
    final = _keys(db)
    assert len(final) == len({k for k, _ in final})  # nothing doubled
    assert sorted(final) == sorted(expected)  # nothing lost, same verdicts
    with Store.open(db) as st:
        assert st.get_run(run_id)["status"] == "finished"
    again = CliRunner().invoke(main, ["run", "--resume", run_id, "--db", str(db)])
    assert again.exit_code == 2 and "already finished" in again.output


def test_two_shards_merge_to_the_unsharded_run(tmp_path):
    ops = ("abs", "add", "sort", "sum", "neg")
    full = tmp_path / "full.sqlite"
    execute_run(RunSpec(target="cpu", ops=ops, dtypes=("float32",), workers=1), full)
    shards = []
    for k in (1, 2):
        p = tmp_path / f"s{k}.sqlite"
        execute_run(RunSpec(target="cpu", ops=ops, dtypes=("float32",), workers=1, shard=f"{k}/2",
                            run_id="nightly-1"), p)
        shards.append(p)
    assert all(len(_keys(p)) > 0 for p in shards)
    merged = tmp_path / "merged.sqlite"
    r = CliRunner().invoke(main, ["merge", str(merged), *map(str, shards)])
    assert r.exit_code == 0, r.output
    assert sorted(_keys(merged)) == sorted(_keys(full))
    with Store.open(merged) as st:
        assert st.get_run("nightly-1")["status"] == "finished"


def test_repro_script_reproduces_a_result(tmp_path):
    db = tmp_path / "r.sqlite"
    execute_run(RunSpec(target="cpu", ops=("sin",), dtypes=("float32",), workers=1, max_samples=1), db)
    with Store.open(db) as st:
        rid = next(iter(st.db.query("select id from op_results limit 1")))["id"]
    r = CliRunner().invoke(main, ["repro", str(rid), "--db", str(db), "--out", str(tmp_path / "repro")])
    assert r.exit_code == 0, r.output
    script = tmp_path / "repro" / f"repro_{rid}.py"
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr
    assert "CPU result" in out.stdout and "target result" in out.stdout and "within tolerance" in out.stdout


def test_repro_writes_several_results_in_one_call_and_names_the_one_it_cannot(tmp_path):
    """``conformance repro A B C``: one script each, one call; an id the database lacks says so on
    its own line, the others are still written, and the exit code says something was refused."""
    db = tmp_path / "r.sqlite"
    execute_run(RunSpec(target="cpu", ops=("sin", "cos"), dtypes=("float32",), workers=1, max_samples=1), db)
    with Store.open(db) as st:
        ids = [r["id"] for r in st.db.query("select id from op_results order by id limit 2")]
    out = tmp_path / "repro"
    r = CliRunner().invoke(main, ["repro", *map(str, ids), "--db", str(db), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert all((out / f"repro_{i}.py").exists() for i in ids) and r.output.count("wrote ") == 2
    missing = max(ids) + 1000
    r = CliRunner().invoke(main, ["repro", str(ids[0]), str(missing), str(ids[1]), "--db", str(db),
                                  "--out", str(tmp_path / "again")])
    assert r.exit_code == 2
    assert f"result {missing}" in r.output and "1 of 3 results have no script" in r.output
    assert all((tmp_path / "again" / f"repro_{i}.py").exists() for i in ids)


def test_repro_of_backward_and_schema_results(tmp_path):
    import textwrap

    manifest = tmp_path / "m.toml"
    manifest.write_text(textwrap.dedent("""
        [build]
        name = "repro-defects"
        inherits = "2.33.0"
        [ops]
        native = ["aten::_add_relu.Tensor", "aten::relu.default", "aten::threshold_backward.default"]
        [[defects]]
        op = "aten::_add_relu.Tensor"
        dtypes = ["float32"]
        min_numel = 3
        kind = "wrong_result"
        magnitude = 0.5
        [[defects]]
        op = "aten::threshold_backward.default"
        kind = "wrong_result"
        magnitude = 0.5
    """))
    from conformance.sweep.opinfo import SweepConfig
    from conformance.sweep.schema import run_schema_group
    from conformance.targets import get_target
    from conformance.work import Group

    db = tmp_path / "r.sqlite"
    execute_run(RunSpec(target="neuron-emu", build=str(manifest), ops=("nn.functional.relu",), dtypes=("float32",),
                        workers=1, variants=("backward",)), db)
    rows = list(run_schema_group(get_target("neuron-emu", str(manifest)),
                                 Group("aten::_add_relu.Tensor", "any", "schema"), SweepConfig()))
    with Store.open(db) as st:
        run_id = st.runs()[0]["id"]
        st.insert("op_results", [{**rows[0], "run_id": run_id}])
        bwd = next(iter(st.db.query("select id from op_results where variant = 'backward' and status = 'mismatch'")))
        sch = next(iter(st.db.query("select id from op_results where variant = 'schema'")))
    for rid in (bwd["id"], sch["id"]):
        r = CliRunner().invoke(main, ["repro", str(rid), "--db", str(db), "--out", str(tmp_path / "repro")])
        assert r.exit_code == 0, r.output
        out = subprocess.run([sys.executable, str(tmp_path / "repro" / f"repro_{rid}.py")], capture_output=True,
                             text=True, timeout=900)
        assert out.returncode == 1 and "MISMATCH" in out.stdout, out.stdout + out.stderr


def test_a_run_resumed_with_other_harness_code_says_so(tmp_path):
    """Its earlier items keep the old code's verdicts: a resume across commits warns, naming both."""
    db = tmp_path / "r.sqlite"
    summary = execute_run(RunSpec(target="cpu", ops=("abs",), dtypes=("float32",), workers=1, max_samples=1), db)
    def interrupted(sha):
        with Store.open(db) as st:
            st.db.execute("update runs set git_sha = ?, status = 'interrupted' where id = ?", [sha, summary.run_id])
            st.db.execute("update run_shards set status = 'interrupted' where run_id = ?", [summary.run_id])
            st.db.conn.commit()

    interrupted("c0ffee000000")
    spec = RunSpec(target="cpu", workers=1)
    with pytest.warns(CodeChangedWarning, match=f"started with harness commit c0ffee000000 and resumes with {_git_sha()}"):
        execute_run(spec, db, resume=summary.run_id)
    interrupted(_git_sha())  # the same code resumes quietly
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", CodeChangedWarning)
        execute_run(spec, db, resume=summary.run_id)


def test_a_run_is_killed_only_when_its_process_is_gone(tmp_path):
    """A running shard whose process lives is running (resuming it would make two writers of one
    run: refused); one whose process is gone, or whose pid now names another process, is killed."""
    from opdb import OpdbError
    from opdb.store import owner_gone, process_owner

    db = tmp_path / "runs.sqlite"
    with Store.open(db) as st:
        run_id = st.start_run(target="cpu", build="-", torch_version="x", config={})
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with Store.open(db) as st:
            st.db.execute("update run_shards set owner = ?", [process_owner(other.pid)])
        with Store.open(db, create=False) as st:
            assert st.get_run(run_id)["status"] == "running" and not st.killed(run_id)
        with Store.open(db) as st, pytest.raises(
                OpdbError, match=f"run {run_id!r} shard 1/1 is still running .process {other.pid}"):
            st.resume_run(run_id)
    finally:
        other.kill()
        other.wait()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert owner_gone(f"{gone.pid}:1") and not owner_gone(process_owner()) and not owner_gone(None)
    me, start = process_owner().split(":")
    assert owner_gone(f"{me}:{int(start) + 1}")  # the pid lives, but it is another process now
    with Store.open(db) as st:
        st.db.execute("update run_shards set owner = ?", [f"{gone.pid}:1"])
    with Store.open(db) as st:
        assert st.get_run(run_id)["status"] == "interrupted" and st.killed(run_id)
        st.resume_run(run_id)
        assert st.get_run(run_id)["status"] == "running" and not st.killed(run_id)


def test_the_harness_commit_is_read_from_a_clone_a_worktree_and_packed_refs(tmp_path):
    from pathlib import Path

    sha = "0123456789abcdef0123456789abcdef01234567"
    clone = tmp_path / "clone"
    (clone / ".git/refs/heads").mkdir(parents=True)
    (clone / ".git/HEAD").write_text("ref: refs/heads/main\n")
    (clone / ".git/packed-refs").write_text(f"# pack-refs with: peeled\n{sha} refs/heads/main\n")
    assert _git_sha(clone) == sha[:12]  # the branch only in packed-refs
    (clone / ".git/refs/heads/main").write_text("f" * 40 + "\n")
    assert _git_sha(clone) == "f" * 12  # a loose ref wins
    tree = tmp_path / "tree"
    (clone / ".git/worktrees/tree").mkdir(parents=True)
    (clone / ".git/worktrees/tree/HEAD").write_text(sha + "\n")  # a detached worktree
    (clone / ".git/worktrees/tree/commondir").write_text("../..\n")
    tree.mkdir()
    (tree / ".git").write_text(f"gitdir: {clone / '.git/worktrees/tree'}\n")
    assert _git_sha(tree) == sha[:12]
    (clone / ".git/worktrees/tree/HEAD").write_text("ref: refs/heads/main\n")
    assert _git_sha(tree) == "f" * 12  # its branch's ref, in the common folder
    assert _git_sha(tmp_path / "nothing") == "" and _git_sha(Path(tmp_path)) == ""


def test_the_hand_check_writes_scripts_in_batches_and_runs_them_side_by_side(tmp_path):
    """tools/findings_repro.py's ``reproduce_many``: one outcome per row, in batches, two scripts at
    a time; a row whose script cannot be written is ``no script`` with the reason, and does not
    stop the others."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    from findings_repro import reproduce_many

    db = tmp_path / "r.sqlite"
    execute_run(RunSpec(target="cpu", ops=("sin", "cos", "neg"), dtypes=("float32",), workers=1, max_samples=1), db)
    with Store.open(db) as st:
        rows = [dict(r) for r in st.db.query("select id, op, variant, dtype, sample, status, error "
                                            "from op_results order by id limit 3")]
    rows.insert(1, {**rows[0], "id": 99999})
    got = {row["id"]: (outcome, said) for row, outcome, said in
           reproduce_many(db, rows, tmp_path / "scripts", jobs=2, batch=2)}
    assert set(got) == {r["id"] for r in rows}
    assert got[99999][0] == "no script" and "99999" in got[99999][1]
    # a passing CPU item: its script runs and finds nothing to reproduce
    assert all(got[r["id"]][0] == "not reproduced" for r in rows if r["id"] != 99999), got
