"""Registers the ``neuron`` PrivateUse1 device with PyTorch: backend name, tensor/module methods,
the ``torch.neuron`` device module (availability, RNG, the synchronous device's streams and events)
and the autocast dtypes.

Example::

    >>> import torch, neuron_emu
    >>> torch.neuron.is_available(), torch.neuron.device_count()
    (True, 1)
    >>> torch.neuron.manual_seed(0)
    >>> a = torch.randn(3, device="neuron"); torch.neuron.manual_seed(0)
    >>> bool((a == torch.randn(3, device="neuron")).all())
    True
"""

from __future__ import annotations

import types

import torch

from ._build import load_extension

_registered = False


def _ext():
    return load_extension()


def is_available() -> bool:
    """The emulated device is always available."""
    return True


def device_count() -> int:
    """One emulated NeuronCore."""
    return 1


def current_device() -> int:
    return 0


def set_device(device) -> None:  # noqa: ARG001 - single device
    idx = torch.device(device).index if not isinstance(device, int) else device
    if idx not in (None, 0):
        raise RuntimeError(f"neuron: invalid device index {idx} (device_count() == 1)")


def synchronize(device=None) -> None:  # noqa: ARG001 - execution is synchronous
    return None


def is_initialized() -> bool:
    return True


def _is_in_bad_fork() -> bool:
    return False


def _lazy_init() -> None:
    return None


def default_generator() -> torch.Generator:
    """The CPU generator that backs the neuron default generator (shared state)."""
    return _ext().default_twin()


def manual_seed(seed: int) -> None:
    """Seeds the neuron default generator."""
    default_generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    manual_seed(seed)


def seed() -> None:
    default_generator().seed()


def seed_all() -> None:
    seed()


def initial_seed() -> int:
    return default_generator().initial_seed()


def get_rng_state(device="neuron") -> torch.Tensor:  # noqa: ARG001
    return default_generator().get_state()


def set_rng_state(new_state: torch.Tensor, device="neuron") -> None:  # noqa: ARG001
    default_generator().set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state()]


def set_rng_state_all(states) -> None:
    set_rng_state(states[0])


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16]


def is_autocast_enabled() -> bool:
    return torch.is_autocast_enabled("neuron")


def set_autocast_enabled(enabled: bool) -> None:
    torch.set_autocast_enabled("neuron", enabled)


def get_autocast_dtype() -> torch.dtype:
    return torch.get_autocast_dtype("neuron")


def set_autocast_dtype(dtype: torch.dtype) -> None:
    torch.set_autocast_dtype("neuron", dtype)


def is_bf16_supported() -> bool:
    return True


# ------------------------------------------------------------------ streams and events
# The device executes synchronously, in program order, on one queue: every stream is that queue
# (stream 0, what the C++ device guard reports), waits and event records are no-ops, and every
# event is complete.  Code written for an asynchronous accelerator asks the device module for
# these -- FSDP2 (``fully_shard``) makes its all-gather and reduce-scatter streams with
# ``torch.<device>.Stream(priority=-1)``, records ``torch.<device>.Event()``s and enters
# ``torch.<device>.stream(s)`` -- and without them fails with "module 'torch.neuron' has no
# attribute 'Stream'".  The guard cannot create streams (``torch.Stream("neuron")`` raises
# "Backend doesn't support create a new Stream"), so these name stream 0 by its ids.
_PRIVATEUSE1 = 20  # c10::DeviceType::PrivateUse1


class Stream(torch.Stream):
    """A stream of the synchronous device: the one queue (stream 0) whatever is asked for."""

    def __new__(cls, device=None, priority: int = 0, **kwargs):  # noqa: ARG004 - one queue
        if device is not None:
            set_device(device)   # validates the index
        return super().__new__(cls, stream_id=0, device_index=0, device_type=_PRIVATEUSE1)

    def record_event(self, event=None) -> Event:
        event = Event() if event is None else event
        event.record(self)
        return event

    def __repr__(self) -> str:
        return "torch.neuron.Stream(device=neuron:0, stream_id=0)"


