"""No false alarms (issue #48): a CPU reference that disagrees with itself is never the target's
fault, and arguments an op wants on the CPU stay there.

On the ``ideal`` build (every op the CPU's own kernel over the device's memory) each of these
items failed before: as a mismatch (memory the op leaves unwritten, read past an input), or as an
error (an argument placed on the device that the op wants on the CPU).
"""

from __future__ import annotations

import ctypes
import types

import pytest
import torch

from conformance.check import selfcheck
from conformance.check.execute import guarded_inputs, on_device, run_item
from conformance.sweep.opinfo import SweepConfig, evaluate
from conformance.sweep.schema import run_schema_group
from conformance.targets import get_target
from conformance.work import Group


@pytest.fixture(scope="module")
def ideal():
    return get_target("neuron-emu", "ideal")


def _schema(target, op):
    rows = list(run_schema_group(target, Group(op, "any"), SweepConfig()))
    assert len(rows) == 1
    return rows[0]


def test_undefined_elements_are_found_and_left_out():
    first = torch.tensor([1.0, 2.0, 3.0, float("nan")])
    second = torch.tensor([1.0, 7.0, 3.0, float("nan")])
    third = torch.tensor([1.0, 2.0, 5.0, float("nan")])
    u = selfcheck.undefined(first, second, third)
    assert (u.elements, u.total, u.everything) == (2, 4, False)
    # the target's values at the undefined places are not compared; the others still are
    assert torch.equal(selfcheck.masked(u, torch.tensor([1.0, 9.0, 9.0, float("nan")]), first).nan_to_num(),
                       first.nan_to_num())
    wrong = selfcheck.masked(u, torch.tensor([4.0, 9.0, 9.0, float("nan")]), first)
    assert wrong[0] == 4.0
    # shapes that differ between runs: nothing is defined
    assert selfcheck.undefined(torch.zeros(2), torch.zeros(3)).everything
    assert selfcheck.undefined((torch.ones(2), 1.0), (torch.ones(2), 1.0)).any is False


def _info(fn, name="garbage"):
    return types.SimpleNamespace(name=name, variant_test_name="", op=fn, inplace_variant=None,
                                 method_variant=None, aliases=(), supports_out=False, error_inputs_func=None)


def _sample(*args):
    from torch.testing._internal.opinfo.core import SampleInput

    return SampleInput(args[0], args=args[1:])


def test_an_op_returning_uninitialised_memory_is_skipped_not_a_mismatch():
    """An op whose result is memory it never wrote: on the CPU target the reference and the
    target each get other garbage; the item says nothing about the target."""
    cpu = get_target("cpu")

    calls = []

    def garbage(x):
        # what a fresh allocation holds differs from call to call; the heap may hand both sides
        # the same bytes now and then (zeros), so the test makes every call's garbage its own
        calls.append(1)
        out = torch.empty(x.numel() * 64)
        return out[: x.numel()].fill_(float(len(calls)))

    row = evaluate(cpu, _info(garbage), "garbage", "function", "float32", 0, _sample(torch.ones(8)),
                   SweepConfig(contracts=("none",)))
    assert row["status"] == "skip", row
    assert row["error"].startswith(selfcheck.NOT_REPRODUCIBLE)


def test_a_tiny_unwritten_result_is_undefined_whatever_the_heap_held():
    """A 2-byte result its kernel never writes, in a block that neither PyTorch's
    ``fill_uninitialized_memory`` (raw storage) nor a heap poison reaches (glibc keeps its own
    free-list pointers in a block that small): the allocator's own fills make the re-runs
    disagree there, even when the first run's garbage is exactly what the filled re-run
    writes."""
    def unwritten():
        return torch.empty(0, dtype=torch.bool).set_(torch.UntypedStorage(2)), None, None

    with selfcheck.allocator_fill("junk") as filling:
        assert filling
        junk = unwritten()[0]
    assert junk.view(torch.uint8).tolist() == [0xEF, 0xBE]
    # copied (as every result is), junk bytes read True: what the filled re-run writes
    first = junk.clone()
    runs, error = selfcheck.again_on_poisoned(unwritten, first)
    assert error is None and len(runs) == 2
    assert [r.view(torch.uint8).tolist() for r in runs] == [[1, 1], [0, 0]]
    u = selfcheck.undefined(first, *runs)
    assert u.everything and u.elements == 2
    # a result the kernel writes, holding no fill value, costs one re-run
    runs, _ = selfcheck.again_on_poisoned(lambda: (torch.tensor([1.0, 2.0]), None, None), torch.tensor([1.0, 2.0]))
    assert len(runs) == 1


