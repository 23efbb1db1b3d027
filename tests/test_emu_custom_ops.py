"""The backend's own custom ops (neuron::rms_norm, neuron::rope, neuron::flash_attention and their
backward ops), registered through torch.library as TorchNeuron registers NKI kernels: values and
gradients against the CPU's, a kernel for the device key and none for the CPU, opcheck and
torch.compile on a clean build, op tracking, and the defects a manifest seeds on them -- the ATen
kinds, and the three only a custom op takes (wrong_fake_shape, wrong_fake_dtype, wrong_backward).
"""

from __future__ import annotations

import contextlib
import time

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.testing._internal.optests.generate_tests import OpCheckError

import neuron_emu
from neuron_emu import ManifestError, custom_ops, load_build
from neuron_emu.defect_targets import CUSTOM_ONLY_KINDS, CUSTOM_OPS
from neuron_emu.manifest import DEFECT_KINDS, FALLBACK_ONLY_ENV

N = "neuron"
ops = torch.ops.neuron
pytestmark = pytest.mark.filterwarnings("ignore:neuron. operator")
TOL = {torch.float32: dict(atol=2e-5, rtol=1e-4), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def defect(op: str, kind: str, **fields) -> str:
    extra = "".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in fields.items())
    return f'[[defects]]\nop = "{op}"\nkind = "{kind}"\n{extra}'


def write(tmp_path, *defects: str, name: str = "custom", parent: str = "ideal"):
    p = tmp_path / f"{name}.toml"
    p.write_text(f'[build]\nname = "{name}"\ninherits = "{parent}"\n' + "\n".join(defects))
    return p


@contextlib.contextmanager
def build(tmp_path, *defects: str, parent: str = "ideal"):
    """Activates a build inheriting `parent` plus `defects`; the previous build comes back after."""
    prev = neuron_emu.active_build()
    b = neuron_emu.use_build(write(tmp_path, *defects, parent=parent))
    neuron_emu.clear_op_tracking()
    try:
        yield b
    finally:
        neuron_emu.use_build(prev)


def gen(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def qkv(dtype=torch.float32, L=6, S=6):
    return gen(2, 3, L, 8, dtype=dtype, seed=1), gen(2, 3, S, 8, dtype=dtype, seed=2), gen(2, 3, S, 4, dtype=dtype, seed=3)


def on_device(*ts, grad=False):
    return [t.to(N).requires_grad_(grad) for t in ts]


def run_with_grads(fn, inputs, grad_out, argnums):
    """fn(*inputs) and the gradients of <fn(...), grad_out> wrt inputs[argnums], on CPU."""
    ins = [t.detach().clone().requires_grad_(i in argnums) for i, t in enumerate(inputs)]
    out = fn(*ins)
    out.backward(grad_out.to(out.device))
    return out.detach().cpu(), [ins[i].grad.cpu() for i in argnums]


def rope_ref(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), -1) * sin


def rope_inputs(dtype=torch.float32):
    pos = torch.arange(5.0)[:, None] * (1.0 / 100 ** (torch.arange(0, 8, 2) / 8))[None]
    emb = torch.cat((pos, pos), -1)
    return gen(2, 3, 5, 8, dtype=dtype, seed=4), emb.cos().to(dtype), emb.sin().to(dtype)


# ---------------------------------------------------------------- registration
def test_the_ops_have_a_device_kernel_a_fake_and_autograd_but_no_cpu_kernel():
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    assert tuple(sorted(custom_ops.OPS)) == CUSTOM_OPS
    for name in CUSTOM_OPS:
        qual = name.removesuffix(".default")
        assert has(qual, "PrivateUse1") and has(qual, "Meta"), name
        assert not has(qual, "CPU") and not has(qual, "CompositeExplicitAutograd"), name
        assert not has(qual, "CompositeImplicitAutograd"), name
    for name in ("neuron::rms_norm", "neuron::rope", "neuron::flash_attention"):
        assert has(name, "Autograd")
    assert str(ops.flash_attention.default._schema) == (
        "neuron::flash_attention(Tensor q, Tensor k, Tensor v, bool is_causal=False, float? scale=None) -> Tensor")
    assert str(ops.rms_norm.default._schema) == "neuron::rms_norm(Tensor x, Tensor weight, float eps) -> Tensor"
    assert str(ops.rope.default._schema) == "neuron::rope(Tensor x, Tensor cos, Tensor sin) -> Tensor"
    with pytest.raises(NotImplementedError, match="'CPU' backend"):
        ops.rms_norm(gen(2, 4), gen(4), 1e-6)
    with pytest.raises(RuntimeError, match="argument 1 is on cpu"):
        ops.rms_norm(gen(2, 4).to(N), gen(4), 1e-6)


