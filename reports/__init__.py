"""reports: the static HTML report of an opdb database (``conformance report``).

The pages are a list of page modules (:mod:`reports.pages`: each with its query, its context
dataclass from :mod:`reports.contexts` and its template); :mod:`reports.site` iterates the list
and writes the pages. One jinja2 Environment (autoescape on, :mod:`reports.html`) renders
templates from ``reports/templates``; what several pages share is in :mod:`reports.scope`;
charts are inline SVG drawn by :mod:`reports.charts`; large tables are JSON blocks rendered by
``templates/report.js``.

Example::

    >>> import tempfile
    >>> from opdb import Store
    >>> from reports import render_site
    >>> render_site(Store.memory(), tempfile.mkdtemp()).builds
    []
"""

from .site import SITE_MARKER, SiteResult, UnknownBuild, make_environment, publish_site, render_site

__all__ = ["SITE_MARKER", "SiteResult", "UnknownBuild", "make_environment", "publish_site", "render_site"]
