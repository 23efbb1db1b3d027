"""Schema-driven inputs: strategies from a spread of schemas, shrinking to a minimal failing
input on a defective op, and the stored input reproducing the failure."""

from __future__ import annotations

import ctypes
import os
import signal
import textwrap
import time

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from conformance.inputs.hints import Hints, hints_from_errors
from conformance.inputs.schema import DEVICE, Call, TensorSpec, call_strategy
from conformance.sweep.opinfo import SweepConfig
from conformance.sweep.schema import cpu_preflight, run_schema_group
from conformance.targets import get_target
from conformance.work import Group, Skip
from opdb.blobs import load_inputs


def _examples(op, n=40, hints=Hints()):
    seen = []

    @settings(max_examples=n, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
    @given(call_strategy(op, hints))
    def collect(call):
        seen.append(call)

    collect()
    return seen


@pytest.mark.parametrize("op, check", [
    # Tensor? and Scalar
    (torch.ops.aten.clamp.default, lambda c: all(a is None or isinstance(a, (TensorSpec, int, float)) for a in c.args)),
    # Tensor[]
    (torch.ops.aten.cat.default, lambda c: isinstance(c.args[0], list) and all(isinstance(t, TensorSpec) for t in c.args[0])),
    # int[] size and optional dtype/layout/device, keyword-only
    (torch.ops.aten.zeros.default, lambda c: isinstance(c.args[0], list) and c.kwargs.get("device", DEVICE) is DEVICE),
    # out= (keyword-only, written): an empty tensor the kernel resizes
    (torch.ops.aten.add.out, lambda c: c.kwargs["out"].kind == "out"),
    # keyword-only scalar
    (torch.ops.aten.add.Tensor, lambda c: isinstance(c.kwargs.get("alpha", 1), (int, float))),
])
def test_strategy_respects_the_schema(op, check):
    calls = _examples(op)
    assert calls and all(isinstance(c, Call) for c in calls)
    assert all(check(c) for c in calls), calls[:3]


def test_strategy_covers_optional_dtype_and_omitted_defaults():
    calls = _examples(torch.ops.aten.sum.dim_IntList, 60)
    assert any("dtype" in c.kwargs for c in calls) and any("dtype" not in c.kwargs for c in calls)
    # keepdim (positional, defaulted) is sometimes given, sometimes left to its default
    assert any(len(c.args) == 2 for c in calls) and any(len(c.args) == 3 for c in calls)


def test_ungenerable_argument_is_a_clear_reason():
    with pytest.raises(ValueError, match="cannot be generated"):
        call_strategy(torch.ops.aten.record_stream.default)  # Stream: not generated


def test_materialize_makes_tensors_and_empty_outs():
    c = Call(args=[TensorSpec((2, 3), torch.float32, 1)], kwargs={"out": TensorSpec((0,), torch.float32, 0, "out")})
    args, kwargs = c.materialize()
    assert args[0].shape == (2, 3) and kwargs["out"].numel() == 0


MANIFEST = """
[build]
name = "schema-defect"
inherits = "2.33.0"
[ops]
native = ["aten::_add_relu.Tensor"]
[[defects]]
op = "aten::_add_relu.Tensor"
dtypes = ["float32"]
min_numel = 3
kind = "wrong_result"
magnitude = 0.5
"""


def test_shrinks_to_a_minimal_failing_input(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text(textwrap.dedent(MANIFEST))
    target = get_target("neuron-emu", str(path))
    rows = list(run_schema_group(target, Group("aten::_add_relu.Tensor", "any", "schema"), SweepConfig()))
    assert len(rows) == 1
    row = rows[0]
    assert row["status"] == "mismatch" and row["dtype"] == "float32"
    assert "minimal failing input" in row["error"]
    saved = load_inputs(row["inputs"])
    tensors = [a for a in saved["args"] if isinstance(a, torch.Tensor)]
    # the defect fires from 3 elements on: the shrunk input is exactly at that edge
    assert max(t.numel() for t in tensors) == 3
    assert "aten::_add_relu.Tensor" in row["native_ops"]


def test_clean_build_passes_and_records_reach():
    target = get_target("neuron-emu", "2.33.0")
    rows = list(run_schema_group(target, Group("aten::_add_relu.Tensor", "any", "schema"), SweepConfig()))
    assert rows[0]["status"] in ("pass", "pass_fallback")
    assert "aten::_add_relu.Tensor" in rows[0]["reached_ops"]


def test_no_valid_input_says_what_was_tried():
    target = get_target("cpu")
    rows = list(run_schema_group(target, Group("aten::values_copy.default", "any", "schema"), SweepConfig()))
    assert rows[0]["status"] == "skip" and rows[0]["error"].startswith("no valid input:")
    assert "rejected by the CPU" in rows[0]["error"] and "expected sparse tensor layout" in rows[0]["error"]


def test_amp_update_scale_found_by_argument_hints():
    """Unsteered, every call is rejected ("growth_tracker must be a 1-element tensor", "... an int
    tensor"); the argument-level hints those messages give make valid calls."""
    target = get_target("cpu")
    rows = list(run_schema_group(target, Group("aten::_amp_update_scale_.default", "any", "schema"), SweepConfig()))
    assert rows[0]["status"] == "pass", rows[0]["error"]


@pytest.mark.parametrize("messages, field, expected", [
    (["CPU reference failed: RuntimeError: adaptive_max_pool2d(): Expected 3D or 4D tensor, but got: []"],
     "ranks", (3, 4)),
    (["RuntimeError: It is expected input_size equals to 5, but got size 0"], "ranks", (5,)),
    (["RuntimeError: expected 3-D `query`, got 0-D tensor"], "ranks", (3,)),  # what it got is ignored
    (["RuntimeError: weight should have at least three dimensions"], "ranks", (3, 4)),
    (["IndexError: Dimension specified as 0 but tensor has no dimensions"], "ranks", (2, 3, 4)),
    (["RuntimeError: Found dtype Long but expected Float"], "dtypes", (torch.float32,)),
    (["RuntimeError: view_as_real is only supported for complex tensors"], "dtypes", (torch.complex64,)),
    (["NotImplementedError: \"bincount_cpu\" not implemented for 'Float'"], "avoid", (torch.float32,)),
    (["RuntimeError: Expected tensor for argument #2 'targets' to have scalar type Int; but got torch.FloatTensor"],
     "arg_dtypes", (("targets", torch.int32),)),
    (["RuntimeError: growth_tracker must be a 1-element tensor."], "arg_shapes", (("growth_tracker", (1,)),)),
    (["RuntimeError: something unrelated went wrong"], "ranks", ()),
    (["CPU reference failed: outside the op's contract: its meta kernel refuses an input the CPU kernel accepts "
      "(RuntimeError: reduce argument must be either add or multiply.)"], "arg_choices", (("reduce", ("add", "multiply")),)),
    (["RuntimeError: max_pool3d: dilation must be either a single int, or a tuple of three ints"], "arg_choices", ()),
])
def test_hints_read_what_the_reference_asked_for(messages, field, expected):
    assert getattr(hints_from_errors(messages), field) == expected


def test_hints_steer_the_strategy():
    hints = Hints(ranks=(5,), arg_dtypes=(("self", torch.int32),))
    calls = _examples(torch.ops.aten.abs.default, 30, hints)
    ranks = {len(c.args[0].shape) for c in calls}
    assert all(c.args[0].dtype == torch.int32 for c in calls)
    # the common shape is 5-D; an argument may take it, a suffix, one dim of it, a scalar, or one more dim
    assert 5 in ranks and ranks <= {0, 1, 4, 5, 6}


def test_fixed_size_lists_and_shared_list_lengths():
    # bool[3] output_mask is exactly 3 long
    for c in _examples(torch.ops.aten.native_layer_norm_backward.default, 30):
        mask = c.args[-1]
        assert isinstance(mask, list) and len(mask) == 3
    # every Tensor[] of a fused optimizer call has one length (the kernel checks they match)
    for c in _examples(torch.ops.aten._fused_adam.default, 30):
        lists = [a for a in c.args if isinstance(a, list) and a and isinstance(a[0], TensorSpec)]
        assert len(lists) >= 4 and len({len(x) for x in lists}) == 1


def test_steered_search_finds_inputs_an_unsteered_one_misses():
    """upsample_nearest3d wants a 5-D input: the first search (ranks 0..4) cannot find one; the
    CPU's own error ("expected input_size equals to 5") steers the next search to rank 5."""
    target = get_target("cpu")
    rows = list(run_schema_group(target, Group("aten::upsample_nearest3d.out", "any", "schema"), SweepConfig()))
    assert rows[0]["status"] == "pass", rows[0]["error"]
    assert "aten::upsample_nearest3d.out" in rows[0]["reached_ops"]


def test_string_values_the_cpu_names_steer_the_search():
    """scatter_.reduce takes reduce='add' or 'multiply', none of the usual reduction names: its
    CPU (meta) error says which, and the steered search draws them."""
    rows = list(run_schema_group(get_target("cpu"), Group("aten::scatter_.reduce", "any", "schema"), SweepConfig()))
    assert rows[0]["status"] == "pass", rows[0]["error"]
    assert "aten::scatter_.reduce" in rows[0]["reached_ops"]


def test_an_uninitialised_token_is_compared_by_its_metadata():
    """_make_dep_token returns torch.empty(()): its value is whatever the allocator held, so the
    CPU's self-check rejected every call ('not reproducible'); its shape, dtype and strides are
    what it defines, as for the empty factories."""
    from conformance.check.comparators import comparator_for

    assert comparator_for("aten::_make_dep_token.default") == "meta"
    row = next(run_schema_group(get_target("cpu"), Group("aten::_make_dep_token.default", "any", "schema"),
                                SweepConfig()))
    assert row["status"] == "pass" and row["reached_ops"] == ["aten::_make_dep_token.default"], row["error"]


def _crashes_on_big_inputs(x):
    if x.numel() > 2:
        os.kill(os.getpid(), signal.SIGSEGV)
    return x


def test_cpu_preflight_turns_a_crash_into_a_rejection():
    from torch.testing._internal.opinfo.core import SampleInput

    info = type("I", (), {"op": staticmethod(_crashes_on_big_inputs)})
    assert cpu_preflight(info, SampleInput(torch.ones(2))) is None
    assert cpu_preflight(info, SampleInput(torch.ones(5))) == "CPU reference crashed (signal SIGSEGV)"


def _reads_past(x):
    return torch.tensor(list((ctypes.c_float * (x.numel() + 4)).from_address(x.data_ptr())))


def test_cpu_preflight_rejects_what_the_cpu_refuses_or_reads_past():
    """The target never runs alone on an input the CPU refuses (its error, worded as the sweep
    words it, steers the search as before) or whose CPU result depends on what lies past it."""
    from torch.testing._internal.opinfo.core import SampleInput

    info = type("I", (), {"op": staticmethod(torch.abs)})
    assert cpu_preflight(info, SampleInput(torch.ones(4))) is None
    assert cpu_preflight(info, SampleInput(torch.ones(2, dtype=torch.bool))).startswith(
        'CPU reference failed: NotImplementedError: "abs_cpu" not implemented for \'Bool\'')
    info = type("I", (), {"op": staticmethod(_reads_past)})
    assert cpu_preflight(info, SampleInput(torch.ones(4))) == \
        "CPU reference read past its inputs (its result is not reproducible)"


def _hangs_on_big_inputs(x):
    if x.numel() > 2:
        time.sleep(60)
    return x


def test_a_hanging_cpu_preflight_waits_long_only_until_a_child_ended(monkeypatch):
    """A CPU reference that hangs rejects its input; once a child of this process has ended by
    itself, later ones get 50 times the slowest (at least CPU_PREFLIGHT_MIN_S), not 30 s each."""
    from torch.testing._internal.opinfo.core import SampleInput

    from conformance.sweep.schema import preflight

    monkeypatch.setattr(preflight, "_ENDED", [])
    monkeypatch.setattr(preflight, "PREFLIGHT_TIMEOUT_S", 20.0)
    monkeypatch.setattr(preflight, "CPU_PREFLIGHT_MIN_S", 1.0)
    assert preflight._cpu_limit() == 20.0  # nothing ended yet: the full limit
    info = type("I", (), {"op": staticmethod(_hangs_on_big_inputs)})
    assert cpu_preflight(info, SampleInput(torch.ones(2))) is None
    assert 0 < preflight._ENDED[0] < 0.3
    limit = preflight._cpu_limit()
    assert limit == max(1.0, 50 * preflight._ENDED[0]) < 20.0
    start = time.monotonic()
    assert cpu_preflight(info, SampleInput(torch.ones(5))) == f"CPU reference hung (over {limit:g} s)"
    assert time.monotonic() - start < 19.0


def test_crash_safe_search_survives_a_crashing_reference(monkeypatch):
    """After a crash the supervisor re-sends the group with a crash-safe skip: each input's CPU
    run is pre-flighted in a forked child, crashing inputs are rejected, the search goes on."""
    import conformance.sweep.schema as search

    real = search._Info

    class Crashy(real):
        def __init__(self, name):
            super().__init__(name)
            inner = self.op
            self.op = lambda *a, **k: _crashes_on_big_inputs(a[0]) if a and isinstance(a[0], torch.Tensor) \
                and a[0].numel() > 2 else inner(*a, **k)

    monkeypatch.setattr(search, "_Info", Crashy)
    target = get_target("cpu")
    rows = list(run_schema_group(target, Group("aten::abs.default", "any", "schema"), SweepConfig(),
                                 skip=Skip(crash_safe=True)))
    assert rows[0]["status"] == "pass"


def test_aten_globs_select_schema_driven_overloads():
    from conformance.run.kinds import select_groups
    from conformance.select import SelectionError

    groups = select_groups(["aten::_amp_update_scale*"])
    assert groups and all(g.kind == "schema" for g in groups)
    assert {g.op for g in groups} >= {"aten::_amp_update_scale_.default"}
    mixed = select_groups(["abs", "aten::_amp_update_scale_.default"], ["float32"])
    assert {g.kind for g in mixed} == {"opinfo", "schema"}
    with pytest.raises(SelectionError, match="aten::nope"):
        select_groups(["aten::nope*"])


class _CrashingTarget:
    """The CPU target, except that the device kernel crashes on inputs of more than 2 elements."""

    def __init__(self):
        self.inner = get_target("cpu")
        self.name, self.device = "crashy", "cpu"

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def wrap(self, fn):
        def run(x, *a, **k):
            if isinstance(x, torch.Tensor) and x.numel() > 2:
                os.kill(os.getpid(), signal.SIGSEGV)
            return fn(x, *a, **k)

        return run


def test_target_preflight_owns_only_the_targets_crash():
    from torch.testing._internal.opinfo.core import SampleInput

    from conformance.sweep.schema import _Info, target_preflight

    info, target = _Info("aten::abs.default"), _CrashingTarget()
    assert target_preflight(target, info, SampleInput(torch.ones(2))) is None
    assert target_preflight(target, info, SampleInput(torch.ones(3))) == "crashed (signal SIGSEGV)"


def test_crash_safe_search_records_a_target_crash_with_its_minimal_input():
    """In crash-safe mode each input the CPU accepts also runs on the target alone in a forked
    child: a crash there is the target's, recorded as `crash` with the shrunk input, and the
    worker lives. An input the CPU refuses (abs of bool) never reaches the target alone: a
    target that crashes on an input outside the op's contract is no finding."""
    rows = list(run_schema_group(_CrashingTarget(), Group("aten::abs.default", "any", "schema"), SweepConfig(),
                                 skip=Skip(crash_safe=True)))
    row = rows[0]
    assert row["status"] == "crash" and "alone in a forked process" in row["error"]
    saved = load_inputs(row["inputs"])
    x = saved["args"][0]
    assert x.dtype != torch.bool and x.numel() > 2
    # shrunk to the edge of the crash: any dimension one shorter has at most 2 elements
    assert all(x.numel() // n * (n - 1) <= 2 for n in x.shape)


def test_file_arguments_stay_out_of_the_working_directory():
    import tempfile

    for c in _examples(torch.ops.aten.from_file.default, 20):
        assert os.path.dirname(c.args[0]) == tempfile.gettempdir()


def test_cpu_preflight_refuses_what_the_ops_contract_refuses_before_running_it():
    """A crash-safe search pre-flights each input and then runs the target on it alone: an input
    the op's meta kernel (or a helper's public namesake's) refuses must stop before either, as in
    the sweep (``_cholesky_solve_helper`` on a non-square factor crashed the target, an A/A's
    false crash)."""
    from torch.testing._internal.opinfo.core import SampleInput

    from conformance.check.metacheck import OUT_OF_CONTRACT
    from conformance.sweep.schema import OverloadInfo

    info = OverloadInfo("aten::_cholesky_solve_helper.default")
    why = cpu_preflight(info, SampleInput(torch.randn(2, 1, 1, 2), args=(torch.randn(2, 2, 1, 1, 2), True)))
    assert why.startswith(f"CPU reference failed: {OUT_OF_CONTRACT}") and "square" in why
    assert cpu_preflight(info, SampleInput(torch.randn(3, 2), args=(torch.randn(3, 3), False))) is None
