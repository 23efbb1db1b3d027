"""What a page module gets to build its contexts: the whole site (:class:`Site`) or one build of
it (:class:`BuildScope`), with the figures several pages share computed once.

Pages read the database only through :mod:`opdb.queries_report`, via ``scope.store``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from markupsafe import Markup

from opdb import Store
from opdb import queries_counts as qc
from opdb import queries_report as q
from opdb.queries_counts import OverloadRow
from opdb.status import FAILING, PASSED, ordered

from . import charts
from .contexts import BuildInfo, CountRow, Link
from .html import Slugger

BACKENDS_PAGE = "backends.html"  # the cross-backend page, at the site's root (when there are two targets)


def build_labels(builds: list[q.BuildRuns]) -> list[str]:
    """What the site calls each (target, build), unique: its build, as always while the database
    holds one target. Beside other targets a build the target named by default (``-``: cpu,
    inductor, device:TYPE) is called by its target, and a build name two targets share is
    prefixed by the target (``device:neuron 2.33.0``).

    >>> from opdb.queries_report import BuildRuns
    >>> build_labels([BuildRuns("2.33.0", None, None, "neuron-emu"), BuildRuns("-", None, None, "cpu"),
    ...               BuildRuns("-", None, None, "inductor")])
    ['2.33.0', 'cpu', 'inductor']
    """
    if len({b.target for b in builds}) < 2:
        return [b.build for b in builds]
    targets: dict[str, set[str]] = {}
    for b in builds:
        targets.setdefault(b.build, set()).add(b.target)
    return [b.target if b.build in ("", "-") else f"{b.target} {b.build}" if len(targets[b.build]) > 1
            else b.build for b in builds]


def build_folder(store: Store, target: str, build: str) -> str | None:
    """The folder the site gives a (target, build): the slug of its label, as :func:`build_infos`
    names them (in build order, with one :class:`Slugger`); None when the database has no run of it."""
    slug, all_builds = Slugger(), q.builds(store)
    for b, label in zip(all_builds, build_labels(all_builds), strict=True):
        folder = slug(label)
        if b.target == target and b.build == (build or "-"):
            return folder
    return None


def build_infos(store: Store, slug: Slugger) -> list[BuildInfo]:
    """Every (target, build) of the database, ordered by start time, with its status counts; each
    build's previous build is the one of the same target before it."""
    all_builds = q.builds(store)
    labels = build_labels(all_builds)
    op_ids = [b.op_run["id"] for b in all_builds if b.op_run]
    model_ids = [b.model_run["id"] for b in all_builds if b.model_run]
    op_counts = qc.result_counts(store, op_ids, "op_results")
    model_counts = qc.result_counts(store, model_ids, "model_results")
    infos = []
    for b, label in zip(all_builds, labels, strict=True):
        oc = op_counts.get(b.op_run["id"], {}) if b.op_run else {}
        mc = model_counts.get(b.model_run["id"], {}) if b.model_run else {}
        run = b.op_run or b.model_run or {}
        infos.append(BuildInfo(
            build=label, slug=slug(label), target=b.target or run.get("target") or "", run_build=b.build,
            torch_version=run.get("torch_version") or "", op_run=b.op_run, model_run=b.model_run,
            op_counts=ordered(oc), op_total=sum(oc.values()), model_counts=ordered(mc),
            model_total=sum(mc.values()), failing=qc.failing_total(oc),
            native_pass=oc.get("pass", 0), fallback_pass=oc.get("pass_fallback", 0)))
    last: dict[str, BuildInfo] = {}
    for info in infos:
        prev = last.get(info.target)
        last[info.target] = info
        if prev is None:
            continue
        info.previous = prev.build
        for kind in ("op_run", "model_run"):
            b, c = getattr(prev, kind), getattr(info, kind)
            if not b or not c or any((g.baseline_run, g.candidate_run) == (b["id"], c["id"]) for g in info.gates):
                continue
            decided = qc.gate_counts(store, b["id"], c["id"])
            if decided:
                info.gates.append(decided)
            elif (b["id"], c["id"]) not in info.ungated:
                info.ungated.append((b["id"], c["id"]))
    return infos


