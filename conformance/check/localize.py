"""Where inside one item the target goes wrong: the item's device call run again under a dispatch
mode that also runs every ATen call the device is handed on the CPU, with the same inputs (the
device's own, copied), and scores how far the device's output is from the CPU's.

An OpInfo item reaches several kernels (``linear`` is ``t`` + ``addmm``; a loss is a dozen); when
its values mismatch, the run-wide blame of :mod:`conformance.triage.causes` can only guess which
of them is wrong from which overloads fail most across the run. This asks the item itself: each
kernel is scored alone, on the inputs it was really given, so an error that entered upstream is
not charged to the kernels downstream (the *local* error of :mod:`conformance.models.localize`,
without tracing a graph). Device-generic: it compares what the target returns with what the CPU
returns for one call, and never asks the device what it supports.

A score is the worst element's ``|device - cpu| / (atol + rtol * |cpu|)`` with the default
tolerances of the call's output dtype (``torch.testing``'s): above 1, the kernel alone is out of
tolerance. A double-precision call that scores above 0 is also computed in single precision on
the CPU (``single``): a kernel that errs no more than that is what a device computing double in
single precision gives, one that errs more is wrong by itself. A differing NaN pattern, shape or dtype, or any integer/bool difference, scores
:data:`WRONG`. Calls the CPU cannot run, random ops and calls on no device tensor are not scored;
views score 0 (they compute nothing), so do allocations, whose values are undefined:
:func:`conformance.triage.causes.blame` leaves those out by name.

Example::

    >>> import torch
    >>> from conformance.targets import get_target
    >>> t = get_target("cpu")
    >>> x = torch.randn(8)
    >>> locate(t, lambda: torch.exp(x.to(t.device)) * 2)["scores"]
    {'aten::exp.default': 0.0, 'aten::mul.Tensor': 0.0}
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.testing._comparison import default_tolerances
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from conformance.targets import Target
from conformance.targets.base import overload_name

#: The score of an output that is wrong beyond measure: another shape, dtype or NaN pattern, or
#: any difference in an integer or bool result.
WRONG = 1e30
#: Overloads scored in the stored locus (the highest ones; the rest only counted).
KEPT = 8


def _to_cpu(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", copy=True) if x.device.type != "cpu" else x.detach().clone()
    return x


def _score(dev: Any, cpu: Any) -> float | None:
    """How far one device output is from the CPU's (None: nothing comparable)."""
    if isinstance(dev, torch.Tensor) and isinstance(cpu, torch.Tensor):
        if dev.layout != torch.strided or cpu.layout != torch.strided or dev.is_quantized or cpu.is_quantized:
            return None
        if dev.shape != cpu.shape or dev.dtype != cpu.dtype:
            return WRONG
        d, c = dev.detach().to("cpu"), cpu.detach()
        if d.numel() == 0:
            return 0.0
        if not (c.is_floating_point() or c.is_complex()):
            return 0.0 if torch.equal(d, c) else WRONG
        rtol, atol = default_tolerances(c)
        wide = torch.complex128 if c.is_complex() else torch.float64
        d, c = d.to(wide), c.to(wide)
        dn, cn = torch.isnan(d), torch.isnan(c)
        if not torch.equal(dn, cn):
            return WRONG
        both = dn | (d == c)  # NaN with NaN, inf with the same inf
        diff = torch.where(both, 0, (d - c).abs())
        if not torch.isfinite(diff).all():
            return WRONG
        return float((diff / (atol + rtol * c.abs())).max())
    if isinstance(dev, (bool, int)) and isinstance(cpu, (bool, int)):
        return 0.0 if dev == cpu else WRONG
    if isinstance(dev, (float, int)) and isinstance(cpu, (float, int)):
        if math.isnan(dev) or math.isnan(cpu):
            return 0.0 if math.isnan(dev) and math.isnan(cpu) else WRONG
        return abs(dev - cpu) / (1e-5 + 1.3e-6 * abs(cpu)) if dev != cpu else 0.0
    return None


def _written(func: torch._ops.OpOverload) -> list[int]:
    """Positions of the arguments the overload writes (in-place, out=)."""
    return [i for i, a in enumerate(func._schema.arguments) if a.alias_info is not None and a.alias_info.is_write]


