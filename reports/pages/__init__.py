"""The report's pages, as a list the renderer iterates: one module per page.

A page module holds its query (through :mod:`opdb.queries_report` only), builds its context (a
dataclass of :mod:`reports.contexts`) and names its template::

    TEMPLATE = "foo.html"          # in reports/templates/, extends base.html
    CONTEXT = FooPage              # the dataclass the template receives, field by field
    PER_BUILD = True               # once per build (gets a BuildScope), or once per site (gets the Site)
    NAV = ("foo.html", "Foo")      # its entry in each build's navigation, or None

    def pages(scope) -> Iterator[tuple[str, FooPage]]:
        yield f"{scope.info.slug}/foo.html", FooPage(**scope.base("Foo", "../", "foo.html"), ...)

Adding a page is one module here, one template, one dataclass in ``contexts.py`` and one entry
in :data:`PAGES`. Pages of a build render in list order and share one
:class:`reports.scope.BuildScope`: the diff links only to op pages already written, so it comes
after ``op``.

Example::

    >>> from reports.pages import PAGES
    >>> [p.TEMPLATE for p in PAGES]
    ['index.html', 'backends.html', 'summary.html', 'matrix.html', 'overloads.html', 'overloads.html', 'regressions.html', 'causes.html', 'claims.html', 'op.html', 'models.html', 'family.html', 'support.html', 'perf.html', 'dist.html', 'serving.html', 'diff.html']
"""

from __future__ import annotations

from types import ModuleType

from . import (
    backends,
    causes,
    claims,
    diff,
    dist,
    failing,
    fallbacks,
    family,
    index,
    matrix,
    models,
    op,
    perf,
    regressions,
    serving,
    summary,
    support,
)

PAGES: tuple[ModuleType, ...] = (index, backends, summary, matrix, fallbacks, failing, regressions, causes, claims, op,
                                 models, family, support, perf, dist, serving, diff)


def name(page: ModuleType) -> str:
    """The page's short name (its module's): timings are reported under it."""
    return page.__name__.rsplit(".", 1)[-1]
