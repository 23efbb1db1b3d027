"""The context of every page: one dataclass per template, documented field by field.

A template sees exactly the fields of its page's dataclass as top-level names (plus ``page``,
the dataclass itself); the Environment uses ``StrictUndefined``, so a name a template uses that
the dataclass lacks fails the render (and ``tests/test_report.py`` checks it statically too).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from markupsafe import Markup

from opdb.queries_counts import BackendShare, GateCounts


@dataclass
class Link:
    """A link in the navigation or between pages (``href`` relative to the current page)."""

    href: str
    text: str
    current: bool = False  # the page being shown (navigation only)


@dataclass
class CountRow:
    """Coverage figures for one group (op class, dtype, or all): overload counts."""

    label: str
    exercised: int
    native: int
    fallback: int
    failing: int
    total: int | None = None  # catalog overloads in the group, when the catalog is known


@dataclass
class BuildInfo:
    """One build as the index and every page header show it."""

    build: str
    slug: str  # folder name of the build in the site
    target: str
    torch_version: str
    op_run: dict[str, Any] | None  # the runs row (id, status, started_at, host, git_sha, ...)
    model_run: dict[str, Any] | None
    op_counts: list[tuple[str, int]]  # (status, count) in display order
    op_total: int
    model_counts: list[tuple[str, int]]
    model_total: int
    failing: int  # op results with a failing status
    native_pass: int  # op results with status pass
    fallback_pass: int  # op results with status pass_fallback
    rendered: bool = True  # False for builds the site does not include (see --build)
    previous: str = ""  # the build of the same target before this one (by start time), "" for its first
    gates: list[GateCounts] = field(default_factory=list)  # the gate's decisions against `previous`
    ungated: list[tuple[str, str]] = field(default_factory=list)  # run pairs the gate has not judged
    run_build: str = ""  # the build as the runs store it ('-': the target's default); `build` is the site's name

    @property
    def gate_verdict(self) -> str:
        """fail / pass as the gate decided against the previous build; "" when it has not judged it."""
        verdicts = [g.verdict for g in self.gates]
        if "fail" in verdicts:
            return "fail"
        return "pass" if verdicts and all(v == "pass" for v in verdicts) and not self.ungated else ""

    def gate_count(self, category: str) -> int:
        return sum(g.of(category) for g in self.gates)

    @property
    def failing_pct(self) -> float | None:
        return 100.0 * self.failing / self.op_total if self.op_total else None


@dataclass
class Page:
    """Fields every page has."""

    title: str
    root: str  # relative prefix from this page to the site root: "", "../" or "../../"
    nav: list[Link]  # the build's navigation (empty on the index)
    generated_at: str
    db_label: str  # the database path as given to `conformance report --db`


@dataclass
class IndexPage(Page):
    """``index.html``: every rendered build and the trend across all builds in the DB."""

    builds: list[BuildInfo]
    overloads: dict[str, dict[str, int]]  # build -> {"fallback": overloads, "failing": overloads}
    trend_svg: Markup
    backends: Link | None = None  # the cross-backend page (the database holds two targets or more)


@dataclass
class SlowOp:
    op: str
    href: str
    samples: int
    total_s: float
    max_s: float


@dataclass
class CustomOpCell:
    """One check of a custom op x dtype on the build page: its worst status, and what failed."""

    status: str  # "" when the op has no item of this check (no reference: no value items)
    text: str  # the badge's text: the status, and the failed opcheck tests
    title: str  # the tooltip: items, failures, the first failure's text


@dataclass
class CustomOpRow:
    """A custom op x dtype of the build's custom-op lane, a cell per check (opcheck, eager forward,
    eager backward, compiled), and whether its values were checked at all."""

    op: str
    href: str  # its op page
    dtype: str
    cells: list[CustomOpCell]
    structural: bool  # no reference declared: checked structurally only, values never


@dataclass
class SummaryPage(Page):
    """``<build>/index.html``: coverage, status counts, slowest ops, trend, links."""

    info: BuildInfo
    coverage_source: str  # "coverage" (table), "op_results" (native/fallback lists) or "" (no data)
    coverage_all: CountRow | None
    catalog_total: int  # overloads in the catalog for the run's torch version (0: no catalog)
    reachable: int  # backend-reachable overloads of the coverage table (0: none), the console's denominator
    by_class: list[CountRow]
    by_dtype: list[CountRow]
    states: list[tuple[str, int]]  # coverage states (exercised, composite_implicit, ...) and counts
    slowest: list[SlowOp]
    trend_svg: Markup
    prev: Link | None  # the previous build's summary, when it is rendered
    links: list[Link]
    # (calls passing, calls replayed) of the signatures traced from the model graphs, weighted by
    # how often the models make each call; (0, 0): the run replayed none
    traced_calls: tuple[int, int] = (0, 0)
    # the custom-op lane: the checks' names (column heads) and a row per custom op x dtype; empty
    # when the run checked no custom op (the section is then left out)
    custom_checks: list[str] = field(default_factory=list)
    custom_ops: list[CustomOpRow] = field(default_factory=list)
    # a compiler target's op results by how much of each its backend ran (None: no item of the
    # run holds a compiler's proof, and the table is left out)
    backend_share: BackendShare | None = None


@dataclass
class MatrixPage(Page):
    """``<build>/matrix.html``: op × dtype, one row per op, rendered by JS from ``table_json``."""

    info: BuildInfo
    dtypes: list[str]
    n_opinfo: int  # rows for OpInfo ops
    n_aten: int  # rows for catalog overloads
    n_fallback: int  # ATen rows in the fallback list (the summary's count; filter "overload: fallback")
    n_failing: int  # ATen rows in the failing list
    table_json: Markup  # data-table spec (columns, rows, filters), escaped for <script>


@dataclass
class ContractCell:
    """One contract over the items of one op × dtype: its aggregate outcome, what the cell says
    (the failing count, or the reason for n/a) and the first item's detail as its tooltip."""

    outcome: str  # fail | pass | n/a | "" (no item checked it)
    text: str
    title: str


