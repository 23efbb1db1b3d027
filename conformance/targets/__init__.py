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


def preload(name: str | None = None) -> None:
    """Import the device package of the target named ``name`` if it is installed (see
    Target.preload); ``None``: every registered target's. A ``device:TYPE`` target, or a name no
    target has, imports nothing here (its ``--import`` modules load in each worker)."""
    load_builtin()
    targets = REGISTRY.values() if name is None else [REGISTRY[name]] if name in REGISTRY else []
    for target in targets:
        target.preload()
