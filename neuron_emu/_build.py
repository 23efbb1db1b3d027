"""Builds (once) and loads the C++ core of the emulator.

The extension is JIT-compiled with :func:`torch.utils.cpp_extension.load` into
``${NEURON_EMU_CACHE:-~/.cache/neuron_emu}/<torch version>-<source hash>``, so a changed source or
torch version rebuilds, and an unchanged one loads in ~0.1 s.  A file lock serialises concurrent
builders (pytest-xdist workers, parallel CI jobs).

Example::

    >>> from neuron_emu._build import load_extension
    >>> ext = load_extension()
    >>> callable(ext.set_strict)
    True
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import sys
import time
from pathlib import Path
from types import ModuleType

import torch

_SRC = Path(__file__).with_name("csrc") / "neuron_ext.cpp"
_ext: ModuleType | None = None
last_build_seconds: float | None = None


def cache_dir() -> Path:
    """Directory that holds the compiled extension for this torch version and source."""
    root = Path(os.environ.get("NEURON_EMU_CACHE", Path.home() / ".cache" / "neuron_emu"))
    digest = hashlib.sha256(_SRC.read_bytes() + sys.version.encode()).hexdigest()[:16]
    return root / f"{torch.__version__}-{digest}{'-debug' if os.environ.get('NEURON_EMU_DEBUG') else ''}"


def _ensure_ninja() -> None:
    """Puts a ninja binary on PATH: the `ninja` PyPI package's, else a system one."""
    if shutil.which("ninja"):
        return
    try:
        import ninja  # type: ignore[import-not-found]

        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
    except ImportError:
        pass
    if not shutil.which("ninja"):
        venv_bin = Path(sys.executable).parent
        if (venv_bin / "ninja").exists():
            os.environ["PATH"] = str(venv_bin) + os.pathsep + os.environ.get("PATH", "")


def load_extension(verbose: bool = False) -> ModuleType:
    """Returns the compiled extension module, building it on first use."""
    global _ext, last_build_seconds
    if _ext is not None:
        return _ext
    from torch.utils import cpp_extension

    _ensure_ninja()
    build_dir = cache_dir()
    build_dir.mkdir(parents=True, exist_ok=True)
    name = "neuron_emu_ext_" + build_dir.name.rsplit("-", 1)[-1]
    t0 = time.perf_counter()
    with open(build_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            _ext = cpp_extension.load(
                name=name,
                sources=[str(_SRC)],
                build_directory=str(build_dir),
                extra_cflags=(["-O0", "-g"] if os.environ.get("NEURON_EMU_DEBUG") else ["-O2"]),
                verbose=verbose,
            )
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    last_build_seconds = time.perf_counter() - t0
    return _ext
