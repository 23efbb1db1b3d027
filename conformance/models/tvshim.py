"""Make ``torchvision`` importable (and its detection models runnable) when its C++ library cannot load.

Why this exists: the registry's ``torchvision`` wheel that matches our torch is a CUDA build; its
``_C.so`` links the CUDA torch libraries and does not load with the CPU torch. torchvision then
registers fake kernels for operators nobody defined, and ``import torchvision`` raises
``operator torchvision::nms does not exist``. ``timm`` and ``transformers`` import torchvision, so
they break the same way (see ``shared/notes/torchvision-on-cpu-torch.md``).

:func:`ensure` (idempotent; call it before anything imports torchvision, timm or transformers):

1. tries to load torchvision's own ``_C`` library; when it loads, nothing else is done;
2. otherwise defines the ``torchvision::`` operator schemas (the C++ library's own signatures,
   :data:`SCHEMAS`) so that torchvision's fake-kernel registrations find them;
3. gives ``torchvision::nms`` a CPU kernel written in PyTorch (greedy NMS, the C++ CPU kernel's
   rule: boxes by descending score, a box is dropped when its IoU with a kept one is
   ``> iou_threshold``) and lets ``torchvision.ops.nms`` call it (``torchvision.ops.boxes``'s
   "has ops" assertion becomes a no-op).

Everything else stays torchvision's: ``torchvision.extension._has_ops()`` stays False, so
``roi_align`` (Faster/Mask/Keypoint R-CNN's pooler) takes torchvision's own pure-PyTorch path,
which traces to plain ATen ops; ``roi_pool``, ``ps_roi_*``, ``deform_conv2d`` (no model of
``torchvision.models`` uses them) keep raising torchvision's "Couldn't load custom C++ ops".

Example::

    >>> from conformance.models import tvshim
    >>> if tvshim.ensure():
    ...     import torch, torchvision
    ...     boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 10., 10.], [20., 20., 30., 30.]])
    ...     torchvision.ops.nms(boxes, torch.tensor([0.9, 0.8, 0.7]), 0.5).tolist()
    ... else:
    ...     [0, 2]
    [0, 2]
"""

from __future__ import annotations

import glob
import importlib.util
import os

import torch
from torch import Tensor

__all__ = ["SCHEMAS", "ensure", "nms_cpu", "state"]

# torchvision's operator schemas (torchvision/csrc/ops/*.cpp, the strings in its _C.so)
SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "int sampling_ratio, bool aligned) -> Tensor",
    "_roi_align_backward(Tensor grad, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "SymInt batch_size, SymInt channels, SymInt height, SymInt width, int sampling_ratio, bool aligned) -> Tensor",
    "ps_roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "int sampling_ratio) -> (Tensor, Tensor)",
    "_ps_roi_align_backward(Tensor grad, Tensor rois, Tensor channel_mapping, float spatial_scale, "
    "SymInt pooled_height, SymInt pooled_width, int sampling_ratio, SymInt batch_size, SymInt channels, "
    "SymInt height, SymInt width) -> Tensor",
    "roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width) "
    "-> (Tensor, Tensor)",
    "_roi_pool_backward(Tensor grad, Tensor rois, Tensor argmax, float spatial_scale, SymInt pooled_height, "
    "SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, SymInt width) -> Tensor",
    "ps_roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width) "
    "-> (Tensor, Tensor)",
    "_ps_roi_pool_backward(Tensor grad, Tensor rois, Tensor channel_mapping, float spatial_scale, "
    "SymInt pooled_height, SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, "
    "SymInt width) -> Tensor",
    "qroi_align(Tensor input, Tensor rois, float input_scale, int input_zero_point, float rois_scale, "
    "int rois_zero_point, float spatial_scale, SymInt pooled_height, SymInt pooled_width, int sampling_ratio, "
    "bool aligned) -> Tensor",
    "deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, SymInt stride_h, "
    "SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, SymInt dilation_w, SymInt groups, "
    "SymInt offset_groups, bool use_mask) -> Tensor",
    "_deform_conv2d_backward(Tensor grad, Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, "
    "SymInt stride_h, SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, SymInt dilation_w, "
    "SymInt groups, SymInt offset_groups, bool use_mask) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
    "box_iou_rotated(Tensor boxes1, Tensor boxes2) -> Tensor",
)

_STATE: dict[str, object] = {}  # "mode": "absent" | "native" | "shim"; "libs": the Library objects kept alive


def nms_cpu(dets: Tensor, scores: Tensor, iou_threshold: float) -> Tensor:
    """Greedy non-maximum suppression (torchvision's CPU rule); int64 indices by descending score."""
    if dets.numel() == 0:
        return torch.empty(0, dtype=torch.long, device=dets.device)
    order = torch.sort(scores, descending=True, stable=True).indices
    boxes = dets[order]
    x1, y1, x2, y2 = boxes.unbind(1)
    area = (x2 - x1) * (y2 - y1)
    w = (torch.minimum(x2[:, None], x2[None]) - torch.maximum(x1[:, None], x1[None])).clamp(min=0)
    h = (torch.minimum(y2[:, None], y2[None]) - torch.maximum(y1[:, None], y1[None])).clamp(min=0)
    inter = w * h
    over = inter / (area[:, None] + area[None] - inter) > iou_threshold
    removed = torch.zeros(len(order), dtype=torch.bool)
    keep = []
    for i in range(len(order)):
        if removed[i]:
            continue
        keep.append(i)
        removed |= over[i]
    return order[torch.tensor(keep, dtype=torch.long)]


def _native_loads() -> bool:
    """Does torchvision's own ``_C`` library load with this torch?"""
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        return False
    for path in glob.glob(os.path.join(os.path.dirname(spec.origin), "_C*.so")):
        try:
            torch.ops.load_library(path)
            return True
        except (OSError, RuntimeError):
            return False
    return False


def ensure() -> bool:
    """Make ``import torchvision`` work; True when torchvision is importable (idempotent)."""
    if "mode" in _STATE:
        return _STATE["mode"] != "absent"
    if importlib.util.find_spec("torchvision") is None:
        _STATE["mode"] = "absent"
        return False
    if _native_loads() or hasattr(torch.ops.torchvision, "nms"):
        _STATE["mode"] = "native"
        return True
    lib = torch.library.Library("torchvision", "DEF")  # noqa: TOR901 - kept alive in _STATE
    for schema in SCHEMAS:
        lib.define(schema)
    impl = torch.library.Library("torchvision", "IMPL", "CPU")  # noqa: TOR901
    impl.impl("nms", nms_cpu)
    _STATE.update(mode="shim", libs=(lib, impl))
    import torchvision.ops.boxes as boxes

    boxes._assert_has_ops = lambda: None  # nms only: our CPU kernel is registered
    return True


def state() -> str:
    """``absent`` (no torchvision), ``native`` (its library loaded) or ``shim`` (this module's schemas)."""
    return str(_STATE.get("mode", "not ensured"))
