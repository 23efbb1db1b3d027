"""What every page is rendered with: the one jinja2 Environment, its filters, static assets, the
JSON table specs that ``report.js`` draws, and file names (slugs) made from arbitrary names.

Example::

    >>> from reports.html import make_environment
    >>> make_environment().from_string("{{ x|num }} {{ y }}").render(x=12345, y="<b>")
    '12,345 &lt;b&gt;'
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from opdb.status import STATUSES, WORST_RANK, css_rules

from .contexts import Page

TEMPLATES = Path(__file__).parent / "templates"
ASSETS = ("report.css", "report.js")
TABLE_PAGE_SIZE = 100  # rows per page of the JS tables
STATUS_CSS_MARKER = "/* status colours: generated from opdb.status.INFO */\n"


def _num(v: Any, digits: int = 3) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v != v:
            return "nan"
        if v == 0:
            return "0"
        if abs(v) >= 1e5 or abs(v) < 1e-3:
            return f"{v:.{digits - 1}e}"
        return f"{v:.{digits}g}"
    return str(v)


def _pct(part: int | float | None, whole: int | float | None) -> str:
    if not whole or part is None:
        return ""
    return f"{100.0 * part / whole:.1f}%"


def _noun(n: Any, word: str) -> str:
    """``word`` as it follows the number ``n``: "1 sample", "2 samples" (``word`` is singular;
    one ending in "y" after a consonant takes "ies", one in "s" or "x" takes "es")."""
    if n == 1:
        return word
    if word.endswith("y") and word[-2:-1] not in "aeiou":
        return word[:-1] + "ies"
    return word + ("es" if word.endswith(("s", "x")) else "s")


def make_environment() -> jinja2.Environment:
    """The report's single jinja2 Environment: autoescape on for everything, strict undefined."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["num"] = _num
    env.filters["pct"] = _pct
    env.filters["noun"] = _noun
    env.globals["STATUSES"] = STATUSES
    return env


def page_vars(page: Page) -> dict[str, Any]:
    """What a template gets: the dataclass's fields as names, and ``page`` itself."""
    ctx = {f.name: getattr(page, f.name) for f in fields(page)}
    ctx["page"] = page
    return ctx


def write_asset(name: str, dest: Path) -> None:
    """Copy one static asset; the stylesheet gets the status colours of the vocabulary."""
    if name != "report.css":
        shutil.copyfile(TEMPLATES / name, dest)
        return
    text = (TEMPLATES / name).read_text(encoding="utf-8")
    if STATUS_CSS_MARKER not in text:
        raise AssertionError(f"{TEMPLATES / name}: the status-colours marker is missing")
    dest.write_text(text.replace(STATUS_CSS_MARKER, STATUS_CSS_MARKER + css_rules()), encoding="utf-8")


def script_json(text: str) -> Markup:
    """JSON text made safe inside ``<script type="application/json">`` (no ``</script>``, no ``&``)."""
    return Markup(text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
                  .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def table_spec(columns: Sequence[dict[str, Any]], rows_json: str, **extra: Any) -> Markup:
    """A data-table spec for ``report.js``: ``rows_json`` is the JSON text of a list of arrays."""
    head = json.dumps({"columns": list(columns), "pageSize": TABLE_PAGE_SIZE,
                       "statusRank": WORST_RANK, **extra}, allow_nan=False)
    return script_json(head[:-1] + ', "rows": ' + rows_json + "}")


def dumps(rows: Any) -> str:
    """Compact JSON text of table rows."""
    return json.dumps(rows, separators=(",", ":"), default=str)


class Slugger:
    """File names from arbitrary names: safe characters, unique even on case-insensitive disks."""

    def __init__(self) -> None:
        self.seen: dict[str, str] = {}
        self.taken: set[str] = set()

    def __call__(self, name: str) -> str:
        if name in self.seen:
            return self.seen[name]
        base = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip(".") or "_"
        base = base[:80]
        slug, i = base, 1
        while slug.lower() in self.taken or slug.lower() in ("assets", "index.html"):
            i += 1
            slug = f"{base}~{i}"
        self.taken.add(slug.lower())
        self.seen[name] = slug
        return slug


def parse_json(text: Any, default: Any) -> Any:
    """A JSON column's value (``default`` when empty or unreadable; non-strings pass through)."""
    if text is None or text == "":
        return default
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return default
