"""Render the static report site from an opdb database: iterate the page list
(:data:`reports.pages.PAGES`), write what each page module makes, in parallel per build when asked.

Layout of the output folder (one page module per kind of page, in ``reports/pages/``)::

    index.html                   every build, trend across builds
    assets/report.css, report.js copied once; pages link them relatively (works from file://)
    <build>/index.html           build summary
    <build>/matrix.html          op × dtype matrix
    <build>/fallbacks.html       overloads that fall back to the CPU, the most reached first
    <build>/failing.html         overloads failing samples reach
    <build>/regressions.html     what the gate found worse than the previous build, grouped
    <build>/ops/<op>.html        one page per OpInfo op (split in parts above OP_PART_ROWS samples)
    <build>/models.html          model families, blocking ops, every graph
    <build>/models/<family>.html one card per graph (split in parts above FAMILY_PART_GRAPHS)
    <build>/diff.html            regressions and fixes against the previous build

Example::

    >>> import tempfile
    >>> from opdb import Store
    >>> from reports import render_site
    >>> out = tempfile.mkdtemp()
    >>> render_site(Store.memory(), out).pages
    1
"""

from __future__ import annotations

import datetime as _dt
import multiprocessing
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from opdb import Store

from .contexts import Page
from .html import ASSETS, Slugger, make_environment, page_vars, write_asset
from .pages import PAGES, name
from .scope import BuildScope, Site, build_infos

SITE_MARKER = ".conformance-report"  # written into every site; `report --out` replaces only folders holding it


class UnknownBuild(ValueError):
    """--build names a build the database does not hold."""


@dataclass
class SiteResult:
    """What :func:`render_site` wrote."""

    out: Path
    builds: list[str]
    pages: int = 0
    bytes: int = 0
    largest: tuple[str, int] = ("", 0)
    seconds: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)  # seconds per page module


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


class SiteRenderer:
    """Iterates :data:`reports.pages.PAGES`: each page module yields (path, context); this writes them."""

    def __init__(self, store: Store, out: Path, *, db_label: str, pages: Sequence[ModuleType] = PAGES,
                 upstream: Mapping[str, Mapping[tuple[str, str], str]] | None = None) -> None:
        self.store, self.out, self.db_label, self.page_list = store, out, db_label, tuple(pages)
        self.upstream = dict(upstream or {})
        self.env = make_environment()
        self.generated_at = _now()
        self.result = SiteResult(out=out, builds=[])

    def write(self, rel: str, page: Page, template: str) -> None:
        text = self.env.get_template(template).render(page_vars(page))
        path = self.out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        data = text.encode("utf-8")
        path.write_bytes(data)
        self.result.pages += 1
        self.result.bytes += len(data)
        if len(data) > self.result.largest[1]:
            self.result.largest = (rel, len(data))

    def render_pages(self, module: ModuleType, scope: Site | BuildScope) -> None:
        """Every page one page module makes for ``scope``, timed under the module's name."""
        s = time.perf_counter()
        for rel, page in module.pages(scope):
            if not isinstance(page, module.CONTEXT):
                raise TypeError(f"{module.__name__} made a {type(page).__name__}, not its {module.CONTEXT.__name__}")
            self.write(rel, page, module.TEMPLATE)
        key = name(module)
        self.result.timings[key] = self.result.timings.get(key, 0.0) + time.perf_counter() - s

    def prepare(self, only: Sequence[str] | None) -> Site:
        """The site: every build's info (ordered by start) marked rendered or not; checks ``only``."""
        infos = build_infos(self.store, Slugger())
        if only:
            known = [i.build for i in infos]
            missing = [b for b in only if b not in known]
            if missing:
                raise UnknownBuild(f"unknown build {', '.join(map(repr, missing))}; "
                                   f"builds in the database: {', '.join(known) or 'none'}")
        for i in infos:
            i.rendered = not only or i.build in only
        nav = [m.NAV for m in self.page_list if m.PER_BUILD and m.NAV]
        return Site(self.store, self.db_label, self.generated_at, infos, nav, upstream=self.upstream)

    def render_build(self, site: Site, build: str) -> None:
        """Every page of one build."""
        scope = BuildScope(site, next(i for i in site.infos if i.build == build))
        for module in self.page_list:
            if module.PER_BUILD:
                self.render_pages(module, scope)

    def render(self, only: Sequence[str] | None, jobs: int = 1) -> SiteResult:
        t0 = time.perf_counter()
        site = self.prepare(only)
        rendered = site.rendered
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / SITE_MARKER).write_text("conformance report site; `conformance report --out` replaces this "
                                            "folder whole\n")
        (self.out / "assets").mkdir(exist_ok=True)
        for asset in ASSETS:
            write_asset(asset, self.out / "assets" / asset)
        for module in self.page_list:
            if not module.PER_BUILD:
                self.render_pages(module, site)
        jobs = max(1, min(jobs, len(rendered)))
        if jobs > 1 and self.store.path is not None:
            self._render_parallel(rendered, only, jobs)
        else:
            for info in rendered:
                self.render_build(site, info.build)
        self.result.builds = [i.build for i in rendered]
        self.result.seconds = time.perf_counter() - t0
        return self.result

    def _render_parallel(self, rendered: list, only: Sequence[str] | None, jobs: int) -> None:
        # Builds are independent: each worker opens the database itself and renders whole builds.
        # Largest builds first, so the pool stays busy.
        order = sorted(rendered, key=lambda i: -(i.op_total + i.model_total))
        batches: list[list[str]] = [[] for _ in range(jobs)]
        for k, info in enumerate(order):
            batches[k % jobs].append(info.build)
        ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods()
                                          else "spawn")
        args = [(str(self.store.path), str(self.out), self.db_label, self.generated_at, list(only or []), b,
                 [m.__name__ for m in self.page_list]) for b in batches if b]
        with ctx.Pool(len(args)) as pool:
            for part in pool.starmap(_render_worker, args):
                self.result.pages += part.pages
                self.result.bytes += part.bytes
                if part.largest[1] > self.result.largest[1]:
                    self.result.largest = part.largest
                for k, v in part.timings.items():
                    self.result.timings[k] = self.result.timings.get(k, 0.0) + v


