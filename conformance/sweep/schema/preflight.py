"""The crash-safe schema search's preflights: one input run in a forked child first, on the CPU
reference (:func:`cpu_preflight`) or on the target alone (:func:`target_preflight`), so that a
kernel that crashes or hangs on it costs that child, not the worker.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

from conformance.check.execute import guarded_inputs, on_device

PREFLIGHT_TIMEOUT_S = 30.0
#: Forked CPU runs an input must survive: a kernel fed an input outside its contract may corrupt
#: memory and crash only now and then, and a target crash on such an input is no finding (an
#: A/A gate of 2.33.0 saw mkldnn_rnn_layer.out's shrunk input crash the target in one run and
#: pass the CPU's single preflight, and crash both on every later try).
CPU_PREFLIGHTS = 3


_WROTE_PAST = 3  # a child's exit status: the CPU kernel wrote into the guards around its inputs


def _in_child(run: Callable[[], Any]) -> str | None:
    """Run ``run`` in a forked child; how it died ("crashed (signal X)", "hung"), or None. A
    ``run`` that returns False exits with :data:`_WROTE_PAST`."""
    pid = os.fork()
    if pid == 0:  # child: run, then leave without cleanup (exceptions are reported by the real run)
        import faulthandler
        import gc

        faulthandler.disable()  # an expected crash, reported by the parent; no traceback dump
        # what the parent had is not this child's to free: collecting it (inherited tensors of other
        # devices, compiler pools, threads' locks) could crash or hang the child for reasons that
        # have nothing to do with the input, and turn a valid input into a "crash"
        gc.freeze()
        code = 0
        try:
            code = _WROTE_PAST if run() is False else 0
            gc.collect()  # free now: heap corruption often only shows when memory is freed
        except BaseException:  # noqa: BLE001, S110
            pass
        os._exit(code)
    deadline = time.monotonic() + PREFLIGHT_TIMEOUT_S
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return f"hung (over {PREFLIGHT_TIMEOUT_S:g} s)"
        time.sleep(0.002)
    if os.WIFSIGNALED(status):
        return f"crashed (signal {signal.Signals(os.WTERMSIG(status)).name})"
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == _WROTE_PAST:
        return "wrote past its inputs"
    return None


def cpu_preflight(info: Any, sample: Any) -> str | None:
    """Run the CPU reference on ``sample`` in a forked child first, its inputs between guard
    regions (:func:`conformance.check.placement.guarded_inputs`); the reason when the child died or
    the kernel wrote into the guards (a crashing reference kernel, or one writing past an input
    outside its contract, is a rejected input, not the end of the search), in up to
    :data:`CPU_PREFLIGHTS` children."""
    def run() -> bool:
        with guarded_inputs() as guards:
            cpu = on_device(sample, "cpu")
        info.op(cpu.input, *cpu.args, **cpu.kwargs)
        return guards.intact()

    for _ in range(CPU_PREFLIGHTS):  # memory corruption need not show on every run
        died = _in_child(run)
        if died is not None:
            return f"CPU reference {died}"
    return None


def target_preflight(target: Any, info: Any, sample: Any) -> str | None:
    """Run ``sample`` on the target alone in a forked child (no CPU reference ran in that
    process, so nothing the reference corrupted can fail there); how the target died, or None."""

    def run() -> None:
        dev = on_device(sample, target.device)
        target.wrap(info.op)(dev.input, *dev.args, **dev.kwargs)
        target.synchronize()

    return _in_child(run)
