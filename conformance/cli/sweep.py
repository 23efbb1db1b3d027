"""CLI commands of the op sweep: ``run``, ``repro``, ``ledger``."""

from __future__ import annotations

import shlex
import sys
from typing import Any

import click

from opdb import OpdbError, Store

from . import (
    EXIT_FAILURES,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    TARGETS,
    UsageProblem,
    check_build,
    db_option,
    env_pairs,
    executor_options,
    handles_errors,
    main,
)

# conformance.select.VARIANTS, spelt out so that the CLI's help needs no torch import (a test
# keeps the two equal)
CLI_VARIANTS = "function,inplace,out,backward,sparse_coo,sparse_csr,sparse_csc,sparse_bsr,sparse_bsc,reference,dtypes"


@main.command("run")
@click.option("--target", default="neuron-emu", show_default=True,
              help=f"{TARGETS} (any device type torch knows, see --import)")
@click.option("--import", "imports", multiple=True, metavar="MODULE",
              help="Import this module first, in the supervisor and every worker (repeatable), "
                   "e.g. --target device:neuron --import neuron_emu.")
@click.option("--env", "env", multiple=True, metavar="NAME=VALUE", callback=lambda _c, _p, v: env_pairs(v),
              help="Set this environment variable in the supervisor and every worker before the target loads "
                   "(repeatable; kept with the run, so a resume and a repro set it too), e.g. --target "
                   "device:neuron --import torch_neuronx --env TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS=1 "
                   "(a kernel that fails is an error, not a silent CPU recovery).")
@click.option("--build", default=None, help="SDK build name or manifest .toml (neuron-emu).")
@click.option("--ops", "ops", multiple=True, metavar="GLOB",
              help="OpInfo name globs, aten:: overload globs for schema-driven inputs, or globs of the target's "
                   "custom ops, e.g. 'neuron::*' (repeatable; none: all of them, the target's custom ops included).")
@click.option("--dtypes", "dtypes", multiple=True, metavar="LIST", help="Comma-separated dtype names (float32, bfloat16, int64, ...; aliases such as 'float' are refused).")
@click.option("--thorough", is_flag=True, help="reference_inputs instead of sample_inputs.")
@click.option("--variants", default=CLI_VARIANTS, show_default=True,
              help="Comma-separated OpInfo variants to run (sparse_*: the OpInfo's own samples in that layout; "
                   "reference: the function on the reference_inputs the samples lack, for the OpInfos "
                   "--reference-inputs selects; dtypes: one probe per op and dtype of --dtypes, claimed by the "
                   "OpInfo or not, of whether the target runs it forward and backward where the CPU does).")
@click.option("--reference-inputs", "reference_inputs", default="none", show_default=True, metavar="none|all|K/N",
              help="Whose reference_inputs the reference variant runs (those of an OpInfo's reference_inputs the "
                   "sample_inputs lack, by shapes, dtypes, strides and arguments): none, all, or K/N, the OpInfos "
                   "whose stable name hash is K modulo N (0 <= K < N). The nightly sweeps one such slice a night.")
@click.option("--sizes", type=click.Choice(["auto", "samples", "ladder", "traced", "all"]), default="auto",
              show_default=True,
              help="Op items at the OpInfo's sample sizes; on the size ladder (one sample per op x dtype grown to "
                   "element counts around the powers of two from 2^10 to 2^20, the first failing size bisected); at "
                   "the signatures traced from the model graphs (`conformance trace`, stored in the database); or all. "
                   "auto: the samples and the traced signatures, and the ladder on an eager target (on a compiler "
                   "target each rung is a compile).")
@click.option("--contracts", "contracts", multiple=True, metavar="LIST",
              help="Contract checks besides values: metadata, aliasing, noncontiguous, variants, out, errors, "
                   "determinism; 'all', 'none' or 'default' (all on an eager target; metadata, variants, "
                   "determinism on a compiler target).")
@click.option("--contract-budget", "contract_budget", default="2", show_default=True, metavar="K|all",
              callback=lambda _c, _p, v: _budget(v),
              help="Per op x variant x dtype, check the costly contracts (noncontiguous, variants) on the first K "
                   "samples and then on each sample of a new shape class; 'all': on every sample.")
