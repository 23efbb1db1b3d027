"""``device:TYPE``: any device type torch knows, once ``--import MODULE`` has registered it
(``device:neuron --import neuron_emu``, ``device:cuda``, ``device:mps``, ``device:xpu``, an
out-of-tree PrivateUse1 backend). Nobody wrote code for the device here: it is checked by
allocating on it, synchronized through ``torch.accelerator`` or the device module, and its CPU
fallbacks are found by watching the dispatcher (:class:`HostWork`), never by asking the device.

Example::

    >>> from conformance.targets import TargetError, get_target
    >>> try:
    ...     get_target("device:nosuch")
    ... except TargetError as exc:
    ...     print("torch knows no device type 'nosuch'" in str(exc))
    True
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from .base import OpTrace, Target, TargetError, overload_name, register_family


def _tensors(value: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]


class HostWork(TorchDispatchMode):
    """Records the overloads one execution reaches (``dispatched``: below autograd and the
    composite-implicit decompositions) and those that worked on the CPU with the device's data
    (``fallback``), from what the dispatcher shows, for any device:

    * an overload that turns device tensors into CPU tensors (a device-to-host ``_to_copy`` or
      ``copy_``, or any op with device inputs and CPU outputs) marks those CPU tensors as host
      copies of device data; it is a fallback itself unless it is a transfer (the op under test
      may be a copy, or decompose into one);
    * an overload that computes on host copies of device data ran on the CPU: a fallback (and its
      CPU outputs are host copies too, until a host-to-device copy takes them back).

    What it cannot see: copies made inside a device kernel (a C++ boxed CPU fallback calls the
    dispatcher below this mode) and a fallback that copies nothing (the emulator's zero-copy
    one). Watching inside kernels needs re-dispatching each call with the mode still active, which
    changed results and recursed on the emulator; an observer must not change what it observes.
    """

    def __init__(self, trace: OpTrace, device_type: str) -> None:
        super().__init__()
        self.trace, self.device_type = trace, device_type
        self.host = WeakIdKeyDictionary()  # CPU tensors copied/derived from device tensors

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        name = overload_name(func)
        if func.namespace == "aten":
            self.trace.dispatched.add(name)
        ins = _tensors((args, kwargs))
        out = func(*args, **kwargs)
        self._classify(name, ins, _tensors(out))
        return out

    def _classify(self, name: str, ins: list[torch.Tensor], outs: list[torch.Tensor]) -> None:
        dev_in = any(t.device.type == self.device_type for t in ins)
        cpu_outs = [t for t in outs if t.device.type == "cpu"]
        if dev_in and cpu_outs:  # device data now on the CPU (a copy, or an op that returned CPU tensors)
            for t in cpu_outs:
                self.host[t] = True
            if not _is_transfer(name):
                self.trace.fallback.add(name)
        elif any(t in self.host for t in ins):  # computing on the CPU copy of device data
            for t in cpu_outs:
                self.host[t] = True
            if not _is_transfer(name):
                self.trace.fallback.add(name)


_TRANSFERS = {"aten::_to_copy.default", "aten::copy_.default", "aten::_copy_from.default",
              "aten::_copy_from_and_resize.default", "aten::to.device", "aten::to.dtype_layout", "aten::to.other"}


def _is_transfer(name: str) -> bool:
    return name in _TRANSFERS


class DeviceTarget(Target):
    """A device type torch knows, after ``--import`` of the modules that register it.

    Each worker imports the modules itself (``get_target`` in the worker, after the fork), not
    the fork server it comes from: a device package may start its runtime on import (CUDA-like
    runtimes do not survive a fork), and the fork server outlives a run whose imports it would
    have had to guess. The supervisor imports them too, to check the device before any work."""

    name = "device"
    description = "any device type torch knows (device:TYPE, --import MODULE) vs eager CPU"

    def __init__(self, build: Any = None, device_type: str = "", imports: tuple[str, ...] = ()) -> None:
        super().__init__(build)
        self.device_type, self.imports = device_type, tuple(imports)
        self.device = device_type
        self.name = f"device:{device_type}"  # type: ignore[misc]  (per instance: the run's target name)

    def _where(self) -> str:
        return f" after importing {', '.join(self.imports)}" if self.imports else " (no --import given)"

    def setup(self) -> None:
        t = self.device_type
        if not t or ":" in t:
            raise TargetError(f"target 'device:{t}': expected device:TYPE with a device type such as cuda, mps, "
                              "xpu or a PrivateUse1 name (e.g. device:neuron --import neuron_emu)")
        if not self.ref.is_default:
            raise TargetError(f"target 'device:{t}' runs the installed device package; --build {self.build!r} "
                              "is not used (a target that selects builds, e.g. neuron-emu, takes it)")
        try:
            torch.device(t)
        except RuntimeError as exc:
            head = (str(exc).strip().splitlines() or [""])[0][:200]
            raise TargetError(f"target 'device:{t}': torch knows no device type {t!r}{self._where()} ({head})") from None
        try:
            x = torch.arange(4.0, device=t)
            back = (x + 1).to("cpu")
            self.synchronize()
        except Exception as exc:  # noqa: BLE001 - the device type exists but cannot hold a tensor here
            head = (str(exc).strip().splitlines() or [""])[0][:200]
            raise TargetError(f"target 'device:{t}': cannot allocate a tensor on device type {t!r}{self._where()}: "
                              f"{type(exc).__name__}: {head}") from None
        if not torch.equal(back, torch.arange(1.0, 5.0)):
            raise TargetError(f"target 'device:{t}': a tensor sent to {t!r} and back came back with different values")

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "imports": list(self.imports)}

    def synchronize(self) -> None:
        module = getattr(torch, self.device_type, None)
        sync = getattr(module, "synchronize", None)
        if callable(sync):
            sync()
            return
        acc = getattr(torch, "accelerator", None)
        if acc is not None and acc.is_available():
            current = acc.current_accelerator()
            if current is not None and current.type == self.device_type:
                acc.synchronize()

    @contextlib.contextmanager
    def trace(self) -> Iterator[OpTrace]:
        trace = OpTrace()
        try:
            with HostWork(trace, self.device_type):
                yield trace
        finally:
            trace.native = trace.dispatched - trace.fallback

    def repro_setup(self) -> tuple[str, str]:
        return "".join(f"import {m}\n" for m in self.imports), "{fn}"

    def compile_backend(self) -> str:
        """The ``torch.compile`` backend a device package registers under its device type's name
        (TorchNeuron's ``backend="neuron"``; Inductor has no code generation for an out-of-tree
        device), else Inductor."""
        from torch._dynamo import list_backends

        return self.device_type if self.device_type in list_backends(exclude_tags=()) else "inductor"


register_family("device:", lambda device_type, build, imports: DeviceTarget(build, device_type=device_type, imports=imports))
