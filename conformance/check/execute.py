"""Execute: one work item (OpInfo x variant x dtype x sample) on the CPU reference and on the
target, with a float64 arbiter computed on demand. Returns plain records; deciding is
:mod:`conformance.check.compare` and :mod:`conformance.check.verdict`'s job.

Example::

    >>> import torch
    >>> from conformance.check.execute import run_item
    >>> from conformance.inputs.opinfo import by_name, samples
    >>> from conformance.targets import get_target
    >>> info = by_name()["abs"]
    >>> s = next(samples(info, torch.float32))
    >>> out = run_item(get_target("cpu"), info, "function", s)
    >>> out.cpu_error is None and out.target_error is None
    True
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from conformance.inputs.opinfo import variant_fn
from conformance.targets import Target
from conformance.targets.base import Dispatched, OpTrace

from .compare import Meta, bitwise_equal, leaves
from .metacheck import OUT_OF_CONTRACT, contract_refusal
from .placement import (
    active_guards,
    clone_sample,
    cpu_args,
    guarded_inputs,
    leafify,
    on_cpu_where_wanted,
    on_device,
    outs_zeroed,
    to_cpu,
    unguarded,
)
from .refcache import SharedCpu, unchanged_sample
from .selfcheck import NOT_REPRODUCIBLE, WRITES_PAST, again_on_poisoned, undefined

_FLOAT_LOW = (torch.float32, torch.bfloat16, torch.float16)
#: Double precision and its single-precision twin (:func:`_twin`).
_DOUBLE = {torch.float64: torch.float32, torch.complex128: torch.complex64}


@dataclass
class Outcome:
    cpu: Any = None
    cpu_error: str | None = None
    target: Any = None  # copied back to the CPU
    target_error: str | None = None
    device_meta: list[Meta] = field(default_factory=list)
    native: tuple[str, ...] = ()
    fallback: tuple[str, ...] = ()
    reached: tuple[str, ...] = ()
    duration_s: float = 0.0
    arbiter: Callable[[], Any] | None = None
    arbiter_result: Any = None  # what the sweep got from ``arbiter`` (shared with the sample's other variants)
    # a double-precision sample computed on the CPU in single precision (None: not double)
    twin: Callable[[], Any] | None = None
    # the reference run again on poisoned memory (conformance.check.selfcheck):
    # ([results], the error of a run that raised)
    again: Callable[[], tuple[list[Any], str | None]] | None = None
    # Proof the target ran the item: "device" (of the outputs) and, on a compiler target,
    # what its backend compiled (Compiled.evidence()); stored as op_results.proof.
    proof: dict[str, Any] = field(default_factory=dict)
    # What the contract checks (:mod:`conformance.check.contracts`) look at: the result as it is on
    # the device, and each side's sample after the call (mutated in place where the op mutates).
    device_result: Any = None
    device_sample: Any = None
    cpu_sample: Any = None
    # the eager target's call once more, the sample placed as it was (None: a compiler target's,
    # or the call did not run): for localising a mismatch (conformance.check.localize)
    rerun: Callable[[], Any] | None = None

    @property
    def graphs(self) -> int | None:
        """Graphs the compiler target compiled for this item (None: not a compiler target)."""
        return self.proof.get("graphs")


_PHASE_HOOK: Callable[[str], None] | None = None


def set_phase_hook(hook: Callable[[str], None] | None) -> None:
    """Called with "cpu" / "target" as an item moves between sides, so a supervisor can tell a
    crash of the CPU reference (the sample is invalid: skip) from a crash on the target."""
    global _PHASE_HOOK
    _PHASE_HOOK = hook


def phase(name: str) -> None:
    if _PHASE_HOOK is not None:
        _PHASE_HOOK(name)


def err(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()
    head = msg[0] if msg else ""
    return f"{type(exc).__name__}: {head}"[:2000]


def out_like(value: Any, device: str | torch.device, sized: bool = False) -> Any:
    """Empty ``out=`` tensors for the result ``value`` (the kernel resizes them), or with its
    shapes when ``sized``; zeros of its shapes inside :func:`conformance.check.placement.zeroed_outs`."""
    def one(v: torch.Tensor) -> torch.Tensor:
        if outs_zeroed():
            return torch.zeros(v.shape, dtype=v.dtype, device=device)
        return torch.empty(v.shape if sized else 0, dtype=v.dtype, device=device)

    if isinstance(value, torch.Tensor):
        return one(value)
    if isinstance(value, (tuple, list)) and all(isinstance(v, torch.Tensor) for v in value):
        return tuple(one(v) for v in value)
    raise TypeError(f"cannot build out= tensors for {type(value).__name__}")


def invoke(fn: Callable[..., Any], variant: str, s: Any, device: str | torch.device, cpu_result: Any,
            sized_out: bool = False) -> Any:
    """Call ``fn`` on sample ``s``. ``sized_out``: ``out=`` tensors come with the result's shapes,
    for a compiler (dynamo breaks the graph on an ``out=`` it must resize, and runs it eager)."""
    if variant == "out":
        out = out_like(cpu_result, device, sized_out)
        ret = fn(s.input, *s.args, **s.kwargs, out=out)
        return out if ret is None else ret
    return fn(s.input, *s.args, **s.kwargs)


def run_item(target: Target, info: Any, variant: str, sample: Any, *, want_arbiter: bool = True,
             traced: bool = True, computed: Any = None, refs: Any = None, ref_hint: str | None = None,
             guard: bool = False, check_first: bool = False) -> Outcome:
    """Run one sample of one OpInfo variant on the CPU and on ``target``. ``traced=False`` runs
    the target's call outside its op trace (no overloads are named): for checking whether the
    trace itself changed the result (:func:`conformance.sweep.evaluate` does). ``computed``: on
    a compiler target, the sample's result from a compiled batch
    (:class:`conformance.check.batching.Computed`), taken instead of compiling the item on its own.
    ``refs``: a :class:`conformance.check.refcache.RefCache` holding the CPU side (the reference
    and the float64 arbiter) of samples seen before, found by ``ref_hint`` and the sample's content.
    ``guard``: the CPU reference runs on copies between guard regions (:func:`guarded_inputs`),
    and one that writes into them fails (:data:`conformance.check.selfcheck.WRITES_PAST`);
    with ``check_first`` too, the reference must also agree with itself
    (:func:`conformance.check.selfcheck.again_on_poisoned`) before the target runs, or the item
    fails on the CPU side ("the CPU reference is not reproducible: ...")."""
    fn = variant_fn(info, variant)
    if fn is None:
        return Outcome(cpu_error=f"OpInfo {info.name} has no {variant} variant")
    out = Outcome()
    shared = SharedCpu(refs, ref_hint, info, variant, sample, target.compiler)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        phase("cpu")

        def call() -> tuple[Any, Any]:
            # A copy: the call may change its inputs (in-place variants, batch norm's running
            # statistics), and the target must start from the sample as generated.
            s_cpu = on_device(sample, "cpu")
            ref = invoke(info.op, "function", s_cpu, "cpu", None) if variant == "out" else None
            # a compiler target's out= tensors come sized (below): the CPU gets the same kind, so
            # that the layouts compared are of one call (an empty out= is restrided by the kernel,
            # a sized one is kept: linalg.inv's result is column-major in one, row-major in the other)
            return invoke(fn, variant, s_cpu, "cpu", ref, sized_out=target.compiler), s_cpu

        def reference() -> tuple[Any, Any, str | None]:
            try:
                # guarded by the caller (a self-consistency re-run), or here when asked
                with guarded_inputs() if guard and active_guards() is None else contextlib.nullcontext():
                    guards = active_guards()
                    try:
                        got, s_cpu = call()
                    except Exception:
                        if guards is None:
                            raise
                        # a guarded copy's storage is numpy's: it cannot grow (resize_) nor be
                        # shared copy-on-write (_lazy_clone); such an op runs on a plain copy
                        guards = None
                        with unguarded():
                            got, s_cpu = call()
                if guards is not None and not guards.intact():
                    return None, None, WRITES_PAST
                return got, s_cpu, None
            except Exception as exc:  # noqa: BLE001 - the CPU reference failed: the item is skipped
                return None, None, err(exc)

        if guard and check_first and variant == "function":
            # a guarded item (the schema search's) is held to the op's meta kernel, PyTorch's
            # second statement of its contract (a helper's public namesake's too), before anything
            # runs: a CPU kernel given an input outside it may read past its own buffers (no guard
            # reaches there) and corrupt the worker's heap (_cholesky_solve_helper on a non-square
            # factor ended in SIGABRT once its inputs were refused only after the CPU ran them)
            placed = on_device(sample, "cpu")  # its device arguments named
            refused = contract_refusal(fn, placed.input, *placed.args, overload_=getattr(info, "packet", None),
                                       **placed.kwargs)
            if refused:
                out.cpu_error = f"{OUT_OF_CONTRACT} ({refused})"[:2000]
                return out
        out.cpu, out.cpu_sample, out.cpu_error = shared.get("cpu", reference, unchanged_sample(sample, lambda: on_device(sample, "cpu")))
        if out.cpu_error is not None:
            return out
        out.again = lambda: again_on_poisoned(reference, out.cpu)
        if guard and check_first:
            # a guarded item (the schema search's) is held to its reference's self-consistency
            # before the target runs: an input whose CPU result depends on what lies past it
            # (out of the op's contract) could make the target read or write out of bounds too,
            # and crash or corrupt the worker for no fault of its own
            runs, raised = out.again()
            out.again = lambda: (runs, raised)
            if raised is not None:
                out.cpu_error = f"{NOT_REPRODUCIBLE}: another CPU run of the same input raises {raised}"[:2000]
                return out
            u = undefined(out.cpu, *runs)
            if u.any:
                out.cpu_error = u.describe()
                return out
        dev = target.device
        phase("target")
        trace = None
        try:
            if computed is not None and target.compiler:  # the sample's share of a compiled batch
                s_dev, result = computed.sample, computed.result
                out.duration_s, out.proof = computed.duration_s, dict(computed.proof)
                with target.standing_for(computed.record):
                    trace = _eager_trace(target, lambda: invoke(fn, variant, on_device(sample, dev), dev, out.cpu))
            elif target.compiler:  # compiled with no dispatch mode active; ops traced on an eager run
                s_dev = on_device(sample, dev)
                wrapped = target.wrap(fn)
                t0 = time.perf_counter()
                result = invoke(wrapped, variant, s_dev, dev, out.cpu, sized_out=True)
                target.synchronize()
                out.duration_s = time.perf_counter() - t0
                out.proof = proof(target, result)
                trace = _eager_trace(target, lambda: invoke(
                    fn, variant, on_device(sample, dev), dev, out.cpu, sized_out=True))
            else:
                traces: list[Any] = [None]
                try:
                    wrapped = target.wrap(fn)
                    result, s_dev = _eager(target, sample, f"{info.name}|{variant}", out, traces, on_device,
                                           lambda s: invoke(wrapped, variant, s, dev, out.cpu), traced)
                finally:
                    trace = traces[0]
            out.device_meta = [Meta.of(x) for x in leaves(result) if isinstance(x, torch.Tensor)]
            out.device_result, out.device_sample = result, s_dev
            out.target = to_cpu(result)
            out.native, out.fallback, out.reached = _trace_of(trace)
        except Exception as exc:  # noqa: BLE001 - any target failure is evidence
            out.target_error = err(exc)
            out.proof = out.proof or proof(target, None)
            out.native, out.fallback, out.reached = _trace_of(trace)
            return out
    if want_arbiter and sample_dtype(sample) in _FLOAT_LOW:
        out.arbiter = lambda: shared.get("f64", lambda: _arbiter(fn, variant, info, sample))
    if want_arbiter and sample_dtype(sample) in _DOUBLE:
        out.twin = lambda: _twin(fn, variant, info, sample)
    return out


def _eager(target: Target, sample: Any, key: str, out: Outcome, traces: list[Any],
           place: Callable[[Any, Any], Any], call: Callable[[Any], Any], traced: bool = True) -> tuple[Any, Any]:
    """An eager target's call of ``sample``: ``place`` it on the device, ``call`` it there, timed
    (``out.duration_s``) and traced (the trace into ``traces[0]``, failing or not); the arguments
    the op wants on the CPU stay there (:func:`conformance.check.placement.on_cpu_where_wanted`,
    learned per ``key``), and the proof says which. Returns (result, the sample on the device)."""
    def once() -> tuple[Any, Any]:
        s = place(sample, target.device)
        with target.trace() if traced else contextlib.nullcontext() as traces[0]:
            t0 = time.perf_counter()
            got = call(s)
            target.synchronize()
            out.duration_s = time.perf_counter() - t0
        return got, s

    result, s_dev = on_cpu_where_wanted(sample, key, once)
    out.rerun = lambda: call(place(sample, target.device))
    out.proof = proof(target, result)
    if cpu_args(sample):
        out.proof["cpu_args"] = list(cpu_args(sample))
    return result, s_dev


def trace_changes_cpu(info: Any, variant: str, sample: Any, tries: int = 3) -> bool:
    """Whether running this item under a dispatch mode that only forwards every call changes its
    result on the CPU (bit for bit, NaN equal to NaN), in any of ``tries`` traced calls.

    PyTorch itself runs some ops differently under any ``TorchDispatchMode`` (torch 2.13:
    ``linalg.matrix_rank(..., out=)`` with tensor tolerances leaves ``out`` unwritten), and an
    eager target's op trace is one. Asked of the CPU, not of the target, so that a target whose
    results vary from call to call is never taken for a trace effect."""
    fn = variant_fn(info, variant)
    if fn is None:
        return False

    def call() -> Any:
        s = on_device(sample, "cpu")
        if variant != "out":
            return to_cpu(invoke(fn, variant, s, "cpu", None))
        # out= tensors of the result's shapes, filled with a value no kernel writes by chance: an
        # out= the call leaves unwritten then differs every time (an empty one is resized into
        # whatever memory the allocator hands back, often the plain call's result itself)
        out = _filled(out_like(invoke(info.op, "function", s, "cpu", None), "cpu", sized=True))
        ret = fn(s.input, *s.args, **s.kwargs, out=out)
        return to_cpu(out if ret is None else ret)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            plain = call()
            for _ in range(tries):
                with Dispatched(OpTrace()):
                    traced = call()
                if not bitwise_equal(plain, traced):
                    return True
        except Exception:  # noqa: BLE001 - a reference that fails here says nothing about the trace
            return False
    return False


def _filled(out: Any) -> Any:
    """``out=`` tensors filled with a sentinel: NaN, or the dtype's largest value (True for bool)."""
    def fill(t: torch.Tensor) -> torch.Tensor:
        if t.dtype.is_floating_point or t.dtype.is_complex:
            return t.fill_(float("nan"))
        return t.fill_(True if t.dtype == torch.bool else torch.iinfo(t.dtype).max)

    return tuple(fill(t) for t in out) if isinstance(out, tuple) else fill(out)