@click.option("--schema/--no-schema", "schema", default=None,
              help="Schema-driven inputs for overloads no OpInfo reaches (default: on for a full sweep).")
@click.option("--corpus/--no-corpus", "corpus", default=True, show_default=True,
              help="Replay the schema search's stored inputs per overload (opdb schema_corpus) and search only "
                   "where none are stored or the overload's schema, CPU kernels or torch changed; "
                   "--no-corpus searches every overload and stores nothing.")
@click.option("--models", "models", multiple=True, metavar="FAMILY|all|hf",
              help="Run model graphs of these families (alone: models only).")
@click.option("--model-limit", type=int, default=None, help="At most this many graphs per family.")
@click.option("--model-modes", default="eager,compile", show_default=True,
              help="Model items per graph: eager (parity, grads, training), compile (+ shape sweep, latency).")
@click.option("--generate", "generate", multiple=True, metavar="hf|hf@K/N|ID",
              help="Greedy-decode with these causal LMs on the target against the CPU (the generation lane: "
                   "token agreement, near-tie flips, log-likelihood, p50/p99 per token; alone: generation only).")
@click.option("--gen-modes", "gen_modes", default="eager,compile", show_default=True,
              help="Generation items per model and bucket: eager, compile (a server's compiled decode) or both.")
@click.option("--buckets", "gen_buckets", default=None, metavar="N,N,...",
              help="Prompt lengths (default: conformance/data/generation.toml's, 8,32,128,512).")
@click.option("--new-tokens", "gen_new_tokens", type=int, default=None,
              help="Greedy tokens per sequence (default: generation.toml's, 16).")
@click.option("-n", "--workers", default=2, show_default=True, type=click.IntRange(1, 64),
              help="Worker processes running items in parallel (each isolated: a crash or hang loses one item).")
@click.option("--shard", default="1/1", show_default=True, metavar="K/N",
              help="Run every N-th group starting at the K-th (1 <= K <= N; an empty shard is refused).")
@click.option("--resume", "resume", default=None, metavar="RUN_ID", help="Continue an interrupted run.")
@click.option("--run-id", default=None, help="Label the run (shards of one run share an id and its spec; a recorded shard is refused).")
@click.option("--timeout", "timeout_s", default=60.0, show_default=True, help="Seconds per item (finite, above 0).")
@click.option("--max-samples", type=int, default=None, help="At most this many samples per op x dtype (1 or more).")
@click.option("--compile-batch", "compile_batch", type=int, default=None,
              help="Compiler targets (inductor, ...): compile up to this many samples of an op x dtype as one graph, "
                   "bisecting a batch that fails; 1: one graph per item. Verdicts are the same either way. "
                   "Default: the target's (16 on inductor, inductor-strict and onnxruntime; 1 on openvino, "
                   "where batches measured no faster).")
@click.option("--ledger", default=None, type=click.Path(dir_okay=False), help="Tolerance/xfail ledger TOML.")
@click.option("--seed", type=int, default=None,
              help="Seed of the generated inputs (default: the fixed seed every run shares, so runs compare).")
@click.option("--refcache", default="auto", show_default=True, metavar="auto|none|FILE",
              help="Where CPU reference results are kept for the next run or build to take (keyed by the "
                   "sample's content, torch and the harness; only results that took 2 ms or more): 'auto' "
                   "beside --db (DB.refcache.sqlite), 'none' to compute every reference.")
