"""CPU targets whose worker process dies in one phase of one item, registered by ``--import
dying_targets`` (tests/test_run_inflight.py): ``test-die-cpu`` dies as item :data:`VICTIM`'s CPU
reference starts, ``test-die-target`` as its target side starts. Which item runs is read from
the worker's shared in-flight slot (the phase hook is bound to it), so the death comes exactly
where the supervisor has to find it."""

from __future__ import annotations

import os
import signal

from conformance.check import execute
from conformance.targets.base import register
from conformance.targets.cpu import CpuTarget

VICTIM = "mul|function|float32|1"
_DIE_IN: list[str] = []  # the phase the worker's target dies in (set when the target is set up)
_phase = execute.phase


def _dying_phase(name: str) -> None:
    _phase(name)
    hook = execute._PHASE_HOOK
    slot = getattr(hook, "__self__", None)  # conformance.run.isolation.Inflight, in a worker
    if _DIE_IN and name == _DIE_IN[0] and slot is not None and slot.read()[1] == VICTIM:
        os.kill(os.getpid(), signal.SIGSEGV)


execute.phase = _dying_phase


class _Dying(CpuTarget):
    die_in = ""

    def setup(self) -> None:
        super().setup()
        _DIE_IN[:] = [self.die_in]


@register
class DieInCpu(_Dying):
    name = "test-die-cpu"
    die_in = "cpu"


@register
class DieOnTarget(_Dying):
    name = "test-die-target"
    die_in = "target"
