"""The ``dist`` command: collectives on the target's torch.distributed backend, per build."""

from __future__ import annotations

import json
import signal
import sys
from collections import Counter
from pathlib import Path

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


def int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise click.BadParameter(f"{text!r}: comma-separated integers, e.g. 2,3,4") from None


@main.command("dist")
@click.option("--target", default="neuron-emu", show_default=True, help=TARGETS)
@click.option("--build", default=None, help="The build (default: the target's default).")
@click.option("--world-sizes", default="2,3,4", show_default=True, metavar="LIST", help="Process group sizes.")
@click.option("--collectives", default=None, metavar="LIST",
              help="torch.distributed functions (default: all_reduce, reduce_scatter_tensor, all_gather_into_tensor, "
                   "all_gather, broadcast, all_to_all_single, send (a send/recv ring), barrier).")
@click.option("--dtypes", default="float32,bfloat16,int64", show_default=True, metavar="LIST",
              help="Comma-separated dtypes (float32, bfloat16, float16, int64).")
@click.option("--timeout", "timeout_s", type=float, default=30.0, show_default=True,
              help="Seconds an item may take on every rank; a hang past it is a timeout (the group is restarted).")
@click.option("--env", "env", multiple=True, metavar="NAME=VALUE", callback=lambda _c, _p, v: env_pairs(v),
              help="Set in every rank before the target loads (repeatable).")
@click.option("--training", default="", metavar="LIST",
              help="Training parity too: fsdp2 and/or tp (a small Llama-style model, 3 SGD steps on 2 ranks against "
                   "one CPU process; items train:fsdp2, train:tp).")
@click.option("--training-reference", type=click.Choice(["cpu", "device"]), default="cpu", show_default=True,
              help="What training parity compares with: one CPU process, or the model trained alone on the device "
                   "(separates the collectives from the build's own arithmetic).")
@click.option("--json", "as_json", is_flag=True,
              help="Print every item as JSON on stdout (collective, reduce_op, dtype, world_size, shape, status, ...); "
                   "progress goes to stderr.")
@click.option("--resume", default=None, metavar="RUN", help="Continue an interrupted dist run (its items are kept).")
@db_option(default="results/opdb.sqlite")
@handles_errors
def dist_cmd(target: str, build: str | None, world_sizes: str, collectives: str | None, dtypes: str, timeout_s: float,
             env: tuple[str, ...], training: str, training_reference: str, as_json: bool, resume: str | None,
             db_path: str) -> None:
    """Run every collective x reduce op x dtype x world size x shape (empty and non-contiguous
    inputs included) on the target's c10d backend, each rank's result held against the exact
    answer; exit 1 when an item fails.

    Example: conformance dist --build 2.33.0 --world-sizes 2,3,4 --dtypes float32,bfloat16 --json
    """
    from conformance.dist.items import COLLECTIVES
    from conformance.dist.lane import DistSpec, run_dist

    check_build(target, build)
    spec = DistSpec(target=target, build=build, world_sizes=int_list(world_sizes),
                    collectives=tuple(c.strip() for c in collectives.split(",")) if collectives else tuple(COLLECTIVES),
                    dtypes=tuple(d.strip() for d in dtypes.split(",") if d.strip()), timeout_s=timeout_s, env=env,
                    training=tuple(m.strip() for m in training.split(",") if m.strip()),
                    training_reference=training_reference)
    say = (lambda line: click.echo(line, err=True)) if as_json else click.echo
    Path(db_path).parent.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with Store.open(db_path) as st:
        result = run_dist(spec, st, progress=say, run_id=resume)
    counts = Counter(r["status"] for r in result.rows)
    say(f"dist {result.run_id}: {len(result.rows)} items, "
        + ", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda kv: -kv[1])))
    for r in result.failing[:20]:
        say(f"  {r['status']:<9} {r['item_key']}: {r.get('error') or ''}"[:300])
    if as_json:
        keys = ("collective", "reduce_op", "dtype", "world_size", "shape", "status", "error")
        click.echo(json.dumps([{**{k: r.get(k) for k in keys}, "evidence": json.loads(r.get("evidence") or "{}")}
                               for r in result.rows], indent=1))
    if result.interrupted:
        say(f"interrupted: conformance dist --db {db_path} --resume {result.run_id} (with the same options)")
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(EXIT_FAILURES if result.failing else EXIT_OK)
