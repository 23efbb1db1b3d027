"""Contracts: what a green cell promises beyond close values, each a named check with its evidence.

A value comparison says the numbers are close to the CPU's. A backend can still break what code
relies on: an ``out=`` tensor whose storage is replaced, a view that is a copy, outputs with other
strides, an input the CPU rejects that the device accepts, two identical calls that differ. Each
such promise is a *contract*, checked next to the value comparison on the same item, always
against what the CPU does with the same input (the harness knows nothing of the device):

==============  ===========================================  ===============================
contract        what the target must do                      items
==============  ===========================================  ===============================
metadata        outputs with the CPU's strides and storage   every item
                offset (or the meta kernels' prediction),
                in a layout the target's own ops accept
aliasing        outputs share storage with the inputs the    function, inplace
                CPU's share it with (views stay views, an
                in-place op returns ``self``), and inputs
                are changed only as the CPU changes them
noncontiguous   the same values for non-contiguous and       function
                channels_last copies of the inputs
variants        in-place and ``out=`` variants, the method   function (method, aliases),
                and the OpInfo's aliases agree with the      inplace, out
                function on the target
out             ``out=``: a sized out keeps its storage and  out, first sample
                strides, a non-contiguous out is honoured,
                a pre-filled out is overwritten, a wrong
                shape is resized with the CPU's warning, an
                unsafe dtype and an out on another device
                raise
errors          every OpInfo ``error_input`` the CPU rejects  function, first sample
                raises on the target too
determinism     two identical calls are bitwise identical    function, first two samples
                (where two calls on the CPU are)
==============  ===========================================  ===============================

Each check ends ``pass``, ``fail`` or ``n/a`` (with the reason it cannot be checked: no ``out=``
variant, no error inputs of the dtype, a random op...), never a silent pass. The verdict
(:func:`conformance.check.verdict.decide`) turns an item whose values pass and whose contract fails
into ``contract``.

Example::

    >>> from conformance.check.contracts import CONTRACTS, Check, summary
    >>> CONTRACTS[:3]
    ('metadata', 'aliasing', 'noncontiguous')
    >>> summary({"out": Check("fail", "data_ptr changed"), "errors": Check("n/a", "no error_inputs")})
    'contract out: data_ptr changed'
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch

from conformance.targets import Target

from .compare import Meta, bitwise_equal, compare, leaves
from .execute import Outcome, clone_sample, err, invoke, on_device, phase, signature, to_cpu
from .ledger import torch_default

#: Every contract, in the order rows and reports show them.
CONTRACTS: tuple[str, ...] = ("metadata", "aliasing", "noncontiguous", "variants", "out", "errors", "determinism")
#: The contracts checked on a compiler target unless ``--contracts`` names others: the rest call
#: the compiled function with new input layouts or dtypes, and every such call compiles again.
COMPILER_DEFAULT: tuple[str, ...] = ("metadata", "variants", "determinism")

#: Samples per op x dtype called twice for "determinism" (a kernel that is not deterministic
#: rarely is so for one input only; every sample would add a call to every function item).
DETERMINISM_SAMPLES = 2
#: Calls on the CPU that must all be bitwise equal before a target is held to determinism.
CPU_DETERMINISM_TRIES = 6

Outcome_ = Literal["pass", "fail", "n/a"]


@dataclass(frozen=True)
class Check:
    """One contract's result on one item."""

    outcome: Outcome_
    detail: str = ""

    def as_json(self) -> dict[str, str]:
        return {"outcome": self.outcome, "detail": self.detail}


PASS = Check("pass")


def _na(why: str) -> Check:
    return Check("n/a", why)


def _fail(why: str) -> Check:
    return Check("fail", why)


