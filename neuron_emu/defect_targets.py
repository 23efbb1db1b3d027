"""Which ops a defect kind may name: the traits of an ATen overload (view, out=, composite) that
some kinds need, and the backend's own custom ops (``neuron::``, :mod:`neuron_emu.custom_ops`),
which take most kinds plus three that only a custom op can get wrong (its fake implementation,
its backward).  :mod:`neuron_emu.manifest` validates ``[[defects]]`` entries with
:func:`kind_problem`; this module imports no torch until an ATen overload's traits are asked for.

Example::

    >>> kind_problem("neuron::rope.default", "wrong_fake_shape", ()) is None
    True
    >>> kind_problem("aten::mm.default", "wrong_backward", ("aten::mm.default",))[0]
    'kind'
"""

from __future__ import annotations

import fnmatch
import functools
from collections.abc import Iterable

CUSTOM_PREFIX = "neuron::"
#: The backend's custom ops that take autograd (a ``wrong_backward`` defect names one of them).
DIFFERENTIABLE_CUSTOM_OPS = ("neuron::rms_norm.default", "neuron::rope.default", "neuron::flash_attention.default")
#: Every custom op of the backend, as a defect's ``op`` glob spells it: each differentiable op and
#: the op its autograd calls for the gradients ("<name>_backward").
CUSTOM_OPS = tuple(sorted((*DIFFERENTIABLE_CUSTOM_OPS,
                           *(n.replace(".default", "_backward.default") for n in DIFFERENTIABLE_CUSTOM_OPS))))
#: The kinds only a custom op takes: its fake (meta) implementation returns a wrong shape / dtype
#: while the device kernel is right; its gradients are scaled by 1 + magnitude.
CUSTOM_ONLY_KINDS = ("wrong_fake_shape", "wrong_fake_dtype", "wrong_backward")
#: The kinds a custom op takes (view_as_copy and out_reallocates need views or out= arguments,
#: which the custom ops do not have).
CUSTOM_OP_KINDS = (
    "wrong_result", "nan", "wrong_dtype", "error", "crash", "hang", "fallback", "wrong_strides",
    "accepts_invalid", "nondeterministic", "noncontiguous_wrong", "slow", *CUSTOM_ONLY_KINDS,
)


def is_custom(name: str) -> bool:
    """Whether `name` (an op name or a defect glob) is the backend's own custom op (``neuron::``)."""
    return name.startswith(CUSTOM_PREFIX)


@functools.cache
def op_traits(name: str) -> tuple[bool, bool, bool]:
    """(view, out, composite_implicit) of ATen overload `name` ("aten::name.overload"): whether it
    returns an alias of an input that it does not write (a view op), whether it has out=
    arguments, and whether it has a CompositeImplicitAutograd kernel (it then decomposes before
    reaching any device)."""
    import torch

    qual, _, overload = name.partition(".")
    overload = "" if overload == "default" else overload
    try:
        schema = torch._C._get_schema(qual, overload)
    except RuntimeError:
        return False, False, False
    view = any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)
    out = any(a.is_out for a in schema.arguments)
    key = qual if overload == "" else f"{qual}.{overload}"
    implicit = torch._C._dispatch_has_kernel_for_dispatch_key(key, "CompositeImplicitAutograd")
    return view, out, implicit


# Kinds that only mean something for some ATen overloads: the glob must match at least one of them.
_KIND_TARGETS = {
    "view_as_copy": (lambda n: op_traits(n)[0] and not op_traits(n)[2],
                     "a view overload that reaches the device (one returning an alias of an input, without a "
                     "CompositeImplicitAutograd kernel), e.g. 'aten::transpose.int' or 'aten::permute.default'"),
    "out_reallocates": (lambda n: op_traits(n)[1],
                        "an out= overload (one with an out argument), e.g. 'aten::add.out'"),
}


def _matching(glob: str, names: Iterable[str]) -> list[str]:
    return [n for n in names if fnmatch.fnmatchcase(n, glob)]


def kind_problem(glob: str, kind: str, aten: Iterable[str]) -> tuple[str, str] | None:
    """None where a defect of `kind` on op `glob` (an ATen or ``neuron::`` glob; the kind one of
    the manifest's) can act on some op; else (the defect's key at fault, "op" or "kind", what
    would be accepted there).  `aten` is every registered ATen overload."""
    if is_custom(glob):
        if not _matching(glob, CUSTOM_OPS):
            return "op", (f"a '{CUSTOM_PREFIX}' fnmatch glob matching at least one of the backend's custom ops "
                          f"{', '.join(CUSTOM_OPS)}; this one matches none")
        if kind not in CUSTOM_OP_KINDS:
            return "kind", (f"for a custom op (op {glob!r}), one of " + ", ".join(CUSTOM_OP_KINDS) +
                            f" ('{kind}' needs a view or out= ATen overload)")
        if kind == "wrong_backward" and not _matching(glob, DIFFERENTIABLE_CUSTOM_OPS):
            return "op", ("for kind 'wrong_backward', a glob matching at least one differentiable custom op "
                          f"({', '.join(DIFFERENTIABLE_CUSTOM_OPS)}: their gradients are scaled); this one "
                          "matches none")
        return None
    if kind in CUSTOM_ONLY_KINDS:
        return "kind", (f"for an ATen op (op {glob!r}), a kind other than " + ", ".join(CUSTOM_ONLY_KINDS) +
                        f": those act only on the backend's custom ops ({', '.join(CUSTOM_OPS)})")
    target = _KIND_TARGETS.get(kind)
    if target is None:
        return None
    fits, what = target
    if not any(fits(n) for n in _matching(glob, aten)):
        return "op", f"for kind '{kind}', a glob matching at least one {what}; this one matches none"
    return None