@dataclass
class ContractRow:
    """One dtype of an op's contract table: a cell per contract, in the table's column order."""

    dtype: str
    cells: list[ContractCell]


@dataclass
class OpPage(Page):
    """``<build>/ops/<op>.html``: every sample of one OpInfo op (one part of them, if many)."""

    info: BuildInfo
    op: str
    classes: list[str]
    n_samples: int  # samples of the op (all parts)
    dtype_counts: list[tuple[str, list[tuple[str, int]]]]  # dtype -> (status, count)
    status_counts: list[tuple[str, int]]
    hist_svg: Markup  # histogram of log10 max_rel_err
    repros: list[str]  # `conformance repro` commands of the failing samples (first ones)
    n_failing: int
    samples_json: Markup  # data-table spec of this part's samples
    part: int  # 1-based
    parts: list[Link]  # one link per part (empty when there is one part)
    other_builds: list[Link]  # the same op's page in the target's other rendered builds, by start time
    contracts: list[str]  # the contract table's columns (none: no item checked one)
    contract_rows: list[ContractRow]  # one per dtype
    other_targets: list[Link] = field(default_factory=list)  # the same op's page in other targets' builds
    # the size ladder per dtype (opdb.queries_report.LadderSizes); empty: the run had none
    ladder: list[Any] = field(default_factory=list)
    # the traced signatures per overload x dtype (opdb.queries_report.TracedSizes): the page's own
    # overload, or an OpInfo's overloads of its name; and the overloads' own pages
    traced: list[Any] = field(default_factory=list)
    traced_links: dict[str, str] = field(default_factory=dict)
    # the dtype probes per dtype (opdb.queries_dtypes.DtypeProbe): claimed, CPU and target, forward
    # and backward, and the verdict; empty: the run probed none
    dtype_probes: list[Any] = field(default_factory=list)


@dataclass
class FamilyRow:
    family: str
    href: str
    graphs: int
    counts: list[tuple[str, int]]
    passing: int
    failing: int
    worst_fwd: float | None  # the worst normwise forward error ||t - c|| / ||c|| (what fwd_rtol judges)
    worst_grad: float | None  # the worst normwise per-parameter gradient error (what grad_rtol judges)
    compiled: int  # graph results in compile mode
    recompiles: int
    median_p50_ms: float | None


@dataclass
class ShapeRow:
    """One record of a graph's shape sweep (``model_results.shapes``)."""

    shape: str  # the input shapes, as the runner recorded them
    compiles: int | None  # compiles this shape caused (the canonical shape: the first compile)
    recompiled: bool | None  # whether this shape made the graph recompile
    p50_ms: float | None
    p99_ms: float | None
    extra: str  # other fields of the per-shape record


@dataclass
class GraphCard:
    """One model result (a graph in one dtype and mode) on its family page."""

    id: int
    anchor: str
    model_id: str
    family: str
    dtype: str
    mode: str
    status: str
    graph_hash: str
    params: str
    fwd_rel_err: float | None  # normwise ||t - c|| / ||c|| of the forward, as fwd_rtol judges it
    max_abs_err: float | None  # element-wise evidence (a relative error near zero means little)
    max_rel_err: float | None
    grad_max_rel_err: float | None  # normwise, per parameter, as grad_rtol judges it
    loss_svg: Markup
    compiles: int  # compiles of this graph: the shape sweep's sum, else 1 + recompiles (compile mode)
    recompiles: int
    compile_s: float | None
    p50_ms: float | None
    p99_ms: float | None
    shapes: list[ShapeRow]
    first_divergent_op: str
    first_divergent_detail: str
    native_ops: int
    fallback_ops: list[str]
    error: str
    cause: str  # a failing graph's error cause (its key; ../causes.html#<key>), '' when it has none


