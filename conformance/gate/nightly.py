"""The nightly pipeline: for each build (oldest first) run the op sweep, the schema-driven
coverage pass, the target's custom ops (the custom-op lane, :mod:`conformance.customops`) and the
model corpus into one opdb; compute coverage; render the site; gate each build against the
previous one.

Each stage is a plain function over one open store, run in order (like nox's workflow); the
nightly opens the store once. Shards of a nightly run in separate processes into separate
databases; after the merge, ``--finish`` runs the stages after the sweeps on the merged one.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from conformance.run.runner import Summary, check, config_difference, run_into, run_together, stored_summary
from conformance.run.spec import RunSpec
from conformance.run.supervisor import start_worker_server
from conformance.select import SelectionError
from conformance.targets import BuildRef
from opdb import Store

from .nightly_spec import (  # noqa: F401  (re-exported: the nightly's spec and slices are its API)
    GEN_NIGHTS,
    Echo,
    NightlySpec,
    default_builds,
    with_generation_slice,
    with_reference_slice,
    with_zoo_slice,
)


@dataclass
class NightlyResult:
    runs: dict[str, str] = field(default_factory=dict)  # build -> run id
    summaries: dict[str, Summary] = field(default_factory=dict)
    gate_exit: int = 0
    site: Path | None = None
    coverage: dict[str, str] = field(default_factory=dict)  # run id -> "exercised/reachable (pct)"
    gates: list[str] = field(default_factory=list)  # one line per gate pair
    prefix: str | None = None  # the nightly's run id prefix: what ``--resume`` takes
    interrupted: str | None = None  # the build whose sweep was interrupted: the nightly stopped there

    def summary_lines(self) -> list[str]:
        """The nightly's last words: one line per build, per gate pair, and where the report is."""
        lines = ["== nightly summary =="]
        for build, run_id in self.runs.items():
            s = self.summaries.get(build)
            counts = f"{s.items:,} items, {s.failures:,} failing, {s.counts.get('pass_fallback', 0):,} pass on the " \
                     f"CPU fallback, " + (f"{s.wall_s / 60:.1f} min" if s.session_items or not s.items
                                         else "swept by an earlier session") if s is not None else "merged"
            if s is not None and s.infra:
                counts = f"INFRA: {s.infra}"
            cov = self.coverage.get(run_id)
            lines.append(f"  {build:<10} {counts}" + (f"; coverage {cov}" if cov else "") + f"  [{run_id}]")
        lines += [f"  {g}" for g in self.gates]
        if self.site is not None:
            lines.append(f"  report: {self.site / 'index.html'}")
        return lines


def run_nightly(spec: NightlySpec, db_path: str | os.PathLike[str], progress: Callable[[str], None] | None = None,
                echo: Echo = print, *, resume: str | None = None) -> NightlyResult:
    """Sweep every build, then the stages after the sweeps. Interrupted (Ctrl-C, SIGTERM) in a
    build's sweep, the nightly stops there (``result.interrupted``): no later build is swept and no
    coverage, gate or report is made of unfinished runs. ``resume``: the prefix of a nightly in
    this database; its finished builds are kept, its interrupted one resumes, the rest run."""
    result = NightlyResult()
    start_worker_server(spec.run.target)  # its imports (torch, the OpInfo db, the device) overlap with the check's
    check(spec.run)  # a bad selection is refused before the database is created
    if resume:
        spec = dataclasses.replace(spec, run_id_prefix=resume)
    elif spec.run_id_prefix is None:
        from opdb.store import new_run_id

        spec = dataclasses.replace(spec, run_id_prefix=new_run_id(spec.run.target, "nightly"))
    result.prefix = spec.run_id_prefix
    if resume and not Path(db_path).exists():
        raise SelectionError(f"{db_path}: no such database, so no nightly {resume!r} to resume")
    with Store.open(db_path) as store:
        # named first: after a kill -9 this line is what --resume takes
        echo(f"== nightly {result.prefix}" + (" (resumed) ==" if resume else " =="))
        spec = with_reference_slice(spec, store, bool(resume))
        spec = with_zoo_slice(spec, store, bool(resume), echo)
        spec = with_generation_slice(spec, store, bool(resume), echo)
        if resume:
            _check_resumable(store, spec)
        trace_stage(spec, store, progress, echo)
        sweep_stage(spec, store, result, progress, echo, resume=bool(resume))
        if result.interrupted is not None:
            echo(f"nightly interrupted in the sweep of {result.interrupted}: nothing after it ran; continue it with "
                 f"`conformance nightly --resume {result.prefix} --db {db_path}` and the same options")
            return result
        if spec.run.shard != "1/1":
            echo(f"shard {spec.run.shard} done; merge the shard databases (conformance merge OUT IN...), then run "
                 f"`conformance nightly --finish` on the merged one")
            return result
        finish_stages(store, spec, result, echo, run_ids=list(result.runs.values()), db_label=str(db_path))
    return result


