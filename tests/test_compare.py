"""Evidence, the float64 arbiter rule, semantic comparators and the verdict."""

from __future__ import annotations

import pytest
import torch

from conformance.check.comparators import comparator_for, ks_statistic, per_tensor_fn
from conformance.check.compare import Meta, arbitrate, compare, strides_agree
from conformance.check.verdict import Status, decide, is_unsupported_dtype


def test_close_and_errors():
    c = torch.tensor([1.0, 2.0, 4.0])
    t = torch.tensor([1.0, 2.0, 4.5])
    ev = compare(c, t, atol=1e-5, rtol=1e-5)
    assert not ev.close
    assert ev.max_abs_err == 0.5 and abs(ev.max_rel_err - 0.125) < 1e-9
    assert abs(ev.mismatch_frac - 1 / 3) < 1e-9
    assert ev.ulp_err == 0.5 / 2 ** (2 - 23)


def test_nan_pattern_must_agree():
    c = torch.tensor([float("nan"), 1.0])
    assert compare(c, c.clone(), atol=0, rtol=0).close
    ev = compare(c, torch.tensor([0.0, 1.0]), atol=0, rtol=0)
    assert not ev.close and not ev.nan_agree


def test_device_tensor_metadata_is_checked():
    c = torch.zeros(2, 3)
    ev = compare(c, c.clone(), atol=0, rtol=0, device_meta=[Meta("float32", (3, 2), (1, 3))])
    assert not ev.close and not ev.shape_ok
    ev = compare(c, c.clone(), atol=0, rtol=0, device_meta=[Meta("float16", (2, 3), (3, 1))])
    assert not ev.close and not ev.dtype_ok
    ev = compare(c, c.clone(), atol=0, rtol=0, device_meta=[Meta("float32", (2, 3), (1, 2))])
    assert ev.close and not ev.stride_ok


def test_integers_compare_exactly():
    assert not compare(torch.tensor([1, 2]), torch.tensor([1, 3]), atol=1, rtol=1).close


def test_arbiter_does_not_punish_a_more_accurate_device():
    exact = torch.tensor([1 / 3, 2 / 3], dtype=torch.float64)
    cpu = exact.to(torch.bfloat16) + torch.tensor([0.0078125, 0.0], dtype=torch.bfloat16)  # CPU off by 1 ulp
    target = exact.to(torch.bfloat16)  # the device rounds correctly
    ev = compare(cpu, target, atol=0, rtol=0)
    assert not ev.close
    judged = arbitrate(ev, cpu, target, exact, atol=0)
    assert judged.close and judged.arbiter_err < judged.cpu_arbiter_err


def test_arbiter_still_fails_a_worse_device():
    exact = torch.tensor([1 / 3, 2 / 3], dtype=torch.float64)
    cpu = exact.to(torch.bfloat16)
    target = cpu * 1.1
    ev = compare(cpu, target, atol=0, rtol=0)
    assert not arbitrate(ev, cpu, target, exact, atol=0).close


def test_indices_comparator_accepts_ties_only():
    x = torch.tensor([[3.0, 1.0, 1.0, 2.0]])
    fn = per_tensor_fn("indices", x)
    assert fn(1, torch.tensor([[1, 2, 3, 0]]), torch.tensor([[2, 1, 3, 0]])).close  # tie swapped
    assert fn(1, torch.tensor([[3, 1, 2, 0]]), torch.tensor([[2, 1, 3, 0]])) is None  # real difference
    assert comparator_for("sort") == "indices" and comparator_for("topk") == "indices"
    values, idx = torch.sort(x)
    ev = compare((values, idx), (values, torch.tensor([[2, 1, 3, 0]])), atol=0, rtol=0, per_tensor=fn)
    assert ev.close


def test_decomposition_comparator_ignores_signs():
    a = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    u, s, vh = torch.linalg.svd(a, full_matrices=False)
    flipped = (u * torch.tensor([-1.0, 1.0, -1.0]), s, vh * torch.tensor([[-1.0], [1.0], [-1.0]]))
    assert not compare((u, s, vh), flipped, atol=1e-5, rtol=1e-5).close
    fn = per_tensor_fn(comparator_for("linalg.svd"))
    assert compare((u, s, vh), flipped, atol=1e-5, rtol=1e-5, per_tensor=fn).close
    assert not compare((u, s, vh), (u * 2, s, vh), atol=1e-5, rtol=1e-5, per_tensor=fn).close


def test_random_comparator_checks_distribution():
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(4000, generator=g), torch.randn(4000, generator=g)
    fn = per_tensor_fn("random")
    assert fn(0, a, b).close  # same distribution, different values
    assert not fn(0, a + 1.0, b).close
    assert ks_statistic(a, a) == 0
    assert comparator_for("bernoulli") == "random"
    assert comparator_for("nn.functional.dropout") == "random"  # its values are defined: not "meta"