# ---------------------------------------------------------------- values and gradients
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("causal,scale,L,S", [(False, None, 6, 6), (True, None, 6, 6), (False, 0.3, 5, 7),
                                              (True, 0.5, 4, 6)])
def test_flash_attention_matches_sdpa_forward_and_backward(dtype, causal, scale, L, S):
    q, k, v = qkv(dtype, L, S)
    g = gen(2, 3, L, 4, dtype=dtype, seed=9)
    wide = [t.double() for t in (q, k, v)]
    ref, ref_grads = run_with_grads(
        lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=causal, scale=scale), wide, g.double(),
        (0, 1, 2))
    out, grads = run_with_grads(lambda a, b, c: ops.flash_attention(a, b, c, causal, scale),
                                on_device(q, k, v), g, (0, 1, 2))
    assert out.dtype == dtype and out.shape == (2, 3, L, 4)
    torch.testing.assert_close(out, ref.to(dtype), **TOL[dtype])
    for got, want in zip(grads, ref_grads, strict=True):
        assert got.dtype == dtype
        torch.testing.assert_close(got, want.to(dtype), **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_and_rope_match_the_cpu_forward_and_backward(dtype):
    x, w = gen(4, 6, 16, dtype=dtype, seed=5), gen(16, dtype=dtype, seed=6)
    g = gen(4, 6, 16, dtype=dtype, seed=7)
    ref, ref_grads = run_with_grads(lambda a, b: F.rms_norm(a, (16,), b, 1e-5), [x.double(), w.double()],
                                    g.double(), (0, 1))
    out, grads = run_with_grads(lambda a, b: ops.rms_norm(a, b, 1e-5), on_device(x, w), g, (0, 1))
    torch.testing.assert_close(out, ref.to(dtype), **TOL[dtype])
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want.to(dtype), **TOL[dtype])

    x, cos, sin = rope_inputs(dtype)
    g = gen(*x.shape, dtype=dtype, seed=8)
    ref, (ref_gx,) = run_with_grads(rope_ref, [x.double(), cos.double(), sin.double()], g.double(), (0,))
    out, (gx,) = run_with_grads(ops.rope, on_device(x, cos, sin), g, (0,))
    torch.testing.assert_close(out, ref.to(dtype), **TOL[dtype])
    torch.testing.assert_close(gx, ref_gx.to(dtype), **TOL[dtype])


def test_16_bit_inputs_are_computed_in_float32_and_rounded_once():
    x, w = gen(3, 64, dtype=torch.bfloat16), gen(64, dtype=torch.bfloat16, seed=1)
    got = ops.rms_norm(x.to(N), w.to(N), 1e-6)
    assert got.device.type == N and got.dtype == torch.bfloat16
    once = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).bfloat16()
    assert torch.equal(got.cpu(), once)
    # the CPU reference (what a recovered call runs) computes in bfloat16 and rounds at every step
    assert torch.equal(custom_ops.reference("neuron::rms_norm.default", x, w, 1e-6),
                       x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w)


def test_tracking_names_the_custom_ops_as_native():
    x, w = on_device(gen(2, 8), gen(8, seed=1), grad=True)
    neuron_emu.clear_op_tracking()
    with neuron_emu.op_tracking() as counts:
        ops.rms_norm(x, w, 1e-6).sum().backward()
    assert counts["neuron::rms_norm.default"] == {"native": 1, "fallback": 0}
    assert counts["neuron::rms_norm_backward.default"] == {"native": 1, "fallback": 0}
    assert "neuron::rms_norm.default" in neuron_emu.get_native_ops()
    assert not [o for o in neuron_emu.get_fallback_ops() if o.startswith("neuron::")]


# ---------------------------------------------------------------- opcheck, torch.compile
def samples(dtype):
    x, cos, sin = rope_inputs(dtype)
    q, k, v = qkv(dtype)
    return [
        (ops.rms_norm.default, [gen(3, 8, dtype=dtype), gen(8, dtype=dtype, seed=1)], (1e-6,)),
        (ops.rope.default, [x, cos, sin], ()),
        (ops.flash_attention.default, [q, k, v], (True, None)),
        (ops.flash_attention.default, [q, k, v], (False, 0.25)),
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_opcheck_passes_on_a_clean_build(dtype):
    assert not [d for d in neuron_emu.active_build().defects if d.op.startswith("neuron::")]
    for op, tensors, rest in samples(dtype):
        res = torch.library.opcheck(op, (*on_device(*tensors), *rest))
        assert set(res.values()) == {"SUCCESS"} and len(res) == 4, (op, res)
        # With inputs that require grad (AOT dispatch then checks the backward op too); torch's
        # test_autograd_registration knows only CPU/CUDA/XPU inputs: the Autograd kernel is asserted above.
        grads = on_device(*tensors[:1], grad=True) + on_device(*tensors[1:], grad=op is not ops.rope.default)
        res = torch.library.opcheck(op, (*grads, *rest),
                                    test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))
        assert set(res.values()) == {"SUCCESS"}, (op, res)


