"""pytest plugin: every op x dtype x variant x sample becomes a pytest item.

``pytest --conformance-target neuron-emu -k "cumsum and bfloat16" -n 2`` collects the op sweep
instead of test files, runs it under pytest-xdist if asked, and writes every result to the same
opdb as ``conformance run``. Only options, hooks and fixtures live here; the sweep code is
imported when the plugin is used.
"""

from __future__ import annotations

import traceback
import uuid
from pathlib import Path
from typing import Any

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("conformance", "operator conformance sweep")
    group.addoption("--conformance-target", default=None, metavar="TARGET",
                    help="Collect the op sweep for TARGET as pytest items (e.g. neuron-emu).")
    group.addoption("--conformance-build", default=None, metavar="BUILD",
                    help="SDK build name or manifest path for the target.")
    group.addoption("--conformance-ops", action="append", default=[], metavar="GLOB",
                    help="OpInfo name globs to collect (repeatable; default all).")
    group.addoption("--conformance-dtypes", default=None, metavar="LIST",
                    help="Comma-separated dtypes (default: the sweep's default set).")
    group.addoption("--conformance-db", default="results/opdb.sqlite", metavar="PATH",
                    help="opdb file the results are written to (default: results/opdb.sqlite).")
    group.addoption("--conformance-max-samples", type=int, default=None, metavar="N",
                    help="At most N samples per op x dtype.")


def _active(config: pytest.Config) -> bool:
    return bool(config.getoption("--conformance-target"))


def pytest_configure(config: pytest.Config) -> None:
    if not _active(config):
        return
    workerinput = getattr(config, "workerinput", None)
    uid = workerinput["testrunuid"] if workerinput else uuid.uuid4().hex
    config._conformance = _Session(config, run_id=f"pytest-{uid[:12]}",
                                   shard=f"xdist-{workerinput['workerid']}" if workerinput else "1/1")


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    if not _active(config):
        return None
    s: _Session = config._conformance
    return [f"conformance: target={s.target_name} build={config.getoption('--conformance-build') or 'default'} "
            f"seed={s.config.seed} db={s.db_path}"]


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    # With a conformance target the session collects the sweep, not test files.
    return True if _active(config) else None


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _active(config):
        return
    s: _Session = config._conformance
    items.extend(s.collect(session))


def pytest_sessionfinish(session: pytest.Session) -> None:
    s = getattr(session.config, "_conformance", None)
    if s is not None:
        s.close()


