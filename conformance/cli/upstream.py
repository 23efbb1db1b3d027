"""The ``upstream`` command: a run's findings against the upstream project's own expectations."""

from __future__ import annotations

import json
import sys

import click

from opdb import Store

from . import EXIT_OK, UsageProblem, db_option, handles_errors, main

_SHOWN = {"pass": "pass", "pass_fallback": "pass"}


def _statuses(st: dict[str, int]) -> str:
    return ", ".join(f"{n} {s}" for s, n in sorted(st.items(), key=lambda kv: -kv[1])) or "no items"


@main.command("upstream")
@db_option()
@click.option("--run", "run_id", required=True, help="Run id of an op sweep on the upstream project's backend.")
@click.option("--source", default=None,
              help="Which stored upstream list to triage against (a [source.NAME] of upstream_inductor.toml or "
                   "upstream_onnxruntime.toml). Default: the first list about the run's target.")
@click.option("--dtype", default="float32", show_default=True, help="Dtype of the upstream facts to triage.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the tables.")
@handles_errors
def upstream_cmd(db_path: str, run_id: str, source: str | None, dtype: str, as_json: bool) -> None:
    """Triage every upstream-known failure (PyTorch's own Inductor CPU expected failures and
    skips; ONNX Script's for the ONNX exporter in ONNX Runtime) against a run, and list the run's
    findings upstream does not know.

    Each upstream fact is re-found (the run holds a failing status for the op x dtype), stale (a
    standalone check passes it here: tools/upstream_inductor_check.py or
    upstream_onnx_check.py), untestable
    (with the reason), not swept, or missed. Recall = re-found / (total - stale - not swept).
    A fact that still fails standalone says on which samples: "holds on some sample" where
    upstream expects it of some samples and the check ran every sample (the list does not say
    which), "holds on the matched samples" where it ran those upstream's matchers pick.
    Exit 0 whatever it finds (it is a report, not a gate).

    Example: conformance upstream --db results/opdb.sqlite --run RUN_ID
    """
    from conformance.triage import upstream
    from opdb.queries_report import matrix_cells

    with Store.open(db_path, create=False) as st:
        run = st.get_run(run_id)
        if run is None:
            raise UsageProblem(f"{db_path}: no run {run_id!r}")
        if source is None:
            source = upstream.default_source(run.get("target"))
        src = upstream.sources().get(source)
        pairs = upstream.statuses_by_pair(matrix_cells(st, run_id))
        # a fact is re-found by the variants upstream's test runs only (its forward call, say: an
        # inference-only target's refused backward items re-find nothing)
        tested = upstream.statuses_by_pair(matrix_cells(st, run_id, src.variants)) if src else pairs
    rows = upstream.triage(tested, source=source, dtype=dtype, target=run.get("target"))
    found, denominator = upstream.recall(rows)
    unknown = [(op, dt, s) for op, dt, s in upstream.unknown_findings(pairs, source=source) if dt == dtype]
    if as_json:
        click.echo(json.dumps({
            "run": run_id, "target": run.get("target"), "source": str(src), "variants": list(src.variants), "dtype": dtype,
            "triage": [{"op": r.op, "expectation": r.expectation, "samples": r.samples, "outcome": r.outcome,
                        "statuses": r.statuses, "standalone": r.standalone, "why": r.why} for r in rows],
            "counts": {o: sum(r.outcome == o for r in rows) for o in upstream.OUTCOMES},
            "recall": {"re_found": found, "of": denominator},
            "unknown_to_upstream": [{"op": op, "dtype": dt, "statuses": s} for op, dt, s in unknown]}, indent=1))
        sys.exit(EXIT_OK)
    scope = f" (statuses of {', '.join(src.variants)} items)" if src.variants else ""
    click.echo(f"run {run_id} ({run.get('target')}) against {src} [{source}], {dtype}, cpu{scope}: "
               f"{len(rows)} upstream-known failures")
    for outcome in upstream.OUTCOMES:
        group = [r for r in rows if r.outcome == outcome]
        if not group:
            continue
        click.echo(f"{outcome} ({len(group)}):")
        for r in group:
            why = f" - {r.why}" if r.why else ""
            some = " (some samples)" if r.samples == "some" else ""
            # a standalone failure is worded by the samples it was found on (upstream.claim)
            alone = f"; standalone: {r.standalone}" if r.standalone.startswith("holds") else ""
            click.echo(f"  {r.op:46s} upstream {r.expectation:5s}{some} harness: {_statuses(r.statuses)}{alone}{why}")
    share = f"{found}/{denominator} = {found / denominator:.0%}" if denominator else "n/a (nothing to re-find)"
    click.echo(f"recall of upstream-known failures among the swept ops: {share} "
               f"(stale {sum(r.outcome == 'stale' for r in rows)}, "
               f"untestable {sum(r.outcome == 'untestable' for r in rows)}, "
               f"not swept {sum(r.outcome == 'not swept' for r in rows)})")
    click.echo(f"harness findings upstream does not list ({len(unknown)}):")
    for op, _, s in unknown:
        click.echo(f"  {op:46s} {_statuses(s)}")
