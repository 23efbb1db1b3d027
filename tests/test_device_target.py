"""``--target device:TYPE --import MODULE``: any device type torch knows, with no code written for it.

The emulator reached generically (``device:neuron --import neuron_emu``) must give the verdicts
``neuron-emu`` gives on the same build, except for what only the emulator's own tracking can know:
its CPU fallback copies nothing (zero-copy views), so the generic detection, which looks for
device<->host copies, cannot see it (``pass_fallback`` there is ``pass`` here).
"""

from __future__ import annotations

import json
import sqlite3

import pytest
import torch
from click.testing import CliRunner

import neuron_emu
from conformance.cli import main
from conformance.run.runner import RunSpec, execute_run
from conformance.sweep.opinfo import SweepConfig, run_group
from conformance.targets import OpTrace, TargetError, get_target
from conformance.targets.device import HostWork
from conformance.work import Group

OPS = ("abs", "add", "cumsum", "index_select", "exp", "mm")
FAILING = {"mismatch", "error", "unsupported_dtype", "crash", "timeout"}


def _fold(status: str) -> str:
    return "pass" if status == "pass_fallback" else status


def _rows(target) -> dict[str, dict]:
    config = SweepConfig(variants=("function", "out", "backward"), max_samples=3)
    return {r["item_key"]: r for op in OPS for r in run_group(target, Group(op, "float32"), config)}


def test_device_neuron_gives_the_verdicts_of_neuron_emu_on_the_same_build():
    build = "2.33.0"  # a shipped build, by name; neuron-emu makes it the active one, which device:neuron runs
    emu = _rows(get_target("neuron-emu", build))
    dev = _rows(get_target("device:neuron", imports=("neuron_emu",)))
    assert neuron_emu.active_build().name == build
    assert set(emu) == set(dev) and len(emu) > 20
    statuses = {r["status"] for r in emu.values()}
    # the comparison is worth something only with all three kinds of items in it
    assert "pass" in statuses and "pass_fallback" in statuses and statuses & FAILING, statuses
    differ = {k: (emu[k]["status"], dev[k]["status"]) for k in emu if _fold(emu[k]["status"]) != _fold(dev[k]["status"])}
    assert not differ
    for key, row in dev.items():
        if row["status"] != "skip":
            assert row["proof"]["device"] == ["neuron:0"] and set(row["proof"]) <= {"device", "locus"}, (key, row["proof"])
        if row["status"] == "mismatch":  # localised alike: the same kernels, the same worst one
            mine, theirs = row["proof"]["locus"]["scores"], emu[key]["proof"]["locus"]["scores"]
            assert set(mine) == set(theirs) and max(mine, key=mine.get) == max(theirs, key=theirs.get), key


def test_host_work_sees_a_round_trip_through_the_cpu_and_nothing_else():
    """A composite op that takes the device's data to the CPU, computes there and copies back is
    a fallback (the overload that ran on the CPU); one that stays on the device is not."""
    get_target("device:neuron", imports=("neuron_emu",))
    x = torch.randn(8, device="neuron")
    trace = OpTrace()
    with HostWork(trace, "neuron"):
        y = x.to("cpu").sin().to(x.device)
    assert y.device.type == "neuron"
    assert trace.fallback == {"aten::sin.default"}
    assert "aten::_to_copy.default" in trace.dispatched  # the copies are seen, not counted as work

    trace = OpTrace()
    with HostWork(trace, "neuron"):
        x.cos().mul(2)
    assert trace.fallback == set() and {"aten::cos.default", "aten::mul.Tensor"} <= trace.dispatched

    trace = OpTrace()
    with HostWork(trace, "neuron"):  # a CPU result made from device data is work off the device
        torch.ops.aten.sum.default(x.to("cpu"))
    assert trace.fallback == {"aten::sum.default"}


def test_the_target_traces_a_fallback_through_the_sweep():
    """Through run_item: native = dispatched minus fallback, as stored in native_ops/fallback_ops."""
    target = get_target("device:neuron", imports=("neuron_emu",))
    with target.trace() as trace:
        torch.ones(3, device="neuron").to("cpu").neg()
    assert trace.fallback == {"aten::neg.default"} and "aten::neg.default" not in trace.native
    assert "aten::ones.default" in trace.native


def test_an_unknown_device_type_is_one_clear_error(tmp_path):
    with pytest.raises(TargetError, match=r"torch knows no device type 'nosuch' \(no --import given\)"):
        get_target("device:nosuch")
    res = CliRunner().invoke(main, ["run", "--target", "device:nosuch", "--ops", "abs", "--db", str(tmp_path / "x.sqlite")])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "device type 'nosuch'" in lines[0], res.output


def test_a_missing_import_is_one_clear_error(tmp_path):
    res = CliRunner().invoke(main, ["run", "--target", "device:neuron", "--import", "no_such_device_pkg",
                                    "--ops", "abs", "--db", str(tmp_path / "x.sqlite")])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "--import 'no_such_device_pkg'" in lines[0] and "ModuleNotFoundError" in lines[0]
    assert not (tmp_path / "x.sqlite").exists() or not sqlite3.connect(tmp_path / "x.sqlite").execute(
        "select count(*) from sqlite_master where name='op_results'").fetchone()[0]


def test_a_build_is_refused_for_a_generic_device():
    with pytest.raises(TargetError, match="--build '2.33.0' is not used"):
        get_target("device:neuron", "2.33.0", imports=("neuron_emu",))


def test_workers_import_the_modules_and_the_run_stores_them(tmp_path):
    db = tmp_path / "r.sqlite"
    spec = RunSpec(target="device:neuron", imports=("neuron_emu",), ops=("abs",), dtypes=("float32",),
                   workers=1, max_samples=1, variants=("function",))
    summary = execute_run(spec, db)
    assert summary.infra is None
    conn = sqlite3.connect(db)
    (target, config), = conn.execute("select target, config from runs").fetchall()
    assert target == "device:neuron" and json.loads(config)["imports"] == ["neuron_emu"]
    rows = conn.execute("select status, proof from op_results where op = 'abs'").fetchall()
    assert rows and all(s == "pass" and json.loads(p)["device"] == ["neuron:0"] for s, p in rows)
    run = dict(zip(("id", "target", "build", "config"),
                   conn.execute("select id, target, build, config from runs").fetchone(), strict=True))
    assert RunSpec.from_run(run).imports == ("neuron_emu",)  # a resumed run imports them again
