"""The Ray executor (conformance.run.ray_executor) against the local one: the same rows, statuses
and verdicts on a local Ray; on a simulated cluster of three 1-CPU nodes, a node taken away while
its actor runs a group loses no item and doubles none. Needs the ``ray`` extra (skipped
without it); every test here shares one Ray, in one xdist worker."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from test_hardening_workers import MANIFEST  # noqa: E402 - its crash and hang build

from conformance.run import ray_executor  # noqa: E402
from conformance.run.executor import Work, executor  # noqa: E402
from conformance.run.runner import execute_run  # noqa: E402
from conformance.run.spec import RunSpec  # noqa: E402
from conformance.select import SelectionError  # noqa: E402
from conformance.work import Group  # noqa: E402
from opdb import Store  # noqa: E402

pytestmark = pytest.mark.xdist_group("ray")

TESTS = str(Path(__file__).parent)  # the --import modules of these tests, for Ray's worker processes


def _init(**kw) -> None:
    ray.shutdown()
    ray_executor._IDLE.clear()
    ray.init(runtime_env={"env_vars": {"PYTHONPATH": TESTS}}, log_to_driver=False, include_dashboard=False, **kw)


@pytest.fixture(scope="module", autouse=True)
def _ray_ends_with_the_module():
    yield
    ray.shutdown()
    ray_executor._IDLE.clear()


@pytest.fixture
def local_ray():
    """A Ray on this machine (2 CPUs) whose workers import this folder's modules; started once,
    again after the cluster test replaced it."""
    if not ray.is_initialized() or "PYTHONPATH" not in str(ray.get_runtime_context().runtime_env):
        _init(num_cpus=2)


def _spec(**kw) -> RunSpec:
    base = {"target": "cpu", "dtypes": ("float32",), "workers": 2, "max_samples": 3, "variants": ("function",),
            "contracts": ("none",)}
    return RunSpec(**{**base, **kw})


def _rows(db: Path) -> dict[str, dict]:
    with Store.open(db, create=False) as st:
        return {r["item_key"]: r for r in st.db.query(
            "select item_key, status, error, fingerprint from op_results where variant != 'canary'")}


def test_every_item_is_one_row_and_done_and_only_are_honoured(local_ray):
    rows: list[dict] = []
    groups = [Group("mul", "float32"), Group("neg", "float32")]
    ex = executor(Work(_spec(executor="ray"), "r1", groups), sink=lambda row, table: rows.append(row))
    assert isinstance(ex, ray_executor.RayExecutor)
    summary = ex.run()
    keys = sorted(r["item_key"] for r in rows)
    assert len(keys) == len(set(keys)) == summary.items == 4
    assert all(r["run_id"] == "r1" and r["shard"] == "1/1" and r["recorded_at"] for r in rows)
    assert sorted(g["group_key"] for g in ex.group_times) == ["mul|float32", "neg|float32"]
    mul = [k for k in keys if k.startswith("mul|")]
    again: list[dict] = []
    executor(Work(_spec(executor="ray"), "r1", groups[:1], done={"mul|float32": {mul[0]}}),
             sink=lambda row, _: again.append(row)).run()
    assert sorted(r["item_key"] for r in again) == mul[1:]
    only: list[dict] = []
    executor(Work(_spec(executor="ray"), "r1", groups[:1], only={"mul|float32": frozenset({mul[1]})}),
             sink=lambda row, _: only.append(row)).run()
    assert [r["item_key"] for r in only] == [mul[1]]


def test_verdicts_and_fingerprints_equal_the_local_executors(local_ray, tmp_path):
    # a build with value defects, so that failing verdicts are compared too, not only passes
    spec = RunSpec(target="neuron-emu", build="2.31.0", ops=("nn.functional.gelu", "exp", "cumsum", "sort"),
                   dtypes=("float32", "bfloat16"), variants=("function", "out"), max_samples=4, run_id="same")
    local = execute_run(spec, tmp_path / "local.sqlite")
    on_ray = execute_run(spec.replace(executor="ray"), tmp_path / "ray.sqlite")
    a, b = _rows(tmp_path / "local.sqlite"), _rows(tmp_path / "ray.sqlite")
    assert a == b
    assert local.counts == on_ray.counts and local.failures > 0


@pytest.mark.parametrize(("target", "status", "error"), [
    ("test-die-cpu", "skip", "CPU reference crashed (signal 11 (SIGSEGV)); no verdict for the target"),
    ("test-die-target", "crash", "process died during the item on the target: signal 11 (SIGSEGV)"),
])
def test_a_dying_worker_gives_its_item_the_local_executors_verdict(local_ray, target, status, error):
    rows: list[dict] = []
    spec = _spec(target=target, imports=("dying_targets",), workers=1, executor="ray")
    summary = executor(Work(spec, "r", [Group("mul", "float32"), Group("neg", "float32")]),
                       sink=lambda row, table: rows.append(row)).run()
    by_key = {r["item_key"]: r for r in rows}
    assert len(rows) == len(by_key) == summary.items == 4
    assert (by_key["mul|function|float32|1"]["status"], by_key["mul|function|float32|1"]["error"]) == (status, error)
    assert {r["status"] for k, r in by_key.items() if k != "mul|function|float32|1"} == {"pass"}


def test_device_crash_and_hang_defects_get_the_local_statuses(local_ray, tmp_path):
    manifest = tmp_path / "m.toml"
    manifest.write_text(textwrap.dedent(MANIFEST))
    spec = RunSpec(target="neuron-emu", build=str(manifest), ops=("neg", "reciprocal", "abs"), dtypes=("float32",),
                   variants=("function",), max_samples=2, timeout_s=3.0, run_id="crash-hang")
    execute_run(spec, tmp_path / "local.sqlite")
    execute_run(spec.replace(executor="ray"), tmp_path / "ray.sqlite")
    a, b = _rows(tmp_path / "local.sqlite"), _rows(tmp_path / "ray.sqlite")
    assert {k: r["status"] for k, r in a.items()} == {k: r["status"] for k, r in b.items()}
    assert {r["status"] for k, r in b.items() if k.startswith("neg|")} == {"crash"}
    assert {r["status"] for k, r in b.items() if k.startswith("reciprocal|")} == {"timeout"}


def test_bad_task_resources_and_missing_resources_are_refused(local_ray):
    with pytest.raises(SelectionError, match=r"--task-resources 'neuron_cores': expected NAME=AMOUNT"):
        RunSpec(executor="ray", task_resources=("neuron_cores",))
    ex = executor(Work(_spec(executor="ray", task_resources=("neuron_cores=1",)), "r", [Group("neg", "float32")]),
                  sink=lambda row, table: None)
    with pytest.raises(SelectionError, match=r"no node of the Ray cluster has them"):
        ex.run()


def test_a_node_taken_away_mid_group_loses_no_item_and_doubles_none():
    from ray.cluster_utils import Cluster

    ray.shutdown()
    ray_executor._IDLE.clear()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    nodes = [cluster.add_node(num_cpus=1) for _ in range(3)]
    try:
        _init(address=cluster.address)
        groups = [Group(op, "float32") for op in ("mul", "add", "sub", "exp", "neg", "abs")]
        spec = _spec(target="test-slow-cpu", imports=("slow_targets",), max_samples=6, executor="ray",
                     ray_address=cluster.address)
        rows: list[dict] = []
        removed: list[str] = []
        ex = None

        def sink(row: dict, table: str) -> None:
            rows.append(row)
            if removed or len(rows) < 4:
                return
            busy = [a for a in ex.actors if a.task is not None and a.node]
            victim = next(n for n in nodes if n.node_id == busy[0].node)
            removed.append(busy[0].task.group.key)
            cluster.remove_node(victim)

        ex = executor(Work(spec, "r", groups), sink=sink)
        summary = ex.run()
        keys = [r["item_key"] for r in rows]
        assert removed and ex.lost_tasks >= 1
        assert len(keys) == len(set(keys)) == summary.items
        assert not summary.interrupted
        assert {r["status"] for r in rows} == {"pass"}  # the lost task is nobody's crash
        local: list[dict] = []
        executor(Work(spec.replace(executor="local", imports=(), target="cpu"), "r", groups),
                 sink=lambda row, table: local.append(row)).run()
        assert sorted(keys) == sorted(r["item_key"] for r in local)
        assert sorted(g["group_key"] for g in ex.group_times) == sorted(g.key for g in groups)
        # --task-resources neuron_cores=1: actors only where a Neuron core is, each told which one
        cluster.add_node(num_cpus=1, resources={"neuron_cores": 1})
        cluster.wait_for_nodes()
        rows.clear()
        device = executor(Work(spec.replace(target="cpu", imports=(), task_resources=("neuron_cores=1",)), "d",
                               [Group("neg", "float32"), Group("abs", "float32")]),
                          sink=lambda row, table: rows.append(row))
        device.run()
        assert len(rows) == 2 and {r["status"] for r in rows} == {"pass"}
        idle = ray_executor._IDLE[repr(sorted(device._options().items()))]
        assert len(idle) == 1 and ray.get(idle[0].handle.where.remote())["neuron_cores"] == "0"
    finally:
        ray.shutdown()
        ray_executor._IDLE.clear()
        cluster.shutdown()


def test_an_interrupted_ray_run_resumes_with_nothing_lost_doubled_or_changed(local_ray, tmp_path):
    spec = _spec(target="test-slow-cpu", imports=("slow_targets",), max_samples=6, executor="ray",
                 ops=("mul", "add", "sub", "exp"), run_id="stop-go")
    db = tmp_path / "r.sqlite"

    def stop(line: str) -> None:  # Ctrl-C at the first progress line that shows an item recorded
        if " 0 items" not in line:
            raise KeyboardInterrupt

    first = execute_run(spec, db, progress=stop)
    assert first.interrupted and 0 < first.items
    second = execute_run(spec, db, resume="stop-go")
    assert not second.interrupted
    with Store.open(db, create=False) as st:
        keys = [r["item_key"] for r in st.db.query("select item_key from op_results where variant != 'canary'")]
    execute_run(spec.replace(executor="local", run_id="whole"), tmp_path / "whole.sqlite")
    assert len(keys) == len(set(keys)) == second.items
    assert _rows(db) == _rows(tmp_path / "whole.sqlite")


def test_the_nightly_on_ray_is_the_local_nightly_in_one_queue(local_ray, tmp_path):
    from click.testing import CliRunner

    from conformance.cli import main

    args = ["nightly", "--build", "2.32.0", "--build", "2.33.0", "--ops", "abs", "--ops", "cumsum",
            "--ops", "nn.functional.gelu", "--dtypes", "float32", "--no-models", "--no-schema",
            "--run-id-prefix", "n7"]
    out = {}
    for name in ("local", "ray"):
        r = CliRunner().invoke(main, [*args, "--executor", name, "--db", str(tmp_path / f"{name}.sqlite"),
                                      "--site", str(tmp_path / f"site-{name}")])
        assert r.exit_code in (0, 1), r.output[-2000:]
        assert (tmp_path / f"site-{name}" / "index.html").exists()
        out[name] = r
    assert "in one queue on ray" in out["ray"].output
    assert out["ray"].exit_code == out["local"].exit_code
    gates = [[ln for ln in out[n].output.splitlines() if ln.startswith("gate ")] for n in ("local", "ray")]
    assert gates[0] == gates[1] and gates[0]
    items = []
    for name in ("local", "ray"):
        with Store.open(tmp_path / f"{name}.sqlite") as st:
            items.append(sorted((r["build"], r["item_key"], r["status"], r["fingerprint"]) for r in st.db.query(
                "select runs.build, item_key, op_results.status, fingerprint from op_results join runs on "
                "runs.id = run_id")))
            assert {x["status"] for x in st.runs()} == {"finished"}
    assert items[0] == items[1]
