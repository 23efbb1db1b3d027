"""The gate's renderings (console, Markdown, JUnit) on a made-up decision: grouped by op × variant ×
dtype × transition, the largest group first, "and N more", evidence and repro commands, drift and
flaky said as what they are, a Markdown short enough for a PR comment."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from conformance.gate.core import Confirmation, Finding, GateResult
from conformance.gate.render import CONSOLE_GROUPS, MD_GROUPS, Links, junit, markdown, summary_lines


def _items(name: str, n: int, before: str, after: str, dtype: str = "float32", **evidence) -> list[Finding]:
    return [Finding("regression", "op", f"{name}|function|{dtype}|{i}", name, "function", dtype, before, after,
                    dict(evidence)) for i in range(n)]


def _result(n_small: int = 30) -> GateResult:
    findings = _items("take_along_dim", 120, "pass", "mismatch", max_rel_err=0.5, max_abs_err=2.0,
                      error="values differ")
    findings += _items("scatter_reduce", 80, "pass", "error", error="RuntimeError: boom")
    for k in range(n_small):  # many one-item groups, alphabetically before the big ones
        findings += _items(f"abs{k:02d}", 1, "pass", "pass_fallback")
    findings.append(Finding("drift", "drift", "cos|function|float32|*", "cos", "function", "float32", "pass",
                            "pass", {"median_error_ratio": 4.0, "p_value": 1e-6, "samples": 40,
                                     "worse_samples": 38}))
    findings += [Finding("flaky", "op", f"sin|function|float32|{i}", "sin", "function", "float32", "pass",
                         "mismatch", {"reruns": ["pass", "mismatch"]} if i == 0 else {}) for i in range(6)]
    findings.append(Finding("regression", "model", "mlp-0|float32|compile", "mlp-0", "compile", "float32", "pass",
                            "pass", {"recompiles": [1, 4]}))
    findings += [Finding("improvement", "op", f"exp|function|float32|{i}", "exp", "function", "float32",
                         "mismatch", "pass") for i in range(3)]
    return GateResult({"id": "r1", "build": "2.32.0"}, {"id": "r2", "build": "2.33.0"}, findings, "fail",
                      Confirmation(attempts=3, budget_s=600, max_reruns=500, groups=3, confirmed=2, flaky=1))


LINKS = Links(db="o.sqlite", repro={"take_along_dim|function|float32|0": 7, "sin|function|float32|0": 9},
              report="site/2.33.0/regressions.html")


def test_console_groups_largest_first_with_evidence_and_and_more():
    lines = summary_lines(_result(), LINKS)
    regs = [line for line in lines if line.startswith(("  REGRESSION", "  DRIFT"))]
    assert len(regs) == CONSOLE_GROUPS
    assert regs[0] == "  REGRESSION take_along_dim [function, float32] pass -> mismatch (120 items)"
    assert regs[1].startswith("  REGRESSION scatter_reduce [function, float32] pass -> error (80 items)")
    detail = lines[lines.index(regs[0]) + 1]
    assert "max rel err 0.5 (abs 2)" in detail and "error: values differ" in detail
    assert "repro: conformance repro 7 --db o.sqlite" in detail
    one = [line for line in lines if line.startswith("  REGRESSION") and "(1 " in line]
    assert one and all(line.endswith("(1 item)") for line in one)  # never "1 items"
    # 30 one-item groups + drift + the model: 34 groups, 15 shown
    more = next(line for line in lines if line.startswith("  and "))
    assert more == "  and 19 more failing groups (19 items): site/2.33.0/regressions.html"
    assert "  regression      231   (33 groups)" in lines
    # what the re-runs moved, so two gates of the same data that count differently say why
    assert any(line.startswith("  237 regression(s) before confirmation: the re-runs judged 6 item(s) in 1 group(s) "
                               "flaky; 0 item(s) stay regressions unconfirmed") for line in lines)


def test_drift_and_flaky_and_recompiles_are_said_as_what_they_are():
    lines = summary_lines(_result(n_small=0), LINKS)
    assert not any("pass -> pass" in line for line in lines), lines
    assert "  DRIFT cos [function, float32] error grew 4x while passing (40 samples)" in lines
    assert "  REGRESSION mlp-0 [compile, float32] recompiles 1 -> 4 (still pass) (1 item)" in lines
    flaky = [line for line in lines if line.startswith("  FLAKY")]
    assert flaky == ["  FLAKY sin [function, float32] pass -> mismatch, not reproduced on every re-run (6 items)"]
    assert "re-runs of 1 representative(s): pass, mismatch" in lines[lines.index(flaky[0]) + 1]
    assert lines[-1] == "  report: site/2.33.0/regressions.html"


def test_markdown_is_a_short_pr_comment_without_duplicate_rows():
    md = markdown(_result(n_small=400), LINKS)
    lines = md.splitlines()
    assert len(lines) < 150, len(lines)
    rows = [line for line in lines if line.startswith("| op |") or line.startswith("| model |")]
    assert len(rows) == len(set(rows)) == MD_GROUPS + 1  # the top regression groups and the flaky group
    assert rows[0].startswith("| op | `take_along_dim` | function | float32 | pass → mismatch | 120 |")
    # 401 one-item regression groups (400 small, the model) and the drift: 8 + 394
    assert "and 394 more groups (394 items) in the report" in md
    assert md.count("<details>") == md.count("</details>") == 2
    assert "repro: `conformance repro 7 --db o.sqlite`" in md
    assert "| flaky | 6 | 1 |" in md and "| drift | 1 | 1 |" in md
    assert "site/2.33.0/regressions.html" in md


def test_junit_has_one_case_per_group():
    xml = junit(_result(n_small=3), LINKS)
    suite = ET.fromstring(xml)
    cases = suite.findall("testcase")
    # take_along_dim, scatter_reduce, 3 small, drift, the model: 7 failing groups; sin: one skipped group
    assert suite.get("failures") == "7" and suite.get("skipped") == "1" and len(cases) == 8
    big = next(c for c in cases if c.get("classname") == "op.take_along_dim")
    failure = big.find("failure")
    assert failure.get("message") == "pass -> mismatch (120 items)"
    assert "conformance repro 7 --db o.sqlite" in failure.text and "and 70 more" in failure.text
    drift = next(c for c in cases if c.get("classname") == "drift.cos")
    assert "error grew 4x while passing" in drift.get("name")


def test_no_findings_is_one_passing_case():
    r = GateResult({"id": "a", "build": "1"}, {"id": "b", "build": "2"}, [], "pass")
    suite = ET.fromstring(junit(r))
    assert suite.get("failures") == "0" and [c.get("name") for c in suite.findall("testcase")] == ["no-regressions"]
    assert "| regression | 0 | 0 |" in markdown(r)


def _contract_db(tmp_path):
    """Two finished runs of one selection: add's out items go pass -> contract (out) and
    contract (out) -> contract (aliasing, out); mul's function item stays contract (out)."""
    from opdb import Store

    def row(run, op, variant, i, status, failed=None):
        return {"run_id": run, "item_key": f"{op}|{variant}|float32|{i}", "op": op, "variant": variant,
                "dtype": "float32", "sample": i, "status": status, "duration_s": 0.01,
                "contract_failed": failed, "max_rel_err": 0.0,
                "error": f"contract {failed.split(',')[0]}: the target replaced the out tensor's storage"
                if failed else None}

    st = Store.open(tmp_path / "g.sqlite")
    runs = []
    for build in ("2.32.0", "2.33.0"):
        runs.append(st.start_run(target="cpu", build=build, torch_version="t", config={"seed": 0}))
    base, cand = runs
    st.insert("op_results", [row(base, "add", "out", 0, "pass"), row(base, "add", "out", 1, "contract", "out"),
                             row(base, "mul", "function", 0, "contract", "out"),
                             row(cand, "add", "out", 0, "contract", "out"),
                             row(cand, "add", "out", 1, "contract", "aliasing,out"),
                             row(cand, "mul", "function", 0, "contract", "out")])
    for r in runs:
        st.finish_run(r)
    return st, base, cand


