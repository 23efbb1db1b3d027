"""Items per second of a compiler target with and without batching (conformance.check.batching).

Each configuration is one ``conformance run`` in its own process and its own database, timed
from start to end, with the inductor cache either empty (``cold``: what a new machine, a new
torch or a changed op pays) or warmed by the same configuration's own earlier run (``warm``:
inductor's FX graph cache on disk holds every graph, as on the second night on one machine).
The configurations run one after another in one invocation, so their ratios compare like with
like on a shared machine; the verdicts of every configuration are compared item by item.

    .venv/bin/python benchmarks/compile_batch.py --ops "nn.functional.*" --dtypes float32 --limit-ops 40
    .venv/bin/python benchmarks/compile_batch.py --target inductor --ops sin,add,sum --batches 1,8,16
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _ops(globs: list[str], limit: int | None) -> list[str]:
    sys.path.insert(0, str(ROOT))
    from conformance.select import select_ops

    names = select_ops(globs)
    return names[:limit] if limit else names


def _run(args: argparse.Namespace, ops: list[str], batch: int, cache: Path, db: Path) -> dict:
    cmd = [sys.executable, "-m", "conformance", "run", "--target", args.target, "--db", str(db),
           "--dtypes", args.dtypes, "-n", str(args.workers), "--compile-batch", str(batch), "--quiet", "--exit-zero",
           "--no-schema"]
    if args.variants:
        cmd += ["--variants", args.variants]
    for op in ops:
        cmd += ["--ops", op]
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache))
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode not in (0, 1):
        raise SystemExit(f"run failed ({proc.returncode}): {proc.stderr[-2000:]}")
    conn = sqlite3.connect(db)
    rows = conn.execute("select item_key, status, proof from op_results").fetchall()
    canary = {k for (k,) in conn.execute("select item_key from op_results where variant = 'canary'")}
    verdicts = {k: s for k, s, _ in rows if k not in canary}
    batched = sum(1 for k, _, p in rows if k not in canary and p and '"batch"' in p and '"alone": true' not in p)
    return {"batch": batch, "wall_s": wall, "items": len(verdicts), "batched": batched, "verdicts": verdicts}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="inductor")
    ap.add_argument("--ops", default="nn.functional.*", help="comma-separated OpInfo globs")
    ap.add_argument("--limit-ops", type=int, default=None, help="the first N OpInfos the globs select")
    ap.add_argument("--dtypes", default="float32")
    ap.add_argument("--variants", default=None, help="default: the run's (function,inplace,out,backward)")
    ap.add_argument("--batches", default="1,16", help="--compile-batch values to compare")
    ap.add_argument("-n", "--workers", type=int, default=2)
    ap.add_argument("--warm", action="store_true", help="also run each configuration again on its warmed cache")
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args()
    ops = _ops([g for g in args.ops.split(",") if g], args.limit_ops)
    if not ops:
        raise SystemExit(f"no OpInfo matches {args.ops!r}")
    print(f"{args.target}, {len(ops)} OpInfos ({', '.join(ops[:6])}{', ...' if len(ops) > 6 else ''}), "
          f"{args.dtypes}, {args.workers} workers")
    work = Path(tempfile.mkdtemp(prefix="compile-batch-"))
    results = []
    try:
        for batch in [int(b) for b in args.batches.split(",")]:
            cache = work / f"cache-{batch}"
            for phase in ("cold", "warm") if args.warm else ("cold",):
                r = _run(args, ops, batch, cache, work / f"{batch}-{phase}.sqlite")
                r["phase"] = phase
                results.append(r)
                print(f"  --compile-batch {batch:>3} {phase}: {r['items']} items in {r['wall_s']:.1f} s = "
                      f"{r['items'] / r['wall_s']:.2f} items/s ({r['batched']} from a batch)", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base = results[0]
    for r in results[1:]:
        differ = sorted(k for k in base["verdicts"] if base["verdicts"][k] != r["verdicts"].get(k))
        only = set(base["verdicts"]) ^ set(r["verdicts"])
        print(f"batch {r['batch']} {r['phase']} vs batch {base['batch']} {base['phase']}: "
              f"{base['wall_s'] / r['wall_s']:.2f}x the speed; verdicts differ on {len(differ)} items"
              f"{' (' + ', '.join(differ[:5]) + ')' if differ else ''}; items in one run only: {len(only)}")
    statuses: dict[str, int] = {}
    for s in base["verdicts"].values():
        statuses[s] = statuses.get(s, 0) + 1
    print("statuses:", ", ".join(f"{k} {v}" for k, v in sorted(statuses.items(), key=lambda kv: -kv[1])))
    if args.json:
        Path(args.json).write_text(json.dumps([{k: v for k, v in r.items() if k != "verdicts"} for r in results], indent=1))


if __name__ == "__main__":
    main()