def _eager_trace(target: Target, call: Callable[[], Any]) -> Any:
    """The overloads an eager run of the item reaches on ``target`` (how a compiler target's
    item names its ops). It only names ops: a failure here is not the compiled result's."""
    trace = None
    try:
        with target.trace() as trace:
            call()
    except Exception:  # noqa: BLE001 - the ops reached until the failure are still named
        pass
    return trace


def proof(target: Target, result: Any) -> dict[str, Any]:
    """Evidence that ``target`` ran the item: the devices of its outputs and, for a compiler
    target, what its backend compiled."""
    devices = sorted({str(x.device) for x in leaves(result) if isinstance(x, torch.Tensor)})
    compiled = target.compiled()
    return {"device": devices, **(compiled.evidence() if compiled is not None else {})}


def _trace_of(trace: Any) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    if trace is None:
        return (), (), ()
    return tuple(sorted(trace.native)), tuple(sorted(trace.fallback)), tuple(sorted(trace.reached))


def sample_dtype(sample: Any) -> torch.dtype | None:
    for x in leaves((sample.input, sample.args, sample.kwargs)):
        if isinstance(x, torch.Tensor):
            return x.dtype
    return None


def _arbiter(fn: Callable[..., Any], variant: str, info: Any, sample: Any) -> Any:
    """The same sample computed in float64 on the CPU (None when the op cannot)."""
    return _recast(fn, variant, info, sample, lambda t: t.to(torch.float64, copy=True) if t.dtype in _FLOAT_LOW
                   else t.clone())


