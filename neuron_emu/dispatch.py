"""Routing of ATen operators on the ``neuron`` device, per the active SDK build.

The C++ fallback asks :func:`classify` once per operator and caches the answer:

* ``NATIVE``   -- zero-copy CPU kernel, counted as native; inputs of a dtype/layout with a
  non-native rule (float64, int64, complex, channels_last) divert the call to :func:`handle`;
* ``FALLBACK`` -- zero-copy CPU kernel, counted as a fallback (warn once, error if strict);
* ``PYTHON``   -- :func:`handle` runs it: build numerics (matmul operand rounding, transcendental
  precision, sin/cos without range reduction, stochastic rounding) and defects.

Infrastructure ops (allocation, copies, views: ``INFRA_GLOBS``) are always ``NATIVE`` and untouched
by numerics, dtype rules and defects -- except that a ``view_as_copy`` defect may name a view op:
that one op goes to :func:`handle` (a composite view op such as transpose.int gets a direct device
kernel for as long as the build is active, so that it reaches the device under its own name).

Inside :func:`handle` the emulator's own calls run under a thread-local "raw" guard: they take
the plain zero-copy path and are not recorded as user ops.

Example::

    >>> import torch, neuron_emu
    >>> neuron_emu.clear_op_tracking()
    >>> _ = torch.ones(3, device="neuron") + 1
    >>> "aten::add.Tensor" in neuron_emu.get_executed_ops()
    True
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from . import defects as _defects
from . import numerics as _num
from ._build import load_extension
from .manifest import Build, _regex, op_traits

NATIVE, FALLBACK, PYTHON = 1, 2, 3

# Device infrastructure: allocation, copies, views and metadata.  Always native, never subject to
# dtype rules, numerics or defects.
INFRA_GLOBS = (
    "aten::empty.*", "aten::empty_strided.*", "aten::_copy_from*", "aten::copy_.*", "aten::_to_copy.*",
    "aten::clone.*", "aten::view.*", "aten::_unsafe_view.*", "aten::as_strided*", "aten::_reshape_alias*",
    "aten::resize_.*", "aten::resize_as_.*", "aten::set_.*", "aten::_local_scalar_dense.*",
    "aten::alias.*", "aten::detach*", "aten::t.*", "aten::t_.*", "aten::transpose*", "aten::permute.*",
    "aten::expand.*", "aten::squeeze*", "aten::unsqueeze*", "aten::select.int", "aten::slice.Tensor",
    "aten::unfold.*", "aten::diagonal.*", "aten::view_as_real.*", "aten::view_as_complex.*",
    "aten::_neg_view.*", "aten::_conj.*", "aten::lift_fresh*", "aten::fill_.*", "aten::zero_.*",
    "aten::_pin_memory.*", "aten::is_pinned.*", "aten::_has_compatible_shallow_copy_type.*",
    "aten::record_stream.*", "aten::split.Tensor", "aten::split_with_sizes.*", "aten::unbind.*",
    "aten::chunk.*", "aten::narrow.*", "aten::_nested*", "aten::empty_like.*", "aten::new_empty*",
    "aten::_resize_output_*", "aten::_make_per_*", "aten::real.*", "aten::imag.*", "aten::_fw_primal.*",
    "aten::_make_dual.*", "aten::_unpack_dual.*",
)
# The only defect kind that reaches infrastructure (view) ops.
INFRA_DEFECT_KINDS = frozenset({"view_as_copy"})
# Ops that may legitimately receive non-scalar CPU tensors (cross-device copies, CPU indices).
ALLOW_CPU_GLOBS = (
    "aten::copy_.*", "aten::_copy_from*", "aten::_to_copy.*", "aten::set_.*", "aten::index.Tensor*",
    "aten::index_put*", "aten::_index_put_impl_*", "aten::lift_fresh*",
)
MATMUL_OPERANDS: dict[str, tuple[str, ...]] = {
    "mm": ("self", "mat2"), "bmm": ("self", "mat2"), "addmm": ("mat1", "mat2"), "addmm_": ("mat1", "mat2"),
    "baddbmm": ("batch1", "batch2"), "baddbmm_": ("batch1", "batch2"), "addbmm": ("batch1", "batch2"),
    "addmv": ("mat", "vec"), "mv": ("self", "vec"), "dot": ("self", "tensor"), "vdot": ("self", "other"),
    "_addmm_activation": ("mat1", "mat2"), "linear": ("input", "weight"), "matmul": ("self", "other"),
    "convolution_overrideable": ("input", "weight"),
    "convolution_backward_overrideable": ("grad_output", "input", "weight"),
    "_scaled_dot_product_attention_math": ("query", "key", "value"),
}
TRANSCENDENTALS = frozenset(
    "exp exp2 expm1 log log2 log10 log1p tanh sigmoid gelu silu erf rsqrt reciprocal sin cos".split()
)
ARITH = frozenset("add sub mul div addcmul addcdiv rsub lerp".split())
INDEX_ARGS = frozenset({"index", "indices", "offsets", "target"})
# Ops whose result shape depends on the integer width (arange's length): computed in int64.
NO_NARROW = frozenset({"arange", "range"})
_INT64, _F64 = torch.int64, torch.float64
_COMPLEX = (torch.complex32, torch.complex64, torch.complex128)


@dataclasses.dataclass
class OpPlan:
    """What the emulator does with one operator under the active build."""

    name: str
    base: str
    native: bool
    infra: bool
    matmul: tuple[str, ...] = ()
    transcendental: bool = False
    sincos: str | None = None
    arith: bool = False
    defects: list[int] = dataclasses.field(default_factory=list)
    _op: Any = None

    @property
    def op(self):
        if self._op is None:
            ns, rest = self.name.split("::", 1)
            base, overload = rest.split(".", 1) if "." in rest else (rest, "default")
            self._op = getattr(getattr(getattr(torch.ops, ns), base), overload)
        return self._op


class _State:
    build: Build | None = None
    plans: dict[str, OpPlan] = {}
    defect_state: _defects.DefectState | None = None
    dtype_codes: dict[torch.dtype, int] = {}
    warned_py: set[str] = set()


S = _State()
_tls = threading.local()


def _ext():
    return load_extension()


def _dtype_code(dt: torch.dtype) -> int:
    code = S.dtype_codes.get(dt)
    if code is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            code = S.dtype_codes[dt] = _ext().scalar_type_code(torch.empty(0, dtype=dt))
    return code


def activate(build: Build) -> None:
    """Makes `build` the active build (clears the per-op routing caches)."""
    S.build = build
    S.plans = {}
    S.defect_state = _defects.DefectState(build.name, build.defects)
    _ext().set_build(build.name, bool(build.numerics.flush_denormals))
    _ext().set_defect_kernels([])  # the previous build's, before asking who has a device kernel
    _ext().set_defect_kernels(_composite_defect_views(build))
    # SDPA takes the CPU's fused kernel only where the build has that kernel natively (else math).
    _ext().set_sparse(build.dtypes.sparse == "native")
    _ext().set_sdp_cpu_choice(build.is_native("aten::_scaled_dot_product_flash_attention_for_cpu.default"))


def _composite_defect_views(build: Build) -> list[str]:
    """The composite view ops (no device kernel of their own: transpose.int, permute, ...) that a
    view_as_copy defect of `build` names, spelled for torch.library ("transpose.int", "permute")."""
    from .manifest import aten_overloads

    globs = tuple(d.op for d in build.defects if d.kind == "view_as_copy")
    if not globs:
        return []
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    rx = _regex(globs)
    out = []
    for name in aten_overloads():
        if not rx.match(name):
            continue
        view, _, implicit = op_traits(name)
        key = name[:-len(".default")] if name.endswith(".default") else name
        if (view and not implicit and not has(key, "PrivateUse1")
                and (has(key, "CompositeExplicitAutograd") or has(key, "CompositeExplicitAutogradNonFunctional"))):
            out.append(key.split("::", 1)[1])
    return out


def _defect_applies(kind: str, name: str, infra: bool) -> bool:
    """Whether a defect of `kind` whose glob matches op `name` can act on it."""
    if infra and kind not in INFRA_DEFECT_KINDS:
        return False  # allocation, copies, views: never subject to the other kinds
    if kind == "view_as_copy":
        return op_traits(name)[0]
    if kind == "out_reallocates":
        return op_traits(name)[1]
    return True


def plan_for(name: str) -> OpPlan:
    plan = S.plans.get(name)
    if plan is not None:
        return plan
    b = S.build
    assert b is not None
    base = name.split("::", 1)[1].split(".", 1)[0]
    infra = bool(_regex(INFRA_GLOBS).match(name))
    num = b.numerics
    stem = base.rstrip("_")
    plan = OpPlan(name=name, base=base, native=infra or b.is_native(name), infra=infra)
    if not infra:
        if num.matmul_inputs != "fp32" or num.rounding == "stochastic":
            plan.matmul = MATMUL_OPERANDS.get(base, ())
        plan.transcendental = stem in TRANSCENDENTALS and num.transcendental_bits < 23
        if stem in ("sin", "cos") and not num.sin_range_reduction:
            plan.sincos = stem
        plan.arith = num.rounding == "stochastic" and (stem in ARITH or stem in MATMUL_OPERANDS)
    if S.defect_state:
        ds = S.defect_state
        plan.defects = [i for i in ds.for_op(name) if _defect_applies(ds.defects[i].kind, name, infra)]
    S.plans[name] = plan
    return plan


def classify(name: str) -> tuple[int, int, bool, bool]:
    """Called by the C++ fallback once per operator: (action, dtype mask, check channels_last,
    allow CPU tensors)."""
    plan = plan_for(name)
    allow_cpu = bool(_regex(ALLOW_CPU_GLOBS).match(name))
    if plan.infra:
        return (PYTHON if plan.defects else NATIVE), 0, False, allow_cpu
    if plan.defects or plan.matmul or plan.transcendental or plan.sincos:
        return PYTHON, 0, False, allow_cpu
    if not plan.native:
        return FALLBACK, 0, False, allow_cpu
    rules = S.build.dtypes
    mask = 0
    if rules.float64 != "native":
        mask |= 1 << _dtype_code(_F64)
    if rules.int64 != "native":
        mask |= 1 << _dtype_code(_INT64)
    if rules.complex != "native":
        for dt in _COMPLEX:
            mask |= 1 << _dtype_code(dt)
    if plan.arith:
        mask |= (1 << _dtype_code(torch.bfloat16)) | (1 << _dtype_code(torch.float16))
    return NATIVE, mask, rules.channels_last != "native", allow_cpu


@contextlib.contextmanager
def raw(level: int = 1) -> Iterator[None]:
    """Runs the block's neuron ops on the plain zero-copy path, untracked (emulator internals)."""
    ext = _ext()
    prev = ext.set_raw(level)
    try:
        yield
    finally:
        ext.set_raw(prev)


