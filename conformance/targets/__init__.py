"""Targets: the devices the harness runs against. The rest of the harness sees only
:class:`~conformance.targets.base.Target`; only this package imports device packages."""

from . import device  # noqa: F401,E402  (registers the device:TYPE family; it imports base, not the reverse)
from .base import (
    REGISTRY,
    BuildRef,
    Compiled,
    OpTrace,
    Target,
    TargetError,
    get_target,
    load_builtin,
    register,
)

__all__ = ["REGISTRY", "BuildRef", "Compiled", "OpTrace", "Target", "TargetError", "get_target", "preload", "register"]


def preload() -> None:
    """Import every registered target's device package that is installed (see Target.preload)."""
    load_builtin()
    for target in REGISTRY.values():
        target.preload()