def test_contract_regressions_name_their_contracts_in_every_rendering(tmp_path):
    from conformance.gate.core import run_gate

    st, base, cand = _contract_db(tmp_path)
    reruns = []

    def rerun(candidate, keys, attempts):  # the re-runs still fail: the regression is confirmed
        reruns.extend(keys)
        return {k: ["contract"] for k in keys}

    result = run_gate(st, base, cand, attempts=1, rerun=rerun)
    assert result.verdict == "fail"
    regs = {f.item_key: f for f in result.of("regression")}
    assert set(regs) == {"add|out|float32|0", "add|out|float32|1"}  # mul stays contract (out): no finding
    first = regs["add|out|float32|0"].evidence
    assert first["contract_failed"] == "out" and first["error"].startswith("contract out:")
    second = regs["add|out|float32|1"].evidence
    assert (second["contract_failed"], second["baseline_contract_failed"], second["new_contracts"]) == (
        "aliasing,out", "out", ["aliasing"])
    assert reruns == ["add|out|float32|0"]  # a status that did not change is not re-run
    lines = summary_lines(result)
    assert "  REGRESSION add [out, float32] pass -> contract (out) (1 item)" in lines
    assert "  REGRESSION add [out, float32] contract (out) -> contract (aliasing, out) (1 item)" in lines
    md = markdown(result)
    assert "| op | `add` | out | float32 | pass → contract \\(out\\) | 1 |" in md
    assert "contract \\(out\\) → contract \\(aliasing, out\\)" in md
    suite = ET.fromstring(junit(result))
    names = {c.get("name") for c in suite.iter("testcase")}
    assert names == {"out|float32|pass -> contract (out)", "out|float32|contract (out) -> contract (aliasing, out)"}
    assert suite.get("failures") == "2"
    # the stored decision reads back the same way (the report's regressions page groups it)
    from opdb.findings import group_findings
    from opdb.queries_report import gate_items

    stored = [{**r, "evidence": json.loads(r["evidence"])} for r in gate_items(st, base, cand)
              if r["category"] == "regression"]
    assert sorted(g.transition for g in group_findings(stored)) == [
        "contract (out) -> contract (aliasing, out)", "pass -> contract (out)"]


