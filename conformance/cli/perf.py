"""The ``perf`` command: a build's op, model-graph and decode-step latency against a baseline build's."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

import click

from opdb import Store

from . import (
    EXIT_FAILURES,
    EXIT_INTERRUPTED,
    EXIT_OK,
    TARGETS,
    check_build,
    db_option,
    env_pairs,
    handles_errors,
    main,
)


def finding_json(row: dict[str, Any]) -> dict[str, Any]:
    """One finding as ``--json`` prints it (``item``: op, model or decode; a decode item's model is
    the causal LM and its shape the bucket, ``b32``)."""
    op = row["kind"] == "op"
    return {"item": row["kind"], "op": row["subject"] if op else None, "model": None if op else row["subject"],
            "dtype": row["dtype"], "shape": row["shape"], "signature": row.get("signature"),
            "kind": row["verdict"], "ratio": row["ratio"], "low": row["low"], "high": row["high"],
            "p50": row.get("p50"), "base_p50": row.get("base_p50"), "p99": row.get("p99"),
            "base_p99": row.get("base_p99"), "confirmed": bool(row.get("confirmed"))}


@main.command("perf")
@click.option("--target", default="neuron-emu", show_default=True, help=TARGETS)
@click.option("--build", default=None, help="The candidate build (default: the target's default).")
@click.option("--baseline-build", default=None,
              help="The build to compare with, measured interleaved in the same session (default: the candidate's "
                   "own build: an A/A run, which should find nothing).")
@click.option("--ops", "ops", multiple=True, metavar="GLOB", help="OpInfo name globs (repeatable), e.g. 'mm' or 'nn.functional.*'.")
@click.option("--dtypes", "dtypes", default="float32", show_default=True, metavar="LIST",
              help="Comma-separated dtypes of the op items.")
@click.option("--models", "models", multiple=True, metavar="NAME",
              help="Model families or ids (repeatable; all, mlp, gpt, ...): forward latency per shape variant.")
@click.option("--decode", "decode", multiple=True, metavar="LM",
              help="Causal LMs (repeatable or comma-separated: hf, hf@K/N, ids such as hf.llama): one greedy decode "
                   "step with a KV cache holding a prompt bucket (per-token decode latency), in the float32 and "
                   "bfloat16 of --dtypes.")
@click.option("--buckets", default=None, metavar="LIST",
              help="Prompt lengths of the --decode items, comma-separated (default: generation.toml's buckets).")
@click.option("--model-limit", type=int, default=2, show_default=True, help="Graphs per model family (0: all).")
@click.option("--sizes", default="small,medium,large", show_default=True, metavar="LIST",
              help="Op input sizes: small and medium are OpInfo samples, large a sample grown to 65,537 elements.")
@click.option("--threshold", type=float, default=1.2, show_default=True,
              help="A regression is called only when the whole interval of candidate/baseline lies above this.")
@click.option("--confidence", type=float, default=0.95, show_default=True, help="The interval's confidence level.")
@click.option("--rounds", type=int, default=10, show_default=True, help="Paired rounds per item (more where undecided).")
@click.option("--max-rounds", type=int, default=60, show_default=True, help="Most rounds per item.")
@click.option("--no-confirm", is_flag=True, help="Report a call without measuring it again first.")
@click.option("--timeout", "timeout_s", type=float, default=60.0, show_default=True,
              help="Seconds one request to a worker may take (a hang is killed, recorded as timeout).")
@click.option("--env", "env", multiple=True, metavar="NAME=VALUE", callback=lambda _c, _p, v: env_pairs(v),
              help="Set in both workers before the target loads (repeatable).")
@click.option("--json", "as_json", is_flag=True,
              help="Print the findings as a JSON list on stdout (op, dtype, shape, kind, ratio, low, high, ...); "
                   "progress goes to stderr.")
@click.option("--resume", default=None, metavar="RUN", help="Continue an interrupted perf run with its own options.")
@db_option(default="results/opdb.sqlite")
@handles_errors
def perf_cmd(target: str, build: str | None, baseline_build: str | None, ops: tuple[str, ...], dtypes: str,
             models: tuple[str, ...], decode: tuple[str, ...], buckets: str | None, model_limit: int, sizes: str, threshold: float, confidence: float, rounds: int,
             max_rounds: int, no_confirm: bool, timeout_s: float, env: tuple[str, ...], as_json: bool,
             resume: str | None, db_path: str) -> None:
    """Measure op, model-graph and decode-step latency (p50/p99) of a build against a baseline build,
    interleaved in one session; exit 1 on a confirmed regression.

    Each item is timed in paired rounds (baseline and candidate alternately, one thread each); a
    regression needs the whole bootstrap interval of the ratio above --threshold and a fresh
    re-measurement that agrees.

    Example: conformance perf --build 2.33.0 --baseline-build 2.32.0 --ops 'nn.functional.*' --json

    Example: conformance perf --build 2.33.0 --baseline-build 2.32.0 --decode hf.llama,hf.gpt2 --buckets 8,128
    """
    from conformance.perf.lane import PerfSpec, run_perf
    from conformance.select import parse_dtypes

    for b, opt in ((build, "--build"), (baseline_build, "--baseline-build")):
        check_build(target, b, opt)
    spec = None
    if not resume:
        spec = PerfSpec(target=target, build=build, baseline_build=baseline_build, ops=ops,
                        dtypes=parse_dtypes([dtypes]), models=models, decode=decode,
                        buckets=_buckets(buckets) if decode else (), model_limit=model_limit or None,
                        sizes=tuple(s.strip() for s in sizes.split(",") if s.strip()), threshold=threshold,
                        confidence=confidence, rounds=rounds, max_rounds=max_rounds, confirm=not no_confirm,
                        timeout_s=timeout_s, env=env)
    say = (lambda line: click.echo(line, err=True)) if as_json else click.echo
    Path(db_path).parent.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops it as Ctrl-C does
    with Store.open(db_path) as st:
        result = run_perf(spec, st, progress=say, resume=resume)  # type: ignore[arg-type]
    for line in summary(result.rows, result.run_id, interrupted=result.interrupted):
        say(line)
    if result.skipped_pairs:
        say(f"  {len(result.skipped_pairs)} op (or causal LM) x dtype pairs have nothing to time, e.g. "
            + "; ".join(f"{op} {dt}: {why}" for op, dt, why in result.skipped_pairs[:3]))
    if as_json:
        click.echo(json.dumps([finding_json(r) for r in result.findings()], indent=1))
    if result.interrupted:
        say(f"interrupted: conformance perf --db {db_path} --resume {result.run_id}")
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(EXIT_FAILURES if result.regressions else EXIT_OK)


def _buckets(text: str | None) -> tuple[int, ...]:
    """``--buckets`` as prompt lengths; without it the generation data file's (stored with the run,
    so a resume measures what the run started with)."""
    from conformance.datafiles import generation
    from conformance.perf.lane import PerfError

    if text is None:
        return generation().buckets
    try:
        out = tuple(sorted({int(w) for w in text.split(",") if w.strip()}))
    except ValueError:
        out = ()
    if not out or out[0] < 1:
        raise PerfError(f"--buckets {text!r}: comma-separated prompt lengths >= 1, e.g. 8,128")
    return out


def summary(rows: list[dict[str, Any]], run_id: str, *, interrupted: bool = False) -> list[str]:
    from collections import Counter

    status = Counter(r["status"] for r in rows)
    verdicts = Counter(r.get("verdict") for r in rows if r["status"] == "ok")
    unconfirmed = sum(1 for r in rows if r.get("confirmed") == 0)
    out = [f"perf {run_id}{' (interrupted)' if interrupted else ''}: {len(rows)} items measured, "
           f"{verdicts['regression']} regressions, {verdicts['improvement']} improvements, "
           f"{verdicts['same']} same ({unconfirmed} calls not confirmed by a re-measure)"
           + "".join(f", {n} {s}" for s, n in sorted(status.items()) if s != "ok")]
    for r in sorted((r for r in rows if r.get("verdict") in ("regression", "improvement")),
                    key=lambda r: (r["verdict"], -abs(r["ratio"] - 1))):
        out.append(f"  {r['verdict']:<11} {r['kind']} {r['subject']} {r['dtype']} {r['shape']} ({r['signature']}): "
                   f"x{r['ratio']:.2f} [{r['low']:.2f}, {r['high']:.2f}], p50 {r['base_p50'] * 1e6:.1f} -> "
                   f"{r['p50'] * 1e6:.1f} us")
    for r in rows:
        if r["status"] in ("error", "crash", "timeout"):
            out.append(f"  {r['status']:<11} {r['item_key']}: {r.get('error')}")
    return out
