"""What a worker process owes its supervisor: to die with it, and to keep its output to itself.

Lifeline. Workers come from a fork server that the supervisor (the ``conformance run``
process) starts. If the supervisor is killed (kill -9, OOM killer) while a worker hangs in a
device call, nothing else would ever end them: the fork server outlives its parent, and a hung
worker never reads its pipe again. :func:`die_with` ties a process to its direct parent
(``PR_SET_PDEATHSIG``: the kernel sends SIGKILL when the parent exits, even if this process is
stuck in C code holding the GIL) and to the supervisor itself (a watchdog thread waiting on a
pidfd of the supervisor, or polling where pidfds are missing).

Output. What a worker prints belongs to the item it ran, not to the console: :class:`Capture`
points file descriptors 1 and 2 at a file (so C-level writes -- glibc's ``free(): invalid
size``, a device's own messages -- are caught as well as Python's), and hands out what was
written since the last item. The supervisor reads the same file for an item whose worker died
or was killed.

In flight. Which item a worker runs, in which phase and since when, is in memory it shares
with its supervisor (:class:`Inflight`): written by the worker without a system call, read by
the supervisor only when it needs it (a death, a timeout check). The worker writes an item's row
to its pipe *before* it names the next item there, so a supervisor that reads the pipe to its end
before it reads the slot blames a death on the right item.

Example::

    >>> import tempfile
    >>> from conformance.run.isolation import read_output
    >>> path = tempfile.mkstemp()[1]
    >>> _ = open(path, "w").write("UserWarning: resized\\n")
    >>> read_output(path), read_output(path)
    ('UserWarning: resized', None)
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

PR_SET_PDEATHSIG = 1
SUPERVISOR_ENV = "CONFORMANCE_SUPERVISOR_PID"
# Set when the supervisor's main thread starts the fork server: PR_SET_PDEATHSIG fires when the
# parent *thread* exits, so it is only armed when that thread lives as long as the process.
PDEATHSIG_ENV = "CONFORMANCE_SUPERVISOR_PDEATHSIG"

#: The target whose device package the fork server imports ahead for its workers (unset: every
#: installed one's). A cuda run's workers must not import the emulator: importing it registers a
#: device and loads its extension into the processes under test, and on a fresh machine builds it.
PRELOAD_ENV = "CONFORMANCE_PRELOAD_TARGET"
OUTPUT_MAX = 8000  # bytes of a worker's output kept per item (head and tail)


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _pdeathsig() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def die_with(parent: int, supervisor: int, *, pdeathsig: bool = True) -> None:
    """Kill this process as soon as ``parent`` (its direct parent) or ``supervisor`` exits."""
    if pdeathsig:
        _pdeathsig()
    if os.getppid() != parent:  # the parent died before the signal was armed
        _die()
    threading.Thread(target=_watch, args=(parent, supervisor), name="conformance-lifeline", daemon=True).start()


def _watch(parent: int, supervisor: int) -> None:
    fd = None
    try:
        fd = os.pidfd_open(supervisor)
    except ProcessLookupError:
        _die()
    except (OSError, AttributeError):  # no pidfds here: poll the process instead
        fd = None
    while True:
        if fd is not None:
            ready, _, _ = select.select([fd], [], [], 1.0)
            if ready:  # a pidfd becomes readable when its process exits
                _die()
        else:
            time.sleep(1.0)
            try:
                os.kill(supervisor, 0)
            except ProcessLookupError:
                _die()
            except PermissionError:
                pass
        if os.getppid() != parent:
            _die()


#: Capture files are named ``conformance-worker-<supervisor pid>-<random>.out`` in the temp folder.
OUTPUT_PREFIX = "conformance-worker-"


def new_output_file() -> str:
    """A fresh capture file for a worker of this process. A supervisor removes its files when it
    ends; one killed first (a Ray actor ends by ``ray.kill``) cannot, and the next supervisor on
    this machine removes them (:func:`sweep_stale_outputs`), known by the pid in their names."""
    import tempfile

    sweep_stale_outputs()
    fd, path = tempfile.mkstemp(prefix=f"{OUTPUT_PREFIX}{os.getpid()}-", suffix=".out")
    os.close(fd)
    return path


_swept = False


def sweep_stale_outputs(min_age_s: float = 60.0) -> int:
    """Remove the capture files of supervisors that are gone (their pid lives no more) and that
    nothing wrote for ``min_age_s``; once per process. Returns how many went."""
    global _swept
    import tempfile

    if _swept:
        return 0
    _swept = True
    folder, removed, now = tempfile.gettempdir(), 0, time.time()
    try:
        names = [n for n in os.listdir(folder) if n.startswith(OUTPUT_PREFIX) and n.endswith(".out")]
    except OSError:
        return 0
    for name in names:
        pid = name[len(OUTPUT_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        path = os.path.join(folder, name)
        try:
            if now - os.stat(path).st_mtime >= min_age_s:
                os.unlink(path)
                removed += 1
        except OSError:
            pass  # another supervisor removed it first
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # it lives, as another user's
        return True
    return True


def read_output(path: str, *, clear: bool = True, limit: int = OUTPUT_MAX) -> str | None:
    """What was written to a capture file, or None; emptied after. Past ``limit`` bytes only the
    head and the tail are read (an item that printed gigabytes costs no memory here)."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size <= limit:
                data = fh.read()
            else:
                half = limit // 2
                head = fh.read(half)
                fh.seek(size - half)
                data = head + f"\n[... {size - 2 * half} bytes left out ...]\n".encode() + fh.read(half)
        if clear and size:
            os.truncate(path, 0)
    except OSError:
        return None
    text = data.decode("utf-8", errors="replace").strip()
    return text or None