def trace_stage(spec: NightlySpec, store: Store, progress: Callable[[str], None] | None, echo: Echo) -> None:
    """The op signatures of the night's model graphs (:mod:`conformance.sweep.traced`), traced
    once and shared by every build's sweep: where the database holds none for this torch and the
    sweeps ask for them (``--sizes`` auto, traced or all, and models selected). ``conformance
    trace`` adds more (other families, more graphs per family)."""
    import torch

    from conformance.models.selection import MODEL_DTYPES
    from conformance.sweep.ladder import traced_wanted
    from conformance.sweep.traced import trace_into
    from opdb import traced as stored

    if not traced_wanted(spec.run.sizes) or not spec.run.models:
        return
    have = stored.summary(store, torch.__version__)
    if have["signatures"]:
        echo(f"== trace: {have['signatures']} op signatures of {have['models']} model graphs stored for torch "
             f"{torch.__version__}, replayed by every build ==")
        return
    wanted = [d.strip() for ds in spec.run.dtypes for d in ds.split(",")] if spec.run.dtypes else list(MODEL_DTYPES)
    dtypes = [d for d in MODEL_DTYPES if d in wanted]
    if not dtypes:
        return
    echo(f"== trace: the op signatures of the model graphs ({', '.join(spec.run.models)}), once for every build ==")
    for line in trace_into(store, spec.run.models, spec.run.model_limit, dtypes, progress):
        echo(line)


def _check_resumable(store: Store, spec: NightlySpec) -> None:
    """A nightly to resume: some build's run under its prefix, each started with this spec."""
    builds = spec.builds or default_builds(spec.run.target)
    found = [(b, run) for b in builds if (run := store.get_run(spec.run_for(b).run_id or "")) is not None]
    if not found:
        raise SelectionError(f"{store.path}: no nightly {spec.run_id_prefix!r} to resume (no run "
                             f"{spec.run_for(builds[0]).run_id!r}); the prefix is printed when a nightly is interrupted")
    for build, run in found:
        differ = config_difference(RunSpec.from_run(run, workers=spec.run.workers).to_config(),
                                   spec.run_for(build).replace(build=build.resolved()).to_config())
        if differ is not None:
            key, theirs, mine = differ
            raise SelectionError(f"nightly {spec.run_id_prefix}: build {build} was started with {key}={theirs!r}, "
                                 f"this command has {key}={mine!r}; resume it with the options it was started with")


def finish_stages(store: Store, spec: NightlySpec, result: NightlyResult, echo: Echo = print,
                  run_ids: Sequence[str] | None = None, db_label: str | None = None) -> None:
    """The stages after the sweeps: coverage, gate, report (of the given runs; after a merge, of
    the latest run of each build)."""
    ids = list(run_ids) if run_ids is not None else _runs_to_finish(store, spec)
    if run_ids is None:  # after a merge: the runs finished here are the merged ones
        result.runs = {store.get_run(i)["build"]: i for i in ids}
    echo("== coverage ==")
    result.coverage = coverage_stage(store, ids, echo)
    claims_stage(store, ids, echo)
    if spec.dist is not None:
        echo("== distributed: collectives on each build ==")
        stopped = dist_stage(store, spec, ids, echo)
        if stopped:
            result.interrupted = stopped
            echo(f"nightly interrupted in the distributed lane ({stopped}): continue it with `conformance nightly "
                 f"--resume {spec.run_id_prefix} --db {db_label or store.path}` and the same options")
            return
    if spec.perf is not None and len(ids) > 1:
        echo("== perf: each build timed against the previous one ==")
        stopped = perf_stage(store, spec, ids, echo)
        if stopped:
            result.interrupted = stopped
            echo(f"nightly interrupted in the perf lane ({stopped}): continue it with `conformance nightly --resume "
                 f"{spec.run_id_prefix} --db {db_label or store.path}` and the same options")
            return
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
                echo: Echo, *, resume: bool = False) -> None:
    builds = spec.builds or default_builds(spec.run.target)
    parts = sweep_parts(spec.run)
    if spec.run.executor != "local":
        _sweep_together(spec, builds, parts, store, result, progress, echo, resume=resume)
        return
    for i, build in enumerate(builds, start=1):
        run = spec.run_for(build)
        stored = store.shard_status(run.run_id, run.shard) if resume and run.run_id else None
        if stored == "finished":
            echo(f"== sweep {i}/{len(builds)}: {spec.run.target} {build}: finished by an earlier session ==")
            summary = stored_summary(store, run.run_id, run.shard)
        else:
            echo(f"== sweep {i}/{len(builds)}: {spec.run.target} {build} ({', '.join(parts)})"
                 + (" resumed ==" if stored else " =="))
            summary = run_into(run, store, progress=progress, resume=run.run_id if stored else None)
            echo(summary.render(top=3))
        result.runs[str(build)] = summary.run_id
        result.summaries[str(build)] = summary
        if summary.interrupted:
            result.interrupted = str(build)
            return