def test_ks_statistic_is_the_largest_cdf_distance_with_ties_and_narrow_dtypes():
    """The statistic against its definition, evaluated at every value of either sample: ties
    (values repeat in both samples), different sample sizes, and bfloat16 values (sorted
    widened, never rounded)."""
    g = torch.Generator().manual_seed(3)
    for a, b in ((torch.randint(0, 5, (300,), generator=g).float(), torch.randint(0, 7, (200,), generator=g).float()),
                 (torch.randn(500, generator=g).bfloat16(), (torch.randn(400, generator=g) + 0.2).bfloat16())):
        xs, ys = a.double().tolist(), b.double().tolist()
        want = max(abs(sum(x <= v for x in xs) / len(xs) - sum(y <= v for y in ys) / len(ys)) for v in xs + ys)
        assert ks_statistic(a, b) == pytest.approx(want, abs=1e-12)
        assert ks_statistic(a, b) > 0


def test_no_opinfo_is_claimed_by_two_comparator_tables():
    """The first table that matches wins: an op listed in two tables (dropout was in both meta
    and random, so its values were never compared) is one wrong choice waiting to happen."""
    import fnmatch

    from conformance import datafiles
    from conformance.inputs.opinfo import by_name

    tables = {kind: rule.ops for kind, rule in datafiles.comparators().items()}
    twice = {}
    for name in by_name():
        kinds = [k for k, globs in tables.items() if any(fnmatch.fnmatchcase(name, g) for g in globs)]
        if len(kinds) > 1:
            twice[name] = kinds
    assert not twice, f"OpInfos matched by more than one comparator table: {twice}"


def test_random_ops_are_found_from_registry_tags():
    # normal's OpInfo reaches aten::normal.* (tagged nondeterministic_seeded) without being listed by name
    assert comparator_for("randint") == "random"


def test_meta_comparator_ignores_values():
    fn = per_tensor_fn(comparator_for("empty"))
    assert compare(torch.zeros(3), torch.ones(3), atol=0, rtol=0, per_tensor=fn).close
    assert not compare(torch.zeros(3), torch.ones(4), atol=0, rtol=0, per_tensor=fn).close


def test_verdicts():
    assert decide(cpu_error="boom", target_error=None, close=False) is Status.SKIP
    assert decide(cpu_error=None, target_error="RuntimeError: x", close=False) is Status.ERROR
    msg = "RuntimeError: \"abs_cpu\" not implemented for 'ComplexHalf'"
    assert decide(cpu_error=None, target_error=msg, close=False) is Status.UNSUPPORTED_DTYPE
    assert is_unsupported_dtype("neuron: dtype complex64 is not supported on neuron (build 2.33.0)")
    assert decide(cpu_error=None, target_error=None, close=False) is Status.MISMATCH
    assert decide(cpu_error=None, target_error=None, close=True) is Status.PASS
    assert decide(cpu_error=None, target_error=None, close=True, fallback=["aten::x.default"]) is Status.PASS_FALLBACK
    assert decide(cpu_error=None, target_error=None, close=False, expected_failure=["mismatch"]) is Status.XFAIL
    assert decide(cpu_error=None, target_error=None, close=True, expected_failure=["mismatch"]) is Status.XPASS
    assert decide(cpu_error=None, target_error="E", close=False, expected_failure=["mismatch"]) is Status.ERROR


def test_worst_element_names_where_and_both_values():
    c = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    t = c.clone()
    t[1, 0], t[0, 1] = 3.5, 2.01  # both outside the tolerance; [1, 0] by far
    ev = compare((c, c[0]), (t, c[0]), atol=1e-5, rtol=1e-5)
    assert ev.worst == {"output": 0, "index": [1, 0], "target": 3.5, "cpu": 3.0}
    arb = arbitrate(ev, (c, c[0]), (t, c[0]), (c.double() + 1e-9, c[0].double()), atol=1e-5)
    assert arb.worst["arbiter"] == pytest.approx(3.0 + 1e-9)
    assert compare(c, c.clone(), atol=0, rtol=0).worst is None  # nothing failed, nothing to show
    assert compare(c, c + 1e-9, atol=1e-5, rtol=1e-5).worst is None  # differences within the tolerance


def test_worst_element_prefers_a_nan_and_the_farthest_output():
    c = torch.tensor([1.0, 2.0, 3.0])
    t = torch.tensor([1.0, float("nan"), 30.0])
    assert compare(c, t, atol=1e-5, rtol=1e-5).worst == {"output": 0, "index": [1], "target": "nan", "cpu": 2.0}
    small, far = torch.tensor([1.0, 2.0]), torch.tensor([10.0])
    ev = compare((small, far), (small + 0.1, far + 5), atol=1e-5, rtol=1e-5)
    assert ev.worst["output"] == 1 and ev.worst["target"] == 15.0
    ints = compare(torch.tensor([1, 2, 3]), torch.tensor([1, 7, 3]), atol=0, rtol=0)
    assert ints.worst == {"output": 0, "index": [1], "target": 7.0, "cpu": 2.0}


