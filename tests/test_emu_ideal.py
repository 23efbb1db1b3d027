"""The ``ideal`` control build, and manifest validation of values and files."""

from __future__ import annotations

import textwrap
import warnings

import pytest
import torch

import neuron_emu
from neuron_emu import ManifestError, load_build

D = "neuron"


@pytest.fixture
def ideal():
    prev = neuron_emu.active_build()
    b = neuron_emu.use_build("ideal")
    yield b
    neuron_emu.use_build(prev)


def test_ideal_is_a_control_not_a_release():
    assert "ideal" not in neuron_emu.shipped_builds()          # the nightly's build list
    assert neuron_emu.shipped_builds(include_controls=True)[-1] == "ideal"
    assert neuron_emu.control_builds() == ["ideal"]
    b = load_build("ideal")
    assert not b.release and all(load_build(n).release for n in neuron_emu.shipped_builds())
    assert b.defects == () and b.cpu_fallback == ()
    assert set(b.dtypes.__dict__.values()) == {"native"}
    assert b.numerics == type(b.numerics)(matmul_inputs="fp32", transcendental_bits=23,
                                          sin_range_reduction=True, flush_denormals=False, rounding="rne")
    assert len(b.native_overloads()) == len(neuron_emu.manifest.aten_overloads())


def test_default_build_is_still_the_newest_release():
    assert neuron_emu.manifest.default_build_name() == neuron_emu.shipped_builds()[-1] != "ideal"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.complex128])
def test_ideal_is_a_bitwise_twin_of_the_cpu(ideal, dtype):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(64, generator=g) * 50).to(dtype)
    y = (torch.randn(64, generator=g) * 50).to(dtype)
    fns = [lambda a, b: a + b, lambda a, b: a * b, lambda a, b: torch.cumsum(a, 0),
           lambda a, b: a.sum(), lambda a, b: torch.sort(a.real if a.is_complex() else a).values]
    if dtype.is_floating_point or dtype.is_complex:
        fns += [lambda a, b: torch.exp(a / 100), lambda a, b: torch.sin(a),
                lambda a, b: a.reshape(8, 8) @ b.reshape(8, 8)]
    neuron_emu.clear_op_tracking()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any fallback warning fails the test
        for fn in fns:
            want = fn(x, y)
            got = fn(x.to(D), y.to(D))
            assert got.device.type == D and got.dtype == want.dtype
            assert torch.equal(got.cpu(), want), (dtype, fn)
    assert neuron_emu.get_fallback_ops() == []


def _write(tmp_path, text, name="m.toml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


@pytest.mark.parametrize("value,shown", [("nan", "nan"), ("inf", "inf"), ("-inf", "-inf"),
                                         ("-1e308", "-1e+308"), ("1e9", "1000000000.0")])
def test_defect_magnitude_must_be_finite_and_sane(tmp_path, value, shown):
    p = _write(tmp_path, f"""
        [build]
        name = "x"
        [[defects]]
        op = "aten::mm.default"
        kind = "wrong_result"
        magnitude = {value}
    """)
    with pytest.raises(ManifestError) as ei:
        load_build(p)
    msg = str(ei.value)
    assert len(msg.splitlines()) == 1
    assert str(p) in msg and "defects[0].magnitude" in msg and shown in msg and "finite" in msg


@pytest.mark.parametrize("name", ['""', '"   "'])
def test_empty_build_name_is_refused(tmp_path, name):
    p = _write(tmp_path, f"[build]\nname = {name}\n")
    with pytest.raises(ManifestError) as ei:
        load_build(p)
    msg = str(ei.value)
    assert str(p) in msg and "build.name" in msg and "non-empty string" in msg and len(msg.splitlines()) == 1


def test_manifest_path_that_is_a_directory(tmp_path):
    d = tmp_path / "dir.toml"
    d.mkdir()
    with pytest.raises(ManifestError) as ei:
        load_build(d)
    assert str(d) in str(ei.value) and "directory" in str(ei.value)


@pytest.mark.parametrize("data", [
    "[build]\nname = \"x\"\n".encode("utf-16"),
    bytes(range(256)) * 4,
    b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR",
], ids=["utf16", "binary", "png"])
def test_manifest_that_is_not_utf8_text(tmp_path, data):
    p = tmp_path / "bad.toml"
    p.write_bytes(data)
    with pytest.raises(ManifestError) as ei:
        load_build(p)
    msg = str(ei.value)
    assert str(p) in msg and len(msg.splitlines()) == 1


def test_inherited_manifest_that_is_binary_names_that_file(tmp_path):
    (tmp_path / "base.toml").write_bytes(b"\xff\xfe\x00garbage")
    p = _write(tmp_path, '[build]\nname = "child"\ninherits = "base.toml"\n')
    with pytest.raises(ManifestError, match="base.toml"):
        load_build(p)