class Capture:
    """Points this process's fd 1 and 2 at ``path`` (append mode, so emptying the file between
    items is safe) and routes Python warnings there, once per item and location."""

    def __init__(self, path: str) -> None:
        self.path = path
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        # glibc writes its fatal heap messages to the terminal unless told to use stderr
        os.environ["LIBC_FATAL_STDERR_"] = "1"
        warnings.simplefilter("default")

    def next_item(self) -> None:
        """A new item starts: a warning shown for the previous item is shown again for this one."""
        warnings.simplefilter("default")  # resets the once-per-location registries

    def take(self) -> str | None:
        """Everything written since the last call (the item that just ended)."""
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        return read_output(self.path)


KEY_MAX = 1024  # bytes of an item key the shared slot holds; a longer key goes through the pipe


class _Shared(ctypes.Structure):
    # seq: odd while the worker writes (a seqlock for a live reader). length: 0 no item in flight,
    # -1 the key went by message (count says which), else the key's length (written last)
    _fields_ = [("seq", ctypes.c_uint64), ("count", ctypes.c_int64), ("since", ctypes.c_double),
                ("phase", ctypes.c_int32), ("length", ctypes.c_int32), ("key", ctypes.c_char * KEY_MAX),
                # the item's seconds in the CPU phase so far (since its clock started), and when its
                # current phase began
                ("cpu_s", ctypes.c_double), ("phase_at", ctypes.c_double)]


class Inflight:
    """A worker's item in flight, in shared memory: its key, its phase (an index into
    ``phases``) and the monotonic time it (or its timed phase) started.

    The supervisor makes one per worker slot (``ctx``: the worker's multiprocessing context) and
    hands it to each worker it starts there, after :meth:`reset`. The worker calls
    :meth:`start` before an item, :meth:`phase` as the item moves between sides and
    :meth:`clear` between groups; entering or leaving the phase ``timed`` restarts the clock (a
    batch has its own time limit, and so does the item after it). Writes are ordered so that a
    dead worker's slot is whole: the key's length is written after the key, the phase before
    its time. :meth:`read` returns ``(count, key, phase, since)``: ``key`` None between items,
    ``""`` for a key sent by message (the ``count``-th item this worker started)."""

    def __init__(self, ctx: Any, phases: tuple[str, ...], timed: str) -> None:
        self.shared = ctx.RawValue(_Shared)
        self.phases, self.timed = phases, phases.index(timed)
        self._codes = {p: i for i, p in enumerate(phases)}
        self._cpu = self._codes.get("cpu", -1)

    def reset(self) -> None:
        ctypes.memset(ctypes.addressof(self.shared), 0, ctypes.sizeof(_Shared))

    # worker side: only the worker writes, while it runs a group
    def start(self, key: str, announce: Callable[[int, str], None]) -> None:
        s, data = self.shared, key.encode()
        count = s.count + 1
        if len(data) > KEY_MAX:
            announce(count, key)  # before the slot names it: a reader finds the key sent
        s.seq += 1
        s.length = 0  # a death from here on leaves no item in flight: the next worker runs it
        if len(data) <= KEY_MAX:
            s.key = data
        s.count, s.phase, s.since = count, 0, time.monotonic()
        s.cpu_s, s.phase_at = 0.0, s.since
        s.length = len(data) if len(data) <= KEY_MAX else -1
        s.seq += 1

    def phase(self, name: str) -> None:
        s, code = self.shared, self._codes.get(name, len(self.phases))
        now = time.monotonic()
        s.seq += 1
        old, s.phase = s.phase, code
        if old == self._cpu:
            s.cpu_s += now - s.phase_at
        s.phase_at = now
        if code == self.timed or old == self.timed:
            s.since, s.cpu_s = now, 0.0
        s.seq += 1

    def clear(self) -> None:
        s = self.shared
        s.seq += 1
        s.length, s.phase = 0, 0
        s.seq += 1

    # supervisor side
    def cpu_seconds(self) -> float:
        """Seconds the item in flight has spent in the ``cpu`` phase (its CPU reference) since its
        clock started, the current phase included (a timeout's share that is not the target's)."""
        s = self.shared
        return s.cpu_s + (time.monotonic() - s.phase_at if s.phase == self._cpu and s.length else 0.0)

    def read(self, *, settled: bool = False) -> tuple[int, str | None, str, float] | None:
        """The slot as last written; None when a live worker kept writing it (try later).
        ``settled``: the worker is dead, the slot final (no retry)."""
        s = self.shared
        for _ in range(1 if settled else 100):
            seq = s.seq
            if seq & 1 and not settled:
                continue
            count, length, code, since = s.count, s.length, s.phase, s.since
            key = None if length == 0 else "" if length < 0 else s.key[:length].decode(errors="replace")
            if settled or s.seq == seq:
                return count, key, self.phases[code] if code < len(self.phases) else "?", since
        return None


def how_it_ended(proc: Any, wait_s: float = 2.0) -> str:
    """How a child process (a ``subprocess.Popen``) ended, in words: "killed by SIGABRT",
    "exit code 3", or "it stopped answering" when it is still running after ``wait_s``."""
    import contextlib
    import signal
    import subprocess

    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(wait_s)
    code = proc.returncode
    if code is None:
        return "it stopped answering"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"
