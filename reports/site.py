"""Render the static report site from an opdb database.

Layout of the output folder::

    index.html                   every build, trend across builds
    assets/report.css, report.js copied once; pages link them relatively (works from file://)
    <build>/index.html           build summary
    <build>/matrix.html          op × dtype matrix
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
import itertools
import json
import multiprocessing
import os
import re
import shutil
import statistics
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from opdb import Store
from opdb import queries_report as q
from opdb.status import FAILING, PASSED, STATUSES, WORST_RANK, css_rules, ordered, severity, worst

from . import charts
from .contexts import (
    BuildInfo,
    CountRow,
    DiffOp,
    DiffPage,
    DiffSection,
    FamilyPage,
    FamilyRow,
    GraphCard,
    IndexPage,
    Link,
    MatrixPage,
    ModelsPage,
    OpPage,
    Page,
    ShapeRow,
    SlowOp,
    SummaryPage,
)

TEMPLATES = Path(__file__).parent / "templates"
ASSETS = ("report.css", "report.js")
OP_PART_ROWS = 2000  # samples per op page part
FAMILY_PART_GRAPHS = 100  # graph cards per family page part
DIFF_ROWS = 10_000  # items of one diff section embedded in the page (worst categories first)
DIFF_OPS = 200  # rows of the per-op roll-up of a diff section
REPRO_LIST = 50  # repro commands listed in the page itself (the table has all)
TABLE_PAGE_SIZE = 100  # rows per page of the JS tables
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
    timings: dict[str, float] = field(default_factory=dict)


# -- the one Environment -----------------------------------------------------------------------
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
    env.globals["STATUSES"] = STATUSES
    return env


def page_vars(page: Page) -> dict[str, Any]:
    """What a template gets: the dataclass's fields as names, and ``page`` itself."""
    ctx = {f.name: getattr(page, f.name) for f in fields(page)}
    ctx["page"] = page
    return ctx


#: template of each page dataclass
TEMPLATE_OF: dict[type[Page], str] = {
    IndexPage: "index.html", SummaryPage: "summary.html", MatrixPage: "matrix.html", OpPage: "op.html",
    ModelsPage: "models.html", FamilyPage: "family.html", DiffPage: "diff.html",
}


# -- helpers -------------------------------------------------------------------------------------
STATUS_CSS_MARKER = "/* status colours: generated from opdb.status.INFO */\n"


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


def _dumps(rows: Any) -> str:
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


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


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


