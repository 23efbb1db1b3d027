"""Per-operator routing under the active SDK build: the operator classes, :class:`OpPlan`, the
routing state shared by the whole emulator (:data:`S`), and :func:`classify`.

The C++ fallback asks :func:`classify` once per operator and caches the answer:

* ``NATIVE``   -- zero-copy CPU kernel, counted as native; inputs of a dtype/layout with a
  non-native rule (float64, int64, complex, channels_last) divert the call to the Python handler;
* ``FALLBACK`` -- zero-copy CPU kernel, counted as a fallback (warn once, error if strict);
* ``PYTHON``   -- the Python handler (:func:`neuron_emu.dispatch.handle`) runs it: build numerics
  and defects.

``slow`` defects change none of that: :func:`classify` hands the C++ fallback their time factor
and filters (dtype mask, ``min_numel``) beside the action, and the fallback times each matching
call -- whichever path runs it -- and busy-works until the factor times that time has passed.

Infrastructure ops (allocation, copies, views: ``INFRA_GLOBS``) are always ``NATIVE`` and untouched
by numerics, dtype rules and defects -- except that a ``view_as_copy`` defect may name a view op:
that one op goes to the Python handler (a composite view op such as transpose.int gets a direct
device kernel for as long as the build is active, so that it reaches the device under its own name).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import torch

from . import defects as _defects
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
    defects: list[int] = dataclasses.field(default_factory=list)   # handled in Python (not slow)
    slow: list[int] = dataclasses.field(default_factory=list)      # slow defects: timed in C++
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
                and (has(key, "CompositeExplicitAutograd")
                     or has(key, "CompositeExplicitAutogradNonFunctional"))):
            out.append(key.split("::", 1)[1])
    return out


def _defect_applies(kind: str, name: str, infra: bool) -> bool:
    """Whether a defect of `kind` whose glob matches op `name` can act on it."""
    if infra and kind not in INFRA_DEFECT_KINDS:
        return False  # allocation, copies, views: never subject to the other kinds (slow included)
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
        hits = [i for i in ds.for_op(name) if _defect_applies(ds.defects[i].kind, name, infra)]
        plan.defects = [i for i in hits if ds.defects[i].kind != "slow"]
        plan.slow = [i for i in hits if ds.defects[i].kind == "slow"]
    S.plans[name] = plan
    return plan


_NO_SLOW = (1.0, 0, 0)


def _slow_rules(plan: OpPlan) -> list[tuple[float, int, int]]:
    """The op's slow defects as (time factor, dtype mask (0: any dtype), min_numel) rules for the C++
    fallback: defects with the same filters are merged (their factors multiply); a call is slowed by
    the product of the factors of the rules it matches.  A defect with an empty ``dtypes`` list
    never matches a call, and is left out."""
    by_name = {v: k for k, v in _defects._DTYPE_NAMES.items()}
    rules: dict[tuple[int, int], float] = {}
    for i in plan.slow:
        d = S.defect_state.defects[i]
        mask = 0
        if d.dtypes is not None:
            if not d.dtypes:
                continue
            for n in d.dtypes:
                mask |= 1 << _dtype_code(by_name[n])
        key = (mask, int(d.min_numel))
        rules[key] = rules.get(key, 1.0) * float(d.magnitude)
    return [(f, m, n) for (m, n), f in rules.items()]


def classify(name: str) -> tuple:
    """Called by the C++ fallback once per operator: (action, dtype mask, check channels_last,
    allow CPU tensors, slow factor, slow dtype mask, slow min_numel[, further slow rules]).

    The slow fields (factor 1.0: not slowed; mask 0: any dtype) say when the fallback makes a call
    take `factor` times as long, whatever the action (see :func:`_slow_rules`); slow defects with
    other filters on the same op come as an 8th field, a tuple of such (factor, mask, min_numel)."""
    plan = plan_for(name)
    rules = _slow_rules(plan) if plan.slow else []
    slow = tuple(rules[0]) if rules else _NO_SLOW
    more = (tuple(rules[1:]),) if len(rules) > 1 else ()
    return (*_route(plan, name), *slow, *more)


def _route(plan: OpPlan, name: str) -> tuple[int, int, bool, bool]:
    """(action, dtype mask, check channels_last, allow CPU tensors) of `plan`'s op."""
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

