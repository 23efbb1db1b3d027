"""Schema-driven inputs: strategies from a spread of schemas, shrinking to a minimal failing
input on a defective op, and the stored input reproducing the failure."""

from __future__ import annotations

import io
import textwrap

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from conformance.inputs.schema import DEVICE, Call, TensorSpec, call_strategy, run_schema_group
from conformance.select import Group
from conformance.sweep import SweepConfig
from conformance.targets import get_target


def _examples(op, n=40):
    seen = []

    @settings(max_examples=n, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
    @given(call_strategy(op))
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
        call_strategy(torch.ops.aten.set_.source_Storage)  # Storage: not generated


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
    saved = torch.load(io.BytesIO(row["inputs"]), weights_only=False)
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
    rows = list(run_schema_group(target, Group("aten::_amp_update_scale_.default", "any", "schema"), SweepConfig()))
    assert rows[0]["status"] == "skip" and rows[0]["error"].startswith("no valid input:")
    assert "rejected by the CPU" in rows[0]["error"]