@dataclass
class Site:
    """The site being rendered: every build (``infos``, by start time) and the ones it shows."""

    store: Store
    db_label: str
    generated_at: str
    infos: list[BuildInfo]
    nav_items: list[tuple[str, str]]  # (file, text) of each build's navigation, from the page list
    # target -> (op, dtype) -> what that target's upstream project expects ("xfail (newest)"): given by
    # the caller (the harness's upstream lists), shown beside each backend's own findings
    upstream: Mapping[str, Mapping[tuple[str, str], str]] = field(default_factory=dict)
    _classes: dict[tuple[str, str], dict[str, list[str]]] = field(default_factory=dict)
    _memo: dict[tuple[str, ...], Any] = field(default_factory=dict)

    @property
    def rendered(self) -> list[BuildInfo]:
        return [i for i in self.infos if i.rendered]

    def base(self, title: str, root: str, nav: list[Link]) -> dict[str, Any]:
        """The fields of :class:`reports.contexts.Page` every page context starts from."""
        return {"title": title, "root": root, "nav": nav, "generated_at": self.generated_at,
                "db_label": self.db_label}

    @property
    def targets(self) -> list[str]:
        """The targets of the database's builds, in the order their first build started."""
        return list(dict.fromkeys(i.target for i in self.infos))

    @property
    def cross_backend(self) -> bool:
        """Whether the database holds builds of two targets or more (the cross-backend page)."""
        return len(self.targets) > 1

    def trend_svg(self, highlight: str | None = None) -> Markup:
        """The trend across builds; beside other targets, one chart per target (of the highlighted
        build's target only, when one is highlighted): builds of two targets are no sequence."""
        if not self.cross_backend:
            return self._trend(self.infos, highlight, "Trend across builds (share of results)")
        shown = [i.target for i in self.infos if i.build == highlight][:1] or self.targets
        return Markup("").join(self._trend([i for i in self.infos if i.target == t], highlight,
                                           f"Trend across builds of {t} (share of results)") for t in shown)

    def _trend(self, infos: list[BuildInfo], highlight: str | None, title: str) -> Markup:
        labels = [i.build for i in infos]

        def pct(n: int, d: int) -> float | None:
            return 100.0 * n / d if d else None

        series = [
            ("native pass %", [pct(i.native_pass, i.op_total) for i in infos]),
            ("pass via fallback %", [pct(i.fallback_pass, i.op_total) for i in infos]),
            ("failing %", [pct(i.failing, i.op_total) for i in infos]),
            ("models passing %", [pct(sum(n for s, n in i.model_counts if s in PASSED), i.model_total)
                                  for i in infos]),
        ]
        hl = labels.index(highlight) if highlight in labels else None
        return charts.line_chart(series, labels, title=title,
                                 y_label="%", y_min=0, y_max=100, highlight=hl, width=720)

    def overloads(self, info: BuildInfo, how: str) -> list[OverloadRow]:
        """The build's fallback (``how="fallback"``) or failing overloads: the one source of the
        index's, the summary's, the matrix's and the lists' counts (computed once per build)."""
        key = ("overloads", info.build, how)
        if key not in self._memo:
            run = info.op_run["id"] if info.op_run else ""
            model = info.model_run["id"] if info.model_run else None
            fetch = qc.fallback_overloads if how == "fallback" else qc.failing_overloads
            self._memo[key] = fetch(self.store, run, model) if run else []
        return self._memo[key]

    def op_slugs(self, info: BuildInfo) -> dict[str, str]:
        """File names of the build's op pages: made from the build's whole sorted op list, so a
        page of any build can link to an op page of any other."""
        key = ("op_slugs", info.build)
        if key not in self._memo:
            slug = Slugger()
            self._memo[key] = {op: slug(op) for op in (q.run_ops(self.store, info.op_run["id"])
                                                      if info.op_run else [])}
        return self._memo[key]

    def classes(self, which: str, torch_version: str) -> dict[str, list[str]]:
        """Op classes by name, of catalog overloads (``"overload"``) or OpInfo ops (``"opinfo"``)."""
        key = (which, torch_version)
        if key not in self._classes:
            fetch = q.overload_classes if which == "overload" else q.opinfo_classes
            self._classes[key] = fetch(self.store, torch_version)
        return self._classes[key]


