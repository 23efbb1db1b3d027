"""Sessions: ``tests`` (the suite), ``conformance`` (the nightly job), ``bench`` (every benchmark,
one table), ``lint`` (ruff), ``browser``
(Debian's chromium for the browser tests, as root), ``hf``, ``zoo`` (the model zoo), ``browse`` (Datasette).

Everything installed here goes through ``constraints.txt`` (torch==2.13.0): a newer torch
would pull a multi-GB CUDA build.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_venv = "yes"
nox.options.default_venv_backend = "venv"

HERE = Path(__file__).parent
CONSTRAINTS = ("-c", str(HERE / "constraints.txt"))
# The torch wheel for this machine lies on disk; pip finds it through --find-links.
WHEELS = ("--find-links", "/opt/wheels") if Path("/opt/wheels").is_dir() else ()
CHROMIUM = Path("/usr/bin/chromium")  # what tests/test_report_browser.py drives


def _install(session: nox.Session, *extras: str) -> None:
    spec = "." + (f"[{','.join(extras)}]" if extras else "")
    session.install(*WHEELS, *CONSTRAINTS, "-e", spec)


def _where(session: nox.Session) -> None:
    """Say where the session's ``conformance`` lies: nox's virtual environments are not on PATH."""
    bin_dir = Path(session.bin)
    shown = bin_dir.relative_to(HERE) if bin_dir.is_relative_to(HERE) else bin_dir
    session.log(f"conformance and opdb are in {shown}/ (not on PATH): run {shown}/conformance --help, "
                f"or `source {shown}/activate` to use them and its python (torch, the harness) directly")


@nox.session(python="3.11")
def tests(session: nox.Session) -> None:
    """The test suite (fast by default; pass ``-- -m slow`` for the heavy sweeps); with the ray
    extra, so that the Ray executor's tests run."""
    _install(session, "test", "ray")
    if not CHROMIUM.exists():
        session.warn(f"{CHROMIUM} is missing: the browser tests will skip (`nox -s browser` installs it as root)")
    # the 15 slowest tests are printed: the suite has a time budget (README, "Tests")
    args = session.posargs or ["-n", "2", "--dist", "loadgroup", "--durations=15"]
    session.run("pytest", *args, env={"PYTHONHASHSEED": "0"})
    _where(session)
    if not session.posargs:
        session.notify("zoo_tests")  # the model zoo's libraries live in their own environment


# The tests that need the model zoo's libraries (transformers, timm, torchvision); the rest of the
# suite runs without them, as the default install does.
ZOO_TESTS = ["tests/test_zoo_vision.py", "tests/test_hf_zoo.py", "tests/test_models_runner_hf.py",
             "tests/test_audit_generate.py", "tests/test_generate.py",
             "tests/test_audit_hf.py", "tests/test_zoo_lane.py",
             "tests/test_perf_decode.py"]  # test_zoo_support.py needs none: the suite runs it


@nox.session(python="3.11")
def zoo_tests(session: nox.Session) -> None:
    """The model zoo's tests with its libraries installed (`nox -s tests` runs this after the suite)."""
    _install(session, "test", "zoo", "hf")
    session.run("pytest", "-n", "2", "--durations=10", *ZOO_TESTS, *session.posargs,
                env={"PYTHONHASHSEED": "0", "HF_HUB_OFFLINE": "1"})
    _where(session)


@nox.session(python=False)
def browser(session: nox.Session) -> None:
    """Debian's chromium for the browser tests (root; apt, no recommends; refuses to upgrade anything)."""
    # playwright drives /usr/bin/chromium (its own browser download cannot work here); the
    # script says what it installs and refuses when apt would touch an installed package
    session.run(sys.executable, str(HERE / ".ci" / "install_chromium.py"), *session.posargs, external=True)