def test_evidence_shows_the_baseline_error_and_a_models_normwise_error():
    from conformance.gate.core import _evidence

    ev = _evidence({"status": "pass", "max_rel_err": 0.001}, {"status": "mismatch", "max_rel_err": 0.5, "max_abs_err": 2.0})
    assert ev == {"max_rel_err": 0.5, "max_abs_err": 2.0, "baseline_max_rel_err": 0.001}
    op = Finding("regression", "op", "abs|function|float32|0", "abs", "function", "float32", "pass", "mismatch", ev)
    model_ev = _evidence({"max_rel_err": 40.0, "fwd_rel_err": 0.001},
                         {"max_rel_err": 73.5, "fwd_rel_err": 0.2, "first_divergent_op": "aten::sin.default"})
    model = Finding("regression", "model", "mlp|eager|float32|0", "mlp", "eager", "float32", "pass", "mismatch",
                    model_ev)
    lines = summary_lines(GateResult({"id": "a", "build": "1"}, {"id": "b", "build": "2"}, [op, model], "fail"))
    text = "\n".join(lines)
    assert "max rel err 0.5 (abs 2; baseline 0.001)" in text
    # a model's evidence is the normwise error its tolerance judges, not the element-wise 73.5
    assert "normwise rel err 0.2 (baseline 0.001)" in text and "73.5" not in text


def test_the_report_says_one_sample_and_two_samples():
    from reports.html import make_environment

    t = make_environment().from_string('{{ n|num }} {{ n|noun("sample") }}, {{ n|noun("overload") }}, '
                                       '{{ n|noun("family") }}, {{ n|noun("day") }}, {{ n|noun("pass") }}')
    assert t.render(n=1) == "1 sample, overload, family, day, pass"
    assert t.render(n=2) == "2 samples, overloads, families, days, passes"
    assert t.render(n=0).startswith("0 samples")


def test_a_drift_line_names_samples_only_where_the_item_has_some():
    """A model graph's drift is one item with no samples: its line said 'of None samples'."""
    from opdb.findings import numerics_line

    ev = {"probe_pairs": 248, "changed_pairs": 220, "worse_pairs": 146, "up_pairs": 79, "p_magnitude": 1e-9,
          "p_bias": 0.2, "rms_ratio": 140.0, "baseline": {"rms_eps": 2.2e5}, "candidate": {"rms_eps": 3.1e7, "elements": 552}}
    assert "552 elements;" in numerics_line(ev) and "None" not in numerics_line(ev)
    assert "552 elements of 1 sample;" in numerics_line({**ev, "samples": 1})
    assert "552 elements of 3 samples;" in numerics_line({**ev, "samples": 3})
