"""The emulated device behaves like a real device where the build declares nothing else.

One regression test per fidelity root cause found by running PyTorch's TestCommon on ``neuron``
(issue 14), each on the ``ideal`` control build and on every shipped release build.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import neuron_emu

REPO = Path(__file__).resolve().parents[1]
D = "neuron"



# 1 ------------------------------------------------------------------ out= on the wrong device
@pytest.mark.parametrize("call", [
    lambda x, out: torch.norm(x, out=out),
    lambda x, out: torch.index_select(x, 0, torch.tensor([0, 1], device=D), out=out),
    lambda x, out: torch.max(x, x, out=out),
    lambda x, out: torch.add(x, x, out=out),
    lambda x, out: torch.cumsum(x, 0, out=out),
], ids=["norm", "index_select", "max_binary", "add", "cumsum"])
@pytest.mark.parametrize("out_shape", [(), (3, 4)], ids=["0dim", "full"])
def test_out_on_cpu_for_device_inputs_raises(emu_build, call, out_shape):
    x = torch.randn(3, 4, device=D)
    out = torch.zeros(out_shape)
    with pytest.raises(RuntimeError, match="same device|device"):
        call(x, out)
    assert out.device.type == "cpu" and bool((out == 0).all()), "nothing may land on the CPU tensor"


def test_cpu_scalar_input_still_accepted(emu_build):
    x = torch.arange(4.0, device=D)
    assert (x * torch.tensor(2.0)).cpu().tolist() == [0.0, 2.0, 4.0, 6.0]
    y = torch.empty(4, device=D)
    torch.mul(x, torch.tensor(2.0), out=y)
    assert y.device.type == D and y.cpu().tolist() == [0.0, 2.0, 4.0, 6.0]


# 2 ------------------------------------------------------------------ int64 with a Python scalar
@pytest.mark.parametrize("fn", [
    lambda t: t % 3, lambda t: torch.fmod(t, 3), lambda t: t & 6, lambda t: t | 1, lambda t: t ^ 5,
    lambda t: 6 & t, lambda t: torch.remainder(t, -3), lambda t: torch.bitwise_and(t, 3),
], ids=["mod", "fmod", "and", "or", "xor", "rand", "remainder_neg", "bitwise_and"])
def test_int64_tensor_with_python_scalar(emu_build, fn):
    c = torch.arange(-4, 9, dtype=torch.int64)
    got = fn(c.to(D))
    want = fn(c)
    assert got.device.type == D and got.dtype == want.dtype == torch.int64
    assert torch.equal(got.cpu(), want)


# 3 ------------------------------------------------------------------ sparse through the fallback
def test_sparse_layouts_follow_the_build(emu_build):
    """Sparse tensors used to fail inside the CPU fallback ("Cannot access storage of
    SparseTensorImpl").  A build with sparse layouts (`ideal`) runs the CPU's sparse kernels over
    the device's memory; the others refuse with a clean NotImplementedError naming the layout."""
    import neuron_emu

    x = torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, 3.0]])
    if neuron_emu.active_build().dtypes.sparse != "native":
        with pytest.raises(NotImplementedError, match="strided"):
            x.to(D).to_sparse()
        with pytest.raises(NotImplementedError, match="strided"):
            torch.sparse.mm(x.to_sparse(), torch.randn(3, 2, device=D))
        return
    s = x.to(D).to_sparse()
    assert s.layout == torch.sparse_coo and s.device.type == D and s._indices().device.type == D
    assert s._nnz() == 3 and s.is_coalesced()
    assert torch.equal(s.to_dense().cpu(), x) and torch.equal((s + s).to_dense().cpu(), 2 * x)
    assert torch.equal(torch.sparse.mm(s, torch.ones(3, 2, device=D)).cpu(), x @ torch.ones(3, 2))
    host = s.cpu()  # a copy to the host owns its memory
    assert host.layout == torch.sparse_coo and host.device.type == "cpu"
    host._values().zero_()
    assert torch.equal(s.to_dense().cpu(), x)
    s.mul_(2)  # in place: the device tensor's members follow the kernel's
    assert torch.equal(s.to_dense().cpu(), 2 * x)
    back = x.to_sparse().to(D)
    assert back.device.type == D and torch.equal(back.to_dense().cpu(), x)
    torch.testing.assert_close(back, x.to_sparse(), check_device=False)
    csr = x.to(D).to_sparse_csr()
    assert csr.layout == torch.sparse_csr and csr.crow_indices().device.type == D
    assert torch.equal(csr.to_dense().cpu(), x)
    m = torch.randn(3, 3)
    got = torch.sparse.sampled_addmm(torch.eye(2, 3).to(D).to_sparse_csr(), x.to(D), m.to(D))
    want = torch.sparse.sampled_addmm(torch.eye(2, 3).to_sparse_csr(), x, m)
    assert got.device.type == D and torch.equal(got.to_dense().cpu(), want.to_dense())


