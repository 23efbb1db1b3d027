"""The ``slow`` defect kind: a performance regression of one SDK build.  A slowed call takes
``magnitude`` times as long (the C++ fallback times it and busy-works for the rest), and nothing
else changes: the same routing (a zero-copy native or fallback op stays one), bitwise the same
values, the same native/fallback counts.

Timings compare the MIN over repeated calls of a slowed build and the same build without the
defect, in alternating rounds in one process; the machine is shared, so the bounds are generous
(a factor of 4 must show as at least 2, a call that is not slowed as less than 2).
"""

from __future__ import annotations

import math
import time

import pytest
import torch
from test_emu_contract_defects import bits_equal, defect  # noqa: E402  (shared manifest helpers)

import neuron_emu
from neuron_emu import ManifestError, load_build
from neuron_emu.manifest import DEFECT_KINDS, MAX_SLOWDOWN
from neuron_emu.routing import FALLBACK, NATIVE, PYTHON, classify

N = "neuron"
MM = "aten::mm.default"
pytestmark = pytest.mark.filterwarnings("ignore:neuron. operator")


def manifest(tmp_path, name: str, *defects: str, parent: str = "ideal", extra: str = ""):
    """Loads a build `name` that inherits `parent` plus `extra` tables and `defects`."""
    p = tmp_path / f"{name}.toml"
    p.write_text(f'[build]\nname = "{name}"\ninherits = "{parent}"\n{extra}' + "\n".join(defects))
    return load_build(p)


def best(call, n: int) -> float:
    """The fastest of `n` timed calls of `call` (after two untimed ones)."""
    call(), call()
    out = math.inf
    for _ in range(n):
        t0 = time.perf_counter()
        call()
        out = min(out, time.perf_counter() - t0)
    return out


