"""The "also known" emulator bugs of issue 14: import order, DispatchStub callers, arange on
narrowing builds, CPU generators, and the fallback warning's reason."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import neuron_emu

REPO = Path(__file__).resolve().parents[1]
D = "neuron"



def test_cpu_backward_before_import_does_not_break_device_backward():
    code = """
import torch
a = torch.ones(3, requires_grad=True)
(a * 2).sum().backward()            # the engine starts its device threads: no neuron yet
import neuron_emu
x = torch.ones(3, device="neuron", requires_grad=True)
(x * x).sum().backward()
y = torch.randn(4, 4, device="neuron", requires_grad=True)
torch.nn.functional.gelu(y @ y).sum().backward()
print(x.grad.cpu().tolist(), y.grad.device)
"""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900,
                         cwd=REPO, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[2.0, 2.0, 2.0] neuron:0"


def test_conj_physical_inplace(emu_build):
    c = torch.randn(5, dtype=torch.complex64)
    t = c.to(D)
    t.conj_physical_()
    assert torch.equal(t.cpu(), c.conj_physical())
    assert torch.equal(torch.conj_physical(c.to(D)).cpu(), torch.conj_physical(c))


@pytest.mark.parametrize("args", [(0, 10, 1.5), (1, 7.5, 2.5), (10, 0, -1.5), (0.5, 6, 1)])
def test_arange_int64_with_float_steps_has_the_cpu_length(emu_build, args):
    want = torch.arange(*args, dtype=torch.int64)
    got = torch.arange(*args, dtype=torch.int64, device=D)
    assert got.dtype == torch.int64 and torch.equal(got.cpu(), want)


def test_cpu_generator_is_rejected_like_cuda(emu_build):
    g = torch.Generator()
    with pytest.raises(RuntimeError, match="Expected a 'neuron' device type for generator but found 'cpu'"):
        torch.randn(3, device=D, generator=g)
    with pytest.raises(RuntimeError, match="generator"):
        torch.empty(3, device=D).normal_(generator=g)
    ng = torch.Generator(device=D).manual_seed(1)
    a = torch.randn(3, device=D, generator=ng)
    ng.manual_seed(1)
    assert torch.equal(a.cpu(), torch.randn(3, device=D, generator=ng).cpu())


def test_fallback_warning_names_the_dtype_rule_not_the_op():
    prev = neuron_emu.active_build()
    b = neuron_emu.use_build("2.33.0")   # mul is native there; complex inputs: rule 'fallback'
    assert b.is_native("aten::mul.Tensor") and b.dtypes.complex == "fallback"
    try:
        x = torch.randn(3, dtype=torch.complex64).to(D)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            x * x
        msgs = [str(m.message) for m in w if "falling back" in str(m.message)]
        assert len(msgs) == 1, msgs
        assert "aten::mul.Tensor" in msgs[0] and "dtypes.complex = 'fallback'" in msgs[0]
        assert "not natively supported" not in msgs[0]
        neuron_emu.set_strict(True)
        with pytest.raises(RuntimeError, match=r"dtypes.complex = 'fallback'"):
            x * x
        # A real missing kernel still says so.
        assert not b.is_native("aten::lgamma.default")
        with pytest.raises(RuntimeError, match="has no native kernel in Neuron SDK build 2.33.0"):
            torch.lgamma(torch.ones(2, device=D))
    finally:
        neuron_emu.set_strict(False)
        neuron_emu.use_build(prev)


@pytest.fixture
def two_threads():
    prev = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(prev)


def test_denormals_flushed_on_every_intra_op_thread_and_only_where_declared(emu_build, two_threads):
    # 1M elements: the CPU kernels split them over both OpenMP threads (the calling thread used to
    # be the only one with FTZ/DAZ, leaving the other half unflushed).
    n = 1 << 20
    sub = torch.full((n,), 1e-39).index_fill_(0, torch.arange(0, n, 3), -3e-40)  # subnormal inputs
    small = torch.full((n,), 1e-20)                                               # subnormal products
    flushes = neuron_emu.active_build().numerics.flush_denormals
    for got, want in [((sub.to(D) * 1.0).cpu(), sub * 1.0),
                      ((sub.to(D) + 0.0).cpu(), sub + 0.0),
                      ((small.to(D) * small.to(D)).cpu(), small * small)]:
        assert int((want != 0).sum()) == n  # the CPU keeps them all
        if flushes:
            assert int((got != 0).sum()) == 0
        else:
            assert torch.equal(got, want)
    # No FTZ/DAZ left behind on the CPU's threads (calling or worker).
    assert int(((sub * 1.0) != 0).sum()) == n and int(((small * small) != 0).sum()) == n


def test_small_calls_flush_on_one_thread_and_backward_flushes_on_every_thread(two_threads):
    # A call with fewer than GRAIN_SIZE input elements runs serially (no `omp parallel` region to
    # set FTZ/DAZ on the workers): avg_pool2d splits its 16 planes over both threads whatever
    # their size, so a worker computing half of them without FTZ/DAZ would leave them unflushed.
    # Backward ops run on autograd's device thread: small ones serially there, large ones on a
    # team of that thread's own, flushed on each of its threads.
    prev = neuron_emu.active_build().name
    neuron_emu.use_build("2.32.0")  # FTZ, avg_pool2d native
    try:
        assert neuron_emu.active_build().numerics.flush_denormals
        sub = torch.full((2, 8, 4, 4), 1e-39)
        want = torch.nn.functional.avg_pool2d(sub, 1)
        assert int((want != 0).sum()) == sub.numel()
        got = torch.nn.functional.avg_pool2d(sub.to(D), 1).cpu()
        assert int((got != 0).sum()) == 0
        for n in (256, 1 << 20):
            x = torch.ones(n, device=D, requires_grad=True)
            (x * torch.full((n,), 1e-39, device=D)).sum().backward()  # x.grad = ones * 1e-39
            assert int((x.grad.cpu() != 0).sum()) == 0, n
        # the calling thread's counts are back, and no FTZ/DAZ is left on the CPU's threads
        assert torch.get_num_threads() == 2
        assert torch.equal(torch.nn.functional.avg_pool2d(sub, 1), want)
        big = torch.full((1 << 20,), 1e-39)
        assert int(((big * 1.0) != 0).sum()) == 1 << 20
    finally:
        neuron_emu.use_build(prev)


def test_denormal_flushing_leaves_no_ftz_in_a_worker_thread_started_during_the_call():
    # A fresh process whose second OpenMP thread starts inside the first device call: a new
    # thread inherits the starting thread's FTZ/DAZ, so it must be started before they are set.
    code = """
import torch, neuron_emu
neuron_emu.use_build("2.31.0")
torch.set_num_threads(1)
n = 1 << 20
sub = torch.full((n,), 1e-39)
torch.set_num_threads(2)
got = (sub.to("neuron") * 1.0).cpu()
print(int((got != 0).sum()), int(((sub * 1.0) != 0).sum()))
"""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("OMP_NUM_THREADS", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900,
                         cwd=REPO, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["0", str(1 << 20)]