class _Session:
    """Per-process state: target, sample cache, and the opdb writer."""

    def __init__(self, config: pytest.Config, run_id: str, shard: str) -> None:
        from conformance.sweep.opinfo import SweepConfig

        self.pytest_config = config
        self.target_name = config.getoption("--conformance-target")
        self.db_path = config.getoption("--conformance-db")
        self.run_id, self.shard = run_id, shard
        self.config = SweepConfig(max_samples=config.getoption("--conformance-max-samples"))
        self._target: Any = None
        self._store: Any = None
        self._writer: Any = None
        self._samples: dict[str, list[Any]] = {}

    def target(self) -> Any:
        if self._target is None:
            from conformance.targets import get_target

            self._target = get_target(self.target_name, self.pytest_config.getoption("--conformance-build"))
        return self._target

    def samples(self, op: str, dtype: str, layout: str | None = None) -> list[Any]:
        """The group's samples (a sparse variant's own, for ``layout``)."""
        key = f"{op}|{dtype}|{layout}"
        if key not in self._samples:
            import torch

            from conformance.inputs.opinfo import by_name, samples

            gen = samples(by_name()[op], getattr(torch, dtype), seed=self.config.seed, layout=layout)
            out = []
            for i, s in enumerate(gen):
                if self.config.max_samples is not None and i >= self.config.max_samples:
                    break
                out.append(s)
            self._samples = {key: out}  # keep one group: items of a group run together
        return self._samples[key]

    def collect(self, session: pytest.Session) -> list[pytest.Item]:
        from conformance.inputs.opinfo import by_name
        from conformance.run.kinds import select_groups
        from conformance.sweep import dtypes as dtype_probe
        from conformance.sweep.opinfo import plan, sparse_plan

        dtypes = self.pytest_config.getoption("--conformance-dtypes")
        groups = select_groups(self.pytest_config.getoption("--conformance-ops") or None,
                               dtypes.split(",") if dtypes else None)
        items = []
        for g in groups:
            if dtype_probe.probe_only(by_name()[g.op], g.dtype):
                continue  # a dtype the OpInfo does not claim: no samples to run (its probe is `conformance run`'s)
            try:
                n = len(self.samples(g.op, g.dtype))
            except Exception:  # noqa: BLE001 - a failing generator is reported by `conformance run`
                continue
            for idx in range(n):
                for variant in plan(by_name()[g.op], self.config):
                    items.append(ConformanceItem.from_parent(
                        session, name=f"{g.op}[{variant}-{g.dtype}-{idx}]", op=g.op, variant=variant,
                        dtype=g.dtype, index=idx))
            for layout in sparse_plan(by_name()[g.op], self.config):
                try:
                    n = len(self.samples(g.op, g.dtype, layout))
                except Exception:  # noqa: BLE001 - as above
                    continue
                items.extend(ConformanceItem.from_parent(
                    session, name=f"{g.op}[{layout}-{g.dtype}-{idx}]", op=g.op, variant=layout, dtype=g.dtype,
                    index=idx) for idx in range(n))
        return items

    def record(self, row: dict[str, Any]) -> None:
        if self._writer is None:
            import torch

            from opdb import Store

            Path(self.db_path).parent.mkdir(parents=True, exist_ok=True)
            self._store = Store.open(self.db_path)
            target = self.target()
            self._store.start_run(target=target.name, build=target.build, torch_version=torch.__version__,
                                  config={**self.config.describe(), "via": "pytest"}, run_id=self.run_id,
                                  shard=self.shard)
            self._writer = self._store.writer("op_results")
        from opdb.store import now

        row.update(run_id=self.run_id, shard=self.shard, recorded_at=now())
        self._writer.add(row)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.flush()
            self._store.finish_run(self.run_id, shard=self.shard)
            self._store.close()
            self._writer = None


class ConformanceItem(pytest.Item):
    def __init__(self, *, op: str, variant: str, dtype: str, index: int, **kw: Any) -> None:
        super().__init__(**kw)
        self.op, self.variant, self.dtype, self.index = op, variant, dtype, index
        self.add_marker(pytest.mark.xdist_group(f"{op}|{dtype}"))

    def runtest(self) -> None:
        from conformance.check.verdict import Status
        from conformance.inputs.opinfo import SPARSE_VARIANTS, by_name
        from conformance.sweep.opinfo import evaluate, harness_error
        from conformance.work import Group

        s: _Session = self.config._conformance
        sample = s.samples(self.op, self.dtype, self.variant if self.variant in SPARSE_VARIANTS else None)[self.index]
        try:
            row = evaluate(s.target(), by_name()[self.op], self.op, self.variant, self.dtype, self.index, sample,
                           s.config)
        except Exception as exc:  # the harness failed on this item: recorded as `conformance run` records it
            row = harness_error(Group(self.op, self.dtype), self.variant, self.index, exc, s.config)
            row["error"] = f"{row['error']}\n{traceback.format_exc()}"[:4000]
        s.record(row)
        status = Status(row["status"])
        self.user_properties.append(("status", status.value))
        if status is Status.SKIP:
            pytest.skip(row.get("error") or "skipped")
        if status.failed:
            raise ConformanceFailure(status.value, row.get("error") or "")

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, ConformanceFailure):
            status, detail = excinfo.value.args
            return f"{status}: {detail}"
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[str, int, str]:
        return "conformance", 0, f"{self.op} {self.variant} {self.dtype} sample {self.index}"


class ConformanceFailure(Exception):
    """A failing verdict (mismatch, error, crash, ...)."""