class Event(torch.Event):
    """An event of the synchronous device: complete as soon as it is recorded (or before)."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        return super().__new__(cls, device="neuron", enable_timing=enable_timing, blocking=blocking,
                               interprocess=interprocess)

    def synchronize(self) -> None:   # the guard has no event to wait for: the work is done
        return None

    def query(self) -> bool:
        return True


def current_stream(device=None) -> Stream:
    if device is not None:
        set_device(device)
    return Stream()


def default_stream(device=None) -> Stream:
    return current_stream(device)


def set_stream(stream) -> None:  # noqa: ARG001 - one queue
    return None


class StreamContext:
    """``with torch.neuron.stream(s):`` -- work inside runs on the one queue, as everywhere."""

    def __init__(self, stream) -> None:
        self.stream = stream

    def __enter__(self):
        return self.stream

    def __exit__(self, *exc) -> None:
        return None


def stream(stream) -> StreamContext:
    return StreamContext(stream)


def _make_module() -> types.ModuleType:
    mod = types.ModuleType("torch.neuron", "Emulated TorchNeuron device module (neuron_emu).")
    for name in (
        "is_available device_count current_device set_device synchronize is_initialized _lazy_init "
        "_is_in_bad_fork "
        "default_generator manual_seed manual_seed_all seed seed_all initial_seed get_rng_state "
        "set_rng_state get_rng_state_all set_rng_state_all get_amp_supported_dtype "
        "is_autocast_enabled set_autocast_enabled get_autocast_dtype set_autocast_dtype "
        "is_bf16_supported Stream Event StreamContext current_stream default_stream set_stream stream"
    ).split():
        fn = globals()[name]
        setattr(mod, name, torch.compiler.disable(fn, recursive=True) if name in _RNG_STATE else fn)
    return mod


# Generator-state plumbing, which dynamo must never trace. A real device module's are C++ or in
# torch/ (dynamo skips both); these are Python. torch.testing's freeze_rng_state (around every
# random OpInfo, e.g. dropout) calls torch.<accelerator>.get/set_rng_state inside no_dispatch():
# traced there, the resume after the graph break at default_generator() made fake tensors with
# the Python dispatch key excluded, and torch.compile of dropout failed with "you set
# no_dispatch() before calling into this function" in any process that had imported the emulator.
_RNG_STATE = frozenset(
    "default_generator manual_seed manual_seed_all seed seed_all initial_seed get_rng_state "
    "set_rng_state get_rng_state_all set_rng_state_all".split())


_EXPLICIT = {
    "aten::_copy_from", "aten::_copy_from_and_resize", "aten::convolution_overrideable",
    "aten::convolution_backward_overrideable", "aten::mode.values", "aten::_efficientzerotensor",
}
# Composite kernels that call a DispatchStub with the device's own tensors (which has no stub
# kernel for PrivateUse1 and asserts): the device runs them as a direct CPU kernel instead.
_STUB_CALLERS = ("conj_physical_", "kaiser_window", "kaiser_window.periodic", "kaiser_window.beta",
                 "kaiser_window.out", "kaiser_window.periodic_out", "kaiser_window.beta_out")


def _direct_kernel_ops() -> list[str]:
    """ATen overloads with a real CPU kernel and no implicit decomposition: the device gets a
    direct kernel (the zero-copy fallback) for each, instead of a generic composite wrapper."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    out = []
    for name in torch._C._dispatch_get_all_op_names():
        if not name.startswith("aten::"):
            continue
        if (has(name, "CPU") and not has(name, "CompositeImplicitAutograd")
                and name not in _EXPLICIT):
            out.append(name[len("aten::"):])
    return out + [n for n in _STUB_CALLERS if n not in out]


def _sparse_kernel_ops(key: str) -> list[str]:
    """ATen overloads with a CPU kernel for the sparse dispatch key `key` (SparseCPU, SparseCsrCPU)."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return [n[len("aten::"):] for n in torch._C._dispatch_get_all_op_names()
            if n.startswith("aten::") and has(n, key)]


_PY_KERNELS: torch.library.Library | None = None


def _lazy_clone(self: torch.Tensor) -> torch.Tensor:
    # Copy-on-write needs a storage whose data pointer is its own context; the device's storages
    # that fallback kernels produce borrow a CPU storage and are not, so PyTorch's own kernel
    # fails ("Expected storage != nullptr"). A clone now is what a lazy clone is once written.
    return self.clone()


def _has_compatible_shallow_copy_type(self: torch.Tensor, src: torch.Tensor) -> bool:
    # ``var.data = t`` (``set_data``) and ``Module._apply`` ask whether `t`'s TensorImpl may replace
    # `var`'s.  c10 answers yes for dense tensors only among its own dense backends (CPU, CUDA,
    # XPU, ...) and leaves a PrivateUse1 backend to say so itself by this op (TensorImpl.h); without
    # it ``p.data = p.to("neuron")`` raised "incompatible tensor type", and FSDP2's fully_shard,
    # which moves a CPU-built module's parameters that way, could not shard onto the device.
    # Dense (strided) CPU and neuron tensors are interchangeable, as CPU and CUDA ones are; any
    # other pair must have the same dispatch keys, c10's own first rule.
    if (self.layout == torch.strided and src.layout == torch.strided
            and {self.device.type, src.device.type} <= {"cpu", "neuron"}):
        return True
    return torch._C._dispatch_keys(self) == torch._C._dispatch_keys(src)


def _register_python_kernels() -> None:
    """Device kernels written in Python: where PyTorch's own kernel for every backend assumes
    something of the storage that the emulated device does not give."""
    global _PY_KERNELS
    if _PY_KERNELS is None:
        _PY_KERNELS = torch.library.Library("aten", "IMPL")
        _PY_KERNELS.impl("_lazy_clone", _lazy_clone, "PrivateUse1")
        _PY_KERNELS.impl("_has_compatible_shallow_copy_type", _has_compatible_shallow_copy_type, "PrivateUse1")
        from .fused_rnn import KERNELS

        for name, kernel in KERNELS.items():  # no CPU kernel to fall back to (fused_rnn's doc)
            _PY_KERNELS.impl(name, kernel, "PrivateUse1")


def register() -> None:
    """Makes ``torch.device("neuron")`` usable.  Idempotent."""
    global _registered
    if _registered:
        return
    ext = _ext()
    ext.init_hooks()
    ext.register_kernels(_direct_kernel_ops())
    ext.register_sparse_kernels(_sparse_kernel_ops("SparseCPU"), _sparse_kernel_ops("SparseCsrCPU"))
    ext.fix_autograd_device_threads()  # a CPU backward may have run before this import
    _register_python_kernels()
    if torch._C._get_privateuse1_backend_name() != "neuron":
        torch.utils.rename_privateuse1_backend("neuron")
    if not hasattr(torch, "neuron"):
        torch._register_device_module("neuron", _make_module())
    if not hasattr(torch.Tensor, "neuron"):
        torch.utils.generate_methods_for_privateuse1_backend(
            for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
        )
    try:
        torch.set_autocast_dtype("neuron", torch.bfloat16)
    except Exception:  # pragma: no cover - older torch
        pass
    _registered = True
