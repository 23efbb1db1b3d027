"""The zoo's timm and torchvision specs (skipped where timm / torchvision are not installed)."""

from __future__ import annotations

import importlib.util
import time

import pytest
import torch

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torchvision") is None or importlib.util.find_spec("timm") is None,
    reason="the zoo's vision extras (timm, torchvision) are not installed",
)


@pytest.fixture(scope="module")
def vision():
    from conformance.models import tvshim

    assert tvshim.ensure()
    pytest.importorskip("torchvision")
    pytest.importorskip("timm")
    from conformance.models import vision

    return vision


def test_tvshim_nms_matches_greedy_rule(vision):
    import torchvision

    boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0], [1.0, 1.0, 10.0, 10.0], [20.0, 20.0, 30.0, 30.0],
                          [0.0, 0.0, 9.0, 9.0]])
    scores = torch.tensor([0.9, 0.8, 0.7, 0.95])
    keep = torchvision.ops.nms(boxes, scores, 0.5)
    assert keep.dtype == torch.long and keep.tolist() == [3, 2]
    assert torchvision.ops.nms(torch.zeros(0, 4), torch.zeros(0), 0.5).numel() == 0


def test_enumeration_is_cheap_complete_and_deterministic(vision):
    import timm
    import torchvision

    t = time.perf_counter()
    specs = vision.enumerate_specs("timm")
    assert time.perf_counter() - t < 30
    assert [s.model_id for s in specs] == [f"timm.{n}" for n in timm.list_models()]
    tv = vision.enumerate_specs("tv")
    assert [s.model_id for s in tv] == [f"tv.{n}" for n in torchvision.models.list_models()]
    assert [s.model_id for s in vision.enumerate_specs("tv", limit=3)] == [s.model_id for s in tv[:3]]
    for s in specs[:50] + tv:
        assert s.family in ("timm", "tv") and s.model_id.startswith(s.family + ".")
        assert {"library", "arch_family", "input_size"} <= set(s.params)
        assert len(s.params["input_size"]) == 3


def test_spec_by_id(vision):
    spec = vision.spec_by_id("tv.resnet18")
    assert spec.params["arch_family"] == "classification/resnet"
    assert vision.spec_by_id("timm.resnet18").params["arch_family"] == "resnet"
    assert vision.spec_by_id("tv.fasterrcnn_resnet50_fpn").params["arch_family"] == "detection/faster_rcnn"
    with pytest.raises(KeyError):
        vision.spec_by_id("timm.no_such_model")
    with pytest.raises(KeyError):
        vision.spec_by_id("nolib.resnet18")


@pytest.mark.parametrize("model_id", ["timm.resnet18", "timm.vit_tiny_patch16_224", "tv.resnet18"])
def test_build_run_trace(vision, model_id):
    spec = vision.spec_by_id(model_id)
    model = spec.build()
    assert model.training
    a, b = spec.build(), spec.build()
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    variants = spec.shape_variants()
    assert len(variants) == 3 and all(v[0].shape[0] >= 2 for v in variants)
    assert torch.equal(variants[0][0], spec.example_inputs()[0])
    out = model(*variants[0])
    assert isinstance(out, tuple) and all(t.is_floating_point() for t in out)
    loss = spec.loss(out)
    loss.backward()
    assert torch.isfinite(loss) and torch.equal(loss, spec.loss(out))
    assert spec.graph_hash() == spec.graph_hash()
    assert spec.aten_histogram()


def test_detection_runs_dense_part_and_traces(vision):
    spec = vision.spec_by_id("tv.fasterrcnn_mobilenet_v3_large_320_fpn")
    model = spec.build()
    out = model(*spec.example_inputs())
    spec.loss(out).backward()
    assert "aten::convolution.default" in spec.aten_histogram()


def test_over_budget_is_a_skip_with_the_reason(vision, monkeypatch):
    from conformance.models.zoo import ZooSkip

    monkeypatch.setenv("CONFORMANCE_ZOO_MAX_PARAMS", "1000")
    with pytest.raises(ZooSkip, match="over budget"):
        vision.spec_by_id("tv.resnet18").build()


def test_build_failure_is_a_skip_with_the_library_reason(vision):
    from conformance.models.zoo import ZooSkip

    spec = vision.spec_by_id("tv.resnet18")
    broken = vision.VisionSpec(spec.model_id, "tv", {**spec.params, "build_kwargs": {"no_such_kwarg": 1}})
    with pytest.raises(ZooSkip, match="torchvision.models.get_model failed: TypeError"):
        broken.build()