@dataclass
class ModelsPage(Page):
    """``<build>/models.html``: families, the blocking-ops ranking and every graph (JS table)."""

    info: BuildInfo
    latency_note: str  # what latencies mean on this target ('' when nothing to say)
    families: list[FamilyRow]
    blocking: list[dict[str, Any]]  # op, graphs, families, family_list
    n_failing: int  # failing graph results
    n_localized: int  # failing graph results localized to a first divergent op
    n_graphs: int
    graphs_json: Markup


@dataclass
class SupportRow:
    """One library on the model-support page: its models, distinct graphs and support counts."""

    library: str
    models: int
    graphs: int  # distinct structural hashes among the models that ran
    topologies: int  # distinct hashes with sizes blanked (width variants are one architecture)
    counts: list[tuple[str, int]]  # (support class, models), best first; a model's worst dtype


@dataclass
class SupportPage(Page):
    """``<build>/support.html``: the support class of every model x dtype, by library and
    architecture family, and the models whose support changed since the previous build."""

    info: BuildInfo
    summary: list[SupportRow]
    n_models: int
    baseline: Link | None  # the previous build's support page, when rendered
    n_broke: int  # models x dtypes whose support got worse since the previous build
    n_fixed: int
    diff_note: str  # why there is no diff ('' when there is one)
    matrix_json: Markup  # library x architecture family x support class
    models_json: Markup  # every model x dtype
    diff_json: Markup  # the models whose support changed


@dataclass
class FamilyPage(Page):
    """``<build>/models/<family>.html``: a card per graph (one part of them, if many)."""

    info: BuildInfo
    family: str
    latency_note: str
    graphs: list[GraphCard]
    n_graphs: int
    part: int
    parts: list[Link]


@dataclass
class DiffOp:
    """One op (or model) of a diff section's roll-up."""

    op: str
    href: str | None
    regressions: int
    improvements: int
    other: int  # flaky, drift, changed, new, removed


@dataclass
class DiffSection:
    """Ops or models of the build diff."""

    kind: str  # "ops" | "models"
    source: str  # "gate" | "no gate decision" (the gate has not judged the pair) | "" (nothing to compare)
    baseline_run: str
    candidate_run: str
    counts: list[tuple[str, int]]  # (category, count)
    n_items: int
    table_json: Markup  # data-table spec of the first n_shown items (worst categories first)
    note: str = ""
    by_op: list[DiffOp] = field(default_factory=list)  # the ops with the most regressions first
    n_ops: int = 0  # ops in the roll-up (by_op holds the first DIFF_OPS)
    n_shown: int = 0
    gate_command: str = ""  # the command that stores the gate's decisions for the pair (when none are)


@dataclass
class DiffPage(Page):
    """``<build>/diff.html``: regressions and fixes against the previous build."""

    info: BuildInfo
    baseline: BuildInfo | None
    baseline_link: Link | None
    sections: list[DiffSection] = field(default_factory=list)
    totals: list[tuple[str, int]] = field(default_factory=list)  # (category, items) over every section: the console's



@dataclass
class OverloadsPage(Page):
    """``<build>/fallbacks.html`` / ``<build>/failing.html``: the overloads that fall back to the CPU
    (or that failing samples reach), the most reached first (a JS table)."""

    info: BuildInfo
    how: str  # "fallback" | "failing"
    source: str  # "coverage" (the run's coverage table) or "op_results" (the samples' overload lists)
    n: int  # overloads listed: the count the index, summary and matrix show
    samples: int  # samples counted over all of them
    graphs: int  # model graphs naming one of them
    table_json: Markup


@dataclass
class RegressionGroup:
    """One op × variant × dtype × transition of the gate's findings, for the regressions page."""

    category: str
    kind: str
    name: str
    href: str | None  # the op's page in this build
    variant: str
    dtype: str
    transition: str
    items: int
    max_rel_err: float | None
    error: str
    repro: str  # `conformance repro` of the group's first item ('' for models and drift)
    first_bad: str = ""  # since which build the items have been bad (FindingGroup.first_bad_build)


