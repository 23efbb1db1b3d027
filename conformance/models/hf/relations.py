"""Sizes a Hugging Face config derives from each other, kept consistent by the zoo's shrink rules
(:func:`conformance.models.hf.rules.shrink`): equal widths stay equal, the layers kept keep every
kind of layer (and the per-layer lists, tables and layer indices follow them), heads divide
widths and group counts divide heads, sizes in patches follow the patch grid, and the sizes the
class defaults leave unset get what the config's other values need.

Example::

    >>> d = Depth.of({"layer_types": ["sliding", "sliding", "sliding", "full"]}, 4, 2)
    >>> d.kept, d.table({"03": "the full layer's"})
    ((0, 3), {'01': "the full layer's"})
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from .sizes import (
    EXPERTS,
    EXPERTS_KEYS,
    EXPERTS_PER_TOKEN,
    EXPERTS_PER_TOKEN_KEYS,
    GROUP_KEY,
    HEAD_DIM_KEYS,
    HEADS,
    HEADS_KEYS,
    HIDDEN,
    HORIZON,
    LAYERS_KEYS,
    MOE_FFN_KEYS,
    STAGE_WIDTHS_KEYS,
    WIDTH_KEYS,
    is_config,
    is_int,
    is_ints,
    layers_of,
    new_token,
    stage_width,
)


def widths_of(d: dict[str, Any]) -> dict[int, int]:
    """Old -> new of the widths and stage widths the rules shrink anywhere in a config tree (a
    width wins over a stage width of the same value)."""
    found: dict[int, int] = {}
    for k, v in d.items():
        if is_config(v):
            for old, new in widths_of(v).items():
                found[old] = HIDDEN if found.get(old) == HIDDEN else new
        elif k in STAGE_WIDTHS_KEYS and is_ints(v):
            found.update({x: stage_width(x) for x in v if x > HIDDEN and found.get(x) != HIDDEN})
    found.update({v: HIDDEN for k, v in d.items() if k in WIDTH_KEYS and is_int(v) and v > HIDDEN})
    return found


@dataclass(frozen=True)
class Depth:
    """A config's layers cut from ``old`` to ``new``: ``kept`` are the original indices of the
    layers kept, the first ones, except that a kind of layer the cut would lose (a hybrid's
    attention layer, a sliding-window model's full-attention one: their configs require one of
    each) takes the place of a repeated kind. Per-layer lists, tables and lists of layer indices
    all follow the same layers."""

    old: int
    new: int
    kept: tuple[int, ...]

    @classmethod
    def of(cls, d: dict[str, Any], old: int | None, new: int | None, keep_kinds: bool = True) -> Depth | None:
        if not old or not new or old == new:
            return None
        kept = list(range(new))
        kinds = [v for k, v in sorted(d.items(), key=lambda kv: kv[0] != "layer_types")
                 if isinstance(v, list) and len(v) == old and v and all(isinstance(x, str) for x in v)
                 and keep_kinds]
        for n, kind_list in enumerate(kinds):
            for kind in dict.fromkeys(kind_list):
                if kind in [kind_list[i] for i in kept]:
                    continue
                j = kind_list.index(kind)
                # a slot whose layer another kept layer repeats, in this list and the ones before
                free = [p for p in range(1, new) if all(
                    e[j] == e[kept[p]] or e[kept[p]] in [e[i] for q, i in enumerate(kept) if q != p]
                    for e in kinds[:n + 1])]
                if free:
                    kept[free[-1]] = j
        return cls(old, new, tuple(kept))

    def index(self, x: int) -> int | None:
        """The new index of original layer ``x`` (None: not kept)."""
        return self.kept.index(x) if x in self.kept else None

    def table(self, v: dict[Any, Any]) -> dict[Any, Any]:
        """A per-layer table (keys are layer numbers, maybe zero-padded) of the kept layers."""
        by_layer = {int(k): (k, x) for k, x in v.items()}
        out = {}
        for p, i in enumerate(self.kept):
            if i in by_layer:
                k, x = by_layer[i]
                out[type(k)(str(p).zfill(len(str(k))))] = x
        return out


def fill_unset(out: dict[str, Any], tokens: dict[Any, int]) -> None:
    """Sizes and ids the class defaults leave unset (None: a checkpoint or its processor supplies
    them) where the config's other values say what the model needs."""
    if any(is_config(v) for k, v in out.items() if k.startswith(("vision", "qformer"))):
        for key in ("image_token_index", "image_token_id"):  # the text's image placeholder
            if key in out and out[key] is None:
                out[key] = new_token(key, tokens)
    if "prediction_length" in out and out["prediction_length"] is None and "lags_sequence" in out:
        out["prediction_length"] = HORIZON  # a time-series model's horizon: the dataset's, not the config's
    if "num_key_value_heads" in out and out["num_key_value_heads"] is None and is_int(out.get("num_attention_heads")):
        out["num_key_value_heads"] = out["num_attention_heads"]  # None means one per head
    if set(out) & (EXPERTS_KEYS | EXPERTS_PER_TOKEN_KEYS) and set(out) & MOE_FFN_KEYS:  # a mixture of experts
        unset = {k for k, v in out.items() if v is None}
        for keys, tiny in ((EXPERTS_KEYS, EXPERTS), (EXPERTS_PER_TOKEN_KEYS, EXPERTS_PER_TOKEN),
                           ({"moe_intermediate_size"}, HIDDEN), ({"n_shared_experts", "num_shared_experts"}, 1)):
            for key in keys & unset:
                out[key] = tiny
    if "sliding_window" in out and out["sliding_window"] is None and any(
            "sliding" in str(x) for k, v in out.items() if k != "sliding_window" and v is not None
            for x in ([k, *v] if isinstance(v, list) else [k])):
        out["sliding_window"] = 8  # the window its sliding-attention parts need


