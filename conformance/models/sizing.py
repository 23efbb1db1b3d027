"""The image side a timm architecture runs at: its shrunk side, else the next side it declares it can take.

The zoo runs a timm model at a shrunk side (a quarter of a fixed-size model's declared side, 64 px
for the others: :mod:`conformance.models.vision`). Some models cannot run there: a window, grid or
patch partition must tile the feature map (coatnet, maxvit, xcit, twins, nest, hiera), a kernel
outgrows a small map (inception), an attention bias is sized for the declared input
(efficientformer, crossvit). Rather than a list of names, :func:`fit` tries the sides the model
itself allows, cheapest first, and keeps the first at which it builds and runs one CPU forward
(train mode, batch 2, what the protocol's first step runs; no gradient, buffers restored):

1. the shrunk side: a model that runs there keeps exactly the graph it had;
2. the shrunk side rounded up to a multiple of the model's feature stride (the largest
   ``reduction`` its ``feature_info`` declares: 32 for most CNNs and hierarchical transformers,
   the patch size for a plain ViT), then doubled while under the declared side;
3. the declared side (``pretrained_cfg.input_size``) at the model's own default ``img_size``.

A fixed-size model (one built with ``img_size``) is rebuilt at each side; any other is built once
and only its input grows. A model over the parameter budget stops at once (its skip says so); one
that runs at no side is a :class:`~conformance.models.zoo.ZooSkip` with the library's message at
the declared side and the sides tried. The side used and why are returned for the spec's params,
so the report shows them.

Example::

    >>> sides(56, 224, 32)
    [56, 64, 128, 224]
    >>> sides(64, 299, 32)
    [64, 128, 256, 299]
    >>> sides(40, 160, 16)
    [40, 48, 96, 160]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .zoo import OverBudget, ZooSkip, build_within_budget

__all__ = ["DEFAULT_STRIDE", "Fit", "feature_stride", "fit", "probe", "sides"]

DEFAULT_STRIDE = 32  # a model that declares no feature_info: the usual total stride of an image backbone
PROBE_BATCH = 2  # the protocol's smallest batch (train-mode BatchNorm needs two)


@dataclass
class Fit:
    """A model built and run once at ``side``; ``params`` says so when it is not the shrunk side."""

    model: nn.Module
    side: int
    build_kwargs: dict[str, Any]
    params: dict[str, Any] = field(default_factory=dict)  # merged into the spec's params (empty: shrunk side ran)


def sides(shrunk: int, declared: int, stride: int) -> list[int]:
    """The sides to try, in order: ``shrunk``, its round-up to ``stride`` doubled under ``declared``, ``declared``."""
    out = [shrunk]
    side = -(-shrunk // stride) * stride
    while side < declared:
        out.append(side)
        side *= 2
    out.append(declared)
    return list(dict.fromkeys(out))


def feature_stride(model: nn.Module) -> int | None:
    """The largest ``reduction`` of a timm model's ``feature_info`` (its total stride), None if it declares none."""
    info = getattr(model, "feature_info", None)
    found = [f.get("reduction") for f in info if isinstance(f, dict)] if isinstance(info, list) else []
    found = [r for r in found if isinstance(r, int) and r > 0]
    return max(found) if found else None


def probe(model: nn.Module, channels: int, side: int) -> None:
    """One train-mode forward of a batch of ``PROBE_BATCH`` at ``side``; the model's state is left as it was."""
    saved = [b.detach().clone() for b in model.buffers()]
    training = model.training
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            model.train()
            model(torch.randn(PROBE_BATCH, channels, side, side))
    finally:
        model.train(training)
        with torch.no_grad():
            for b, s in zip(model.buffers(), saved, strict=True):
                b.copy_(s)


def _why(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, ZooSkip) else f"CPU reference failed: {type(exc).__name__}: {exc}"


def fit(create: Callable[..., nn.Module], model_id: str, seed: int, stage: str, *, build_kwargs: dict[str, Any],
        channels: int, shrunk: int, declared: int, fixed: bool) -> Fit:
    """Build (seeded, within the budget) and run the model at the first side of :func:`sides` that works.

    ``create(**kwargs)`` is the library's constructor; ``fixed``: the model takes ``img_size``
    (``build_kwargs`` holds it at the shrunk side). Raises :class:`ZooSkip` (over budget, or no side ran).
    """
    failed: list[tuple[int, str]] = []
    model: nn.Module | None = None
    built: dict[str, Any] | None = None
    stride: int | None = None
    queue = [shrunk]
    while queue:
        side = queue.pop(0)
        kw = dict(build_kwargs)
        if fixed:
            kw.pop("img_size", None)
            if side != declared:
                kw["img_size"] = side
        try:
            if model is None or kw != built:
                model, built = None, None
                model = build_within_budget(model_id, lambda kw=kw: create(**kw), seed, stage)
                built = kw
            probe(model, channels, side)
        except OverBudget:
            raise
        except Exception as exc:  # noqa: BLE001 - the library's own reason, kept for the skip
            failed.append((side, _why(exc)[:600]))
        else:
            return Fit(model, side, kw, _record(failed, side, declared, stride, shrunk, channels))
        if stride is None:  # first failure: the next sides come from the model's own feature stride
            stride = _stride(create, build_kwargs, fixed, model)
            queue = sides(shrunk, declared, stride)[1:]
    last_side, last = failed[-1]
    also = f"; also failed at {', '.join(str(s) for s, _ in failed[:-1])} px" if len(failed) > 1 else ""
    where = "its declared side" if last_side == declared else "the side it runs at"
    raise ZooSkip(f"{last} (at {last_side} px, {where}{also})"[:2000])


def _stride(create: Callable[..., nn.Module], build_kwargs: dict[str, Any], fixed: bool,
            model: nn.Module | None) -> int:
    """The model's feature stride: from the model built at the shrunk side, else built on the meta device at its
    declared defaults (nothing allocated), else :data:`DEFAULT_STRIDE`."""
    if model is None:
        kw = {k: v for k, v in build_kwargs.items() if not (fixed and k == "img_size")}
        try:
            with torch.device("meta"):
                model = create(**kw)
        except Exception:  # noqa: BLE001 - a model the meta device cannot build declares nothing here
            model = None
    return (feature_stride(model) if model is not None else None) or DEFAULT_STRIDE


def _record(failed: list[tuple[int, str]], side: int, declared: int, stride: int | None, shrunk: int,
            channels: int) -> dict[str, Any]:
    """The params that say the model ran at another side than the shrunk one (none when it did not)."""
    if not failed:
        return {}
    how = "its declared side" if side == declared else f"a multiple of its feature stride {stride}"
    also = f" (also failed at {', '.join(str(s) for s, _ in failed[1:])} px)" if len(failed) > 1 else ""
    return {"input_size": [channels, side, side], "shrunk_input_size": [channels, shrunk, shrunk],
            "size_multiple": stride,
            "size_fallback": f"{shrunk} px: {failed[0][1][:300]}; ran at {side} px, {how}{also}"}
