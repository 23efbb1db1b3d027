"""The crash-safe schema search's preflights: one input run in a forked child first, on the CPU
reference (:func:`cpu_preflight`) or on the target alone (:func:`target_preflight`), so that a
kernel that crashes or hangs on it costs that child, not the worker.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from conformance.check.execute import err
from conformance.check.placement import guarded_inputs, on_device, to_cpu
from conformance.check.selfcheck import again_on_poisoned, undefined

PREFLIGHT_TIMEOUT_S = 30.0
#: A CPU preflight's limit once a child in this process has ended by itself: this many times the
#: slowest such child, at least :data:`CPU_PREFLIGHT_MIN_S` (at most :data:`PREFLIGHT_TIMEOUT_S`).
#: A hung CPU reference only rejects an input, so the search need not wait 30 s on each (the
#: crash-safe search of batch_norm_backward met six hanging inputs, three minutes); a target's
#: preflight keeps the full limit, since its hang is a verdict.
CPU_PREFLIGHT_FACTOR = 50
CPU_PREFLIGHT_MIN_S = 5.0
_ENDED: list[float] = []  # the slowest CPU preflight child that ended by itself, in this process
#: Forked CPU runs an input must survive: a kernel fed an input outside its contract may corrupt
#: memory and crash only now and then, and a target crash on such an input is no finding (an
#: A/A gate of 2.33.0 saw mkldnn_rnn_layer.out's shrunk input crash the target in one run and
#: pass the CPU's single preflight, and crash both on every later try).
CPU_PREFLIGHTS = 3


# a child's exit status: the CPU kernel wrote into the guards around its inputs, read past them
# (its result depends on what the guards hold), or raised (its message follows on a pipe)
_WROTE_PAST, _READS_PAST, _RAISED = 3, 4, 5
_CHILD_SAYS = {_WROTE_PAST: "wrote past its inputs", _READS_PAST: "read past its inputs (its result is not reproducible)"}


def _cpu_limit() -> float:
    """How long a CPU preflight child may run (:data:`CPU_PREFLIGHT_FACTOR`)."""
    if not _ENDED:
        return PREFLIGHT_TIMEOUT_S
    return min(PREFLIGHT_TIMEOUT_S, max(CPU_PREFLIGHT_MIN_S, CPU_PREFLIGHT_FACTOR * _ENDED[0]))


def _in_child(run: Callable[[], Any], timeout: float = PREFLIGHT_TIMEOUT_S,
              ended: list[float] | None = None) -> str | None:
    """Run ``run`` in a forked child for up to ``timeout`` seconds; how it died ("crashed
    (signal X)", "hung"), what it found (a ``run`` returning one of :data:`_CHILD_SAYS`'s exit
    statuses), "raised: <its error>", or None. ``ended`` (when given) keeps the longest time a
    child took to end by itself."""
    start = time.monotonic()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: run, then leave without cleanup
        import faulthandler
        import gc

        os.close(read)
        faulthandler.disable()  # an expected crash, reported by the parent; no traceback dump
        # what the parent had is not this child's to free: collecting it (inherited tensors of other
        # devices, compiler pools, threads' locks) could crash or hang the child for reasons that
        # have nothing to do with the input, and turn a valid input into a "crash"
        gc.freeze()
        code = 0
        try:
            code = run() or 0
            gc.collect()  # free now: heap corruption often only shows when memory is freed
        except BaseException as exc:  # noqa: BLE001 - the parent says what it means
            code = _RAISED
            with contextlib.suppress(BaseException):
                os.write(write, err(exc).encode()[:4000])
        os._exit(code)
    os.close(write)
    try:
        deadline = start + timeout
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return f"hung (over {timeout:g} s)"
            time.sleep(0.002)
        message = os.read(read, 4096).decode(errors="replace")
    finally:
        os.close(read)
    if ended is not None:
        took = time.monotonic() - start
        ended[:] = [max([took, *ended])]
    if os.WIFSIGNALED(status):
        return f"crashed (signal {signal.Signals(os.WTERMSIG(status)).name})"
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 0
    if code == _RAISED:
        return f"raised: {message}"
    return _CHILD_SAYS.get(code)


def cpu_preflight(info: Any, sample: Any) -> str | None:
    """Run the CPU reference on ``sample`` in forked children first, its inputs between guard
    regions (:func:`conformance.check.placement.guarded_inputs`): why the input is rejected, or
    None. A crashing or hanging reference kernel, one writing past an input outside its contract,
    or one whose result depends on what lies past its inputs (the first child runs it again
    between other guards, as the sweep's self-check does) rejects the input, not the search; so
    does the reference's own error ("CPU reference failed: ...", as the sweep words it: the
    target is never run alone on an input the CPU refuses). Before any of it, the input is held to
    the op's meta kernel (:func:`conformance.check.metacheck.contract_refusal`, as the sweep
    holds it): one outside the op's contract runs nowhere. Up to :data:`CPU_PREFLIGHTS`
    children, each for :func:`_cpu_limit` seconds."""
    from conformance.check.metacheck import OUT_OF_CONTRACT, contract_refusal

    overload = getattr(info, "packet", None)  # the search's overload (a bare function has no meta)
    if overload is not None:  # the overload itself, on fake tensors: nothing runs here for real
        from conformance.inputs.schema import NOARG

        placed = on_device(sample, "cpu")
        args = [a for a in (placed.input, *placed.args) if a is not NOARG]
        refused = contract_refusal(overload, *args, **placed.kwargs)
        if refused:
            return f"CPU reference failed: {OUT_OF_CONTRACT} ({refused})"

    def run(check: bool) -> int:
        with guarded_inputs() as guards:
            cpu = on_device(sample, "cpu")
        first = info.op(cpu.input, *cpu.args, **cpu.kwargs)
        if not guards.intact():
            return _WROTE_PAST
        if check:
            def again() -> tuple[Any, Any, None]:
                c = on_device(sample, "cpu")
                return info.op(c.input, *c.args, **c.kwargs), c, None

            runs, raised = again_on_poisoned(again, to_cpu(first))
            if raised is not None or undefined(to_cpu(first), *runs).any:
                return _READS_PAST
        return 0

    from conformance.check.comparators import comparator_for
    from conformance.sweep.opinfo import UNCHECKED_KINDS

    checked = comparator_for(str(getattr(info, "name", ""))) not in UNCHECKED_KINDS  # as the sweep does
    for i in range(CPU_PREFLIGHTS):  # memory corruption need not show on every run
        died = _in_child(lambda: run(checked and i == 0), _cpu_limit(), _ENDED)
        if died is not None and died.startswith("raised: "):
            return f"CPU reference failed: {died.removeprefix('raised: ')}"
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

    died = _in_child(run)
    return None if died is not None and died.startswith("raised: ") else died  # its error: the sweep's to report