def record(name: str, fallback: bool, rule: str | None = None) -> None:
    """Counts one execution of `name`; a fallback warns once, or raises in strict mode.  `rule`
    names the dtype/layout rule that sent a natively supported op to the CPU, if one did."""
    ext = _ext()
    why = (f"operator {name} has a native kernel in Neuron SDK build {S.build.name} but not for "
           f"{rule} inputs (manifest rule dtypes.{rule} = 'fallback')" if rule else
           f"operator {name} is not natively supported by Neuron SDK build {S.build.name}")
    if fallback and ext.get_strict():
        raise RuntimeError(f"neuron_emu strict mode: {why} and would fall back to the CPU "
                           "(NEURON_EMU_STRICT / set_strict)")
    if ext.record(name, fallback):
        warnings.warn(f"neuron: {why}; falling back to the CPU (warned once per operator)",
                      UserWarning, stacklevel=3)


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
    """Runs one operator call with the active build's dtype rules, numerics and defects."""
    plan = plan_for(name)
    b = S.build
    tensors = _neuron_tensors(args, kwargs)
    fired = S.defect_state.firing(plan.defects, tensors) if plan.defects else []
    fallback = not plan.native
    rule_fallback = None
    for d in fired:
        if d.kind in ("error", "crash", "hang"):
            _defects.raise_now(d, name, b.name)
        elif d.kind == "fallback":
            fallback = True
    downcast64 = narrow64 = upcast16 = False
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
    record(name, fallback, rule_fallback)
    try:
        if fallback:
            with raw(2):
                out = plan.op(*args, **kwargs)
        else:
            with raw(1):
                out = _run_native(plan, args, kwargs, downcast64, narrow64, upcast16)
    except Exception as err:
        if not any(d.kind == "accepts_invalid" for d in fired):
            raise
        with raw(2):
            return _garbage(plan, args, kwargs, err)  # accepts_invalid: what the kernel rejects, it returns
    if fired:
        with raw(2):
            out = _apply_output_defects(plan, fired, out, args, kwargs)
    return out


