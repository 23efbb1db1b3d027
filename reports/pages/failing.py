"""``<build>/failing.html``: the overloads failing samples reach, the most reached first."""

from __future__ import annotations

from collections.abc import Iterator

from ..contexts import OverloadsPage
from ..scope import BuildScope
from ._overloads import overload_pages

TEMPLATE = "overloads.html"
CONTEXT = OverloadsPage
PER_BUILD = True
NAV = ("failing.html", "Failing")


def pages(b: BuildScope) -> Iterator[tuple[str, OverloadsPage]]:
    yield from overload_pages(b, "failing")
