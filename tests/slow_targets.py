"""A CPU target whose items each take a while on the target side (``test-slow-cpu``, registered
by ``--import slow_targets``; tests/test_ray_executor.py): groups long enough that a test can take
a node away from a Ray cluster while one of them runs there."""

from __future__ import annotations

import time

from conformance.check import execute
from conformance.targets.base import register
from conformance.targets.cpu import CpuTarget

SECONDS = 0.25  # per item, on the target side
_ON: list[bool] = []
_phase = execute.phase


def _slow_phase(name: str) -> None:
    _phase(name)
    if _ON and name == "target":
        time.sleep(SECONDS)


execute.phase = _slow_phase


@register
class SlowCpu(CpuTarget):
    name = "test-slow-cpu"

    def setup(self) -> None:
        super().setup()
        _ON[:] = [True]
