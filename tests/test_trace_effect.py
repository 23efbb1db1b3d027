"""The op trace must not change what it observes: an item whose values fail under the target's
op trace (a ``TorchDispatchMode``) is run once more outside it, and a user's untraced result
decides (``proof.trace_perturbed`` says so); a failure that stays without the trace stands."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from conformance.inputs.opinfo import by_name, samples
from conformance.sweep import SweepConfig, evaluate
from conformance.targets.base import OpTrace
from conformance.targets.cpu import CpuTarget

CONFIG = SweepConfig(contracts=("none",))


class _AddOneToSin(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        return out + 1 if func is torch.ops.aten.sin.default else out


class TracePerturbs(CpuTarget):
    """The CPU, whose op trace (not its untraced call) adds 1 to every sin."""

    @contextlib.contextmanager
    def trace(self) -> Iterator[OpTrace]:
        with super().trace() as trace, _AddOneToSin():
            yield trace


class AlwaysWrong(CpuTarget):
    """The CPU, whose sin is off by one traced or not."""

    def wrap(self, fn):  # noqa: ANN001, ANN201
        return lambda *a, **k: fn(*a, **k) + 1


def _sin_sample():
    return next(iter(samples(by_name()["sin"], torch.float32, seed=CONFIG.seed)))


def test_a_result_only_the_trace_changes_is_decided_untraced():
    row = evaluate(TracePerturbs(), by_name()["sin"], "sin", "function", "float32", 0, _sin_sample(), CONFIG)
    assert row["status"] == "pass", row["error"]
    assert row["proof"]["trace_perturbed"].startswith("under the op trace: output 0: 400 of 400 values outside")
    assert "aten::sin.default" in row["reached_ops"]  # the overloads still come from the traced call


def test_a_failure_without_the_trace_too_stands():
    row = evaluate(AlwaysWrong(), by_name()["sin"], "sin", "function", "float32", 0, _sin_sample(), CONFIG)
    assert row["status"] == "mismatch" and "trace_perturbed" not in row["proof"]


def test_a_passing_item_is_not_run_again(monkeypatch):
    import conformance.sweep as sweep

    calls = []
    real = sweep.run_item
    monkeypatch.setattr(sweep, "run_item", lambda *a, **k: calls.append(k) or real(*a, **k))
    row = evaluate(CpuTarget(), by_name()["sin"], "sin", "function", "float32", 0, _sin_sample(), CONFIG)
    assert row["status"] == "pass" and len(calls) == 1


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_matrix_rank_out_is_not_a_mismatch_of_the_trace(dtype):
    """torch 2.13: under any dispatch mode ``linalg.matrix_rank(A, atol=t, rtol=t, out=o)`` leaves
    ``o`` unwritten; the traced call returned uninitialised memory, a different value each run
    (two identical sweeps flipped between pass and mismatch)."""
    info = by_name()["linalg.matrix_rank"]
    cases = [(i, s) for i, s in enumerate(samples(info, dtype, seed=CONFIG.seed))
             if isinstance(s.kwargs.get("atol"), torch.Tensor)][:2]
    assert cases, "no sample with tensor tolerances"
    for i, s in cases:
        for _ in range(3):
            row = evaluate(CpuTarget(), info, "linalg.matrix_rank", "out", str(dtype)[6:], i, s, CONFIG)
            assert row["status"] == "pass", (i, row["error"])