def _is_view(func: torch._ops.OpOverload) -> bool:
    s = func._schema
    return (not _written(func) and bool(s.returns)
            and all(r.alias_info is not None and not r.alias_info.is_write for r in s.returns))


class Differential(TorchDispatchMode):
    """Runs each ATen call handed to ``device`` on the device and, on copies of the same inputs,
    on the CPU; keeps each overload's worst score (:func:`_score`) and how many calls it had."""

    def __init__(self, device: torch.device | str) -> None:
        super().__init__()
        self.device_type = torch.device(device).type
        self.key = getattr(torch._C.DispatchKey, torch._C._dispatch_key_for_device(self.device_type))
        self.scores: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.single: dict[str, float] = {}  # double-precision calls: the single-precision twin's score
        self._open: set[torch._ops.OpOverload] = set()  # composites being run through their calls

    def _composite(self, func: torch._ops.OpOverload) -> torch._C.DispatchKey | None:
        """The composite kernel the device runs for ``func`` (None: the device has its own)."""
        if func.has_kernel_for_dispatch_key(self.key):
            return None
        for key in (torch._C.DispatchKey.CompositeExplicitAutograd, torch._C.DispatchKey.CompositeImplicitAutograd):
            if func.has_kernel_for_dispatch_key(key):
                return key
        return None

    def _on_device(self, flat: list[Any]) -> bool:
        return any(isinstance(x, torch.Tensor) and x.device.type == self.device_type for x in flat)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        flat, _ = tree_flatten((args, kwargs))
        if not self._on_device(flat) or _random(func, args, kwargs):
            return func(*args, **kwargs)
        composite = self._composite(func) if func not in self._open else None
        if composite is not None:
            # no kernel of the device's own: the device runs PyTorch's composite one, whose calls
            # are the device's kernels; they are scored, under this mode again (a composite that
            # calls its own op again is scored whole there)
            self._open.add(func)
            try:
                with self:
                    return func._op_dk(composite, *args, **kwargs)
            finally:
                self._open.discard(func)
        name = overload_name(func)
        if _is_view(func):
            self.scores.setdefault(name, 0.0)
            self.calls[name] = self.calls.get(name, 0) + 1
            return func(*args, **kwargs)
        cpu_args, cpu_kwargs = tree_map(_to_cpu, (args, kwargs))
        cpu_args, cpu_kwargs = tree_map(
            lambda v: torch.device("cpu") if isinstance(v, torch.device) else v, (cpu_args, cpu_kwargs))
        if "device" in cpu_kwargs and isinstance(cpu_kwargs["device"], str):
            cpu_kwargs["device"] = "cpu"
        out = func(*args, **kwargs)
        cpu_func, cpu_args, cpu_kwargs = _on_the_cpu(func, cpu_args, cpu_kwargs)
        double = any(isinstance(x, torch.Tensor) and x.dtype in _SINGLE for x in flat)
        # the single-precision twin's inputs, copied before an in-place call changes them
        narrowed = tree_map(_narrow, (cpu_args, cpu_kwargs)) if double else None
        try:
            ref = cpu_func(*cpu_args, **cpu_kwargs)
        except Exception:  # noqa: BLE001 - the CPU cannot run this call as the device was handed it
            return out
        pairs = list(zip(tree_flatten(out)[0], tree_flatten(ref)[0], strict=False))
        written = _written(func)
        names = [a.name for a in func._schema.arguments]
        for i in written:  # what an in-place or out= call wrote, where it returns nothing
            got = args[i] if i < len(args) else kwargs.get(names[i])
            want = cpu_args[i] if i < len(cpu_args) else cpu_kwargs.get(names[i])
            pairs += list(zip(tree_flatten(got)[0], tree_flatten(want)[0], strict=False))
        worst = _worst(pairs)
        if worst is not None:
            self.scores[name] = max(self.scores.get(name, 0.0), worst)
            self.calls[name] = self.calls.get(name, 0) + 1
            if worst > 0 and narrowed is not None:
                single = self._single(cpu_func, *narrowed, ref)
                if single is not None:
                    self.single[name] = max(self.single.get(name, 0.0), single)
        return out

    def _single(self, func: torch._ops.OpOverload, args: Any, kwargs: Any, ref: Any) -> float | None:
        """The score of the call computed in single precision on the CPU (``args``, ``kwargs``:
        its double-precision tensors narrowed; the results widened back): what a device that
        computes double in single precision gets wrong at this kernel, for comparison with what it
        does get wrong."""
        try:
            got = func(*args, **kwargs)
        except Exception:  # noqa: BLE001 - no single-precision kernel: nothing to compare with
            return None
        refs = tree_flatten(ref)[0]
        outs = tree_flatten(got)[0]
        if len(refs) != len(outs):
            return None
        wide = [o.to(r.dtype) if isinstance(o, torch.Tensor) and isinstance(r, torch.Tensor) else o
                for o, r in zip(outs, refs, strict=True)]
        return _worst(list(zip(wide, refs, strict=True)))


