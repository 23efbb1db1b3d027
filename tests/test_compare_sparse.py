"""Sparse results (COO, CSR, CSC, BSR, BSC) are compared through their layout, their structure
(sparse/dense dims, block size, index dtypes, the set of specified elements) and their dense
values; a layout or pattern difference is never forgiven by the values, and the sweep reaches
the rule through a real sparse OpInfo (``to_sparse``)."""

from __future__ import annotations

import warnings

import pytest
import torch

from conformance.check.compare import Meta, arbitrate, bitwise_equal, compare
from conformance.sweep.opinfo import SweepConfig, run_group
from conformance.targets.cpu import CpuTarget
from conformance.work import Group

warnings.filterwarnings("ignore", message=".*(beta state|invariant checks).*")

DENSE = torch.tensor([[0.0, 1.0, 0.0, 0.0], [2.0, 0.0, 0.0, 3.0]])
BLOCK = (1, 2)  # the block size of the BSR/BSC cases
LAYOUTS = (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)


def _sparse(x: torch.Tensor, layout: torch.layout) -> torch.Tensor:
    return x.to_sparse(layout=layout, blocksize=BLOCK if layout in (torch.sparse_bsr, torch.sparse_bsc) else None)


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_equal_sparse_results_pass_in_every_layout(layout):
    c = _sparse(DENSE, layout)
    ev = compare(c, _sparse(DENSE.clone(), layout), atol=0, rtol=0, device_meta=[Meta.of(c)])
    assert ev.close and ev.structure_ok and ev.detail == ""
    assert bitwise_equal(c, _sparse(DENSE.clone(), layout))


@pytest.mark.parametrize("layout", LAYOUTS[1:], ids=str)
def test_another_layout_fails_and_names_both_even_with_equal_values(layout):
    c = DENSE.to_sparse()
    t = _sparse(DENSE, layout)
    ev = compare(c, t, atol=0, rtol=0)
    name = str(layout).removeprefix("torch.")
    assert not ev.close and not ev.structure_ok and not ev.stride_ok
    assert ev.detail == f"output 0: layout {name} on target vs sparse_coo on CPU; dense values equal"
    assert not bitwise_equal(c, t)


def test_a_dense_result_where_the_cpu_gives_a_sparse_one_fails():
    c = DENSE.to_sparse()
    ev = compare(c, DENSE.clone(), atol=0, rtol=0, device_meta=[Meta.of(DENSE)])
    assert not ev.close and "layout strided on target vs sparse_coo on CPU; dense values equal" in ev.detail
    ev = compare(DENSE, c, atol=0, rtol=0, device_meta=[Meta.of(c)])  # and the other way round
    assert not ev.close and "layout sparse_coo on target vs strided on CPU" in ev.detail
    # the device's layout counts even when its copy on the CPU is strided
    ev = compare(c, c.clone(), atol=0, rtol=0, device_meta=[Meta("float32", (2, 4), (4, 1))])
    assert not ev.close and "layout strided on target vs sparse_coo on CPU" in ev.detail


def test_meta_names_a_layout_difference_for_the_metadata_contract():
    assert Meta.of(DENSE.to_sparse_csr()).layout_differs(Meta.of(DENSE)) == "layout sparse_csr vs strided"
    assert Meta.of(DENSE).layout_differs(Meta.of(DENSE.clone())) == ""


def test_an_explicit_zero_is_a_pattern_difference_reported_as_such():
    c = DENSE.to_sparse()  # 3 specified elements
    idx = torch.cat([c.indices(), torch.tensor([[0], [0]])], dim=1)
    t = torch.sparse_coo_tensor(idx, torch.cat([c.values(), torch.zeros(1)]), DENSE.shape)
    ev = compare(c, t, atol=0, rtol=0)
    assert not ev.close and not ev.structure_ok and ev.max_abs_err == 0
    assert ev.detail == ("output 0: sparsity pattern differs: 4 specified elements on target vs 3 on CPU "
                         "(1 only on target, 0 only on CPU); dense values equal")
    assert not bitwise_equal(c, t)


def test_a_pattern_difference_in_a_compressed_layout():
    c = DENSE.to_sparse_csr()
    # the same dense values with an explicit zero at (0, 0): one more column index in row 0
    t = torch.sparse_csr_tensor(torch.tensor([0, 2, 4]), torch.tensor([0, 1, 0, 3]),
                                torch.tensor([0.0, 1.0, 2.0, 3.0]), DENSE.shape)
    ev = compare(c, t, atol=0, rtol=0)
    assert not ev.close and "sparsity pattern differs: 4 specified elements on target vs 3 on CPU" in ev.detail


