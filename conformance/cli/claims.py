"""The ``claims`` command: a vendor's published compatibility table held against a build's run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from opdb import Store

from . import EXIT_FAILURES, EXIT_OK, db_option, find_run, handles_errors, main


@main.command("claims")
@click.argument("table", type=click.Path(dir_okay=False, exists=True), required=False)
@db_option()
@click.option("--build", "build", required=True, metavar="BUILD|RUN",
              help="The build (its latest run) or run id whose verdicts the table is held against.")
@click.option("--target", default=None, help="With --build: the target whose run to take (a DB may hold several).")
@click.option("--json", "json_path", default=None, type=click.Path(dir_okay=False),
              help="Write the disagreements (api, dtype, claimed, measured, kind) and unchecked claims to FILE.")
@click.option("--all", "show_all", is_flag=True, help="List kept claims too.")
@handles_errors
def claims_cmd(db_path: str, build: str, target: str | None, json_path: str | None, show_all: bool,
               table: str | None) -> None:
    """Hold a published compatibility table (Markdown: API | Status | Dtypes | Notes) against what
    a build did: claimed native (Y) but ran on the CPU fallback or fails on the device, claimed
    CPU_FALLBACK but ran natively, claimed not supported (N) but works, a dtype claimed but
    refused. A claim no stored item reached is unchecked, never kept. Exit 1 on any disagreement.

    Example: conformance claims --db results/opdb.sqlite --build 2.33.0 neuron_emu/builds/2.33.0.compat.md
    """
    from conformance.catalog import claims as cl

    if table is None:  # checked here, after --db and --build: click checks arguments first
        raise click.UsageError("Missing argument 'TABLE' (the compatibility table, a Markdown file).")
    table_claims = cl.load(Path(table))
    with Store.open(db_path, create=False) as st:
        run = find_run(st, build, target, "--build")
        report = cl.run_report(st, run["id"], Path(table))
    for line in lines(report, run, table, show_all):
        click.echo(line)
    if json_path:
        Path(json_path).write_text(json.dumps({
            "run": run["id"], "target": run["target"], "build": run["build"], "table": str(table),
            "claims": len(table_claims), "kept": report.count("kept"),
            "disagreements": [f.as_json() for f in report.disagreements],
            "unchecked": [f.as_json() for f in report.findings if f.kind == "unchecked"]}, indent=1) + "\n")
    sys.exit(EXIT_FAILURES if report.disagreements else EXIT_OK)


def lines(report, run: dict, table: str, show_all: bool = False) -> list[str]:
    from conformance.catalog.claims import KINDS

    bad = report.disagreements
    claims = len({f.claim.api for f in report.findings})
    out = [f"claims of {table} against {run['target']} {run['build']} ({run['id']}): {claims} claims, "
           f"{report.count('kept')} kept (claim x dtype), {len(bad)} disagree, {report.count('unchecked')} unchecked"]
    for kind, what in KINDS.items():
        these = [f for f in bad if f.kind == kind]
        if not these:
            continue
        out.append(f"  {kind} ({len(these)}): {what}")
        for f in these:
            out.append(f"    line {f.claim.line:<4} {f.claim.api:<36} {f.dtype:<10} claimed {f.claim.status:<12} "
                       f"measured: {f.measured}")
            if f.example:
                out.append(f"    {'':<9} e.g. {f.example[:220]}")
    unchecked = [f for f in report.findings if f.kind == "unchecked"]
    if unchecked:
        shown = ", ".join(f"{f.claim.api}{' ' + f.dtype if f.dtype else ''}" for f in unchecked[:12])
        out.append(f"  unchecked ({len(unchecked)}): {shown}{' ...' if len(unchecked) > 12 else ''}")
    if show_all:
        for f in report.findings:
            if f.kind == "kept":
                out.append(f"  kept   line {f.claim.line:<4} {f.claim.api:<36} {f.dtype:<10} {f.claim.status:<12} "
                           f"{f.measured}")
    return out
