"""Routing of ATen operators on the ``neuron`` device, per the active SDK build: the entry point.

The C++ fallback asks :func:`classify` once per operator whether it takes a zero-copy CPU kernel
(native or fallback) or comes to :func:`handle`, which runs it with the build's dtype rules
(float64 downcast, int64 narrowing, error/fallback rules), numerics (matmul operand rounding,
transcendental precision, sin/cos without range reduction, stochastic rounding) and defects.
Inside :func:`handle` the emulator's own calls run under a thread-local "raw" guard: they take
the plain zero-copy path and are not recorded as user ops.

This module holds :func:`handle` and the native path it runs; the rest lives in (lowest layer
first) :mod:`.routing` (operator classes, :class:`OpPlan`, the shared state :data:`S`,
:func:`classify`), :mod:`.tracking` (the raw guard, execution counts, the tracking API),
:mod:`.meta_dtypes` (the CPU's result dtypes, cached) and :mod:`.output_defects` (defects on
results).  Their names stay importable from here.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from . import defects as _defects
from . import numerics as _num
from .manifest import FALLBACK_ONLY_ENV
from .meta_dtypes import (  # noqa: F401  (re-exported: tests)
    _META_DTYPES,
    _dtype_key,
    _meta_dtypes,
    _meta_dtypes_uncached,
)
from .output_defects import _apply_output_defects, _garbage, _outputs
from .routing import (  # noqa: F401  (re-exported: the package's entry point)
    _COMPLEX,
    _F64,
    _INT64,
    ALLOW_CPU_GLOBS,
    ARITH,
    FALLBACK,
    INFRA_DEFECT_KINDS,
    INFRA_GLOBS,
    MATMUL_OPERANDS,
    NATIVE,
    PYTHON,
    TRANSCENDENTALS,
    OpPlan,
    S,
    _dtype_code,
    _ext,
    activate,
    classify,
    plan_for,
)
from .tracking import (  # noqa: F401  (re-exported: the public tracking API)
    clear_op_tracking,
    get_executed_ops,
    get_fallback_ops,
    get_native_ops,
    get_op_counts,
    op_tracking,
    raw,
    record,
)

INDEX_ARGS = frozenset({"index", "indices", "offsets", "target"})
# Ops whose result shape depends on the integer width (arange's length): computed in int64.
NO_NARROW = frozenset({"arange", "range"})


def _neuron_tensors(args, kwargs) -> list[torch.Tensor]:
    out = []
    for v in (*args, *kwargs.values()):
        if isinstance(v, torch.Tensor):
            if v.device.type == "neuron":
                out.append(v)
        elif isinstance(v, (list, tuple)):
            out.extend(t for t in v if isinstance(t, torch.Tensor) and t.device.type == "neuron")
    return out


def _is_channels_last(t: torch.Tensor) -> bool:
    return t.dim() == 4 and not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last)


def _generator() -> torch.Generator:
    return _ext().default_twin()


def handle(name: str, args: tuple, kwargs: dict) -> Any:
    """Runs one operator call with the active build's dtype rules, numerics and defects. A device
    execution that fails (an ``error`` defect, a dtype or layout rule of 'error', a native kernel
    that raises) is recovered on the CPU where the build's runtime does so (:func:`_recovering`),
    as the real device does by default."""
    plan = plan_for(name)
    b = S.build
    tensors = _neuron_tensors(args, kwargs)
    fired = S.defect_state.firing(plan.defects, tensors) if plan.defects else []
    fallback = not plan.native
    rule_fallback = None
    downcast64 = narrow64 = upcast16 = False
    try:
        for d in fired:
            if d.kind in ("error", "crash", "hang"):
                _defects.raise_now(d, name, b.name)
            elif d.kind == "fallback":
                fallback = True
        if not fallback and not plan.infra:
            rules = b.dtypes
            checks = (
                ("float64", rules.float64, any(t.dtype == _F64 for t in tensors)),
                ("int64", rules.int64, any(t.dtype == _INT64 for t in tensors)),
                ("complex", rules.complex, any(t.dtype in _COMPLEX for t in tensors)),
                ("channels_last", rules.channels_last, any(_is_channels_last(t) for t in tensors)),
            )
            for kind, rule, present in checks:
                if not present or rule == "native":
                    continue
                if rule == "error":
                    raise RuntimeError(
                        f"neuron: {kind} inputs are not supported by {name} on Neuron SDK build {b.name} "
                        f"(manifest rule dtypes.{kind} = 'error')")
                if rule == "fallback":
                    if not fallback:
                        rule_fallback = kind
                    fallback = True
                elif kind == "float64":
                    downcast64 = True
                elif kind == "int64":
                    narrow64 = True
            if narrow64 and plan.base in NO_NARROW:
                narrow64 = False  # the length depends on the dtype (int64 truncates the step)
            upcast16 = plan.arith and any(t.dtype in (torch.bfloat16, torch.float16) for t in tensors)
    except RuntimeError as failed:  # the device refused to run it: an execution error
        return _recover(plan, name, args, kwargs, failed)
    record(name, fallback, rule_fallback)
    try:
        if fallback:
            with raw(2):
                out = plan.op(*args, **kwargs)
        else:
            with raw(1):
                out = _run_native(plan, args, kwargs, downcast64, narrow64, upcast16)
    except Exception as err:
        if any(d.kind == "accepts_invalid" for d in fired):
            with raw(2):
                return _garbage(plan, args, kwargs, err)  # accepts_invalid: what the kernel rejects, it returns
        if fallback:
            raise  # the CPU's own error: nothing to recover on
        return _recover(plan, name, args, kwargs, err)
    if fired:
        with raw(2):
            out = _apply_output_defects(plan, fired, out, args, kwargs)
    return out


def _recovering() -> bool:
    """Whether a failed device execution is re-run on the CPU: the build's ``runtime.recover_errors``,
    unless :data:`~neuron_emu.manifest.FALLBACK_ONLY_ENV` is set for the process."""
    off = os.environ.get(FALLBACK_ONLY_ENV, "").strip().lower() in ("1", "true", "yes", "on")
    return S.build.runtime.recover_errors and not off


def _recover(plan: OpPlan, name: str, args: tuple, kwargs: dict, failed: Exception) -> Any:
    """The call whose device execution raised ``failed``, re-run on the CPU fallback where the
    runtime recovers (counted and warned once as a fallback that says why); ``failed`` itself
    otherwise, and the CPU's own error when the CPU refuses the call too (the user's mistake,
    not the device's: no fallback is counted)."""
    if not _recovering():
        raise failed
    try:
        with raw(2):
            out = plan.op(*args, **kwargs)
    except Exception as cpu_error:
        raise cpu_error from failed
    record(name, True, recovered=f"{type(failed).__name__}: {str(failed).strip().splitlines()[0] if str(failed).strip() else ''}")
    return out


