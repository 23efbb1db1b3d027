"""Silent recovery: the real device re-runs a failed device execution on the CPU by default, so a
broken kernel looks like an op that falls back. The emulator does the same (``[runtime]
recover_errors``, off for a process with NEURON_EMU_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS=1), and
the harness sees through it: the neuron-emu target surfaces the errors, ``device:TYPE`` takes
``--env`` to set the device's switch, and an item that failed on the device says what a user with
recovery on sees instead."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from click.testing import CliRunner

import neuron_emu
from conformance.cli import main
from conformance.inputs.opinfo import by_name, samples
from conformance.run.runner import RunSpec
from conformance.select import SelectionError
from conformance.sweep.opinfo import SweepConfig, evaluate
from conformance.targets import get_target
from neuron_emu.manifest import FALLBACK_ONLY_ENV, ManifestError, load_build

# 2.33.0 declares an `error` defect on aten::upsample_nearest2d.* in bfloat16 (a native op there)
BUILD = "2.33.0"


def _upsample():
    return torch.randn(1, 2, 4, 4, dtype=torch.bfloat16)


@pytest.fixture
def recovering(monkeypatch):
    """The emulator as users run it: recovery on (the suite runs with errors surfaced)."""
    monkeypatch.delenv(FALLBACK_ONLY_ENV, raising=False)
    prev = neuron_emu.active_build()
    neuron_emu.use_build(BUILD)
    yield
    neuron_emu.use_build(prev)


def test_the_runtime_table_is_validated_and_inherited(tmp_path):
    assert all(load_build(b).runtime.recover_errors for b in ("2.31.0", "2.32.0", BUILD, "ideal"))
    off = tmp_path / "off.toml"
    off.write_text(f'[build]\nname = "off"\ninherits = "{BUILD}"\n[runtime]\nrecover_errors = false\n')
    assert load_build(off).runtime.recover_errors is False
    child = tmp_path / "child.toml"
    child.write_text('[build]\nname = "child"\ninherits = "off.toml"\n')
    assert load_build(child).runtime.recover_errors is False  # inherited
    for body, where in (('[runtime]\nrecover_errors = "yes"\n', "runtime.recover_errors"),
                        ('[runtime]\nretry = true\n', "runtime.retry")):
        bad = tmp_path / "bad.toml"
        bad.write_text('[build]\nname = "bad"\n' + body)
        with pytest.raises(ManifestError, match=rf"bad\.toml: invalid manifest key '{where}'"):
            load_build(bad)


def test_a_failing_device_kernel_is_recovered_on_the_cpu_and_warned_once(recovering):
    x = _upsample()
    neuron_emu.clear_op_tracking()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = torch.nn.functional.interpolate(x.to("neuron"), scale_factor=2, mode="nearest")
    assert torch.equal(y.cpu(), torch.nn.functional.interpolate(x, scale_factor=2, mode="nearest"))
    assert "aten::upsample_nearest2d.default" in neuron_emu.get_fallback_ops()
    said = [str(w.message) for w in caught if "upsample_nearest2d" in str(w.message)]
    assert len(said) == 1 and "failed on the device" in said[0] and "injected defect" in said[0]
    assert FALLBACK_ONLY_ENV in said[0]


def test_the_switch_makes_the_device_error_raise(recovering, monkeypatch):
    monkeypatch.setenv(FALLBACK_ONLY_ENV, "1")
    with pytest.raises(RuntimeError, match="internal compiler/runtime error in aten::upsample_nearest2d"):
        torch.nn.functional.interpolate(_upsample().to("neuron"), scale_factor=2, mode="nearest")


def test_a_build_without_recovery_raises(recovering, tmp_path):
    off = tmp_path / "off.toml"
    off.write_text(f'[build]\nname = "off"\ninherits = "{BUILD}"\n[runtime]\nrecover_errors = false\n')
    neuron_emu.use_build(str(off))
    with pytest.raises(RuntimeError, match="injected defect"):
        torch.nn.functional.interpolate(_upsample().to("neuron"), scale_factor=2, mode="nearest")


def test_the_users_own_mistake_is_not_recovered_nor_counted(recovering):
    """An input the CPU refuses too (mismatched shapes) raises the CPU's error; no fallback is
    counted for it."""
    neuron_emu.clear_op_tracking()
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        torch.mm(torch.ones(2, 3, device="neuron"), torch.ones(4, 5, device="neuron"))
    assert "aten::mm.default" not in neuron_emu.get_fallback_ops()


def _interpolate_row(target):
    info = by_name()["nn.functional.interpolate.nearest"]
    sample = next(s for s in samples(info, torch.bfloat16) if s.input.dim() == 4)
    return evaluate(target, info, "nn.functional.interpolate.nearest", "function", "bfloat16", 0, sample,
                    SweepConfig(contracts=("none",)))


def test_the_harness_sees_through_recovery(recovering, monkeypatch):
    """The neuron-emu target surfaces the device's error (an error verdict that keeps the
    kernel's own text and says what a user sees); left on, recovery makes it look like a fallback."""
    row = _interpolate_row(get_target("neuron-emu", BUILD))  # sets the switch: nothing had set it
    assert row["status"] == "error" and "injected defect" in row["error"], row
    assert "a user sees this op run, on the CPU" in row["proof"]["recovery"]
    monkeypatch.setenv(FALLBACK_ONLY_ENV, "0")  # what a user sees: the target leaves a set switch alone
    target = get_target("neuron-emu", BUILD)
    assert target.recovery is None and target.describe()["recovery"].startswith("on:")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        row = _interpolate_row(target)
    assert row["status"] == "pass_fallback", row


def test_device_target_takes_the_switch_through_env(recovering):
    """``device:TYPE`` runs the device as installed (recovery on); ``--env`` sets the switch."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        row = _interpolate_row(get_target("device:neuron", imports=("neuron_emu",)))
    assert row["status"] in ("pass", "pass_fallback"), row  # the broken kernel is hidden
    row = _interpolate_row(get_target("device:neuron", imports=("neuron_emu",), env=(f"{FALLBACK_ONLY_ENV}=1",)))
    assert row["status"] == "error" and "injected defect" in row["error"], row


def test_env_is_kept_with_the_run_and_checked_on_the_command_line():
    spec = RunSpec(target="device:neuron", imports=("neuron_emu",), env=(f"{FALLBACK_ONLY_ENV}=1",))
    assert RunSpec.from_run({"config": json.dumps(spec.to_config())}).env == spec.env
    with pytest.raises(SelectionError, match="--env 'NOEQUALS'"):
        RunSpec(env=("NOEQUALS",))
    r = CliRunner().invoke(main, ["run", "--target", "cpu", "--env", "1BAD=x", "--ops", "abs"])
    assert r.exit_code == 2 and "'1BAD=x': expected NAME=VALUE" in r.output