def _outputs(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [o for o in out if isinstance(o, torch.Tensor)]
    return []


def _return_kind(ret) -> str:
    """"fresh" (a new tensor), "written" (an out=/in-place argument) or "view" (an alias of an input)."""
    if ret.alias_info is None:
        return "fresh"
    return "written" if ret.alias_info.is_write else "view"


def _map_returns(plan: OpPlan, out, fn):
    """`out` with fn(tensor, return kind) applied to each tensor it holds (list elements included)."""
    rets = plan.op._schema.returns

    def one(v, ret):
        kind = _return_kind(ret)
        if isinstance(v, torch.Tensor):
            return fn(v, kind)
        if isinstance(v, list):
            return [fn(t, kind) if isinstance(t, torch.Tensor) else t for t in v]
        return v

    if len(rets) == 1:
        return one(out, rets[0])
    if isinstance(out, (tuple, list)) and len(out) == len(rets):
        return type(out)(one(v, r) for v, r in zip(out, rets, strict=True))
    return out


def _arg_values(plan: OpPlan, args, kwargs):
    """(schema argument, value) for every argument of the call."""
    for i, a in enumerate(plan.op._schema.arguments):
        if i < len(args):
            yield a, args[i]
        elif a.name in kwargs:
            yield a, kwargs[a.name]


def _tensors_of(v) -> list[torch.Tensor]:
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (list, tuple)):
        return [t for t in v if isinstance(t, torch.Tensor)]
    return []


