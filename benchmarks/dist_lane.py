"""The distributed lane's figures (#41): items per build, wall time on this machine, false alarms
on the shipped builds, and the seeded collective defects found.

* **Shipped builds**: every collective x reduce op x dtype x shape at ``--world-sizes`` on each of
  ``--builds``; every failing item is a false alarm (the emulator's backend is correct on them).
* **Seeded**: a build inheriting ``--base`` with a wrong bfloat16 all-reduce at world size 3, a
  hanging uneven all-to-all, an erroring reduce-scatter and a crashing broadcast; and a build whose
  reductions accumulate bfloat16 in bfloat16 (``[distributed] reduce_accumulate = "native"``).
  Each must fail exactly where it was seeded.
* Start-up: one process group per world size serves every item of it; the time to start one and
  the time per item are printed.

Example::

    python benchmarks/dist_lane.py --quick        # one build, world sizes 2 and 3
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from conformance.dist.lane import DistSpec, Group, run_dist  # noqa: E402
from opdb import Store  # noqa: E402

SEEDED = """
[[defects]]
op = "c10d::all_reduce"
kind = "wrong_result"
magnitude = 0.01
dtypes = ["bfloat16"]
world_sizes = [3]

[[defects]]
op = "c10d::reduce_scatter_tensor"
kind = "error"
dtypes = ["float32"]

[[defects]]
op = "c10d::all_to_all_single"
kind = "hang"
world_sizes = [4]
dtypes = ["int64"]
min_numel = 1

[[defects]]
op = "c10d::broadcast"
kind = "crash"
world_sizes = [2]
dtypes = ["bfloat16"]
min_numel = 20
"""
WANT = {  # (collective, dtype, world size, status) the seeded build must fail with, and nothing else
    ("all_reduce", "bfloat16", 3, "mismatch"),
    ("reduce_scatter_tensor", "float32", 2, "error"), ("reduce_scatter_tensor", "float32", 3, "error"),
    ("reduce_scatter_tensor", "float32", 4, "error"),
    ("all_to_all_single", "int64", 4, "timeout"),
    ("broadcast", "bfloat16", 2, "crash"),
}


def run(spec: DistSpec, db: Path) -> tuple[list[dict], float]:
    t0 = time.monotonic()
    with Store.open(db) as st:
        result = run_dist(spec, st, progress=lambda line: print(f"  {line}", file=sys.stderr, flush=True))
    return result.rows, time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--builds", default="2.31.0,2.32.0,2.33.0,ideal")
    ap.add_argument("--world-sizes", default="2,3,4")
    ap.add_argument("--base", default="2.33.0")
    ap.add_argument("--quick", action="store_true", help="One build (the base), world sizes 2 and 3.")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="dist-lane-"))
    db = tmp / "dist.sqlite"
    builds = args.builds.split(",")
    ws = tuple(int(w) for w in args.world_sizes.split(","))
    if args.quick:
        builds, ws = [args.base], (2, 3)
    t0 = time.monotonic()
    g = Group(DistSpec(build=args.base, world_sizes=(ws[-1],)), ws[-1])
    g.start()
    start_s = time.monotonic() - t0
    g.stop()
    print(f"start-up: a world-size {ws[-1]} group on {args.base} starts in {start_s:.1f} s (once per world size "
          "and run; restarted only after a crash, a hang or ranks that disagree)")
    print(f"{'build':<10}{'items':>7}{'pass':>7}{'false alarms':>14}{'wall s':>9}{'ms/item':>9}")
    for b in builds:
        rows, wall = run(DistSpec(build=b, world_sizes=ws), db)
        bad = [r for r in rows if r["status"] not in ("pass", "skip")]
        print(f"{b:<10}{len(rows):>7}{sum(r['status'] == 'pass' for r in rows):>7}{len(bad):>14}{wall:>9.0f}"
              f"{1000 * wall / max(len(rows), 1):>9.0f}")
        for r in bad[:10]:
            print(f"    false alarm: {r['item_key']} {r['status']}: {r['error']}")
    seeded = tmp / "seeded.toml"
    seeded.write_text(f'[build]\nname = "{args.base}-dist"\ninherits = "{args.base}"\n' + SEEDED)
    rows, wall = run(DistSpec(build=str(seeded), world_sizes=ws, timeout_s=10), db)
    got = {(r["collective"], r["dtype"], r["world_size"], r["status"]) for r in rows if r["status"] != "pass"}
    want = {w for w in WANT if w[2] in ws}
    print(f"\nseeded defects ({len(rows)} items, {wall:.0f} s): found {len(got & want)} of {len(want)} seeded "
          f"(collective, dtype, world size) cells, {len(got - want)} failing elsewhere")
    for cell in sorted(want):
        n = Counter(r["status"] for r in rows if (r["collective"], r["dtype"], r["world_size"]) == cell[:3])
        print(f"    {'found' if cell in got else 'MISSED'}: {cell[0]} {cell[1]} world {cell[2]} -> {cell[3]} "
              f"({', '.join(f'{k} {v}' for k, v in sorted(n.items()))})")
    for cell in sorted(got - want):
        print(f"    elsewhere: {cell}")
    native = tmp / "native.toml"
    native.write_text(f'[build]\nname = "{args.base}-native"\ninherits = "{args.base}"\n'
                      '[distributed]\nreduce_accumulate = "native"\n')
    rows, wall = run(DistSpec(build=str(native), world_sizes=ws, collectives=("all_reduce", "reduce_scatter_tensor"),
                              dtypes=("float32", "bfloat16")), db)
    bad = Counter((r["collective"], r["reduce_op"], r["dtype"], r["world_size"]) for r in rows
                  if r["status"] != "pass")
    print(f"\nbfloat16 accumulated in bfloat16 ({len(rows)} items): failing cells "
          + (", ".join(f"{c} {o} {d} world {w} ({n})" for (c, o, d, w), n in sorted(bad.items())) or "none"))
    ok = not (want - got) and not (got - want)
    print(f"dist lane: {'every seeded defect found where seeded, nothing else' if ok else 'NOT as seeded'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