@pytest.mark.parametrize("name", neuron_emu.shipped_builds(include_controls=True))
def test_opcheck_passes_on_every_shipped_build(name):
    prev = neuron_emu.active_build()
    neuron_emu.use_build(name)
    try:
        for dtype in (torch.float32, torch.bfloat16):
            res = torch.library.opcheck(ops.flash_attention.default, (*on_device(*qkv(dtype)), True, None))
            assert set(res.values()) == {"SUCCESS"}, (name, dtype, res)
    finally:
        neuron_emu.use_build(prev)


def test_torch_compile_runs_the_custom_ops_forward_and_backward():
    def block(x, w, cos, sin, k, v):
        h = ops.rope(ops.rms_norm(x, w, 1e-6), cos, sin)
        return ops.flash_attention(h, k, v, True, None).square().sum()

    x, cos, sin = rope_inputs()
    args_eager = on_device(x, gen(8, seed=3), grad=True) + on_device(cos, sin) + on_device(
        gen(2, 3, 5, 8, seed=11), gen(2, 3, 5, 8, seed=12), grad=True)
    args_comp = [a.detach().clone().requires_grad_(a.requires_grad) for a in args_eager]
    neuron_emu.reset_compile_stats()
    torch._dynamo.reset()
    compiled = torch.compile(block, backend="neuron", fullgraph=True)
    got = compiled(*args_comp)
    want = block(*args_eager)
    got.backward()
    want.backward()
    torch.testing.assert_close(got.cpu(), want.cpu())
    for a, b in zip(args_comp, args_eager, strict=True):
        if b.requires_grad:
            torch.testing.assert_close(a.grad.cpu(), b.grad.cpu())
    graphs = neuron_emu.compile_stats()["graphs"]
    native = {o for g in graphs for o in g["native_ops"]}
    assert {"neuron::rms_norm.default", "neuron::rope.default", "neuron::flash_attention.default",
            "neuron::flash_attention_backward.default", "neuron::rope_backward.default",
            "neuron::rms_norm_backward.default"} <= native
    assert not [o for g in graphs for o in g["fallback_ops"] if o.startswith("neuron::")]


# ---------------------------------------------------------------- defects
def test_shipped_builds_are_clean_for_custom_ops():
    for name in neuron_emu.shipped_builds(include_controls=True):
        assert not [d for d in load_build(name).defects if d.op.startswith("neuron::")], name


def test_the_new_kinds_are_documented():
    doc = neuron_emu.manifest.__doc__ or ""
    for kind in CUSTOM_ONLY_KINDS:
        assert kind in DEFECT_KINDS and f"``{kind}``" in doc


@pytest.mark.parametrize("kind,check", [
    ("wrong_fake_shape", lambda fake, real: fake.shape == (*real.shape[:-1], real.shape[-1] + 1)
     and fake.dtype == real.dtype),
    ("wrong_fake_dtype", lambda fake, real: fake.dtype == torch.float32 and fake.shape == real.shape),
])
def test_a_wrong_fake_leaves_the_device_right_and_fails_opcheck(tmp_path, kind, check):
    q, k, v = on_device(*qkv(torch.bfloat16))
    right = ops.flash_attention(q, k, v, True, None).cpu()
    with build(tmp_path, defect("neuron::flash_attention.default", kind)):
        assert torch.equal(ops.flash_attention(q, k, v, True, None).cpu(), right)  # the kernel is right
        with FakeTensorMode() as mode:
            fake = ops.flash_attention(*(mode.from_tensor(t) for t in (q, k, v)), True, None)
        assert check(fake, right), (fake.shape, fake.dtype)
        with pytest.raises(OpCheckError, match="test_faketensor"):
            torch.library.opcheck(ops.flash_attention.default, (q, k, v, True, None), test_utils="test_faketensor")
        # the other ops' fakes are right
        x, w = on_device(gen(2, 8, dtype=torch.bfloat16), gen(8, dtype=torch.bfloat16))
        torch.library.opcheck(ops.rms_norm.default, (x, w, 1e-6), test_utils="test_faketensor")
    with FakeTensorMode() as mode:  # the build is gone: so is the defect
        assert ops.flash_attention(*(mode.from_tensor(t) for t in (q, k, v)), True, None).shape == right.shape


