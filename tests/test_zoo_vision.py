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


# ---------------------------------------------------------------- image sizes the models declare


class _Tiled(torch.nn.Module):
    """A fixed-size toy: it runs only at its ``img_size``, which its 16-px patches must tile, and (like an
    attention bias sized for the declared input) only at ``runs_at`` when that is given."""

    def __init__(self, img_size=96, num_classes=10, runs_at=None):
        super().__init__()
        if img_size % 16:
            raise ValueError("`patch_size` should divide image dimensions evenly")
        self.img_size, self.runs_at = img_size, runs_at
        self.feature_info = [{"reduction": 8}, {"reduction": 16}]
        self.proj = torch.nn.Conv2d(3, num_classes, 16, 16)
        self.norm = torch.nn.BatchNorm2d(num_classes)

    def forward(self, x):
        if x.shape[-1] != self.img_size or self.runs_at not in (None, x.shape[-1]):
            raise RuntimeError(f"input {x.shape[-1]}")
        return self.norm(self.proj(x)).mean((2, 3))


def _fit(create, shrunk=24, declared=96, fixed=True):
    from conformance.models import sizing

    return sizing.fit(create, "toy.tiled", 0, "toy.create", build_kwargs={"num_classes": 10, "img_size": shrunk},
                      channels=3, shrunk=shrunk, declared=declared, fixed=fixed)


def test_sizing_snaps_to_the_feature_stride_and_leaves_the_model_unrun(vision):
    found = _fit(_Tiled)
    assert found.side == 32 and found.build_kwargs == {"num_classes": 10, "img_size": 32}
    assert found.params["input_size"] == [3, 32, 32] and found.params["shrunk_input_size"] == [3, 24, 24]
    assert found.params["size_fallback"].startswith("24 px: toy.create failed: ValueError: `patch_size` should")
    assert "multiple of its feature stride 16" in found.params["size_fallback"]
    assert int(found.model.norm.num_batches_tracked) == 0  # the probe's train-mode forward left no trace
    assert not _fit(_Tiled, shrunk=48).params  # a model that runs at its shrunk side: nothing to record


def test_sizing_falls_back_to_the_declared_side_and_skips_with_the_library_reason(vision):
    from conformance.models.zoo import OverBudget, ZooSkip

    found = _fit(lambda **kw: _Tiled(**kw, runs_at=96))
    assert found.side == 96 and "img_size" not in found.build_kwargs  # the model's own default size
    assert "its declared side (also failed at 32, 64 px)" in found.params["size_fallback"]
    with pytest.raises(ZooSkip, match=r"^CPU reference failed: RuntimeError: input 96 \(at 96 px, its declared "
                                      r"side; also failed at 24, 32, 64 px\)"):
        _fit(lambda **kw: _Tiled(**kw, runs_at=80))
    calls = []

    def too_big(**kw):
        calls.append(kw)
        return torch.nn.Linear(20_000, 10_000)

    with pytest.raises(OverBudget):
        _fit(too_big)
    assert len(calls) == 1  # over the budget: no other side is tried


@pytest.mark.parametrize(("model_id", "shrunk", "side"), [
    ("timm.test_vit", 40, 48),  # a quarter of 160 px is no multiple of its 16-px patches
    ("timm.test_coatnet", 40, 64),  # maxvit/coatnet windows tile the 32-stride map only at a multiple of 32
])
def test_fixed_size_timm_models_run_at_a_side_their_stride_allows(vision, model_id, shrunk, side):
    spec = vision.VisionSpec(model_id, "timm", dict(vision.spec_by_id(model_id).params))
    assert spec.params["input_size"] == [3, shrunk, shrunk]
    variants = spec.shape_variants()  # fits first: inputs at the side the model runs at
    assert [v[0].shape[-1] for v in variants] == [side] * 3
    assert spec.params["input_size"] == [3, side, side] and spec.params["build_kwargs"]["img_size"] == side
    assert spec.params["shrunk_input_size"] == [3, shrunk, shrunk] and spec.params["size_fallback"]
    model = spec.build()
    spec.loss(model(*variants[0])).backward()


def test_a_timm_model_that_runs_shrunk_keeps_its_size(vision):
    spec = vision.VisionSpec("timm.resnet18", "timm", dict(vision.spec_by_id("timm.resnet18").params))
    spec.build()
    assert spec.fitted == {"side": 64} and "size_fallback" not in spec.params
    assert [v[0].shape[-1] for v in spec.shape_variants()] == [64, 96, 80]


def test_video_clip_length_is_the_weights_declared_minimum(vision):
    assert vision.spec_by_id("tv.s3d").params["frames"] == 14  # S3D_Weights: min_temporal_size 14
    assert vision.spec_by_id("tv.mvit_v2_s").params["frames"] == 16
    assert vision.spec_by_id("tv.r3d_18").params["frames"] == 4
