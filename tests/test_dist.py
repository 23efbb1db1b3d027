"""The distributed lane (``conformance dist``): items and their exact answers, the lane on the CPU's
gloo backend and on the emulated device's c10d backend (no false alarms on a shipped build; seeded
collective defects caught at the right collective, dtype and world size; a crash and a hang
isolated), its store, resume, and the CLI's JSON and exit code."""

from __future__ import annotations

import json
import tempfile

import pytest
import torch
from click.testing import CliRunner

from conformance.dist.items import COLLECTIVES, DistItem, enumerate_items, expected, rank_input, split_sizes
from conformance.dist.lane import DistError, DistSpec, run_dist, worst
from opdb import Store
from opdb import dist as db

pytestmark = [pytest.mark.filterwarnings("ignore:neuron. operator"), pytest.mark.xdist_group("dist")]


# -- items -----------------------------------------------------------------------------------
def test_every_collective_has_items_and_an_exact_answer():
    items = enumerate_items(tuple(COLLECTIVES), ("float32", "int64"), (3,))
    assert {i.collective for i in items} == set(COLLECTIVES)
    assert not [i for i in items if i.reduce_op == "avg" and i.dtype == "int64"]  # no AVG of integers
    for item in items:
        inputs = [rank_input(item, r) for r in range(3)]
        assert [rank_input(item, r).tolist() for r in range(3)] == [x.tolist() for x in inputs]  # seeded
        for r in range(3):
            want = expected(item, inputs, r)
            assert want is None or want.dtype in (torch.float64, torch.int64)


def test_uneven_all_to_all_splits_agree_between_ranks():
    item = DistItem("all_to_all_single", "", "float32", 3, "uneven")
    for r in range(3):
        sends, recvs = split_sizes(item, r)
        assert recvs == [split_sizes(item, s)[0][r] for s in range(3)]  # what s sends to r
        assert expected(item, [rank_input(item, s) for s in range(3)], r).numel() == sum(recvs)


def test_reduce_scatter_and_sum_answers():
    item = DistItem("reduce_scatter_tensor", "sum", "float32", 2, "vector")
    x = [rank_input(item, r) for r in range(2)]
    total = x[0].double() + x[1].double()
    assert torch.equal(expected(item, x, 1), total[7:])
    assert worst(["pass", "timeout", "mismatch"]) == "timeout"


@pytest.mark.parametrize(("kw", "message"), [
    ({"world_sizes": (0,)}, "--world-sizes 0"),
    ({"collectives": ("all_reduce", "gossip")}, "--collectives 'gossip'"),
    ({"dtypes": ("complex64",)}, "--dtypes 'complex64'"),
    ({"timeout_s": 0}, "--timeout 0"),
])
def test_bad_options_are_one_clear_error(kw, message):
    with pytest.raises(DistError, match=message):
        DistSpec(**kw)


# -- the lane on the CPU (gloo) ----------------------------------------------------------------
def test_gloo_at_world_size_two_passes_everything_and_resumes(tmp_path, monkeypatch):
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # where the ranks' rendezvous folder goes
    spec = DistSpec(target="cpu", world_sizes=(2,), dtypes=("float32", "int64"))
    with Store.open(tmp_path / "d.sqlite") as st:
        first = run_dist(spec, st, run_id="d-cpu")
        assert first.rows and not first.failing, first.failing[:3]
        assert db.get_run(st, "d-cpu")["status"] == "finished" and db.get_run(st, "d-cpu")["backend"] == "gloo"
        again = run_dist(spec, st, run_id="d-cpu")  # everything stored: nothing to run
        assert again.rows == [] and len(db.results(st, "d-cpu")) == len(first.rows)
    assert list(temp.iterdir()) == []  # the world's rendezvous folder is gone with it


# -- the lane on the emulated device's c10d backend --------------------------------------------
def test_shipped_build_has_no_false_alarms(tmp_path):
    spec = DistSpec(build="2.33.0", world_sizes=(3,), dtypes=("float32", "bfloat16"))
    with Store.open(tmp_path / "d.sqlite") as st:
        result = run_dist(spec, st)
        assert result.rows and not result.failing, result.failing[:3]
        assert db.get_run(st, result.run_id)["backend"] == "neuron"


SEEDED = """
[[defects]]
op = "c10d::all_reduce"
kind = "wrong_result"
magnitude = 0.01
dtypes = ["bfloat16"]
world_sizes = [3]

[[defects]]
op = "c10d::reduce_scatter_tensor"
kind = "error"

[[defects]]
op = "c10d::all_to_all_single"
kind = "hang"
dtypes = ["bfloat16"]
min_numel = 1
world_sizes = [2]

[[defects]]
op = "c10d::broadcast"
kind = "crash"
dtypes = ["float32"]
min_numel = 20
world_sizes = [3]
"""


