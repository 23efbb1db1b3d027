"""The gate's decision as people read it: console lines, a Markdown PR comment, JUnit XML.

All three show the same thing: findings grouped by op (or model) × variant × dtype × transition
(:func:`opdb.findings.group_findings`), the largest group first, each with its evidence (its
first bad build, size, worst error, first error message, the flake re-runs) and, when :class:`Links` are given, the
repro command of its first item and a link to the report. Drift says "error grew Nx while
passing", flaky groups say they are flaky: neither is shown as a status change. A ``contract``
status names the contracts its items failed: "pass -> contract (out)".

Example::

    >>> from conformance.gate import Finding, GateResult
    >>> from conformance.gate.render import summary_lines
    >>> r = GateResult({"id": "a", "build": "1"}, {"id": "b", "build": "2"},
    ...                [Finding("regression", "op", "abs|function|float32|0", "abs", "function", "float32",
    ...                         "pass", "mismatch", {"max_rel_err": 0.5})], "fail")
    >>> print("\\n".join(summary_lines(r)[-2:]))
      REGRESSION abs [function, float32] pass -> mismatch (1 items)
          max rel err 0.5
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from xml.sax.saxutils import escape, quoteattr

from opdb import Store
from opdb.findings import CATEGORIES, FindingGroup, group_findings, numerics_line
from opdb.queries import result_ids
from opdb.status import FAILS_GATE, NUMERICS

if TYPE_CHECKING:
    from .core import Finding, GateResult

CONSOLE_GROUPS = 15  # regression groups the console lists (then "and N more")
MD_GROUPS = 10  # groups of each kind in the Markdown tables
MD_KEYS = 5  # item keys listed per group in the Markdown details
JUNIT_KEYS = 50  # item keys listed per group in a JUnit failure


@dataclass(frozen=True)
class Links:
    """Where a reader goes next: ``repro`` maps an op item key to its result id in the candidate
    run (``conformance repro ID --db DB``); ``report`` is the candidate build's regressions page."""

    db: str = ""
    repro: dict[str, int] = field(default_factory=dict)
    report: str = ""

    def repro_of(self, g: FindingGroup) -> str:
        rid = self.repro.get(g.first_key) if g.kind == "op" else None
        return f"conformance repro {rid} --db {self.db}" if rid is not None else ""


def _dicts(findings: Sequence[Finding]) -> list[dict[str, Any]]:
    return [{"category": f.category, "kind": f.kind, "name": f.name, "variant": f.variant, "dtype": f.dtype,
             "baseline": f.baseline, "candidate": f.candidate, "item_key": f.item_key, "evidence": f.evidence}
            for f in findings]


def groups(result: GateResult, categories: Sequence[str] = CATEGORIES) -> list[FindingGroup]:
    """The result's findings of ``categories``, grouped and ordered (largest first)."""
    return group_findings(_dicts([f for f in result.findings if f.category in categories]))


def _num(v: float | None) -> str:
    return "" if v is None else f"{v:.3g}"


def evidence(g: FindingGroup) -> str:
    """The numbers behind a group, in one line ('' when there are none)."""
    parts = [f"first bad: {g.first_bad_build}"] if g.first_bad_build else []
    if g.category in NUMERICS:
        parts.append(numerics_line(g.drift))
    if g.fwd_rel_err is not None:  # a model: the normwise error its tolerance judges
        parts.append(f"normwise rel err {_num(g.fwd_rel_err)}"
                     + (f" (baseline {_num(g.baseline_fwd_rel_err)})" if g.baseline_fwd_rel_err is not None else ""))
    elif g.max_rel_err is not None:
        was = [f"abs {_num(g.max_abs_err)}"] if g.max_abs_err is not None else []
        was += [f"baseline {_num(g.baseline_rel_err)}"] if g.baseline_rel_err is not None else []
        parts.append(f"max rel err {_num(g.max_rel_err)}" + (f" ({'; '.join(was)})" if was else ""))
    if g.reruns:
        runs = [s for statuses in g.reruns.values() for s in statuses]
        parts.append(f"re-runs of {len(g.reruns)} representative(s): {', '.join(runs)}")
    if g.unconfirmed:
        parts.append(f"{g.unconfirmed} unconfirmed (confirmation budget)")
    if g.error:
        parts.append(f"error: {g.error}")
    return "; ".join(parts)


def _header(g: FindingGroup) -> str:
    label = g.category.upper()
    op_numerics = g.category in NUMERICS and g.kind != "model"
    unit = "samples" if op_numerics else "items"
    size = g.drift.get("samples", g.size) if op_numerics else g.size
    mark = ", unconfirmed" if g.unconfirmed else ""
    return f"  {label} {g.name} [{g.variant}, {g.dtype}] {g.transition} ({_n(size, unit[:-1])}{mark})"