# -- the renderer ----------------------------------------------------------------------------------
class SiteRenderer:
    """Builds every page's context from the store and writes the pages."""

    def __init__(self, store: Store, out: Path, *, db_label: str) -> None:
        self.store, self.out, self.db_label = store, out, db_label
        self.env = make_environment()
        self.generated_at = _now()
        self.result = SiteResult(out=out, builds=[])
        self.build_slug = Slugger()
        self._reached: dict[str, Reached] = {}
        self._classes: dict[tuple[str, str], dict[str, list[str]]] = {}
        self._op_slugs = Slugger()
        self._op_pages: set[str] = set()

    # writing
    def write(self, rel: str, page: Page) -> None:
        template = self.env.get_template(TEMPLATE_OF[type(page)])
        text = template.render(page_vars(page))
        path = self.out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        data = text.encode("utf-8")
        path.write_bytes(data)
        self.result.pages += 1
        self.result.bytes += len(data)
        if len(data) > self.result.largest[1]:
            self.result.largest = (rel, len(data))

    def _base(self, title: str, root: str, nav: list[Link]) -> dict[str, Any]:
        return {"title": title, "root": root, "nav": nav, "generated_at": self.generated_at,
                "db_label": self.db_label}

    def _nav(self, info: BuildInfo, root: str, here: str) -> list[Link]:
        b = f"{root}{info.slug}/"
        items = [("index.html", "Summary"), ("matrix.html", "Op × dtype"), ("models.html", "Models"),
                 ("diff.html", "Diff")]
        nav = [Link(f"{root}index.html", "All builds")]
        nav += [Link(b + f, t, current=f == here) for f, t in items]
        return nav

    # build infos
    def build_infos(self, all_builds: list[q.BuildRuns]) -> list[BuildInfo]:
        op_ids = [b.op_run["id"] for b in all_builds if b.op_run]
        model_ids = [b.model_run["id"] for b in all_builds if b.model_run]
        op_counts = q.status_counts_by_run(self.store, op_ids, "op_results")
        model_counts = q.status_counts_by_run(self.store, model_ids, "model_results")
        infos = []
        for b in all_builds:
            oc = op_counts.get(b.op_run["id"], {}) if b.op_run else {}
            mc = model_counts.get(b.model_run["id"], {}) if b.model_run else {}
            run = b.op_run or b.model_run or {}
            infos.append(BuildInfo(
                build=b.build, slug=self.build_slug(b.build), target=run.get("target") or "",
                torch_version=run.get("torch_version") or "", op_run=b.op_run, model_run=b.model_run,
                op_counts=ordered(oc), op_total=sum(oc.values()), model_counts=ordered(mc),
                model_total=sum(mc.values()), failing=sum(n for s, n in oc.items() if s in FAILING),
                native_pass=oc.get("pass", 0), fallback_pass=oc.get("pass_fallback", 0)))
        return infos

    def trend_svg(self, infos: list[BuildInfo], highlight: str | None = None) -> Markup:
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
        return charts.line_chart(series, labels, title="Trend across builds (share of results)",
                                 y_label="%", y_min=0, y_max=100, highlight=hl, width=720)

    # pages
    def index(self, infos: list[BuildInfo], rendered: list[BuildInfo]) -> None:
        page = IndexPage(**self._base("Conformance report: builds", "", []), builds=rendered,
                         trend_svg=self.trend_svg(infos))
        self.write("index.html", page)

    def summary(self, info: BuildInfo, infos: list[BuildInfo]) -> None:
        root = "../"
        run = info.op_run
        by_class: list[CountRow] = []
        by_dtype: list[CountRow] = []
        states: list[tuple[str, int]] = []
        coverage_all = None
        source = ""
        catalog_total = q.catalog_total(self.store, info.torch_version) if info.torch_version else 0
        slowest: list[SlowOp] = []
        if run:
            rid = run["id"]
            if q.coverage_count(self.store, rid):
                source = "coverage"
                t = q.coverage_totals(self.store, rid)
                coverage_all = CountRow("all overloads", t["exercised"], t["native"], t["fallback"],
                                        t["failing"], catalog_total or t["listed"])
                by_class = [CountRow(r["class"], r["exercised"] or 0, r["native"] or 0, r["fallback"] or 0,
                                     r["failing"] or 0, r["total"])
                            for r in q.coverage_by_class(self.store, rid, info.torch_version)]
                states = list(q.coverage_states(self.store, rid).items())
            elif info.op_total:
                source = "op_results"
                reached = self.reached(info)
                coverage_all = reached.totals(catalog_total or None)
                if catalog_total:
                    by_class = reached.by_class(self.overload_classes(info.torch_version))
            if info.op_total:
                by_dtype = self.reached(info).by_dtype()
                slowest = [SlowOp(r["op"], f"ops/{self.op_slug(r['op'])}.html", r["samples"],
                                  r["total_s"] or 0.0, r["max_s"] or 0.0)
                           for r in q.slowest_ops(self.store, rid)]
        prev = self.previous(info, infos)
        links = [Link("matrix.html", "Op × dtype matrix"), Link("models.html", "Models"),
                 Link("diff.html", "Diff against the previous build"), Link("../index.html", "All builds")]
        page = SummaryPage(
            **self._base(f"Build {info.build}", root, self._nav(info, root, "index.html")), info=info,
            coverage_source=source, coverage_all=coverage_all, catalog_total=catalog_total,
            by_class=by_class, by_dtype=by_dtype, states=states, slowest=slowest,
            trend_svg=self.trend_svg(infos, highlight=info.build),
            prev=Link(f"../{prev.slug}/index.html", prev.build) if prev and prev.rendered else None,
            links=links)
        self.write(f"{info.slug}/index.html", page)

    @staticmethod
    def previous(info: BuildInfo, infos: list[BuildInfo]) -> BuildInfo | None:
        """The build before ``info`` by start time (``infos`` is ordered that way)."""
        i = infos.index(info)
        return infos[i - 1] if i > 0 else None

    def reached(self, info: BuildInfo) -> Reached:
        """The overloads the build's op results reached (one scan per build, cached)."""
        rid = info.op_run["id"] if info.op_run else ""
        if rid not in self._reached:
            self._reached = {rid: Reached(q.reached_cells(self.store, rid) if rid else [])}
        return self._reached[rid]

    def overload_classes(self, torch_version: str) -> dict[str, list[str]]:
        key = ("ov", torch_version)
        if key not in self._classes:
            self._classes[key] = q.overload_classes(self.store, torch_version)
        return self._classes[key]

    def opinfo_classes(self, torch_version: str) -> dict[str, list[str]]:
        key = ("oi", torch_version)
        if key not in self._classes:
            self._classes[key] = q.opinfo_classes(self.store, torch_version)
        return self._classes[key]

    def op_slug(self, op: str) -> str:
        return self._op_slugs(op)

    def matrix(self, info: BuildInfo) -> None:
        root = "../"
        rows: list[list[Any]] = []
        dtypes: list[str] = []
        n_op = n_aten = 0
        if info.op_run:
            rid = info.op_run["id"]
            tv = info.torch_version
            op_classes = self.opinfo_classes(tv)
            ov_classes = self.overload_classes(tv)
            cells = q.matrix_cells(self.store, rid)
            ov_cells = self.reached(info).cells()
            dtypes = sorted({c[1] or "-" for c in cells} | {c[1] or "-" for c in ov_cells})
            col = {d: i for i, d in enumerate(dtypes)}

            def grouped(items: Iterable[tuple[str, str, str, int]]) -> dict[str, dict[str, Counter]]:
                out: dict[str, dict[str, Counter]] = {}
                for name, dtype, status, n in items:
                    out.setdefault(name, {}).setdefault(dtype or "-", Counter())[status or "?"] += n
                return out

            def cell_row(by_dtype: dict[str, Counter]) -> tuple[list[Any], list[str], int, str | None]:
                cells_out: list[Any] = [None] * len(dtypes)
                present: set[str] = set()
                total = 0
                for d, cnt in by_dtype.items():
                    w = worst(cnt)
                    n = sum(cnt.values())
                    total += n
                    present.update(cnt)
                    tip = f"{d}: " + ", ".join(f"{s} {k}" for s, k in ordered(dict(cnt)))
                    cells_out[col[d]] = [w, tip, n]
                return cells_out, sorted(present, key=lambda s: WORST_RANK.get(s, 99)), total, worst(present)

            for name, by_dtype in sorted(grouped(cells).items()):
                c, present, total, w = cell_row(by_dtype)
                rows.append([[f"ops/{self.op_slug(name)}.html", name], "OpInfo", op_classes.get(name, []),
                             "sampled", total, w, *c, present])
                n_op += 1
            by_overload = grouped(ov_cells)
            cov = q.coverage_rows(self.store, rid)
            seen = set()
            for r in cov:
                seen.add(r["name"])
                c, present, total, w = cell_row(by_overload.get(r["name"], {}))
                state = r["state"] or ""
                rows.append([[None, r["name"]], "ATen", ov_classes.get(r["name"], []), state,
                             total or (r["samples"] or 0), w, *c, present])
                n_aten += 1
            for name in sorted(set(by_overload) - seen):
                c, present, total, w = cell_row(by_overload[name])
                rows.append([[None, name], "ATen", ov_classes.get(name, []), "exercised", total, w, *c,
                             present])
                n_aten += 1
        columns = [{"key": "op", "label": "op", "kind": "link"},
                   {"key": "kind", "label": "kind", "kind": "text"},
                   {"key": "classes", "label": "classes", "kind": "list"},
                   {"key": "state", "label": "coverage", "kind": "text"},
                   {"key": "samples", "label": "samples", "kind": "int"},
                   {"key": "worst", "label": "worst", "kind": "status"},
                   *({"key": f"dtype:{d}", "label": d, "kind": "cell"} for d in dtypes),
                   {"key": "statuses", "label": "statuses", "kind": "list", "hidden": True}]
        ncol = len(columns)
        filters = [{"col": 1, "label": "kind", "mode": "eq"},
                   {"col": ncol - 1, "label": "has status", "mode": "has"},
                   {"col": 2, "label": "class", "mode": "has"},
                   {"col": 3, "label": "coverage", "mode": "eq"}]
        page = MatrixPage(**self._base(f"Op × dtype: {info.build}", root, self._nav(info, root, "matrix.html")),
                          info=info, dtypes=dtypes, n_opinfo=n_op, n_aten=n_aten,
                          table_json=table_spec(columns, _dumps(rows), filters=filters, id="matrix"))
        self.write(f"{info.slug}/matrix.html", page)

    def op_pages(self, info: BuildInfo) -> None:
        if not info.op_run:
            return
        rid = info.op_run["id"]
        op_classes = self.opinfo_classes(info.torch_version)
        for op, group in itertools.groupby(q.op_sample_stream(self.store, rid), key=lambda r: r[0]):
            rows = list(group)
            self._op_page(info, op, rows, op_classes.get(op, []))

    def _op_page(self, info: BuildInfo, op: str, rows: list[tuple], classes: list[str]) -> None:
        root = "../../"
        self._op_pages.add(op)
        slug = self.op_slug(op)
        by_dtype: dict[str, Counter] = {}
        status_counts: Counter = Counter()
        for _, _, dtype, status, _, _ in rows:
            by_dtype.setdefault(dtype or "-", Counter())[status] += 1
            status_counts[status] += 1
        failing_ids = [r[1] for r in rows if r[3] in FAILING][:REPRO_LIST]
        n_failing = sum(n for s, n in status_counts.items() if s in FAILING)
        hist = charts.histogram(charts.log10_bins([r[4] for r in rows]),
                                title=f"max relative error of {op} (log10 bins, {len(rows)} samples)",
                                x_label="max_rel_err decade (0: exact, n/a: not measured)")
        dtype_counts = [(d, ordered(dict(c))) for d, c in sorted(by_dtype.items())]
        columns = [{"key": k, "label": k, "kind": _SAMPLE_KINDS.get(k, "text")} for k in q.SAMPLE_COLUMNS]
        columns.append({"key": "repro", "label": "repro", "kind": "repro", "ref": 0})
        filters = [{"col": q.SAMPLE_COLUMNS.index("status"), "label": "status", "mode": "eq"},
                   {"col": q.SAMPLE_COLUMNS.index("dtype"), "label": "dtype", "mode": "eq"},
                   {"col": q.SAMPLE_COLUMNS.index("variant"), "label": "variant", "mode": "eq"}]
        nparts = max(1, -(-len(rows) // OP_PART_ROWS))
        names = [f"{slug}.html"] + [f"{slug}.{k}.html" for k in range(2, nparts + 1)]
        parts = [Link(n, f"part {k + 1}") for k, n in enumerate(names)] if nparts > 1 else []
        repros = [f"conformance repro {i} --db {self.db_label}" for i in failing_ids]
        for k in range(nparts):
            chunk = rows[k * OP_PART_ROWS:(k + 1) * OP_PART_ROWS]
            rows_json = "[" + ",".join(r[5] for r in chunk) + "]"
            page = OpPage(
                **self._base(f"{op} — {info.build}", root, self._nav(info, root, "")), info=info, op=op,
                classes=classes, n_samples=len(rows), dtype_counts=dtype_counts,
                status_counts=ordered(dict(status_counts)), hist_svg=hist, repros=repros,
                n_failing=n_failing,
                samples_json=table_spec(columns, rows_json, filters=filters, id="samples-table",
                                        failing=sorted(FAILING), db=self.db_label),
                part=k + 1, parts=parts)
            self.write(f"{info.slug}/ops/{names[k]}", page)

    # models
    def models(self, info: BuildInfo) -> None:
        root = "../"
        run = info.model_run
        rows = q.model_rows(self.store, run["id"]) if run else []
        note = ""
        if run and (run.get("target") or "").startswith("neuron-emu"):
            note = ("Latencies on the emulator (target neuron-emu) are CPU time of the emulated device, "
                    "not device time.")
        fam_slug = Slugger()
        families: list[FamilyRow] = []
        table: list[list[Any]] = []
        blocking = q.blocking_ops(self.store, run["id"]) if run else []
        for fam, grp in itertools.groupby(rows, key=lambda r: r["family"] or "-"):
            graphs = list(grp)
            slug = fam_slug(fam)
            cards = [self._card(g) for g in graphs]
            nparts = max(1, -(-len(cards) // FAMILY_PART_GRAPHS))
            names = [f"{slug}.html"] + [f"{slug}.{k}.html" for k in range(2, nparts + 1)]
            parts = [Link(n, f"part {k + 1}") for k, n in enumerate(names)] if nparts > 1 else []
            counts = Counter(g["status"] or "?" for g in graphs)
            p50s = [g["p50_ms"] for g in graphs if g["p50_ms"] is not None]
            rels = [g["max_rel_err"] for g in graphs if g["max_rel_err"] is not None]
            grads = [g["grad_max_rel_err"] for g in graphs if g["grad_max_rel_err"] is not None]
            families.append(FamilyRow(
                family=fam, href=f"models/{names[0]}", graphs=len(graphs), counts=ordered(dict(counts)),
                passing=sum(n for s, n in counts.items() if s in PASSED),
                failing=sum(n for s, n in counts.items() if s in FAILING),
                worst_rel=max(rels) if rels else None, worst_grad=max(grads) if grads else None,
                compiled=sum(1 for g in graphs if g["mode"] == "compile"),
                recompiles=sum(g["recompiles"] or 0 for g in graphs),
                median_p50_ms=statistics.median(p50s) if p50s else None))
            for k in range(nparts):
                chunk = cards[k * FAMILY_PART_GRAPHS:(k + 1) * FAMILY_PART_GRAPHS]
                for c in chunk:
                    table.append([[f"models/{names[k]}#{c.anchor}", c.model_id], fam, c.dtype, c.mode,
                                  c.status, c.max_rel_err, c.grad_max_rel_err, c.first_divergent_op,
                                  c.compiles, c.recompiles, c.p50_ms, c.p99_ms, c.graph_hash[:12]])
                page = FamilyPage(**self._base(f"{fam} — {info.build}", "../../", self._nav(info, "../../", "")),
                                  info=info, family=fam, latency_note=note, graphs=chunk,
                                  n_graphs=len(cards), part=k + 1, parts=parts)
                self.write(f"{info.slug}/models/{names[k]}", page)
        columns = [{"key": "model", "label": "model", "kind": "link"},
                   {"key": "family", "label": "family", "kind": "text"},
                   {"key": "dtype", "label": "dtype", "kind": "text"},
                   {"key": "mode", "label": "mode", "kind": "text"},
                   {"key": "status", "label": "status", "kind": "status"},
                   {"key": "max_rel_err", "label": "max rel err", "kind": "num"},
                   {"key": "grad", "label": "grad max rel err", "kind": "num"},
                   {"key": "first_divergent_op", "label": "first divergent op", "kind": "text"},
                   {"key": "compiles", "label": "compiles", "kind": "int"},
                   {"key": "recompiles", "label": "recompiles", "kind": "int"},
                   {"key": "p50_ms", "label": "p50 ms", "kind": "num"},
                   {"key": "p99_ms", "label": "p99 ms", "kind": "num"},
                   {"key": "graph", "label": "graph", "kind": "text"}]
        filters = [{"col": 4, "label": "status", "mode": "eq"}, {"col": 1, "label": "family", "mode": "eq"},
                   {"col": 3, "label": "mode", "mode": "eq"}]
        page = ModelsPage(**self._base(f"Models: {info.build}", root, self._nav(info, root, "models.html")),
                          info=info, latency_note=note, families=families, blocking=blocking,
                          n_graphs=len(rows), graphs_json=table_spec(columns, _dumps(table), filters=filters,
                                                                     id="graphs-table"))
        self.write(f"{info.slug}/models.html", page)

    @staticmethod
    def _card(g: dict[str, Any]) -> GraphCard:
        curve = _json(g["loss_curve"], {})
        series = []
        n = 0
        if isinstance(curve, dict):
            for key in ("target", "cpu"):
                vals = curve.get(key)
                if isinstance(vals, list):
                    vals = [float(v) if isinstance(v, (int, float)) else None for v in vals]
                    series.append((key, vals))
                    n = max(n, len(vals))
        loss_svg = (charts.line_chart(series, [str(i) for i in range(n)], title="loss curve (target vs cpu)",
                                      width=360, height=180, css_class="chart small")
                    if n else Markup('<p class="empty">no loss curve</p>'))
        shapes = []
        raw = _json(g["shapes"], [])
        if isinstance(raw, dict):
            raw = [{"shape": k, **(v if isinstance(v, dict) else {"value": v})} for k, v in raw.items()]
        if isinstance(raw, list):
            for rec in raw:
                if not isinstance(rec, dict):
                    rec = {"shape": rec}
                known = ("shape", "compiles", "recompiled", "recompiles", "p50_ms", "p99_ms")
                recompiled = rec.get("recompiled")
                if recompiled is None and rec.get("recompiles") is not None:
                    recompiled = bool(_int(rec.get("recompiles")))
                compiles = _int(rec.get("compiles"))
                if compiles is None and rec.get("recompiles") is not None:
                    compiles = _int(rec.get("recompiles"))
                shapes.append(ShapeRow(
                    shape=_shape_text(rec.get("shape", "")), compiles=compiles,
                    recompiled=None if recompiled is None else bool(recompiled),
                    p50_ms=_float(rec.get("p50_ms")), p99_ms=_float(rec.get("p99_ms")),
                    extra=", ".join(f"{k}={v}" for k, v in rec.items() if k not in known)))
        native = _json(g["native_ops"], [])
        fallback = _json(g["fallback_ops"], [])
        recompiles = g["recompiles"] or 0
        return GraphCard(
            id=g["id"], anchor=f"g{g['id']}", model_id=g["model_id"] or "", family=g["family"] or "-",
            dtype=g["dtype"] or "", mode=g["mode"] or "", status=g["status"] or "?",
            graph_hash=g["graph_hash"] or "", params=g["params"] or "", max_abs_err=g["max_abs_err"],
            max_rel_err=g["max_rel_err"], grad_max_rel_err=g["grad_max_rel_err"], loss_svg=loss_svg,
            compiles=_compiles(g["mode"], recompiles, shapes), recompiles=recompiles,
            compile_s=g["compile_s"], p50_ms=g["p50_ms"], p99_ms=g["p99_ms"], shapes=shapes,
            first_divergent_op=g["first_divergent_op"] or "", first_divergent_detail=g["first_divergent_detail"] or "",
            native_ops=len(native) if isinstance(native, list) else 0,
            fallback_ops=[str(x) for x in fallback] if isinstance(fallback, list) else [str(fallback)],
            error=g["error"] or "")

    # diff
    def diff(self, info: BuildInfo, infos: list[BuildInfo]) -> None:
        root = "../"
        base = self.previous(info, infos)
        sections = []
        if base:
            for kind, table, brun, crun in (("ops", "op_results", base.op_run, info.op_run),
                                            ("models", "model_results", base.model_run, info.model_run)):
                if not brun or not crun:
                    sections.append(DiffSection(kind, "", (brun or {}).get("id", ""), (crun or {}).get("id", ""),
                                                [], 0, table_spec([], "[]"),
                                                note=f"no {kind} run in one of the two builds"))
                    continue
                sections.append(self._diff_section(kind, table, brun["id"], crun["id"]))
        page = DiffPage(**self._base(f"Diff: {info.build}", root, self._nav(info, root, "diff.html")), info=info,
                        baseline=base,
                        baseline_link=Link(f"../{base.slug}/index.html", base.build) if base and base.rendered else None,
                        sections=sections)
        self.write(f"{info.slug}/diff.html", page)

    def _diff_section(self, kind: str, table: str, brun: str, crun: str) -> DiffSection:
        # The gate judged this pair when it stored any decision for it; a mixed run's pair holds op,
        # drift and model decisions together, so each section keeps its own kinds.
        decided = q.gate_items(self.store, brun, crun)
        kinds = ("model",) if kind == "models" else ("op", "drift")
        gate = [g for g in decided if (g["kind"] or "op") in kinds]
        columns = [{"key": "category", "label": "category", "kind": "text"},
                   {"key": "kind", "label": "kind", "kind": "text"},
                   {"key": "op", "label": "op / model", "kind": "link"},
                   {"key": "variant", "label": "variant / mode", "kind": "text"},
                   {"key": "dtype", "label": "dtype", "kind": "text"},
                   {"key": "baseline", "label": "baseline", "kind": "status"},
                   {"key": "candidate", "label": "candidate", "kind": "status"},
                   {"key": "item_key", "label": "item", "kind": "text"},
                   {"key": "evidence", "label": "evidence", "kind": "pre"}]
        filters = [{"col": 0, "label": "category", "mode": "eq"}, {"col": 4, "label": "dtype", "mode": "eq"}]

        def op_link(op: str | None) -> list[Any]:
            if kind == "ops" and op and op in self._op_pages:
                return [f"ops/{self.op_slug(op)}.html", op]
            return [None, op or ""]

        if decided:
            rows = [[g["category"], g["kind"], op_link(g["op"]), g["variant"], g["dtype"], g["baseline"],
                     g["candidate"], g["item_key"], _evidence(g["evidence"])] for g in gate]
            source = "gate"
        else:
            rows = []
            for key, op, variant, dtype, b, c in q.status_changes(self.store, brun, crun, table):
                if b is None:
                    cat = "new"
                elif c is None:
                    cat = "removed"
                elif severity(c) > severity(b):
                    cat = "regression"
                elif severity(c) < severity(b):
                    cat = "improvement"
                else:
                    cat = "changed"
                rows.append([cat, kind[:-1], op_link(op), variant, dtype, b, c, key,
                             f"severity {severity(b)} → {severity(c)}" if b and c else ""])
            order = {"regression": 0, "improvement": 1, "changed": 2, "new": 3, "removed": 4}
            rows.sort(key=lambda r: (order.get(r[0], 9), r[2][1] or "", r[7]))
            source = "status diff (gate not run)"
        counts = Counter(r[0] for r in rows)
        cats = ["regression", "improvement", "flaky", "drift", "changed", "new", "removed"]
        counts_list = [(c, counts[c]) for c in cats if counts.get(c)] + \
                      sorted((c, n) for c, n in counts.items() if c not in cats)
        per_op: dict[str, Counter] = {}
        links: dict[str, Any] = {}
        for r in rows:
            name = r[2][1] or ""
            per_op.setdefault(name, Counter())[r[0]] += 1
            links[name] = r[2][0]
        by_op = [DiffOp(name, links[name], c.get("regression", 0), c.get("improvement", 0),
                        sum(n for k, n in c.items() if k not in ("regression", "improvement")))
                 for name, c in per_op.items()]
        by_op.sort(key=lambda d: (-d.regressions, -d.improvements, d.op))
        shown = rows[:DIFF_ROWS]
        return DiffSection(kind, source, brun, crun, counts_list, len(rows),
                           table_spec(columns, _dumps(shown), filters=filters, id=f"diff-{kind}-items"),
                           by_op=by_op[:DIFF_OPS], n_ops=len(by_op), n_shown=len(shown))

    # everything
    def prepare(self, only: Sequence[str] | None) -> tuple[list[BuildInfo], list[BuildInfo]]:
        """Every build's info (ordered by start) and the ones to render; checks ``only``."""
        all_builds = q.builds(self.store)
        known = [b.build for b in all_builds]
        if only:
            missing = [b for b in only if b not in known]
            if missing:
                raise UnknownBuild(f"unknown build {', '.join(map(repr, missing))}; "
                                   f"builds in the database: {', '.join(known) or 'none'}")
        infos = self.build_infos(all_builds)
        for i in infos:
            i.rendered = not only or i.build in only
        return infos, [i for i in infos if i.rendered]

    def render_build(self, info: BuildInfo, infos: list[BuildInfo]) -> None:
        """Every page of one build."""
        self._op_slugs = Slugger()
        self._op_pages = set()
        steps = (("summary", lambda: self.summary(info, infos)), ("matrix", lambda: self.matrix(info)),
                 ("ops", lambda: self.op_pages(info)), ("models", lambda: self.models(info)),
                 ("diff", lambda: self.diff(info, infos)))
        for name, fn in steps:
            s = time.perf_counter()
            fn()
            self.result.timings[name] = self.result.timings.get(name, 0.0) + time.perf_counter() - s
        self._reached = {}

    def render(self, only: Sequence[str] | None, jobs: int = 1) -> SiteResult:
        t0 = time.perf_counter()
        infos, rendered = self.prepare(only)
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / SITE_MARKER).write_text("conformance report site; `conformance report --out` replaces this "
                                            "folder whole\n")
        (self.out / "assets").mkdir(exist_ok=True)
        for name in ASSETS:
            write_asset(name, self.out / "assets" / name)
        self.index(infos, rendered)
        jobs = max(1, min(jobs, len(rendered)))
        if jobs > 1 and self.store.path is not None:
            self._render_parallel(rendered, only, jobs)
        else:
            for info in rendered:
                self.render_build(info, infos)
        self.result.builds = [i.build for i in rendered]
        self.result.seconds = time.perf_counter() - t0
        return self.result

    def _render_parallel(self, rendered: list[BuildInfo], only: Sequence[str] | None, jobs: int) -> None:
        # Builds are independent: each worker opens the database itself and renders whole builds.
        # Largest builds first, so the pool stays busy.
        order = sorted(rendered, key=lambda i: -(i.op_total + i.model_total))
        batches: list[list[str]] = [[] for _ in range(jobs)]
        for k, info in enumerate(order):
            batches[k % jobs].append(info.build)
        ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods()
                                          else "spawn")
        args = [(str(self.store.path), str(self.out), self.db_label, self.generated_at, list(only or []), b)
                for b in batches if b]
        with ctx.Pool(len(args)) as pool:
            for part in pool.starmap(_render_worker, args):
                self.result.pages += part.pages
                self.result.bytes += part.bytes
                if part.largest[1] > self.result.largest[1]:
                    self.result.largest = part.largest
                for k, v in part.timings.items():
                    self.result.timings[k] = self.result.timings.get(k, 0.0) + v


def _render_worker(db: str, out: str, db_label: str, generated_at: str, only: list[str],
                   builds: list[str]) -> SiteResult:
    with Store.open(db, create=False) as store:
        r = SiteRenderer(store, Path(out), db_label=db_label)
        r.generated_at = generated_at
        infos, _ = r.prepare(only)
        for info in infos:
            if info.build in builds:
                r.render_build(info, infos)
        return r.result


_SAMPLE_KINDS = {"id": "int", "sample": "int", "status": "status", "max_abs_err": "num", "max_rel_err": "num",
                 "ulp_err": "num", "mismatch_frac": "num", "arbiter_err": "num", "cpu_arbiter_err": "num",
                 "atol": "num", "rtol": "num", "native_ops": "list", "fallback_ops": "list", "error": "pre",
                 "duration_s": "num", "seed": "int", "tol_source": "pre"}


def _shape_text(shape: Any) -> str:
    """``[[2, 8], [8]]`` -> ``[2, 8], [8]``; a flat list of ints is one shape."""
    if isinstance(shape, (list, tuple)):
        if all(isinstance(x, int) for x in shape):
            return "[" + ", ".join(map(str, shape)) + "]"
        return ", ".join(_shape_text(x) for x in shape)
    return str(shape)


def _compiles(mode: str | None, recompiles: int, shapes: list[ShapeRow]) -> int:
    if mode != "compile":
        return 0
    known = [s.compiles for s in shapes if s.compiles is not None]
    if known and any(s.recompiled is not None for s in shapes):
        return sum(known)
    return 1 + recompiles


def _json(text: Any, default: Any) -> Any:
    if text is None or text == "":
        return default
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return default


def _int(v: Any) -> int | None:
    try:
        return int(v) if v is not None else None
    except (TypeError, ValueError):
        return None


def _float(v: Any) -> float | None:
    try:
        return float(v) if v is not None else None
    except (TypeError, ValueError):
        return None


def _evidence(text: str | None) -> str:
    data = _json(text, text)
    if isinstance(data, dict):
        return "; ".join(f"{k}: {v}" for k, v in data.items())
    if data is None:
        return ""
    return str(data) if not isinstance(data, str) else data


def default_jobs() -> int:
    return max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def render_site(store: Store, out: str | Path, *, builds: Sequence[str] | None = None,
                db_label: str | None = None, jobs: int | None = 1) -> SiteResult:
    """Render the site for ``builds`` (all builds when empty) into ``out``; returns what was written.

    ``jobs`` > 1 renders builds in that many processes (each opens the database file itself);
    ``None`` picks one per available CPU (at most 4). Raises :class:`UnknownBuild` (a ValueError)
    when a requested build is not in the database.
    """
    label = db_label or (str(store.path) if store.path else ":memory:")
    return SiteRenderer(store, Path(out), db_label=label).render(builds, jobs=default_jobs() if jobs is None else jobs)



def check_site_dir(out: str | Path) -> None:
    """Refuse an ``--out`` folder that is neither empty nor a previous report (raises ValueError)."""
    p = Path(out)
    if p.exists() and not p.is_dir():
        raise ValueError(f"{p}: exists and is not a folder")
    if p.is_dir() and any(p.iterdir()) and not (p / SITE_MARKER).is_file():
        raise ValueError(f"{p}: folder is not empty and holds no previous report ({SITE_MARKER} missing); "
                         "choose another --out or empty it")


def publish_site(store: Store, out: str | Path, *, builds: Sequence[str] | None = None,
                 db_label: str | None = None, jobs: int | None = 1) -> SiteResult:
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
        result = render_site(store, staging, builds=builds, db_label=db_label, jobs=jobs)
        check_site_dir(target)  # still ours to replace
        old = target.parent / f".{target.name}.old-{os.getpid()}"
        if target.exists():
            target.rename(old)
        staging.rename(target)
        shutil.rmtree(old, ignore_errors=True)
        return result
    finally:
        shutil.rmtree(staging, ignore_errors=True)
