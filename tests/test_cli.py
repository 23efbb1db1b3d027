"""The CLI: exit codes, one-line errors, and help for every command."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from conformance.cli import main
from opdb import SCHEMA_VERSION


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def _commands(group: click.Group, prefix: tuple[str, ...] = ()):
    for name, cmd in group.commands.items():
        yield prefix + (name,), cmd
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, prefix + (name,))


def test_every_command_has_help_with_an_example():
    for path, cmd in _commands(main):
        assert cmd.help and "Example:" in cmd.help, f"conformance {' '.join(path)} lacks an example"


@pytest.mark.parametrize("args", [["bogus"], ["ops", "--bogus-flag"]])
def test_unknown_command_or_flag_exits_2(args):
    assert run(*args).exit_code == 2


def test_store_without_db_exits_2():
    r = run("ops", "--store")
    assert r.exit_code == 2 and "--db" in r.output


def test_every_command_that_needs_a_db_says_so_without_a_traceback():
    """--db without a default is required (click 8.5 stopped enforcing it when default=None was
    passed: `conformance report` alone gave a TypeError traceback)."""
    needs = [path for path, cmd in _commands(main) if any(
        p.name == "db_path" and p.required for p in cmd.params)]
    assert ("report",) in needs
    for path in needs:
        r = run(*path)
        assert r.exit_code == 2 and "Missing option '--db'" in r.output, (path, r.output)
        assert not isinstance(r.exception, TypeError), path


def test_non_sqlite_db_exits_2_and_is_untouched(tmp_path):
    p = tmp_path / "x.sqlite"
    p.write_bytes(b"not sqlite at all")
    r = run("ops", "--store", "--db", str(p))
    assert r.exit_code == 2
    assert r.output.strip().splitlines()[-1].startswith(f"error: {p}: not an SQLite database")
    assert p.read_bytes() == b"not sqlite at all"


def test_newer_schema_db_exits_2(tmp_path):
    p = tmp_path / "n.sqlite"
    sqlite3.connect(p).execute(f"PRAGMA user_version = {SCHEMA_VERSION + 3}")
    r = run("ops", "--store", "--db", str(p))
    assert r.exit_code == 2 and "newer than this opdb" in r.output


def test_merge_of_missing_db_exits_2(tmp_path):
    r = run("merge", str(tmp_path / "out.sqlite"), str(tmp_path / "missing.sqlite"))
    assert r.exit_code == 2 and "no such database" in r.output


def test_target_help_names_every_registered_target():
    from conformance.targets.base import REGISTRY, load_builtin

    load_builtin()
    for path, cmd in _commands(main):
        for p in cmd.params:
            if isinstance(p, click.Option) and "--target" in p.opts and "device:TYPE" in (p.help or ""):
                missing = [name for name in REGISTRY if name not in p.help]
                assert not missing, f"conformance {' '.join(path)} --target help lacks {missing}"


def test_every_option_of_conformance_and_opdb_has_help():
    """Every option of every command of both console scripts says what it does (sqlite-utils'
    meta-test): a new option without help fails here, not in a user's terminal."""
    from opdb.cli import main as opdb_main

    missing = []
    for script, group in (("conformance", main), ("opdb", opdb_main)):
        for path, cmd in [((), group), *_commands(group)]:
            missing += [f"{script} {' '.join(path)} {'/'.join(p.opts)}".replace("  ", " ")
                        for p in cmd.params if isinstance(p, click.Option) and not (p.help or "").strip()]
    assert not missing, "options without help: " + "; ".join(missing)


AVAILABLE = "available: 2.31.0, 2.32.0, 2.33.0, ideal (or a path to a manifest .toml)"


@pytest.mark.parametrize("args", [
    ["run", "--build", "9.99.0", "--ops", "abs"],
    ["nightly", "--build", "2.33.0", "--build", "9.99.0"],
    ["audit", "examples.audit_example:build", "--input-shape", "2,16:int64", "--build", "9.99.0"],
])
def test_unknown_build_is_one_line_exit_2_and_writes_nothing(args, tmp_path):
    db = tmp_path / "x.sqlite"
    r = run(*args, *(["--db", str(db)] if args[0] != "audit" else []))
    assert r.exit_code == 2, r.output
    assert r.output.splitlines() == [f"error: --build '9.99.0': no such neuron-emu build; {AVAILABLE}"]
    assert not db.exists()


def test_missing_manifest_path_is_one_line_exit_2(tmp_path):
    r = run("run", "--build", str(tmp_path / "nope.toml"), "--db", str(tmp_path / "x.sqlite"))
    assert r.exit_code == 2
    assert r.output.splitlines() == [f"error: --build '{tmp_path / 'nope.toml'}': no such build manifest file"]


def test_unknown_build_is_refused_before_torch_loads():
    """The check reads only the shipped manifests' file names: torch (and the emulator) never
    load for a build that does not exist (that took ~7 s)."""
    code = ("import sys\nfrom conformance.cli import main\n"
            "try:\n    main(['run', '--build', '9.99.0', '--ops', 'abs', '--db', 'never.sqlite'])\n"
            "except SystemExit as e:\n    print('exit', e.code, 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900,
                         cwd=Path(__file__).resolve().parent.parent)
    assert out.stdout.split() == ["exit", "2", "False"], out.stdout + out.stderr
    assert "no such neuron-emu build" in out.stderr


def test_the_run_commands_spelt_out_defaults_match_the_library():
    """The CLI spells some defaults out so that ``--help`` imports no torch: they must stay the library's."""
    from conformance.check.contracts import DEFAULT_BUDGET
    from conformance.cli.sweep import CLI_VARIANTS, run_cmd
    from conformance.select import VARIANTS

    assert CLI_VARIANTS == ",".join(VARIANTS)
    budget = next(p for p in run_cmd.params if p.name == "contract_budget")
    assert budget.default == str(DEFAULT_BUDGET)
