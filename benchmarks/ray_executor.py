"""The Ray executor against the local one, in one run on this machine:

(a) the same ``conformance run`` (default: the forward sweep, float32, function/inplace/out
    variants, no schema search) with ``--executor local``, ``--executor ray`` (a Ray started by
    the command) and ``--executor ray --ray-address`` a simulated cluster (``ray.cluster_utils``,
    ``--nodes`` nodes of 1 CPU each), each into a fresh database; wall time and ratio to local,
    and whether the three recorded the same verdicts;
(b) the driver's recording throughput: a run whose actors do no work (they yield ready-made rows,
    copied from (a), in the executor's batches) through the real driver loop and the store, so
    that the driver alone is measured (items/s, median of ``--reps``);
(c) on paper, from (a)'s and a model run's measured worker seconds per item: the workers at which
    the driver would become the bottleneck, and the workers (and 2-core nodes) that 100,000 model
    graphs per build in 8 hours need.

Example::

    python benchmarks/ray_executor.py                           # ~6 min on 2 cores
    python benchmarks/ray_executor.py --ops "nn.functional.*"   # a quicker selection
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed_run(db: Path, args: list[str]) -> float:
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "conformance", "run", "--db", str(db), "--exit-zero", "--quiet",
                        "--run-id", "bench", *args], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"conformance run {' '.join(args)} failed ({p.returncode}): {p.stderr[-2000:]}")
    return time.perf_counter() - t


def verdicts(db: Path) -> dict[str, str]:
    con = sqlite3.connect(db)
    return dict(con.execute("select item_key, status from op_results where variant != 'canary'").fetchall())


def per_item_seconds(db: Path, kind: str, table: str) -> float:
    con = sqlite3.connect(db)
    wall = con.execute("select sum(wall_s) from group_times where kind = ?", [kind]).fetchone()[0] or 0.0
    items = con.execute(f"select count(*) from {table}").fetchone()[0] or 1  # noqa: S608 - a table name of ours
    return wall / items


def driver_throughput(rows_db: Path, reps: int) -> tuple[float, int]:
    """Items/s the Ray driver records when its actors yield ready-made rows (no work)."""
    import ray

    from conformance.run import ray_executor as rx
    from conformance.run.executor import Work
    from conformance.run.spec import RunSpec
    from conformance.work import Group
    from opdb import Store

    con = sqlite3.connect(rows_db)
    con.row_factory = sqlite3.Row
    template = [dict(r) for r in con.execute("select * from op_results where variant != 'canary'")]
    for r in template:
        for k in ("id", "run_id", "shard", "recorded_at"):
            r.pop(k, None)
        for k, v in r.items():  # lists and dicts are stored as JSON text; a worker's rows hold values
            if isinstance(v, str) and v[:1] in ("{", "["):
                with contextlib.suppress(ValueError):
                    r[k] = json.loads(v)
    by_group = collections.defaultdict(list)
    for r in template:
        by_group[f"{r['op']}|{r['dtype']}"].append(r)
    groups = [Group(*key.split("|")) for key in by_group]

    @ray.remote(num_cpus=1)
    class Echo:
        def __init__(self, by_group):  # the rows come through the object store, not the class
            self.by_group = by_group

        def run(self, spec, group, done, only, replay):  # GroupRunner.run's signature, no work
            rows = [({**r}, "op_results") for r in self.by_group[group.key]]
            for i in range(0, len(rows), rx.BATCH_ROWS):
                yield rows[i:i + rx.BATCH_ROWS], None
            yield [], {"wall_s": 0.0}

        def where(self):
            return {"node": ray.get_runtime_context().get_node_id()}

    class Driver(rx.RayExecutor):
        def _scale(self, force: bool = False) -> None:
            while len(self.actors) < 2:
                h = Echo.remote(shared)
                self.actors.append(rx._Actor(h, ready=h.where.remote()))

    rates = []
    rx.connect(None)
    shared = ray.put(dict(by_group))
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(reps):
            with Store.open(Path(tmp) / f"d{rep}.sqlite") as store:
                run_id = store.start_run(target="cpu", build="-", torch_version="-", kind="ops", config={})
                ex = Driver(Work(RunSpec(target="cpu", executor="ray"), run_id, groups), store, None)
                ex._scale()
                while any(a.ready is not None for a in ex.actors):  # started before the clock
                    ex._collect(0.5)
                t = time.perf_counter()
                ex.run()
                rates.append(ex.summary.items / (time.perf_counter() - t))
                for idle in rx._IDLE.values():  # they hold the CPUs the next repetition's actors need
                    for a in idle:
                        ray.kill(a.handle)
                rx._IDLE.clear()
    return statistics.median(rates), len(template)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", default=None, help="OpInfo glob (default: every op)")
    ap.add_argument("--dtypes", default="float32")
    ap.add_argument("--variants", default="function,inplace,out")
    ap.add_argument("--build", default="2.33.0")
    ap.add_argument("--nodes", type=int, default=2, help="nodes of the simulated cluster, 1 CPU each")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of the driver measurement")
    args = ap.parse_args()
    sel = ["--build", args.build, "--dtypes", args.dtypes, "--variants", args.variants, "--no-schema", "-n", "2"]
    if args.ops:
        sel += ["--ops", args.ops]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        import ray
        from ray.cluster_utils import Cluster

        walls = {"local": timed_run(tmp / "local.sqlite", [*sel, "--executor", "local"]),
                 "ray (local Ray)": timed_run(tmp / "ray.sqlite", [*sel, "--executor", "ray"])}
        # the driver alone, in this process, before a simulated cluster has been here (ray.init
        # after a cluster's shutdown waits on it)
        rate, rows = driver_throughput(tmp / "local.sqlite", args.reps)
        ray.shutdown()
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
        for _ in range(args.nodes):
            cluster.add_node(num_cpus=1)
        try:
            walls[f"ray ({args.nodes}-node simulated cluster)"] = timed_run(
                tmp / "cluster.sqlite", [*sel, "--executor", "ray", "--ray-address", cluster.address])
        finally:
            cluster.shutdown()
        runs = {name: verdicts(tmp / f"{name}.sqlite") for name in ("local", "ray", "cluster")}
        differ = sorted(k for k in runs["local"] if len({r.get(k) for r in runs.values()}) > 1)
        differ += sorted(set(runs["ray"]) ^ set(runs["local"]) | set(runs["cluster"]) ^ set(runs["local"]))
        print(f"(a) conformance run {' '.join(sel)}: {len(runs['local'])} items; verdicts differing between the "
              f"three: {len(differ)}")
        for k in differ[:5]:
            print(f"    {k}: " + ", ".join(f"{name} {r.get(k)}" for name, r in runs.items()))
        for name, wall in walls.items():
            print(f"    {name:<34} {wall:7.1f} s wall   {wall / walls['local']:.2f}x local")
        print(f"(b) driver records {rate:,.0f} items/s (median of {args.reps}; {rows} ready-made rows, 2 actors, "
              "batches of the executor's size, into a real store)")
        op_s = per_item_seconds(tmp / "local.sqlite", "opinfo", "op_results")
        timed_run(tmp / "models.sqlite", ["--build", args.build, "--models", "mlp", "--models", "resnet", "--model-limit", "2",
                                          "--executor", "local"])
        model_s = per_item_seconds(tmp / "models.sqlite", "model", "model_results")
        with sqlite3.connect(tmp / "models.sqlite") as con:
            graphs = con.execute("select count(distinct model_id) from model_results").fetchone()[0] or 1
            per_graph = model_s * con.execute("select count(*) from model_results").fetchone()[0] / graphs
        print(f"(c) measured worker time: {op_s * 1e3:.2f} ms per OpInfo item, {model_s:.2f} s per model item "
              f"({per_graph:.2f} s per model graph: its eager and compile items)")
        print(f"    the driver is the bottleneck past {rate * op_s:,.0f} workers on OpInfo items and "
              f"{rate * model_s:,.0f} workers on model items (items/s it records x seconds per item)")
        need = 100_000 * per_graph / (8 * 3600)
        print(f"    100,000 model graphs per build in 8 h: {100_000 * per_graph / 3600:,.0f} worker-hours, "
              f"{need:.1f} workers busy all night ({-(-need // 2):.0f} nodes of 2 cores like this one), "
              f"{100_000 * 2 / (8 * 3600):.1f} items/s for the driver")


if __name__ == "__main__":
    main()
