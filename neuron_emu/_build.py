"""Builds (once) and loads the C++ core of the emulator.

The extension is JIT-compiled with :func:`torch.utils.cpp_extension.load`.  The compiled module
lives in ``${NEURON_EMU_CACHE:-~/.cache/neuron_emu}/<torch version>-<key>`` where the key hashes
the C++ source, the Python version, the torch installation (its path and version) and the build
flags: a changed source or another virtual environment gets its own directory instead of evicting
the others' builds, and an unchanged one loads in ~0.1 s.

Crash safety.  A build never happens in the final directory: the builder holds an exclusive
``flock`` on ``<key>.lock`` (the kernel drops it when the holder dies, so it can never go stale),
compiles into a private ``<key>.tmp-<pid>-*`` directory -- the only place torch's own ``lock``
file (its ``FileBaton``) is created -- and renames the finished directory into place atomically.
A run killed at any moment therefore leaves at most a private temp directory (removed by the
next builder) and never a ``lock`` file that a later run would wait on.  A final directory
without the module (an interrupted build of an older emulator version) is rebuilt.  Waiting for
another process's build and building are both announced on stderr.

Example::

    >>> from neuron_emu._build import load_extension
    >>> ext = load_extension()
    >>> callable(ext.set_strict)
    True
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import torch

_SRC = Path(__file__).with_name("csrc") / "neuron_ext.cpp"
_ext: ModuleType | None = None
last_build_seconds: float | None = None   # wall time of the last load_extension() that built or waited
last_build_built: bool = False            # whether that call compiled the core itself


def _debug() -> bool:
    return bool(os.environ.get("NEURON_EMU_DEBUG"))


def _cflags() -> list[str]:
    return (["-O0", "-g"] if _debug() else ["-O2"]) + _openmp()


def _openmp() -> list[str]:
    # FTZ/DAZ must reach ATen's OpenMP intra-op threads (see FtzGuard in the C++ core): build
    # with the OpenMP that torch itself runs on, where it does (Linux wheels: libgomp).
    return ["-fopenmp"] if sys.platform.startswith("linux") and "OpenMP" in torch.__config__.parallel_info() else []


def cache_root() -> Path:
    return Path(os.environ.get("NEURON_EMU_CACHE", Path.home() / ".cache" / "neuron_emu"))


def cache_key() -> str:
    """What the compiled module depends on: source, Python, the torch installation, flags."""
    torch_dir = str(Path(torch.__file__).resolve().parent)
    h = hashlib.sha256()
    for part in (_SRC.read_bytes(), sys.version.encode(), torch_dir.encode(), torch.__version__.encode(),
                 " ".join(_cflags()).encode()):
        h.update(part)
        h.update(b"\0")
    return h.hexdigest()[:16]


def cache_dir() -> Path:
    """Directory that holds the compiled extension for this source and torch installation."""
    return cache_root() / f"{torch.__version__}-{cache_key()}{'-debug' if _debug() else ''}"


def _module_name(build_dir: Path) -> str:
    return "neuron_emu_ext_" + cache_key()


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


def _so_path(build_dir: Path, name: str) -> Path:
    return build_dir / f"{name}.so"


def _import_so(path: Path, name: str) -> ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    sys.modules[name] = mod
    return mod


def _say(msg: str) -> None:
    sys.stderr.write(f"neuron_emu: {msg}\n")
    sys.stderr.flush()


def _acquire(lock_path: Path):
    """Opens and exclusively flocks `lock_path`; announces a wait for another process's build."""
    f = open(lock_path, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        owner = f.read().strip() or "another process"
        _say(f"waiting for {owner} building the neuron_emu core ({lock_path}); "
             "the lock is released automatically if that process dies")
        fcntl.flock(f, fcntl.LOCK_EX)
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()}")
    f.flush()
    return f


def _clear_stale(root: Path, final: Path) -> list[str]:
    """With the lock held: removes temp dirs of interrupted builds (no live builder can own one)
    and a final directory that lacks the module.  Returns what was removed."""
    removed = []
    for p in root.glob(final.name + ".tmp-*"):
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p.name)
    if final.exists():
        shutil.rmtree(final, ignore_errors=True)
        removed.append(final.name)
    return removed


def load_extension(verbose: bool = False) -> ModuleType:
    """Returns the compiled extension module, building it on first use."""
    global _ext, last_build_seconds, last_build_built
    if _ext is not None:
        return _ext
    final = cache_dir()
    name = _module_name(final)
    so = _so_path(final, name)
    if so.exists():  # the fast path: a finished build is only ever renamed into place whole
        _ext = _import_so(so, name)
        return _ext
    root = final.parent
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    lock = _acquire(root / f"{final.name}.lock")
    try:
        if so.exists():  # another process built it while we waited
            _ext = _import_so(so, name)
        else:
            removed = _clear_stale(root, final)
            from torch.utils import cpp_extension

            _ensure_ninja()
            tmp = Path(tempfile.mkdtemp(prefix=f"{final.name}.tmp-{os.getpid()}-", dir=root))
            _say(f"building the neuron_emu core, first use, ~1 min (in {tmp})"
                 + (f"; removed leftovers of an interrupted build: {', '.join(removed)}" if removed else ""))
            mod = cpp_extension.load(
                name=name,
                sources=[str(_SRC)],
                build_directory=str(tmp),
                extra_cflags=_cflags(),
                extra_ldflags=_openmp(),
                verbose=verbose,
            )
            os.rename(tmp, final)  # atomic: the final directory appears complete or not at all
            last_build_built = True
            _ext = mod  # already loaded from the temp path; loading the renamed copy would register twice
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()
    last_build_seconds = time.perf_counter() - t0
    return _ext