def test_bitwise_equal_counts_nans_and_signed_zeros_and_views_alike():
    """Same bits are equal in one pass (any strides, any float width); values that differ only in
    a NaN's payload or a zero's sign are equal too; any other bit is not."""
    from conformance.check.compare import bitwise_equal

    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    for dt in (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.float8_e4m3fn):
        a = x.to(dt)
        assert bitwise_equal(a.t(), a.t().contiguous())  # a strided view against its copy
        b = a.clone()
        b.view(-1)[5] = torch.tensor(100.0).to(dt)
        assert not bitwise_equal(a, b)
    nan, other_nan = torch.tensor([float("nan"), 0.0]), torch.tensor([-float("nan"), -0.0])
    assert bitwise_equal(nan, other_nan) and not bitwise_equal(nan, torch.tensor([1.0, 0.0]))
    assert bitwise_equal(torch.tensor([1.0 + 2j]), torch.tensor([1.0 + 2j]).conj().conj())


def test_a_complex_element_is_one_value_as_assert_close_takes_it():
    """|target - cpu| <= atol + rtol * |cpu| per complex element (torch.isclose's rule, which the
    standalone repro's assert_close applies), not each part on its own: a small part's error
    within the element's tolerance passes (ONNX Runtime's fft.fft was a false mismatch), and two
    parts each within tolerance whose modulus is not fail."""
    from conformance.check.compare import tensor_evidence

    c = torch.tensor([1 + 1j, 0.001 + 5j], dtype=torch.complex64)
    small_part = c.clone()
    small_part[1] = complex(0.001 + 1.2e-5, 5)  # 1.2e-5 > atol on a part of 1e-3; within 1e-5 + 1.3e-6 * 5
    ev = tensor_evidence(small_part, c, 1e-5, 1.3e-6)
    assert ev.close and ev.detail == "" and ev.max_abs_err > 1e-5
    torch.testing.assert_close(small_part, c, atol=1e-5, rtol=1.3e-6)
    both_parts = c.clone()
    both_parts[0] = complex(1 + 8e-6, 1 + 8e-6)  # each part within 1e-5 + 1.3e-6; |diff| = 1.13e-5 is not
    ev = tensor_evidence(both_parts, c, 1e-5, 0.0)
    assert not ev.close and ev.detail.startswith("1 of 2 complex values outside") and ev.mismatch_frac == 0.5
    with pytest.raises(AssertionError):
        torch.testing.assert_close(both_parts, c, atol=1e-5, rtol=0.0)
    nan = torch.tensor([complex(float("nan"), 0)], dtype=torch.complex64)
    assert tensor_evidence(nan, nan.clone(), 1e-5, 0.0).close
    assert not tensor_evidence(nan, torch.tensor([1 + 0j]), 1e-5, 0.0).close


def test_an_empty_tensor_has_no_layout_to_differ_in():
    """Inductor returns an empty unfold result ([0, 4, 16]) with strides (0, 0, 0), eager with
    (64, 16, 1): a result of no element reads no memory, so neither its strides nor its offset
    are a finding (torch._prims_common.check_significant_strides skips it too)."""
    inductors, eagers = torch.empty_strided((0, 4, 16), (0, 0, 0)), torch.empty(0, 4, 16)
    assert strides_agree(Meta.of(inductors), Meta.of(eagers))
    assert Meta.of(inductors).layout_differs(Meta.of(eagers)) == ""
    # a tensor with elements is still compared, and so are the shapes of empty ones
    transposed = torch.empty(3, 2).t()
    assert not strides_agree(Meta.of(transposed), Meta.of(torch.empty(2, 3)))
    assert Meta.of(transposed).layout_differs(Meta.of(torch.empty(2, 3))) == "strides [1, 2] vs [3, 1]"
    assert not strides_agree(Meta.of(torch.empty(0, 4)), Meta.of(torch.empty(4, 0)))


def test_a_device_without_a_quantized_backend_rejects_the_layout():
    """The dispatcher's refusal of a quantized tensor on a device with no quantized backend (the
    emulated neuron device, as a real PrivateUse1 one) is the target refusing that layout (as the
    layout probe and coverage count quantized tensors), not an error of the op; a missing kernel
    of a plain tensor stays an error."""
    from conformance.targets import get_target

    get_target("neuron-emu", "ideal")
    with pytest.raises(NotImplementedError) as info:
        torch.ops.aten._empty_affine_quantized.default([2], dtype=torch.quint8, device="neuron")
    message = f"{type(info.value).__name__}: {info.value}"
    assert decide(cpu_error=None, target_error=message, close=False) is Status.UNSUPPORTED_LAYOUT
    plain = "NotImplementedError: Could not run 'aten::foo' with arguments from the 'neuron' backend."
    assert decide(cpu_error=None, target_error=plain, close=False) is Status.ERROR
