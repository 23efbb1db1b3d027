"""The ``errors`` command: a run's failing items grouped into their causes, by reach."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from opdb import Store

from . import EXIT_FAILURES, EXIT_OK, UsageProblem, db_option, find_run, handles_errors, main

DEFAULT_LIMIT = 30


def cause_json(c: Any, new: bool | None) -> dict[str, Any]:
    first, last = c.first_seen, c.last_seen
    return {"key": c.key, "kind": c.kind, "exc": c.exc, "pattern": c.pattern, "locus": c.locus, "text": c.text(),
            "items": c.items, "statuses": c.statuses, "ops": c.ops, "dtypes": c.dtypes, "models": c.models,
            "reach": {build: {"run": rid, "items": n} for build, rid, n in c.trend if n} or None,
            "first_build": first[0] if first else None, "first_run": first[1] if first else None,
            "last_build": last[0] if last else None, "last_run": last[1] if last else None,
            "targets": c.targets, "new": new, "example": c.example, "example_item": c.example_key,
            "repro": c.repro_id, "repro_signature": c.repro_signature,
            "explanation": c.explanation, "workaround": c.workaround, "upstream": c.upstream, "owner": c.owner,
            "knowledge": c.knowledge}


@main.command("errors")
@db_option()
@click.option("--build", "build", default=None, metavar="BUILD|RUN",
              help="The build (its latest run) or run id whose causes to list (default: the latest run).")
@click.option("--target", default=None, help="With --build: the target whose run to take (a DB may hold several).")
@click.option("--new-since", "since", default=None, metavar="BUILD|RUN",
              help="Mark causes the given earlier build (or run) of the same target does not have; exit 1 if any.")
@click.option("--json", "as_json", is_flag=True, help="A JSON list of causes, each with its reach per build.")
@click.option("--limit", type=click.IntRange(0), default=DEFAULT_LIMIT, show_default=True,
              help="Causes listed (0: all); --json lists all.")
@click.option("--knowledge", type=click.Path(dir_okay=False, exists=True), default=None,
              help="The knowledge file to explain causes by (default: conformance/data/causes.toml).")
@handles_errors
def errors_cmd(db_path: str, build: str | None, target: str | None, since: str | None, as_json: bool, limit: int,
               knowledge: str | None) -> None:
    """List a run's failing items grouped into causes, widest reach first.

    A cause is a failure's normalised signature (exception type and message with numbers,
    shapes, paths, versions and op names taken out; for a value mismatch, its class and the
    ATen overload it is blamed on). Each cause shows its items, the ops, dtypes and models it
    reaches, the first build of the target that showed it, and what the knowledge file says.

    Example: conformance errors --db results/opdb.sqlite --build 2.33.0 --new-since 2.32.0
    """
    from conformance.triage import causes as ca
    from opdb import queries_causes as qc

    with Store.open(db_path, create=False) as st:
        run = find_run(st, build, target, "--build")
        base = find_run(st, since, run["target"], "--new-since") if since else None
        if base is not None and base["id"] == run["id"]:
            raise UsageProblem(f"--new-since {since!r} is the same run as --build ({run['id']})")
        summary = ca.ensure_runs(st, [run["id"]] + ([base["id"]] if base else []),
                                 knowledge=Path(knowledge) if knowledge else None)[0]
        before = qc.cause_keys(st, base["id"]) if base is not None else None
        found = qc.run_causes(st, run["id"])
    new = [c for c in found if before is not None and c.key not in before]
    if as_json:
        click.echo(json.dumps([cause_json(c, None if before is None else c.key not in before) for c in found], indent=1))
    else:
        for line in lines(run, base, summary, found, before, limit):
            click.echo(line)
    sys.exit(EXIT_FAILURES if new else EXIT_OK)


def lines(run: dict[str, Any], base: dict[str, Any] | None, summary: Any, found: list[Any],
          before: dict[str, int] | None, limit: int) -> list[str]:
    ratio = f"{summary.failing / summary.causes:.0f}:1" if summary.causes else "-"
    out = [f"causes of {run['target']} {run['build']} ({run['id']}): {summary.failing:,} failing items "
           f"in {summary.causes:,} causes ({ratio})"]
    if before is not None and base is not None:
        new = [c for c in found if c.key not in before]
        gone = len(set(before) - {c.key for c in found})
        n_items = sum(c.items for c in new)
        out.append(f"  since {base['build']} ({base['id']}): {len(new)} new cause{'' if len(new) == 1 else 's'} "
                   f"({n_items:,} item{'' if n_items == 1 else 's'}), {gone} gone")
        found = new + [c for c in found if c.key in before]  # the new ones first
    if not found:
        return out
    out.append(f"  {'key':<12} {'items':>7} {'ops':>4} {'dtypes':>6} {'models':>6}  {'first seen':<12} "
               f"{'':<9} cause")
    shown = found if limit == 0 else found[:limit]
    for c in shown:
        first = c.first_seen[0] if c.first_seen else "-"
        mark = "NEW" if before is not None and c.key not in before else ""
        known = "explained" if c.explanation else ""
        out.append(f"  {c.key:<12} {c.items:>7,} {len(c.ops):>4} {len(c.dtypes):>6} {len(c.models):>6}  "
                   f"{first:<12} {mark or known:<9} {c.text()[:160]}")
        if c.workaround:
            out.append(f"  {'':<12} workaround: {c.workaround}")
    if len(found) > len(shown):
        rest = found[len(shown):]
        out.append(f"  and {len(rest)} more causes ({sum(c.items for c in rest):,} items); --limit 0 lists all")
    return out
