"""Tracing a model's calls: the counting/recording dispatch mode, the CPU reference run, tensor moves."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from conformance.catalog.overloads import op_name
from conformance.check.compare import leaves
from conformance.structure import map_leaves, map_tensors

from .results import AuditInputError

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
RECORDS_PER_OP = 2  # isolated checks per overload (its first calls)


@dataclass
class Record:
    func: Any
    args: Any  # CPU copies of the call's inputs, taken before it ran
    kwargs: Any


class Recorder(TorchDispatchMode):
    """Counts every overload (any namespace), records the first calls' inputs (CPU copies) and
    notes dtype/layout facts of the outputs."""

    def __init__(self, record: bool = False, facts: bool = False) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()
        self.order: list[str] = []
        self.records: dict[str, list[Record]] = {}
        self.record, self.facts = record, facts
        self.seen: dict[str, set[str]] = {"float64": set(), "complex": set(), "channels_last": set(),
                                          "int64_range": set()}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        name = op_name(func)
        if name not in self.counts:
            self.order.append(name)
        self.counts[name] += 1
        if self.record and len(self.records.setdefault(name, [])) < RECORDS_PER_OP:
            cpu = tree_map(lambda x: x.detach().to("cpu", copy=True) if isinstance(x, torch.Tensor) else x,
                           (args, kwargs))
            self.records[name].append(Record(func, cpu[0], cpu[1]))
        out = func(*args, **kwargs)
        if self.facts:
            self._facts(name, out)
        return out

    def _facts(self, name: str, out: Any) -> None:
        for t in leaves(out):
            if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
                continue
            if t.dtype == torch.float64:
                self.seen["float64"].add(name)
            elif t.is_complex():
                self.seen["complex"].add(name)
            elif t.dtype == torch.int64 and t.numel() and name not in self.seen["int64_range"]:
                if int(t.min()) < INT32_MIN or int(t.max()) > INT32_MAX:
                    self.seen["int64_range"].add(name)
            if t.dim() == 4 and t.shape[1] > 1 and t.shape[2] * t.shape[3] > 1 and \
                    t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous():
                self.seen["channels_last"].add(name)


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip()[:1000]


def to_cpu(tree: Any) -> Any:
    return map_tensors(lambda x: x.detach().to("cpu"), tree)


def devices_to(tree: Any, dev: torch.device) -> Any:
    def one(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return x.to(dev)
        if isinstance(x, torch.device) and x.type == "cpu":
            return dev
        return x
    return map_leaves(one, tree)


def main_dtype(model: nn.Module) -> str:
    for p in list(model.parameters()) + list(model.buffers()):
        if p.is_floating_point():
            name = str(p.dtype).removeprefix("torch.")
            return name if name in ("float32", "float64", "bfloat16", "float16") else "float32"
    return "float32"


def inputs_label(inputs: tuple) -> str:
    return "; ".join(f"[{','.join(map(str, x.shape))}] {str(x.dtype).removeprefix('torch.')}"
                     if isinstance(x, torch.Tensor) else type(x).__name__ for x in inputs)


def cpu_run(model: nn.Module, inputs: tuple, what: str = "the model") -> tuple[Any, Recorder]:
    rec = Recorder(facts=True)
    try:
        with torch.no_grad(), rec:
            out = model(*inputs)
    except Exception as exc:  # noqa: BLE001
        raise AuditInputError(f"{what} fails on the CPU with inputs {inputs_label(inputs)}: {error_text(exc)}") from None
    return to_cpu(out), rec