def test_coalescing_and_index_order_are_not_differences():
    c = DENSE.to_sparse()
    # uncoalesced: (1, 0) twice, adding up to the CPU's value, in another order
    t = torch.sparse_coo_tensor([[1, 1, 0, 1], [3, 0, 1, 0]], [3.0, 1.5, 1.0, 0.5], DENSE.shape)
    assert not t.is_coalesced()
    ev = compare(c, t, atol=0, rtol=0)
    assert ev.close and ev.structure_ok, ev.detail


def test_values_differing_on_the_same_pattern_are_a_mismatch_at_a_dense_index():
    c = DENSE.to_sparse_csr()
    t = torch.sparse_csr_tensor(c.crow_indices(), c.col_indices(), c.values() * torch.tensor([1.0, 1.0, 1.5]),
                                DENSE.shape)
    ev = compare(c, t, atol=1e-5, rtol=1e-5)
    assert not ev.close and ev.structure_ok
    assert ev.worst == {"output": 0, "index": [1, 3], "target": 4.5, "cpu": 3.0}
    assert "1 of 8 values outside" in ev.detail


def test_block_size_and_index_dtype_are_structure():
    ev = compare(DENSE.to_sparse_bsr((2, 2)), DENSE.to_sparse_bsr((1, 2)), atol=0, rtol=0)
    assert not ev.close and "block size (1, 2) on target vs (2, 2) on CPU; dense values equal" in ev.detail
    c = DENSE.to_sparse_csr()
    t = torch.sparse_csr_tensor(c.crow_indices().int(), c.col_indices().int(), c.values(), DENSE.shape)
    ev = compare(c, t, atol=0, rtol=0)
    assert not ev.close and "crow_indices dtype int32 on target vs int64 on CPU" in ev.detail
    hybrid = torch.sparse_coo_tensor([[0, 1]], torch.ones(2, 4), (2, 4))  # 1 sparse, 1 dense dim
    ev = compare(DENSE.to_sparse(), hybrid, atol=10, rtol=10)
    assert not ev.close and "sparse/dense dims (1, 1) on target vs (2, 0) on CPU" in ev.detail


def test_the_arbiter_never_forgives_a_structure_difference():
    c = DENSE.to_sparse().to(torch.bfloat16)
    t = DENSE.to(torch.bfloat16)  # the right values, densely
    ev = compare(c, t, atol=0, rtol=0, device_meta=[Meta.of(t)])
    assert not ev.close
    assert arbitrate(ev, c, t, DENSE.double(), atol=0) == ev
    # a values-only difference of sparse results is arbitrated as a dense one would be
    cb = torch.tensor([1.0, 1.0 + 2 ** -8]).to(torch.bfloat16).to_sparse()
    tb = torch.tensor([1.0, 1.0 + 2 ** -7]).to(torch.bfloat16).to_sparse()
    ev = compare(cb, tb, atol=0, rtol=0)
    assert not ev.close and ev.structure_ok
    assert arbitrate(ev, cb, tb, torch.tensor([1.0, 1.0 + 2 ** -7], dtype=torch.float64), atol=0).close


class _CsrInsteadOfCoo(CpuTarget):
    """The CPU, but ``to_sparse`` answers in CSR: right dense values, wrong layout."""

    name = "test-csr-instead-of-coo"

    def wrap(self, fn):
        def run(*args, **kwargs):
            out = fn(*args, **kwargs)
            return out.to_sparse_csr() if out.layout == torch.sparse_coo and out.sparse_dim() == 2 else out
        return run


class _DropsOne(CpuTarget):
    """The CPU, but ``to_sparse`` loses its last specified element (OpInfo's samples hold no
    zeros, so every element is specified on the CPU)."""

    name = "test-drops-one"

    def wrap(self, fn):
        def run(*args, **kwargs):
            out = fn(*args, **kwargs).coalesce()
            if out.layout != torch.sparse_coo or out._nnz() < 2:
                return out
            return torch.sparse_coo_tensor(out.indices()[:, :-1], out.values()[:-1], out.shape).coalesce()
        return run


def _to_sparse_rows(target):
    return list(run_group(target, Group("to_sparse", "float32"), SweepConfig(variants=("function",))))


