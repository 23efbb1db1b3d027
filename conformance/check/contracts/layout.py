"""Layout contracts: ``metadata`` (outputs in the CPU's strides and offset, or the meta kernels'
prediction, and usable on the target), ``aliasing`` (storage shared with the inputs the CPU's
share, inputs changed only as the CPU changes them) and ``noncontiguous`` (the same values for
non-contiguous and channels_last inputs), with the non-contiguous copies the ``out=`` contract
uses too.

Example::

    >>> import torch
    >>> from conformance.check.contracts.layout import noncontiguous_copy
    >>> t = noncontiguous_copy(torch.arange(4.0), "cpu")
    >>> t.tolist(), t.stride(), t.is_contiguous()
    ([0.0, 1.0, 2.0, 3.0], (2,), False)
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from conformance.check import execute, selfcheck
from conformance.check.compare import Meta, bitwise_equal, leaves
from conformance.check.execute import clone_sample, err, phase, to_cpu
from conformance.check.placement import filler, leafify

from .terms import PASS, Check, Subject, fail, na

# -- metadata --------------------------------------------------------------------------------

def check_metadata(s: Subject) -> Check | None:
    if s.variant == "backward":  # torch.autograd.grad promises no layout for the gradients it
        unusable = _unusable(s)   # returns, but they must be usable on the target
        return fail(unusable) if unusable else None
    o = s.outcome
    cpu = [x for x in leaves(o.cpu) if isinstance(x, torch.Tensor)]
    if not cpu or not o.device_meta:
        return na("no tensor output")
    if not any(x.layout == torch.strided for x in cpu):
        return na("no strided tensor output")
    unusable = _unusable(s)
    diffs = [(i, dm, dm.layout_differs(Meta.of(c)))
             for i, (c, dm) in enumerate(zip(cpu, o.device_meta, strict=False))]
    diffs = [(i, d, why) for i, d, why in diffs if why]
    if not diffs:
        return fail(unusable) if unusable else PASS
    predicted = _meta_prediction(s)
    if isinstance(predicted, list):
        still = [(i, why) for i, d, why in diffs if i >= len(predicted) or d.layout_differs(predicted[i])]
        if not still and unusable:
            return fail(unusable)
        if not still:
            return Check("pass", "layout differs from the CPU's but matches the meta kernels' prediction: "
                         + "; ".join(f"output {i}: {why}" for i, _, why in diffs))
        return fail("; ".join(f"output {i}: {why} (target vs CPU; the meta kernels predict "
                              f"{_layout(predicted[i]) if i < len(predicted) else 'nothing'})"
                              for i, why in still))
    return fail("; ".join(f"output {i}: {why} (target vs CPU)" for i, _, why in diffs)
                + f"; no meta prediction: {predicted}")


def _unusable(s: Subject) -> str:
    """Why an output in a layout other than contiguous cannot be used on the target (its own
    elementwise ops reject it, as a channels_last result on a device without channels_last
    kernels does), or ""."""
    problems = []
    cpu = [t for t in leaves(s.outcome.cpu) if isinstance(t, torch.Tensor)]
    for i, x in enumerate(t for t in leaves(s.outcome.device_result) if isinstance(t, torch.Tensor)):
        if x.layout != torch.strided or x.numel() < 2 or x.is_contiguous() or i >= len(cpu):
            continue
        probe = _probe_op(cpu[i])  # an elementwise op the CPU runs on its own output
        if probe is None:
            continue
        phase("target")
        try:
            probe(x, x)
            s.target.synchronize()
        except Exception as exc:  # noqa: BLE001
            problems.append(f"output {i} (strides {list(x.stride())}) is rejected by the target's own ops: "
                            f"torch.{probe.__name__}(output, output) raises {err(exc)}")
    return "; ".join(problems)


def _probe_op(t: torch.Tensor) -> Callable[..., Any] | None:
    for op in (torch.eq, torch.mul):
        try:
            op(t, t)
            return op
        except Exception:  # noqa: BLE001 - the CPU has no such kernel for the dtype
            continue
    return None


def _layout(m: Meta) -> str:
    return f"strides {list(m.stride)}, offset {m.offset}"


def _meta_prediction(s: Subject) -> list[Meta] | str:
    """The output layouts PyTorch's meta kernels predict for the item on the target device."""
    from torch._subclasses.fake_tensor import FakeTensorMode


    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mode = FakeTensorMode()
            dev_sample = s.on_device()
            fake = clone_sample(dev_sample, mode.from_tensor)
            with mode:
                result = execute.invoke(s.fn, s.variant, fake, s.device, s.outcome.cpu,
                                        sized_out=s.target.compiler)
        return [Meta.of(x) for x in leaves(result) if isinstance(x, torch.Tensor)]
    except Exception as exc:  # noqa: BLE001
        return err(exc)