def test_seeded_collective_defects_are_caught_where_they_are(tmp_path):
    from conformance.cli import main

    manifest = tmp_path / "bad.toml"
    manifest.write_text('[build]\nname = "2.33.0-dist"\ninherits = "2.33.0"\n' + SEEDED)
    res = CliRunner().invoke(main, [
        "dist", "--db", str(tmp_path / "d.sqlite"), "--build", str(manifest), "--world-sizes", "2,3",
        "--collectives", "all_reduce,reduce_scatter_tensor,all_to_all_single,broadcast,all_gather_into_tensor",
        "--dtypes", "float32,bfloat16", "--timeout", "5", "--json"])
    assert res.exit_code == 1, res.output
    items = json.loads(res.stdout)
    failing = {(i["collective"], i["dtype"], i["world_size"], i["status"]) for i in items if i["status"] != "pass"}
    expected_failing = (
        {("all_reduce", "bfloat16", 3, "mismatch")}
        | {("reduce_scatter_tensor", d, w, "error") for d in ("float32", "bfloat16") for w in (2, 3)}
        | {("all_to_all_single", "bfloat16", 2, "timeout")}
        | {("broadcast", "float32", 3, "crash")})
    assert failing == expected_failing
    mism = [i for i in items if i["status"] == "mismatch"]
    assert all(i["reduce_op"] in ("sum", "product", "min", "max", "avg") and i["shape"] != "empty" for i in mism)
    assert all("error_eps" in i["evidence"] and i["evidence"]["error_eps"] > i["evidence"]["tolerance_eps"]
               for i in mism if i["reduce_op"] not in ("min", "max"))
    crash = next(i for i in items if i["status"] == "crash")
    assert "died" in crash["error"]
    # the items after a hang and a crash ran in restarted groups
    after = [i for i in items if i["collective"] == "all_gather_into_tensor"]
    assert after and all(i["status"] == "pass" for i in after)


def test_nightly_runs_the_lane_and_the_gate_fails_on_a_broken_collective(tmp_path):
    from conformance.cli import main
    from conformance.gate.nightly import NightlySpec, run_nightly
    from conformance.run.spec import RunSpec

    manifest = tmp_path / "bad.toml"
    manifest.write_text('[build]\nname = "2.33.0-dist"\ninherits = "2.33.0"\n[[defects]]\nop = "c10d::all_reduce"\n'
                        'kind = "wrong_result"\nmagnitude = 0.01\ndtypes = ["bfloat16"]\nworld_sizes = [3]\n')
    db_path, said = tmp_path / "n.sqlite", []
    spec = NightlySpec(run=RunSpec(ops=("abs",), dtypes=("float32",), schema=False, workers=1),
                       builds=("2.33.0", str(manifest)), site=str(tmp_path / "site"),
                       dist=DistSpec(world_sizes=(2, 3), collectives=("all_reduce", "broadcast"), dtypes=("bfloat16",)))
    result = run_nightly(spec, db_path, echo=said.append)
    text = "\n".join(said)
    assert "== distributed: collectives on each build ==" in text
    assert "distributed (neuron-emu 2.33.0-dist against 2.33.0): " in text and "in all_reduce (" in text
    assert result.gate_exit == 1  # a collective that passed and now fails fails the gate
    page = (tmp_path / "site" / "2.33.0-dist" / "dist.html").read_text()
    assert 'data-status="mismatch"' in page and "all_reduce (sum)" in page
    res = CliRunner().invoke(main, ["gate", "--db", str(db_path), "--baseline", "2.33.0", "--candidate", "2.33.0-dist",
                                    "--reruns", "0", "--json", str(tmp_path / "g.json")])
    assert res.exit_code == 1, res.output
    doc = json.loads((tmp_path / "g.json").read_text())
    regs = doc["dist"]["regressions"]
    assert doc["verdict"] == "fail" and regs and {(r["collective"], r["dtype"], r["world_size"]) for r in regs} == {
        ("all_reduce", "bfloat16", 3)}
    assert all(r["first_bad_build"] == "2.33.0-dist" for r in regs)


def test_training_parity_is_an_item_of_the_lane(tmp_path):
    manifest = tmp_path / "ar.toml"
    manifest.write_text('[build]\nname = "ideal-ar"\ninherits = "ideal"\n[[defects]]\nop = "c10d::all_reduce"\n'
                        'kind = "wrong_result"\nmagnitude = 0.01\ndtypes = ["float32"]\nworld_sizes = [2]\n')
    spec = DistSpec(build=str(manifest), world_sizes=(2,), collectives=("broadcast",), dtypes=("float32",),
                    training=("tp",))
    with Store.open(tmp_path / "d.sqlite") as st:
        result = run_dist(spec, st)
    row = next(r for r in result.rows if r["collective"] == "train:tp")
    assert row["status"] == "mismatch" and row["error"].startswith("step 1: ")  # tp all-reduces activations
    assert json.loads(row["evidence"])["first_divergence"]["step"] == 1
    assert all(r["status"] == "pass" for r in result.rows if r is not row)
    with pytest.raises(DistError, match="--training 'ddp'"):
        DistSpec(training=("ddp",))
