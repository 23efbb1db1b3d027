"""``cpu``: the CPU against itself; a control target (every result must pass)."""

from __future__ import annotations

from .base import Target, register


@register
class CpuTarget(Target):
    name = "cpu"
    description = "eager CPU vs eager CPU (control)"
    device = "cpu"
