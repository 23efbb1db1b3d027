"""Injected SDK bugs ("defects"): matching a call against a build's ``[[defects]]`` and applying them.

A defect fires for a call when its op glob matches, an input dtype is listed (if ``dtypes`` is
given), the largest input has at least ``min_numel`` elements, and -- for ``probability`` < 1 -- a
per-process RNG seeded by (build, defect index, call counter) says so.  The same call therefore
succeeds on some repetitions and fails on others, deterministically for a given process history.

Example::

    >>> from neuron_emu.defects import DefectState
    >>> from neuron_emu.manifest import Defect
    >>> st = DefectState("b", (Defect(op="aten::mm.default", kind="error", probability=0.5),))
    >>> sorted({st.roll(0) for _ in range(50)})
    [False, True]
"""

from __future__ import annotations

import os
import random
import sys
import time

import torch

from .manifest import Defect

_DTYPE_NAMES = {
    torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32",
    torch.float64: "float64", torch.int8: "int8", torch.uint8: "uint8", torch.int16: "int16",
    torch.int32: "int32", torch.int64: "int64", torch.bool: "bool", torch.complex64: "complex64",
    torch.complex128: "complex128",
}


class DefectState:
    """Per-process firing state of one build's defects."""

    def __init__(self, build_name: str, defects: tuple[Defect, ...]):
        self.build_name = build_name
        self.defects = defects
        self.calls = [0] * len(defects)
        self.fired = [0] * len(defects)   # times each defect fired (nondeterministic alternates on it)
        self._index = {id(d): i for i, d in enumerate(defects)}

    def for_op(self, name: str) -> list[int]:
        """Indices of the defects whose op glob matches `name`."""
        return [i for i, d in enumerate(self.defects) if d.matches_name(name)]

    def roll(self, i: int) -> bool:
        d = self.defects[i]
        n = self.calls[i]
        self.calls[i] += 1
        if d.probability >= 1.0:
            return True
        return random.Random(f"{self.build_name}|{i}|{n}").random() < d.probability

    def firing(self, indices: list[int], tensors: list[torch.Tensor]) -> list[Defect]:
        """The defects among `indices` that fire for a call with input `tensors`."""
        out = []
        for i in indices:
            d = self.defects[i]
            if d.dtypes is not None and not any(_DTYPE_NAMES.get(t.dtype) in d.dtypes for t in tensors):
                continue
            if d.min_numel and max((t.numel() for t in tensors), default=0) < d.min_numel:
                continue
            if self.roll(i):
                self.fired[i] += 1
                out.append(d)
        return out

    def times_fired(self, d: Defect) -> int:
        """How many calls `d` (one of this build's defects) has fired for, this one included."""
        return self.fired[self._index[id(d)]]


def raise_now(d: Defect, op_name: str, build_name: str) -> None:
    """Acts on the defects that act before the op runs: error, crash, hang."""
    what = f"{op_name} (injected defect {d.source} of Neuron SDK build {build_name}" + (
        f": {d.note})" if d.note else ")")
    if d.kind == "error":
        raise RuntimeError(f"neuron: internal compiler/runtime error in {what}")
    if d.kind == "crash":
        sys.stderr.write(f"neuron_emu: NRT device fault (SIGABRT) in {what}\n")
        sys.stderr.flush()
        os.abort()
    if d.kind == "hang":
        sys.stderr.write(f"neuron_emu: device hang in {what}\n")
        sys.stderr.flush()
        while True:
            time.sleep(3600)


def perturb_outputs(d: Defect, outputs: list[torch.Tensor], kind: str | None = None) -> None:
    """Applies wrong_result / nan (`kind`, default d.kind) in place to output tensors."""
    kind = kind or d.kind
    for o in outputs:
        if kind == "wrong_result":
            if o.is_floating_point() or o.is_complex():
                o.mul_(1.0 + d.magnitude)
            elif o.dtype != torch.bool:
                o.add_(1)
            else:
                o.logical_not_()
        elif kind == "nan":
            if o.is_floating_point() or o.is_complex():
                o.fill_(float("nan"))
            elif o.dtype != torch.bool:
                o.fill_(torch.iinfo(o.dtype).min)


_WRONG_DTYPE = {
    torch.float32: torch.float16, torch.float16: torch.float32, torch.bfloat16: torch.float32,
    torch.float64: torch.float32, torch.int64: torch.int32, torch.int32: torch.int64,
}


def wrong_dtype_of(dtype: torch.dtype) -> torch.dtype:
    """The dtype a buggy kernel returns instead of `dtype`."""
    return _WRONG_DTYPE.get(dtype, torch.float32)


def wrong_dtype(t: torch.Tensor) -> torch.Tensor:
    """`t` in the dtype a buggy kernel returns instead of t's."""
    return t.to(wrong_dtype_of(t.dtype))


def relayout(o: torch.Tensor) -> torch.Tensor:
    """wrong_strides: `o`'s values (bitwise) in another memory layout.  With >= 2 dims of size > 1:
    another dense dim order (column-major, or row-major where `o` already is column-major);
    otherwise a copy at another storage offset."""
    big = [i for i, n in enumerate(o.shape) if n > 1]
    if len(big) >= 2:
        rev = list(range(o.dim()))[::-1]
        new = o.permute(rev).contiguous().permute(rev)
        if [new.stride(i) for i in big] == [o.stride(i) for i in big]:
            new = o.clone(memory_format=torch.contiguous_format)
        return new
    off = 2 if o.storage_offset() == 1 else 1
    buf = torch.empty(o.numel() + off, dtype=o.dtype, device=o.device)
    new = buf[off:].view(o.shape)
    new.copy_(o)
    return new


_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def nudge_ulp(o: torch.Tensor) -> None:
    """nondeterministic: moves every finite element of a floating (or complex) tensor by one ULP in
    place -- toward zero, or away from it for zeros -- so it never overflows to inf.  Integer and
    bool tensors are left alone."""
    if o.is_complex():
        o = torch.view_as_real(o)
    if not o.is_floating_point() or o.numel() == 0:
        return
    bits = o.view(_BITS[o.element_size()])
    step = torch.where(o == 0, 1, torch.where(torch.isfinite(o), -1, 0)).to(bits.dtype)
    bits.add_(step)


def garbage_like(t: torch.Tensor | None, device) -> torch.Tensor:
    """accepts_invalid: what a call that should have raised returns for one fresh tensor result."""
    if t is None:
        return torch.zeros((), device=device)
    return torch.zeros(t.shape, dtype=t.dtype, device=t.device)