@dataclass
class RegressionsPage(Page):
    """``<build>/regressions.html``: what the gate found worse than the previous build, grouped."""

    info: BuildInfo
    baseline: str  # the previous build ('' for the first)
    judged: bool  # the gate judged every pair of runs of the two builds
    gate_commands: list[str]  # how to judge the pairs it has not
    counts: list[tuple[str, int]]  # (category, items) as the console gate prints them
    groups: list[RegressionGroup]  # regressions and drift, the largest group first
    flaky: list[RegressionGroup]


@dataclass
class CausesPage(Page):
    """``<build>/causes.html``: the build's failing items grouped into error causes (JS table)."""

    info: BuildInfo
    computed: bool  # the build's runs have causes (the report command computes them first)
    n_causes: int
    n_failing: int  # failing items the causes hold
    n_new: int  # causes the previous build's runs do not have
    n_explained: int  # causes the knowledge file explains
    baseline: str  # the previous build ('' when none, or it has no causes)
    top: list[tuple[str, int, str]]  # (key, items, one-line text) of the ten widest
    table: Markup


@dataclass
class ClaimsPage(Page):
    """``<build>/claims.html``: the build's published compatibility table against its run."""

    info: BuildInfo
    table_path: str  # the table held against the run ('' when the target publishes none)
    problem: str  # the table's loader error, if it is malformed
    counts: list[tuple[str, str, int]]  # (kind, what it means, claim x dtype findings)
    disagree: int
    findings: Markup


@dataclass
class PerfRegression:
    """One confirmed perf regression (or improvement) of the build, with its p50 across builds."""

    item: str  # "op mm float32 large"
    signature: str
    ratio: float
    low: float
    high: float
    base_p50_us: float
    p50_us: float
    first_bad: str
    chart: Markup


@dataclass
class PerfPage(Page):
    """``<build>/perf.html``: the build's latency against its baseline build (the perf lane)."""

    info: BuildInfo
    run: dict[str, Any] | None  # the perf run shown (None: none measured this build)
    machine: str
    confidence: str  # "95%": the interval's level
    counts: list[tuple[str, int]]  # (verdict or status, items)
    regressions: list[PerfRegression]
    improvements: list[PerfRegression]
    slowest: Markup  # the slowest items (table spec)
    items: Markup  # every item (table spec)


@dataclass
class DistCell:
    """One collective x dtype x world size: the worst status over its shapes and reduce ops."""

    status: str
    title: str  # the statuses and items behind it


@dataclass
class DistPage(Page):
    """``<build>/dist.html``: the build's collectives on its c10d backend (the distributed lane)."""

    info: BuildInfo
    run: dict[str, Any] | None
    counts: list[tuple[str, int]]
    columns: list[tuple[str, int]]  # (dtype, world size)
    rows: list[tuple[str, list[DistCell | None]]]  # (collective|reduce op, one cell per column)
    failing: Markup  # the failing items (table spec)


@dataclass
class Backend:
    """One column of the cross-backend page: a target's latest rendered build with an op run."""

    target: str
    info: BuildInfo
    href: str  # its build summary
    anchor: str  # the id of its "fails only on" section
    samples: int  # OpInfo samples in the matrix
    failing: int  # of them failing
    only_items: int  # samples failing on this backend only (passing on every other holding them)
    only_groups: int  # op × dtype groups of them
    # a compiler target's items its backend ran none of (everything ran in PyTorch); None: the
    # run holds no compiler's proof (an eager target)
    ran_none: int | None = None


@dataclass
class OnlyRow:
    """An op × dtype whose samples fail on one backend only: the backend engineer's own findings."""

    op: str
    dtype: str
    href: str  # the op's page in that backend's build
    items: int  # samples failing there and passing on every other backend holding them
    samples: int  # that backend's samples of the op × dtype
    statuses: list[str]  # their statuses there
    passes_on: list[str]  # the other backends holding samples of the op × dtype
    upstream: str = ""  # what the backend's upstream project expects of it ("xfail (onnxscript)"), if it lists it


@dataclass
class OnlySection:
    """"Fails only on X" for one backend: its op × dtype groups, the largest first."""

    backend: Backend
    rows: list[OnlyRow]  # the first ONLY_ROWS groups
    more: int  # groups not listed (the matrix's "fails only on" filter shows them all)


@dataclass
class BackendsPage(Page):
    """``backends.html`` (two targets or more): an op × backend matrix per dtype (a JS table, a
    cell per backend with its pass and fail counts linking to that build's op page) and, per
    backend, what fails on it only."""

    backends: list[Backend]
    dtypes: list[str]
    n_ops: int  # OpInfo ops of the matrix
    n_rows: int  # op × dtype rows
    n_disagree: int  # rows failing on some backend and passing on another
    table_json: Markup
    only: list[OnlySection]
