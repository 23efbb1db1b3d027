"""Lazy re-exports for a stage package: ``conformance.gate.run_gate`` is
``conformance.gate.core.run_gate``, imported only when first asked for.

A stage's ``__init__`` names its public API without importing it, so that a light module of the
stage (``conformance.gate.limits``, which the command line reads to answer ``--help`` without
torch) does not pull in the heavy ones. Code inside the harness imports the defining module;
the package-level names are the API that users, old repro scripts and the README rely on.

Example::

    >>> import types
    >>> pkg = types.ModuleType("pkg")
    >>> pkg.__getattr__, pkg.__dir__ = exports("os", {"path": ("join",)})
    >>> pkg.__getattr__("join") is __import__("os").path.join
    True
    >>> "join" in pkg.__dir__() and "getcwd" in pkg.__dir__()
    True
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping


def exports(package: str, modules: Mapping[str, Iterable[str]]) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: each name of ``modules[sub]`` is read from
    ``package.sub`` when first asked for; any other name is an ``AttributeError`` as usual."""
    home = {name: sub for sub, names in modules.items() for name in names}

    def __getattr__(name: str) -> object:
        sub = home.get(name)
        if sub is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{sub}"), name)

    def __dir__() -> list[str]:  # the package's own names (submodules imported so far) and the exports
        return sorted(set(vars(sys.modules[package])) | set(home))

    return __getattr__, __dir__
