"""An op item's mismatch localised inside the item (conformance.check.localize), and the error
cause that follows from it (conformance.triage.causes.local_blame)."""

from __future__ import annotations

import json

import pytest
import torch

import neuron_emu
from conformance.check.localize import WRONG, locate
from conformance.sweep import SweepConfig, run_group
from conformance.targets import get_target
from conformance.triage.causes import local_blame
from conformance.triage.signature import SINGLE_PRECISION, op_signature, rules
from conformance.work import Group


def _build(tmp_path, name, body, parent="ideal"):
    p = tmp_path / f"{name}.toml"
    p.write_text(f'[build]\nname = "{name}"\ninherits = "{parent}"\n\n{body}', encoding="utf-8")
    return str(p)


@pytest.fixture
def emu(tmp_path):
    def make(body, parent="ideal"):
        t = get_target("neuron-emu", _build(tmp_path, "loc", body, parent))
        t.setup()
        return t
    return make


def test_a_correct_target_scores_zero_everywhere():
    t = get_target("cpu")
    x = torch.randn(16)
    assert locate(t, lambda: torch.exp(x.to(t.device)) * 2)["scores"] == {
        "aten::exp.default": 0.0, "aten::mul.Tensor": 0.0}


def test_the_wrong_kernel_scores_high_and_the_kernels_after_it_do_not(emu):
    t = emu('[[defects]]\nop = "aten::exp.default"\nkind = "wrong_result"\nmagnitude = 0.01\n')
    x = torch.randn(64)
    found = locate(t, lambda: (torch.exp(x.to(t.device)) * 2).sin())
    assert found["scores"]["aten::exp.default"] > 100
    # the kernels downstream were fed the wrong exp and computed right from it
    assert found["scores"]["aten::mul.Tensor"] == 0 and found["scores"]["aten::sin.default"] == 0
    assert local_blame({"locus": found}) == ("aten::exp.default", False)


def test_a_composite_op_without_a_device_kernel_is_scored_by_the_kernels_it_runs(emu):
    t = emu('[[defects]]\nop = "aten::mm.out"\nkind = "wrong_result"\n')
    x, w = torch.randn(4, 8), torch.randn(3, 8)

    def call():
        out = torch.empty(0, device=t.device)
        return torch.ops.aten.linear.out(x.to(t.device), w.to(t.device), out=out)

    scores = locate(t, call)["scores"]
    assert "aten::linear.out" not in scores and scores["aten::mm.out"] > 1


def test_wrong_integers_nan_patterns_and_dtypes_score_as_wrong(emu):
    t = emu('[[defects]]\nop = "aten::add.Tensor"\nkind = "wrong_result"\n\n'
            '[[defects]]\nop = "aten::sub.Tensor"\nkind = "nan"\n\n'
            '[[defects]]\nop = "aten::neg.default"\nkind = "wrong_dtype"\n')
    i, f = torch.arange(6), torch.randn(6)
    s = locate(t, lambda: (i.to(t.device) + 1, f.to(t.device) - 1, -f.to(t.device)))["scores"]
    assert s["aten::add.Tensor"] == s["aten::sub.Tensor"] == s["aten::neg.default"] == WRONG


def test_double_precision_computed_in_single_is_the_dtypes_and_a_worse_kernel_its_own(emu):
    t = emu('[dtypes]\nfloat64 = "downcast"\n\n[numerics]\ntranscendental_bits = 12\n')
    x = torch.rand(256, dtype=torch.float64) + 0.5
    a = torch.randn(64, 256, dtype=torch.float64)
    exp = locate(t, lambda: torch.exp(x.to(t.device)))
    mm = locate(t, lambda: a.to(t.device) @ a.to(t.device).T)
    assert set(exp["single"]) == {"aten::exp.default"}
    # a 12-bit exp errs far beyond float32's rounding: the kernel is wrong by itself
    assert exp["scores"]["aten::exp.default"] > 100 * exp["single"]["aten::exp.default"]
    assert local_blame({"locus": exp}) == ("aten::exp.default", False)
    # the float64 matmul, out of float64's tolerance, errs exactly as float32 does: the dtype's
    # cause, at no kernel
    assert mm["scores"]["aten::mm.default"] > 1 and mm["single"]["aten::mm.default"] == mm["scores"]["aten::mm.default"]
    assert local_blame({"locus": mm}) == ("", True)
    # an in-place call's twin starts from its inputs as they were, not as the call left them
    y = torch.randn(4096, dtype=torch.float64) * 1e3

    def inplace():
        z = y.to(t.device)
        return z.add_(z * 1.0001)

    found = locate(t, inplace)
    assert found["scores"]["aten::add_.Tensor"] > 0 and found["single"] == found["scores"], found
    row = {"status": "mismatch", "dtype": "float64", "op": "matmul", "proof": {}}
    assert op_signature(row, single=True).pattern == SINGLE_PRECISION and op_signature(row, single=True).locus == ""
    assert op_signature(row, blamed="aten::exp.default", single=False).locus == "aten::exp.default"


