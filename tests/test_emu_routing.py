"""Routing, tracking, strict mode, dtype rules, numerics knobs and defects of neuron_emu."""

import contextlib
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import neuron_emu

N = "neuron"
pytestmark = pytest.mark.filterwarnings("ignore:neuron. operator")
DEFAULT = neuron_emu.active_build()


@contextlib.contextmanager
def build(ref):
    prev = neuron_emu.active_build()
    b = neuron_emu.use_build(ref)
    neuron_emu.clear_op_tracking()
    try:
        yield b
    finally:
        neuron_emu.use_build(prev)
        neuron_emu.set_strict(False)


def manifest(tmp_path, body: str, name: str = "custom") -> str:
    p = tmp_path / f"{name}.toml"
    p.write_text(textwrap.dedent(body))
    return str(p)


BASE = """
[build]
name = "custom"
[ops]
native = ["aten::add.Tensor", "aten::mul.Tensor", "aten::mm.default", "aten::sin.default",
          "aten::exp.default", "aten::cumsum.default", "aten::sum.default", "aten::relu.default"]
[dtypes]
float64 = "{f64}"
int64 = "{i64}"
complex = "{cplx}"
channels_last = "{cl}"
[numerics]
matmul_inputs = "{mm}"
transcendental_bits = {bits}
sin_range_reduction = {sinrr}
flush_denormals = {ftz}
rounding = "{rounding}"
"""


def custom(tmp_path, extra: str = "", **kw):
    vals = dict(f64="downcast", i64="narrow", cplx="fallback", cl="error", mm="fp32", bits=23,
                sinrr="true", ftz="false", rounding="rne")
    vals.update(kw)
    return manifest(tmp_path, BASE.format(**vals) + textwrap.dedent(extra))


# ---------------------------------------------------------------- routing and tracking
@pytest.mark.parametrize("name", neuron_emu.shipped_builds())
def test_shipped_build_routing(name):
    with build(name) as b:
        x = torch.randn(8, 8, device=N)
        _ = x + x
        _ = x @ x
        _ = torch.special.i0(x)  # never native in any shipped build
        ex, fb = neuron_emu.get_executed_ops(), neuron_emu.get_fallback_ops()
        assert "aten::add.Tensor" in ex and "aten::mm.default" in ex
        assert "aten::add.Tensor" not in fb and "aten::mm.default" not in fb
        assert "aten::i0.default" in fb
        assert b.is_native("aten::add.Tensor") and not b.is_native("aten::i0.default")
        assert set(fb) <= set(ex)


def test_coverage_grows_between_builds():
    sizes = [len(neuron_emu.load_build(n).native_overloads()) for n in ("2.31.0", "2.32.0", "2.33.0")]
    assert 80 <= sizes[0] < sizes[1] < sizes[2] <= 600, sizes
    with build("2.31.0"):
        torch.cumsum(torch.randn(4, device=N), 0)
        assert "aten::cumsum.default" in neuron_emu.get_fallback_ops()
    with build("2.32.0"):
        torch.cumsum(torch.randn(4, device=N), 0)
        assert "aten::cumsum.default" not in neuron_emu.get_fallback_ops()


def test_custom_manifest_routing_and_counts(tmp_path):
    with build(custom(tmp_path)):
        x = torch.randn(4, device=N)
        _ = x + x
        _ = x - x
        counts = neuron_emu.get_op_counts()
        assert counts["aten::add.Tensor"] == {"native": 1, "fallback": 0}
        assert counts["aten::sub.Tensor"] == {"native": 0, "fallback": 1}
        with neuron_emu.op_tracking() as block:
            _ = x - x
        assert block == {"aten::sub.Tensor": {"native": 0, "fallback": 1}}
        neuron_emu.clear_op_tracking()
        assert neuron_emu.get_executed_ops() == []


def test_fallback_warns_once_per_op(tmp_path):
    with build(custom(tmp_path)):
        x = torch.randn(4, device=N)
        with pytest.warns(UserWarning, match=r"aten::sub\.Tensor .*build custom"):
            _ = x - x
        import warnings

        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            _ = x - x
        assert not [w for w in rec if "aten::sub.Tensor" in str(w.message)]


def test_internal_casts_not_recorded(tmp_path):
    with build(custom(tmp_path)):
        x = torch.ones(4, dtype=torch.float64).to(N)
        neuron_emu.clear_op_tracking()
        _ = x + x  # downcast to f32 and back happen inside the emulator
        assert neuron_emu.get_executed_ops() == ["aten::add.Tensor"]


def test_strict_mode_eager(tmp_path):
    x = torch.randn(4).to(N)
    with build(custom(tmp_path)):
        neuron_emu.set_strict(True)
        _ = x + x
        with pytest.raises(RuntimeError, match=r"aten::sub\.Tensor"):
            _ = x - x


def test_strict_env_var(tmp_path):
    code = "import torch, neuron_emu; x = torch.randn(3, device='neuron'); torch.special.i0(x)"
    env = dict(os.environ, NEURON_EMU_STRICT="1")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode != 0 and "aten::i0.default" in r.stderr