def test_a_part_undefined_result_is_compared_where_defined(ideal):
    """``resize_as`` growing a tensor: the grown elements are undefined, the rest must still match
    (and the comparison says how many it left out)."""
    info = _info(lambda x, y: torch.ops.aten.resize_as.default(x.clone(), y), "aten::resize_as.default")
    row = evaluate(ideal, info, "aten::resize_as.default", "function", "float32", 0,
                   _sample(torch.arange(3.0), torch.zeros(40)), SweepConfig(contracts=("none",)))
    assert row["status"] in ("pass", "pass_fallback"), row


def test_a_real_difference_beside_undefined_elements_still_fails(ideal):
    """Masking leaves out only what the CPU does not reproduce: a target wrong in a defined
    element is still a mismatch."""
    def half_garbage(x):
        out = torch.empty(x.numel() * 2, device=x.device)
        out[: x.numel()] = x * (2.0 if x.device.type != "cpu" else 1.0)  # wrong on the device
        return out

    row = evaluate(ideal, _info(half_garbage), "half", "function", "float32", 0, _sample(torch.ones(4)),
                   SweepConfig(contracts=("none",)))
    assert row["status"] == "mismatch", row
    assert (row.get("proof") or {}).get("undefined", {}).get("of") == 8


def test_a_kernel_writing_past_its_input_is_caught_by_the_guards():
    """On a guarded reference (the schema search's), a kernel that writes past the end of its
    input writes into the guard region, not the heap, and the input is rejected."""
    def scribble(x):
        end = x.data_ptr() + x.numel() * x.element_size()
        ctypes.memset(end, 0x11, 8)  # past the storage: into the guard
        return x + 1

    out = run_item(get_target("cpu"), _info(scribble), "function", _sample(torch.ones(16)), guard=True)
    assert out.cpu_error == selfcheck.WRITES_PAST
    out = run_item(get_target("cpu"), _info(lambda x: x + 1), "function", _sample(torch.ones(16)), guard=True)
    assert out.cpu_error is None


def test_guards_surround_every_cpu_copy_and_keep_aliasing():
    base = torch.arange(6.0)
    s = _sample(base[1:4], base[2:5])
    with guarded_inputs() as guards:
        moved = on_device(s, "cpu")
    assert moved.input.untyped_storage().data_ptr() == moved.args[0].untyped_storage().data_ptr()
    assert torch.equal(moved.input, base[1:4]) and torch.equal(moved.args[0], base[2:5])
    assert len(guards.regions) == 2 and guards.intact()
    # the copy's storage is as long as the original's (as_strided past it raises, as on a device)
    assert moved.input.untyped_storage().nbytes() == base.untyped_storage().nbytes()
    with pytest.raises(RuntimeError, match="out of bounds"):
        torch.as_strided(moved.input, (7,), (1,), 0)


@pytest.mark.parametrize("op", ["aten::resize_as.default", "aten::_make_dep_token.default",
                                "aten::_log_softmax_backward_data.out", "aten::grid_sampler_2d.out"])
