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


DEVICE_PACKAGES = {"neuron_emu", "onnxruntime", "onnxscript", "openvino"}


def test_only_targets_import_device_packages():
    bad = [_rel(p) for p in _modules("conformance")
           if _imports(p) & DEVICE_PACKAGES and "targets" not in p.relative_to(ROOT).parts]
    assert not bad, f"only conformance/targets/ may import {sorted(DEVICE_PACKAGES)}: {bad}"


def _is_command_line(path: Path) -> bool:
    """``conformance/cli/`` (the harness's commands) and ``opdb/cli.py`` (the store's)."""
    parts = path.relative_to(ROOT).parts
    return parts[:2] == ("conformance", "cli") or path.stem == "cli"


def test_click_only_in_command_line_modules():
    bad = [_rel(p) for pkg in ("conformance", "opdb", "reports") for p in _modules(pkg)
           if "click" in _imports(p) and not _is_command_line(p)]
    assert not bad, f"the library must not use click (only conformance/cli/ and opdb/cli.py): {bad}"


def test_nothing_but_the_command_line_imports_it():
    """Commands are the top floor: the library never calls back into them."""
    graph = _harness_graph()
    bad = {m: sorted(d for d in deps if d.startswith("conformance.cli")) for m, deps in graph.items()
           if not m.startswith("conformance.cli") and m != "conformance.__main__"
           and any(d.startswith("conformance.cli") for d in deps)}
    assert not bad, f"only the command line imports conformance.cli: {bad}"


# The floors of the harness, bottom to top: a module imports only from its own floor or below
# (and never in a circle: test_no_import_cycles_in_the_harness). The key is a folder of
# conformance/ or a top-level module; a top-level module not named here is shared vocabulary
# (work units, selection, value structure, data files) on the ground floor.
FLOORS = {
    "_lazy": 0, "work": 0, "structure": 0, "datafiles": 0,
    "targets": 1,  # the devices and compilers under test
    "inputs": 2, "catalog": 2, "select": 2,  # enumerate and generate (OpInfos are read through inputs)
    "check": 3,  # one item on target and CPU, its evidence, contracts and status
    "sweep": 4, "models": 4, "customops": 4, "generate": 4,  # the work kinds
    "run": 5,  # spec, executors, the runner: hands work kinds' groups to workers, records rows
    "audit": 6, "triage": 6,  # a user's model; upstream, repros, ledger review
    "perf": 6, "dist": 6,  # the perf and distributed lanes: their own sessions over the inputs and targets below
    "gate": 7,  # the gate over stored runs, first bad build, the nightly's stages
    "cli": 8, "pytest_plugin": 8, "__main__": 8,  # the commands
}
# Modules that hold data the floors below need, placed by what they import rather than by folder:
# the model definitions (families, layers, registries) are an input source like inputs/; the
# ledger names models when it validates an override. The zoo (zoo, hf, vision, sizing, tvshim) is one more such
# source.
FLOOR_OF_MODULE = {
    "models.family": 2, "models.families": 2, "models.layers": 2, "models.registry": 2,
    "models.tracing": 2, "models.hf": 2, "models.zoo": 2, "models.vision": 2, "models.sizing": 2,
    "models.tvshim": 2,
}


def _floor(module: str) -> int:
    rest = module.removeprefix("conformance.")
    for prefix, floor in FLOOR_OF_MODULE.items():
        if rest == prefix or rest.startswith(prefix + "."):
            return floor
    return FLOORS[rest.split(".")[0]]


def test_every_folder_has_a_floor():
    missing = sorted({m.split(".")[1] for m in _harness_graph() if m.count(".")} - set(FLOORS))
    assert not missing, f"add these to FLOORS (tests/test_walls.py) and ARCHITECTURE.md: {missing}"