# 4 ------------------------------------------------------------------ efficient zero tensors
def test_efficientzerotensor_is_a_device_zero_tensor(emu_build):
    z = torch._efficientzerotensor(5, device=D)
    assert z.device.type == D and z._is_zerotensor() and z.dtype == torch.get_default_dtype()
    assert torch.equal(z.cpu(), torch.zeros(5))
    assert torch.equal((z + torch.ones(5, device=D)).cpu(), torch.ones(5))
    assert torch.equal(torch._efficientzerotensor(2, 3, dtype=torch.int32, device=D).cpu(),
                       torch.zeros(2, 3, dtype=torch.int32))


def test_zerotensor_backwards_do_not_crash():
    """sgn and grid_sample backward used to SIGSEGV in copy_from: run them in a subprocess."""
    code = """
import torch, neuron_emu, warnings
warnings.simplefilter("ignore")
for b in ["ideal", *neuron_emu.shipped_builds()]:
    neuron_emu.use_build(b)
    for dev in ("cpu", "neuron"):
        torch.manual_seed(0)
        x = torch.randn(4, dtype=torch.complex64).to(dev).requires_grad_()
        torch.sgn(x).abs().sum().backward()
        g = torch.randn(1, 1, 4, 4).to(dev).requires_grad_()
        grid = (torch.rand(1, 3, 3, 2) * 2 - 1).to(dev)
        torch.nn.functional.grid_sample(g, grid, align_corners=False).sum().backward()
        r = (x.grad.cpu(), g.grad.cpu())
        if dev == "cpu":
            ref = r
        else:
            assert all(torch.allclose(a, b) for a, b in zip(r, ref)), b
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900, cwd=REPO)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


# 5 ------------------------------------------------------------------ complex128 preserved
def test_complex128_is_preserved(emu_build):
    x = torch.randn(3, dtype=torch.float64)
    got = x.to(D) * torch.tensor(1j, dtype=torch.complex128)
    assert got.dtype == torch.complex128
    p = torch.polar(torch.ones(3, dtype=torch.float64, device=D), x.to(D))
    assert p.dtype == torch.complex128
    a = torch.randn(3, 3, dtype=torch.complex128, device=D, requires_grad=True)
    torch.linalg.slogdet(a).logabsdet.backward()
    assert a.grad.dtype == torch.complex128


# 6 ------------------------------------------------------------------ index_select keeps int32
def test_index_select_int32_data_int64_index(emu_build):
    data = torch.arange(6, dtype=torch.int32)
    idx = torch.tensor([4, 1], dtype=torch.int64)
    got = torch.index_select(data.to(D), 0, idx.to(D))
    assert got.dtype == torch.int32 and got.cpu().tolist() == [4, 1]
    out = torch.empty(0, dtype=torch.int32, device=D)
    torch.index_select(data.to(D), 0, idx.to(D), out=out)
    assert out.dtype == torch.int32 and out.cpu().tolist() == [4, 1]


# 7 ------------------------------------------------------------------ cumsum int64 with dtype=
def test_cumsum_int64_with_dtype_inplace_and_out(emu_build):
    a = torch.arange(1, 6, dtype=torch.int64)
    want = torch.cumsum(a, 0, dtype=torch.int64)
    t = a.to(D)
    t.cumsum_(0, dtype=torch.int64)
    assert t.dtype == torch.int64 and torch.equal(t.cpu(), want)
    out = torch.empty(5, dtype=torch.int64, device=D)
    r = torch.cumsum(a.to(D), 0, dtype=torch.int64, out=out)
    assert r is out and torch.equal(out.cpu(), want)
    f = torch.empty(5, dtype=torch.float64, device=D)
    torch.cumsum(a.to(D), 0, dtype=torch.float64, out=f)
    assert f.dtype == torch.float64 and torch.equal(f.cpu(), want.double())


# 8 ------------------------------------------------------------------ SDPA picks the CPU's backend
def test_sdpa_backend_choice_matches_the_cpu(emu_build):
    """A PrivateUse1 device without a `_fused_sdp_choice_stub` kernel always got the math path, so
    bf16 attention differed from the CPU's flash kernel on `ideal`.  A build with the CPU's fused
    kernel natively picks what the CPU picks (and honours sdpa_kernel); the others keep math."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import neuron_emu

    F = torch.nn.functional
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 17, 8, dtype=torch.bfloat16, generator=g) for _ in range(3))
    fused = neuron_emu.active_build().is_native("aten::_scaled_dot_product_flash_attention_for_cpu.default")
    assert fused == (emu_build == "ideal")
    with neuron_emu.op_tracking() as ops:
        qd, kd, vd = (t.to(D).requires_grad_() for t in (q, k, v))
        got = F.scaled_dot_product_attention(qd, kd, vd, is_causal=True)
        got.float().sum().backward()
    assert ("aten::_scaled_dot_product_flash_attention_for_cpu.default" in ops) == fused
    qc, kc, vc = (t.clone().requires_grad_() for t in (q, k, v))
    want = F.scaled_dot_product_attention(qc, kc, vc, is_causal=True)
    want.float().sum().backward()
    if fused:  # the very kernel the CPU ran: bit-identical, forward and backward
        assert torch.equal(got.detach().cpu(), want.detach())
        assert all(torch.equal(a.grad.cpu(), b.grad) for a, b in zip((qd, kd, vd), (qc, kc, vc), strict=True))
    with sdpa_kernel(SDPBackend.MATH):  # the CPU's choice honours the toggles, so the device's does
        m_dev = F.scaled_dot_product_attention(q.to(D), k.to(D), v.to(D)).cpu()
        m_cpu = F.scaled_dot_product_attention(q, k, v)
    if fused:
        assert torch.equal(m_dev, m_cpu)
    assert not torch.equal(m_cpu, F.scaled_dot_product_attention(q, k, v)), "inputs must tell math from flash"
    # The CPU's checks read requires_grad: a mask that requires grad rules the fused kernel out.
    mask = torch.zeros(17, 17, dtype=torch.bfloat16)
    for mask_grad in (False, True):
        with neuron_emu.op_tracking() as ops:
            md = mask.to(D).requires_grad_(mask_grad)
            F.scaled_dot_product_attention(q.to(D), k.to(D), v.to(D), attn_mask=md)
        cpu_pick = torch._fused_sdp_choice(q, k, v, mask.clone().requires_grad_(mask_grad))
        assert cpu_pick == (0 if mask_grad else 1)  # SDPBackend: math, flash_attention
        assert ("aten::_scaled_dot_product_flash_attention_for_cpu.default" in ops) == (fused and cpu_pick == 1)


