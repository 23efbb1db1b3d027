"""The first-use build of the emulator's C++ core: crash safety, stale locks, cache keys.

The kill tests build the core from scratch in a private NEURON_EMU_CACHE (~45-60 s per build on a
busy 2-core machine): one kill moment runs by default, the others are marked ``slow``.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from neuron_emu import _build

REPO = Path(__file__).resolve().parents[1]
BUILD_TIMEOUT = 900  # a cold build on a loaded 2-core machine; only a hang gets near this


def _env(cache: Path) -> dict[str, str]:
    env = dict(os.environ, NEURON_EMU_CACHE=str(cache), PYTHONPATH=str(REPO))
    env.pop("NEURON_EMU_DEBUG", None)
    return env


def _final_name(cache: Path) -> str:
    """The final cache directory name a build in `cache` produces (same key as this process)."""
    old = os.environ.get("NEURON_EMU_CACHE")
    os.environ["NEURON_EMU_CACHE"] = str(cache)
    try:
        return _build.cache_dir().name
    finally:
        if old is None:
            os.environ.pop("NEURON_EMU_CACHE")
        else:
            os.environ["NEURON_EMU_CACHE"] = old


def _start_build(cache: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", "from neuron_emu._build import load_extension; load_extension()"],
        env=_env(cache), cwd=REPO, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
        start_new_session=True)  # own process group: the kill takes ninja and g++ with it


def _read_until(proc: subprocess.Popen, needle: str) -> str:
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if needle in line:
            return "".join(seen)
    raise AssertionError(f"process ended without printing {needle!r}: {''.join(seen)[-2000:]}")


def _kill(proc: subprocess.Popen, whole_group: bool = True) -> None:
    if whole_group:
        os.killpg(proc.pid, signal.SIGKILL)
    else:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def _wait_for_file(root: Path, pattern: str, proc: subprocess.Popen) -> None:
    """Polls until a file matching `pattern` appears under `root` (the kill moment)."""
    deadline = time.monotonic() + BUILD_TIMEOUT
    while not list(root.glob(pattern)):
        assert proc.poll() is None, "the build ended before the kill moment"
        assert time.monotonic() < deadline, f"{pattern} never appeared"
        time.sleep(0.05)


def _fresh_import_completes(cache: Path, hold_lock: bool = False) -> subprocess.CompletedProcess:
    """A new run after the kill: `import neuron_emu` and one device op.  With `hold_lock`, this
    test holds the build lock first and checks that the new run says it is waiting."""
    code = ("import torch, neuron_emu; "
            "print((torch.ones(3, device='neuron') + 1).cpu().tolist())")
    lock = None
    if hold_lock:
        lock = open(cache / f"{_final_name(cache)}.lock", "a+")
        fcntl.flock(lock, fcntl.LOCK_EX)
    proc = subprocess.Popen([sys.executable, "-c", code], env=_env(cache), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err_head = ""
    if lock is not None:
        err_head = _read_until(proc, "waiting for")
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()
    out, err = proc.communicate(timeout=BUILD_TIMEOUT)
    err = err_head + err
    assert proc.returncode == 0, err[-3000:]
    assert out.strip().endswith("[2.0, 2.0, 2.0]")
    assert "building the neuron_emu core, first use" in err
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _assert_recovered(cache: Path) -> None:
    final = cache / _final_name(cache)
    assert list(final.glob("neuron_emu_ext_*.so")), sorted(p.name for p in cache.iterdir())
    assert not list(cache.glob("*.tmp-*")), "the interrupted build's temp dir was not cleared"
    assert not (final / "lock").exists(), "torch's build baton was left in the final directory"


def test_killed_at_build_start_then_fresh_import_completes(tmp_path):
    proc = _start_build(tmp_path)
    _read_until(proc, "building the neuron_emu core, first use, ~1 min")
    _kill(proc)
    final = tmp_path / _final_name(tmp_path)
    assert not final.exists(), "a killed build must not leave a final directory behind"
    res = _fresh_import_completes(tmp_path, hold_lock=True)
    assert "removed leftovers of an interrupted build" in res.stderr
    _assert_recovered(tmp_path)
    # A second run loads the cache and builds nothing.
    again = subprocess.run([sys.executable, "-c", "import neuron_emu"], env=_env(tmp_path), cwd=REPO,
                           capture_output=True, text=True, timeout=BUILD_TIMEOUT)
    assert again.returncode == 0 and "building" not in again.stderr, again.stderr


@pytest.mark.slow
@pytest.mark.parametrize("moment,pattern,whole_group", [
    ("torch's baton taken, compiling", "*.tmp-*/lock", True),
    ("object file written, linking", "*.tmp-*/*.o", True),
    ("python killed alone, compiler orphaned", "*.tmp-*/lock", False),
])
def test_killed_mid_build_then_fresh_import_completes(tmp_path, moment, pattern, whole_group):
    proc = _start_build(tmp_path)
    _read_until(proc, "building the neuron_emu core")
    _wait_for_file(tmp_path, pattern, proc)
    _kill(proc, whole_group)
    assert list(tmp_path.glob("*.tmp-*")), moment
    _fresh_import_completes(tmp_path)
    _assert_recovered(tmp_path)


def test_stale_lock_and_leftovers_are_cleared_without_waiting(tmp_path):
    """A lock file whose owner is gone (no flock held) and torch batons in leftover dirs neither
    block nor survive the next builder."""
    final = tmp_path / "2.13.0-abc"
    (tmp_path / "2.13.0-abc.lock").write_text("pid 999999999")
    leftover = tmp_path / "2.13.0-abc.tmp-999999999-x"
    leftover.mkdir()
    (leftover / "lock").write_text("")
    final.mkdir()  # an interrupted old-layout build: torch's baton, no module
    (final / "lock").write_text("")
    t0 = time.monotonic()
    f = _build._acquire(tmp_path / "2.13.0-abc.lock")  # must not block
    try:
        removed = _build._clear_stale(tmp_path, final)
    finally:
        f.close()
    assert time.monotonic() - t0 < 30
    assert sorted(removed) == sorted([leftover.name, final.name])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["2.13.0-abc.lock"]
    assert (tmp_path / "2.13.0-abc.lock").read_text() == f"pid {os.getpid()}"


def test_cache_key_includes_the_torch_installation(monkeypatch):
    key = _build.cache_key()
    assert _build.cache_key() == key
    monkeypatch.setattr(torch, "__file__", "/elsewhere/venv2/lib/python3.11/site-packages/torch/__init__.py")
    other_path = _build.cache_key()
    assert other_path != key
    monkeypatch.undo()
    monkeypatch.setattr(torch, "__version__", "2.13.0+other")
    assert _build.cache_key() not in (key, other_path)
    monkeypatch.undo()
    assert _build.cache_key() == key