# -- aliasing --------------------------------------------------------------------------------

def _storage(t: Any) -> int | None:
    if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
        return None
    st = t.untyped_storage()
    return st.data_ptr() if st.nbytes() else None


def _alias_map(result: Any, sample: Any) -> list[frozenset[int]]:
    inputs = [_storage(x) for x in leaves((sample.input, sample.args, sample.kwargs))
              if isinstance(x, torch.Tensor)]
    return [frozenset(j for j, p in enumerate(inputs) if p is not None and p == _storage(x))
            for x in leaves(result) if isinstance(x, torch.Tensor)]


def check_aliasing(s: Subject) -> Check | None:
    if s.variant not in ("function", "inplace"):
        return None
    o = s.outcome
    if o.cpu_sample is None or o.device_sample is None:
        return na("no sample to compare")
    problems = []
    cpu_map, dev_map = _alias_map(o.cpu, o.cpu_sample), _alias_map(o.device_result, o.device_sample)
    for i, (c, d) in enumerate(zip(cpu_map, dev_map, strict=False)):
        if c != d:
            problems.append(f"output {i} shares storage with input(s) {sorted(d) or 'none'} on the target, "
                            f"{sorted(c) or 'none'} on the CPU")
    if s.variant == "inplace":
        cpu_self, dev_self = o.cpu is o.cpu_sample.input, o.device_result is o.device_sample.input
        if cpu_self and not dev_self:
            problems.append("the in-place variant does not return self on the target")
    # Which inputs the call changed, on each side, against the sample as generated; how a changed
    # input's values differ is the value comparison's business when the input is the result
    # (an in-place op), and compared here otherwise (batch norm's running statistics).
    before = [x for x in leaves((s.sample.input, s.sample.args, s.sample.kwargs))
              if isinstance(x, torch.Tensor)]
    cpu_after = [x for x in leaves((o.cpu_sample.input, o.cpu_sample.args, o.cpu_sample.kwargs))
                 if isinstance(x, torch.Tensor)]
    dev_after = [to_cpu(x)
                 for x in leaves((o.device_sample.input, o.device_sample.args, o.device_sample.kwargs))
                 if isinstance(x, torch.Tensor)]
    results = {j for m in cpu_map for j in m}
    for i, (b, c, d) in enumerate(zip(before, cpu_after, dev_after, strict=False)):
        if i in results:
            continue  # the result itself (an in-place op's self): its values are the value comparison's
        cpu_changed, dev_changed = not bitwise_equal(c, b), not bitwise_equal(d, b)
        if cpu_changed != dev_changed:
            problems.append(f"input {i} is {'changed' if dev_changed else 'left unchanged'} by the call on "
                            f"the target, {'changed' if cpu_changed else 'left unchanged'} on the CPU")
        elif cpu_changed:
            ok, why = s.close(d, c)
            if not ok:
                problems.append(f"input {i}, changed by the call, differs from the CPU's afterwards ({why})")
    return fail("; ".join(problems)) if problems else PASS


# -- noncontiguous ---------------------------------------------------------------------------

def noncontiguous_copy(t: torch.Tensor, device: torch.device | str, gap: Any = None) -> torch.Tensor:
    """``t`` on ``device`` as a non-contiguous view (every other element of a buffer twice its
    size, followed by a tail as long again; the gaps and the tail filled with ``gap``, by default
    NaN or the dtype's largest value), or a plain copy when ``t`` has fewer than two elements or is
    not strided."""
    if t.layout != torch.strided or t.numel() < 2:
        return t.to(device, copy=True)
    # built on the CPU, moved once; a tail as long as the view, filled like the gaps, follows it, so
    # that a kernel reading past the view's last element reads the same fill on the CPU and the
    # target instead of whatever each heap holds there (_weight_norm_interface's CPU kernel does)
    n = t.numel()
    big = torch.full((n * 3,), filler(t.dtype) if gap is None else gap, dtype=t.dtype)
    big[:2 * n:2].view(t.shape).copy_(t)
    return big.to(device)[:2 * n:2].view(t.shape)


