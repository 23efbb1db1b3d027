"""The Target protocol and the registry of targets.

A real device package is one class away: subclass :class:`Target`, set ``name``, implement
``setup`` and (if the device tracks it) ``trace``, and decorate it with :func:`register`.

Example::

    >>> from conformance.targets import get_target
    >>> t = get_target("cpu")
    >>> t.device, t.build
    ('cpu', '-')
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from conformance.structure import map_tensors


class TargetError(ValueError):
    """Unknown target, unusable build, or a target that cannot run on this machine."""


class TargetUnsupported(Exception):  # noqa: N818 - the status it leads to is ``unsupported``
    """The target refuses an item before running it: an exporter cannot convert the sample (its
    reason is the message). :func:`conformance.check.verdict.decide` makes it ``unsupported``, apart
    from a runtime ``error`` and a wrong result (``mismatch``)."""


@dataclass
class OpTrace:
    """Overloads one execution reached: ``dispatched`` (seen by a dispatch mode below autograd
    and composite-implicit decompositions), and the device's own split into ``native`` and
    ``fallback`` where the device tracks it."""

    native: set[str] = field(default_factory=set)
    fallback: set[str] = field(default_factory=set)
    dispatched: set[str] = field(default_factory=set)

    @property
    def reached(self) -> set[str]:
        return self.native | self.fallback | self.dispatched


@dataclass
class Compiled:
    """What a compiler target's backend compiled for one item: the proof that it did not run eager.

    ``graphs`` counts the graphs handed to the backend, ``frames`` the frames dynamo converted,
    ``graph_ops`` the ATen overloads in the compiled graphs and ``fallback_kernels`` those of
    them the backend did not lower (it calls the ATen kernel). ``backend_ran`` counts the parts
    of the graphs the backend ran itself, for a backend that runs some parts of a graph and hands
    the rest back to PyTorch (OpenVINO's subgraphs); 0 says that nothing of the item ran on the
    backend. The report counts those items apart (``opdb.queries_counts.backend_share``: where a
    target leaves it None, every graph op being a fallback kernel says the same)."""

    backend: str
    graphs: int = 0
    frames: int = 0
    graph_breaks: int = 0
    break_reasons: list[str] = field(default_factory=list)  # first line of each graph-break reason
    graph_ops: set[str] = field(default_factory=set)
    fallback_kernels: set[str] = field(default_factory=set)
    compile_s: float = 0.0
    backend_ran: int | None = None  # parts of the graphs the backend ran itself (None: not counted)
    # the backend's own evidence (JSON values): an exported model's node count and op types, the
    # runtime that ran it, subgraphs a partitioning backend ran itself
    extra: dict[str, Any] = field(default_factory=dict)

    def evidence(self) -> dict[str, Any]:
        return {"backend": self.backend, "graphs": self.graphs, "frames": self.frames,
                "graph_breaks": self.graph_breaks, "break_reasons": self.break_reasons[:5], "graph_ops": sorted(self.graph_ops),
                "fallback_kernels": sorted(self.fallback_kernels), "compile_s": round(self.compile_s, 4),
                **({} if self.backend_ran is None else {"backend_ran": self.backend_ran}), **self.extra}


def overload_name(op: torch._ops.OpOverload) -> str:
    """``aten::sin.default`` for ``torch.ops.aten.sin.default`` (the form traces record)."""
    return f"{op.namespace}::{op._schema.name.split('::', 1)[1]}.{op._overloadname}"


class Dispatched(TorchDispatchMode):
    """Records every aten overload dispatched below autograd into ``trace.dispatched``."""

    def __init__(self, trace: OpTrace) -> None:
        super().__init__()
        self.trace = trace

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        if func.namespace == "aten":
            self.trace.dispatched.add(overload_name(func))
        return func(*args, **(kwargs or {}))


@dataclass(frozen=True)
class BuildRef:
    """Which build of a target is asked for: a build name (``2.33.0``), a manifest path
    (``builds/x.toml``), or the target's default (``spec`` None). Where a label is stored for
    the default (``runs.build``, a nightly's build list) it reads ``-``.

    >>> BuildRef.parse("-").is_default, str(BuildRef()), str(BuildRef.parse("2.33.0"))
    (True, '-', '2.33.0')
    """

    spec: str | None = None

    DEFAULT_LABEL: ClassVar[str] = "-"

    @classmethod
    def parse(cls, text: str | BuildRef | None) -> BuildRef:
        if isinstance(text, BuildRef):
            return text
        return cls(None if text in (None, "", cls.DEFAULT_LABEL) else text)

    @property
    def is_default(self) -> bool:
        return self.spec is None

    def resolved(self) -> BuildRef:
        """A manifest path made absolute (a resumed run or a worker elsewhere finds it)."""
        if self.spec is not None and self.spec.endswith(".toml"):
            return BuildRef(str(Path(self.spec).resolve()))
        return self

    def __str__(self) -> str:
        return self.spec or self.DEFAULT_LABEL


class Target:
    """Base class: places inputs, runs callables, synchronizes, and traces dispatch."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    device: str = "cpu"
    # A compiler target: ``wrap`` compiles, and every item must prove a compiled graph
    # (:meth:`compiled`). Its op trace is taken on a separate eager run, because under an
    # active dispatch mode ``torch.compile`` silently runs eager.
    compiler: ClassVar[bool] = False
    # The contract checks run unless ``--contracts`` names others (None: every contract on an
    # eager target, ``conformance.check.contracts.COMPILER_DEFAULT`` on a compiler target). A target
    # whose results cannot carry a contract leaves it out (an ONNX value has no strides).
    default_contracts: ClassVar[tuple[str, ...] | None] = None
    # A compiler target whose one compiled graph can run many samples of an op x dtype, each
    # item taking its own result from it (:mod:`conformance.check.batching`); its evidence must let
    # :meth:`batch_problem` tell that every sample was compiled.
    batchable: ClassVar[bool] = False
    # Samples per batch unless ``--compile-batch`` says otherwise (1: batch only when asked, on a
    # target where batches were measured not to pay).
    default_batch: ClassVar[int] = 16
    # A device documented to re-run a failed execution on the CPU by default ("silent
    # recovery"), whose errors this target surfaces: what a user sees instead of an item's device
    # error, recorded with it (``proof.recovery``); None for a device that does not recover.
    recovery: str | None = None

    def __init__(self, build: str | BuildRef | None = None) -> None:
        self.ref = BuildRef.parse(build)  # what was asked for
        self.build = str(self.ref)  # its name once set up (a target resolves its default's name)

    @classmethod
    def published_claims(cls, build: str) -> Path | None:
        """The compatibility table (Markdown, ``conformance claims``) the device's vendor
        publishes for ``build``, where this target ships one; None otherwise."""
        return None

    # -- life cycle ------------------------------------------------------------------
    def setup(self) -> None:
        """Import and initialise the device; raise TargetError if it cannot run here."""

    def describe(self) -> dict[str, Any]:
        return {"target": self.name, "build": self.build, "device": self.device,
                "torch": torch.__version__}

    # -- execution -------------------------------------------------------------------
    def to_device(self, value: Any) -> Any:
        """``value`` with its tensors on the device (caches and ModelOutputs walked: conformance.structure)."""
        return map_tensors(lambda x: x.to(self.device), value)

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """The callable as the target runs it (eager by default; compiled for inductor)."""
        return fn

    def compiled(self) -> Compiled | None:
        """What the backend compiled since the last :meth:`wrap` (None: not a compiler target)."""
        return None

    def use_own_rng(self, own: bool) -> None:
        """Whether the next items' random ops may draw from the target's own random number
        generator (``own``: a random OpInfo, compared by distribution) or must draw what eager
        PyTorch draws from the same seed (a deterministic op that calls a random one inside, e.g.
        attention with dropout: compared value by value), where the target can choose. Default:
        nothing to choose (an eager device draws from its own generator either way)."""

    @contextlib.contextmanager
    def standing_for(self, record: Compiled | None) -> Iterator[None]:
        """Inside the block ``record`` is the target's latest compile (what :meth:`trace` reads
        for fallback): the compiled batch an item's result came from, which later batches and
        alone re-runs have since replaced. Default: nothing to restore."""
        yield

    def batch_problem(self, record: Compiled) -> str | None:
        """Why a batch's compiled call cannot stand for each of its samples (None: it can): it
        must have compiled exactly one graph and broken none, so that no sample's call ran eager
        between graphs."""
        if record.graphs != 1 or record.graph_breaks:
            return (f"{record.graphs} graphs, {record.graph_breaks} graph breaks"
                    + (f" ({'; '.join(record.break_reasons[:2])})" if record.break_reasons else ""))
        return None

    def synchronize(self) -> None:
        """Wait for queued device work (no-op for synchronous devices)."""

    def dist_backend(self) -> str | None:
        """The ``torch.distributed`` backend for this device (registered first where the device
        package registers one on request), or None where the device has none. Default: the
        backend torch maps the device type to (``Backend.default_device_backend_map``: gloo for
        the CPU, nccl for CUDA, an out-of-tree backend that registered itself for the type)."""
        import torch.distributed as dist

        if not dist.is_available():
            return None
        return dist.Backend.default_device_backend_map.get(torch.device(self.device).type)

    @contextlib.contextmanager
    def trace(self) -> Iterator[OpTrace]:
        """Record the overloads one execution reaches. Default: a dispatch mode; every overload
        that ran counts as native (the device has no fallback tracking to say otherwise)."""
        trace = OpTrace()
        with Dispatched(trace):
            yield trace
        trace.native = set(trace.dispatched)

    def probe_layouts(self) -> dict[str, str | None]:
        """Which tensor layouts the device holds: a small tensor of each layout goes to the
        device and back and must come back equal. ``None`` when it did, else the error. The
        coverage table uses this to say "needs a layout the target lacks" from evidence."""
        import warnings

        out: dict[str, str | None] = {}
        x = torch.arange(1.0, 5.0).reshape(2, 2)
        for layout, (make, dense) in LAYOUT_PROBES.items():
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # beta/prototype-layout warnings
                    back = self.to_device(make(x)).to("cpu")
                    self.synchronize()
                    out[layout] = None if torch.equal(dense(back), x) else "came back with different values"
            except Exception as exc:  # noqa: BLE001 - any failure means the layout is not held
                out[layout] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        return out

    @classmethod
    def available_builds(cls) -> tuple[str, ...]:
        """Builds this target can be run with, oldest first (empty: just the installed one)."""
        return ()

    @classmethod
    def preload(cls) -> None:
        """Import this target's device package ahead of time, if it is installed (the workers'
        fork server calls it, so forked workers start with the device registered). Never raises."""

    def repro_setup(self) -> tuple[str, str]:
        """Python source a standalone repro script runs first, and how it wraps ``{fn}`` (a
        placeholder replaced as it is: the rest of the text is Python, braces included)."""
        return "", "{fn}"

    def compile_backend(self) -> str | Callable[..., Any]:
        """The ``torch.compile`` backend that targets this device."""
        return "inductor"

    def __repr__(self) -> str:
        return f"get_target({self.name!r}, build={self.build!r})"


def _nested(x: torch.Tensor) -> torch.Tensor:
    return torch.nested.nested_tensor([x[0], x[1]])


# layout -> (make one from a dense 2x2 tensor, turn it back into that dense tensor)
LAYOUT_PROBES: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]] = {
    "sparse": (lambda x: x.to_sparse(), lambda y: y.to_dense()),
    "sparse_csr": (lambda x: x.to_sparse_csr(), lambda y: y.to_dense()),
    "quantized": (lambda x: torch.quantize_per_tensor(x, 1.0, 0, torch.quint8), lambda y: y.dequantize()),
    "nested": (_nested, lambda y: torch.stack(y.unbind())),
    "mkldnn": (lambda x: x.to_mkldnn(), lambda y: y.to_dense()),
}

