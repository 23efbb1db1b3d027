"""How good the progress ETA is, and how much of a nightly's console is progress.

Runs ``conformance nightly`` (arguments after ``--`` pass through) with its console going to a
pipe, as in CI, timestamps every line, then prints per sweep stage the ETA's error at 10%, 25%
and 50% of the stage's wall time (predicted seconds left / seconds that were actually left;
1.0 is exact, the target is within 2x) and the count of progress and other lines.

    python benchmarks/eta_accuracy.py -- --build 2.32.0 --build 2.33.0 --ops "nn.functional.*"

The first build of a new database has no earlier timings (priors per kind, calibrated while it
runs); later builds are priced by the build before them.

``--replay DB`` measures the same without running anything, deterministically: it schedules the
groups of each stored run with 2 workers and the wall times its ``group_times`` recorded, prices
them cold and by every other run, and prints the same error figures (a loaded machine's noise
taken out; what is left is the pricing's own error).
"""

from __future__ import annotations

import argparse
import heapq
import re
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from conformance.run.progress import LINE

DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def seconds(text: str) -> float:
    m = DURATION.match(text)
    if not m or not text:
        raise ValueError(text)
    h, mi, s = (int(x) if x else 0 for x in m.groups())
    return h * 3600 + mi * 60 + s


def parse(line: str) -> tuple[str, float, float | None]:
    """(stage, elapsed s, eta s or None) of a progress line."""
    stage = line[:line.index(" [")]
    tail = line.rsplit(" · ", 1)[1]
    elapsed, _, eta = tail.partition(", eta ")
    return stage, seconds(elapsed), seconds(eta) if eta else None


def simulate(history: dict[str, float], actual: dict[str, float], kinds: dict[str, str], order: list[str],
             workers: int = 2) -> tuple[float, list[float | None]]:
    """Run ``order``'s groups (wall times ``actual``) through the schedule and ETA, priced by
    ``history``; returns the makespan and the ETA / actual-time-left ratio at 10, 25 and 50%."""
    from conformance.run.progress import Eta, Pricer
    from conformance.work import Group

    groups = [Group(*k.rsplit("|", 1), kinds[k]) for k in order]
    eta = Eta(Pricer(history, kinds), workers=workers)
    queue = eta.schedule(groups)
    t, qi, running, samples = 0.0, 0, [], []
    while qi < len(queue) or running:
        while len(running) < workers and qi < len(queue):
            g = queue[qi]
            qi += 1
            heapq.heappush(running, (t + actual[g.key], t, g.key, g))
        end, start, _, g = heapq.heappop(running)
        while t + 1.0 <= end:  # the ETA each second, as the console would show it
            t += 1.0
            if eta.ready():
                now = [(x, t - s) for _, s, _, x in running] + [(g, t - start)]
                samples.append((t, eta.remaining(queue[qi:], now)))
        t = end
        eta.finish(g, actual[g.key])
    ratios: list[float | None] = []
    for frac in (0.10, 0.25, 0.50):
        at = next(((x, e) for x, e in samples if x >= frac * t), None)
        ratios.append(at[1] / (t - at[0]) if at and t > at[0] else None)
    return t, ratios


def replay(db: str) -> int:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    runs: dict[str, list[tuple[str, str, float]]] = {}
    for run, key, kind, wall in con.execute("select run_id, group_key, kind, wall_s from group_times order by rowid"):
        runs.setdefault(run, []).append((key, kind, wall))
    if not runs:
        print(f"{db}: no group_times", file=sys.stderr)
        return 2
    kinds = {k: kind for rows in runs.values() for k, kind, _ in rows}
    print(f"{'run':<48}{'priced by':<20}{'makespan':>9}{'@10%':>7}{'@25%':>7}{'@50%':>7}")
    for run, rows in runs.items():
        actual = {k: w for k, _, w in rows}
        order = [k for k, _, _ in rows]
        for label, other in [("cold", None), *((o, o) for o in runs if o != run)]:
            history = {k: w for k, _, w in runs[other]} if other else {}
            span, ratios = simulate(history, actual, kinds, order)
            cells = "".join(f"{r:>7.2f}" if r is not None else f"{'-':>7}" for r in ratios)
            print(f"{run:<48}{label[-18:]:<20}{span:>8.0f}s{cells}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replay", metavar="DB", help="simulate from the group times stored in DB instead of running")
    ap.add_argument("--db", help="database (default: a new temporary one)")
    ap.add_argument("--log", help="keep the timestamped console here")
    ap.add_argument("nightly_args", nargs="*")
    args = ap.parse_args()
    if args.replay:
        return replay(args.replay)
    tmp = tempfile.mkdtemp(prefix="eta-")
    db = args.db or str(Path(tmp) / "opdb.sqlite")
    cmd = [sys.executable, "-m", "conformance", "nightly", "--db", db, "--site", str(Path(tmp) / "site"),
           *args.nightly_args]
    print("running:", " ".join(cmd), flush=True)
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
    lines: list[tuple[float, str, str]] = []
    lock = threading.Lock()

    def pump(stream, name: str) -> None:
        for ln in stream:
            with lock:
                lines.append((time.monotonic() - start, name, ln.rstrip("\n")))

    threads = [threading.Thread(target=pump, args=(proc.stdout, "out")), threading.Thread(target=pump, args=(proc.stderr, "err"))]
    for t in threads:
        t.start()
    rc = proc.wait()
    for t in threads:
        t.join()
    wall = time.monotonic() - start
    if args.log:
        Path(args.log).write_text("".join(f"{t:9.1f} {n} {ln}\n" for t, n, ln in lines))
    progress = [ln for _, _, ln in lines if LINE.match(ln)]
    other = [ln for _, _, ln in lines if ln.strip() and not LINE.match(ln)]
    print(f"exit {rc}; {wall:.0f} s; console: {len(progress)} progress lines, {len(other)} other lines "
          f"({'fewer' if len(other) < len(progress) else 'NOT fewer'} other than progress)")
    stages: dict[str, list[tuple[float, float | None]]] = {}
    for ln in progress:
        stage, elapsed, eta = parse(ln)
        stages.setdefault(stage, []).append((elapsed, eta))
    print(f"{'stage':<32}{'wall':>8}{'@10%':>8}{'@25%':>8}{'@50%':>8}   (ETA / actual time left)")
    for stage, points in stages.items():
        total = points[-1][0]
        cells = []
        for frac in (0.10, 0.25, 0.50):
            at = next(((e, eta) for e, eta in points if e >= frac * total and eta is not None), None)
            if at is None or total - at[0] <= 0:
                cells.append("-")
                continue
            cells.append(f"{at[1] / (total - at[0]):.2f}")
        print(f"{stage:<32}{total:>7.0f}s" + "".join(f"{c:>8}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