class BuildScope:
    """One build of the site, as its pages see it; what several pages need is computed once."""

    def __init__(self, site: Site, info: BuildInfo) -> None:
        self.site, self.info = site, info
        self.store = site.store
        self.db_label = site.db_label
        self._slugs = site.op_slugs(info)
        self._extra_slug = Slugger()  # names outside the run's op list (none expected)
        self.op_pages: set[str] = set()  # ops whose page was written (the op page module fills it)
        self._reached: Reached | None = None
        self._model_rows: list[dict[str, Any]] | None = None
        self._memo: dict[str, Any] = {}

    def op_slug(self, op: str) -> str:
        """The file name (without .html) of an op's page in this build."""
        return self._slugs.get(op) or self._extra_slug(op)

    def overloads(self, how: str) -> list[OverloadRow]:
        return self.site.overloads(self.info, how)

    def memo(self, key: str, make: Callable[[], Any]) -> Any:
        """``make()``, computed once per build: what two pages derive alike (e.g. model families)."""
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    def nav(self, root: str, here: str) -> list[Link]:
        b = f"{root}{self.info.slug}/"
        nav = [Link(f"{root}index.html", "All builds")]
        if self.site.cross_backend:
            nav.append(Link(f"{root}{BACKENDS_PAGE}", "Across backends"))
        nav += [Link(b + f, t, current=f == here) for f, t in self.site.nav_items]
        return nav

    def base(self, title: str, root: str, here: str = "") -> dict[str, Any]:
        return self.site.base(title, root, self.nav(root, here))

    def previous(self) -> BuildInfo | None:
        """The build of the same target before this one by start time."""
        return next((i for i in self.site.infos if i.build == self.info.previous), None) if self.info.previous else None

    def reached(self) -> Reached:
        """The overloads the build's op results reached (one scan per build)."""
        if self._reached is None:
            rid = self.info.op_run["id"] if self.info.op_run else ""
            self._reached = Reached(q.reached_cells(self.store, rid) if rid else [])
        return self._reached

    def classes(self, which: str) -> dict[str, list[str]]:
        return self.site.classes(which, self.info.torch_version)

    def model_rows(self) -> list[dict[str, Any]]:
        """The build's model results, by family (one query per build)."""
        if self._model_rows is None:
            run = self.info.model_run
            self._model_rows = q.model_rows(self.store, run["id"]) if run else []
        return self._model_rows


class Reached:
    """Coverage figures derived from :func:`opdb.queries_report.reached_cells` rows."""

    def __init__(self, rows: list[tuple[str, str, str, str, int]]) -> None:
        self.rows = rows

    def _sets(self, rows: Iterable[tuple[str, str, str, str, int]]) -> tuple[set, set, set, set]:
        ex, nat, fb, fail = set(), set(), set(), set()
        for name, _, status, how, _ in rows:
            ex.add(name)
            (nat if how == "native" else fb).add(name)
            if status in FAILING:
                fail.add(name)
        return ex, nat, fb, fail

    def totals(self, total: int | None) -> CountRow:
        ex, nat, fb, fail = self._sets(self.rows)
        return CountRow("all overloads", len(ex), len(nat), len(fb), len(fail), total)

    def by_dtype(self) -> list[CountRow]:
        groups: dict[str, list] = {}
        for r in self.rows:
            groups.setdefault(r[1] or "-", []).append(r)
        out = []
        for dtype in sorted(groups):
            ex, nat, fb, fail = self._sets(groups[dtype])
            out.append(CountRow(dtype, len(ex), len(nat), len(fb), len(fail)))
        return out

    def by_class(self, classes: dict[str, list[str]]) -> list[CountRow]:
        ex, nat, fb, fail = self._sets(self.rows)
        counts: dict[str, list[int]] = {}
        for name, cls_list in classes.items():
            flags = (1, name in ex, name in nat, name in fb, name in fail)
            for c in cls_list:
                acc = counts.setdefault(c, [0, 0, 0, 0, 0])
                for i, f in enumerate(flags):
                    acc[i] += f
        rows = [CountRow(c, v[1], v[2], v[3], v[4], v[0]) for c, v in counts.items()]
        rows.sort(key=lambda r: (-(r.total or 0), r.label))
        return rows

    def cells(self) -> list[tuple[str, str, str, int]]:
        """``(overload, dtype, status, samples)``; a sample reaching an overload both natively and
        via fallback counts twice (once per way)."""
        return [(name, dtype, status, n) for name, dtype, status, _, n in self.rows]
