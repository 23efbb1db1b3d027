"""Benchmark the model-graph corpus: spec counts, distinct ATen-graph hashes, tracing time,
and eager CPU forward+backward throughput.

Usage:
    python3 benchmarks/bench_models.py                    # whole corpus
    python3 benchmarks/bench_models.py --families gpt moe --limit 40
    python3 benchmarks/bench_models.py --compare-export 3  # make_fx vs torch.export per family

Example (programmatic):
    >>> from benchmarks.bench_models import run
    >>> stats = run(["mlp"], limit=4, train_every=2, quiet=True)
    >>> stats["distinct_hashes"]
    4
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from conformance.models.registry import FAMILIES, GraphSpec, enumerate_graphs  # noqa: E402
from conformance.models.tracing import hash_graph, trace  # noqa: E402


def train_step_seconds(spec: GraphSpec) -> float:
    """Wall time of build + inputs + eager forward + loss + backward."""
    t0 = time.perf_counter()
    model = spec.build()
    spec.loss(model(*spec.example_inputs())).backward()
    return time.perf_counter() - t0


def compare_export(per_family: int) -> dict[str, dict[str, float]]:
    """Median trace seconds per family for make_fx (fake) vs torch.export + run_decompositions."""
    out: dict[str, dict[str, float]] = {}
    for fam in FAMILIES:
        times: dict[str, list[float]] = defaultdict(list)
        for spec in enumerate_graphs([fam], limit=per_family):
            model, inputs = spec.build(), spec.example_inputs()
            for method in ("make_fx", "export"):
                t0 = time.perf_counter()
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        trace(model, inputs, method=method)
                except Exception:  # noqa: BLE001 - record, do not abort the benchmark
                    continue
                times[method].append(time.perf_counter() - t0)
        out[fam] = {m: statistics.median(v) for m, v in times.items() if v}
    return out


def run(
    families: list[str] | None = None, limit: int | None = None, train_every: int = 1, quiet: bool = False
) -> dict[str, Any]:
    """Enumerate, hash and (every ``train_every``-th spec) train-step the corpus; returns the figures."""
    log = (lambda *a: None) if quiet else (lambda *a: print(*a, flush=True))
    torch.set_num_threads(1)
    specs = list(enumerate_graphs(families, limit))
    counts = Counter(s.family for s in specs)
    hashes: dict[str, set[str]] = defaultdict(set)
    failures: list[str] = []
    t0 = time.perf_counter()
    for spec in specs:
        try:
            hashes[spec.family].add(hash_graph(spec.trace()))
        except Exception as exc:  # noqa: BLE001
            failures.append(f"{spec.model_id}: {type(exc).__name__}: {exc}"[:300])
    hash_s = time.perf_counter() - t0
    all_hashes = set().union(*hashes.values()) if hashes else set()
    steps: dict[str, list[float]] = defaultdict(list)
    for spec in specs[::train_every]:
        steps[spec.family].append(train_step_seconds(spec))
    all_steps = [t for v in steps.values() for t in v]
    median = statistics.median(all_steps) if all_steps else float("nan")
    log(f"{'family':<10} {'specs':>6} {'hashes':>7} {'fwd+bwd ms (median)':>20}")
    for fam in counts:
        ms = statistics.median(steps[fam]) * 1e3 if steps[fam] else float("nan")
        log(f"{fam:<10} {counts[fam]:>6} {len(hashes[fam]):>7} {ms:>20.1f}")
    log(f"specs: {len(specs)}  distinct hashes: {len(all_hashes)}  trace failures: {len(failures)}")
    log(f"enumerate+trace+hash: {hash_s:.1f} s ({hash_s / max(len(specs), 1) * 1e3:.1f} ms/graph)")
    log(f"eager fwd+bwd (build included), {len(all_steps)} graphs: median {median * 1e3:.1f} ms "
        f"-> {60 / median:.0f} graphs/min; total {sum(all_steps):.1f} s")  # fmt: skip
    for f in failures[:10]:
        log("FAIL", f)
    return {
        "specs": len(specs),
        "per_family": {f: {"specs": counts[f], "hashes": len(hashes[f])} for f in counts},
        "distinct_hashes": len(all_hashes),
        "hash_seconds": hash_s,
        "train_median_ms": median * 1e3,
        "graphs_per_min": 60 / median,
        "failures": failures,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", nargs="*", default=None)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--train-every", type=int, default=1, help="train-step only every N-th spec")
    ap.add_argument(
        "--compare-export", type=int, default=0, metavar="N", help="specs per family for make_fx vs export"
    )
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.compare_export:
        for fam, t in compare_export(args.compare_export).items():
            print(f"{fam:<10} " + "  ".join(f"{m} {s * 1e3:.0f} ms" for m, s in t.items()), flush=True)
        return 0
    stats = run(args.families, args.limit, args.train_every)
    if args.json:
        args.json.write_text(json.dumps(stats, indent=1))
    return 1 if stats["failures"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