def sweep_parts(run: RunSpec) -> list[str]:
    """What a build's sweep runs, in words: the OpInfo sweep, the slice of reference inputs, the
    schema search, the target's custom ops (a run without ``--ops`` checks every one it has;
    ``--ops 'neuron::*'`` selects them), the models."""
    from conformance.customops import CUSTOM_OPS

    selection = run.selection  # custom-op globs alone turn the OpInfo sweep off
    reference = selection.opinfo and "reference" in run.variants and run.reference_inputs != "none"
    return [name for name, on in (("OpInfo sweep", selection.opinfo),
                                  (f"reference inputs {run.reference_inputs}", reference), ("schema search", run.schema),
                                  ("custom ops", bool(CUSTOM_OPS.groups(selection))),
                                  ("models", bool(run.models))) if on]


def _sweep_together(spec: NightlySpec, builds: Sequence[BuildRef], parts: list[str], store: Store,
                    result: NightlyResult, progress: Callable[[str], None] | None, echo: Echo, *,
                    resume: bool) -> None:
    """Every build's sweep in one queue (an executor that takes several runs: Ray), the builds'
    summaries in build order as a sequential nightly has them."""
    runs, order = [], []
    for build in builds:
        run = spec.run_for(build)
        stored = store.shard_status(run.run_id, run.shard) if resume and run.run_id else None
        if stored == "finished":
            echo(f"== sweep {spec.run.target} {build}: finished by an earlier session ==")
            summary = stored_summary(store, run.run_id, run.shard)
            result.runs[str(build)], result.summaries[str(build)] = summary.run_id, summary
            continue
        runs.append((run, run.run_id if stored else None, None))
        order.append(build)
    if not runs:
        return
    echo(f"== sweep {spec.run.target} {', '.join(str(b) for b in order)} in one queue on {spec.run.executor} "
         f"({', '.join(parts)}) ==")
    for build, summary in zip(order, run_together(runs, store, progress=progress), strict=True):
        echo(f"-- {build}: " + summary.render(top=3))
        result.runs[str(build)], result.summaries[str(build)] = summary.run_id, summary
        if summary.interrupted and result.interrupted is None:
            result.interrupted = str(build)
    result.runs = {str(b): result.runs[str(b)] for b in builds if str(b) in result.runs}  # build order


def coverage_stage(store: Store, run_ids: Sequence[str], echo: Echo) -> dict[str, str]:
    """Coverage of each run; returns run id -> its exercised share."""
    import torch

    from conformance.catalog import coverage
    from conformance.catalog import overloads as catalog
    from opdb.queries_report import traced_share

    if not store.count("ops", torch_version=torch.__version__):
        store.store_catalog([o.row(torch.__version__) for o in catalog.overloads(with_opinfos=True)])
    shares = {}
    for rid in run_ids:
        counts = coverage.compute(store, rid)
        shares[rid] = coverage.reachable_share(counts)
        echo(f"coverage of {rid}: backend-reachable overloads exercised {shares[rid]}; "
             + ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))
        good, calls = traced_share(store, rid)
        if calls:
            echo(f"  traced model calls giving the CPU's values: {good:,} of {calls:,} ({100 * good / calls:.1f}%), "
                 "each signature weighted by how often the model graphs make it")
    return shares


def claims_stage(store: Store, run_ids: Sequence[str], echo: Echo) -> None:
    """Each run's build against the compatibility table its target publishes, where it publishes
    one (the emulator's shipped builds): a line per run (``conformance claims`` lists them)."""
    from conformance.catalog import claims as cl
    from conformance.datafiles import DataFileError

    header = False
    for rid in run_ids:
        run = store.get_run(rid)
        table = cl.published_table(run["target"], run["build"]) if run else None
        if table is None:
            continue
        if not header:
            echo("== published claims ==")
            header = True
        try:
            report = cl.run_report(store, rid, table)
        except DataFileError as exc:
            echo(f"claims of {run['build']}: the published table is malformed: {exc}")
            continue
        cl.store_report(store, rid, table, report)  # for the report's Claims page
        kinds = ", ".join(f"{k} {report.count(k)}" for k in cl.KINDS if report.count(k))
        echo(f"claims of {run['build']} ({table.name}): {len(report.disagreements)} disagree"
             + (f" ({kinds})" if kinds else "") + f", {report.count('kept')} kept, {report.count('unchecked')} unchecked "
             f"(claim x dtype); conformance claims --db {store.path} --build {rid} {table}")


