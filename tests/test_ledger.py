"""The tolerance ledger and expected failures: lookup, provenance, validation errors."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from conformance.cli import main
from conformance.ledger import Ledger, LedgerError


def test_shipped_ledger_is_valid():
    led = Ledger.load()
    assert led.defaults
    tol = led.tolerance("add", "function", "bfloat16", "neuron-emu")
    assert tol.source.startswith("ledger.toml:default[")


def test_torch_defaults_and_exact_ints():
    led = Ledger()
    assert led.tolerance("add", "function", "float32", "cpu").rtol == 1.3e-6
    tol = led.tolerance("add", "function", "int64", "cpu")
    assert (tol.atol, tol.rtol) == (0.0, 0.0) and "exact" in tol.source


def test_override_wins_and_names_its_reason():
    led = Ledger.from_toml('[[override]]\nop = "cum*"\ndtype = "bfloat16"\ntarget = "neuron-emu"\n'
                           'rtol = 0.05\nreason = "bf16 scan"\nissue = "https://example.invalid/1"\n', source="x.toml")
    tol = led.tolerance("cumsum", "function", "bfloat16", "neuron-emu")
    assert tol.rtol == 0.05 and tol.source == "x.toml:override[0] (bf16 scan)"
    assert led.tolerance("cumsum", "function", "bfloat16", "cuda").rtol != 0.05


def test_expired_entries_do_not_apply():
    led = Ledger.from_toml('[[xfail]]\nop = "sort"\nreason = "r"\nexpires = 2020-01-01\n', source="x.toml")
    assert led.expected_failure("sort", "function", "float32", "t") is None
    assert led.xfails[0].expired()


@pytest.mark.parametrize("text, key, value", [
    ('[[override]]\nop = "a"\nrtol = 0.1\n', "override[0].reason", "None"),
    ('[[override]]\nop = "a"\nrtol = -1\nreason = "r"\n', "override[0].rtol", "-1"),
    ('[[override]]\nop = "a"\ndtype = "float33"\nrtol = 1\nreason = "r"\n', "override[0].dtype", "'float33'"),
    ('[[xfail]]\nop = "a"\nstatus = "broken"\nreason = "r"\n', "xfail[0].status", "'broken'"),
    ('[[xfail]]\nop = "a"\nreason = "r"\ncolour = "red"\n', "xfail[0].colour", "'red'"),
    ('[[xfail]]\nop = "a"\nreason = "r"\nexpires = "soon"\n', "xfail[0].expires", "'soon'"),
    ('[[override]]\nop = "a"\nreason = "r"\n', "override[0]", "{"),
    ('[tolerances]\na = 1\n', "tolerances", "{"),
])
def test_validation_errors_name_file_key_value(text, key, value):
    with pytest.raises(LedgerError) as err:
        Ledger.from_toml(text, source="bad.toml")
    msg = str(err.value)
    assert msg.startswith(f"bad.toml: {key} = {value}") and "expected" in msg


def test_cli_rejects_a_malformed_ledger_before_writing(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[[override]]\nop = "a"\nrtol = "wide"\nreason = "r"\n')
    db = tmp_path / "r.sqlite"
    r = CliRunner().invoke(main, ["run", "--target", "cpu", "--ops", "abs", "--ledger", str(bad), "--db", str(db)])
    assert r.exit_code == 2
    assert f"{bad}: override[0].rtol = 'wide'" in r.output
    assert not db.exists()
    assert CliRunner().invoke(main, ["ledger", "check", str(bad)]).exit_code == 2
    assert CliRunner().invoke(main, ["ledger", "check"]).exit_code == 0
