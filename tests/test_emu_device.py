"""Device semantics of the emulated `neuron` device: views, out=, metadata ops, autograd, RNG..."""


import pytest
import torch

N = "neuron"
pytestmark = pytest.mark.filterwarnings("ignore:neuron. operator")


def test_device_basics():
    assert torch.device(N).type == "neuron"
    assert torch.neuron.is_available() and torch.neuron.device_count() == 1
    x = torch.randn(3)
    assert x.to(N).device == torch.device("neuron", 0)
    assert x.neuron().is_neuron
    assert torch.equal(x.to(N).cpu(), x)
    assert "device='neuron:0'" in repr(torch.zeros(2, device=N))


def test_views_alias_and_inplace():
    x = torch.arange(12.0).reshape(3, 4).to(N)
    x[1].add_(100)
    assert x.cpu()[1].tolist() == [104.0, 105.0, 106.0, 107.0]
    u = torch.zeros(4, 2, device=N)
    u.unfold(0, 2, 1).fill_(7)  # a view produced by a CPU kernel stays a view
    assert u.cpu().eq(7).all()
    t = x.t()
    assert t.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert t.stride() == (1, 4)


def test_out_resize_from_empty():
    x = torch.randn(3, 4, device=N)
    out = torch.empty(0, device=N)
    torch.add(x, 1, out=out)
    assert out.shape == (3, 4) and out.stride() == (4, 1)
    torch.testing.assert_close(out.cpu(), x.cpu() + 1)
    vo, io = torch.empty(0, device=N), torch.empty(0, dtype=torch.long, device=N)
    torch.mode(torch.tensor([[1.0, 1, 2]], device=N), out=(vo, io))
    assert vo.cpu().tolist() == [1.0]


def test_metadata_mutating_ops():
    y = torch.randn(3, 4, device=N)
    y.t_()
    assert y.shape == (4, 3) and y.stride() == (1, 4)
    z = torch.randn(1, 3, 1, device=N)
    z.squeeze_()
    assert z.shape == (3,)
    r = torch.arange(2.0, device=N)
    r.resize_(5)
    assert r.shape == (5,) and r.cpu()[:2].tolist() == [0.0, 1.0]
    a = torch.arange(6.0, device=N)
    a.as_strided_((2, 2), (1, 2))
    assert a.shape == (2, 2) and a.stride() == (1, 2)
    assert a.cpu().tolist() == [[0.0, 2.0], [1.0, 3.0]]
    v = torch.randn(3, device=N)
    assert (torch.randn(3, device=N) @ torch.randn(3, 4, device=N)).shape == (4,)
    assert v.unsqueeze_(0).shape == (1, 3)


def test_autograd_and_module_to():
    w = torch.randn(3, requires_grad=True, device=N)
    (w * w).sum().backward()
    torch.testing.assert_close(w.grad.cpu(), 2 * w.detach().cpu())
    m = torch.nn.Linear(3, 2).to(N)
    assert m.weight.device.type == N
    assert m(torch.randn(4, 3, device=N)).shape == (4, 2)
    conv = torch.nn.Conv2d(3, 4, 3).to(N)
    conv(torch.randn(1, 3, 8, 8, device=N)).sum().backward()
    assert conv.weight.grad.shape == (4, 3, 3, 3)


def test_cpu_tensor_mixing_rejected_like_cuda():
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.randn(3, device=N) + torch.randn(3)
    assert (torch.randn(3, device=N) + torch.tensor(1.0)).device.type == N  # 0-dim CPU scalar ok
    x = torch.zeros(3, device=N)
    x.copy_(torch.ones(3))  # copies across devices are fine
    assert x.cpu().tolist() == [1.0, 1.0, 1.0]


def test_rng_seed_state_and_generator():
    torch.neuron.manual_seed(0)
    a = torch.randn(5, device=N)
    torch.neuron.manual_seed(0)
    assert torch.equal(a.cpu(), torch.randn(5, device=N).cpu())
    st = torch.neuron.get_rng_state()
    b = torch.rand(3, device=N)
    torch.neuron.set_rng_state(st)
    assert torch.equal(b.cpu(), torch.rand(3, device=N).cpu())
    g = torch.Generator(N)
    assert g.device.type == N
    g.manual_seed(1)
    c = torch.randn(2, device=N, generator=g)
    g.manual_seed(1)
    assert torch.equal(c.cpu(), torch.randn(2, device=N, generator=g).cpu())


def test_autocast_policy():
    p = torch.randn(4, 4, device=N)
    with torch.autocast(N, dtype=torch.bfloat16):
        assert (p @ p).dtype == torch.bfloat16
        assert torch.nn.functional.linear(p, p).dtype == torch.bfloat16
        assert torch.softmax(p, 0).dtype == torch.float32
        assert torch.exp(p.bfloat16()).dtype == torch.float32


def test_misc_ops_work():
    assert torch.tensor(3.5, device=N).item() == 3.5
    assert torch.fft.hfft(torch.randn(4, dtype=torch.complex64).to(N)).shape == (6,)
    q = torch.randn(1, 2, 4, 8, device=N)
    assert torch.nn.functional.scaled_dot_product_attention(q, q, q).shape == (1, 2, 4, 8)
    assert torch.randn(3, device=N).untyped_storage().resize_(40).nbytes() == 40
    x = torch.randn(2, 3)
    torch.testing.assert_close(torch.nn.functional.layer_norm(x.to(N), (3,)).cpu(),
                               torch.nn.functional.layer_norm(x, (3,)))


def test_attention_compiles_with_dynamic_shapes_where_the_cpus_fused_kernel_is_native():
    # a build with the CPU's flash kernel native asks the CPU's SDPA choice; under torch.compile with
    # symbolic sizes it cannot (no CPU view of a symbolic-size tensor) and the trace takes the math path
    # (it raised "Expected !size_bytes_is_heap_allocated_" in the fake-tensor trace)
    import neuron_emu

    neuron_emu.use_build("ideal")
    fn = torch.compile(lambda q, m: torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=m),
                       backend="neuron")  # automatic dynamic shapes: the second length traces symbolic sizes
    for n in (5, 9, 13):
        q = torch.randn(1, 2, n, 16)
        mask = torch.ones(n, n, dtype=torch.bool).tril()
        want = torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)
        torch.testing.assert_close(fn(q.to(N), mask.to(N)).cpu(), want)
