"""reports: the static HTML report of an opdb database (``conformance report``).

One jinja2 Environment (autoescape on) renders templates from ``reports/templates``; every
page's context is a dataclass in :mod:`reports.contexts`; charts are inline SVG drawn by
:mod:`reports.charts`; large tables are JSON blocks rendered by ``templates/report.js``.

Example::

    >>> import tempfile
    >>> from opdb import Store
    >>> from reports import render_site
    >>> render_site(Store.memory(), tempfile.mkdtemp()).builds
    []
"""

from .site import SiteResult, UnknownBuild, make_environment, render_site

__all__ = ["SiteResult", "UnknownBuild", "make_environment", "render_site"]
