"""The one status vocabulary (opdb.status): the harness, the ledger, the gate, the report's
counts, its CSS and its templates all use it, so a status cannot mean two things."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import reports.html as html
import reports.scope as scope
from conformance.check import ledger, verdict
from conformance.gate import core as gate
from opdb import status as st
from opdb.status import FAILING, INFO, PASSED, STATUSES, Status

TEMPLATES = Path(html.__file__).parent / "templates"


def test_every_status_is_described_once_and_classified_once():
    assert set(INFO) == set(Status) and STATUSES == tuple(s.value for s in Status)
    neutral = {s for s in Status if INFO[s].kind == "neutral"}
    assert PASSED | FAILING | neutral == set(Status)
    assert not (PASSED & FAILING) and not (PASSED & neutral) and not (FAILING & neutral)
    assert sorted(st.WORST_RANK.values()) == list(range(len(Status)))
    for s in Status:
        assert s.passed == (s in PASSED) and s.failed == (s in FAILING)
        assert re.fullmatch(r"#[0-9a-f]{3}([0-9a-f]{3})?", INFO[s].colour) and INFO[s].meaning


def test_failing_is_worse_than_anything_not_failing():
    # the gate calls "got worse" by severity: no non-failing status may outrank a failing one
    assert min(st.severity(s) for s in FAILING) > max(st.severity(s) for s in set(Status) - FAILING)
    assert max(st.severity(s) for s in PASSED) <= st.severity(Status.PASS_FALLBACK)


def test_harness_layers_use_the_vocabulary_not_copies():
    assert verdict.Status is Status and verdict.FAILING is FAILING
    assert gate._SEV is st.SEVERITY and gate._PASSED is PASSED
    assert set(ledger.STATUSES) == {s.value for s in FAILING} - {"xpass"}
    assert scope.FAILING is FAILING and html.STATUSES is STATUSES


def test_decide_and_decide_unrun_choose_statuses():
    assert verdict.decide(cpu_error="bad input", target_error=None, close=False) is Status.SKIP
    assert verdict.decide(cpu_error=None, target_error="boom", close=False) is Status.ERROR
    assert verdict.decide(cpu_error=None, target_error=None, close=False) is Status.MISMATCH
    assert verdict.decide(cpu_error=None, target_error=None, close=True, expected_failure=["mismatch"]) is Status.XPASS
    assert verdict.decide_unrun("cpu") is Status.SKIP and verdict.decide_unrun("cpu", timed_out=True) is Status.SKIP
    assert verdict.decide_unrun("target") is Status.CRASH
    assert verdict.decide_unrun("target", timed_out=True) is Status.TIMEOUT
    assert verdict.decide_unrun("harness") is Status.ERROR


def test_a_refused_layout_is_named_as_such_not_as_a_dtype():
    """The status names the cause the target's own error gives (never a device manifest): a
    refused memory format or layout is unsupported_layout, a refused dtype unsupported_dtype."""
    layout = ["RuntimeError: neuron: channels_last inputs are not supported by aten::convolution.default on "
              "Neuron SDK build 2.31.0 (manifest rule dtypes.channels_last = 'error')",
              "RuntimeError: MPS does not support channels_last_3d", "unsupported memory format ChannelsLast3d",
              "NotImplementedError: Could not run 'aten::_to_copy' with arguments from the 'SparseCUDA' backend",
              "NotImplementedError: Could not run 'aten::add' on the neuron device with a Sparse tensor: the "
              "neuron device of this build supports only strided tensors"]
    for msg in layout:
        assert verdict.decide(cpu_error=None, target_error=msg, close=False) is Status.UNSUPPORTED_LAYOUT, msg
    dtype = ["neuron: float64 inputs are not supported by aten::mm.default (manifest rule dtypes.float64 = 'error')",
             "RuntimeError: \"abs_cpu\" not implemented for 'ComplexHalf'"]
    for msg in dtype:
        assert verdict.decide(cpu_error=None, target_error=msg, close=False) is Status.UNSUPPORTED_DTYPE, msg
    # an op's name is not a refused layout
    for msg in ["RuntimeError: neuron: internal error in aten::to_sparse.default: unsupported resize",
                "RuntimeError: neuron: internal error in aten::empty.memory_format (unsupported bf16 resize)"]:
        assert verdict.decide(cpu_error=None, target_error=msg, close=False) is Status.ERROR, msg
    assert Status.UNSUPPORTED_LAYOUT in FAILING
    assert st.severity("unsupported_layout") == st.severity("unsupported_dtype")  # a change of name is no regression


def test_generated_css_has_one_rule_per_status(tmp_path):
    source = (TEMPLATES / "report.css").read_text(encoding="utf-8")
    assert not re.search(r"^\.st-", source, re.M), "status colours belong in opdb.status.INFO, not report.css"
    html.write_asset("report.css", tmp_path / "report.css")
    rules = re.findall(r"^\.st-([a-z_]+) \{ background: (#[0-9a-f]+); color: (#[0-9a-f]+); \}$",
                       (tmp_path / "report.css").read_text(encoding="utf-8"), re.M)
    assert [r[0] for r in rules] == list(STATUSES)
    assert all((bg, ink) == (INFO[Status(s)].colour, INFO[Status(s)].ink) for s, bg, ink in rules)


def test_generated_css_refuses_a_stylesheet_without_the_marker(tmp_path, monkeypatch):
    fake = tmp_path / "templates"
    fake.mkdir()
    (fake / "report.css").write_text("body { color: red; }\n")
    monkeypatch.setattr(html, "TEMPLATES", fake)
    with pytest.raises(AssertionError, match="marker"):
        html.write_asset("report.css", tmp_path / "out.css")


@pytest.mark.parametrize("path", sorted(p.name for p in TEMPLATES.iterdir() if p.suffix in (".html", ".js")))
def test_templates_name_only_statuses_the_vocabulary_knows(path):
    text = (TEMPLATES / path).read_text(encoding="utf-8")
    # literal status classes ("st-pass") and literal statuses given to a badge ("'mismatch'")
    literal = set(re.findall(r"\bst-([a-z][a-z_]*)\b", text))
    literal |= set(re.findall(r"st-\{\{ '([a-z_]+)'", text))
    unknown = literal - set(STATUSES)
    assert not unknown, f"{path} names statuses opdb.status does not define: {sorted(unknown)}"


def test_a_site_with_every_status_colours_and_counts_each(tmp_path):
    from opdb import Store
    from reports import render_site

    db, run = tmp_path / "o.sqlite", "run-status-vocabulary"
    with Store.open(db) as store:
        store.insert("runs", [{"id": run, "target": "neuron-emu", "build": "b1", "torch_version": "2.13.0",
                               "host": "h", "git_sha": "abc", "started_at": "2026-11-01T10:00:00+00:00",
                               "finished_at": "2026-11-01T10:00:00+00:00", "status": "finished", "kind": "ops",
                               "config": "{}"}])
        store.insert("op_results", [{"run_id": run, "item_key": f"abs|function|float32|{i}", "op": "abs",
                                     "variant": "function", "dtype": "float32", "sample": i, "status": s}
                                    for i, s in enumerate(STATUSES)])
    out = tmp_path / "site"
    with Store.open(db) as store:
        render_site(store, out)
    row = re.search(r'<tr data-build="b1">(.*?)</tr>', (out / "index.html").read_text(encoding="utf-8"), re.S)
    assert f'data-k="failing">{len(FAILING)}<' in row.group(1)
    css = (out / "assets" / "report.css").read_text(encoding="utf-8")
    assert all(f".st-{s} {{" in css for s in STATUSES)
