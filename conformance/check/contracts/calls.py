"""Call contracts: ``variants`` (the method, aliases, in-place and ``out=`` variants agree with
the function), ``out`` (an ``out=`` tensor is used as the CPU uses it: kept, honoured, overwritten,
resized or refused), ``errors`` (inputs the CPU rejects raise on the target) and ``determinism``
(two identical calls are bitwise identical). Each calls the op again, on the target and, where the
target disagrees, on the CPU."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from conformance.check import execute
from conformance.check.compare import bitwise_equal, leaves
from conformance.check.execute import err, phase, signature, to_cpu
from conformance.check.placement import filler, leafify

from .layout import noncontiguous_copy
from .terms import CPU_DETERMINISM_TRIES, DETERMINISM_SAMPLES, PASS, Check, Subject, fail, na

# -- variants --------------------------------------------------------------------------------

def _function_on_target(s: Subject) -> Any:
    if s.peer is not None:
        return s.peer["target"]
    return _call_function_on_target(s)


def _call_function_on_target(s: Subject) -> Any:
    """The function on the target, called now (not the peer's stored result)."""
    phase("target")
    return to_cpu(execute.invoke(s.target.wrap(s.info.op), "function", s.on_device(), s.device, None))


def _function_on_cpu(s: Subject) -> Any:
    if s.peer is not None:
        return s.peer["cpu"]
    phase("cpu")
    return execute.invoke(s.info.op, "function", s.on_cpu(), "cpu", None)


def other_callables(info: Any) -> Iterator[tuple[str, Callable[..., Any]]]:
    """The callables that must agree with the function on the same sample: the method and
    every alias's function and method."""
    if info.method_variant is not None and info.method_variant is not info.op:
        yield "method", info.method_variant
    for a in info.aliases or ():
        if a.op is not None:
            yield f"alias {a.name}", a.op
        if a.method_variant is not None:
            yield f"alias method Tensor.{a.name}", a.method_variant


def check_variants(s: Subject) -> Check | None:
    """Compared on the target first; the CPU is asked only when the target's variants disagree
    (a variant the CPU's own variants disagree on for this sample proves nothing)."""
    o = s.outcome
    if s.variant in ("inplace", "out"):
        function = _function_on_target(s)
        ok, why = s.same(o.target, function)
        if ok:
            return PASS
        if not s.same(o.cpu, _function_on_cpu(s))[0]:
            return na(f"the CPU's {s.variant} variant differs from its function variant on this sample")
        excused, more = s.within_noise(lambda: _call_function_on_target(s), function, o.target, o.cpu,
                                       f"the {s.variant} variant is")
        if excused:
            return Check("pass", f"the function differs between two identical calls on the target; the "
                         f"{s.variant} variant is within the item's tolerance of the CPU")
        return fail(f"the {s.variant} variant differs from the function variant on the target ({why}){more}")
    if s.variant == "backward":
        return _gradient_variants(s)
    if s.variant != "function":
        return None
    others = list(other_callables(s.info))
    if not others:
        has = s.info.inplace_variant is not None or s.info.supports_out
        return None if has or s.index else na("no method, in-place, out= variant or alias")
    problems = []
    for label, fn in others:
        try:
            got = s.call_on_target(fn)
            target_error = None
        except Exception as exc:  # noqa: BLE001
            got, target_error = None, err(exc)
        if target_error is None:
            ok, why = s.same(got, o.target)
            if ok:
                continue
        phase("cpu")
        try:
            cpu = execute.invoke(fn, "function", s.on_cpu(), "cpu", None)
        except Exception:  # noqa: BLE001 - the CPU has no such variant for this sample
            continue
        if not s.same(cpu, o.cpu)[0]:
            continue  # the CPU's own variants disagree here
        if target_error is None:
            excused, more = s.within_noise(lambda: s.call_on_target(s.fn, repeat=1), o.target, got, cpu,
                                           f"the {label} is")
            if excused:
                continue  # as close to the CPU as the item's own values need to be
            why += more
        problems.append(f"the {label} raises on the target: {target_error}" if target_error else
                        f"the {label} differs from the function on the target ({why})")
    return fail("; ".join(problems)) if problems else PASS


def gradient_variants(info: Any) -> list[tuple[str, Callable[..., Any]]]:
    """The callables whose gradients must equal the function's: the method, every alias's
    function and method, and the in-place variant applied to a clone of the input (a leaf that
    requires grad cannot be changed in place), as PyTorch's test_variant_consistency_eager has it."""
    out = list(other_callables(info))
    inplace = info.inplace_variant
    if inplace is not None:
        out.append(("in-place variant (on a clone)",
                    lambda x, *args, **kwargs: inplace(x.clone(), *args, **kwargs)))
    return out


def _gradient_variants(s: Subject) -> Check | None:
    """A backward item: each variant's gradients on the target against the function's (the
    item's own); where they differ, the same variant on the CPU against the CPU's gradients
    decides whether the CPU's own variants disagree on this sample (then it proves nothing)."""
    others = gradient_variants(s.info)
    if not others or s.outcome.target is None:
        return None
    problems = []
    for label, fn in others:
        phase("target")
        try:
            got = to_cpu(_grads(s.target.wrap(fn), s.sample, s.device))
            target_error = None
        except Exception as exc:  # noqa: BLE001
            got, target_error = None, err(exc)
        if target_error is None:
            ok, why = s.same(got, s.outcome.target)
            if ok:
                continue
        phase("cpu")
        try:
            cpu = _grads(fn, s.sample, "cpu")
        except Exception:  # noqa: BLE001 - the CPU cannot differentiate this variant on this sample
            continue
        if not s.same(cpu, s.outcome.cpu)[0]:
            continue  # the CPU's own variants' gradients disagree here
        if target_error is None:
            excused, more = s.within_noise(lambda: to_cpu(_grads(s.target.wrap(s.fn), s.sample, s.device)),
                                           s.outcome.target, got, cpu, f"the {label}'s gradients are")
            if excused:
                continue
            why += more
        problems.append(f"the {label}'s backward raises on the target: {target_error}" if target_error else
                        f"the {label}'s gradients differ from the function's on the target ({why})")
    return fail("; ".join(problems)) if problems else PASS


def _grads(fn: Callable[..., Any], sample: Any, device: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return execute.backward_grads(fn, leafify(sample, device), None, device)[0]


# -- out= ------------------------------------------------------------------------------------

@dataclass
class _Probe:
    raised: str | None = None
    warned: bool = False
    kept_storage: bool = True
    kept_strides: bool = True
    values: Any = None


def _tensors_like(value: Any, make: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        return make(value)
    return tuple(make(v) for v in value)


def _probe(fn: Callable[..., Any], sample: Any, out: Any) -> _Probe:
    outs = [x for x in leaves(out) if isinstance(x, torch.Tensor)]
    before = [(x.data_ptr(), x.stride()) for x in outs]
    p = _Probe()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            fn(sample.input, *sample.args, **sample.kwargs, out=out)
        except Exception as exc:  # noqa: BLE001
            p.raised = err(exc)
            return p
    p.warned = any("resized" in str(w.message) for w in caught)
    p.kept_storage = all(x.data_ptr() == ptr for x, (ptr, _) in zip(outs, before, strict=True))
    p.kept_strides = all(x.stride() == st for x, (_, st) in zip(outs, before, strict=True))
    p.values = to_cpu(out)
    return p


def _unsafe_dtype(dtype: torch.dtype) -> torch.dtype | None:
    """A dtype the result cannot be cast to safely (None: every dtype can hold it)."""
    for cand in (torch.int64, torch.bool, torch.float32):
        if cand != dtype and not torch.can_cast(dtype, cand):
            return cand
    return None


def check_out(s: Subject) -> Check | None:
    if s.variant == "function" and s.index == 0 and not s.info.supports_out:
        return na("no out= variant")
    if s.variant != "out":
        return None
    ref = s.outcome.cpu
    flat = leaves(ref)
    if not flat or not all(isinstance(x, torch.Tensor) and x.layout == torch.strided for x in flat):
        return na("the result is not a strided tensor or tuple of them")
    dev = s.device
    fn = s.fn

    def sized(device: Any) -> Any:
        return _tensors_like(ref, lambda v: torch.full(v.shape, filler(v.dtype), dtype=v.dtype,
                                                       device=device))

    def strided(device: Any) -> Any:
        return _tensors_like(ref, lambda v: noncontiguous_copy(
            torch.full(v.shape, filler(v.dtype), dtype=v.dtype), device))

    def reshaped(device: Any) -> Any:
        def one(v: torch.Tensor) -> torch.Tensor:
            shape = list(v.shape) or [1]
            shape[-1] += 1
            return torch.full(shape, filler(v.dtype), dtype=v.dtype, device=device)
        return _tensors_like(ref, one)

    def retyped(device: Any) -> Any:
        return _tensors_like(ref, lambda v: torch.empty(v.shape, dtype=_unsafe_dtype(v.dtype) or v.dtype,
                                                        device=device))

    cases: list[tuple[str, Callable[[Any], Any]]] = [
        ("a correctly sized out pre-filled with NaN/extremes", sized)]
    if any(x.numel() > 1 for x in flat):
        cases.append(("a non-contiguous out", strided))
    cases.append(("an out of the wrong shape", reshaped))
    if any(_unsafe_dtype(x.dtype) for x in flat):
        cases.append(("an out of a dtype the result cannot be cast to safely", retyped))
    problems: list[str] = []
    for label, make in cases:
        phase("cpu")
        c = _probe(fn, s.on_cpu(), make("cpu"))
        phase("target")
        t = _probe(s.target.wrap(fn), s.on_device(), make(dev))
        if c.raised and not t.raised:
            problems.append(f"{label}: the CPU raises ({c.raised}), the target returns")
        elif t.raised and not c.raised:
            problems.append(f"{label}: the target raises ({t.raised}), the CPU does not")
        elif not c.raised:
            if c.kept_storage and not t.kept_storage:
                problems.append(f"{label}: the target replaced the out tensor's storage (data_ptr changed), "
                                "the CPU kept it")
            if c.kept_strides and not t.kept_strides:
                problems.append(f"{label}: the target changed the out tensor's strides, the CPU kept them")
            if c.warned != t.warned:  # asked again: a warning already shown may be filtered once
                phase("cpu")
                c.warned = c.warned or _probe(fn, s.on_cpu(), make("cpu")).warned
                phase("target")
                t.warned = t.warned or _probe(s.target.wrap(fn), s.on_device(), make(dev)).warned
            if c.warned != t.warned:
                problems.append(f"{label}: the CPU {'warns' if c.warned else 'does not warn'} that the out "
                                f"was resized, the target {'does' if t.warned else 'does not'}")
            # against the target's own out= result: its numerics against the CPU are the value
            # comparison's finding; here what counts is that every element was written
            # Held to its own out= result where the CPU's probe gives the CPU's own out= result
            # (the CPU wrote every element); else to what the CPU did with that out.
            own = ([x.dtype for x in leaves(t.values)] == [x.dtype for x in leaves(s.outcome.target)]
                   and s.same(c.values, s.outcome.cpu)[0])
            ok, why = s.same(t.values, s.outcome.target) if own else s.close(t.values, c.values)
            if not ok:
                problems.append(f"{label}: values differ from the target's own out= result ({why})"
                                if own else f"{label}: values differ from the CPU's ({why})")
    if str(torch.device(dev).type) != "cpu" and _has_tensor(s.sample) and not _out_fails_upstream(s.info):
        wrong = [("an out on the CPU",
                  lambda: _tensors_like(ref, lambda v: torch.empty(v.shape, dtype=v.dtype)))]
        if any(x.dim() > 0 for x in flat):
            wrong.append(("a 0-dim out on the CPU",
                          lambda: _tensors_like(ref, lambda v: torch.empty((), dtype=v.dtype))))
        for label, make in wrong:
            phase("target")
            t = _probe(s.target.wrap(fn), s.on_device(), make())
            if not t.raised:
                problems.append(f"{label} for inputs on {dev}: accepted, a device must raise")
    return fail("; ".join(problems)) if problems else PASS


def _out_fails_upstream(info: Any) -> bool:
    """Whether PyTorch's OpInfo expects its own ``TestCommon.test_out`` to fail on every device
    (``torch.lu``: a Python function that copies into ``out``, across devices too). The rule that a
    device must refuse an ``out=`` on another device is that test's; where PyTorch says no device
    keeps it, the harness does not hold the device to it."""
    import unittest

    for d in getattr(info, "decorators", ()) or ():
        if (getattr(d, "cls_name", None) == "TestCommon" and getattr(d, "test_name", None) == "test_out"
                and getattr(d, "device_type", None) is None and getattr(d, "active_if", True)
                and unittest.expectedFailure in (getattr(d, "decorators", ()) or ())):
            return True
    return False


def _has_tensor(sample: Any) -> bool:
    return any(isinstance(x, torch.Tensor) and x.numel() > 0
               for x in leaves((sample.input, sample.args, sample.kwargs)))


# -- errors ----------------------------------------------------------------------------------

def check_errors(s: Subject) -> Check | None:
    if s.variant != "function" or s.index != 0:
        return None
    if getattr(s.info, "error_inputs_func", None) is None:
        return na("the OpInfo has no error_inputs")
    want = getattr(torch, s.dtype)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            inputs = [e for e in s.info.error_inputs("cpu") if _dtype_of(e.sample_input) == want]
    except Exception as exc:  # noqa: BLE001
        return na(f"error_inputs could not be generated: {err(exc)}")
    if not inputs:
        return na(f"no error_inputs with {s.dtype} tensors")
    problems, checked = [], 0
    for i, e in enumerate(inputs):
        moved = s.on_device(e.sample_input)  # before the CPU call, which might change the input
        phase("cpu")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                s.info.op(e.sample_input.input, *e.sample_input.args, **e.sample_input.kwargs)
            continue  # the CPU accepts it: nothing to check
        except Exception as exc:  # noqa: BLE001
            cpu_exc = exc
        phase("target")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result = s.target.wrap(s.info.op)(moved.input, *moved.args, **moved.kwargs)
                s.target.synchronize()
        except Exception:  # noqa: BLE001 - raised, as the CPU does
            checked += 1
            continue
        checked += 1
        shapes = [list(x.shape) for x in leaves(result) if isinstance(x, torch.Tensor)]
        problems.append(f"error input {i} ({signature(e.sample_input)}): the CPU raises {err(cpu_exc)}; "
                        f"the target returns {shapes or type(result).__name__}")
    if not checked:
        return na(f"the CPU accepts every error_input with {s.dtype} tensors")
    return fail("; ".join(problems)) if problems else Check("pass", f"{checked} error inputs raise")


def _dtype_of(sample: Any) -> torch.dtype | None:
    for x in leaves((sample.input, sample.args, sample.kwargs)):
        if isinstance(x, torch.Tensor):
            return x.dtype
    return None


# -- determinism -----------------------------------------------------------------------------

def check_determinism(s: Subject) -> Check | None:
    if s.variant != "function" or s.index >= DETERMINISM_SAMPLES:
        return None
    if s.comparator in ("meta", "random"):
        return na("the op's values are undefined (uninitialised memory)" if s.comparator == "meta"
                  else "a random op: two calls differ by design")
    # Two calls of their own, one right after the other: the item's call ran traced (a dispatch
    # mode may take other kernel paths), and other contracts' calls may sit between it and here.
    again = s.call_on_target(s.fn, repeat=1)
    third = s.call_on_target(s.fn, repeat=2)
    if bitwise_equal(again, third):
        return PASS
    # Some CPU kernels (threaded LAPACK/BLAS reductions) differ only now and then: the CPU is
    # asked several times before the target is held to bitwise determinism.
    phase("cpu")
    first = execute.invoke(s.fn, "function", s.on_cpu(), "cpu", None)
    for _ in range(CPU_DETERMINISM_TRIES):
        if not bitwise_equal(first, execute.invoke(s.fn, "function", s.on_cpu(), "cpu", None)):
            return na("the CPU's kernel is not bitwise deterministic either")
    return fail(f"two identical calls differ on the target{_diff(again, third)}")


def _diff(a: Any, b: Any) -> str:
    for x, y in zip(leaves(a), leaves(b), strict=False):
        if (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.shape == y.shape
                and x.dtype == y.dtype):
            if x.is_floating_point():
                d = (x.double() - y.double()).abs().nan_to_num(0.0)
                n = int((d > 0).sum())
                if n:
                    return f" ({n} of {x.numel()} values, max |difference| {float(d.max()):.3g})"
            elif not torch.equal(x, y):
                return f" ({int((x != y).sum())} of {x.numel()} values)"
    return ""

