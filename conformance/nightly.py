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
                     schema=spec.schema, models=spec.models, run_id=run_id)
        echo(f"== {spec.target} build {build}: sweep ==")
        summary = execute_run(rs, db_path, progress=progress)
        if progress is not None:
            echo("")
        echo(summary.render())
        result.runs[build] = summary.run_id
        result.summaries[build] = summary
    if spec.shard != "1/1":
        echo(f"shard {spec.shard} done; merge the shard databases, then run `conformance nightly --finish`")
        return result
    finish(db_path, list(result.runs.values()), spec, result, echo)
    return result


def finish(db_path: str | os.PathLike[str], run_ids: Sequence[str], spec: NightlySpec, result: NightlyResult,
           echo: Callable[[str], None] = print) -> None:
    """The stages after the sweeps: coverage, report, gate."""
    from . import coverage

    with Store.open(db_path) as store:
        for rid in run_ids:
            coverage.compute(store, rid)
    stages = _optional_stages()
    if spec.site and "report" in stages:
        result.site = stages["report"](db_path, spec.site, echo)
    if spec.gate and "gate" in stages and len(run_ids) > 1:
        result.gate_exit = stages["gate"](db_path, run_ids, echo)


def _optional_stages() -> dict[str, Callable[..., object]]:
    stages: dict[str, Callable[..., object]] = {}
    try:
        from .gate import nightly_gate

        stages["gate"] = nightly_gate
    except ImportError:
        pass
    try:
        from reports.render import nightly_report  # type: ignore[attr-defined]

        stages["report"] = nightly_report
    except ImportError:
        pass
    return stages