def ratio(base, slow, call, calls: int = 30, rounds: int = 5) -> float:
    """min time of `call` on build `slow` / on build `base`: `calls` calls on each, in alternating
    rounds (a load change on the shared machine meets both), on one intra-op thread (an OpenMP team
    that shares the cores with other processes stalls whole calls at random)."""
    t = {"base": math.inf, "slow": math.inf}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(rounds):
            for key, b in (("base", base), ("slow", slow)):
                neuron_emu.use_build(b)
                t[key] = min(t[key], best(call, max(1, calls // rounds)))
    finally:
        torch.set_num_threads(threads)
    return t["slow"] / t["base"]


def mm_of(a: torch.Tensor):
    x = a.to(N)
    return lambda: torch.mm(x, x)


# ---------------------------------------------------------------- manifest
@pytest.mark.parametrize("fields,key,value", [
    ({}, "magnitude", "None"),                                   # required
    ({"magnitude": 1.0}, "magnitude", "1.0"),
    ({"magnitude": 0.5}, "magnitude", "0.5"),
    ({"magnitude": 1}, "magnitude", "1"),
    ({"magnitude": -3.0}, "magnitude", "-3.0"),
    ({"magnitude": 100.5}, "magnitude", "100.5"),
    ({"magnitude": 1000}, "magnitude", "1000"),
    ({"magnitude": math.inf}, "magnitude", "inf"),
    ({"magnitude": math.nan}, "magnitude", "nan"),
    ({"magnitude": 2.0, "probability": 0.5}, "probability", "0.5"),
    ({"magnitude": 2.0, "probability": 0.999}, "probability", "0.999"),
])
def test_slow_validation_names_file_key_and_value(tmp_path, fields, key, value):
    p = tmp_path / "bad.toml"
    p.write_text('[build]\nname = "bad"\ninherits = "ideal"\n' + defect(MM, "slow", **fields))
    with pytest.raises(ManifestError) as exc:
        load_build(p)
    msg = str(exc.value)
    assert str(p) in msg and f"'defects[0].{key}' = {value}" in msg, msg
    assert "for kind 'slow'" in msg
    if key == "magnitude":
        assert "> 1 and <= 100" in msg
    else:
        assert "every matching call" in msg


def test_slow_is_a_kind_and_accepts_factors_up_to_the_limit(tmp_path):
    assert "slow" in DEFECT_KINDS and MAX_SLOWDOWN == 100
    assert "``slow``" in (neuron_emu.manifest.__doc__ or "")
    b = manifest(tmp_path, "ok", defect(MM, "slow", magnitude=1.3),
                 defect(MM, "slow", magnitude=100, probability=1.0, dtypes=["float32"], min_numel=5),
                 defect(MM, "slow", magnitude=2))
    assert [(d.kind, d.magnitude) for d in b.defects] == [("slow", 1.3), ("slow", 100.0), ("slow", 2.0)]
    assert b.defects[1].dtypes == ("float32",) and b.defects[1].min_numel == 5
    # The other kinds' magnitude (a relative error) is checked as before.
    assert manifest(tmp_path, "wr", defect(MM, "wrong_result", magnitude=-1.0)).defects[0].magnitude == -1.0
    with pytest.raises(ManifestError,
                       match=r"'defects\[0\].magnitude' = 2000.0: expected a finite relative error"):
        manifest(tmp_path, "wr", defect(MM, "wrong_result", magnitude=2000.0))


def test_shipped_builds_have_no_slow_defects():
    for name in neuron_emu.shipped_builds(include_controls=True):
        assert not [d for d in load_build(name).defects if d.kind == "slow"], name


def test_slow_defects_reach_the_router_not_the_route(tmp_path):
    """classify's first four fields are the same with and without slow defects; the factor and its
    filters follow; defects with the same filters multiply, others come as further rules."""
    f32 = 1 << int(neuron_emu.routing._dtype_code(torch.float32))
    for parent in ("ideal", "2.33.0"):
        plain = manifest(tmp_path, "plain", parent=parent)
        neuron_emu.use_build(plain)
        want = classify(MM)
        assert want[4:] == (1.0, 0, 0)
        neuron_emu.use_build(manifest(tmp_path, "two", defect(MM, "slow", magnitude=2),
                                      defect("aten::mm.*", "slow", magnitude=1.5), parent=parent))
        assert classify(MM) == (*want[:4], 3.0, 0, 0)
        neuron_emu.use_build(manifest(tmp_path, "filters",
                                      defect(MM, "slow", magnitude=2, dtypes=["float32"]),
                                      defect(MM, "slow", magnitude=3, min_numel=100), parent=parent))
        assert classify(MM) == (*want[:4], 2.0, f32, 0, ((3.0, 0, 100),))
        assert neuron_emu.routing.plan_for(MM).defects == []
    # Infrastructure ops are never slowed.
    neuron_emu.use_build(manifest(tmp_path, "infra", defect("aten::clone.*", "slow", magnitude=50),
                                  defect("aten::copy_.*", "slow", magnitude=50)))
    assert classify("aten::clone.default")[:5] == (NATIVE, 0, False, False, 1.0)
    assert classify("aten::copy_.default")[4] == 1.0


# ---------------------------------------------------------------- time
def test_mm_is_slowed_by_its_factor(tmp_path):
    base = manifest(tmp_path, "base")
    slow = manifest(tmp_path, "slow", defect(MM, "slow", magnitude=4, dtypes=["float32"]))
    r = ratio(base, slow, mm_of(torch.randn(128, 128)))
    assert r >= 2.0, r


@pytest.mark.parametrize("dtype", [torch.float64, torch.int64])
def test_dtypes_filter(tmp_path, dtype):
    base = manifest(tmp_path, "base")
    slow = manifest(tmp_path, "slow", defect(MM, "slow", magnitude=4, dtypes=["float32"]))
    r = ratio(base, slow, mm_of(torch.randn(128, 128).mul(8).to(dtype)))
    assert r < 2.0, r


def test_min_numel_filter(tmp_path):
    base = manifest(tmp_path, "base")
    slow = manifest(tmp_path, "slow", defect(MM, "slow", magnitude=4, min_numel=128 * 128))
    small = ratio(base, slow, mm_of(torch.randn(96, 96)))         # 9216 < min_numel: not slowed
    big = ratio(base, slow, mm_of(torch.randn(128, 128)))
    assert small < 2.0 <= big, (small, big)


def test_defects_with_other_filters_each_apply_and_multiply(tmp_path):
    """x2 on float32 and x3 from 10000 elements: a float32 128x128 mm takes ~6x, a float64 one ~3x,
    a float64 64x64 one (neither) as long as without them."""
    base = manifest(tmp_path, "base")
    slow = manifest(tmp_path, "slow", defect(MM, "slow", magnitude=2, dtypes=["float32"]),
                    defect(MM, "slow", magnitude=3, min_numel=10000))
    both = ratio(base, slow, mm_of(torch.randn(128, 128)))
    big = ratio(base, slow, mm_of(torch.randn(128, 128, dtype=torch.float64)))
    neither = ratio(base, slow, mm_of(torch.randn(64, 64, dtype=torch.float64)))
    assert both >= 3.5 and big >= 2.0 and neither < 1.5, (both, big, neither)


@pytest.mark.parametrize("parent,ops,action", [
    ("ideal", "", NATIVE),                                                   # zero-copy native
    ("ideal", '[ops]\ncpu_fallback = ["aten::mm.*"]\n', FALLBACK),           # zero-copy fallback
    ("2.33.0", "", PYTHON),                                                  # matmul numerics: Python
])
def test_values_counts_and_route_are_the_unslowed_builds(tmp_path, parent, ops, action):
    a, b = torch.randn(128, 128), torch.randn(128, 128)
    f = manifest(tmp_path, "f", parent=parent, extra=ops)
    s = manifest(tmp_path, "s", defect(MM, "slow", magnitude=4), parent=parent, extra=ops)

    def run(build):
        neuron_emu.use_build(build)
        neuron_emu.clear_op_tracking()
        x, y = a.to(N), b.to(N)
        out = [torch.mm(x, y).cpu(), torch.mm(x, y).cpu(), (x @ y + x).cpu()]
        return classify(MM)[:4], out, neuron_emu.get_op_counts()

    route_f, out_f, counts_f = run(f)
    route_s, out_s, counts_s = run(s)
    assert route_f == route_s and route_s[0] == action
    assert all(bits_equal(p, q) for p, q in zip(out_f, out_s, strict=True))
    assert counts_f == counts_s and counts_s[MM]["native" if action != FALLBACK else "fallback"] == 3
    r = ratio(f, s, mm_of(a))
    assert r >= 2.0, (action, r)


@pytest.mark.parametrize("glob,call", [
    ("aten::fill_.*", lambda x, y: y.fill_(1.5)),
    ("aten::empty.*", lambda x, y: torch.empty(256, 256, device=N)),
    ("aten::view.*", lambda x, y: x.view(-1)),
    # clone and copy_ reach the device as empty_strided + _copy_from (a kernel of its own): infra too.
    ("aten::clone.*", lambda x, y: x.clone()),
    ("aten::copy_.*", lambda x, y: y.copy_(x)),
])
def test_infra_ops_are_not_slowed(tmp_path, glob, call):
    """Allocation, views and copies: a slow defect on them (accepted, its glob names ops) does
    nothing; were they slowed, a factor of 50 would show (fill_, empty and view reach the
    fallback under their own name)."""
    base = manifest(tmp_path, "base")
    slow = manifest(tmp_path, "slow", defect(glob, "slow", magnitude=50))
    x, y = torch.randn(256, 256).to(N), torch.empty(256, 256).to(N)
    r = ratio(base, slow, lambda: call(x, y), calls=15)
    assert r < 2.0, r