# ---------------------------------------------------------------- dtype rules
def test_float64_downcast_loses_precision(tmp_path):
    x = torch.tensor([1.0 + 1e-12, 1.0 / 3.0], dtype=torch.float64)
    with build(custom(tmp_path)):
        y = (x.to(N) * 1.0).cpu()
    assert y.dtype == torch.float64
    assert y[0] == 1.0 and (x * 1.0)[0] != 1.0
    assert 1e-9 < abs(y[1] - 1.0 / 3.0) < 1e-7
    with build(custom(tmp_path, f64="native")):
        assert torch.equal((x.to(N) * 1.0).cpu(), x)


def test_int64_narrow_wraps(tmp_path):
    i = torch.tensor([2**31 - 1, 5], dtype=torch.int64)
    with build(custom(tmp_path)):
        y = (i.to(N) + i.to(N)).cpu()
    assert y.dtype == torch.int64 and y.tolist() == [-2, 10]
    with build(custom(tmp_path, i64="native")):
        assert (i.to(N) + i.to(N)).cpu().tolist() == [2**32 - 2, 10]


def test_complex_rules(tmp_path):
    c = torch.randn(3, dtype=torch.complex64)
    with build(custom(tmp_path)):
        torch.testing.assert_close((c.to(N) * c.to(N)).cpu(), c * c)
        assert "aten::mul.Tensor" in neuron_emu.get_fallback_ops()
    with build(custom(tmp_path, cplx="error")):
        with pytest.raises(RuntimeError, match="complex"):
            c.to(N) * c.to(N)


def test_channels_last_rules(tmp_path):
    x = torch.randn(1, 3, 4, 4).to(memory_format=torch.channels_last)
    with build(custom(tmp_path)):
        with pytest.raises(RuntimeError, match="channels_last"):
            torch.relu(x.to(N))
        torch.relu(torch.randn(1, 3, 4, 4, device=N))  # contiguous is fine
    with build(custom(tmp_path, cl="fallback")):
        torch.testing.assert_close(torch.relu(x.to(N)).cpu(), torch.relu(x))
        assert "aten::relu.default" in neuron_emu.get_fallback_ops()


# ---------------------------------------------------------------- numerics knobs
def _rel_err(a, b):
    return float((a.double() - b).abs().max() / b.abs().max())


def test_bf16_matmul_error_range(tmp_path):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 64, generator=g), torch.randn(64, 64, generator=g)
    ref = a.double() @ b.double()
    with build(custom(tmp_path, mm="bf16")):
        e_bf16 = _rel_err((a.to(N) @ b.to(N)).cpu(), ref)
    with build(custom(tmp_path, mm="fp32")):
        e_fp32 = _rel_err((a.to(N) @ b.to(N)).cpu(), ref)
    assert 1e-3 <= e_bf16 <= 1e-2, e_bf16
    assert e_fp32 < 1e-5


def test_sin_range_reduction(tmp_path):
    x = torch.tensor([9.0, 1.0, -2.0])
    with build(custom(tmp_path, sinrr="false")):
        y = torch.sin(x.to(N)).cpu()
    assert abs(y[0] - math.sin(9.0)) > 1.0
    torch.testing.assert_close(y[1:], torch.sin(x[1:]), atol=1e-6, rtol=0)
    with build(custom(tmp_path, sinrr="true")):
        torch.testing.assert_close(torch.sin(x.to(N)).cpu(), torch.sin(x))
    with build("2.31.0"):
        assert abs(torch.sin(torch.tensor(9.0, device=N)).item() - math.sin(9.0)) > 1.0
    with build("2.32.0"):
        assert abs(torch.sin(torch.tensor(9.0, device=N)).item() - math.sin(9.0)) < 1e-3


def test_transcendental_bits(tmp_path):
    x = torch.linspace(-2, 2, 1001)
    with build(custom(tmp_path, bits=8)):
        y = torch.exp(x.to(N)).cpu()
    rel = ((y - torch.exp(x)) / torch.exp(x)).abs().max()
    assert 2**-10 < rel <= 2**-9 + 1e-7
    mant = y.view(torch.int32) & ((1 << 15) - 1)
    assert (mant == 0).all()  # only 8 explicit mantissa bits survive
    with build(custom(tmp_path, bits=23)):
        torch.testing.assert_close(torch.exp(x.to(N)).cpu(), torch.exp(x))


def test_flush_denormals(tmp_path):
    x = torch.tensor([1e-39, 1.0, -3e-40])
    with build(custom(tmp_path, ftz="true")):
        assert (x.to(N) * 1.0).cpu().tolist() == [0.0, 1.0, 0.0]
    with build(custom(tmp_path, ftz="false")):
        assert torch.equal((x.to(N) * 1.0).cpu(), x)