def _input_tensors(plan: OpPlan, args, kwargs) -> list[torch.Tensor]:
    """The call's neuron tensor inputs: every tensor argument the op does not write (not out=)."""
    return [t for a, v in _arg_values(plan, args, kwargs)
            if a.alias_info is None or not a.alias_info.is_write
            for t in _tensors_of(v) if t.device.type == "neuron"]


def _out_tensors(plan: OpPlan, args, kwargs) -> list[torch.Tensor]:
    return [t for a, v in _arg_values(plan, args, kwargs) if a.is_out for t in _tensors_of(v)]


def _reallocate(t: torch.Tensor) -> None:
    """out_reallocates: `t` keeps its values, sizes and strides in new storage."""
    fresh = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device)
    fresh.copy_(t)
    t.set_(fresh)


def _garbage(plan: OpPlan, args, kwargs, err: Exception):
    """accepts_invalid: the result of a call the CPU kernel rejected -- zeros shaped like the first
    tensor input for fresh results, the out= tensors zeroed, in-place arguments as they are."""
    schema = plan.op._schema
    inputs = _input_tensors(plan, args, kwargs)
    outs = _out_tensors(plan, args, kwargs)
    for t in outs:
        t.zero_()
    written = {}
    for a, v in _arg_values(plan, args, kwargs):
        if a.alias_info is not None and a.alias_info.is_write:
            written.setdefault(frozenset(a.alias_info.before_set), v)
    like = outs[0] if outs else (inputs[0] if inputs else None)
    res = []
    for r in schema.returns:
        typ = str(r.type)
        if r.alias_info is not None and r.alias_info.is_write and frozenset(r.alias_info.before_set) in written:
            res.append(written[frozenset(r.alias_info.before_set)])
        elif typ == "Tensor":
            res.append(_defects.garbage_like(like, "neuron"))
        elif typ == "List[Tensor]":
            res.append([_defects.garbage_like(like, "neuron")])
        elif typ in ("bool", "int", "SymInt", "float", "Scalar"):
            res.append(False if typ == "bool" else 0.0 if typ == "float" else 0)
        elif typ.startswith("Optional["):
            res.append(None)
        else:
            raise err  # no garbage of this return type: the kernel's error stands
    if not res:
        return None
    return res[0] if len(res) == 1 else tuple(res)