REGISTRY: dict[str, type[Target]] = {}


def register(cls: type[Target]) -> type[Target]:
    if not cls.name:
        raise TypeError(f"{cls.__name__} needs a name")
    REGISTRY[cls.name] = cls
    return cls


# Families of targets named by a prefix and a parameter (``device:TYPE``): prefix -> a maker
# of the target from (the parameter, the build asked for, the modules imported).
FAMILIES: dict[str, Callable[[str, str | BuildRef | None, tuple[str, ...]], Target]] = {}


def register_family(prefix: str, make: Callable[[str, str | BuildRef | None, tuple[str, ...]], Target]) -> None:
    FAMILIES[prefix] = make


def get_target(name: str, build: str | BuildRef | None = None, imports: tuple[str, ...] = (),
               env: tuple[str, ...] = ()) -> Target:
    """Instantiate and set up the target ``name`` (``neuron-emu``, ``inductor``, ``cuda``, ``cpu``,
    or ``device:TYPE``), after setting the environment variables ``env`` (``--env NAME=VALUE``: a
    device runtime's switches, read when its package loads or runs) and importing the modules
    ``imports`` (``--import``: what registers a device with torch)."""
    load_builtin()
    set_env(env)
    import_modules(imports)
    family = next((p for p in FAMILIES if name.startswith(p)), None)
    if family is not None:
        target = FAMILIES[family](name[len(family):], build, tuple(imports))
    elif name not in REGISTRY:
        families = "".join(f", or {p}TYPE" for p in sorted(FAMILIES))
        raise TargetError(f"unknown target {name!r}; known targets: {', '.join(sorted(REGISTRY))}{families} "
                          "(device:TYPE: any device type torch knows, with --import MODULE)")
    else:
        target = REGISTRY[name](build)
    target.setup()
    return target


def set_env(pairs: tuple[str, ...] | list[str]) -> None:
    """Set each ``NAME=VALUE`` of ``--env`` in this process (a worker sets them itself)."""
    import os

    for pair in pairs:
        name, eq, value = pair.partition("=")
        if not eq or not name:
            raise TargetError(f"--env {pair!r}: expected NAME=VALUE")
        os.environ[name] = value


def import_modules(names: tuple[str, ...] | list[str]) -> None:
    """Import each module named by ``--import`` (a device package registers its device type with
    torch on import). One that is missing or fails is a :class:`TargetError` naming it."""
    import importlib

    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - ImportError, or the package's own failure on import
            head = (str(exc).strip().splitlines() or [""])[0][:300]
            raise TargetError(f"--import {name!r}: cannot import it: {type(exc).__name__}: {head}") from None


def load_builtin() -> None:
    from . import cpu, cuda, inductor, neuron_emu, onnx_runtime, openvino_compile  # noqa: F401  (registration side effects)