def test_schema_search_on_ideal_reports_no_garbage(ideal, op):
    """Each of these was a mismatch on ``ideal`` (uninitialised results, reads past a shorter
    input, out-of-range modes): the search now keeps to inputs the CPU reproduces and the op's
    meta kernel accepts (an out-of-range mode is refused before the CPU runs it)."""
    from conformance.check.metacheck import OUT_OF_CONTRACT

    row = _schema(ideal, op)
    assert row["status"] in ("pass", "pass_fallback", "skip"), (row["status"], row["error"])
    if row["status"] == "skip":
        assert selfcheck.NOT_REPRODUCIBLE in row["error"] or OUT_OF_CONTRACT in row["error"]


@pytest.mark.parametrize("op", ["aten::empty_like.out", "aten::new_empty_strided.out"])
def test_the_self_check_leaves_ops_undefined_by_design_alone(ideal, op):
    """An ``empty*`` op's values are undefined by design (only shape, dtype and strides are
    compared): the search must not reject every input as not reproducible, as it did."""
    row = _schema(ideal, op)
    assert row["status"] in ("pass", "pass_fallback"), (row["status"], row["error"])


@pytest.mark.parametrize("op, arg", [("aten::_foreach_addcmul.Tensor", "args.2"),
                                     ("aten::_pack_padded_sequence.default", "args.0"),
                                     ("aten::randint_like.Tensor", "args.0")])
def test_arguments_an_op_wants_on_the_cpu_stay_there(ideal, op, arg):
    """Learned from the op's own error on the device, never from a list."""
    row = _schema(ideal, op)
    assert row["status"] in ("pass", "pass_fallback"), (row["status"], row["error"])
    assert arg in (row.get("proof") or {}).get("cpu_args", []), row.get("proof")


def test_tensor_split_indices_stay_on_the_cpu_forward_and_backward(ideal):
    rows = [r for r in evaluate_opinfo(ideal, "tensor_split", "float32")]
    assert rows and all(r["status"] in ("pass", "pass_fallback") for r in rows), \
        [(r["item_key"], r["status"], r["error"]) for r in rows if r["status"] not in ("pass", "pass_fallback")]
    assert any((r.get("proof") or {}).get("cpu_args") for r in rows if r["variant"] == "backward")


def test_an_argument_that_is_refused_on_the_device_everywhere_is_still_an_error(ideal):
    """A device error that names the CPU but that no single argument on the CPU cures stands."""
    def picky(x, y):
        if x.device.type != "cpu" or y.device.type != "cpu":
            raise RuntimeError("this op runs only on the CPU")
        return x + y

    out = run_item(ideal, _info(picky, "picky"), "function", _sample(torch.ones(3), torch.ones(3)))
    assert out.target_error and "only on the CPU" in out.target_error
    # one tensor alone on the CPU would be a CPU run, not a placement
    out = run_item(ideal, _info(lambda x: picky(x, x), "picky1"), "function", _sample(torch.ones(3)))
    assert out.target_error and "only on the CPU" in out.target_error


def evaluate_opinfo(target, op, dtype):
    from conformance.sweep import run_group

    return list(run_group(target, Group(op, dtype), SweepConfig(variants=("function", "backward"))))


def test_two_runs_of_a_build_gate_clean_on_the_ops_that_cried_wolf(tmp_path):
    """A/A: two independent runs (no shared CPU results, the schema search run afresh) of one
    shipped build, over overloads whose references hold undefined memory or read past their
    inputs: no regression, no flaky group."""
    from conformance.gate.core import run_gate
    from conformance.run.runner import RunSpec, execute_run
    from opdb import Store

    db = tmp_path / "aa.sqlite"
    ops = ("aten::resize_as.default", "aten::_reshape_alias_copy.default", "aten::_log_softmax_backward_data.out",
           "aten::_compute_linear_combination.default", "aten::_fused_adagrad.default", "tensor_split")
    ids = [execute_run(RunSpec(target="neuron-emu", build="2.33.0", ops=ops, dtypes=("float32",), workers=2,
                               max_samples=4, refcache="none", corpus=False, run_id=f"aa{i}"), db).run_id
           for i in (1, 2)]
    with Store.open(db) as st:
        result = run_gate(st, ids[0], ids[1])
    assert not result.of("regression") and not result.of("flaky"), \
        [(f.name, f.category, f.candidate) for f in result.findings]