def parse_contracts(values: Collection[str], target: Target | None = None) -> tuple[str, ...]:
    """``--contracts`` values: names, ``all``, ``none`` or ``default`` (every contract on an
    eager target, :data:`COMPILER_DEFAULT` on a compiler target); comma-separated or repeated.

        >>> parse_contracts(["out,errors"]), parse_contracts(["none"])
        (('out', 'errors'), ())
    """
    names = [n.strip() for v in values for n in str(v).split(",") if n.strip()]
    if names == ["none"]:
        return ()
    if "all" in names:
        return CONTRACTS
    if names == ["default"] or not names:
        return CONTRACTS if target is None else default_for(target)
    bad = [n for n in names if n not in CONTRACTS]
    if bad:
        raise ValueError(f"unknown contract {bad[0]!r}; expected one of {', '.join(CONTRACTS)}, all or none")
    return tuple(c for c in CONTRACTS if c in names)


def default_for(target: Target) -> tuple[str, ...]:
    if target.default_contracts is not None:
        return tuple(c for c in CONTRACTS if c in target.default_contracts)
    return COMPILER_DEFAULT if target.compiler else CONTRACTS


def failed(checks: dict[str, Check]) -> list[str]:
    return [name for name, c in checks.items() if c.outcome == "fail"]


def summary(checks: dict[str, Check]) -> str:
    """The failed contracts as one line for the item's error text."""
    return "; ".join(f"contract {name}: {checks[name].detail}" for name in failed(checks))


@dataclass
class Subject:
    """One executed item, as the contracts see it."""

    target: Target
    info: Any
    variant: str
    dtype: str
    index: int
    sample: Any  # the CPU sample as generated (never mutated by the item's calls)
    fn: Callable[..., Any]  # the variant's callable
    outcome: Outcome
    atol: float
    rtol: float
    per_tensor: Any = None  # the item's semantic comparator (None: allclose)
    comparator: str = "allclose"
    # the function variant's results on this sample, {"cpu": ..., "target": ...} (copied to the
    # CPU), when the sweep already has them; computed on demand otherwise
    peer: dict[str, Any] | None = None
    # the group's compiled batches (conformance.check.batching.OpBatches) on a compiler target that
    # batches: a call of this function item's sample is taken from them where they hold it
    batches: Any = None

    @property
    def device(self) -> torch.device | str:
        return self.target.device

    def call_on_target(self, fn: Callable[..., Any], repeat: int = 0) -> Any:
        """``fn`` on this item's sample on the target, copied to the CPU: from the group's
        compiled batch where one holds it (``repeat`` k: the k-th later identical call of the
        same compiled graph), else wrapped and called on its own."""
        if self.batches is not None and self.variant == "function":
            got = self.batches.get("function", fn, self.index)
            if got is not None and repeat == 0:
                return to_cpu(got.result)
            if got is not None and len(got.repeats) >= repeat:
                return got.repeats[repeat - 1]
        phase("target")
        return to_cpu(invoke(self.target.wrap(fn), "function", self.on_device(), self.device, None))

    def close(self, a: Any, b: Any) -> tuple[bool, str]:
        """``a`` against ``b`` with the item's tolerance (the ledger's, for target vs CPU)."""
        ev = compare(b, a, atol=self.atol, rtol=self.rtol, per_tensor=self.per_tensor, comparator=self.comparator)
        return ev.close, ev.detail

    def same(self, a: Any, b: Any) -> tuple[bool, str]:
        """``a`` against ``b``, two results of the same device, with torch.testing's default
        tolerance for the dtype: a ledger entry that accepts a device's numerics against the
        CPU does not let its own variants or layouts disagree with each other."""
        dtype = next((str(x.dtype).removeprefix("torch.") for x in leaves(b) if isinstance(x, torch.Tensor)), "float32")
        tol = torch_default(dtype)
        ev = compare(b, a, atol=tol.atol, rtol=tol.rtol, per_tensor=self.per_tensor, comparator=self.comparator)
        return ev.close, ev.detail

    def on_device(self, sample: Any | None = None) -> Any:
        return on_device(sample or self.sample, self.device)

    def on_cpu(self, sample: Any | None = None) -> Any:
        return on_device(sample or self.sample, "cpu")


