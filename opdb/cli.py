"""``opdb``: the result store's own small command line (``opdb merge OUT IN...``)."""

from __future__ import annotations

import click

from conformance.cli import merge_cmd


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """The opdb result store.

    Example: opdb merge results/opdb.sqlite shard1.sqlite shard2.sqlite
    """


main.add_command(merge_cmd, "merge")