@pytest.mark.parametrize("op, variants", [("to", ("function", "backward")), ("lu", ("out",))])
def test_opinfo_items_that_failed_on_ideal_pass(ideal, op, variants):
    """``to`` moves its result off the device: its upstream gradient goes where its output is.
    ``lu``'s out= is a Python copy on every device, and PyTorch's OpInfo expects its own
    test_out to fail: the device is not held to refusing a CPU out."""
    from conformance.sweep import run_group

    rows = list(run_group(ideal, Group(op, "float32"), SweepConfig(variants=variants, max_samples=4)))
    assert rows and all(r["status"] in ("pass", "pass_fallback") for r in rows), \
        [(r["item_key"], r["status"], r["error"]) for r in rows if r["status"] not in ("pass", "pass_fallback")]


@pytest.mark.parametrize("message, asks", [
    ("Expected scalars to be on CPU, got neuron:0 instead.", True),
    ("'lengths' argument should be a 1D CPU int64 tensor, but got 1D neuron:0 Long tensor", True),
    ("high must be a scalar tensor and on CPU", True),
    ("neuron: aten::add.Tensor fell back to the CPU and failed", False),
    ("Expected all tensors to be on the same device, but found at least two devices, neuron:0 and cpu!", False),
    ("Could not run 'aten::x' with arguments from the 'CPU' backend", False),
])
def test_only_an_error_that_asks_for_the_cpu_moves_an_argument(message, asks):
    """A device error that merely names the CPU (a defect's own message) is never cured by moving
    an argument there: that would hide it."""
    from conformance.check.placement import _CPU_WORD

    assert bool(_CPU_WORD.search(message)) is asks


def test_an_input_the_meta_kernel_refuses_is_outside_the_contract():
    """``_native_batch_norm_legit_functional`` with 4 channels and statistics of 3: the CPU kernel
    accepts it and reads past a buffer of its own (garbage no guard reaches, so the reference can
    agree with itself); the op's meta kernel refuses it. A guarded, checked-first item (the schema
    search's) is then refused on the CPU side, and the target never runs it."""
    from conformance.check.metacheck import OUT_OF_CONTRACT, meta_refusal

    op = torch.ops.aten._native_batch_norm_legit_functional.default
    x = torch.randn(3, 4, 1, 3)
    bad = (x, None, None, torch.zeros(3), torch.ones(3), False, 0.1, 1e-5)
    good = (x, None, None, torch.zeros(4), torch.ones(4), False, 0.1, 1e-5)
    assert meta_refusal(op, *bad).startswith("RuntimeError: ")
    assert meta_refusal(op, *good) is None
    # where a fake run cannot tell (an output shape that depends on the data), it says nothing
    assert meta_refusal(torch.ops.aten.nonzero.default, torch.tensor([0.0, 1.0])) is None

    ran = []
    target = get_target("cpu")
    wrap = target.wrap
    target.wrap = lambda fn: ran.append(fn) or wrap(fn)
    out = run_item(target, _info(op, "bn"), "function", _sample(*bad), guard=True, check_first=True)
    assert out.cpu_error.startswith(OUT_OF_CONTRACT) and "broadcast" in out.cpu_error
    assert not ran  # the target never ran the input
    out = run_item(target, _info(op, "bn"), "function", _sample(*good), guard=True, check_first=True)
    assert out.cpu_error is None and ran
    # an OpInfo sample (no check_first) is not held to it: its author wrote it within the contract
    assert run_item(target, _info(op, "bn"), "function", _sample(*bad)).cpu_error is None