@pytest.mark.parametrize("op", ["neuron::flash_attention.default", "neuron::*"])
def test_wrong_backward_scales_the_gradients_not_the_forward(tmp_path, op):
    q, k, v = qkv()
    g = gen(2, 3, 6, 4, seed=9)
    fn = lambda a, b, c: ops.flash_attention(a, b, c, False, None)  # noqa: E731
    out, grads = run_with_grads(fn, on_device(q, k, v), g, (0, 1, 2))
    with build(tmp_path, defect(op, "wrong_backward", magnitude=0.5)):
        bad_out, bad = run_with_grads(fn, on_device(q, k, v), g, (0, 1, 2))
        _, (rms_gx,) = run_with_grads(lambda a: ops.rms_norm(a, torch.ones(8, device=N), 1e-6),
                                      on_device(gen(2, 8)), gen(2, 8, seed=3), (0,))
    assert torch.equal(bad_out, out)
    for b, r in zip(bad, grads, strict=True):
        torch.testing.assert_close(b, r * 1.5)
    _, (clean_gx,) = run_with_grads(lambda a: ops.rms_norm(a, torch.ones(8, device=N), 1e-6),
                                    on_device(gen(2, 8)), gen(2, 8, seed=3), (0,))
    torch.testing.assert_close(rms_gx, clean_gx * (1.5 if op == "neuron::*" else 1.0))


def test_the_aten_kinds_reach_the_custom_ops(tmp_path):
    x, w = on_device(gen(4, 8), gen(8, seed=1))
    xb, wb = on_device(gen(4, 8, dtype=torch.bfloat16), gen(8, dtype=torch.bfloat16, seed=1))
    right, right_b = ops.rms_norm(x, w, 1e-6).cpu(), ops.rms_norm(xb, wb, 1e-6).cpu()
    rope_in = on_device(*rope_inputs())
    rope_right = ops.rope(*rope_in).cpu()
    with build(tmp_path, defect("neuron::rms_norm.default", "wrong_result", magnitude=0.25, dtypes=["bfloat16"]),
               defect("neuron::rope*", "nan", min_numel=200)):
        assert torch.equal(ops.rms_norm(x, w, 1e-6).cpu(), right)                   # not a listed dtype
        torch.testing.assert_close(ops.rms_norm(xb, wb, 1e-6).cpu(), (right_b * 1.25))
        assert ops.rope(*rope_in).isnan().all()                                     # 240 elements
        small = [t[:, :1].contiguous() for t in rope_in[:1]] + rope_in[1:]          # 40 elements
        assert not ops.rope(*small).isnan().any()
    assert torch.equal(ops.rope(*rope_in).cpu(), rope_right)
    with build(tmp_path, defect("neuron::rms_norm.default", "wrong_dtype"),
               defect("neuron::rope.default", "error", probability=0.5)):
        assert ops.rms_norm(x, w, 1e-6).dtype == torch.float16
        outcomes = set()
        for _ in range(12):
            try:
                ops.rope(*rope_in)
                outcomes.add("ok")
            except RuntimeError as e:
                assert "injected defect custom.toml:defects[1]" in str(e)
                outcomes.add("error")
        assert outcomes == {"ok", "error"}


def test_fallback_and_a_recovered_error_run_the_cpu_reference_counted_as_fallbacks(tmp_path, monkeypatch):
    xb, wb = on_device(gen(4, 64, dtype=torch.bfloat16), gen(64, dtype=torch.bfloat16, seed=1))
    cpu = custom_ops.reference("rms_norm", xb, wb, 1e-6)
    with build(tmp_path, defect("neuron::rms_norm.default", "error")):
        with pytest.raises(RuntimeError, match=r"internal compiler/runtime error in neuron::rms_norm\.default"):
            ops.rms_norm(xb, wb, 1e-6)
        monkeypatch.delenv(FALLBACK_ONLY_ENV)
        with pytest.warns(UserWarning, match="neuron::rms_norm.default failed on the device"):
            got = ops.rms_norm(xb, wb, 1e-6)
        assert torch.equal(got.cpu(), cpu) and got.device.type == N
        assert neuron_emu.get_op_counts()["neuron::rms_norm.default"] == {"native": 0, "fallback": 1}
    with build(tmp_path, defect("neuron::rms_norm.default", "fallback")):
        assert torch.equal(ops.rms_norm(xb, wb, 1e-6).cpu(), cpu)
        assert neuron_emu.get_fallback_ops() == ["neuron::rms_norm.default"]


