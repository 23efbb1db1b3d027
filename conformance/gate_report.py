"""What a gate decided, as text: the console summary, a Markdown table for a pull request, and
JUnit XML for CI (one failing case per regression, one skipped case per flaky group).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from .gate import GateResult


def summary_lines(result: GateResult) -> list[str]:
    b, c = result.baseline, result.candidate
    lines = [f"gate {b['build']} ({b['id']}) -> {c['build']} ({c['id']}): {result.verdict.upper()}"]
    for cat in ("regression", "drift", "flaky", "improvement", "new", "removed"):
        lines.append(f"  {cat:<12}{len(result.of(cat)):>7}")
    pairs = defaultdict(int)
    for f in result.findings:
        if f.category in ("regression", "drift"):
            pairs[(f.name, f.variant, f.dtype, f.baseline, f.candidate)] += 1
    unconfirmed: dict[tuple[str, str, str], int] = defaultdict(int)
    for f in result.findings:
        if f.category == "regression" and f.evidence.get("confirmation", {}).get("verdict") == "unconfirmed":
            unconfirmed[(f.name, f.variant, f.dtype)] += 1
    if result.common is not None:
        lines.append(f"  common-only: compared {result.common['compared']} items; ignored "
                     f"{result.common['only_baseline']} only in the baseline, "
                     f"{result.common['only_candidate']} only in the candidate")
    if result.confirmation is not None:
        lines.append(result.confirmation.line())
    for (name, variant, dtype, before, after), n in sorted(pairs.items())[:50]:
        mark = ", unconfirmed" if unconfirmed.get((name, variant, dtype)) else ""
        lines.append(f"  REGRESSION {name} [{variant}, {dtype}] {before} -> {after} ({n} items{mark})")
    for g in result.flaky_groups()[:50]:
        runs = [s for statuses in g["reruns"].values() for s in statuses]
        name = g.get("op") or g.get("model")
        lines.append(f"  FLAKY {name} [{g['variant']}, {g['dtype']}] ({g['items']} items; its "
                     f"{len(g['reruns'])} representative(s) re-run {len(runs)} time(s): {', '.join(runs)})")
    return lines


def markdown(result: GateResult) -> str:
    b, c = result.baseline, result.candidate
    out = [f"## Gate: {_md(b['build'])} → {_md(c['build'])} — **{result.verdict}**", "",
           "| category | items |", "|---|---|"]
    out += [f"| {cat} | {len(result.of(cat))} |" for cat in ("regression", "drift", "flaky", "improvement", "new", "removed")]
    regs = [f for f in result.findings if f.category in ("regression", "drift")]
    if regs:
        out += ["", "| kind | op/model | variant | dtype | baseline | candidate |", "|---|---|---|---|---|---|"]
        out += [f"| {_md(f.kind)} | `{_md_code(f.name)}` | {_md(f.variant)} | {_md(f.dtype)} | {_md(f.baseline)} "
                f"| {_md(f.candidate)} |" for f in regs[:500]]
    return "\n".join(out) + "\n"


def _md(text: Any) -> str:
    """Stored text as inert Markdown: no HTML, no markup, no table-cell or line breaks."""
    return re.sub(r"([\\`*_{}\[\]()#+!|~<>&])", r"\\\1", " ".join(str(text).split()))


def _md_code(text: Any) -> str:
    # Inside a code span HTML and markup are literal; only a backtick (ends it) and a pipe (ends
    # the table cell) need care.
    return " ".join(str(text).split()).replace("`", "'").replace("|", "\\|")


def junit(result: GateResult) -> str:
    regs = [f for f in result.findings if f.category in ("regression", "drift")]
    cases = []
    for f in regs:
        msg = f"{f.baseline} -> {f.candidate}: {json.dumps(f.evidence, default=str)[:2000]}"
        cases.append(f'<testcase classname={quoteattr(f.kind + "." + f.name)} name={quoteattr(f.item_key)}>'
                     f'<failure message={quoteattr(f.baseline + " -> " + f.candidate)}>{escape(msg)}</failure></testcase>')
    groups = result.flaky_groups()  # a flaky op x variant x dtype is one skipped case, not one per item
    for g in groups:
        name = g.get("op") or g.get("model") or ""
        group = "|".join((name, g["variant"], g["dtype"]))
        cases.append(f'<testcase classname={quoteattr(g["kind"] + "." + name)} name={quoteattr(group)}>'
                     f'<skipped message={quoteattr("flaky: " + json.dumps(g["reruns"]))}/></testcase>')
    cases.append('<testcase classname="gate" name="no-regressions"/>' if not regs else "")
    return (f'<?xml version="1.0" encoding="utf-8"?>\n<testsuite name="conformance-gate" tests="{len(cases)}" '
            f'failures="{len(regs)}" skipped="{len(groups)}">{"".join(cases)}</testsuite>\n')
