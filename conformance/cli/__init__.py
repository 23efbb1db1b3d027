"""The ``conformance`` command: a thin layer over the library.

Exit codes mean something: 0 ok, 1 conformance failures or regressions, 2 usage or
infrastructure error (bad flag, bad file, bad database).
"""

from __future__ import annotations

import importlib.util
import json
import sqlite3
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any

import click

from opdb import OpdbError, Store
from opdb.cli import merge_cmd

EXIT_OK = 0
#: The targets ``--target`` takes, as every command's help names them (kept as text: the command
#: line must answer --help without importing torch; tests/test_cli.py holds it to the registry).
TARGETS = "neuron-emu | inductor | inductor-strict | onnxruntime | openvino | cuda | cpu | device:TYPE"
EXIT_FAILURES = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # Ctrl-C or SIGTERM stopped a run or a nightly (the shell's code for SIGINT)


class UsageProblem(Exception):
    """Bad input found by the library; the CLI prints it as one line and exits 2."""


def fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(EXIT_USAGE)


def find_run(st: Any, ref: str | None, target: str | None, what: str) -> dict[str, Any]:
    """The run ``ref`` names (a run id, or a build: its latest run, on ``target`` when given); a
    :class:`UsageProblem` naming the option ``what`` and what the database holds otherwise."""
    from opdb.queries import latest_run

    run = st.get_run(ref) if ref else None
    if run is None:
        run = latest_run(st, build=ref, target=target)
    if run is None:
        builds = sorted({f"{r['target']} {r['build']}" for r in st.runs()})
        raise UsageProblem(f"{what} {ref!r}: no run with that id or build"
                           + (f" on target {target}" if target else "")
                           + f" in {st.path} (it holds: {', '.join(builds) or 'no runs'})")
    return run


def handles_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn the library's input errors into one clear line and exit code 2."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (OpdbError, UsageProblem, FileNotFoundError) as exc:
            fail(str(exc))
        except ValueError as exc:  # validation errors of ledgers, manifests, selections, targets
            fail(str(exc))
        except sqlite3.DatabaseError as exc:  # damage found while reading (the header checks passed)
            where = kwargs.get("db_path") or kwargs.get("out") or "the database"
            fail(f"{where}: damaged SQLite database ({exc})")

    return wrapper


def check_build(target: str, build: str | None, option: str = "--build") -> None:
    """Refuse a ``--build`` name the emulated device does not ship, before torch and the
    emulator load (that took ~7 s before the manifest loader said so).

    Only the names of the shipped manifest files (``neuron_emu/builds/*.toml``) are read, found
    without importing ``neuron_emu``; a manifest path is checked for existence, its content is
    left to the emulator's validating loader; other targets judge their own builds.
    """
    if target != "neuron-emu" or build in (None, "", "-"):
        return
    if build.endswith(".toml") or "/" in build or "\\" in build:
        if not Path(build).is_file():
            raise UsageProblem(f"{option} {build!r}: no such build manifest file")
        return
    spec = importlib.util.find_spec("neuron_emu")
    if spec is None or not spec.submodule_search_locations:
        return  # the target says the emulator is missing
    names = sorted(p.stem for p in Path(spec.submodule_search_locations[0], "builds").glob("*.toml"))
    if build not in names:
        raise UsageProblem(f"{option} {build!r}: no such neuron-emu build; available: {', '.join(names)} "
                           "(or a path to a manifest .toml)")


def env_pairs(values: tuple[str, ...]) -> tuple[str, ...]:
    """``--env`` values, each ``NAME=VALUE`` with NAME a shell variable name (else one clear error)."""
    import re

    for v in values:
        name, eq, _ = v.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise click.BadParameter(f"{v!r}: expected NAME=VALUE, NAME a shell variable name "
                                     "(letters, digits, underscores; not starting with a digit)")
    return tuple(values)


