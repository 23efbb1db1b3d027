"""CLI command ``conformance audit``: migration readiness of a user's own model."""

from __future__ import annotations

import sys

import click

from . import EXIT_FAILURES, EXIT_OK, EXIT_USAGE, TARGETS, UsageProblem, check_build, handles_errors, main


@main.command("audit")
@click.argument("model_ref", metavar="MODULE:CALLABLE")
@click.option("--inputs", "inputs_ref", metavar="MODULE:CALLABLE", default=None,
              help="Callable returning the example inputs (a tensor or a tuple).")
@click.option("--input-shape", "input_shapes", multiple=True, metavar="SHAPE:DTYPE",
              help="One example input, e.g. '1,3,224,224:float32' (repeat for several inputs).")
@click.option("--shapes", multiple=True, metavar="SHAPES",
              help="An extra input-shape set for the compile shape sweep, same syntax "
                   "(several inputs separated by ';'); repeatable.")
@click.option("--target", "target_name", default="neuron-emu", show_default=True,
              help=f"{TARGETS} (as for conformance run).")
@click.option("--build", default=None, help="Target build (name or manifest path; default: the newest).")
@click.option("--train", is_flag=True, help="Also compare parameter gradients and a 3-step SGD run.")
@click.option("--db", "db_path", type=click.Path(dir_okay=False), default=None,
              help="opdb with the build's sweep results (used for the ops it covers).")
@click.option("--html", "html_dir", type=click.Path(file_okay=False), default=None,
              help="Write an HTML page (DIR/index.html) in the report's style.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write the full audit as JSON.")
@click.option("--timed-iters", default=5, show_default=True, help="Timed forward calls per shape set.")
@click.option("--generate", "generate", is_flag=True,
              help="The model is a causal LM: also greedy-decode seeded prompts on the target against the CPU "
                   "per dtype x mode x bucket (token agreement, flips, log-likelihood, latency per token).")
@click.option("--buckets", "gen_buckets", default=None, metavar="N,N,...",
              help="With --generate: prompt lengths (default: conformance/data/generation.toml's, 8,32,128,512).")
@click.option("--new-tokens", "gen_new_tokens", type=int, default=None,
              help="With --generate: greedy tokens per prompt (default: generation.toml's, 16).")
@click.option("--gen-modes", "gen_modes", default=None, metavar="eager,compile",
              help="With --generate: eager, compile (a server's compiled decode) or both  [default: both].")
@click.option("--dtypes", "gen_dtypes", default=None, metavar="float32,bfloat16",
              help="With --generate: the dtypes the model decodes in  [default: float32].")
@handles_errors
def audit_cmd(model_ref: str, inputs_ref: str | None, input_shapes: tuple[str, ...], shapes: tuple[str, ...],
              target_name: str, build: str | None, train: bool, db_path: str | None, html_dir: str | None,
              json_path: str | None, timed_iters: int, generate: bool, gen_buckets: str | None,
              gen_new_tokens: int | None, gen_modes: str | None, gen_dtypes: str | None) -> None:
    """Audit a model (MODULE:CALLABLE returning an nn.Module, or (module, inputs)) for a target.

    With --generate the callable returns a causal LM (a transformers model: .generate and
    .config.vocab_size; anything else exits 2) and the report gains a generation section: per dtype,
    mode and prompt-length bucket, does greedy decoding give the CPU's tokens? Its example input,
    unless given, is a seeded prompt of the smallest bucket.

    Exit 0: ready (with or without fallbacks); 1: blocked; 2: bad input.

    Example: conformance audit examples.audit_example:build --input-shape "2,16:int64" --shapes "2,32:int64"
    """
    check_build(target_name, build)  # before the imports below load torch
    gen_config = _generate_config(generate, gen_buckets, gen_new_tokens, gen_modes, gen_dtypes)
    from conformance.audit import AuditInputError, run_audit, text_lines, write_html, write_json

    if inputs_ref and input_shapes:
        raise UsageProblem("give either --inputs or --input-shape, not both")
    if timed_iters < 1:
        raise UsageProblem("--timed-iters must be >= 1")
    import torch

    torch.set_num_threads(1)  # small models: intra-op threads only add contention and latency noise
    try:
        res = run_audit(model_ref, inputs_ref=inputs_ref, input_shapes=input_shapes, shapes=shapes,
                        target_name=target_name, build=build, train=train, db_path=db_path,
                        timed_iters=timed_iters, generate=gen_config)
    except AuditInputError as exc:
        raise UsageProblem(str(exc)) from None
    for line in text_lines(res):
        click.echo(line)
    if json_path:
        write_json(res, json_path)
        click.echo(f"wrote {json_path}")
    if html_dir:
        click.echo(f"wrote {write_html(res, html_dir)}")
    sys.exit(EXIT_FAILURES if res.exit_code else EXIT_OK)


def _generate_config(generate: bool, buckets: str | None, new_tokens: int | None, modes: str | None,
                     dtypes: str | None) -> object | None:
    """The --generate options, checked (each of the others needs --generate)."""
    given = [o for o, v in (("--buckets", buckets), ("--new-tokens", new_tokens), ("--gen-modes", modes),
                            ("--dtypes", dtypes)) if v is not None]
    if not generate:
        if given:
            raise UsageProblem(f"{', '.join(given)} only apply with --generate")
        return None
    from conformance.audit.generate import DTYPES
    from conformance.audit.results import GenerateConfig

    from .sweep import parse_ints, parse_modes

    if new_tokens is not None and new_tokens < 1:
        raise UsageProblem(f"--new-tokens {new_tokens}: a whole number of at least 1")
    chosen = tuple(dict.fromkeys(d.strip().removeprefix("torch.") for d in (dtypes or "float32").split(",")
                                 if d.strip()))
    if not chosen or any(d not in DTYPES for d in chosen):
        raise UsageProblem(f"--dtypes {dtypes!r}: expected {', '.join(DTYPES)} or both, comma-separated")
    return GenerateConfig(buckets=parse_ints(buckets, "--buckets"), new_tokens=new_tokens,
                          modes=parse_modes(modes or "eager,compile", "--gen-modes"), dtypes=chosen)


__all__ = ["audit_cmd", "EXIT_USAGE"]