@nox.session(python="3.11")
def conformance(session: nox.Session) -> None:
    """The nightly job on the embedded default target (the emulated ``neuron`` device)."""
    _install(session)
    db = os.environ.get("CONFORMANCE_DB", "results/opdb.sqlite")
    Path(db).parent.mkdir(parents=True, exist_ok=True)
    session.run("conformance", "ops", "--store", "--db", db)
    # Exit 1 means the gate found regressions between builds: that is the nightly's finding,
    # printed above, not a failure of the job (CONFORMANCE_STRICT=1 makes it fail the session).
    strict = os.environ.get("CONFORMANCE_STRICT") == "1"
    session.run("conformance", "nightly", "--db", db, *session.posargs, success_codes=[0] if strict else [0, 1])
    _where(session)


@nox.session(python="3.11")
def bench(session: nox.Session) -> None:
    """Every benchmark (benchmarks/benchmarks.toml), one table of their figures at the end
    (about 15 minutes on 2 cores; ``-- --heavy`` adds the nightly cold and warm and the test suite
    idle and loaded, over an hour; ``-- --only item_cost.py`` for one, ``-- --list`` for what runs)."""
    _install(session, "test", "ray")  # suite_time.py runs the test suite; ray_executor.py needs Ray
    session.run("python", str(HERE / "benchmarks" / "run_all.py"), *session.posargs)


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    """ruff over the code base."""
    session.install("ruff")
    session.run("ruff", "check", ".")


@nox.session(python="3.11")
def backends(session: nox.Session) -> None:
    """The ONNX Runtime and OpenVINO targets' tests, with the optional ``backends`` extra
    (about 300 MB more; ``nox -s tests`` skips these tests without it)."""
    _install(session, "test", "backends")
    args = session.posargs or ["tests/test_backends.py", "tests/test_compiler_targets.py", "-n", "2"]
    session.run("pytest", *args, env={"PYTHONHASHSEED": "0"})


@nox.session(python="3.11")
def hf(session: nox.Session) -> None:
    """Hugging Face architectures (random weights from in-code configs) on the emulated device."""
    _install(session, "hf")
    db = os.environ.get("CONFORMANCE_DB", "results/opdb.sqlite")
    Path(db).parent.mkdir(parents=True, exist_ok=True)
    session.run("conformance", "run", "--models", "hf", "--db", db, "--exit-zero", *session.posargs,
                env={"HF_HUB_OFFLINE": "1"})


@nox.session(python="3.11")
def zoo(session: nox.Session) -> None:
    """The model zoo: every architecture transformers, timm and torchvision list, through the per-graph
    protocol, per build (hours on 2 cores: README, "The model zoo"). Arguments after ``--`` go to
    ``conformance run`` (default: the newest shipped build, float32); ``-- --models timm@0/10`` runs a
    tenth of timm, ``-- --resume RUN_ID`` continues an interrupted one."""
    _install(session, "zoo", "hf")
    db = os.environ.get("CONFORMANCE_DB", "results/opdb.sqlite")
    Path(db).parent.mkdir(parents=True, exist_ok=True)
    args = list(session.posargs)
    if not any(a == "--resume" or a.startswith("--resume=") for a in args):
        if not any(a == "--models" or a.startswith("--models=") for a in args):
            args += ["--models", "zoo@0/1"]
        if not any(a == "--dtypes" or a.startswith("--dtypes=") for a in args):
            args += ["--dtypes", "float32"]
    session.run("conformance", "run", "--db", db, "--exit-zero", *args, env={"HF_HUB_OFFLINE": "1"})
    _where(session)


@nox.session(python="3.11")
def browse(session: nox.Session) -> None:
    """Serve the result database with Datasette (http://127.0.0.1:8001) and opdb's canned queries."""
    session.install(*CONSTRAINTS, "datasette")
    db = os.environ.get("CONFORMANCE_DB", "results/opdb.sqlite")
    # opdb/browse.py needs only the standard library: this environment holds Datasette, not the harness
    meta = Path(session.create_tmp()) / "opdb-metadata.json"
    session.run("python", str(HERE / "opdb" / "browse.py"), db, "--out", str(meta))
    # Facet suggestions try every column of every facet kind, each up to 50 ms: 5 s to open a
    # nightly's op_results; facets chosen by hand (the column menu) stay, served by the indexes.
    session.run("datasette", "serve", db, "--metadata", str(meta), "--setting", "suggest_facets", "off",
                "--host", "127.0.0.1", "--port", "8001", *session.posargs)