def test_stochastic_rounding_seeded_and_unbiased(tmp_path):
    a = torch.full((20000,), 1.0, dtype=torch.bfloat16)
    b = torch.full((20000,), 2.0**-9, dtype=torch.bfloat16)  # a quarter of a bf16 ulp at 1.0
    with build(custom(tmp_path, rounding="stochastic")):
        torch.neuron.manual_seed(0)
        y1 = (a.to(N) + b.to(N)).cpu()
        torch.neuron.manual_seed(0)
        y2 = (a.to(N) + b.to(N)).cpu()
        torch.neuron.manual_seed(1)
        y3 = (a.to(N) + b.to(N)).cpu()
    assert torch.equal(y1, y2) and not torch.equal(y1, y3)
    assert abs(y1.double().mean().item() - (1 + 2**-9)) < 2e-4
    assert ((y1 == 1.0) | (y1 == 1.0 + 2**-7)).all()
    with build(custom(tmp_path, rounding="rne")):
        assert ((a.to(N) + b.to(N)).cpu() == 1.0).all()  # RNE always rounds down: biased


# ---------------------------------------------------------------- defects
def test_defect_wrong_result_threshold_and_dtype():
    x = torch.ones(5000, dtype=torch.bfloat16)
    with build("2.33.0"):
        bad = torch.cumsum(x.to(N), 0).cpu()
        ok_small = torch.cumsum(x[:4000].to(N), 0).cpu()
        ok_f32 = torch.cumsum(x.float().to(N), 0).cpu()
    assert not torch.equal(bad, torch.cumsum(x, 0))
    assert torch.equal(ok_small, torch.cumsum(x[:4000], 0))
    assert torch.equal(ok_f32, torch.cumsum(x.float(), 0))
    with build("2.32.0"):
        assert torch.equal(torch.cumsum(x.to(N), 0).cpu(), torch.cumsum(x, 0))


@pytest.mark.parametrize("kind", ["wrong_result", "nan", "wrong_dtype", "error", "fallback"])
def test_defect_kinds(tmp_path, kind):
    extra = f'\n[[defects]]\nop = "aten::exp.default"\nkind = "{kind}"\nmagnitude = 0.5\n'
    x = torch.randn(6)
    with build(custom(tmp_path, extra)):
        if kind == "error":
            with pytest.raises(RuntimeError, match="aten::exp.default"):
                torch.exp(x.to(N))
            return
        y = torch.exp(x.to(N))
        ref = torch.exp(x)
        if kind == "wrong_result":
            torch.testing.assert_close(y.cpu(), ref * 1.5)
        elif kind == "nan":
            assert y.cpu().isnan().all()
        elif kind == "wrong_dtype":
            assert y.dtype != torch.float32
        else:
            torch.testing.assert_close(y.cpu(), ref)
            assert "aten::exp.default" in neuron_emu.get_fallback_ops()


def test_defect_probability_mix(tmp_path):
    extra = '\n[[defects]]\nop = "aten::exp.default"\nkind = "error"\nprobability = 0.5\n'
    x = torch.randn(4, device=N)
    with build(custom(tmp_path, extra)):
        outcomes = []
        for _ in range(40):
            try:
                torch.exp(x)
                outcomes.append(True)
            except RuntimeError:
                outcomes.append(False)
    assert 5 < sum(outcomes) < 35
    with build(custom(tmp_path, extra)):  # deterministic for a given history
        again = []
        for _ in range(40):
            try:
                torch.exp(x)
                again.append(True)
            except RuntimeError:
                again.append(False)
    assert again == outcomes


def _run_defect_subprocess(tmp_path, kind, timeout):
    path = custom(tmp_path, f'\n[[defects]]\nop = "aten::exp.default"\nkind = "{kind}"\n')
    code = "import torch, neuron_emu; torch.exp(torch.ones(3, device='neuron')); print('survived')"
    env = dict(os.environ, NEURON_EMU_BUILD=path)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_defect_crash_aborts_process(tmp_path):
    r = _run_defect_subprocess(tmp_path, "crash", 120)
    assert r.returncode == -6 and "survived" not in r.stdout  # SIGABRT
    assert "aten::exp.default" in r.stderr


def test_defect_hang_never_returns(tmp_path):
    # The child says when the device is up (a cold cache builds the extension first, which can
    # take a minute); from then on the call must never return.
    path = custom(tmp_path, '\n[[defects]]\nop = "aten::exp.default"\nkind = "hang"\n')
    code = ("import sys, torch, neuron_emu; x = torch.ones(3, device='neuron'); print('ready', flush=True); "
            "torch.exp(x); print('survived', flush=True)")
    proc = subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ, NEURON_EMU_BUILD=path),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        said = ""
        while "device hang in" not in said:  # the defect says so as the call starts to hang
            line = proc.stderr.readline()
            assert line, f"ended without saying it hangs: {said[-2000:]}"
            said += line
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=3)
    finally:
        proc.kill()
        out, err = proc.communicate()
    assert "survived" not in out and "hang" in said + err
