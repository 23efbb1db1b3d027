"""The serving page's contexts (:mod:`reports.pages.serving`), beside :mod:`reports.contexts`,
which is at the walls' 550 lines: the same rules (one documented dataclass per template, a
template sees exactly its fields).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from markupsafe import Markup

from .contexts import BuildInfo, Link, Page


@dataclass
class ServingMatrix:
    """One dtype x mode of the generation run: its models x prompt-length buckets."""

    dtype: str
    mode: str  # eager | compile
    anchor: str  # the section's id ("m-float32-eager")
    counts: list[tuple[str, int]]  # (status, items) in display order
    table: Markup  # the matrix (table spec): a row per model, a status-coloured cell per bucket


@dataclass
class ServingPage(Page):
    """``<build>/serving.html``: will this build serve my causal LM? The generation lane's items
    (greedy decoding on the target against the CPU) of the build's latest generation run, and what
    got worse since the previous build's."""

    info: BuildInfo
    run: dict[str, Any] | None  # the generation run shown (None: no run of this build holds gen_results)
    n_models: int
    buckets: list[int]  # prompt lengths (tokens), over every dtype and mode
    n_items: int
    sequences: int  # prompts decoded on both devices, over every item
    counts: list[tuple[str, int]]  # (status, items) in display order
    near_tie: int  # near-tie flips in all (counted, never hidden: they do not fail an item)
    near_tie_items: int  # items holding one
    wide: int  # wide flips in all
    matrices: list[ServingMatrix]
    items: Markup  # every item with its figures (table spec)
    baseline: Link | None  # the previous build's serving page (None: no previous build, or not rendered)
    diff_note: str  # why there is no comparison ('' when there is one)
    n_changed: int  # items of both builds that got worse
    diff: Markup  # those items (table spec)