def db_option(required: bool = True, default: str | None = None) -> Callable[..., Any]:
    # no default= at all when there is none: click 8.5 takes an explicit default=None as a value
    # and no longer enforces required (`conformance report` without --db gave a traceback)
    kw: dict[str, Any] = {"default": default, "show_default": True} if default is not None else {}
    return click.option("--db", "db_path", type=click.Path(dir_okay=False), required=required and default is None,
                        help="opdb SQLite file.", **kw)


def executor_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--executor``, ``--ray-address``, ``--task-resources``: where a command's work runs (the
    RunSpec fields of those names)."""
    for option in reversed((
        click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
                     help="Where items run: worker processes on this machine, or Ray actors on a Ray cluster "
                          "(pip install -e '.[ray]'; README, Scale out)."),
        click.option("--ray-address", "ray_address", default=None, metavar="ADDRESS",
                     help="With --executor ray: the cluster to join ('auto': the one `ray start` runs here; "
                          "default: start a Ray on this machine)."),
        click.option("--task-resources", "task_resources", multiple=True, metavar="NAME=AMOUNT",
                     help="With --executor ray: what each task (one worker) holds, e.g. neuron_cores=1 so that a "
                          "device target runs only on nodes with the device (repeatable or comma-separated; "
                          "default CPU=1)."),
    )):
        fn = option(fn)
    return fn


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="neuron-conformance")
def main() -> None:
    """Operator-conformance harness for PyTorch device backends.

    Example: conformance ops --json | head
    """


@main.command("ops")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object per overload, one per line (with --coverage: its coverage state).")
@click.option("--store", is_flag=True, help="Write the catalog into --db.")
@click.option("--no-cache", is_flag=True, help="Re-measure the OpInfo map instead of using the cache.")
@click.option("--coverage", "coverage_run", metavar="RUN_ID", default=None,
              help="Print every overload's coverage state for a stored run.")
@db_option(required=False)
@handles_errors
def ops_cmd(as_json: bool, store: bool, no_cache: bool, coverage_run: str | None, db_path: str | None) -> None:
    """The ATen catalog: every overload, its classes, and the OpInfos that reach it.

    Example: conformance ops --store --db results/opdb.sqlite
    """
    import torch

    from conformance.catalog import overloads as catalog

    if (store or coverage_run) and not db_path:
        raise UsageProblem("--store and --coverage need --db PATH")
    if coverage_run:
        from conformance.catalog import coverage

        with Store.open(db_path, create=False) as st:
            for line in (coverage.json_lines if as_json else coverage.table_lines)(st, coverage_run):
                click.echo(line)
        sys.exit(EXIT_OK)
    ops, summary = catalog.build(use_cache=not no_cache)
    if store:
        with Store.open(db_path) as st:
            st.store_catalog([o.row(torch.__version__) for o in ops])
    if as_json:
        for o in ops:
            click.echo(json.dumps({"name": o.name, "classes": list(o.classes), "schema": o.schema,
                                   "tags": list(o.tags), "opinfos": list(o.opinfos)}))
        return
    click.echo(f"ATen overloads in torch {torch.__version__}: {summary.total} "
               f"(catalog built in {summary.build_s:.2f} s; {summary.opinfos} OpInfos)")
    click.echo(f"{'class':<20}{'overloads':>10}{'reached by OpInfo':>20}")
    for cls in catalog.CLASSES:
        click.echo(f"{cls:<20}{summary.per_class[cls]:>10}{summary.reached_per_class[cls]:>20}")
    click.echo(f"{'all':<20}{summary.total:>10}{summary.reached_by_opinfo:>20}")
    if store:
        click.echo(f"stored {summary.total} overloads in {db_path}")


# `conformance merge` is the store's own command (opdb/cli.py), attached here.
main.add_command(merge_cmd, "merge")


# Commands of later pipeline stages live in their own modules and attach to ``main``.
from . import audit, claims, dist, errors, gate, perf, report, sweep, upstream  # noqa: E402,F401
