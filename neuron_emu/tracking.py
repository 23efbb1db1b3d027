"""Op tracking: the raw guard for the emulator's own calls, the per-operator execution counts
(:func:`record`, with the once-per-op fallback warning and strict mode) and the public tracking API.

Example::

    >>> import torch, neuron_emu
    >>> neuron_emu.clear_op_tracking()
    >>> _ = torch.ones(3, device="neuron") + 1
    >>> "aten::add.Tensor" in neuron_emu.get_executed_ops()
    True
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

from .manifest import FALLBACK_ONLY_ENV
from .routing import S, _ext


@contextlib.contextmanager
def raw(level: int = 1) -> Iterator[None]:
    """Runs the block's neuron ops on the plain zero-copy path, untracked (emulator internals)."""
    ext = _ext()
    prev = ext.set_raw(level)
    try:
        yield
    finally:
        ext.set_raw(prev)


def record(name: str, fallback: bool, rule: str | None = None, recovered: str | None = None) -> None:
    """Counts one execution of `name`; a fallback warns once, or raises in strict mode.  `rule`
    names the dtype/layout rule that sent a natively supported op to the CPU, if one did;
    `recovered` the error of a device execution the runtime re-ran on the CPU, if it was one."""
    ext = _ext()
    if recovered:
        why = (f"operator {name} failed on the device in Neuron SDK build {S.build.name} ({recovered}) "
               f"and was recovered: re-run on the CPU ({FALLBACK_ONLY_ENV}=1 raises the device's error instead)")
    elif rule:
        why = (f"operator {name} has a native kernel in Neuron SDK build {S.build.name} but not for "
               f"{rule} inputs (manifest rule dtypes.{rule} = 'fallback')")
    else:
        why = f"operator {name} is not natively supported by Neuron SDK build {S.build.name}"
    if fallback and ext.get_strict():
        raise RuntimeError(f"neuron_emu strict mode: {why} and would fall back to the CPU "
                           "(NEURON_EMU_STRICT / set_strict)")
    if ext.record(name, fallback):
        warnings.warn(f"neuron: {why}; falling back to the CPU (warned once per operator)",
                      UserWarning, stacklevel=3)


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