def _apply_output_defects(plan: OpPlan, fired, out, args, kwargs):
    for d in fired:
        if d.kind in ("wrong_result", "nan"):
            _defects.perturb_outputs(d, _outputs(out))
        elif d.kind == "wrong_dtype":
            if isinstance(out, torch.Tensor):
                out = _defects.wrong_dtype(out)
            elif isinstance(out, tuple):
                out = tuple(_defects.wrong_dtype(o) if isinstance(o, torch.Tensor) else o for o in out)
        elif d.kind == "wrong_strides":
            out = _map_returns(plan, out, lambda t, k: _defects.relayout(t) if k == "fresh" else t)
        elif d.kind == "view_as_copy":
            out = _map_returns(plan, out, lambda t, k: t.clone(memory_format=torch.contiguous_format)
                               if k == "view" else t)
        elif d.kind == "out_reallocates":
            for t in _out_tensors(plan, args, kwargs):
                _reallocate(t)
        elif d.kind == "nondeterministic":
            if S.defect_state.times_fired(d) % 2 == 0:  # every second call: consecutive calls differ
                for t in _results(plan, out):
                    _defects.nudge_ulp(t)
        elif d.kind == "noncontiguous_wrong":
            if any(not t.is_contiguous() for t in _input_tensors(plan, args, kwargs)):
                _defects.perturb_outputs(d, _results(plan, out), "wrong_result")
    return out


def _results(plan: OpPlan, out) -> list[torch.Tensor]:
    """The tensors a call produced (fresh or written), not the views of its inputs it returned."""
    got: list[torch.Tensor] = []

    def keep(t, kind):
        if kind != "view":
            got.append(t)
        return t

    _map_returns(plan, out, keep)
    return got


def _to_meta(v):
    if isinstance(v, torch.Tensor):
        if v.device.type == "cpu" and v.dim() == 0:
            return v  # a CPU scalar (possibly a wrapped Python number) stays as it is
        return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
    if isinstance(v, torch.device) and v.type == "neuron":
        return torch.device("meta")
    if isinstance(v, (list, tuple)) and any(isinstance(t, torch.Tensor) for t in v):
        return type(v)(_to_meta(t) if t is not None else None for t in v)
    return v


#: The result dtypes of a meta run, per operator and argument signature (:func:`_dtype_key`):
#: a meta kernel in Python costs ~0.2 ms, 40x an int64 add, and every int64/float64 call asks.
_META_DTYPES: dict[tuple, list[torch.dtype | None]] = {}
_META_DTYPES_MAX = 16384
_BOOL_PROBE = torch.empty(1, dtype=torch.bool)


