"""``<build>/fallbacks.html``: the overloads some sample fell back to the CPU on, the most reached first."""

from __future__ import annotations

from collections.abc import Iterator

from ..contexts import OverloadsPage
from ..scope import BuildScope
from ._overloads import overload_pages

TEMPLATE = "overloads.html"
CONTEXT = OverloadsPage
PER_BUILD = True
NAV = ("fallbacks.html", "CPU fallbacks")


def pages(b: BuildScope) -> Iterator[tuple[str, OverloadsPage]]:
    yield from overload_pages(b, "fallback")