def test_imports_go_down_the_floors():
    """The folders read as the pipeline: checks below the work kinds, the run above them, the gate
    above the run, the commands on top. A module reaching up a floor is a layering problem."""
    graph = _harness_graph()
    bad = sorted(f"{m} (floor {_floor(m)}) -> {d} (floor {_floor(d)})"
                 for m, deps in graph.items() if m != "conformance" for d in deps if _floor(d) > _floor(m))
    assert not bad, "imports up the floors:\n" + "\n".join(bad)


def test_the_floor_check_sees_upward_imports():
    assert _floor("conformance.gate.nightly") > _floor("conformance.run.runner") > _floor("conformance.check.execute")
    assert _floor("conformance.models.runner") == 4 and _floor("conformance.models.families.gpt") == 2
    assert "conformance.check.verdict" in _harness_graph()["conformance.run.runner"]


MAX_LINES = 550


def test_no_module_is_over_550_lines():
    """A module past 550 lines holds more than one job: split it along its seams."""
    bad = {_rel(p): n for pkg in PACKAGES for p in _modules(pkg)
           if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not bad, f"modules over {MAX_LINES} lines: {bad}"


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
    assert "opdb" in _imports(ROOT / "conformance" / "gate" / "core.py")
    assert "neuron_emu" in _imports(ROOT / "conformance" / "targets" / "neuron_emu.py")
    assert "click" in _imports(ROOT / "conformance" / "cli" / "__init__.py")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _harness_imports(path: Path, known: set[str]) -> set[str]:
    """The conformance modules a module imports: module-level and lazy (inside a function) alike,
    ``from . import x`` resolved to the module ``x`` where it is one, else to the package."""
    here = _module_name(path)
    package = here.split(".") if path.name == "__init__.py" else here.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + (node.module.split(".") if node.module else []))
            for a in node.names:
                if f"{module}.{a.name}" in known:
                    out.add(f"{module}.{a.name}")
                elif module in known:
                    out.add(module)
    return out - {here}


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


# Registration is the one circle allowed: a package module imports its members so that they
# register themselves (click commands in cli_*.py, devices in targets/*.py via load_builtin).
_REGISTRATION = ({"conformance.cli", "conformance.cli.audit", "conformance.cli.claims", "conformance.cli.errors", "conformance.cli.gate", "conformance.cli.perf", "conformance.cli.dist", "conformance.cli.report",
                  "conformance.cli.sweep", "conformance.cli.upstream"},
                 {"conformance.targets.base", "conformance.targets.cpu", "conformance.targets.cuda",
                  "conformance.targets.inductor", "conformance.targets.neuron_emu", "conformance.targets.onnx_runtime",
                  "conformance.targets.openvino_compile"})


def _harness_graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in _modules("conformance")}
    return {m: _harness_imports(p, set(paths)) for m, p in paths.items()}


def test_no_import_cycles_in_the_harness():
    """Imports among conformance modules form no circle, lazy imports inside functions included
    (a lazy import that closes a circle is a layering problem postponed, not solved)."""
    bad = [sorted(c) for c in _cycles(_harness_graph()) if not any(c <= allowed for allowed in _REGISTRATION)]
    assert not bad, f"import cycles among conformance modules (break them by moving code down a layer): {bad}"


def test_the_cycle_check_sees_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    graph = _harness_graph()
    assert "conformance.work" in graph["conformance.run.kinds"]  # resolves `from .work import ...`
    assert "conformance.cli.sweep" in graph["conformance.cli"]  # and lazy imports
    assert not graph["conformance.work"], "conformance/work.py is a leaf: it imports nothing of the harness"


def test_no_module_imports_another_modules_private_names():
    """``from x import _name`` across modules reaches into a private helper: make it public instead."""
    bad = []
    for pkg in ("conformance", "opdb", "reports"):
        for p in _modules(pkg):
            for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and node.module and not node.module.startswith("torch"):
                    bad += [f"{_rel(p)}: {node.module}.{a.name}" for a in node.names
                            if a.name.startswith("_") and not a.name.startswith("__")]
    assert not bad, bad
