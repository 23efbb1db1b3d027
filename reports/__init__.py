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

from .site import SITE_MARKER, SiteResult, UnknownBuild, make_environment, publish_site, render_site

__all__ = ["SITE_MARKER", "SiteResult", "UnknownBuild", "make_environment", "publish_site", "render_site"]