def _explained(result: GateResult, grouped: list[FindingGroup]) -> str:
    """Why two gates of the same data can count differently: what the re-runs moved."""
    flaky = [g for g in grouped if g.category == "flaky"]
    unrepro = [g for g in grouped if g.category == "unreproducible"]
    unconfirmed = sum(g.unconfirmed for g in grouped if g.category == "regression")
    before = len(result.of("regression")) + len(result.of("flaky")) + len(result.of("unreproducible"))
    return (f"  {before} regression(s) before confirmation: the re-runs judged "
            f"{sum(g.size for g in flaky)} item(s) in {len(flaky)} group(s) flaky"
            + (f" and {sum(g.size for g in unrepro)} item(s) in {len(unrepro)} group(s) unreproducible (the CPU "
               "reference did not agree with itself)" if unrepro else "") + "; "
            f"{unconfirmed} item(s) stay regressions unconfirmed (re-runs decide these counts, so two gates of "
            f"the same data can differ by them)")


def summary_lines(result: GateResult, links: Links | None = None, top: int = CONSOLE_GROUPS) -> list[str]:
    """The console summary: counts, the confirmation, then the largest groups with their evidence."""
    links = links or Links()
    b, c = result.baseline, result.candidate
    lines = [f"gate {b['build']} ({b['id']}) -> {c['build']} ({c['id']}): {result.verdict.upper()}"]
    lines += cause_lines(result, links)
    grouped = groups(result)
    for cat in CATEGORIES:
        n_groups = sum(1 for g in grouped if g.category == cat)
        lines.append(f"  {cat:<12}{len(result.of(cat)):>7}" + (f"   ({_n(n_groups, 'group')})" if n_groups else ""))
    if result.common is not None:
        lines.append(f"  common-only: compared {result.common['compared']} items; ignored "
                     f"{result.common['only_baseline']} only in the baseline, "
                     f"{result.common['only_candidate']} only in the candidate")
    if result.outside_slice:
        lines.append(f"  reference: {_n(result.outside_slice, 'item')} not in both runs' slices of reference inputs "
                     "(the slice rotates nightly): not compared")
    if result.unprobed:
        lines.append(f"  dtypes: {_n(result.unprobed, 'probe item')} held by one run only, the other probed no dtypes "
                     "(stored before the dtype probe, or --variants without it): not compared")
    if result.confirmation is not None:
        lines.append(result.confirmation.line())
        lines.append(_explained(result, grouped))
    for what, cats in (("failing", FAILS_GATE), ("flaky", ("flaky",)), ("unreproducible", ("unreproducible",))):
        shown = [g for g in grouped if g.category in cats]
        for g in shown[:top]:
            lines.append(_header(g))
            repro = links.repro_of(g)
            detail = "; ".join(x for x in (evidence(g), repro and f"repro: {repro}") if x)
            if detail:
                lines.append(f"      {detail}")
        if len(shown) > top:
            rest = shown[top:]
            lines.append(f"  and {len(rest)} more {what} groups ({sum(g.size for g in rest)} items)"
                         + (f": {links.report}" if links.report else ""))
    if links.report:
        lines.append(f"  report: {links.report}")
    return lines


CONSOLE_CAUSES = 5  # new causes the console names