def _run_native(plan: OpPlan, args, kwargs, downcast64: bool, narrow64: bool, upcast16: bool):
    b = S.build
    num = b.numerics
    op = plan.op
    schema = op._schema
    stochastic = num.rounding == "stochastic"
    gen = _generator() if stochastic else None
    changed: list[tuple[torch.Tensor, torch.Tensor]] = []
    orig_dtypes_16 = {}

    def convert(argname: str, t):
        if argname in dtype_args and t is not None:
            # A requested result dtype follows the narrowed computation (cumsum(dtype=int64, out=)):
            # the result is cast back to what the CPU returns below.  The boxed call passes a
            # ScalarType as its int code.
            code = t if isinstance(t, int) else _dtype_code(t)
            if narrow64 and code == _dtype_code(_INT64):
                return torch.int32
            if downcast64 and code == _dtype_code(_F64):
                return torch.float32
            return t
        if not isinstance(t, torch.Tensor) or t.device.type != "neuron":
            return t
        new = t
        if downcast64 and t.dtype == _F64:
            new = t.to(torch.float32)
        elif narrow64 and t.dtype == _INT64 and argname not in INDEX_ARGS:
            new = t.to(torch.int32)
        elif upcast16 and t.dtype in (torch.bfloat16, torch.float16):
            new = t.float()
            orig_dtypes_16[id(new)] = t.dtype
        if argname in plan.matmul and new.dtype == torch.float32 and num.matmul_inputs != "fp32":
            new = _num.round_to_format(new, num.matmul_inputs, stochastic, gen)
        if new is not t:
            changed.append((t, new))
        return new

    sargs = schema.arguments
    dtype_args = ({a.name for a in sargs if "ScalarType" in str(a.real_type)}
                  if (downcast64 or narrow64) else set())
    new_args = []
    for i, a in enumerate(args):
        argname = sargs[i].name if i < len(sargs) else ""
        if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor):
            new_args.append(type(a)(convert(argname, t) for t in a))
        else:
            new_args.append(convert(argname, a))
    new_kwargs = {k: convert(k, v) for k, v in kwargs.items()}
    want = _meta_dtypes(op, args, kwargs) if (downcast64 or narrow64) else None
    sin_input = None
    if plan.sincos:
        x = args[0] if args else kwargs["self"]
        sin_input = x.clone()
    result = op(*new_args, **new_kwargs)

    # Mutated arguments that were converted: write the converted result back into the original.
    mutated = {}
    for i, a in enumerate(sargs):
        if a.alias_info is not None and a.alias_info.is_write:
            v = args[i] if i < len(args) else kwargs.get(a.name)
            if isinstance(v, torch.Tensor):
                mutated[id(v)] = v
    for orig, new in changed:
        if id(orig) in mutated:
            if upcast16 and orig.dtype in (torch.bfloat16, torch.float16):
                new = _num.stochastic_cast(new, orig.dtype, gen)
            if orig.shape != new.shape:
                orig.resize_(new.shape)
            orig.copy_(new)

    # Returns: aliases of (possibly converted) arguments map back to the originals.
    back = {id(new): orig for orig, new in changed}
    any_down = downcast64 or narrow64

    def fix(r, i):
        if not isinstance(r, torch.Tensor):
            return r
        if id(r) in back:
            return back[id(r)]
        if want is not None and i < len(want):
            # The dtype the CPU kernel returns for the original inputs (int32 data indexed by an
            # int64 index stays int32; complex128 stays complex128).
            return r if want[i] is None or r.dtype == want[i] else r.to(want[i])
        if any_down and downcast64 and r.dtype == torch.float32:
            return r.to(_F64)
        if any_down and downcast64 and r.dtype == torch.complex64:
            return r.to(torch.complex128)
        if any_down and narrow64 and r.dtype == torch.int32:
            return r.to(_INT64)
        if upcast16 and r.dtype == torch.float32:
            target = next(iter(orig_dtypes_16.values()))
            return _num.stochastic_cast(r, target, gen)
        return r

    if isinstance(result, tuple):
        result = tuple(fix(r, i) for i, r in enumerate(result))
    elif isinstance(result, list):
        result = [fix(r, i) for i, r in enumerate(result)]
    else:
        result = fix(result, 0)

    outs = _outputs(result)
    if plan.sincos and sin_input is not None:
        poly = _num.sin_no_range_reduction if plan.sincos == "sin" else _num.cos_no_range_reduction
        for o in outs:
            if o.is_floating_point():
                o.copy_(poly(sin_input.to(o.dtype)))
    if plan.transcendental:
        for o in outs:
            if o.is_floating_point():
                o.copy_(_num.round_mantissa(o, num.transcendental_bits, stochastic, gen))
    return result

