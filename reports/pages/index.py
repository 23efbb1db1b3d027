"""``index.html``: every rendered build and the trend across all builds in the database."""

from __future__ import annotations

from collections.abc import Iterator

from ..contexts import IndexPage, Link
from ..scope import BACKENDS_PAGE, Site

TEMPLATE = "index.html"
CONTEXT = IndexPage
PER_BUILD = False  # once per site
NAV = None  # not in a build's navigation


def pages(site: Site) -> Iterator[tuple[str, IndexPage]]:
    counts = {i.build: {how: len(site.overloads(i, how)) for how in ("fallback", "failing")} for i in site.rendered}
    yield "index.html", IndexPage(**site.base("Conformance report: builds", "", []), builds=site.rendered,
                                  overloads=counts, trend_svg=site.trend_svg(),
                                  backends=Link(BACKENDS_PAGE, "Across backends") if site.cross_backend else None)