def test_crash_hang_and_accepts_invalid(tmp_path, monkeypatch):
    class Stopped(Exception):
        pass

    def stop(*_):
        raise Stopped

    monkeypatch.setattr(neuron_emu.defects.os, "abort", stop)
    monkeypatch.setattr(neuron_emu.defects.time, "sleep", stop)
    q, k, v = on_device(*qkv())
    with build(tmp_path, defect("neuron::flash_attention.default", "crash"), defect("neuron::rope.default", "hang"),
               defect("neuron::rms_norm.default", "accepts_invalid")):
        with pytest.raises(Stopped):
            ops.flash_attention(q, k, v)
        with pytest.raises(Stopped):
            ops.rope(*on_device(*rope_inputs()))
        bad = ops.rms_norm(*on_device(gen(2, 8), gen(5)), 1e-6)  # weight does not broadcast: zeros instead
        assert bad.shape == (2, 8) and not bad.cpu().any()
    with pytest.raises(RuntimeError, match="broadcast"):
        ops.rms_norm(*on_device(gen(2, 8), gen(5)), 1e-6)


def test_slow_makes_the_call_take_longer_with_the_same_values(tmp_path):
    """The fastest of alternating rounds of calls on the clean and the slowed build, on one intra-op
    thread (the machine is shared: a factor of 8 must show as more than 2.5)."""
    q, k, v = on_device(*(gen(1, 4, 128, 64, seed=s) for s in range(3)))
    clean = neuron_emu.active_build()
    slow = load_build(write(tmp_path, defect("neuron::flash_attention.default", "slow", magnitude=8)))
    best = {clean.name: float("inf"), slow.name: float("inf")}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(4):
            for b in (clean, slow):
                neuron_emu.use_build(b)
                for _ in range(3):
                    t0 = time.perf_counter()
                    ops.flash_attention(q, k, v)
                    best[b.name] = min(best[b.name], time.perf_counter() - t0)
        right = ops.flash_attention(q, k, v).cpu()
        neuron_emu.use_build(clean)
        assert torch.equal(ops.flash_attention(q, k, v).cpu(), right)
    finally:
        torch.set_num_threads(threads)
        neuron_emu.use_build(clean)
    assert best[slow.name] > 2.5 * best[clean.name], best


# ---------------------------------------------------------------- manifest validation
@pytest.mark.parametrize("op,kind,key,value,says", [
    ("neuron::nope*", "wrong_result", "op", "'neuron::nope*'", "custom ops neuron::flash_attention.default"),
    ("neuron::rope.default", "view_as_copy", "kind", "'view_as_copy'", "for a custom op"),
    ("neuron::rope.default", "out_reallocates", "kind", "'out_reallocates'", "wrong_fake_shape"),
    ("aten::mm.default", "wrong_fake_shape", "kind", "'wrong_fake_shape'", "act only on the backend's custom ops"),
    ("aten::*", "wrong_backward", "kind", "'wrong_backward'", "a kind other than wrong_fake_shape"),
    ("neuron::rope_backward.default", "wrong_backward", "op", "'neuron::rope_backward.default'",
     "differentiable custom op"),
    ("c10d::all_reduce", "wrong_fake_dtype", "kind", "'wrong_fake_dtype'", "for a collective"),
])
def test_bad_entries_name_file_key_value_and_what_is_accepted(tmp_path, op, kind, key, value, says):
    p = write(tmp_path, defect(op, kind), name="bad")
    with pytest.raises(ManifestError) as exc:
        load_build(p)
    msg = str(exc.value)
    assert str(p) in msg and f"invalid manifest key 'defects[0].{key}' = {value}: expected" in msg, msg
    assert says in msg, msg


def test_good_entries_load(tmp_path):
    b = load_build(write(tmp_path, defect("neuron::*", "wrong_fake_dtype", dtypes=["bfloat16"]),
                         defect("neuron::flash_attention*", "wrong_backward", magnitude=0.1),
                         defect("neuron::rope_backward.default", "slow", magnitude=2)))
    assert [d.kind for d in b.defects] == ["wrong_fake_dtype", "wrong_backward", "slow"]
    assert b.is_native("neuron::rope.default") and not b.is_native("c10d::all_reduce")