def _asked(spec: NightlySpec, runs: list[dict]) -> list[str]:
    """How each run's build was asked for (a manifest path stands for its build): the runs are in
    build order."""
    builds = spec.builds or default_builds(spec.run.target)
    return [str(b) for b in builds] if len(builds) == len(runs) else [r["build"] for r in runs]


def dist_stage(store: Store, spec: NightlySpec, run_ids: Sequence[str], echo: Echo) -> str | None:
    """Each build's dist run (run id ``{prefix}-dist-{build}``): a finished one is kept, an
    interrupted one resumed. Returns the build it was interrupted in."""
    from collections import Counter

    from conformance.dist.lane import run_dist
    from opdb import dist as distdb

    assert spec.dist is not None
    runs = [store.get_run(i) for i in run_ids]
    for run, asked in zip(runs, _asked(spec, runs), strict=True):
        run_id = f"{spec.run_id_prefix or 'dist'}-dist-{run['build']}".replace("/", "_")
        stored = distdb.get_run(store, run_id)
        if stored is not None and stored["status"] == "finished":
            echo(f"dist {run['build']}: finished by an earlier session ({run_id})")
            continue
        result = run_dist(dataclasses.replace(spec.dist, target=run["target"], build=asked), store, progress=echo,
                          run_id=run_id)
        counts = Counter(r["status"] for r in result.rows)
        echo(f"dist {run['build']}: {len(result.rows)} items, "
             + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + f" ({run_id})")
        if result.interrupted:
            return run["build"]
    return None


def perf_stage(store: Store, spec: NightlySpec, run_ids: Sequence[str], echo: Echo) -> str | None:
    """Each build's perf run against the build before it (run id ``{prefix}-perf-{build}``): a
    finished one is kept, an interrupted one resumed. Returns the pair it was interrupted in."""
    from conformance.perf.lane import Lane
    from opdb import perf as perfdb

    assert spec.perf is not None
    runs = [store.get_run(i) for i in run_ids]
    asked = _asked(spec, runs)
    for i in range(1, len(runs)):
        base, cand = runs[i - 1], runs[i]
        pair = f"{cand['build']} against {base['build']}"
        run_id = f"{spec.run_id_prefix or 'perf'}-perf-{cand['build']}".replace("/", "_")
        stored = perfdb.get_run(store, run_id)
        if stored is not None and stored["status"] == "finished":
            echo(f"perf {pair}: finished by an earlier session ({run_id})")
            continue
        pspec = dataclasses.replace(spec.perf, target=cand["target"], build=asked[i], baseline_build=asked[i - 1])
        result = Lane(pspec, store, progress=echo).run(run_id, resume=stored is not None)
        regs = len(result.regressions)
        echo(f"perf {pair}: {len(result.rows)} items measured, {regs} regression{'s' * (regs != 1)} ({run_id})")
        if result.interrupted:
            return pair
    return None


def gate_stage(store: Store, run_ids: Sequence[str], echo: Echo, verdicts: list[str] | None = None) -> int:
    """Gate each run against the previous one; returns the worst exit code (``verdicts`` gets
    one line per pair)."""
    from conformance.dist.gate import dist_section
    from conformance.perf.gate import perf_section

    from .core import GateError, run_gate
    from .render import gate_links, summary_lines

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
        cand, base = result.candidate, result.baseline
        perf = perf_section(store, cand["target"], cand["build"], base["build"])
        dist = dist_section(store, cand["target"], cand["build"], base["build"])
        for line in [*lines, *(perf.lines() if perf else ()), *(dist.lines() if dist else ())]:
            echo(line)
        if verdicts is not None:
            verdicts.append(lines[0] + "; " + ", ".join(
                f"{c} {len(result.of(c))}" for c in ("regression", "worsened", "drift", "flaky", "unreproducible")
                if result.of(c)))
        worst = max(worst, 1 if result.verdict == "fail" or (dist and dist.regressions) else 0)
    return worst


def report_stage(store: Store, site: Path, db_label: str, echo: Echo) -> Path:
    from conformance.triage.causes import ensure_latest
    from conformance.triage.upstream import known_by_target
    from reports import render_site

    ensure_latest(store)
    out = render_site(store, site, builds=[], db_label=db_label, upstream=known_by_target())
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
