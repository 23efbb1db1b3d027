"""The contract budget: the costly contracts (noncontiguous, variants, out) are checked on the first K
samples of an op x variant x dtype and then on every sample of a new shape class; the others are
marked as not checked, never as passed; --contract-budget all checks every sample."""

from __future__ import annotations

import pytest

from conformance.check.contracts import BUDGETED, SAMPLED_OUT, Budget, shape_class
from conformance.sweep.opinfo import SweepConfig, run_group
from conformance.targets import get_target
from conformance.work import Group


def test_shape_classes_keep_rank_broadcast_empty_strides_and_arguments():
    assert shape_class("f32[5,7], f32[7]") == shape_class("f32[2,3], f32[3]") == "f32[n,n], f32[n]"
    assert shape_class("f32[5,1]") != shape_class("f32[5,5]")  # a broadcast dimension
    assert shape_class("f32[0,3]") != shape_class("f32[2,3]")  # an empty one
    assert shape_class("f32[3,4]{1,3}") != shape_class("f32[3,4]")  # non-contiguous
    assert shape_class("f32[3]; dim=0") != shape_class("f32[3]; dim=-1")
    assert shape_class("bf16[3]") != shape_class("f32[3]")


def test_the_budget_takes_the_first_k_then_new_classes_and_answers_a_sample_once():
    b = Budget(2)
    sigs = ["f32[3]", "f32[4]", "f32[5]", "f32[5,1]", "f32[6]", "f32[2,1]"]
    got = [b.wants("noncontiguous", "function", i, s) for i, s in enumerate(sigs)]
    assert got == [True, True, False, True, False, False]
    assert b.wants("noncontiguous", "function", 2, "f32[5]") is False  # asked again: the same answer
    assert b.wants("noncontiguous", "function", 0, "f32[3]") is True
    assert [b.wants("variants", "function", i, s) for i, s in enumerate(sigs)][:3] == [True, True, False]  # own count
    assert all(b.wants("metadata", "function", i, s) for i, s in enumerate(sigs))  # not budgeted
    every = Budget(0)
    assert all(every.wants("noncontiguous", "function", i, "f32[3]") for i in range(20))


@pytest.fixture(scope="module")
def rows():
    """addmm's function and out= items (30+ samples, method and aliases) with a budget of 1 and with none."""
    target = get_target("neuron-emu", build="2.33.0")
    group = Group("addmm", "float32")
    out = {}
    for k in (1, 0):
        config = SweepConfig(variants=("function", "out"), contract_budget=k)
        out[k] = {r["item_key"]: r for r in run_group(target, group, config)}
    return out


def test_a_budgeted_sweep_checks_fewer_samples_and_marks_the_rest(rows):
    budgeted, every = rows[1], rows[0]
    assert budgeted.keys() == every.keys()
    for name in BUDGETED:
        checked = [k for k, r in budgeted.items() if r["contracts"] and name in r["contracts"]
                   and r["contracts"][name]["detail"] != SAMPLED_OUT]
        sampled_out = [k for k, r in budgeted.items() if r["contracts"] and name in r["contracts"]
                       and r["contracts"][name] == {"outcome": "n/a", "detail": SAMPLED_OUT}]
        assert checked and sampled_out, name  # some of each
        assert all(every[k]["contracts"][name]["outcome"] in ("pass", "fail") for k in sampled_out)
        for k in checked:  # where the budget checks, it finds what the exhaustive check finds
            assert budgeted[k]["contracts"][name] == every[k]["contracts"][name]
    for name, variant in (("noncontiguous", "function"), ("out", "out")):
        mine = {k: r for k, r in budgeted.items() if r["variant"] == variant}
        classes = {shape_class(r["signature"]) for r in mine.values()}
        checked_classes = {shape_class(r["signature"]) for r in mine.values()
                           if r["contracts"] and r["contracts"][name]["detail"] != SAMPLED_OUT}
        assert checked_classes == classes, name  # every shape class is checked at least once


def test_values_and_other_contracts_do_not_change_under_the_budget(rows):
    budgeted, every = rows[1], rows[0]
    for key, r in every.items():
        b = budgeted[key]
        assert (b["max_abs_err"], b["fingerprint"]) == (r["max_abs_err"], r["fingerprint"])
        for name, c in (r["contracts"] or {}).items():
            if name not in BUDGETED:
                assert b["contracts"][name] == c
        if r["status"] != "contract":
            assert b["status"] == r["status"]
