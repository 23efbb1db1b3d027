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

PR_SET_PDEATHSIG = 1
SUPERVISOR_ENV = "CONFORMANCE_SUPERVISOR_PID"
# Set when the supervisor's main thread starts the fork server: PR_SET_PDEATHSIG fires when the
# parent *thread* exits, so it is only armed when that thread lives as long as the process.
PDEATHSIG_ENV = "CONFORMANCE_SUPERVISOR_PDEATHSIG"
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