@executor_options
@click.option("--exit-zero", is_flag=True, help="Exit 0 when the run completes, whatever it found.")
@click.option("--quiet", is_flag=True, help="No progress line.")
@db_option(default="results/opdb.sqlite")
@handles_errors
def run_cmd(variants: str, schema: bool | None, model_modes: str, resume: str | None, exit_zero: bool, quiet: bool,
            db_path: str, **spec_fields: Any) -> None:
    """Sweep every OpInfo x dtype x variant x sample on a target against the CPU.

    The summary and the exit code are about the whole run (a resumed run's earlier sessions
    included); a run that records no item exits 2. What workers print is stored with the item
    it belongs to (result column ``output``), not shown here.

    Example: conformance run --target neuron-emu --build 2.33.0 --ops "nn.functional.*" -n 2
    """
    check_build(spec_fields["target"], spec_fields["build"])  # before the imports below load torch
    from conformance.run.runner import RunSpec, execute_run, stderr_progress

    # the options named like a RunSpec field go to it as they are (a new run option is a field
    # and an option of the same name); these are derived from several options or parsed
    ops, models = spec_fields["ops"], spec_fields["models"]
    opinfo = bool(ops) or not (models or spec_fields["generate"])
    if schema is None:
        schema = opinfo and not ops  # the full default sweep covers every overload it can
    spec_fields["contracts"] = spec_fields["contracts"] or ("default",)
    spec_fields["gen_modes"] = parse_modes(spec_fields["gen_modes"], "--gen-modes")
    spec_fields["gen_buckets"] = parse_ints(spec_fields["gen_buckets"], "--buckets")
    spec = RunSpec(**spec_fields, opinfo=opinfo, schema=schema, variants=_variants(variants),
                   model_modes=parse_modes(model_modes))
    summary = execute_run(spec, db_path, resume=resume, progress=None if quiet else stderr_progress())
    click.echo(summary.render())
    if summary.failures and not summary.interrupted and not summary.infra:
        click.echo(causes_line(db_path, summary.run_id))
    if summary.infra:
        sys.exit(EXIT_USAGE)
    if summary.interrupted:
        click.echo(f"interrupted; continue with: conformance run --resume {summary.run_id} --db {db_path}")
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(EXIT_OK if exit_zero or not summary.failures else EXIT_FAILURES)


def _budget(text: str) -> int:
    if text.strip().lower() == "all":
        return 0
    try:
        k = int(text)
    except ValueError:
        k = -1
    if k < 1:
        raise click.BadParameter(f"{text!r}: expected a whole number of samples (1 or more) or 'all'")
    return k


def _variants(text: str) -> tuple[str, ...]:
    from conformance.select import VARIANTS

    chosen = tuple(v.strip() for v in text.split(",") if v.strip())
    bad = [v for v in chosen if v not in VARIANTS]
    if bad or not chosen:
        raise UsageProblem(f"--variants {text!r}: unknown variant {bad[0] if bad else ''!r}; "
                           f"expected some of {', '.join(VARIANTS)}")
    return chosen


def parse_modes(text: str, option: str = "--model-modes") -> tuple[str, ...]:
    chosen = tuple(m.strip() for m in text.split(",") if m.strip())
    if not chosen or any(m not in ("eager", "compile") for m in chosen):
        raise UsageProblem(f"{option} {text!r}: expected eager, compile or both")
    return chosen


def parse_ints(text: str | None, option: str) -> tuple[int, ...]:
    if text is None:
        return ()
    try:
        out = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        out = ()
    if not out or any(n < 1 for n in out):
        raise UsageProblem(f"{option} {text!r}: expected whole numbers >= 1, comma-separated (e.g. 8,32,128)")
    return tuple(sorted(set(out)))


@main.command("trace")
@click.option("--models", "models", multiple=True, default=("all",), show_default=True,
              help="Model families whose graphs are traced (repeatable; all, hf or family names such as mlp, gpt).")
@click.option("--model-limit", type=int, default=6, show_default=True, help="Graphs per family (0: every graph).")
@click.option("--dtypes", "dtypes", default="float32,bfloat16", show_default=True, metavar="LIST",
              help="The dtypes the graphs are traced in (those of the model lane: float32, bfloat16).")
@click.option("--quiet", is_flag=True, help="No progress line.")
@db_option(default="results/opdb.sqlite")
@handles_errors
def trace_cmd(models: tuple[str, ...], model_limit: int, dtypes: str, quiet: bool, db_path: str) -> None:
    """Trace every ATen call of the model graphs on the CPU (forward and backward) and store each
    distinct signature (overload, shapes, strides, dtypes, arguments) with the models using it.
    Runs then replay them at those sizes (--sizes auto, traced or all).

    Example: conformance trace --models gpt --models vit --model-limit 3 --db results/opdb.sqlite
    """
    from conformance.sweep.traced import trace_into

    chosen = [d.strip() for d in dtypes.split(",") if d.strip()]
    bad = [d for d in chosen if d not in ("float32", "bfloat16", "float16", "float64")]
    if bad or not chosen:
        raise UsageProblem(f"--dtypes {dtypes!r}: expected floating dtypes the model graphs run in (float32, bfloat16)")
    from conformance.run.runner import stderr_progress

    with Store.open(db_path) as st:
        lines = trace_into(st, list(models), model_limit or None, chosen, progress=None if quiet else stderr_progress())
    for line in lines:
        click.echo(line)


