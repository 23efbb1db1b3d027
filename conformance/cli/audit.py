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
@handles_errors
def audit_cmd(model_ref: str, inputs_ref: str | None, input_shapes: tuple[str, ...], shapes: tuple[str, ...],
              target_name: str, build: str | None, train: bool, db_path: str | None, html_dir: str | None,
              json_path: str | None, timed_iters: int) -> None:
    """Audit a model (MODULE:CALLABLE returning an nn.Module, or (module, inputs)) for a target.

    Exit 0: ready (with or without fallbacks); 1: blocked; 2: bad input.

    Example: conformance audit examples.audit_example:build --input-shape "2,16:int64" --shapes "2,32:int64"
    """
    check_build(target_name, build)  # before the imports below load torch
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
                        timed_iters=timed_iters)
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


__all__ = ["audit_cmd", "EXIT_USAGE"]
