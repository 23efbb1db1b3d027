"""The op trace must not change what it observes: an item whose values fail under the target's
op trace (a ``TorchDispatchMode``), for an op whose CPU result a dispatch mode changes, is run
once more outside it, and a user's untraced result decides (``proof.trace_perturbed`` says so);
a failure that stays without the trace stands, and a flaky device is never retried into a pass."""

from __future__ import annotations

import pytest
import torch

from conformance.inputs.opinfo import by_name, samples
from conformance.sweep.opinfo import SweepConfig, evaluate
from conformance.targets.base import Dispatched
from conformance.targets.cpu import CpuTarget

CONFIG = SweepConfig(contracts=("none",))


class AlwaysWrong(CpuTarget):
    """The CPU, whose sin is off by one traced or not."""

    def wrap(self, fn):  # noqa: ANN001, ANN201
        return lambda *a, **k: fn(*a, **k) + 1


class Flaky(CpuTarget):
    """The CPU, whose sin is off by one on every other call (a flaky device bug)."""

    calls = 0

    def wrap(self, fn):  # noqa: ANN001, ANN201
        def call(*a, **k):  # noqa: ANN002, ANN003, ANN202
            type(self).calls += 1
            return fn(*a, **k) + (1 if type(self).calls % 2 else 0)
        return call


@pytest.fixture
def modes_add_one_to_sin(monkeypatch):
    """PyTorch as if it ran sin differently under every dispatch mode (as it does matrix_rank's
    out=): the target's op trace and the harness's CPU probe both see it."""
    real = Dispatched.__torch_dispatch__

    def perturbed(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN202
        out = real(self, func, types, args, kwargs)
        return out + 1 if func is torch.ops.aten.sin.default else out

    monkeypatch.setattr(Dispatched, "__torch_dispatch__", perturbed)


def _sin_sample():
    return next(iter(samples(by_name()["sin"], torch.float32, seed=CONFIG.seed)))


def test_a_result_only_the_trace_changes_is_decided_untraced(modes_add_one_to_sin):
    row = evaluate(CpuTarget(), by_name()["sin"], "sin", "function", "float32", 0, _sin_sample(), CONFIG)
    assert row["status"] == "pass", row["error"]
    assert row["proof"]["trace_perturbed"].startswith("under the op trace: output 0: 400 of 400 values outside")
    assert "aten::sin.default" in row["reached_ops"]  # the overloads still come from the traced call


def test_a_failure_without_the_trace_too_stands():
    row = evaluate(AlwaysWrong(), by_name()["sin"], "sin", "function", "float32", 0, _sin_sample(), CONFIG)
    assert row["status"] == "mismatch" and "trace_perturbed" not in row["proof"]


def test_a_flaky_device_failure_is_not_retried_into_a_pass():
    """Only an op the trace changes *on the CPU* is re-run untraced: a retry of anything else
    would turn a flaky device's failures into passes (the gate's flaky tests caught that)."""
    Flaky.calls = 0
    row = evaluate(Flaky(), by_name()["sin"], "sin", "function", "float32", 0, _sin_sample(), CONFIG)
    assert row["status"] == "mismatch" and "trace_perturbed" not in row["proof"]


def test_a_passing_item_is_not_run_again(monkeypatch):
    import conformance.sweep.opinfo as sweep

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


def test_an_unwritten_out_is_seen_whatever_memory_it_was_given():
    """The probe hands out= tensors filled with a sentinel: an ``out`` the traced call leaves
    unwritten is found every time, not only when the allocator happens to hand it memory other
    than the plain call's result (before: ``linalg.matrix_rank|out|float32|40`` was a mismatch in
    about one run of four, in worker processes)."""
    from conformance.check.execute import trace_changes_cpu

    info = by_name()["linalg.matrix_rank"]
    probes = [s for i, s in enumerate(samples(info, torch.float32)) if i in (0, 4, 40)]
    assert all(trace_changes_cpu(info, "out", s) for s in probes for _ in range(5))
    add = by_name()["add"]
    assert not any(trace_changes_cpu(add, "out", s) for s in samples(add, torch.float32))