def _channels_last(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    moved = t.to(device, copy=True)
    if t.layout == torch.strided and t.dim() == 4 and t.shape[1] > 1 and t.shape[2] * t.shape[3] > 1:
        return moved.contiguous(memory_format=torch.channels_last)
    return moved


#: A layout maker: a tensor (detached, on the CPU) and a device -> the copy the call gets there.
Make = Callable[[torch.Tensor, Any], torch.Tensor]


def _call(s: Subject, make: Make, device: Any, on_target: bool) -> Any:
    """The item's call on copies of its sample made by ``make``: the function's result, or, on a
    backward item, the gradients w.r.t. the inputs that require grad with the item's upstream
    gradients made by ``make`` too (PyTorch's test_noncontiguous_samples back-propagates a
    non-contiguous gradient the same way)."""
    fn = s.target.wrap(s.fn) if on_target else s.fn
    if s.variant == "backward":
        leaves_ = leafify(s.sample, device, make)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            grads, _ = execute.backward_grads(fn, leaves_, None, device,
                                              place=lambda g, o: make(g.to(o.dtype), o.device))
        return to_cpu(grads) if on_target else grads
    moved = clone_sample(s.sample, lambda t: make(t.detach(), device), device)
    got = execute.invoke(fn, "function", moved, device, None)
    return to_cpu(got) if on_target else got


def check_noncontiguous(s: Subject) -> Check | None:
    """Function items: non-contiguous and channels_last copies of the inputs; backward items:
    non-contiguous inputs and upstream gradients, the gradients compared."""
    if s.variant not in ("function", "backward"):
        return None
    tensors = [x for x in leaves((s.sample.input, s.sample.args, s.sample.kwargs))
               if isinstance(x, torch.Tensor)]
    if not any(t.layout == torch.strided and t.numel() > 1 for t in tensors):
        return na("no input with two or more elements to make non-contiguous")
    problems = []
    layouts: list[tuple[str, Make]] = [("non-contiguous", noncontiguous_copy)]
    if s.variant == "function" and any(t.layout == torch.strided and t.dim() == 4 and t.shape[1] > 1
                                       and t.shape[2] * t.shape[3] > 1 for t in tensors):
        layouts.append(("channels_last", _channels_last))
    what = "gradients" if s.variant == "backward" else "values"
    dev = s.device
    unjudged: list[str] = []
    for label, make in layouts:
        phase("target")
        try:
            got = _call(s, make, dev, on_target=True)
        except Exception as exc:  # noqa: BLE001
            got, why = None, f"they raise {err(exc)}"
        if got is not None:
            ok, why = s.same(got, s.outcome.target)
            if ok:
                continue
        # The CPU itself may give other values for another layout (e.g. a summation order):
        # then the target need only match the CPU on the same layout.
        phase("cpu")
        try:
            cpu_got = _call(s, make, "cpu", on_target=False)
        except Exception:  # noqa: BLE001 - the CPU rejects the layout too: nothing to hold the target to
            continue
        if got is None:
            problems.append(f"{label} inputs: on the target {why}, the CPU accepts them")
            continue
        ok2, why2 = s.close(got, cpu_got)
        if ok2:
            continue
        if label == "non-contiguous" and _reads_the_gaps(s, cpu_got):
            # the CPU kernel's result depends on the memory between the view's elements: it
            # ignores the strides, so no result on that input is a reference (PyTorch's bug, not
            # the target's; seen on the ideal build, _weight_norm_interface)
            unjudged.append(f"{label} inputs: the CPU's result depends on the memory between the elements "
                            "(its kernel reads past the view's strides), so there is no reference for them")
            continue
        problems.append(f"{label} inputs give other {what} than contiguous ones on the target ({why}), "
                        f"and than the CPU's for the same layout ({why2})")
    if problems:
        return fail("; ".join(problems))
    return na("; ".join(unjudged)) if unjudged and len(unjudged) == len(layouts) else PASS


def _reads_the_gaps(s: Subject, cpu_got: Any) -> bool:
    """Whether the CPU's result on non-contiguous inputs is no reference: it changes with what
    fills the gaps between their elements (the view's values are the same), or it does not agree
    with itself when computed again on poisoned memory (:func:`conformance.check.selfcheck.
    again_on_poisoned`): its kernel reads memory the view skips, or past it."""
    phase("cpu")
    try:
        again = _call(s, lambda t, d: noncontiguous_copy(t, d, gap=0), "cpu", on_target=False)
    except Exception:  # noqa: BLE001 - it refused the other fill: it looked at the gaps
        return True
    if not s.same(again, cpu_got)[0]:
        return True

    def reference() -> tuple[Any, Any, str | None]:
        return _call(s, noncontiguous_copy, "cpu", on_target=False), None, None

    runs, raised = selfcheck.again_on_poisoned(reference, to_cpu(cpu_got))
    return raised is not None or selfcheck.undefined(to_cpu(cpu_got), *runs).any
