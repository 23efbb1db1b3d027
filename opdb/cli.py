"""``opdb``: the result store's own small command line (``opdb merge OUT IN...``).

It imports nothing of the harness; ``conformance merge`` is this same command.
"""

from __future__ import annotations

import sqlite3
import sys

import click

from .merge import merge_files
from .store import OpdbError

EXIT_USAGE = 2


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """The opdb result store.

    Example: opdb merge results/opdb.sqlite shard1.sqlite shard2.sqlite
    """


@main.command("merge")
@click.argument("out", type=click.Path(dir_okay=False))
@click.argument("inputs", nargs=-1, required=True, type=click.Path(dir_okay=False))
def merge_cmd(out: str, inputs: tuple[str, ...]) -> None:
    """Merge shard databases of the same run(s) into OUT without duplicating rows.

    Example: conformance merge results/opdb.sqlite shard1.sqlite shard2.sqlite
    """
    try:
        counts = merge_files(out, list(inputs))
    except (OpdbError, FileNotFoundError, ValueError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    except sqlite3.DatabaseError as exc:
        click.echo(f"error: {out}: damaged SQLite database ({exc})", err=True)
        sys.exit(EXIT_USAGE)
    click.echo("merged " + ", ".join(f"{n} {t}" for t, n in counts.items() if n) + f" into {out}")