def _n(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def cause_lines(result: GateResult, links: Links | None = None, top: int = CONSOLE_CAUSES) -> list[str]:
    """The new error causes, first: '3 new causes (212 items) since 2.32.0', then the widest."""
    causes = result.causes
    if not causes:
        return []
    new = causes["new"]
    lines = [f"  causes: {_n(len(new), 'new cause')} ({_n(causes['new_items'], 'item')}) since {result.baseline['build']}, "
             f"{len(causes['gone'])} gone" + (f"; all: conformance errors --db {links.db} --build "
                                              f"{result.candidate['id']} --new-since {result.baseline['id']}"
                                              if links and links.db and new else "")]
    for c in new[:top]:
        reach = f"{_n(c['items'], 'item')}, {_n(len(c['ops']), 'op')}" + (f", {_n(len(c['models']), 'model')}" if c["models"] else "")
        lines.append(f"    NEW {c['key']} ({reach}): {c['text'][:160]}")
    if len(new) > top:
        lines.append(f"    and {_n(len(new) - top, 'more new cause')}")
    return lines


# -- Markdown ------------------------------------------------------------------------------
def _md(text: Any) -> str:
    """Stored text as inert Markdown: no HTML, no markup, no table-cell or line breaks."""
    return re.sub(r"([\\`*_{}\[\]()#+!|~<>&])", r"\\\1", " ".join(str(text).split()))


def _md_code(text: Any) -> str:
    # Inside a code span HTML and markup are literal; only a backtick (ends it) and a pipe (ends
    # the table cell) need care.
    return " ".join(str(text).split()).replace("`", "'").replace("|", "\\|")


def _md_change(g: FindingGroup) -> str:
    return _md(g.transition.replace(" -> ", " → "))


def markdown(result: GateResult, links: Links | None = None, top: int = MD_GROUPS) -> str:
    """A PR comment: the verdict, a summary table, the largest groups, their evidence collapsed."""
    links = links or Links()
    b, c = result.baseline, result.candidate
    grouped = groups(result)
    out = [f"## Gate: {_md(b['build'])} → {_md(c['build'])} — **{result.verdict}**", "",
           "| category | items | groups |", "|---|---|---|"]
    for cat in CATEGORIES:
        out.append(f"| {cat} | {len(result.of(cat))} | {sum(1 for g in grouped if g.category == cat)} |")
    if result.causes and result.causes["new"]:
        new = result.causes["new"]
        out = out[:2] + [f"**{len(new)} new error causes** ({result.causes['new_items']} items) since "
                         f"{_md(b['build'])}:", "", "| cause | items | ops | what |", "|---|---|---|---|"] + [
            f"| `{x['key']}` | {x['items']} | {len(x['ops'])} | `{_md_code(x['text'][:200])}` |" for x in new[:top]
        ] + [""] + out[2:]
    if result.confirmation is not None:
        out += ["", _md(result.confirmation.line().strip()), "", _md(_explained(result, grouped).strip())]
    if links.report:
        out += ["", f"Report: {_md_code(links.report)}" if "://" not in links.report
                else f"Report: <{links.report.replace('>', '%3E').replace(' ', '%20')}>"]
    for title, cats in (("Regressions", FAILS_GATE), ("Flaky", ("flaky",))):
        shown = [g for g in grouped if g.category in cats]
        if not shown:
            continue
        first_bad = cats != ("flaky",)  # since when the items have been bad: failing groups only
        out += ["", f"### {title} (largest first)", "",
                "| kind | op/model | variant | dtype | change | items |" + (" first bad build |" if first_bad else ""),
                "|---|---|---|---|---|---|" + ("---|" if first_bad else "")]
        out += [f"| {_md(g.kind)} | `{_md_code(g.name)}` | {_md(g.variant)} | {_md(g.dtype)} | {_md_change(g)} "
                f"| {g.size} |" + (f" {_md(g.first_bad_build or '-')} |" if first_bad else "") for g in shown[:top]]
        if len(shown) > top:
            rest = shown[top:]
            out += ["", f"and {len(rest)} more groups ({sum(g.size for g in rest)} items)"
                    + (" in the report" if links.report else " (`conformance gate --json` lists every item)")]
        out += ["", f"<details><summary>{title}: evidence, repro commands, items</summary>", ""]
        for g in shown[:top]:
            ev, repro = evidence(g), links.repro_of(g)
            keys = ", ".join(f"`{_md_code(k)}`" for k in g.item_keys[:MD_KEYS])
            more = f" and {g.size - MD_KEYS} more" if g.size > MD_KEYS else ""
            out.append(f"- `{_md_code(g.name)}` {_md(g.variant)}, {_md(g.dtype)}: {_md_change(g)}"
                       + (f"; {_md(ev)}" if ev else "") + (f"; repro: `{_md_code(repro)}`" if repro else "")
                       + f"; items: {keys}{more}")
        out += ["", "</details>"]
    return "\n".join(out) + "\n"


# -- JUnit -----------------------------------------------------------------------------------
def junit(result: GateResult, links: Links | None = None) -> str:
    """One test case per group: regressions and drift fail, flaky groups are skipped."""
    links = links or Links()
    cases, failures, skipped = [], 0, 0
    for g in groups(result, (*FAILS_GATE, "flaky")):
        name = quoteattr(f"{g.variant}|{g.dtype}|{g.transition}")
        keys = g.item_keys[:JUNIT_KEYS]
        body = "\n".join([f"{g.transition}: {g.size} items", evidence(g), links.repro_of(g),
                          "items: " + ", ".join(keys) + (f" and {g.size - len(keys)} more" if g.size > len(keys)
                                                         else ""), links.report])
        head = f'<testcase classname={quoteattr(g.kind + "." + g.name)} name={name}>'
        if g.category == "flaky":
            skipped += 1
            cases.append(f'{head}<skipped message={quoteattr(f"flaky: {json.dumps(g.reruns)}")}/></testcase>')
        else:
            failures += 1
            cases.append(f'{head}<failure message={quoteattr(f"{g.transition} ({g.size} items)")}>'
                         f'{escape(body.strip())}</failure></testcase>')
    if not failures:
        cases.append('<testcase classname="gate" name="no-regressions"/>')
    return (f'<?xml version="1.0" encoding="utf-8"?>\n<testsuite name="conformance-gate" tests="{len(cases)}" '
            f'failures="{failures}" skipped="{skipped}">{"".join(cases)}</testsuite>\n')


def gate_links(store: Store, result: GateResult, db_label: str, report: str = "") -> Links:
    """Where the renderings point: the repro ids of each regression and flaky group's first item."""
    firsts = [g.first_key for g in groups(result, ("regression", "flaky")) if g.kind == "op"]
    return Links(db=db_label, repro=result_ids(store, result.candidate["id"], firsts), report=report)
