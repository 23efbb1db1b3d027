"""timm and torchvision architectures as model graphs (the zoo's vision part; optional extras).

Every name ``timm.list_models()`` and ``torchvision.models.list_models()`` list is a spec (ids
``timm.<name>``, ``tv.<name>``) with the ``GraphSpec`` interface; enumeration only reads the
libraries' registries (no model is built). Weights are random and seeded (never downloaded:
``pretrained=False`` / ``weights=None``); a model over the parameter budget, one the library cannot
build or whose inputs cannot be made raises :class:`~conformance.models.zoo.ZooSkip` with the
library's own reason.

Input sizes come from the models' own declarations, shrunk where the model allows, to keep a CPU
run of one architecture around a second:

* timm: ``pretrained_cfg.input_size`` (C, H, W). A model that declares ``fixed_input_size`` (ViTs,
  Swin, ...) is built with ``img_size=H // 4`` (at least 32) and runs at that size in every shape
  variant; any other model runs at ``max(64, min_input_size)`` and its shape variants also vary the
  image size (64, 96, 80 scaled the same way). ``num_classes=10``. The first ``build()`` checks
  that size with one CPU forward; a model that cannot build or run there (a window or patch
  partition that does not tile it, a kernel larger than its feature map) runs at the next side its
  own feature stride allows, else at its declared size (:mod:`conformance.models.sizing`), and its
  params say so (``size_fallback``, ``shrunk_input_size``, the ``input_size`` used).
* torchvision: the weights' declared ``min_size``, at least 64 (classification, quantization with
  ``quantize=False``, segmentation, detection); a builder that takes the image size is built
  smaller (ViT: ``image_size`` = 4 patches; mvit and s3d keep their declared 224). Video:
  (N, 3, T, H, W) with T the weights' declared ``min_temporal_size``, at least 4 (mvit 16, s3d 14).
  Optical flow (RAFT): two images, 2 flow updates.
  ``num_classes=10`` where the builder takes it.
* Detection models run their dense part in train mode: ``(images, boxes)`` in, the backbone (+FPN),
  the dense heads (RPN, RetinaNet/FCOS/SSD heads) and, for the R-CNNs, the box/mask/keypoint RoI
  heads on the given boxes (``roi_align`` on the finest level) out; sum-of-squares loss. The
  transform, anchor matching, sampling and NMS are left out: they are data-dependent (random
  resize, ``nonzero``, NMS's output size) and do not trace under ``make_fx`` in fake mode. SSD and
  SSDlite keep their declared 300 / 320 input; the others run at 64.
Every shape variant has a batch of at least 2 (train-mode BatchNorm).

Example::

    >>> from conformance.models import vision
    >>> if vision.available("timm"):
    ...     spec = vision.spec_by_id("timm.resnet18")
    ...     spec.params["arch_family"], spec.params["input_size"]
    ... else:
    ...     ("resnet", [3, 64, 64])
    ('resnet', [3, 64, 64])
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import warnings
import zlib
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import sizing
from .family import N_SHAPE_VARIANTS, float_leaves, pick, sumsq_loss
from .tracing import Traceable
from .zoo import ZooSkip, build_within_budget

os.environ.setdefault("HF_HUB_OFFLINE", "1")

__all__ = ["NUM_CLASSES", "VisionSpec", "available", "enumerate_specs", "spec_by_id", "unavailable_reason"]

LIBS = {"timm": "timm", "tv": "torchvision"}
NUM_CLASSES = 10
MIN_SIDE = 64  # the smallest image side a run uses (unless the model declares a larger minimum)
SIZE_SCALE = (1.0, 1.5, 1.25)  # shape variants' image side relative to the canonical one (variable-size models)
SIZE_MULTIPLE = 8  # variants' sides round to this (or to the feature stride of a model that needed another side)
MIN_FRAMES = 4  # a video model's clip length unless its weights declare a longer minimum
BATCHES = (2, 3, 4)


def available(library: str) -> bool:
    """Is the library (``timm`` or ``tv``) importable?"""
    return importlib.util.find_spec(LIBS[library]) is not None and importlib.util.find_spec("torchvision") is not None


def unavailable_reason(library: str) -> str:
    return f"{LIBS[library]} is not installed; install the zoo extra: pip install timm torchvision"


def _import(library: str) -> Any:
    from . import tvshim

    tvshim.ensure()  # torchvision (and timm, which imports it) must see its operator schemas first
    import torchvision

    if library == "timm":
        import timm

        return timm
    return torchvision


def _seed(*parts: Any) -> int:
    return zlib.crc32("|".join(map(str, parts)).encode())


class Outputs(nn.Module):
    """A model that returns a tuple of its float output tensors (dicts and lists flattened in order)."""

    def __init__(self, model: nn.Module, call: str = "plain", extra: dict[str, Any] | None = None):
        super().__init__()
        self.model, self.call, self.extra = model, call, dict(extra or {})

    def forward(self, *args: Tensor) -> tuple[Tensor, ...]:
        if self.call == "detection":
            return self._dense_detection(*args)
        if self.call == "flow":
            return tuple(self.model(args[0], args[1], num_flow_updates=self.extra["updates"]))
        out = self.model(*args)
        if isinstance(out, dict):
            out = [out[k] for k in sorted(out)]
        return tuple(float_leaves(out))


    def _dense_detection(self, images: Tensor, boxes: Tensor) -> tuple[Tensor, ...]:
        """Backbone (+FPN), the dense heads and, for the R-CNNs, the RoI heads on the given boxes."""
        import importlib

        from torchvision.ops._utils import convert_boxes_to_roi_format

        # torchvision's pure-PyTorch RoIAlign without its lazy torch.compile wrapper (which make_fx
        # cannot trace through, and which would compile inside an eager run)
        roi_align = importlib.import_module("torchvision.ops.roi_align")._roi_align.__wrapped__
        m = self.model
        feats = m.backbone(images)
        feats = list(feats.values()) if isinstance(feats, dict) else [feats]
        if not hasattr(m, "rpn"):  # RetinaNet, FCOS, SSD, SSDlite: one head over every level
            out = m.head(feats)
            return tuple(out[k] for k in sorted(out))
        objectness, deltas = m.rpn.head(feats)
        outs = [*objectness, *deltas]
        rois = convert_boxes_to_roi_format(list(boxes))
        scale = feats[0].shape[-1] / images.shape[-1]
        heads = m.roi_heads
        for pool, head, predictor in (("box_roi_pool", "box_head", "box_predictor"),
                                      ("mask_roi_pool", "mask_head", "mask_predictor"),
                                      ("keypoint_roi_pool", "keypoint_head", "keypoint_predictor")):
            if getattr(heads, pool, None) is None:
                continue
            size = getattr(heads, pool).output_size
            pooled = roi_align(feats[0], rois, scale, size[0], size[1], 2, False)
            out = getattr(heads, predictor)(getattr(heads, head)(pooled))
            outs.extend(out if isinstance(out, tuple) else (out,))
        return tuple(outs)



@dataclass(frozen=True)
class VisionSpec(Traceable):
    """A timm or torchvision architecture with the ``GraphSpec`` interface."""

    model_id: str
    family: str  # "timm" | "tv"
    params: dict[str, Any] = field(hash=False)
    seed: int = 0
    supports_bf16: bool = True
    # a timm spec's first build() checks its image size and fills this ({"side": ...}; "skip" when
    # example_inputs() found none); see sizing
    fitted: dict[str, Any] = field(default_factory=dict, hash=False, compare=False, repr=False)

    @property
    def name(self) -> str:
        return self.model_id.split(".", 1)[1]

    @property
    def task(self) -> str:
        return self.params["arch_family"].split("/")[0] if self.family == "tv" else "classification"

    def _create(self, **kw: Any) -> nn.Module:
        lib = _import(self.family)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if self.family == "timm":
                return lib.create_model(self.name, pretrained=False, **kw)
            return lib.models.get_model(self.name, weights=None, **kw)

    def _make(self) -> nn.Module:
        return self._create(**self.params.get("build_kwargs", {}))

    def _fit(self) -> nn.Module:
        """The first build of a timm model: at the side :func:`sizing.fit` finds (params updated to it)."""
        p = self.params
        found = sizing.fit(self._create, self.model_id, _seed(self.model_id, self.seed, "weights"), "timm.create_model",
                           build_kwargs=dict(p.get("build_kwargs", {})), channels=p["input_size"][0],
                           shrunk=p["input_size"][1], declared=p["declared_input_size"][1],
                           fixed=not p["variable_size"])
        if found.params:
            p.update(found.params, build_kwargs=found.build_kwargs)
        self.fitted["side"] = found.side
        return found.model

    def build(self) -> nn.Module:
        stage = "timm.create_model" if self.family == "timm" else "torchvision.models.get_model"
        if self.family == "timm" and "side" not in self.fitted:
            model = self._fit()
        else:
            model = build_within_budget(self.model_id, self._make, _seed(self.model_id, self.seed, "weights"), stage)
        call = {"detection": "detection", "optical_flow": "flow"}.get(self.task, "plain")
        extra: dict[str, Any] = {}
        if call == "flow":
            extra = {"updates": 2}
        return Outputs(model, call, extra).float().train()

    def example_inputs(self, batch_shape_variant: int = 0) -> tuple:
        v = batch_shape_variant
        if self.family == "timm" and not self.fitted:
            try:  # inputs at the size the model runs at: fit it first (a skip is build()'s to raise)
                self.build()
            except ZooSkip as skip:
                self.fitted["skip"] = str(skip)  # the inputs stay at the shrunk size; no second try here
        gen = torch.Generator().manual_seed(_seed(self.model_id, self.seed, "inputs", v))
        b = pick(v, BATCHES)
        c, h, w = self.params["input_size"]
        if self.params.get("variable_size") and v:  # the canonical inputs are at the side the model was checked at
            m = self.params.get("size_multiple") or SIZE_MULTIPLE
            h = w = int(round(h * pick(v, SIZE_SCALE) / m)) * m
        if self.task == "video":
            return (torch.randn(b, c, self.params["frames"], h, w, generator=gen),)
        if self.task == "optical_flow":
            return (torch.randn(b, c, h, w, generator=gen), torch.randn(b, c, h, w, generator=gen))
        if self.task == "detection":
            k = pick(v, (2, 3, 1))  # boxes per image (the R-CNNs' RoIs)
            xy = torch.rand(b, k, 2, generator=gen) * torch.tensor([w, h]) * 0.5
            wh = (torch.rand(b, k, 2, generator=gen) * 0.4 + 0.1) * torch.tensor([w, h])
            return (torch.rand(b, c, h, w, generator=gen), torch.cat([xy, xy + wh], dim=-1))
        return (torch.randn(b, c, h, w, generator=gen),)

    def shape_variants(self) -> list[tuple]:
        return [self.example_inputs(v) for v in range(N_SHAPE_VARIANTS)]

    def loss(self, output: Any) -> Tensor:
        gen = torch.Generator().manual_seed(_seed(self.model_id, self.seed, "targets"))
        if self.task in ("classification", "quantization", "video"):
            logits = float_leaves(output)[0].float()  # (N, classes); aux heads, if any, are not in the loss
            if logits.dim() == 2:
                target = torch.randint(0, logits.shape[-1], (logits.shape[0],), generator=gen)
                return F.cross_entropy(logits, target)
        return sumsq_loss(output, self.params, gen)



# ---------------------------------------------------------------- timm


@functools.cache
def _timm_modules() -> dict[str, str]:
    """timm model name -> the module that defines it (its architecture family), from timm's public listing."""
    import timm

    return {n: mod for mod in timm.list_modules() for n in timm.list_models(module=mod)}