def test_no_kernel_diverging_alone_leaves_the_blame_to_the_run():
    assert local_blame({"locus": {"scores": {"aten::sum.default": 0.7, "aten::mul.Tensor": 0.2}}}) == ("", None)
    assert local_blame({}) == ("", None) and local_blame(json.dumps({"locus": None})) == ("", None)
    # allocations and views are never blamed, whatever their garbage scores
    assert local_blame({"locus": {"scores": {"aten::empty.memory_format": WRONG, "aten::resize_.default": 9e9,
                                             "aten::t.default": WRONG, "aten::add.Tensor": 3.0}}},
                       rules().never_blamed) == ("aten::add.Tensor", False)


def test_the_sweep_stores_the_locus_of_a_mismatch_and_not_of_a_pass(emu):
    t = emu('[[defects]]\nop = "aten::addmm.default"\nkind = "wrong_result"\n')
    rows = list(run_group(t, Group("nn.functional.linear", "float32"), SweepConfig(variants=("function",), max_samples=3)))
    bad = [r for r in rows if r["status"] == "mismatch"]
    assert bad and all(local_blame(r["proof"])[0] in ("aten::addmm.default",) for r in bad if
                       "aten::addmm.default" in r["native_ops"])
    clean = list(run_group(get_target("cpu"), Group("nn.functional.linear", "float32"),
                           SweepConfig(variants=("function",), max_samples=3)))
    assert all("locus" not in (r["proof"] or {}) for r in clean)
    neuron_emu.use_build("ideal")


def test_the_convolution_hooks_of_an_out_of_tree_device_are_scored_against_the_cpus_convolution(emu):
    """A PrivateUse1 device's convolution runs through hooks with no CPU kernel
    (convolution_overrideable and its backward); their CPU counterpart is the convolution."""
    t = emu('[[defects]]\nop = "aten::convolution_backward_overrideable.default"\nkind = "wrong_result"\n')
    x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)

    def call():
        xd, wd = x.to(t.device).requires_grad_(), w.to(t.device).requires_grad_()
        return torch.autograd.grad(torch.nn.functional.conv2d(xd, wd, padding=1).sum(), [xd, wd])

    scores = locate(t, call)["scores"]
    assert scores["aten::convolution_overrideable.default"] == 0
    assert scores["aten::convolution_backward_overrideable.default"] > 1


def test_a_composite_that_calls_its_own_op_again_is_scored_whole_not_forever():
    """scaled_dot_product_attention's composite kernel dispatches to itself again on a device
    without its own kernel (the OpInfo's gradient samples on a shipped build): the mode scores it
    once it is open instead of recursing until Python's limit, which left it without a locus."""
    t = get_target("neuron-emu", "2.33.0")
    rows = list(run_group(t, Group("nn.functional.scaled_dot_product_attention", "float32"),
                          SweepConfig(variants=("backward",), max_samples=2)))
    bad = [r for r in rows if r["status"] == "mismatch"]
    assert bad and all(local_blame(r["proof"])[0] == "aten::bmm.default" for r in bad), [r["proof"] for r in bad]


def test_attention_without_dropout_is_scored_though_its_kernel_is_tagged_random(emu):
    # SDPA's kernels carry the nondeterministic_seeded tag for their dropout; at dropout_p=0 (every
    # model in inference) they are deterministic, and a wrong attention kernel must be found
    t = emu('[[defects]]\nop = "aten::_scaled_dot_product_flash_attention_for_cpu.default"\n'
            'kind = "wrong_result"\nmagnitude = 0.1\n')
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    found = locate(t, lambda: torch.nn.functional.scaled_dot_product_attention(
        *(x.to(t.device) for x in (q, k, v))) * 2)
    assert found["scores"]["aten::_scaled_dot_product_flash_attention_for_cpu.default"] > 1
    assert local_blame({"locus": found})[0] == "aten::_scaled_dot_product_flash_attention_for_cpu.default"
    # with dropout the call draws random numbers: not scored
    found = locate(t, lambda: torch.nn.functional.scaled_dot_product_attention(
        *(x.to(t.device) for x in (q, k, v)), dropout_p=0.5))
    assert "aten::_scaled_dot_product_flash_attention_for_cpu.default" not in found["scores"]