def _on_the_cpu(func: torch._ops.OpOverload, args: Any, kwargs: Any) -> tuple[Any, Any, Any]:
    """The CPU's call for a device call: the same one, except for the hooks PyTorch gives an
    out-of-tree device for convolution (``*_overrideable``, no CPU kernel), whose CPU counterpart
    is the convolution they stand for."""
    aten = torch.ops.aten
    if func is aten.convolution_overrideable.default:
        return aten.convolution.default, args, kwargs
    if func is aten.convolution_backward_overrideable.default and not kwargs:
        grad_output = args[0]
        # convolution_backward takes the bias's sizes (its gradient sums grad_output over all but
        # the channel dimension) where the hook takes none
        return aten.convolution_backward.default, (*args[:3], [grad_output.shape[1]], *args[3:]), kwargs
    return func, args, kwargs


#: Double-precision dtypes and their single-precision twins.
_SINGLE = {torch.float64: torch.float32, torch.complex128: torch.complex64}


def _random(func: torch._ops.OpOverload, args: Any, kwargs: Any) -> bool:
    """Whether the call draws random numbers: a seeded-nondeterministic overload, unless its dropout
    probability is zero (attention kernels are tagged for their dropout; at ``dropout_p=0`` they are
    deterministic, and the attention of every model in inference is such a call)."""
    if torch.Tag.nondeterministic_seeded not in func.tags:
        return False
    names = [a.name for a in func._schema.arguments]
    if "dropout_p" not in names:
        return True
    i = names.index("dropout_p")
    p = args[i] if i < len(args) else kwargs.get("dropout_p", func._schema.arguments[i].default_value)
    return not (isinstance(p, (int, float)) and p == 0)


def _narrow(x: Any) -> Any:
    return x.to(_SINGLE[x.dtype]) if isinstance(x, torch.Tensor) and x.dtype in _SINGLE else x


def _worst(pairs: list[tuple[Any, Any]]) -> float | None:
    worst = None
    for d, c in pairs:
        s = _score(d, c)
        if s is not None:
            worst = s if worst is None else max(worst, s)
    return worst


def locate(target: Target, call: Callable[[], Any]) -> dict[str, Any] | None:
    """Run ``call`` (the item's device side, placing its sample on the device itself) under
    :class:`Differential`: ``{"scores": {overload: worst score}, "calls": n}`` with the
    :data:`KEPT` highest-scoring overloads (a tie by name), the double-precision ones' ``single``
    scores, and the seconds it took (``seconds``); None when the call raised (the
    target is not deterministic in what it accepts: nothing to localise)."""
    mode = Differential(target.device)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with mode:
                call()
                target.synchronize()
        except Exception:  # noqa: BLE001 - a re-run that raises localises nothing
            return None
    top = sorted(mode.scores.items(), key=lambda kv: (-kv[1], kv[0]))[:KEPT]
    found: dict[str, Any] = {"scores": {k: _rounded(v) for k, v in sorted(top)}, "calls": sum(mode.calls.values()),
                             "seconds": round(time.perf_counter() - t0, 4)}
    single = {k: _rounded(mode.single[k]) for k, _ in top if k in mode.single}
    if single:
        found["single"] = dict(sorted(single.items()))
    return found


def _rounded(v: float) -> float:
    return round(v, 3) if v < WRONG else WRONG