def test_the_sweep_catches_a_layout_and_a_pattern_difference_in_a_real_sparse_opinfo():
    clean = _to_sparse_rows(CpuTarget())
    assert clean and all(r["status"] == "pass" for r in clean), [r["error"] for r in clean]
    wrong_layout = _to_sparse_rows(_CsrInsteadOfCoo())
    assert any(r["status"] == "mismatch" and "layout sparse_csr on target vs sparse_coo on CPU; dense values equal"
               in r["error"] for r in wrong_layout), [r["error"] for r in wrong_layout]
    dropped = _to_sparse_rows(_DropsOne())
    assert any(r["status"] == "mismatch" and "sparsity pattern differs" in r["error"] and "0 only on target, 1 "
               "only on CPU); dense values: 1 of" in r["error"] for r in dropped), [r["error"] for r in dropped]


# -- the sparse variants: the OpInfo's own sparse samples ----------------------------------------

class _ScalesSparseValues(CpuTarget):
    """The CPU, but every sparse result's specified values come back 1 % too large."""

    name = "test-scales-sparse-values"

    def wrap(self, fn):
        def run(*args, **kwargs):
            out = fn(*args, **kwargs)
            if not isinstance(out, torch.Tensor) or out.layout == torch.strided:
                return out
            if out.layout == torch.sparse_coo:
                out = out.coalesce()
                return torch.sparse_coo_tensor(out.indices(), out.values() * 1.01, out.shape)
            compressed, plain = ((out.crow_indices(), out.col_indices()) if out.layout in (torch.sparse_csr, torch.sparse_bsr)
                                 else (out.ccol_indices(), out.row_indices()))
            return torch.sparse_compressed_tensor(compressed, plain, out.values() * 1.01, out.shape, layout=out.layout)
        return run


SPARSE = ("sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc")


def _mul_rows(target, variants=SPARSE, max_samples=4):
    return list(run_group(target, Group("mul", "float32"), SweepConfig(variants=variants, max_samples=max_samples)))


def test_the_sparse_variants_run_the_opinfos_own_sparse_samples_in_each_layout():
    from conformance.inputs.opinfo import by_name, samples, sparse_samples_fn

    info = by_name()["mul"]
    for variant, layout in zip(SPARSE, LAYOUTS, strict=True):
        first = next(samples(info, torch.float32, layout=variant))
        assert first.input.layout == layout, variant
    # abs declares sparse support but gives no sample function of its own (upstream raises
    # NotImplementedError): no sparse item is planned, none fails to generate
    assert sparse_samples_fn(by_name()["abs"], "sparse_coo") is None
    assert [r for r in run_group(CpuTarget(), Group("abs", "float32"), SweepConfig(variants=SPARSE))] == []

    clean = _mul_rows(CpuTarget())
    assert {r["variant"] for r in clean} == set(SPARSE)
    assert all(r["status"] == "pass" for r in clean), [(r["item_key"], r["error"]) for r in clean if r["status"] != "pass"]
    assert {r["item_key"] for r in clean} >= {"mul|sparse_bsc|float32|0", "mul|sparse_coo|float32|3"}


def test_the_sparse_variants_catch_wrong_sparse_values_and_leave_strided_items_alone():
    # mul's first COO samples have no specified element (nothing to scale): COO takes 10
    rows = _mul_rows(_ScalesSparseValues(), variants=("function", *SPARSE), max_samples=10)
    by_variant = {v: {r["status"] for r in rows if r["variant"] == v} for v in ("function", *SPARSE)}
    assert by_variant["function"] == {"pass"}
    for variant in SPARSE:
        assert "mismatch" in by_variant[variant], (variant, by_variant)
    assert all("values outside" in r["error"] for r in rows if r["status"] == "mismatch")


def test_a_device_that_refuses_sparse_tensors_gives_unsupported_layout_and_the_ideal_build_passes():
    from conformance.targets import get_target

    refused = _mul_rows(get_target("neuron-emu", "2.33.0"))
    assert refused and {r["status"] for r in refused} == {"unsupported_layout"}, {r["error"] for r in refused}
    assert all("supports only strided tensors" in r["error"] for r in refused)
    ideal = _mul_rows(get_target("neuron-emu", "ideal"))
    assert {r["status"] for r in ideal} == {"pass"}, {r["error"] for r in ideal}


def test_a_compiler_that_refuses_sparse_inputs_is_unsupported_layout_not_infra():
    from conformance.targets import get_target

    rows = list(run_group(get_target("inductor"), Group("mul", "float32"),
                          SweepConfig(variants=("sparse_coo",), max_samples=1)))
    assert [r["status"] for r in rows] == ["unsupported_layout"], rows
    assert "refused an input's layout, compiled no graph and ran eager" in rows[0]["error"]
    assert "Attempted to wrap sparse Tensor" in rows[0]["error"]
