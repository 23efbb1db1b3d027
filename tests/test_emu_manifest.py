"""Build manifests: shipped builds, inheritance, selection and validation errors."""

import dataclasses
import os
import subprocess
import sys
import textwrap

import pytest

import neuron_emu
from neuron_emu import ManifestError, load_build


def write(tmp_path, text, name="m"):
    p = tmp_path / f"{name}.toml"
    p.write_text(textwrap.dedent(text))
    return p


def test_shipped_builds_and_inheritance():
    assert neuron_emu.shipped_builds()[:3] == ["2.31.0", "2.32.0", "2.33.0"]
    b31, b32, b33 = (load_build(n) for n in ("2.31.0", "2.32.0", "2.33.0"))
    assert not b31.numerics.sin_range_reduction and b32.numerics.sin_range_reduction
    assert set(b31.native) <= set(b32.native) <= set(b33.native)
    assert any(d.op == "aten::cumsum.default" and d.dtypes == ("bfloat16",) for d in b33.defects)
    with pytest.raises(dataclasses.FrozenInstanceError):
        b33.name = "x"  # frozen


def test_default_is_newest_and_env_selection(tmp_path):
    code = "import neuron_emu; print(neuron_emu.active_build().name)"
    env = dict(os.environ)
    env.pop("NEURON_EMU_BUILD", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
    assert out.stdout.strip() == neuron_emu.shipped_builds()[-1]
    p = write(tmp_path, '[build]\nname = "mine"\ninherits = "2.31.0"\n')
    env["NEURON_EMU_BUILD"] = str(p)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
    assert out.stdout.strip() == "mine"


def test_inherits_relative_path_extends_lists(tmp_path):
    write(tmp_path, '[build]\nname = "base"\n[ops]\nnative = ["aten::add.Tensor"]\n', "base")
    p = write(tmp_path, '[build]\nname = "child"\ninherits = "base.toml"\n[ops]\nnative = ["aten::mm.*"]\n')
    b = load_build(p)
    assert b.native == ("aten::add.Tensor", "aten::mm.*")
    assert b.is_native("aten::mm.out") and b.is_native("aten::add.Tensor") and not b.is_native("aten::sub.Tensor")


def test_inherit_cycle(tmp_path):
    write(tmp_path, '[build]\nname = "a"\ninherits = "b.toml"\n', "a")
    write(tmp_path, '[build]\nname = "b"\ninherits = "a.toml"\n', "b")
    with pytest.raises(ManifestError, match="cycle"):
        load_build(tmp_path / "a.toml")


@pytest.mark.parametrize("body,key,value", [
    ('[build]\nname = "x"\nbogus = 1\n', "build.bogus", "1"),
    ('[build]\nname = "x"\n[ops]\nnative = ["aten::no_such_op.*"]\n', "ops.native[0]", "aten::no_such_op.*"),
    ('[build]\nname = "x"\n[dtypes]\nfloat64 = "maybe"\n', "dtypes.float64", "maybe"),
    ('[build]\nname = "x"\n[dtypes]\nfloat16 = "native"\n', "dtypes.float16", "native"),
    ('[build]\nname = "x"\n[dtypes]\nsparse = "fallback"\n', "dtypes.sparse", "fallback"),
    ('[build]\nname = "x"\n[numerics]\ntranscendental_bits = "14"\n', "numerics.transcendental_bits", "14"),
    ('[build]\nname = "x"\n[numerics]\nmatmul_inputs = "fp8"\n', "numerics.matmul_inputs", "fp8"),
    ('[build]\nname = "x"\n[numerics]\nflush_denormals = 1\n', "numerics.flush_denormals", "1"),
    ('[build]\nname = "x"\n[[defects]]\nop = "aten::mm.default"\nkind = "ok"\n'
     '[[defects]]\nop = "aten::mm.default"\nkind = "explode"\n', "defects[0].kind", "ok"),
    ('[build]\nname = "x"\n[[defects]]\nop = "aten::mm.default"\nkind = "nan"\n'
     '[[defects]]\nop = "aten::mm.default"\nkind = "explode"\n', "defects[1].kind", "explode"),
    ('[build]\nname = "x"\n[[defects]]\nop = "aten::mm.default"\nkind = "nan"\ndtypes = ["float8"]\n',
     "defects[0].dtypes[0]", "float8"),
    ('[build]\nname = "x"\n[[defects]]\nop = "aten::mm.default"\nkind = "nan"\nprobability = 2\n',
     "defects[0].probability", "2"),
    ('[build]\nname = "x"\n[[defects]]\nop = "aten::mm.default"\nkind = "nan"\nextra = 2\n',
     "defects[0].extra", "2"),
    ('[build]\nname = "x"\ninherits = "9.9.9"\n', "build.inherits", "9.9.9"),
])
def test_validation_errors_name_file_key_value(tmp_path, body, key, value):
    p = write(tmp_path, body)
    with pytest.raises(ManifestError) as exc:
        load_build(p)
    msg = str(exc.value)
    assert str(p) in msg and f"'{key}'" in msg and value in msg and "expected" in msg


def test_use_build_unknown_name():
    with pytest.raises(ManifestError, match="2.31.0"):
        neuron_emu.use_build("0.0.1")