# 8 ------------------------------------------------------------------ the meta-dtype cache
_DTYPE_CALLS = [
    lambda t: t + 1, lambda t: t + 1.5, lambda t: t * True, lambda t: t / 2, lambda t: torch.div(t, 2, rounding_mode="floor"),
    lambda t: t.sum(), lambda t: (t > 1).sum(), lambda t: torch.where(t > 1, t, torch.tensor(0.5)),
    lambda t: t + torch.tensor(2.5, dtype=torch.float64), lambda t: t + torch.ones(t.shape[-1], dtype=torch.float64, device=t.device),
    lambda t: t.double() + t, lambda t: t + t.sum(), lambda t: t.double() + t.sum(), lambda t: t + t.double().sum(),
    lambda t: t.float() + t.double(), lambda t: t.float() + t.double().sum(),
    lambda t: torch.cat([t, t.double()]), lambda t: torch.mean(t.double(), 0), lambda t: torch.pow(t, 2),
    lambda t: torch.pow(t, 2.0), lambda t: t.cumsum(0, dtype=torch.float64), lambda t: t.cumsum(0),
]


def test_meta_dtype_cache_agrees_with_a_fresh_meta_run(emu_build):
    """The emulator caches the CPU's result dtypes per operator and argument signature. The same
    operators (add, div, sum, cat, ...) with other argument dtypes, 0-dim or not, and other
    shapes (left out of the key), once with the cache cleared before every call and once with
    it holding every answer: dtypes and values as the CPU's each time."""
    from neuron_emu import dispatch

    for warm in (False, True):
        dispatch._META_DTYPES.clear()
        for shape in ((3, 4), (5,), (2, 1, 4)):
            c = torch.arange(1, 1 + math.prod(shape), dtype=torch.int64).reshape(shape)
            for i, call in enumerate(_DTYPE_CALLS):
                if not warm:
                    dispatch._META_DTYPES.clear()
                want, got = call(c), call(c.to(D))
                assert got.dtype == want.dtype, (i, shape, warm)
                torch.testing.assert_close(got.cpu(), want, rtol=1e-6, atol=1e-6)
        if emu_build == "2.33.0":  # int64 narrowed there, add and sum native: the cache answered
            assert dispatch._META_DTYPES


def test_meta_dtype_cache_key_keeps_what_decides_a_dtype():
    from neuron_emu.dispatch import _dtype_key

    t = torch.ones(3, dtype=torch.int64)
    assert _dtype_key(t) == _dtype_key(torch.ones(7, 2, dtype=torch.int64))  # shape: left out
    assert _dtype_key(t) != _dtype_key(torch.ones((), dtype=torch.int64))  # 0-dim: ranks lower
    # (a wrapped Python number, which a Python dispatch mode never sees as a tensor, against a
    # float64 CPU scalar: t + 1.5 and t + tensor(2.5, float64) in the test above)
    assert _dtype_key(t) != _dtype_key(t.double())
    assert _dtype_key(2) != _dtype_key(2.0) != _dtype_key(True)
    assert _dtype_key("floor") != _dtype_key("trunc")
    with pytest.raises(TypeError):
        _dtype_key(object())  # unknown arguments: the call is not cached


