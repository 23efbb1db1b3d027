"""Ledger values that would silently turn mismatches into passes (inf, nan, negative) and entries
for ops that do not exist are refused by the validated loader, with one line naming file, key,
value and what is accepted (plus the closest existing name)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from conformance.check.ledger import Ledger, LedgerError
from conformance.cli import main


@pytest.mark.parametrize("text, key, value", [
    ('[[override]]\nop = "cumsum"\natol = inf\nreason = "r"\n', "override[0].atol", "inf"),
    ('[[override]]\nop = "cumsum"\natol = +inf\nreason = "r"\n', "override[0].atol", "inf"),
    ('[[override]]\nop = "cumsum"\nrtol = nan\nreason = "r"\n', "override[0].rtol", "nan"),
    ('[[override]]\nop = "cumsum"\nrtol = -inf\nreason = "r"\n', "override[0].rtol", "-inf"),
    ('[[override]]\nop = "cumsum"\natol = -0.001\nreason = "r"\n', "override[0].atol", "-0.001"),
    ('[[default]]\ndtype = "float32"\nrtol = nan\n', "default[0].rtol", "nan"),
    ('[[default]]\ndtype = "float32"\natol = inf\nrtol = 0.1\n', "default[0].atol", "inf"),
])
def test_non_finite_or_negative_tolerances_are_refused(text, key, value):
    with pytest.raises(LedgerError) as err:
        Ledger.from_toml(text, source="bad.toml")
    assert str(err.value) == f"bad.toml: {key} = {value} is not valid; expected a finite number >= 0"


def test_zero_and_large_finite_tolerances_are_accepted():
    led = Ledger.from_toml('[[default]]\ndtype = "float32"\natol = 0\nrtol = 1e300\n', source="ok.toml")
    tol = led.tolerance("add", "function", "float32", "cpu")
    assert (tol.atol, tol.rtol) == (0.0, 1e300)


@pytest.mark.parametrize("text, key, value, closest", [
    ('[[override]]\nop = "cumsun"\nrtol = 0.1\nreason = "r"\n', "override[0].op", "cumsun", "cumsum"),
    ('[[override]]\nop = "nn.functional.gelo"\nvariant = "function"\nrtol = 0.1\nreason = "r"\n',
     "override[0].op", "nn.functional.gelo", "nn.functional.gelu"),
    ('[[xfail]]\nop = "sotr"\nreason = "r"\n', "xfail[0].op", "sotr", "sort"),
    ('[[override]]\nop = "aten::add.Tensr"\nvariant = "schema"\nrtol = 0.1\nreason = "r"\n',
     "override[0].op", "aten::add.Tensr", "aten::add.Tensor"),
    ('[[override]]\nop = "aten::add.Tensr"\nrtol = 0.1\nreason = "r"\n', "override[0].op", "aten::add.Tensr",
     "aten::add.Tensor"),
])
def test_unknown_op_is_refused_with_the_closest_name(text, key, value, closest):
    with pytest.raises(LedgerError) as err:
        Ledger.from_toml(text, source="bad.toml")
    msg = str(err.value)
    assert msg.startswith(f"bad.toml: {key} = {value!r} is not valid; expected ")
    assert msg.endswith(f"(did you mean {closest!r}?)") and "\n" not in msg


@pytest.mark.parametrize("text", [
    # a glob that matches nothing
    '[[override]]\nop = "nn.functionl.*"\nrtol = 0.1\nreason = "r"\n',
    # function items carry OpInfo names, never ATen overloads: this entry could never apply
    '[[override]]\nop = "aten::add.Tensor"\nvariant = "function"\nrtol = 0.1\nreason = "r"\n',
    # model items carry model ids
    '[[override]]\nop = "add"\nvariant = "model"\nrtol = 0.1\nreason = "r"\n',
    '[[override]]\nop = "mlpp.*"\nvariant = "model"\nrtol = 0.1\nreason = "r"\n',
])
def test_entries_that_can_match_nothing_are_refused(text):
    with pytest.raises(LedgerError, match=r"^bad\.toml: override\[0\]\.op = .* is not valid; expected "):
        Ledger.from_toml(text, source="bad.toml")


def test_existing_names_and_globs_of_every_namespace_are_accepted():
    led = Ledger.from_toml(
        '[[override]]\nop = "nn.functional.*"\nrtol = 0.1\nreason = "opinfo glob"\n'
        '[[override]]\nop = "aten::_foreach_*"\nvariant = "schema"\nrtol = 0.1\nreason = "aten glob"\n'
        '[[override]]\nop = "aten::add.Tensor"\nrtol = 0.1\nreason = "aten name, any variant"\n'
        '[[override]]\nop = "mlp.*"\nvariant = "model"\nrtol = 0.1\nreason = "model glob"\n'
        '[[override]]\nop = "hf.gpt2"\nvariant = "model"\nrtol = 0.1\nreason = "hf model"\n'
        '[[xfail]]\nop = "linalg.svd"\nvariant = "backward"\nreason = "known"\n', source="ok.toml")
    assert len(led.overrides) == 5 and len(led.xfails) == 1
    assert led.tolerance("nn.functional.gelu", "function", "float32", "cpu").rtol == 0.1


@pytest.mark.parametrize("body, needle", [
    ('[[override]]\nop = "cumsum"\nrtol = nan\nreason = "r"\n', "override[0].rtol = nan is not valid"),
    ('[[override]]\nop = "cumsun"\nrtol = 0.1\nreason = "r"\n', "override[0].op = 'cumsun' is not valid"),
])
def test_cli_check_and_run_refuse_in_one_line_writing_nothing(tmp_path, body, needle):
    bad = tmp_path / "bad.toml"
    bad.write_text(body)
    chk = CliRunner().invoke(main, ["ledger", "check", str(bad)])
    assert chk.exit_code == 2
    assert chk.output.strip().splitlines() == [chk.output.strip()] and f"{bad}: {needle}" in chk.output
    assert "Traceback" not in chk.output
    db = tmp_path / "r.sqlite"
    r = CliRunner().invoke(main, ["run", "--target", "cpu", "--ops", "abs", "--ledger", str(bad), "--db", str(db)])
    assert r.exit_code == 2 and f"{bad}: {needle}" in r.output
    assert not db.exists()


# -- a target's custom ops (the custom-op lane, conformance/customops) --------------------------------------
def test_custom_op_names_globs_and_variants_are_accepted():
    led = Ledger.from_toml(
        '[[override]]\nop = "neuron::flash_attention.default"\ndtype = "bfloat16"\nrtol = 0.1\nreason = "any variant"\n'
        '[[override]]\nop = "neuron::*"\nvariant = "custom_bwd"\natol = 0.2\nreason = "glob, one variant"\n'
        '[[xfail]]\nop = "neuron::rms_norm.default"\nvariant = "opcheck"\nstatus = "contract"\nreason = "fake"\n'
        '[[xfail]]\nop = "*::rope*"\nvariant = "custom_compile"\nreason = "any namespace"\n', source="ok.toml")
    assert led.tolerance("neuron::flash_attention.default", "custom_fwd", "bfloat16", "neuron-emu").rtol == 0.1
    assert led.tolerance("neuron::rope.default", "custom_bwd", "float32", "neuron-emu").atol == 0.2
    assert led.tolerance("neuron::rope.default", "custom_fwd", "float32", "neuron-emu").atol != 0.2
    assert led.expected_failure("neuron::rms_norm.default", "opcheck", "float32", "neuron-emu").statuses == ("contract",)
    assert led.expected_failure("cotest::rope.default", "custom_compile", "float32", "device:neuron") is not None
    assert led.expected_failure("neuron::rms_norm.default", "custom_fwd", "float32", "neuron-emu") is None


@pytest.mark.parametrize("text, key, value, needle", [
    # an ATen overload is never an item of the custom-op lane
    ('[[override]]\nop = "aten::add.Tensor"\nvariant = "custom_fwd"\nrtol = 0.1\nreason = "r"\n',
     "override[0].op", "'aten::add.Tensor'", "a custom op's overload name"),
    # the lane's items carry overload names: without one the entry would match none of them
    ('[[xfail]]\nop = "neuron::flash_attention"\nreason = "r"\n', "xfail[0].op", "'neuron::flash_attention'",
     "(did you mean 'neuron::flash_attention.default'?)"),
    ('[[xfail]]\nop = "neuron::flash attention.default"\nvariant = "opcheck"\nreason = "r"\n', "xfail[0].op",
     "'neuron::flash attention.default'", "of a namespace other than aten and prims for variant 'opcheck'"),
    # custom-op globs are no OpInfo names
    ('[[override]]\nop = "neuron::*"\nvariant = "function"\nrtol = 0.1\nreason = "r"\n', "override[0].op",
     "'neuron::*'", "an OpInfo name"),
    ('[[override]]\nop = "neuron::rope.default"\nvariant = "custom_forward"\nrtol = 0.1\nreason = "r"\n',
     "override[0].variant", "'custom_forward'", "opcheck, custom_fwd, custom_bwd, custom_compile"),
])
def test_a_bad_custom_op_name_or_variant_is_refused_in_one_line(text, key, value, needle):
    with pytest.raises(LedgerError) as err:
        Ledger.from_toml(text, source="bad.toml")
    msg = str(err.value)
    assert msg.startswith(f"bad.toml: {key} = {value} is not valid; expected ") and "\n" not in msg
    assert needle in msg, msg
