"""The nightly pipeline: for each build (oldest first) run the op sweep, the schema-driven
coverage pass and the model corpus into one opdb; compute coverage; render the site; gate each
build against the previous one.

Each stage is a plain function over one open store, run in order (like nox's workflow); the
nightly opens the store once. Shards of a nightly run in separate processes into separate
databases; after the merge, ``--finish`` runs the stages after the sweeps on the merged one.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from opdb import Store

from .run import Summary, check, run_into
from .spec import RunSpec
from .targets import BuildRef

Echo = Callable[[str], None]


@dataclass(frozen=True)
class NightlySpec:
    """A nightly: the run spec every build's sweep starts from, plus what only a nightly has."""

    run: RunSpec = RunSpec(models=("all",), schema=True)  # its build and run id are set per build
    builds: tuple[BuildRef, ...] = ()  # default: every build the target ships, oldest first
    run_id_prefix: str | None = None  # shards of one nightly share run ids
    site: str | None = "results/site"
    gate: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "builds", tuple(BuildRef.parse(b) for b in self.builds))

    def run_for(self, build: BuildRef) -> RunSpec:
        return self.run.replace(build=build, run_id=f"{self.run_id_prefix}-{build}" if self.run_id_prefix else None)


@dataclass
class NightlyResult:
    runs: dict[str, str] = field(default_factory=dict)  # build -> run id
    summaries: dict[str, Summary] = field(default_factory=dict)
    gate_exit: int = 0
    site: Path | None = None
    coverage: dict[str, str] = field(default_factory=dict)  # run id -> "exercised/reachable (pct)"
    gates: list[str] = field(default_factory=list)  # one line per gate pair

    def summary_lines(self) -> list[str]:
        """The nightly's last words: one line per build, per gate pair, and where the report is."""
        lines = ["== nightly summary =="]
        for build, run_id in self.runs.items():
            s = self.summaries.get(build)
            counts = f"{s.items:,} items, {s.failures:,} failing, {s.counts.get('pass_fallback', 0):,} pass on the " \
                     f"CPU fallback, {s.wall_s / 60:.1f} min" if s is not None else "merged"
            if s is not None and s.infra:
                counts = f"INFRA: {s.infra}"
            cov = self.coverage.get(run_id)
            lines.append(f"  {build:<10} {counts}" + (f"; coverage {cov}" if cov else "") + f"  [{run_id}]")
        lines += [f"  {g}" for g in self.gates]
        if self.site is not None:
            lines.append(f"  report: {self.site / 'index.html'}")
        return lines


def default_builds(target: str) -> tuple[BuildRef, ...]:
    from .targets import REGISTRY, get_target

    get_target("cpu")  # loads the registry
    cls = REGISTRY.get(target)
    builds = cls.available_builds() if cls is not None else ()
    return tuple(BuildRef(b) for b in builds) or (BuildRef(),)


def run_nightly(spec: NightlySpec, db_path: str | os.PathLike[str], progress: Callable[[str], None] | None = None,
                echo: Echo = print) -> NightlyResult:
    result = NightlyResult()
    check(spec.run)  # a bad selection is refused before the database is created
    with Store.open(db_path) as store:
        sweep_stage(spec, store, result, progress, echo)
        if spec.run.shard != "1/1":
            echo(f"shard {spec.run.shard} done; merge the shard databases (conformance merge OUT IN...), then run "
                 f"`conformance nightly --finish` on the merged one")
            return result
        finish_stages(store, spec, result, echo, run_ids=list(result.runs.values()), db_label=str(db_path))
    return result


def finish_stages(store: Store, spec: NightlySpec, result: NightlyResult, echo: Echo = print,
                  run_ids: Sequence[str] | None = None, db_label: str | None = None) -> None:
    """The stages after the sweeps: coverage, gate, report (of the given runs; after a merge, of
    the latest run of each build)."""
    ids = list(run_ids) if run_ids is not None else _runs_to_finish(store, spec)
    if run_ids is None:  # after a merge: the runs finished here are the merged ones
        result.runs = {store.get_run(i)["build"]: i for i in ids}
    echo("== coverage ==")
    result.coverage = coverage_stage(store, ids, echo)
    if spec.gate and len(ids) > 1:
        echo("== gate: each build against the previous one ==")
        result.gate_exit = gate_stage(store, ids, echo, verdicts=result.gates)
    if spec.site:
        echo("== report ==")
        result.site = report_stage(store, Path(spec.site), db_label or str(store.path), echo)
    for line in result.summary_lines():
        echo(line)


# -- the stages ----------------------------------------------------------------------------
def sweep_stage(spec: NightlySpec, store: Store, result: NightlyResult, progress: Callable[[str], None] | None,
                echo: Echo) -> None:
    builds = spec.builds or default_builds(spec.run.target)
    parts = [name for name, on in (("OpInfo sweep", spec.run.opinfo), ("schema search", spec.run.schema),
                                   ("models", bool(spec.run.models))) if on]
    for i, build in enumerate(builds, start=1):
        echo(f"== sweep {i}/{len(builds)}: {spec.run.target} {build} ({', '.join(parts)}) ==")
        summary = run_into(spec.run_for(build), store, progress=progress)
        echo(summary.render(top=3))
        result.runs[str(build)] = summary.run_id
        result.summaries[str(build)] = summary


def coverage_stage(store: Store, run_ids: Sequence[str], echo: Echo) -> dict[str, str]:
    """Coverage of each run; returns run id -> its exercised share."""
    import torch

    from . import catalog, coverage

    if not store.count("ops", torch_version=torch.__version__):
        store.store_catalog([o.row(torch.__version__) for o in catalog.overloads(with_opinfos=True)])
    shares = {}
    for rid in run_ids:
        counts = coverage.compute(store, rid)
        shares[rid] = coverage.reachable_share(counts)
        echo(f"coverage of {rid}: backend-reachable overloads exercised {shares[rid]}; "
             + ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    return shares


def gate_stage(store: Store, run_ids: Sequence[str], echo: Echo, verdicts: list[str] | None = None) -> int:
    """Gate each run against the previous one; returns the worst exit code (``verdicts`` gets
    one line per pair)."""
    from .gate import GateError, run_gate
    from .gate_render import gate_links, summary_lines

    worst = 0
    for base, cand in zip(run_ids, run_ids[1:], strict=False):
        try:
            result = run_gate(store, base, cand)
        except GateError as exc:
            echo(f"gate {base} -> {cand}: INFRA: {exc}")
            if verdicts is not None:
                verdicts.append(f"gate {base} -> {cand}: INFRA")
            worst = 2
            continue
        lines = summary_lines(result, gate_links(store, result, str(store.path)))
        for line in lines:
            echo(line)
        if verdicts is not None:
            verdicts.append(lines[0] + "; " + ", ".join(
                f"{c} {len(result.of(c))}" for c in ("regression", "worsened", "drift", "flaky") if result.of(c)))
        worst = max(worst, 1 if result.verdict == "fail" else 0)
    return worst


def report_stage(store: Store, site: Path, db_label: str, echo: Echo) -> Path:
    from reports import render_site

    out = render_site(store, site, builds=[], db_label=db_label)
    echo(f"report: {out.pages} pages for {len(out.builds)} build(s): {site / 'index.html'}")
    return site


def _runs_to_finish(store: Store, spec: NightlySpec) -> list[str]:
    """After a merge: the latest finished run of each build, in build order."""
    from opdb.queries import latest_run

    ids = []
    for build in spec.builds or default_builds(spec.run.target):
        run = latest_run(store, target=spec.run.target, build=str(build))
        if run is not None:
            ids.append(run["id"])
    return ids
