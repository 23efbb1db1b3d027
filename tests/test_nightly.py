"""The nightly pipeline, sharded as a CI matrix would run it: 2 shards as separate processes,
merged, then finished (coverage, gate, report) — equal to an unsharded nightly."""

from __future__ import annotations

import subprocess
import sys

import pytest

from opdb import Store

ARGS = ["--build", "2.32.0", "--build", "2.33.0", "--ops", "abs", "--ops", "cumsum",
        "--dtypes", "float32", "--no-models", "--no-schema", "-n", "1",
        "--reference-inputs", "none"]  # not the night's slice: these nightlies run the same items every day


def _items(db) -> list[tuple[str, str, str]]:
    with Store.open(db) as st:
        return sorted((r["build"], r["item_key"], r["status"]) for r in st.db.query(
            "select runs.build, item_key, op_results.status from op_results join runs on runs.id = run_id"))


def test_two_shards_merge_and_finish_like_the_unsharded_nightly(tmp_path):
    from click.testing import CliRunner

    from conformance.cli import main

    full = tmp_path / "full.sqlite"
    shards = [tmp_path / f"shard{k}.sqlite" for k in (1, 2)]
    # the shards are separate processes, as a CI matrix runs them; the unsharded nightly, the merge
    # and the finish run the same commands in this process (while the shards start up)
    procs = [subprocess.Popen([sys.executable, "-m", "conformance", "nightly", *ARGS, "--shard", f"{k}/2",
                               "--run-id-prefix", "n42", "--db", str(p)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for k, p in zip((1, 2), shards, strict=True)]
    r = CliRunner().invoke(main, ["nightly", *ARGS, "--db", str(full), "--site", str(tmp_path / "site-full")])
    assert r.exit_code in (0, 1), r.output[-2000:]
    assert "gate 2.32.0" in r.output
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-2000:]
        assert "merge the shard databases" in out
    merged = tmp_path / "merged.sqlite"
    m = CliRunner().invoke(main, ["merge", str(merged), *map(str, shards)])
    assert m.exit_code == 0, m.output
    fin = CliRunner().invoke(main, ["nightly", *ARGS, "--finish", "--db", str(merged), "--site", str(tmp_path / "site")])
    assert fin.exit_code == r.exit_code, fin.output[-2000:]
    assert "gate 2.32.0" in fin.output and (tmp_path / "site" / "index.html").exists()
    assert _items(merged) == _items(full)
    with Store.open(merged) as st:
        assert {x["status"] for x in st.runs()} == {"finished"}
        assert st.count("coverage") == 2 * st.count("ops") or st.count("coverage") > 3000


def _interrupt_in(build: str):
    """A progress callback that stops the sweep of ``build`` at its first line, as Ctrl-C would."""
    def progress(line: str) -> None:
        if f" {build} " in line:
            raise KeyboardInterrupt

    return progress


def test_an_interrupted_nightly_stops_at_its_build_and_resumes_from_there(tmp_path):
    from conformance.gate.nightly import NightlySpec, run_nightly
    from conformance.run.spec import RunSpec
    from conformance.select import SelectionError

    db, said = tmp_path / "n.sqlite", []
    run = RunSpec(ops=("abs",), dtypes=("float32",), schema=False, workers=1)
    spec = NightlySpec(run=run, builds=("2.32.0", "2.33.0"), site=str(tmp_path / "site"))
    first = run_nightly(spec, db, progress=_interrupt_in("2.33.0"), echo=said.append)
    assert first.interrupted == "2.33.0" and first.prefix, said
    assert f"--resume {first.prefix}" in said[-1]
    with Store.open(db) as st:
        status = {r["build"]: r["status"] for r in st.runs()}
        assert status == {"2.32.0": "finished", "2.33.0": "interrupted"}, status
        assert st.count("coverage") == 0  # no stage after the sweeps ran on unfinished runs
        before = st.count("op_results", run_id=first.runs["2.32.0"])
    assert not (tmp_path / "site").exists() and first.gates == []

    other = NightlySpec(run=run.replace(dtypes=("bfloat16",)), builds=spec.builds, site=spec.site)
    with pytest.raises(SelectionError, match="2.32.0 was started with dtypes"):
        run_nightly(other, db, resume=first.prefix, echo=said.append)
    with pytest.raises(SelectionError, match="no nightly 'nope'"):
        run_nightly(spec, db, resume="nope", echo=said.append)

    said.clear()
    second = run_nightly(spec, db, resume=first.prefix, echo=said.append)
    assert second.interrupted is None and second.runs == first.runs, said
    assert any("2.32.0: finished by an earlier session" in s for s in said), said
    with Store.open(db) as st:
        assert {r["status"] for r in st.runs()} == {"finished"} and len(st.runs()) == 2
        assert st.count("op_results", run_id=first.runs["2.32.0"]) == before  # kept, not swept again
        assert st.count("coverage") > 0
    assert len(second.gates) == 1 and (tmp_path / "site" / "index.html").exists()


def test_the_nightly_command_exits_130_when_interrupted(tmp_path, monkeypatch):
    from click.testing import CliRunner

    import conformance.run.runner
    from conformance.cli import main

    monkeypatch.setattr(conformance.run.runner, "stderr_progress", lambda: _interrupt_in("2.33.0"))
    r = CliRunner().invoke(main, ["nightly", *ARGS, "--db", str(tmp_path / "n.sqlite"), "--site", str(tmp_path / "s")])
    assert r.exit_code == 130, r.output
    assert "nightly interrupted in the sweep of 2.33.0" in r.output and "--resume " in r.output


def test_a_nightly_without_ops_checks_the_targets_custom_ops_and_says_so(tmp_path, monkeypatch):
    """No nightly test runs the default selection (every OpInfo: hours), so the spec the command
    builds is caught before it runs: without --ops the custom-op lane is in it (every custom op,
    float32 and bfloat16) and the sweep's heading names it; --ops 'neuron::*' runs the lane alone,
    and OpInfo globs alone leave it out."""
    from click.testing import CliRunner

    import conformance.gate.nightly
    from conformance.cli import main
    from conformance.customops import CUSTOM_OPS
    from conformance.gate.nightly import NightlyResult, sweep_parts

    specs = []

    def caught(spec, db_path, **kw):
        specs.append(spec)
        return NightlyResult()

    monkeypatch.setattr(conformance.gate.nightly, "run_nightly", caught)
    for ops in ([], ["--ops", "neuron::*"], ["--ops", "abs"]):
        r = CliRunner().invoke(main, ["nightly", *ops, "--db", str(tmp_path / "n.sqlite")])
        assert r.exit_code == 0, r.output
    plain, custom, opinfo = (s.run for s in specs)
    assert [g.key for g in CUSTOM_OPS.groups(plain.selection)] == ["*::*|float32", "*::*|bfloat16"]
    assert sweep_parts(plain) == ["OpInfo sweep", "schema search", "custom ops", "models"]
    assert sweep_parts(custom) == ["custom ops", "models"]
    assert sweep_parts(opinfo) == ["OpInfo sweep", "models"]
    assert "the target's custom ops" in CliRunner().invoke(main, ["nightly", "--help"]).output