@main.command("repro")
@click.argument("result_ids", nargs=-1, required=True, type=int, metavar="RESULT_ID...")
@click.option("--out", "out_dir", default="repro", show_default=True, type=click.Path(file_okay=False),
              help="Folder to write the scripts and their saved inputs into (created if missing).")
@db_option(default="results/opdb.sqlite")
@handles_errors
def repro_cmd(result_ids: tuple[int, ...], out_dir: str, db_path: str) -> None:
    """Write a standalone script (inputs saved next to it) that reproduces a result; several ids
    write one script each in one call (torch and the target load once). A result that cannot be
    written says why on its own line and the others are still written; the exit code is then 2.

    Example: conformance repro 1234 --db results/opdb.sqlite  (prints the command that runs the script)
    """
    from conformance.triage.repro import write_repro

    refused = []
    with Store.open(db_path, create=False) as st:
        for result_id in result_ids:
            try:
                script = write_repro(st, result_id, out_dir)
            except (ValueError, OpdbError) as exc:
                if len(result_ids) == 1:
                    raise
                refused.append(result_id)
                said = str(exc)
                click.echo(f"error: {said if f'result {result_id}' in said else f'result {result_id}: {said}'}", err=True)
                continue
            # the interpreter running this command has torch and the target's package; a bare `python`
            # (the system's, outside the virtual environment) has neither
            click.echo(f"wrote {script} (run: {shlex.join([sys.executable, str(script)])})")
    if refused:
        raise UsageProblem(f"{len(refused)} of {len(result_ids)} results have no script (each said why above): "
                           + ", ".join(map(str, refused)))


@main.group("ledger")
def ledger_group() -> None:
    """Tolerance ledger and expected failures.

    Example: conformance ledger check conformance/data/ledger.toml
    """


@ledger_group.command("check")
@click.argument("path", required=False, type=click.Path(dir_okay=False))
@handles_errors
def ledger_check(path: str | None) -> None:
    """Validate a ledger file (default: the shipped one).

    Example: conformance ledger check my-ledger.toml
    """
    from conformance.check.ledger import Ledger

    led = Ledger.load(path)
    click.echo(f"ok: {len(led.defaults)} defaults, {len(led.overrides)} overrides, {len(led.xfails)} expected failures")


@ledger_group.command("propose")
@click.option("--run", "run_id", required=True, metavar="RUN_ID", help="The stored run whose mismatches to read.")
@click.option("--max-rel", default=0.1, show_default=True, help="Propose nothing for errors above this.")
@db_option(default="results/opdb.sqlite")
@handles_errors
def ledger_propose(run_id: str, max_rel: float, db_path: str) -> None:
    """Suggest tolerance overrides (TOML on stdout) from a run's stored mismatch evidence.

    Example: conformance ledger propose --run 20261130T120000-neuron-emu-2.33.0-ab12cd >> my-ledger.toml
    """
    from conformance.triage.ledger_review import propose_overrides

    with Store.open(db_path, create=False) as st:
        proposal = propose_overrides(st, run_id, max_rel=max_rel)
    for block in proposal.overrides:
        click.echo(block)
    click.echo(proposal.summary())


def causes_line(db_path: str, run_id: str) -> str:
    """The run's failing items grouped into causes, in one line (conformance/triage/causes.py)."""
    from conformance.triage.causes import ensure

    with Store.open(db_path) as st:
        s = ensure(st, run_id)
    return (f"causes: {s.failing} failing items in {s.causes} causes; "
            f"list them with: conformance errors --db {db_path} --build {run_id}")