def _recast(fn: Callable[..., Any], variant: str, info: Any, sample: Any,
            cast: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """The sample with every tensor ``cast`` computed on the CPU (None when the op cannot)."""
    if any(isinstance(x, torch.UntypedStorage) for x in leaves((sample.input, sample.args, sample.kwargs))):
        return None  # a Storage argument's bytes are of the sample's dtype: a recast would misread them
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            recast = clone_sample(sample, cast)
            ref = None
            if variant == "out":
                ref = invoke(info.op, "function", clone_sample(recast, torch.clone), "cpu", None)
            return invoke(fn, variant, recast, "cpu", ref)
        except Exception:  # noqa: BLE001 - the op cannot take the recast sample
            return None


def _twin(fn: Callable[..., Any], variant: str, info: Any, sample: Any) -> Any:
    """The same double-precision sample computed on the CPU in single precision (float64 tensors
    as float32, complex128 as complex64; None when the op cannot): what a device that computes
    double precision in single precision would return."""
    return _recast(fn, variant, info, sample, lambda t: t.to(_DOUBLE[t.dtype], copy=True) if t.dtype in _DOUBLE
                   else t.clone())


def signature(sample: Any) -> str:
    """A compact shape/dtype/stride signature of a sample, e.g. ``f32[3,4]{4,1}, f32[4]; alpha=2``."""
    parts = []
    for x in leaves((sample.input, sample.args)):
        parts.append(_sig(x))
    kw = ", ".join(f"{k}={_sig(v)}" for k, v in sample.kwargs.items())
    return ", ".join(parts) + (f"; {kw}" if kw else "")


_SHORT = {torch.float32: "f32", torch.float64: "f64", torch.bfloat16: "bf16", torch.float16: "f16",
          torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
          torch.bool: "b8", torch.complex64: "c64", torch.complex128: "c128"}


def _sig(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        shape = ",".join(map(str, x.shape))
        s = f"{_SHORT.get(x.dtype, str(x.dtype))}[{shape}]"
        if x.layout == torch.strided and not x.is_contiguous() and x.dim() > 1:
            s += "{" + ",".join(map(str, x.stride())) + "}"
        return s
    if isinstance(x, torch.UntypedStorage):  # a Storage argument, by its size (its repr lists every byte)
        return f"storage[{x.nbytes()}B]"
    if isinstance(x, (list, tuple)):
        return "(" + ",".join(_sig(v) for v in x) + ")"
    r = repr(x)
    return r if len(r) < 40 else r[:37] + "..."


def grad_inputs(sample: Any) -> list[torch.Tensor]:
    return [x for x in leaves((sample.input, sample.args, sample.kwargs))
            if isinstance(x, torch.Tensor) and x.requires_grad]


def backward_grads(fn: Callable[..., Any], sample: Any, upstream: list[torch.Tensor] | None, device: str | torch.device,
                   place: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
                   ) -> tuple[list[Any], list[torch.Tensor]]:
    """The gradients w.r.t. ``sample``'s inputs that require grad, of ``fn``'s differentiable
    outputs with ``upstream`` gradients (None: drawn from a generator seeded by their count, so
    that every call on the same sample draws the same). ``place(g, output)`` puts an upstream
    gradient where its output is (default: ``g.to(output.device, output.dtype)``; the noncontiguous
    contract passes non-contiguous ones)."""
    out = fn(sample.input, *sample.args, **sample.kwargs)
    outs = [o for o in leaves(out) if isinstance(o, torch.Tensor) and o.requires_grad]
    if not outs:
        raise ValueError("no differentiable output")
    if upstream is None:
        gen = torch.Generator().manual_seed(len(outs))
        upstream = [torch.randn(o.shape, generator=gen, dtype=torch.float32).to(o.dtype) for o in outs]
    # each upstream gradient where its output is (``to`` moves its result off the device)
    put = place or (lambda g, o: g.to(o.device, o.dtype))
    grads = torch.autograd.grad(outs, grad_inputs(sample), [put(g, o) for g, o in zip(upstream, outs, strict=True)],
                                allow_unused=True)
    return list(grads), upstream


def run_backward(target: Target, info: Any, sample: Any, *, computed: Any = None) -> Outcome:
    """Forward + backward of one sample (generated with requires_grad) on the CPU and on the
    target, with the same upstream gradient; the results compared are the input gradients.
    ``computed``: the target's gradients from a compiled batch (see :func:`run_item`)."""
    out = Outcome()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        phase("cpu")
        try:
            grads, upstream = backward_grads(info.op, leafify(sample, "cpu"), None, "cpu")
            out.cpu = grads
        except Exception as exc:  # noqa: BLE001 - no CPU reference gradient: the item is skipped
            out.cpu_error = err(exc)
            return out
        dev = target.device
        trace = None
        phase("target")
        try:
            if computed is not None and target.compiler:  # the sample's share of a compiled batch
                s_dev, grads_dev = computed.sample, computed.result
                out.duration_s, out.proof = computed.duration_s, dict(computed.proof)
                with target.standing_for(computed.record):
                    trace = _eager_trace(target, lambda: backward_grads(info.op, leafify(sample, dev), upstream, dev))
            elif target.compiler:  # see run_item: compiled untraced, ops traced on an eager run
                s_dev = leafify(sample, dev)
                wrapped = target.wrap(info.op)
                t0 = time.perf_counter()
                grads_dev, _ = backward_grads(wrapped, s_dev, upstream, dev)
                target.synchronize()
                out.duration_s = time.perf_counter() - t0
                out.proof = proof(target, grads_dev)
                trace = _eager_trace(target, lambda: backward_grads(info.op, leafify(sample, dev), upstream, dev))
            else:
                traces: list[Any] = [None]
                try:
                    wrapped = target.wrap(info.op)
                    grads_dev, s_dev = _eager(target, sample, f"{info.name}|backward", out, traces, leafify,
                                              lambda s: backward_grads(wrapped, s, upstream, dev)[0])
                finally:
                    trace = traces[0]
            out.device_meta = [Meta.of(g) for g in grads_dev if isinstance(g, torch.Tensor)]
            out.device_result = grads_dev
            out.target = to_cpu(grads_dev)
            out.native, out.fallback, out.reached = _trace_of(trace)
        except Exception as exc:  # noqa: BLE001
            out.target_error = err(exc)
            out.proof = out.proof or proof(target, None)
            out.native, out.fallback, out.reached = _trace_of(trace)
            return out
    if sample_dtype(sample) in _FLOAT_LOW:
        out.arbiter = lambda: _backward_arbiter(info, sample, upstream)
    return out


def _backward_arbiter(info: Any, sample: Any, upstream: list[torch.Tensor]) -> Any:
    """The gradients of the same sample and upstream gradient computed in float64 on the CPU
    (None when the op cannot): an op may compute its gradient differently on another device (a
    chunked loss accumulates in bfloat16 off the CPU and CUDA), and a target closer to the exact
    gradient than the CPU is not wrong."""
    def cast(t: torch.Tensor) -> torch.Tensor:
        return t.detach().to(torch.float64 if t.dtype in _FLOAT_LOW else t.dtype, copy=True).requires_grad_(t.requires_grad)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            grads, _ = backward_grads(info.op, sample.transform(lambda t: cast(t) if isinstance(t, torch.Tensor) else t),
                                      [g.to(torch.float64) if g.dtype in _FLOAT_LOW else g for g in upstream], "cpu")
            return grads
        except Exception:  # noqa: BLE001 - the op cannot take float64
            return None
