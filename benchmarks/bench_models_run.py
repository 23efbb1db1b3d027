"""Benchmark model items on a target: graphs per minute and the projected time of the corpus.

Two profiles over a deterministic sample (``--per-family`` graphs of every family, float32):

* ``eager``: the eager forward+backward parity item (build, trace for the op histogram/hash,
  CPU and device forward+backward, op trace, compare; one training step, no latency timing);
* ``full``: the whole per-graph protocol (eager + compile items, float32 + bfloat16, 3 SGD steps,
  latency, shape sweep with recompiles, localization of failures).

Work is split across ``--workers`` forked processes (one thread each), like ``conformance.run``.
``--calibrate`` instead prints the normwise errors behind ``conformance/data/model_tolerances.toml``.

Usage:
    python3 benchmarks/bench_models_run.py                       # neuron-emu 2.33.0, 2 per family, 2 workers
    python3 benchmarks/bench_models_run.py --profile eager --per-family 6
    python3 benchmarks/bench_models_run.py --calibrate --build 2.33.0 --per-family 2
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import multiprocessing as mp
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _setup() -> None:
    warnings.filterwarnings("ignore")
    import logging

    import torch

    torch.set_num_threads(1)
    logging.getLogger("torch._dynamo").setLevel(logging.ERROR)


def _work(args: tuple[str, str | None, list[tuple[str, str]], str]) -> list[dict[str, Any]]:
    target_name, build, groups, profile = args
    _setup()
    from conformance.models.runner import run_model_group
    from conformance.sweep.opinfo import SweepConfig
    from conformance.targets import get_target
    from conformance.work import Group

    target = get_target(target_name, build)
    config = SweepConfig()
    kw: dict[str, Any] = ({"modes": ("eager",), "train_steps": 1, "timed_iters": 0, "localize_failures": False}
                          if profile == "eager" else {})
    out = []
    for model_id, dtype in groups:
        t0 = time.perf_counter()
        rows = list(run_model_group(target, Group(model_id, dtype, "model"), config, **kw))
        out.append({"model_id": model_id, "dtype": dtype, "s": time.perf_counter() - t0,
                    "statuses": [r["status"] for r in rows]})
    return out


def sample(per_family: int, families: list[str] | None, dtypes: tuple[str, ...]) -> list[tuple[str, str]]:
    """``per_family`` graphs evenly spaced over each family's grid (grids run small to large)."""
    from conformance.models.registry import FAMILIES, enumerate_graphs

    out = []
    for fam in families or list(FAMILIES):
        specs = list(enumerate_graphs([fam]))
        n = min(per_family, len(specs))
        picks = [specs[round(i * (len(specs) - 1) / max(1, n - 1))] for i in range(n)] if n > 1 else specs[:n]
        out += [(s.model_id, d) for s in picks for d in dtypes if d == "float32" or s.supports_bf16]
    return out


def bench(target: str, build: str | None, profile: str, per_family: int, workers: int,
          families: list[str] | None = None) -> dict[str, Any]:
    from conformance.models.registry import enumerate_graphs

    dtypes = ("float32",) if profile == "eager" else ("float32", "bfloat16")
    groups = sample(per_family, families, dtypes)
    graphs = len({m for m, _ in groups})
    chunks = [groups[i::workers] for i in range(workers)]
    t0 = time.perf_counter()
    with mp.get_context("fork").Pool(workers) as pool:
        results = [r for part in pool.map(_work, [(target, build, c, profile) for c in chunks]) for r in part]
    wall = time.perf_counter() - t0
    statuses = collections.Counter(s for r in results for s in r["statuses"])
    corpus = sum(1 for _ in enumerate_graphs())
    per_min = graphs / wall * 60
    slowest = sorted(results, key=lambda r: -r["s"])[:5]
    return {"target": target, "build": build, "profile": profile, "workers": workers, "graphs": graphs,
            "groups": len(groups), "wall_s": round(wall, 2), "graphs_per_min": round(per_min, 1),
            "corpus_graphs": corpus, "projected_corpus_min": round(corpus / per_min, 1),
            "statuses": dict(statuses), "slowest": [(r["model_id"], r["dtype"], round(r["s"], 2)) for r in slowest]}


def calibrate(target_name: str, build: str | None, per_family: int, families: list[str] | None) -> None:
    """Normwise forward / gradient / loss errors of clean graphs (what the floors must exceed)."""
    _setup()
    import torch

    from conformance.models import runner as R
    from conformance.models.item import prepare
    from conformance.models.localize import rel_l2
    from conformance.models.training import cast, train_side
    from conformance.targets import get_target

    target = get_target(target_name, build)
    for model_id, dtype_name in sample(per_family, families, ("float32", "bfloat16")):
        prep = prepare(model_id)
        dtype = getattr(torch, dtype_name)
        inputs = cast(prep.inputs, dtype)
        try:
            cm = copy.deepcopy(prep.model).to(dtype)
            c = train_side(prep.spec, cm, cm, inputs, None, R.TRAIN_STEPS, 0)
            tm = copy.deepcopy(prep.model).to(dtype).to(target.device)
            t = train_side(prep.spec, tm, tm, target.to_device(inputs), target, R.TRAIN_STEPS, 0)
        except Exception as exc:  # noqa: BLE001
            print(f"{model_id:45s} {dtype_name:9s} error {type(exc).__name__}: {str(exc)[:80]}")
            continue
        tol = R.ModelTolerance(1.0, 1e9, 1.0, 0.0, 0.0, "")
        _, g, _ = R.grad_evidence(c.grads or {}, t.grads or {}, tol)
        loss = max(abs(a - b) / max(abs(a), 1.0) for a, b in zip(c.losses or [], t.losses or [], strict=True))
        print(f"{model_id:45s} {dtype_name:9s} fwd {rel_l2(c.out, t.out):.2e} grad {g:.2e} loss {loss:.2e}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="neuron-emu")
    ap.add_argument("--build", default="2.33.0")
    ap.add_argument("--profile", choices=("eager", "full", "both"), default="both")
    ap.add_argument("--per-family", type=int, default=2)
    ap.add_argument("--families", nargs="*")
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--calibrate", action="store_true")
    a = ap.parse_args(argv)
    build = None if a.build in ("", "-") else a.build
    if a.calibrate:
        calibrate(a.target, build, a.per_family, a.families)
        return 0
    for profile in (("eager", "full") if a.profile == "both" else (a.profile,)):
        print(json.dumps(bench(a.target, build, profile, a.per_family, a.workers, a.families)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
