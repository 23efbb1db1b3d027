"""Sessions: ``tests`` (the suite), ``conformance`` (the nightly job), ``lint`` (ruff).

Everything installed here goes through ``constraints.txt`` (torch==2.13.0): a newer torch
would pull a multi-GB CUDA build.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_venv = "yes"
nox.options.default_venv_backend = "venv"

HERE = Path(__file__).parent
CONSTRAINTS = ("-c", str(HERE / "constraints.txt"))
# The torch wheel for this machine lies on disk; pip finds it through --find-links.
WHEELS = ("--find-links", "/opt/wheels") if Path("/opt/wheels").is_dir() else ()


def _install(session: nox.Session, *extras: str) -> None:
    spec = "." + (f"[{','.join(extras)}]" if extras else "")
    session.install(*WHEELS, *CONSTRAINTS, "-e", spec)


def _chromium(session: nox.Session) -> None:
    """Debian's chromium for the browser tests (playwright drives it; its own download cannot work)."""
    if Path("/usr/bin/chromium").exists() or shutil.which("apt-get") is None or os.geteuid() != 0:
        return
    session.run("apt-get", "update", "-qq", external=True)
    session.run("apt-get", "install", "-y", "-qq", "chromium", external=True,
                env={"DEBIAN_FRONTEND": "noninteractive"})


@nox.session(python="3.11")
def tests(session: nox.Session) -> None:
    """The test suite (fast by default; pass ``-- -m slow`` for the heavy sweeps)."""
    _install(session, "test")
    _chromium(session)
    args = session.posargs or ["-n", "2", "--dist", "loadgroup"]
    session.run("pytest", *args, env={"PYTHONHASHSEED": "0"})


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


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    """ruff over the code base."""
    session.install("ruff")
    session.run("ruff", "check", ".")


@nox.session(python="3.11")
def hf(session: nox.Session) -> None:
    """Hugging Face architectures (random weights from in-code configs) on the emulated device."""
    _install(session, "hf")
    db = os.environ.get("CONFORMANCE_DB", "results/opdb.sqlite")
    Path(db).parent.mkdir(parents=True, exist_ok=True)
    session.run("conformance", "run", "--models", "hf", "--db", db, "--exit-zero", *session.posargs,
                env={"HF_HUB_OFFLINE": "1"})


@nox.session(python="3.11")
def browse(session: nox.Session) -> None:
    """Serve the result database with Datasette (http://127.0.0.1:8001)."""
    session.install("datasette")
    db = os.environ.get("CONFORMANCE_DB", "results/opdb.sqlite")
    session.run("datasette", "serve", db, "--host", "127.0.0.1", "--port", "8001", *session.posargs)
