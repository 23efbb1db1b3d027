"""neuron_emu: a CPU emulator of AWS TorchNeuron's ``neuron`` PyTorch device.

``import neuron_emu`` registers the PrivateUse1 device ``neuron`` (building the C++ core on first
use), activates an SDK build manifest (``NEURON_EMU_BUILD`` or the newest shipped one) and the
``torch.compile(backend="neuron")`` backend.

Example::

    >>> import torch, neuron_emu
    >>> x = torch.randn(4, 4).to("neuron")
    >>> (x @ x).device
    device(type='neuron', index=0)
    >>> neuron_emu.active_build().name == neuron_emu.shipped_builds()[-1]
    True
"""

from __future__ import annotations

import os
from pathlib import Path

from . import device as _device
from . import dispatch as _dispatch
from .dispatch import (
    clear_op_tracking,
    get_executed_ops,
    get_fallback_ops,
    get_native_ops,
    get_op_counts,
    op_tracking,
)
from .manifest import Build, ManifestError, control_builds, load_build, shipped_builds

__all__ = [
    "Build", "ManifestError", "active_build", "clear_op_tracking", "compile_stats", "control_builds",
    "get_executed_ops",
    "get_fallback_ops", "get_native_ops", "get_op_counts", "is_strict", "load_build", "op_tracking",
    "register_distributed", "reset_compile_stats", "set_strict", "shipped_builds", "use_build",
]


def use_build(build: str | Path | Build) -> Build:
    """Activates an SDK build by shipped name, path to a .toml manifest, or loaded :class:`Build`.

    Returns the active build.  Routing caches are reset; op tracking is kept.
    """
    b = build if isinstance(build, Build) else load_build(build)
    _dispatch.activate(b)
    return b


def active_build() -> Build:
    """The currently active SDK build."""
    assert _dispatch.S.build is not None
    return _dispatch.S.build


def set_strict(strict: bool = True) -> None:
    """Strict mode: any CPU fallback raises a RuntimeError naming the op (eager and compile)."""
    _dispatch._ext().set_strict(bool(strict))


def is_strict() -> bool:
    return bool(_dispatch._ext().get_strict())


def register_distributed() -> None:
    """Registers the c10d backend "neuron" (idempotent), so that ``torch.distributed.init_process_group
    ("neuron", ...)`` and ``init_device_mesh("neuron", ...)`` work: see :mod:`neuron_emu.distributed`."""
    from . import distributed

    distributed.register()


def _init() -> None:
    _device.register()
    ext = _dispatch._ext()
    ext.set_router(_dispatch.classify, _dispatch.handle)
    use_build(os.environ.get("NEURON_EMU_BUILD") or shipped_builds()[-1])
    set_strict(os.environ.get("NEURON_EMU_STRICT", "") not in ("", "0", "false", "False"))
    from . import (
        compile_backend,  # noqa: F401  (registers backend="neuron")
        custom_ops,  # noqa: F401  (registers the backend's custom ops: neuron::rms_norm, ...)
    )


_init()

from .compile_backend import compile_stats, reset_compile_stats  # noqa: E402