def _timm_params(timm: Any, name: str) -> dict[str, Any]:
    cfg = timm.models.get_pretrained_cfg(name)
    declared = list(cfg.input_size) if cfg is not None and cfg.input_size else [3, 224, 224]
    fixed = bool(cfg is not None and cfg.fixed_input_size)
    minimum = cfg.min_input_size[1] if cfg is not None and cfg.min_input_size else 0
    kw: dict[str, Any] = {"num_classes": NUM_CLASSES}
    if fixed:
        side = max(32, declared[1] // 4)
        kw["img_size"] = side
    else:
        side = max(MIN_SIDE, minimum)
    return {"library": "timm", "arch_family": _timm_modules().get(name, "unknown"),
            "input_size": [declared[0], side, side], "declared_input_size": declared, "variable_size": not fixed,
            "build_kwargs": kw}


# ---------------------------------------------------------------- torchvision

def _tv_params(tv: Any, name: str) -> dict[str, Any]:
    from torchvision.models import _api

    module = _api.BUILTIN_MODELS[name].__module__.split(".")[2:]  # ['resnet'] or ['detection', 'faster_rcnn']
    arch_family = "/".join(module if len(module) > 1 else ["classification", *module])
    task = arch_family.split("/")[0]
    try:
        meta = next(iter(_api.get_model_weights(name))).meta
    except Exception:  # noqa: BLE001 - a builder without weights declares nothing
        meta = {}
    side = max(MIN_SIDE, *(meta.get("min_size") or (0, 0)))
    kw: dict[str, Any] = {}
    if task in ("classification", "quantization", "video", "segmentation", "detection"):
        kw["num_classes"] = NUM_CLASSES
    if task in ("segmentation", "detection"):
        kw["weights_backbone"] = None
    if task == "detection" and "keypoint" in arch_family:
        kw["num_classes"] = 2  # person / background, what the keypoint head is built for
    if task == "detection" and "ssd" in arch_family:
        side = int(re.search(r"ssd(?:lite)?(\d+)", name).group(1))  # SSD300, SSDlite320: their fixed input
    if "inception" in arch_family:
        kw["aux_logits"] = False  # the train-mode aux head needs the declared 299 x 299 input
    if arch_family == "classification/vision_transformer":
        patch = int(re.search(r"_(\d+)$", name).group(1))
        side = kw["image_size"] = 4 * patch
    params: dict[str, Any] = {"library": "torchvision", "arch_family": arch_family, "input_size": [3, side, side],
                              "declared_min_size": list(meta.get("min_size") or []),
                              "variable_size": task in ("classification", "quantization", "segmentation")
                              and side == MIN_SIDE and "image_size" not in kw, "build_kwargs": kw}
    if task == "video":
        params["frames"] = max(MIN_FRAMES, meta.get("min_temporal_size") or 0)
    return params


# ---------------------------------------------------------------- enumeration


@functools.cache
def _specs(library: str) -> tuple[VisionSpec, ...]:
    if library not in LIBS:
        raise KeyError(f"unknown vision library {library!r}; known: {sorted(LIBS)}")
    if not available(library):
        raise RuntimeError(unavailable_reason(library))
    lib = _import(library)
    if library == "timm":
        return tuple(VisionSpec(f"timm.{n}", "timm", _timm_params(lib, n)) for n in lib.list_models())
    return tuple(VisionSpec(f"tv.{n}", "tv", _tv_params(lib, n)) for n in lib.models.list_models())


def enumerate_specs(library: str, limit: int | None = None) -> list[VisionSpec]:
    """Every architecture the library lists, in its own listing order (nothing is built)."""
    specs = list(_specs(library))
    return specs[:limit] if limit is not None else specs


def spec_by_id(model_id: str) -> VisionSpec:
    """The spec of ``timm.<name>`` or ``tv.<name>``; KeyError when unknown or the library is missing."""
    library = model_id.split(".", 1)[0]
    if library not in LIBS:
        raise KeyError(model_id)
    if not available(library):
        raise KeyError(f"{model_id}: {unavailable_reason(library)}")
    for spec in _specs(library):
        if spec.model_id == model_id:
            return spec
    raise KeyError(model_id)
