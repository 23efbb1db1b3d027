"""The tolerance ledger and expected failures: lookup, provenance, validation errors."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from conformance.check.ledger import Ledger, LedgerError
from conformance.cli import main


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


# -- reviewing the ledger against stored runs (conformance/triage/ledger_review.py) -----------------------
REVIEW_LEDGER = """
[[xfail]]
op = "sort"
reason = "unstable on the device"

[[xfail]]
op = "cumsum"
reason = "bf16 scan"

[[override]]
op = "abs"
dtype = "bfloat16"
rtol = 0.1
reason = "once needed"

[[xfail]]
op = "topk"
reason = "gone"
expires = 2020-01-01
"""


def _review_db(path):
    from opdb import Store

    def row(run, op, dtype, status, abs_err=0.0, rel_err=0.0, **kw):
        return {"run_id": run, "item_key": f"{op}|function|{dtype}|{kw.pop('sample', 0)}", "op": op,
                "variant": "function", "dtype": dtype, "status": status, "max_abs_err": abs_err,
                "max_rel_err": rel_err, **kw}

    with Store.open(path) as st:
        runs = []
        for k in range(2):
            rid = st.start_run(target="neuron-emu", build=f"b{k}", torch_version="2.13.0", config={},
                               run_id=f"r{k}")
            st.insert("op_results", [
                row(rid, "sort", "float32", "pass"),
                # cumsum still fails in the newer run only: the entry is still needed
                row(rid, "cumsum", "bfloat16", "mismatch" if k else "pass", 0.5, 0.5),
                row(rid, "abs", "bfloat16", "pass", 0.0, 1e-3),
            ])
            st.finish_run(rid)
            runs.append(rid)
        rid = st.start_run(target="neuron-emu", build="b2", torch_version="2.13.0", config={}, run_id="mm")
        ok = {"nan_agree": 1, "dtype_ok": 1, "shape_ok": 1}
        st.insert("op_results", [
            row(rid, "exp", "bfloat16", "mismatch", 0.002, 0.013, **ok),
            row(rid, "exp", "bfloat16", "pass", 0.0, 0.0, sample=1, **ok),
            row(rid, "log", "float32", "mismatch", 1.0, 0.5, **ok),  # too far: a bug, not a tolerance
            row(rid, "tan", "float32", "mismatch", 1e-4, 1e-4, nan_agree=0, dtype_ok=1, shape_ok=1),
        ])
    return path


def test_stale_entries_are_expired_or_unneeded_in_every_recent_run(tmp_path):
    from conformance.triage.ledger_review import entry_staleness, stale_entries
    from opdb import Store
    from opdb.queries import item_outcomes

    db = _review_db(tmp_path / "o.sqlite")
    led = Ledger.from_toml(REVIEW_LEDGER, source="r.toml")
    with Store.open(db) as st:
        got = {s.entry.op: s.why for s in stale_entries(st, led, n_runs=2)}
        assert got == {"sort": "passed in each of the last 2 runs",
                       "abs": "not needed in each of the last 2 runs (errors within torch's default tolerance)",
                       "topk": "expired on 2020-01-01"}
        # judged on the older run alone, cumsum passed too; on a target without runs, only expiry counts
        assert entry_staleness(led.xfails[1], [st.get_run("r0")], {"r0": item_outcomes(st, "r0")}) == \
            "passed in each of the last 1 runs"
        assert [s.entry.op for s in stale_entries(st, led, target="cuda")] == ["topk"]


def test_ledger_stale_command_prints_each_entry_and_a_count(tmp_path):
    db = _review_db(tmp_path / "o.sqlite")
    (tmp_path / "r.toml").write_text(REVIEW_LEDGER)
    r = CliRunner().invoke(main, ["ledger", "stale", "--ledger", str(tmp_path / "r.toml"), "--runs", "2",
                                  "--db", str(db)])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[-1] == "3 stale entries" and len(lines) == 4
    assert lines[0] == (f"{tmp_path / 'r.toml'}:override[0]: op=abs dtype=bfloat16 target=*: not needed in each of the last 2 runs "
                        "(errors within torch's default tolerance) (reason was: once needed)")


def test_propose_overrides_only_for_plain_numeric_drift(tmp_path):
    from conformance.triage.ledger_review import propose_overrides
    from opdb import Store

    db = _review_db(tmp_path / "o.sqlite")
    with Store.open(db) as st:
        p = propose_overrides(st, "mm", max_rel=0.1)
        with pytest.raises(ValueError, match="no run with id 'nope'"):
            propose_overrides(st, "nope")
    assert p.skipped == 2 and len(p.overrides) == 1
    proposed = Ledger.from_toml(p.overrides[0], source="p.toml")  # what it proposes is a valid ledger
    tol = proposed.tolerance("exp", "function", "bfloat16", "neuron-emu")
    assert (tol.atol, tol.rtol) == (0.005, 0.02)  # 1.5 x the worst error, rounded up to 1, 2 or 5
    assert "1 of 2 samples beyond the default" in p.overrides[0]
    assert p.summary().startswith("# 1 overrides proposed; 2 op x dtype pairs left out")


def test_ledger_propose_command(tmp_path):
    db = _review_db(tmp_path / "o.sqlite")
    r = CliRunner().invoke(main, ["ledger", "propose", "--run", "mm", "--db", str(db)])
    assert r.exit_code == 0, r.output
    assert r.output.startswith('[[override]]\nop = "exp"\ndtype = "bfloat16"\ntarget = "neuron-emu"\n'
                               'atol = 0.005\nrtol = 0.02\n')
    bad = CliRunner().invoke(main, ["ledger", "propose", "--run", "nope", "--db", str(db)])
    assert bad.exit_code == 2 and "no run with id 'nope'" in bad.output