def test_a_helper_is_held_to_its_public_namesakes_contract():
    """``_cholesky_solve_helper`` is ``cholesky_solve``'s kernel: its meta checks nothing, and its
    CPU kernel reads past a non-square factor (heap garbage the reference can agree with). The
    public op of the same signature, found by the name, refuses the factor; ops that are no
    helper, or whose namesake takes other arguments, have none."""
    from conformance.check.metacheck import OUT_OF_CONTRACT, contract_refusal, meta_refusal, public_namesake

    op = torch.ops.aten._cholesky_solve_helper.default
    assert public_namesake(op) is torch.ops.aten.cholesky_solve.default
    assert public_namesake(torch.ops.aten._cholesky_solve_helper.out) is torch.ops.aten.cholesky_solve.out
    assert public_namesake(torch.ops.aten.abs.default) is None
    assert public_namesake(torch.ops.aten._values.default) is None  # no helper by its name
    assert public_namesake(torch.ops.aten._fft_c2c.default) is None  # no namesake
    bad = (torch.randn(3, 2), torch.randn(3, 4), False)
    good = (torch.randn(3, 2), torch.randn(3, 3), False)
    assert meta_refusal(op, *bad) is None  # its own meta sees nothing wrong
    refused = contract_refusal(op, *bad)
    assert refused.startswith("aten::cholesky_solve.default's meta") and "square" in refused
    assert contract_refusal(op, *good) is None
    # batch dimensions the public op would broadcast before calling its helper: its meta's output
    # shape is not the helper's, and the helper's kernel would index the smaller one past its end
    broadcast = (torch.randn(1, 4, 2), torch.randn(2, 4, 4), False)
    assert meta_refusal(op, *broadcast) is None and meta_refusal(torch.ops.aten.cholesky_solve.default, *broadcast) is None
    assert "gives outputs of shapes [(2, 4, 2)] where the helper's gives [(1, 4, 2)]" in contract_refusal(op, *broadcast)

    out = run_item(get_target("cpu"), _info(op, "chol"), "function", _sample(*bad), guard=True, check_first=True)
    assert out.cpu_error.startswith(OUT_OF_CONTRACT) and "cholesky_solve" in out.cpu_error
    out = run_item(get_target("cpu"), _info(op, "chol"), "function", _sample(*good), guard=True, check_first=True)
    assert out.cpu_error is None
    # the schema search calls the overload through a wrapper that drops absent arguments: its
    # info names the overload, and the namesake is found from that
    from conformance.sweep.schema import _Info

    schema_info = _Info("aten::_cholesky_solve_helper.out")
    assert not hasattr(schema_info.op, "_schema")
    sample = _sample(*bad)
    sample.kwargs["out"] = torch.empty(0)
    out = run_item(get_target("cpu"), schema_info, "function", sample, guard=True, check_first=True)
    assert out.cpu_error.startswith(OUT_OF_CONTRACT) and "aten::cholesky_solve.out's meta" in out.cpu_error, \
        out.cpu_error


def test_an_input_outside_the_contract_never_reaches_the_cpu_kernel():
    """The meta check comes first: ``_cholesky_solve_helper``'s CPU kernel, handed a non-square
    factor, reads past its own copy of it, and repeated such calls aborted a worker (SIGABRT, a
    corrupted heap) when inputs were refused only after the CPU had run them."""
    from torch._subclasses.fake_tensor import FakeTensor

    from conformance.check.metacheck import OUT_OF_CONTRACT

    calls = []  # the kernel's real calls (the meta check calls it on fake tensors)
    op = torch.ops.aten._cholesky_solve_helper.default

    def kernel(*a, **k):
        if not isinstance(a[0], FakeTensor):
            calls.append(a)
        return op(*a, **k)

    info = _info(kernel, "chol")
    info.packet = op  # the overload the wrapper calls, as the schema search's info names it
    out = run_item(get_target("cpu"), info, "function", _sample(torch.randn(3, 2), torch.randn(3, 4), False),
                   guard=True, check_first=True)
    assert out.cpu_error.startswith(OUT_OF_CONTRACT) and not calls
