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
                out.append(d)
        return out


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


def perturb_outputs(d: Defect, outputs: list[torch.Tensor]) -> None:
    """Applies wrong_result / nan in place to output tensors."""
    for o in outputs:
        if d.kind == "wrong_result":
            if o.is_floating_point() or o.is_complex():
                o.mul_(1.0 + d.magnitude)
            elif o.dtype != torch.bool:
                o.add_(1)
            else:
                o.logical_not_()
        elif d.kind == "nan":
            if o.is_floating_point() or o.is_complex():
                o.fill_(float("nan"))
            elif o.dtype != torch.bool:
                o.fill_(torch.iinfo(o.dtype).min)


def wrong_dtype(t: torch.Tensor) -> torch.Tensor:
    """The dtype a buggy kernel returns instead of t's."""
    swap = {
        torch.float32: torch.float16, torch.float16: torch.float32, torch.bfloat16: torch.float32,
        torch.float64: torch.float32, torch.int64: torch.int32, torch.int32: torch.int64,
    }
    return t.to(swap.get(t.dtype, torch.float32))