def _render_worker(db: str, out: str, db_label: str, generated_at: str, only: list[str],
                   builds: list[str], pages: list[str]) -> SiteResult:
    import importlib

    with Store.open(db, create=False) as store:
        r = SiteRenderer(store, Path(out), db_label=db_label, pages=[importlib.import_module(p) for p in pages])
        r.generated_at = generated_at
        site = r.prepare(only)
        for build in builds:
            r.render_build(site, build)
        return r.result


def default_jobs() -> int:
    return max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def render_site(store: Store, out: str | Path, *, builds: Sequence[str] | None = None,
                db_label: str | None = None, jobs: int | None = 1,
                upstream: Mapping[str, Mapping[tuple[str, str], str]] | None = None) -> SiteResult:
    """Render the site for ``builds`` (all builds when empty) into ``out``; returns what was written.

    ``upstream`` (target -> (op, dtype) -> what that backend's own project expects of it) marks,
    on the cross-backend page, which of a backend's findings its upstream already lists.

    ``jobs`` > 1 renders builds in that many processes (each opens the database file itself);
    ``None`` picks one per available CPU (at most 4). Raises :class:`UnknownBuild` (a ValueError)
    when a requested build is not in the database.
    """
    label = db_label or (str(store.path) if store.path else ":memory:")
    return SiteRenderer(store, Path(out), db_label=label, upstream=upstream).render(
        builds, jobs=default_jobs() if jobs is None else jobs)



def check_site_dir(out: str | Path) -> None:
    """Refuse an ``--out`` folder that is neither empty nor a previous report (raises ValueError)."""
    p = Path(out)
    if p.exists() and not p.is_dir():
        raise ValueError(f"{p}: exists and is not a folder")
    if p.is_dir() and any(p.iterdir()) and not (p / SITE_MARKER).is_file():
        raise ValueError(f"{p}: folder is not empty and holds no previous report ({SITE_MARKER} missing); "
                         "choose another --out or empty it")


def publish_site(store: Store, out: str | Path, *, builds: Sequence[str] | None = None,
                 db_label: str | None = None, jobs: int | None = 1,
                 upstream: Mapping[str, Mapping[tuple[str, str], str]] | None = None) -> SiteResult:
    """Render the site into a fresh folder next to ``out``, then put it in ``out``'s place.

    ``out`` must be missing, empty, or a previous report (it holds :data:`SITE_MARKER`); it is
    replaced whole, so no stale page of an earlier report survives. Nothing is touched when the
    folder is refused or the rendering fails.
    """
    target = Path(out)
    check_site_dir(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".{target.name}.rendering-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        result = render_site(store, staging, builds=builds, db_label=db_label, jobs=jobs, upstream=upstream)
        check_site_dir(target)  # still ours to replace
        old = target.parent / f".{target.name}.old-{os.getpid()}"
        if target.exists():
            target.rename(old)
        staging.rename(target)
        shutil.rmtree(old, ignore_errors=True)
        return result
    finally:
        shutil.rmtree(staging, ignore_errors=True)