def _grid(d: dict[str, Any], out: dict[str, Any]) -> tuple[int, int] | None:
    """The patch grid's side before and after the rules: image size over patch size (or stride),
    of the config or else of a sub-config (a vision tower's backbone)."""
    for old, new in [(d, out), *((v, out[k]) for k, v in d.items() if is_config(v))]:
        sides = []
        for c in (old, new):
            image = c.get("image_size")
            patch = c.get("patch_size", c.get("patch_stride"))
            image, patch = (x[0] if is_ints(x) else x for x in (image, patch))
            sides.append(image // patch if is_int(image) and is_int(patch) and patch > 0 else None)
        if None not in sides and sides[0] != sides[1]:
            return sides[0], sides[1]
    return None


def _keep_grids(d: dict[str, Any], out: dict[str, Any]) -> None:
    """Sizes in patches of the image stay in step with the patch grid: SAM's image_embedding_size
    (image_size // patch_size), SAM 2's backbone_feature_sizes (the grid at each stride)."""
    grid = _grid(d, out)
    if grid is None:
        return
    (old, new), factor = grid, grid[0] / grid[1]
    for key, v in d.items():
        if is_int(v) and key.endswith(("embedding_size", "grid_size")) and v == old and out[key] == v:
            out[key] = new
        elif key.endswith("feature_sizes") and isinstance(v, list) and all(is_ints(x) for x in v):
            if all((x / factor).is_integer() for row in v for x in row):
                out[key] = [[int(x / factor) for x in row] for row in v]


def _keep_parts_of_depth(d: dict[str, Any], out: dict[str, Any]) -> None:
    """Counts of some of the layers follow the layer count: parts that add up to it (Dory's
    input, recurrent and output layers) share the new count out; the layers that share another's
    cache, or come first or last (Gemma 3n's num_kv_shared_layers), scale down with it."""
    old, new = layers_of(d)
    if not old or old == new:
        return
    parts = {k: v for k, v in d.items() if re.fullmatch(r"(num|n)_\w+_layers", k) and k not in LAYERS_KEYS
             and is_int(v) and 0 < v < old}
    if len(parts) > 1 and sum(parts.values()) == old:
        shares = {k: v * new / old for k, v in parts.items()}
        counts = {k: int(x) for k, x in shares.items()}
        for k in sorted(shares, key=lambda k: counts[k] - shares[k])[:new - sum(counts.values())]:
            counts[k] += 1  # largest remainders first
        out.update(counts)
        return
    for k, v in parts.items():
        if re.search(r"(shared|first|last)", k):
            out[k] = v * new // old


def keep_relations(d: dict[str, Any], out: dict[str, Any]) -> None:
    """Sizes the config derives from each other stay consistent after the rules."""
    _keep_grids(d, out)
    _keep_parts_of_depth(d, out)
    image = next((k for k in ("image_size", "max_img_size") if is_int(d.get(k)) and d[k] > out[k] > 0), None)
    if image and is_int(d.get("visual_prompt_size")):  # a frame of pixels around the image: its share
        out["visual_prompt_size"] = max(1, d["visual_prompt_size"] * out[image] // d[image])
    for key in [k for k, v in d.items() if re.search(r"pos.*(feats|_dim)$", k) and is_int(v) and v > 0]:
        for width in WIDTH_KEYS & set(d):  # positional features per axis: half the width they embed
            if d[width] == 2 * d[key] and is_int(out[width]):
                out[key] = out[width] // 2
    window, patch = d.get("window_size"), d.get("patch_size")
    if is_int(window) and is_int(patch) and is_int(out.get("patch_size")) and patch > 0 and \
            window % patch == 0 and window // patch >= 4:
        out["window_size"] = window // patch * out["patch_size"]  # a window in pixels: the same patches
    rope = out.get("qk_rope_head_dim")
    if isinstance(d.get("head_dim"), int) and d.get("head_dim") == d.get("qk_rope_head_dim"):
        out["head_dim"] = rope  # multi-head latent attention: head_dim is the rotary part
    if isinstance(d.get("qk_head_dim"), int) and d["qk_head_dim"] == d.get("qk_nope_head_dim", 0) + (
            d.get("qk_rope_head_dim") or 0):
        out["qk_head_dim"] = out.get("qk_nope_head_dim", 0) + (rope or 0)
    if isinstance(d.get("mamba_d_head"), int) and isinstance(out.get("mamba_n_heads"), int):
        width = int(out.get("mamba_expand", 2) * out.get("hidden_size", HIDDEN))
        out["mamba_d_head"] = max(1, width // out["mamba_n_heads"])
        if is_int(d.get("mamba_d_ssm")):
            out["mamba_d_ssm"] = width  # the Mamba mixer's width: heads x head size
    for key in [k for k, v in d.items() if GROUP_KEY.search(k) and is_int(v) and v > 0]:
        for heads in HEADS_KEYS & set(d):  # groups of heads (Mamba-2's n_groups) still divide the heads
            if is_int(d[heads]) and d[heads] % d[key] == 0 and is_int(out[heads]) and out[heads] > 0:
                out[key] = math.gcd(out[key], out[heads])
    for expand in ("expand", "mamba_expand"):  # Mamba-2: heads x head size = expand x hidden size
        for heads in HEADS_KEYS & set(d):
            for dim in HEAD_DIM_KEYS & set(d):
                if all(is_int(d.get(k)) or isinstance(d.get(k), float) for k in (expand, heads, dim, "hidden_size")) \
                        and d[heads] * d[dim] == d[expand] * d["hidden_size"] and out[heads] > 0:
                    out[dim] = max(1, int(out[expand] * out["hidden_size"]) // out[heads])
    for rk in ("rope_parameters", "rope_scaling"):
        rp = out.get(rk)
        if isinstance(rp, dict) and rp and "mrope_section" not in rp and _declares_mrope(out.get("model_type")):
            rp = {**rp, "mrope_section": [16, 24, 24]}  # the modeling code's default, split below
        if isinstance(rp, dict) and is_ints(rp.get("mrope_section")):
            head = out.get("head_dim") or out.get("qk_rope_head_dim") or (
                out.get("hidden_size", HIDDEN) // max(1, out.get("num_attention_heads", HEADS) or HEADS))
            factor = rp.get("partial_rotary_factor", out.get("partial_rotary_factor", 1.0)) or 1.0
            if "qk_rope_head_dim" in out and out.get("qk_rope_head_dim"):
                head, factor = out["qk_rope_head_dim"], 1.0
            out[rk] = {**rp, "mrope_section": _split(list(rp["mrope_section"]), int(head * factor) // 2)}


def _declares_mrope(model_type: Any) -> bool:
    """Does the config class of ``model_type`` take a multimodal rotary split (``mrope_section``)?"""
    try:
        from transformers import CONFIG_MAPPING

        cls = CONFIG_MAPPING[model_type]
    except Exception:  # noqa: BLE001 - no such class here
        return False
    return "mrope_section" in (getattr(cls, "ignore_keys_at_rope_validation", None) or ())


def _split(parts: list[int], total: int) -> list[int]:
    """``parts`` scaled to sum to ``total`` (each at least 1 where possible)."""
    old = sum(parts) or 1
    new = [max(1, p * total // old) for p in parts]
    new[-1] += total - sum(new)
    return new if new[-1] >= 1 else parts
