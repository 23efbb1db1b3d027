"""CLI commands of the gate stage: ``gate``, ``ledger stale``, ``nightly``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from conformance.gate.limits import CONFIRM_BUDGET_S, MAX_RERUNS  # not .gate: it imports torch
from opdb import Store

from . import (
    EXIT_FAILURES,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    TARGETS,
    check_build,
    db_option,
    executor_options,
    fail,
    handles_errors,
    main,
)
from .sweep import ledger_group


@main.command("gate")
@click.option("--baseline", required=True, metavar="RUN|BUILD",
              help="The run to compare against: a run id, or a build name (its latest finished run).")
@click.option("--candidate", required=True, metavar="RUN|BUILD",
              help="The run under judgement: a run id, or a build name (its latest finished run).")
@click.option("--reruns", default=3, show_default=True,
              help="Re-runs of each representative item of a regressed op x variant x dtype (timeouts and crashes "
                   "once; 0: no confirmation).")
@click.option("--confirm-budget", "budget_s", default=CONFIRM_BUDGET_S, show_default=True, metavar="SECONDS",
              help="Time the whole flake confirmation may spend; groups it cannot afford stay regressions, "
                   "marked unconfirmed.")
@click.option("--max-reruns", default=MAX_RERUNS, show_default=True, help="Re-runs the whole confirmation may do.")
@click.option("--common-only", is_flag=True,
              help="Compare only the items both runs hold, even when their selections differ (says how many).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write the decision as JSON.")
@click.option("--junit", "junit_path", type=click.Path(dir_okay=False), help="Write JUnit XML.")
@click.option("--markdown", "md_path", type=click.Path(dir_okay=False),
              help="Write a Markdown summary short enough for a PR comment (the largest groups; details collapsed).")
@click.option("--report", "report", default=None, metavar="SITE",
              help="The report site (folder or URL) of these runs: the output links the candidate build's "
                   "regressions page in it.")
@click.option("--perf-fails", is_flag=True,
              help="Confirmed perf regressions (from a stored `conformance perf` run of these two builds) fail the "
                   "gate too; without it they are reported only.")
@db_option(default="results/opdb.sqlite")
@handles_errors
def gate_cmd(baseline: str, candidate: str, reruns: int, budget_s: float, max_reruns: int, common_only: bool,
             json_path: str | None, junit_path: str | None, md_path: str | None, report: str | None,
             perf_fails: bool, db_path: str) -> None:
    """Compare a candidate build (or run) with a baseline; exit 1 on regressions, 2 on infra.

    Where the database holds perf runs (conformance perf) or dist runs (conformance dist) of the
    two builds, their sections follow; a collective that passed and now fails is a regression.

    Refuses (exit 2) an infra, unfinished or empty run, and runs whose selections differ unless
    --common-only.

    Example: conformance gate --db results/opdb.sqlite --baseline 2.32.0 --candidate 2.33.0 --json gate.json
    """
    from conformance.gate.core import GateError, check_limits, run_gate
    from conformance.gate.render import gate_links, junit, markdown, summary_lines

    check_limits(reruns, budget_s, max_reruns)  # bad options: one line, exit 2, nothing written
    with Store.open(db_path, create=False) as st:
        try:
            result = run_gate(st, baseline, candidate, attempts=reruns, budget_s=budget_s, max_reruns=max_reruns,
                              common_only=common_only)
        except GateError as exc:
            if json_path:
                Path(json_path).write_text(json.dumps({"regressions": [], "improvements": [], "verdict": "infra",
                                                       "error": str(exc)}, indent=1))
            click.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_USAGE)
        links = gate_links(st, result, db_path, _report_page(report, st, result.candidate))
        perf = _perf(st, result)
        dist = _dist(st, result)
    for line in summary_lines(result, links):
        click.echo(line)
    for line in [*(perf.lines() if perf else ()), *(dist.lines() if dist else ())]:
        click.echo(line)
    perf_failed = bool(perf_fails and perf and perf.regressions) or bool(dist and dist.regressions)
    if json_path:
        doc = result.as_json()
        doc["perf"] = perf.as_json() if perf else None
        doc["dist"] = dist.as_json() if dist else None
        if perf_failed:
            doc["verdict"] = "fail"
        Path(json_path).write_text(json.dumps(doc, indent=1, default=str))
    if junit_path:
        Path(junit_path).write_text(junit(result, links))
    if md_path:
        Path(md_path).write_text(markdown(result, links) + ("\n" + perf.markdown() if perf else ""))
    sys.exit(EXIT_FAILURES if result.verdict == "fail" or perf_failed else EXIT_OK)


def _dist(store: Store, result: Any) -> Any:
    """The distributed section of the gated builds (None: one of them has no dist run). Its
    regressions fail the gate."""
    from conformance.dist.gate import dist_section

    cand, base = result.candidate, result.baseline
    return dist_section(store, cand["target"], cand["build"], base["build"])


def _perf(store: Store, result: Any) -> Any:
    """The perf section of the gated builds (None: no perf run measured them)."""
    from conformance.perf.gate import perf_section

    cand, base = result.candidate, result.baseline
    if cand.get("build") is None or base.get("build") is None:
        return None
    return perf_section(store, cand["target"], cand["build"], base["build"])


def _report_page(site: str | None, store: Store, candidate: dict[str, Any]) -> str:
    """The candidate build's regressions page in a report site (a folder or a URL) of this
    database: the folder the site names it by (beside other targets, ``cpu`` or ``TARGET BUILD``)."""
    if not site:
        return ""
    from reports.html import Slugger
    from reports.scope import build_folder

    folder = build_folder(store, candidate["target"], candidate["build"]) or Slugger()(candidate["build"] or "-")
    return f"{site.rstrip('/')}/{folder}/regressions.html"


@ledger_group.command("stale")
@click.option("--ledger", "ledger_path", default=None, type=click.Path(dir_okay=False),
              help="Ledger TOML to review (default: the shipped conformance/data/ledger.toml).")
@click.option("--runs", "n_runs", default=3, show_default=True, help="Look at the last N finished runs.")
@click.option("--target", default=None, help="Only runs of this target.")
@db_option(default="results/opdb.sqlite")
@handles_errors
def ledger_stale(ledger_path: str | None, n_runs: int, target: str | None, db_path: str) -> None:
    """List ledger entries that can go: expired, or passing in each of the last N runs.

    Example: conformance ledger stale --runs 5 --target neuron-emu
    """
    from conformance.check.ledger import Ledger
    from conformance.triage.ledger_review import stale_entries

    led = Ledger.load(ledger_path)
    with Store.open(db_path, create=False) as st:
        stale = stale_entries(st, led, n_runs=n_runs, target=target)
    for s in stale:
        click.echo(s.line())
    click.echo(f"{len(stale)} stale entries")


@main.command("nightly")
@click.option("--target", default="neuron-emu", show_default=True,
              help=f"{TARGETS} (as for conformance run).")
@click.option("--build", "builds", multiple=True, help="Build(s) to run, oldest first (default: all shipped).")
@click.option("--ops", "ops", multiple=True, metavar="GLOB",
              help="OpInfo name, aten:: overload or custom-op ('neuron::*') globs (repeatable; default: every op, "
                   "schema search and the target's custom ops included).")
@click.option("--dtypes", "dtypes", multiple=True, metavar="LIST", help="Comma-separated dtype names (default: every dtype).")
@click.option("--models", "models", multiple=True, default=("all",), show_default=True,
              help="Model families to run (repeatable; all, hf or family names such as mlp, resnet, gpt).")
@click.option("--model-limit", type=int, default=6, show_default=True,
              help="Graphs per family for the full per-graph protocol (0: the whole corpus; hours on 2 cores).")
@click.option("--no-models", is_flag=True, help="Skip the model corpus.")
@click.option("--no-schema", is_flag=True, help="Skip schema-driven coverage.")
@click.option("--sizes", type=click.Choice(["auto", "samples", "ladder", "traced", "all"]), default="auto",
              show_default=True,
              help="Op items at sample sizes, on the size ladder, at the signatures traced from the night's model "
                   "graphs (traced once, before the first build's sweep), or all (as for conformance run).")
@click.option("--reference-inputs", "reference_inputs", default="auto", show_default=True, metavar="auto|none|all|K/N",
              help="Whose reference_inputs the reference variant sweeps (as for conformance run); auto: the night's "
                   "slice, K = the UTC date's ordinal modulo N = 4, so every OpInfo's within 4 nights (a resumed nightly "
                   "keeps the slice it started with).")
@click.option("--zoo", default="auto", show_default=True, metavar="auto|none|all|K/N",
              help="Real architectures (transformers, timm, torchvision; the zoo and hf extras) every build runs beside "
                   "--models: auto, the night's slice, K = the UTC date's ordinal modulo N = 120, so every "
                   "architecture within 120 nights, eager items (none installed: the nightly says so and runs without them).")
@click.option("--generate", "generate", default="auto", show_default=True, metavar="auto|none|all|K/N",
              help="Causal LMs (transformers; the hf extra) every build decodes with against the CPU (the generation "
                   "lane): auto, the night's slice hf@K/100, K = the UTC date's ordinal modulo 100, so every causal LM "
                   "within 100 nights; with --perf their decode steps are timed build against build too.")
@click.option("-n", "--workers", default=2, show_default=True, help="Worker processes per run.")
@click.option("--shard", default="1/1", show_default=True, metavar="K/N",
              help="Run this shard of every build's work (merge the shard databases, then --finish).")
@click.option("--run-id-prefix", default=None, help="Shards of one nightly must share this.")
@click.option("--site", default="results/site", show_default=True, type=click.Path(file_okay=False),
              help="Folder the report site is written to.")
@click.option("--finish", is_flag=True, help="After merging shard DBs: coverage, report and gate only.")
@click.option("--perf", is_flag=True,
              help="After the sweeps, time each build against the previous one (conformance perf: op and model-graph "
                   "latency, interleaved); the gate and the report show what it finds.")
@click.option("--perf-ops", multiple=True, default=("*",), show_default=True, metavar="GLOB",
              help="With --perf: OpInfo globs timed (float32; small, medium and large inputs).")
@click.option("--perf-models", multiple=True, default=("all",), show_default=True, metavar="NAME",
              help="With --perf: model families or ids whose forward pass is timed per shape variant.")
@click.option("--perf-model-limit", type=int, default=1, show_default=True, help="With --perf: graphs per family.")
@click.option("--dist", is_flag=True,
              help="After the sweeps, run the collectives and FSDP2/tensor-parallel training parity on each build's "
                   "c10d backend (conformance dist --training fsdp2,tp); the gate fails on an item that passed and "
                   "now fails.")
@click.option("--dist-world-sizes", default="2,3,4", show_default=True, metavar="LIST",
              help="With --dist: process group sizes.")
@executor_options
@click.option("--resume", default=None, metavar="PREFIX",
              help="Continue an interrupted nightly (its prefix is printed when it stops), with the options it "
                   "was started with: finished builds are kept, the interrupted one resumes, the rest run.")
@db_option(default="results/opdb.sqlite")
@handles_errors
def nightly_cmd(target: str, builds: tuple[str, ...], ops: tuple[str, ...], dtypes: tuple[str, ...],
                models: tuple[str, ...], model_limit: int | None, no_models: bool, no_schema: bool, sizes: str,
                reference_inputs: str, zoo: str, generate: str, workers: int,
                shard: str, run_id_prefix: str | None, site: str, finish: bool, perf: bool, perf_ops: tuple[str, ...],
                perf_models: tuple[str, ...], perf_model_limit: int, dist: bool, dist_world_sizes: str,
                resume: str | None,
                db_path: str, executor: str, ray_address: str | None, task_resources: tuple[str, ...]) -> None:
    """The nightly: sweeps (OpInfo, schema search, the target's custom ops) + models per build, coverage, the
    report site, and the gate.

    Example: conformance nightly --build 2.32.0 --build 2.33.0 --ops "nn.functional.*" --model-limit 5

    Interrupted (Ctrl-C, SIGTERM), it stops in the build it was sweeping and exits 130; --resume
    continues it.
    """
    if resume and finish:
        fail("--resume continues a nightly's sweeps and --finish skips them: give one")
    if resume and run_id_prefix and resume != run_id_prefix:
        fail(f"--resume {resume} and --run-id-prefix {run_id_prefix} name two nightlies: give --resume alone")
    for build in builds:  # before the imports below load torch
        check_build(target, build)
    from conformance.gate.nightly import NightlyResult, NightlySpec, finish_stages, run_nightly
    from conformance.run.runner import stderr_progress
    from conformance.run.spec import RunSpec

    Path(db_path).parent.mkdir(parents=True, exist_ok=True)
    run = RunSpec(target=target, ops=ops, dtypes=dtypes, models=() if no_models else models,
                  model_limit=model_limit or None, schema=not no_schema and not ops, sizes=sizes, workers=workers, shard=shard,
                  executor=executor, ray_address=ray_address, task_resources=task_resources)
    perf_spec = None
    if perf:
        from conformance.perf.lane import PerfSpec

        perf_spec = PerfSpec(target=target, ops=perf_ops, models=perf_models, model_limit=perf_model_limit or None)
    dist_spec = None
    if dist:
        from conformance.dist.lane import DistSpec

        from .dist import int_list

        dist_spec = DistSpec(target=target, world_sizes=int_list(dist_world_sizes), training=("fsdp2", "tp"),
                             training_reference="device")
    spec = NightlySpec(run=run, builds=builds, run_id_prefix=run_id_prefix, site=site, perf=perf_spec, dist=dist_spec,
                       reference_inputs=reference_inputs, zoo=None if no_models else zoo, generate=generate)
    if finish:
        result = NightlyResult()
        with Store.open(db_path) as store:
            finish_stages(store, spec, result, click.echo, db_label=db_path)
    else:
        result = run_nightly(spec, db_path, progress=stderr_progress(), echo=click.echo, resume=resume)
    if result.interrupted is not None:
        sys.exit(EXIT_INTERRUPTED)
    if any(s.infra for s in result.summaries.values()):
        sys.exit(EXIT_USAGE)
    sys.exit(result.gate_exit)
