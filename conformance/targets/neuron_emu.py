"""``neuron-emu``: the emulated TorchNeuron device (package ``neuron_emu``).

Native vs fallback comes from the device's own runtime tracking (as with torch-neuronx's
``get_fallback_ops``/``get_executed_ops``), never from the build manifest.

Like the real device, the emulator re-runs a failed device execution on the CPU by default, so a
broken kernel looks like an op that falls back. The target surfaces those errors: it sets the
device's documented switch (:data:`SURFACE_ERRORS`) in every process it runs in, unless the
environment already sets it (``=0`` measures what a user sees with recovery on); an item that
fails on the device says so in ``proof.recovery``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .base import Dispatched, OpTrace, Target, TargetError, register


#: The device's switch that makes a failed execution raise instead of recovering on the CPU (the
#: real device's TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS, with the emulator's prefix).
SURFACE_ERRORS = "NEURON_EMU_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS"


def _surfacing() -> bool:
    return os.environ.get(SURFACE_ERRORS, "").strip().lower() in ("1", "true", "yes", "on")


@register
class NeuronEmuTarget(Target):
    name = "neuron-emu"
    description = "emulated AWS TorchNeuron device (PrivateUse1 'neuron') vs eager CPU"
    device = "neuron"

    def setup(self) -> None:
        os.environ.setdefault(SURFACE_ERRORS, "1")  # see the module doc
        self.recovery = (f"with the device's default recovery ({SURFACE_ERRORS} unset) a user sees this op run, "
                         "on the CPU and slower, not this error" if _surfacing() else None)
        try:
            import neuron_emu
        except ImportError as exc:  # the extension build failed or the package is absent
            raise TargetError(f"target 'neuron-emu' cannot load the emulator: {exc}") from exc
        self._emu = neuron_emu
        self.build_spec = self.ref.spec  # a name or a manifest path
        try:
            build = (neuron_emu.active_build() if self.ref.is_default
                     else neuron_emu.use_build(self.ref.spec))
        except (ValueError, FileNotFoundError) as exc:
            raise TargetError(str(exc)) from exc
        self.build = build.name

    @classmethod
    def preload(cls) -> None:
        with contextlib.suppress(Exception):  # a worker for another target does not need it
            import neuron_emu  # noqa: F401  (registers the device; workers choose their build)

    @classmethod
    def published_claims(cls, build: str) -> Path | None:
        """The emulated vendor's compatibility table of a shipped build (beside its manifest)."""
        try:
            from neuron_emu.manifest import BUILDS_DIR
        except ImportError:
            return None
        path = BUILDS_DIR / f"{build}.compat.md"
        return path if path.is_file() else None

    @classmethod
    def available_builds(cls) -> tuple[str, ...]:
        import neuron_emu

        return tuple(neuron_emu.shipped_builds())

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "emulated": True,
                "recovery": "surfaced" if _surfacing() else "on: a failed device execution re-runs on the CPU unseen"}

    def _ensure_active(self) -> None:
        """The emulated device runs one build per process (as a real device runs one SDK): when
        another target object switched it since (two builds in one process: tests, audits), this
        one switches it back before running anything, instead of running on the other build."""
        if self._emu.active_build().name != self.build:
            self._emu.use_build(self.build_spec)

    # Every way onto the device makes this target's build the active one first: the runs outside
    # an op trace (a contract's second call, an untraced re-run, a model's localization) too.
    def to_device(self, value: Any) -> Any:
        self._ensure_active()
        return super().to_device(value)

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        self._ensure_active()
        return super().wrap(fn)

    @contextlib.contextmanager
    def trace(self) -> Iterator[OpTrace]:
        emu = self._emu
        self._ensure_active()
        emu.clear_op_tracking()
        trace = OpTrace()
        try:
            with Dispatched(trace):
                yield trace
        finally:
            fallback = set(emu.get_fallback_ops())
            trace.fallback = fallback
            trace.native = set(emu.get_executed_ops()) - fallback

    def dist_backend(self) -> str | None:
        """The emulator's c10d backend ("neuron"), registered for the device as an out-of-tree
        backend registers itself."""
        from neuron_emu import distributed

        distributed.register()
        return "neuron"

    def repro_setup(self) -> tuple[str, str]:
        spec = self.build_spec or self.build
        if spec.endswith(".toml"):
            spec = str(Path(spec).resolve())
        # the sweep surfaces a failed device execution instead of letting the device recover on the
        # CPU unseen (setup); so does the script, or it would pass where the item failed
        surface = (f"import os\nos.environ.setdefault({SURFACE_ERRORS!r}, '1')  # as the sweep ran: no silent "
                   "CPU recovery\n" if _surfacing() else "")
        return f"{surface}import neuron_emu\nneuron_emu.use_build({spec!r})", "{fn}"

    def compile_backend(self) -> str:
        return "neuron"