def _dtype_key(v: Any) -> Any:
    """What of an argument can decide a result dtype: a tensor's dtype, whether it is 0-dim
    (type promotion ranks those below dimensioned tensors) and, for a CPU scalar (a wrapped
    Python number among them), how it promotes; everything else by type and value.
    Shapes and values of tensors are left out: no kernel's result dtype depends on them."""
    if isinstance(v, torch.Tensor):
        if v.dim() == 0 and v.device.type == "cpu":
            # A CPU scalar may be a wrapped Python number, which promotes as its category's
            # default dtype (t + 1.5 is float32 for an int64 t; t + tensor(1.5, float64) is
            # float64): how it promotes against a bool tensor tells the two apart.
            return ("S", v.dtype, torch.result_type(_BOOL_PROBE, v))
        return ("T", v.dtype, v.dim() == 0, v.layout)
    if isinstance(v, (list, tuple)):
        return (type(v), tuple(_dtype_key(x) for x in v))
    if isinstance(v, (bool, int, float, complex, str, torch.dtype, torch.device, torch.layout,
                      torch.memory_format)) or v is None:
        return (type(v), v)
    if isinstance(v, torch.Generator):
        return (torch.Generator,)
    raise TypeError("no dtype key")  # anything else: not cached


def _meta_dtypes(op, args, kwargs) -> list[torch.dtype | None] | None:
    """The result dtypes the CPU kernel would give for these (unconverted) arguments, from the
    op's meta kernel; None when it has none (the caller then uses its per-rule heuristic).
    Successful answers are cached per operator and argument signature (:func:`_dtype_key`);
    a failed meta run is asked again (it may depend on shapes)."""
    try:
        key = (op, _dtype_key(args), _dtype_key(tuple(sorted(kwargs.items()))))
    except TypeError:
        key = None
    if key is not None:
        hit = _META_DTYPES.get(key)
        if hit is not None:
            return hit
    got = _meta_dtypes_uncached(op, args, kwargs)
    if key is not None and got is not None:
        if len(_META_DTYPES) >= _META_DTYPES_MAX:
            _META_DTYPES.clear()
        _META_DTYPES[key] = got
    return got


def _meta_dtypes_uncached(op, args, kwargs) -> list[torch.dtype | None] | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = op(*[_to_meta(a) for a in args], **{k: _to_meta(v) for k, v in kwargs.items()})
    except Exception:
        return None
    items = res if isinstance(res, (tuple, list)) else [res]
    return [r.dtype if isinstance(r, torch.Tensor) else None for r in items]


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
    dtype_args = {a.name for a in sargs if "ScalarType" in str(a.real_type)} if (downcast64 or narrow64) else set()
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


# ------------------------------------------------------------------ public tracking API
def get_executed_ops() -> list[str]:
    """All operator overloads that reached the device backend (native or fallback), sorted."""
    return sorted(_ext().get_counts())


def get_fallback_ops() -> list[str]:
    """Operator overloads that ran on the CPU fallback, sorted."""
    return sorted(k for k, (_, f) in _ext().get_counts().items() if f)


def get_native_ops() -> list[str]:
    """Operator overloads that ran natively, sorted."""
    return sorted(k for k, (n, _) in _ext().get_counts().items() if n)


def get_op_counts() -> dict[str, dict[str, int]]:
    """{"aten::name.overload": {"native": n, "fallback": m}} for every executed overload."""
    return {k: {"native": n, "fallback": f} for k, (n, f) in sorted(_ext().get_counts().items())}


def clear_op_tracking() -> None:
    """Forgets executed/fallback ops (the once-per-op fallback warning stays once per process)."""
    _ext().clear_counts()


@contextlib.contextmanager
def op_tracking() -> Iterator[dict[str, dict[str, int]]]:
    """Context manager yielding a dict filled, on exit, with the op counts of the block only."""
    before = get_op_counts()
    result: dict[str, dict[str, int]] = {}
    try:
        yield result
    finally:
        after = get_op_counts()
        for k, v in after.items():
            b = before.get(k, {"native": 0, "fallback": 0})
            d = {"native": v["native"] - b["native"], "fallback": v["fallback"] - b["fallback"]}
            if d["native"] or d["fallback"]:
                result[k] = d
