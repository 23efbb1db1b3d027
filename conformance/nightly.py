"""The nightly pipeline: for each build (oldest first) run the op sweep, the schema-driven
coverage pass and the model corpus into one opdb; compute coverage; render the site; gate each
build against the previous one. Each stage is a plain function over the store.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from opdb import Store

from .run import RunSpec, Summary, execute_run


@dataclass(frozen=True)
class NightlySpec:
    target: str = "neuron-emu"
    builds: tuple[str, ...] = ()  # default: every build the target ships, oldest first
    ops: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ()
    models: tuple[str, ...] = ("all",)
    model_limit: int | None = None
    schema: bool = True
    workers: int = 2
    shard: str = "1/1"
    run_id_prefix: str | None = None  # shards of one nightly share run ids
    timeout_s: float = 60.0
    max_samples: int | None = None
    site: str | None = "results/site"
    gate: bool = True


@dataclass
class NightlyResult:
    runs: dict[str, str] = field(default_factory=dict)  # build -> run id
    summaries: dict[str, Summary] = field(default_factory=dict)
    gate_exit: int = 0
    site: Path | None = None


def default_builds(target: str) -> tuple[str, ...]:
    from .targets import REGISTRY, get_target

    get_target("cpu")  # loads the registry
    cls = REGISTRY.get(target)
    builds = cls.available_builds() if cls is not None else ()
    return tuple(builds) or ("-",)


def run_nightly(spec: NightlySpec, db_path: str | os.PathLike[str],
                progress: Callable[[str], None] | None = None,
                echo: Callable[[str], None] = print) -> NightlyResult:
    result = NightlyResult()
    builds = spec.builds or default_builds(spec.target)
    for build in builds:
        run_id = f"{spec.run_id_prefix}-{build}" if spec.run_id_prefix else None
        rs = RunSpec(target=spec.target, build=None if build == "-" else build, ops=spec.ops, dtypes=spec.dtypes,
                     workers=spec.workers, shard=spec.shard, timeout_s=spec.timeout_s, max_samples=spec.max_samples,
                     schema=spec.schema, models=spec.models, model_limit=spec.model_limit, run_id=run_id)
        echo(f"== {spec.target} build {build}: sweep ==")
        summary = execute_run(rs, db_path, progress=progress)
        if progress is not None:
            echo("")
        echo(summary.render())
        result.runs[build] = summary.run_id
        result.summaries[build] = summary
    if spec.shard != "1/1":
        echo(f"shard {spec.shard} done; merge the shard databases (conformance merge OUT IN...), then run "
             f"`conformance nightly --finish` on the merged one")
        return result
    finish_stages(db_path, spec, result, echo, run_ids=list(result.runs.values()))
    return result


def _runs_to_finish(store: Store, spec: NightlySpec) -> list[str]:
    """After a merge: the latest finished run of each build, in build order."""
    from opdb.queries import latest_run

    ids = []
    for build in spec.builds or default_builds(spec.target):
        run = latest_run(store, target=spec.target, build=build)
        if run is not None:
            ids.append(run["id"])
    return ids


def finish_stages(db_path: str | os.PathLike[str], spec: NightlySpec, result: NightlyResult,
                  echo: Callable[[str], None] = print, run_ids: Sequence[str] | None = None) -> None:
    """The stages after the sweeps: coverage, report, gate."""
    import torch

    from reports import render_site

    from . import catalog, coverage
    from .gate import nightly_gate

    with Store.open(db_path) as store:
        if not store.count("ops", torch_version=torch.__version__):
            store.store_catalog([o.row(torch.__version__) for o in catalog.overloads(with_opinfos=True)])
        ids = list(run_ids) if run_ids is not None else _runs_to_finish(store, spec)
        for rid in ids:
            counts = coverage.compute(store, rid)
            echo(f"coverage of {rid}: backend-reachable overloads exercised {coverage.reachable_share(counts)}; "
                 + ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    if spec.gate and len(ids) > 1:
        result.gate_exit = nightly_gate(str(db_path), ids, echo)
    if spec.site:
        with Store.open(db_path) as store:
            site = render_site(store, Path(spec.site), builds=[], db_label=str(db_path))
        result.site = Path(spec.site)
        echo(f"report: {site.pages} pages for {len(site.builds)} build(s): {Path(spec.site) / 'index.html'}")
