"""The executor interface (conformance.run.executor): what the runner may count on from any
executor, checked on the local one through the interface alone."""

from __future__ import annotations

import pytest

from conformance.run.executor import EXECUTORS, Executor, Work, executor
from conformance.run.spec import RunSpec
from conformance.work import Group, ItemKey


def _spec(**kw) -> RunSpec:
    return RunSpec(target="cpu", dtypes=("float32",), workers=1, max_samples=3, variants=("function",),
                   contracts=("none",), **kw)


def test_every_item_of_every_group_is_one_row_in_the_sink():
    rows: list[tuple[dict, str]] = []
    groups = [Group("mul", "float32"), Group("neg", "float32")]
    ex = executor(Work(_spec(), "r1", groups), sink=lambda row, table: rows.append((row, table)))
    assert isinstance(ex, Executor)
    summary = ex.run()
    keys = [r["item_key"] for r, _ in rows]
    assert len(keys) == len(set(keys)) == summary.items == 4  # mul: 3 samples, neg: 1
    assert {ItemKey.parse(k).name for k in keys} == {"mul", "neg"}
    assert all(t == "op_results" and r["run_id"] == "r1" and r["shard"] == "1/1" and r["recorded_at"]
               for r, t in rows)
    assert sorted(g["group_key"] for g in ex.group_times) == ["mul|float32", "neg|float32"]


def test_done_items_are_skipped_and_only_runs_just_those():
    group = [Group("mul", "float32")]
    first: list[dict] = []
    executor(Work(_spec(), "r2", group), sink=lambda row, _: first.append(row)).run()
    keys = [r["item_key"] for r in first]
    assert len(keys) == 3
    resumed: list[dict] = []
    executor(Work(_spec(), "r2", group, done={"mul|float32": {keys[0]}}),
             sink=lambda row, _: resumed.append(row)).run()
    assert [r["item_key"] for r in resumed] == keys[1:]
    only: list[dict] = []
    executor(Work(_spec(), "r2", group, only={"mul|float32": frozenset({keys[1]})}),
             sink=lambda row, _: only.append(row)).run()
    assert [r["item_key"] for r in only] == [keys[1]]


def test_an_unknown_executor_is_named_with_the_known_ones():
    assert "local" in EXECUTORS
    with pytest.raises(ValueError, match=r"executor 'nope': unknown \(known: local, ray\)"):
        executor(Work(_spec(), "r3", []), name="nope")
