"""The house's walls (ARCHITECTURE.md), checked on the source: who may import whom, where SQL
and the command line live. Read from the syntax tree, so a comment or a string never counts."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("conformance", "opdb", "reports", "neuron_emu")


def _modules(package: str) -> list[Path]:
    return sorted(p for p in (ROOT / package).rglob("*.py") if "__pycache__" not in p.parts)


def _imports(path: Path) -> set[str]:
    """Top-level package names a module imports (at any depth of the file, lazy imports too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            # a relative import resolves inside the module's own package
            out.add(path.relative_to(ROOT).parts[0])
    return out


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@pytest.mark.parametrize(("package", "forbidden"), [
    ("neuron_emu", {"conformance", "opdb", "reports"}),  # a device, usable alone
    ("opdb", {"conformance", "reports"}),  # the bottom floor
    ("reports", {"conformance", "neuron_emu"}),  # reads only through opdb
])
def test_package_imports_nothing_above_it(package, forbidden):
    bad = {_rel(p): sorted(_imports(p) & forbidden) for p in _modules(package) if _imports(p) & forbidden}
    assert not bad, f"{package} must not import {sorted(forbidden)}: {bad}"


def test_only_targets_import_device_packages():
    bad = [_rel(p) for p in _modules("conformance")
           if "neuron_emu" in _imports(p) and "targets" not in p.relative_to(ROOT).parts]
    assert not bad, f"only conformance/targets/ may import neuron_emu: {bad}"


def test_click_only_in_command_line_modules():
    bad = [_rel(p) for pkg in ("conformance", "opdb", "reports") for p in _modules(pkg)
           if "click" in _imports(p) and not p.stem.startswith("cli")]
    assert not bad, f"the library must not use click (only cli*.py): {bad}"


_SQL_CALLS = {"query", "execute", "executescript", "executemany", "table", "conn", "attach", "vacuum"}


def test_sql_only_in_opdb():
    """No module above opdb reaches the store's connection (``<store>.db.query(...)``) or opens SQLite."""
    bad = []
    for pkg in ("conformance", "reports"):
        for p in _modules(pkg):
            tree = ast.parse(p.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute) and node.attr in _SQL_CALLS \
                        and isinstance(node.value, ast.Attribute) and node.value.attr == "db":
                    bad.append(f"{_rel(p)}:{node.lineno} .db.{node.attr}")
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                        and node.func.attr == "connect" and isinstance(node.func.value, ast.Name) \
                        and node.func.value.id == "sqlite3":
                    bad.append(f"{_rel(p)}:{node.lineno} sqlite3.connect")
    assert not bad, f"SQL belongs in opdb (add a named query there): {bad}"


def test_the_walls_test_sees_imports():
    # guard against a checker that passes because it sees nothing
    assert "opdb" in _imports(ROOT / "conformance" / "gate.py")
    assert "neuron_emu" in _imports(ROOT / "conformance" / "targets" / "neuron_emu.py")
    assert "click" in _imports(ROOT / "conformance" / "cli.py")