# issue 48 ---------------------------------------------------------- what ideal reported as the target's
def test_kaiser_window_runs_on_the_device(emu_build):
    """Its composite kernel calls a DispatchStub, which had no kernel for the device (an INTERNAL
    ASSERT on every build)."""
    assert torch.allclose(torch.kaiser_window(5, device=D).cpu(), torch.kaiser_window(5))
    assert torch.allclose(torch.kaiser_window(6, False, 2.0, device=D).cpu(), torch.kaiser_window(6, False, 2.0))
    out = torch.empty(0, device=D)
    torch.ops.aten.kaiser_window.out(4, out=out)
    assert torch.allclose(out.cpu(), torch.kaiser_window(4))


def test_lazy_clone_is_a_clone_on_the_device(emu_build):
    """Copy-on-write needs a storage whose data pointer is its own context: the fallback's
    borrowed storages are not ("Expected storage != nullptr")."""
    x = torch.arange(3.0, device=D)
    y = torch._lazy_clone(x)
    y.add_(1)
    assert torch.equal(x.cpu(), torch.arange(3.0)) and torch.equal(y.cpu(), torch.arange(3.0) + 1)


def test_sparse_mm_reduce_backward_does_not_crash():
    """The CPU fallback's views lost requires_grad, so the forward computed no argmax and the
    backward read an empty one (SIGSEGV): run it in a subprocess."""
    code = """
import torch, neuron_emu, warnings
warnings.simplefilter("ignore")
neuron_emu.use_build("ideal")
torch.manual_seed(0)
a0, w0 = torch.randn(5, 5).relu().to_sparse_csr(), torch.randn(5, 3)
grads = []
for dev in ("cpu", "neuron"):
    a = a0.to(dev, copy=True).requires_grad_()
    w = w0.to(dev, copy=True).requires_grad_()
    grads.append([g.to_dense().cpu() for g in torch.autograd.grad(torch.sparse.mm(a, w, "amax").sum(), [a, w])])
assert all(torch.allclose(x, y) for x, y in zip(*grads))
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900, cwd=REPO)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


@pytest.mark.parametrize("cls", [torch.nn.LSTM, torch.nn.GRU])
@pytest.mark.parametrize("bias", [True, False])
def test_fused_rnn_cells_run_where_the_build_has_them(cls, bias):
    """PyTorch's LSTM and GRU cells call the fused cell kernels on any PrivateUse1 device, and
    the CPU has none to fall back to: the ideal build (every kernel native) runs them, forward
    and backward, as the CPU's unfused cells compute; a build without them fails as before, with
    the dispatcher's own error."""
    prev = neuron_emu.active_build()
    try:
        neuron_emu.use_build("ideal")
        torch.manual_seed(0)
        m = cls(4, 8, bias=bias, batch_first=True)
        x = torch.randn(2, 5, 4)
        ref = m(x)[0]
        ref.sum().backward()
        want = [p.grad.clone() for p in m.parameters()]
        m.zero_grad()
        m.to(D)
        out = m(x.to(D))[0]
        out.sum().backward()
        assert torch.allclose(out.cpu(), ref, atol=1e-6)
        assert all(torch.allclose(p.grad.cpu(), g, atol=1e-5) for p, g in zip(m.parameters(), want, strict=True))
        neuron_emu.use_build("2.33.0")
        with pytest.raises(NotImplementedError, match="Could not run 'aten::_thnn_fused_.*' with arguments from the 'CPU'"):
            m(x.to(D))
    finally:
        neuron_emu.use_build(prev)


def test_compiled_sdpa_traces_on_a_build_with_the_cpus_fused_kernel():
    """Tracing reaches the device's SDPA backend choice with FakeTensors: the choice, made by
    the CPU's own checks on views of them, must not call back into the FakeTensorMode."""
    prev = neuron_emu.active_build()
    try:
        neuron_emu.use_build("ideal")
        torch.manual_seed(0)
        q, k, v = torch.randn(2, 2, 1, 8), torch.randn(2, 2, 16, 8), torch.randn(2, 2, 16, 8)
        mask = torch.ones(1, 16, dtype=torch.bool)

        def attend(q, k, v, m):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m)

        out = torch.compile(attend, backend="neuron", fullgraph=True)(*(t.to(D) for t in (q, k, v, mask)))
        assert torch.allclose(out.cpu(), attend(q, k, v, mask), atol=1e-6)
    finally:
        neuron_emu.use_build(prev)
