"""One module per model family; each exposes ``FAMILY`` (a ``conformance.models.family.Family``)."""

from __future__ import annotations

from ..family import Family
from . import mlp

ALL_FAMILIES: list[Family] = [
    mlp.FAMILY,
]