def check(subject: Subject, wanted: Collection[str]) -> dict[str, Check]:
    """Every contract in ``wanted`` that applies to the subject's variant, checked."""
    out: dict[str, Check] = {}
    for name in CONTRACTS:
        if name not in wanted:
            continue
        fn = _CHECKS[name]
        try:
            result = fn(subject)
        except Exception as exc:  # noqa: BLE001 - a check that cannot run is not a pass
            result = _na(f"the check itself failed: {err(exc)}")
        if result is not None:
            out[name] = result
    return out


# -- metadata --------------------------------------------------------------------------------

def _metadata(s: Subject) -> Check | None:
    if s.variant == "backward":  # torch.autograd.grad promises no layout for the gradients it
        unusable = _unusable(s)   # returns, but they must be usable on the target
        return _fail(unusable) if unusable else None
    o = s.outcome
    cpu = [x for x in leaves(o.cpu) if isinstance(x, torch.Tensor)]
    if not cpu or not o.device_meta:
        return _na("no tensor output")
    if not any(x.layout == torch.strided for x in cpu):
        return _na("no strided tensor output")
    unusable = _unusable(s)
    diffs = [(i, dm, dm.layout_differs(Meta.of(c))) for i, (c, dm) in enumerate(zip(cpu, o.device_meta, strict=False))]
    diffs = [(i, d, why) for i, d, why in diffs if why]
    if not diffs:
        return _fail(unusable) if unusable else PASS
    predicted = _meta_prediction(s)
    if isinstance(predicted, list):
        still = [(i, why) for i, d, why in diffs if i >= len(predicted) or d.layout_differs(predicted[i])]
        if not still and unusable:
            return _fail(unusable)
        if not still:
            return Check("pass", "layout differs from the CPU's but matches the meta kernels' prediction: "
                         + "; ".join(f"output {i}: {why}" for i, _, why in diffs))
        return _fail("; ".join(f"output {i}: {why} (target vs CPU; the meta kernels predict "
                               f"{_layout(predicted[i]) if i < len(predicted) else 'nothing'})" for i, why in still))
    return _fail("; ".join(f"output {i}: {why} (target vs CPU)" for i, _, why in diffs)
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
                result = invoke(s.fn, s.variant, fake, s.device, s.outcome.cpu, sized_out=s.target.compiler)
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
    inputs = [_storage(x) for x in leaves((sample.input, sample.args, sample.kwargs)) if isinstance(x, torch.Tensor)]
    return [frozenset(j for j, p in enumerate(inputs) if p is not None and p == _storage(x))
            for x in leaves(result) if isinstance(x, torch.Tensor)]


def _aliasing(s: Subject) -> Check | None:
    if s.variant not in ("function", "inplace"):
        return None
    o = s.outcome
    if o.cpu_sample is None or o.device_sample is None:
        return _na("no sample to compare")
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
    before = [x for x in leaves((s.sample.input, s.sample.args, s.sample.kwargs)) if isinstance(x, torch.Tensor)]
    cpu_after = [x for x in leaves((o.cpu_sample.input, o.cpu_sample.args, o.cpu_sample.kwargs)) if isinstance(x, torch.Tensor)]
    dev_after = [to_cpu(x) for x in leaves((o.device_sample.input, o.device_sample.args, o.device_sample.kwargs))
                 if isinstance(x, torch.Tensor)]
    results = {j for m in cpu_map for j in m}
    for i, (b, c, d) in enumerate(zip(before, cpu_after, dev_after, strict=False)):
        if i in results:
            continue  # the result itself (an in-place op's self): its values are the value comparison's
        cpu_changed, dev_changed = not bitwise_equal(c, b), not bitwise_equal(d, b)
        if cpu_changed != dev_changed:
            problems.append(f"input {i} is {'changed' if dev_changed else 'left unchanged'} by the call on the target, "
                            f"{'changed' if cpu_changed else 'left unchanged'} on the CPU")
        elif cpu_changed:
            ok, why = s.close(d, c)
            if not ok:
                problems.append(f"input {i}, changed by the call, differs from the CPU's afterwards ({why})")
    return _fail("; ".join(problems)) if problems else PASS


# -- noncontiguous ---------------------------------------------------------------------------

def _filler(dtype: torch.dtype) -> Any:
    if dtype.is_floating_point or dtype.is_complex:
        return math.nan
    if dtype == torch.bool:
        return True
    return torch.iinfo(dtype).max


def noncontiguous_copy(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``t`` on ``device`` as a non-contiguous view (every other element of a buffer twice its
    size, the gaps filled with NaN or the dtype's largest value), or a plain copy when ``t`` has
    fewer than two elements or is not strided."""
    if t.layout != torch.strided or t.numel() < 2:
        return t.to(device, copy=True)
    big = torch.full((t.numel() * 2,), _filler(t.dtype), dtype=t.dtype)  # built on the CPU, moved once
    big[::2].view(t.shape).copy_(t)
    return big.to(device)[::2].view(t.shape)


def _channels_last(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    moved = t.to(device, copy=True)
    if t.layout == torch.strided and t.dim() == 4 and t.shape[1] > 1 and t.shape[2] * t.shape[3] > 1:
        return moved.contiguous(memory_format=torch.channels_last)
    return moved


def _noncontiguous(s: Subject) -> Check | None:
    if s.variant != "function":
        return None
    tensors = [x for x in leaves((s.sample.input, s.sample.args, s.sample.kwargs)) if isinstance(x, torch.Tensor)]
    if not any(t.layout == torch.strided and t.numel() > 1 for t in tensors):
        return _na("no input with two or more elements to make non-contiguous")
    problems = []
    layouts: list[tuple[str, Callable[[torch.Tensor, Any], torch.Tensor]]] = [("non-contiguous", noncontiguous_copy)]
    if any(t.layout == torch.strided and t.dim() == 4 and t.shape[1] > 1 and t.shape[2] * t.shape[3] > 1 for t in tensors):
        layouts.append(("channels_last", _channels_last))
    dev = s.device
    for label, make in layouts:
        phase("target")
        try:
            moved = clone_sample(s.sample, lambda t, make=make: make(t.detach(), dev), dev)
            got = to_cpu(invoke(s.target.wrap(s.fn), "function", moved, dev, None))
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
            cpu_moved = clone_sample(s.sample, lambda t, make=make: make(t.detach(), "cpu"), "cpu")
            cpu_got = invoke(s.fn, "function", cpu_moved, "cpu", None)
        except Exception:  # noqa: BLE001 - the CPU rejects the layout too: nothing to hold the target to
            continue
        if got is None:
            problems.append(f"{label} inputs: on the target {why}, the CPU accepts them")
            continue
        ok2, why2 = s.close(got, cpu_got)
        if not ok2:
            problems.append(f"{label} inputs give other values than contiguous ones on the target ({why}), "
                            f"and than the CPU's for the same layout ({why2})")
    return _fail("; ".join(problems)) if problems else PASS


# -- variants --------------------------------------------------------------------------------

def _function_on_target(s: Subject) -> Any:
    if s.peer is not None:
        return s.peer["target"]
    phase("target")
    return to_cpu(invoke(s.target.wrap(s.info.op), "function", s.on_device(), s.device, None))


def _function_on_cpu(s: Subject) -> Any:
    if s.peer is not None:
        return s.peer["cpu"]
    phase("cpu")
    return invoke(s.info.op, "function", s.on_cpu(), "cpu", None)


def _others(info: Any) -> Iterator[tuple[str, Callable[..., Any]]]:
    """The callables that must agree with the function on the same sample: the method and
    every alias's function and method."""
    if info.method_variant is not None and info.method_variant is not info.op:
        yield "method", info.method_variant
    for a in info.aliases or ():
        if a.op is not None:
            yield f"alias {a.name}", a.op
        if a.method_variant is not None:
            yield f"alias method Tensor.{a.name}", a.method_variant


def _variants(s: Subject) -> Check | None:
    """Compared on the target first; the CPU is asked only when the target's variants disagree
    (a variant the CPU's own variants disagree on for this sample proves nothing)."""
    o = s.outcome
    if s.variant in ("inplace", "out"):
        ok, why = s.same(o.target, _function_on_target(s))
        if ok:
            return PASS
        if not s.same(o.cpu, _function_on_cpu(s))[0]:
            return _na(f"the CPU's {s.variant} variant differs from its function variant on this sample")
        return _fail(f"the {s.variant} variant differs from the function variant on the target ({why})")
    if s.variant != "function":
        return None
    others = list(_others(s.info))
    if not others:
        has = s.info.inplace_variant is not None or s.info.supports_out
        return None if has or s.index else _na("no method, in-place, out= variant or alias")
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
            cpu = invoke(fn, "function", s.on_cpu(), "cpu", None)
        except Exception:  # noqa: BLE001 - the CPU has no such variant for this sample
            continue
        if not s.same(cpu, o.cpu)[0]:
            continue  # the CPU's own variants disagree here
        problems.append(f"the {label} raises on the target: {target_error}" if target_error else
                        f"the {label} differs from the function on the target ({why})")
    return _fail("; ".join(problems)) if problems else PASS


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


def _out(s: Subject) -> Check | None:
    if s.variant == "function" and s.index == 0 and not s.info.supports_out:
        return _na("no out= variant")
    if s.variant != "out" or s.index != 0:
        return None
    ref = s.outcome.cpu
    flat = leaves(ref)
    if not flat or not all(isinstance(x, torch.Tensor) and x.layout == torch.strided for x in flat):
        return _na("the result is not a strided tensor or tuple of them")
    dev = s.device
    fn = s.fn

    def sized(device: Any) -> Any:
        return _tensors_like(ref, lambda v: torch.full(v.shape, _filler(v.dtype), dtype=v.dtype, device=device))

    def strided(device: Any) -> Any:
        return _tensors_like(ref, lambda v: noncontiguous_copy(torch.full(v.shape, _filler(v.dtype), dtype=v.dtype), device))

    def reshaped(device: Any) -> Any:
        def one(v: torch.Tensor) -> torch.Tensor:
            shape = list(v.shape) or [1]
            shape[-1] += 1
            return torch.full(shape, _filler(v.dtype), dtype=v.dtype, device=device)
        return _tensors_like(ref, one)

    def retyped(device: Any) -> Any:
        return _tensors_like(ref, lambda v: torch.empty(v.shape, dtype=_unsafe_dtype(v.dtype) or v.dtype, device=device))

    cases: list[tuple[str, Callable[[Any], Any]]] = [("a correctly sized out pre-filled with NaN/extremes", sized)]
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
                problems.append(f"{label}: the target replaced the out tensor's storage (data_ptr changed), the CPU kept it")
            if c.kept_strides and not t.kept_strides:
                problems.append(f"{label}: the target changed the out tensor's strides, the CPU kept them")
            if c.warned != t.warned:  # asked again: a warning already shown may be filtered once
                phase("cpu")
                c.warned = c.warned or _probe(fn, s.on_cpu(), make("cpu")).warned
                phase("target")
                t.warned = t.warned or _probe(s.target.wrap(fn), s.on_device(), make(dev)).warned
            if c.warned != t.warned:
                problems.append(f"{label}: the CPU {'warns' if c.warned else 'does not warn'} that the out was resized, "
                                f"the target {'does' if t.warned else 'does not'}")
            # against the target's own out= result: its numerics against the CPU are the value
            # comparison's finding; here what counts is that every element was written
            # Held to its own out= result where the CPU's probe gives the CPU's own out= result
            # (the CPU wrote every element); else to what the CPU did with that out.
            own = ([x.dtype for x in leaves(t.values)] == [x.dtype for x in leaves(s.outcome.target)]
                   and s.same(c.values, s.outcome.cpu)[0])
            ok, why = s.same(t.values, s.outcome.target) if own else s.close(t.values, c.values)
            if not ok:
                problems.append(f"{label}: values differ from the target's own out= result ({why})" if own else
                                f"{label}: values differ from the CPU's ({why})")
    if str(torch.device(dev).type) != "cpu" and _has_tensor(s.sample):
        wrong = [("an out on the CPU", lambda: _tensors_like(ref, lambda v: torch.empty(v.shape, dtype=v.dtype)))]
        if any(x.dim() > 0 for x in flat):
            wrong.append(("a 0-dim out on the CPU", lambda: _tensors_like(ref, lambda v: torch.empty((), dtype=v.dtype))))
        for label, make in wrong:
            phase("target")
            t = _probe(s.target.wrap(fn), s.on_device(), make())
            if not t.raised:
                problems.append(f"{label} for inputs on {dev}: accepted, a device must raise")
    return _fail("; ".join(problems)) if problems else PASS


def _has_tensor(sample: Any) -> bool:
    return any(isinstance(x, torch.Tensor) and x.numel() > 0
               for x in leaves((sample.input, sample.args, sample.kwargs)))


# -- errors ----------------------------------------------------------------------------------

def _errors(s: Subject) -> Check | None:
    if s.variant != "function" or s.index != 0:
        return None
    if getattr(s.info, "error_inputs_func", None) is None:
        return _na("the OpInfo has no error_inputs")
    want = getattr(torch, s.dtype)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            inputs = [e for e in s.info.error_inputs("cpu") if _dtype_of(e.sample_input) == want]
    except Exception as exc:  # noqa: BLE001
        return _na(f"error_inputs could not be generated: {err(exc)}")
    if not inputs:
        return _na(f"no error_inputs with {s.dtype} tensors")
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
        return _na(f"the CPU accepts every error_input with {s.dtype} tensors")
    return _fail("; ".join(problems)) if problems else Check("pass", f"{checked} error inputs raise")


def _dtype_of(sample: Any) -> torch.dtype | None:
    for x in leaves((sample.input, sample.args, sample.kwargs)):
        if isinstance(x, torch.Tensor):
            return x.dtype
    return None


# -- determinism -----------------------------------------------------------------------------

def _determinism(s: Subject) -> Check | None:
    if s.variant != "function" or s.index >= DETERMINISM_SAMPLES:
        return None
    if s.comparator in ("meta", "random"):
        return _na("the op's values are undefined (uninitialised memory)" if s.comparator == "meta"
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
    first = invoke(s.fn, "function", s.on_cpu(), "cpu", None)
    for _ in range(CPU_DETERMINISM_TRIES):
        if not bitwise_equal(first, invoke(s.fn, "function", s.on_cpu(), "cpu", None)):
            return _na("the CPU's kernel is not bitwise deterministic either")
    return _fail(f"two identical calls differ on the target{_diff(again, third)}")


def _diff(a: Any, b: Any) -> str:
    for x, y in zip(leaves(a), leaves(b), strict=False):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.shape == y.shape and x.dtype == y.dtype:
            if x.is_floating_point():
                d = (x.double() - y.double()).abs().nan_to_num(0.0)
                n = int((d > 0).sum())
                if n:
                    return f" ({n} of {x.numel()} values, max |difference| {float(d.max()):.3g})"
            elif not torch.equal(x, y):
                return f" ({int((x != y).sum())} of {x.numel()} values)"
    return ""


_CHECKS: dict[str, Callable[[Subject], Check | None]] = {
    "metadata": _metadata, "aliasing": _aliasing, "noncontiguous": _noncontiguous, "variants": _variants,
    "out": _out, "errors": _errors, "determinism": _determinism,
}
assert tuple(_CHECKS) == CONTRACTS
