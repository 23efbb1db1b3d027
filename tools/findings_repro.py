"""Do a run's findings reproduce outside the harness? The hand check of a backend's findings.

Picks up to ``--limit`` failing items of a run (one per op x variant, chosen at random with
``--seed`` across the whole run, or the first in op order with ``--first``; failing statuses only,
canaries left out; ``--not-upstream`` leaves out op x dtype pairs that the upstream expectations
about the run's target already list: PyTorch's for Inductor, ONNX Script's for onnxruntime),
writes each one's standalone script with ``conformance repro`` (torch and the backend only: no
harness code runs in it), runs it in a fresh interpreter, and prints per
finding whether the script reproduces it (exit 1 with a value difference for a mismatch, or the
same exception class for an error: the difference is real, outside the harness; for a layout
or variants contract's finding, a ``STANDALONE:`` line, what torch calls alone show of it: an
output in another layout than the CPU's or one the device's own ops reject, inputs in a layout
the device rejects or computes differently from the CPU on that layout, a variant that differs
from the function), fails some
other way ("other failure": look at it), or not (exit 0: a harness false alarm to fix, or a flaky
one), with the script's last line. Do not edit the harness while it runs: a script holds the
source of the target's functions as the files say at that moment.
Items whose compiler compiled no graph are left out unless ``--with-uncompiled``: they are the
harness's infrastructure errors, not the backend's findings (their script says it compiled no
graph, with dynamo's graph-break reasons, as the item's proof does).

    .venv/bin/python tools/findings_repro.py --db results/inductor.sqlite --run RUN --limit 30 --not-upstream
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sqlite3
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _upstream_pairs(target: str | None) -> set[tuple[str, str]]:
    """The op x dtype pairs the upstream lists about ``target``'s runs name (any list if none is)."""
    sys.path.insert(0, str(ROOT))
    from conformance.triage.upstream import expectations

    facts = [e for e in expectations() if e.device == "cpu"]
    mine = [e for e in facts if target in e.source.targets]
    return {(e.op, e.dtype) for e in (mine or facts)}


NOT_COMPILED = "infra: the compiler target compiled no graph"


def _findings(db: Path, run: str, limit: int, not_upstream: bool, statuses: tuple[str, ...],
              compiled_only: bool = True, seed: int | None = 0) -> list[dict]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    marks = ",".join("?" * len(statuses))
    rows = conn.execute(f"select id, op, variant, dtype, sample, status, error from op_results where run_id = ? "
                        f"and variant != 'canary' and status in ({marks}) order by op, variant, sample",
                        [run, *statuses]).fetchall()
    target = conn.execute("select target from runs where id = ?", [run]).fetchone()
    known = _upstream_pairs(target[0] if target else None) if not_upstream else set()
    out, seen = [], set()
    for r in rows:
        if (r["op"], r["dtype"]) in known or (r["op"], r["variant"]) in seen:
            continue
        if compiled_only and (r["error"] or "").startswith(NOT_COMPILED):
            continue  # dynamo compiled nothing (its graph-break reasons are in the proof): no value to check
        seen.add((r["op"], r["variant"]))
        out.append(dict(r))
    if seed is not None and len(out) > limit:
        out = sorted(random.Random(seed).sample(out, limit), key=lambda r: (r["op"], r["variant"]))
    return out[:limit]


def _same_failure(row: dict, said: str, text: str = "") -> str:
    """"reproduced" when the script fails as the item did: a value difference for a mismatch, the
    same exception class for an error; "other failure" when it fails some other way (a script that
    dies of its own NameError reproduces nothing). The sweep words a compiler's failure as
    ``TargetError: backend ... failed to compile a graph: INNER: ...``; the script raises torch's
    ``BackendCompilerFailed`` around the same INNER (``text``: what the script printed)."""
    if row["status"] == "mismatch":
        return "reproduced" if said.startswith("MISMATCH:") else "other failure"
    if row["status"] != "error":
        return "reproduced"
    if not said.startswith("target raised:"):
        return "other failure"
    error = row["error"] or ""
    inner = re.search(r"failed to compile a graph: (\w+):", error)
    harness = inner or re.match(r"(\w+):", error)
    if harness is None:
        return "reproduced"
    script = said.removeprefix("target raised:").split()[:1]
    if script == [harness.group(1)]:
        return "reproduced"
    after = text[text.find(said):]
    if inner and script == ["BackendCompilerFailed"]:
        # the same cause: its class, or its words (a target's own wrapper, e.g. openvino's
        # "TargetError: OpenVINO failed to convert the graph", is a RuntimeError in the script)
        words = error[inner.end():].strip()[:60]
        if re.search(rf"\b{inner.group(1)}\b", after) or (words and words in after):
            return "reproduced"
    return "other failure"


def write_scripts(db: Path, rows: list[dict], where: Path) -> dict[int, tuple[Path | None, str]]:
    """Each row's standalone script, written by one ``conformance repro`` call for all of them
    (torch and the target load once): {id: (script, "") or (None, why there is none)}."""
    ids = [int(r["id"]) for r in rows]
    if not ids:
        return {}
    made = subprocess.run([sys.executable, "-m", "conformance", "repro", *map(str, ids), "--db", str(db),
                           "--out", str(where)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300 + 30 * len(ids))
    said = (made.stderr or made.stdout).strip().splitlines()
    out: dict[int, tuple[Path | None, str]] = {}
    for rid in ids:
        script = where / f"repro_{rid}.py"
        if script.exists() and f"wrote {script}" in made.stdout:
            out[rid] = (script, "")
        else:  # its own line ("error: result N: ..."), or the call's last one (a crash)
            own = next((ln for ln in said if f"result {rid}:" in ln), said[-1] if said else f"exit {made.returncode}")
            out[rid] = (None, own.removeprefix("error: ")[:160])
    return out


def run_script(row: dict, script: Path, where: Path) -> tuple[str, str]:
    """Run one repro script in a fresh interpreter: (outcome, what it said)."""
    try:
        ran = subprocess.run([sys.executable, str(script)], cwd=where, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return "reproduced", "timed out (600 s)"
    text = ran.stdout + ran.stderr
    last = [ln for ln in text.strip().splitlines() if ln.strip()][-1:] or [""]
    said = next((ln for ln in text.splitlines() if ln.startswith(("MISMATCH:", "target raised:"))), last[0])
    if ran.returncode == 1 and said.startswith(("MISMATCH:", "target raised:")):
        return _same_failure(row, said, text), said[:160]
    shown = next((ln for ln in text.splitlines() if ln.startswith("STANDALONE:")), None)
    if ran.returncode == 1 and shown:  # a contract's finding shown with torch alone
        return "reproduced", shown[:160]
    if ran.returncode == 1:  # only a contract the script checks with harness code failed
        return "contract only", last[0][:160]
    if ran.returncode == 0:
        return "not reproduced", last[0][:160]
    if ran.returncode < 0 or ran.returncode > 128:
        return "reproduced", f"the script died (exit {ran.returncode}): {last[0][:120]}"
    return "script error", f"exit {ran.returncode}: {last[0][:140]}"


def reproduce_many(db: Path, rows: list[dict], where: Path, jobs: int = 1,
                   batch: int = 40) -> Iterator[tuple[dict, str, str]]:
    """(row, outcome, what the script said) for each row, as each script finishes: the scripts
    are written ``batch`` rows to a ``conformance repro`` call and run ``jobs`` at a time, each in
    a fresh interpreter (``no script`` where none could be written)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for i in range(0, len(rows), batch):
            part = rows[i:i + batch]
            scripts = write_scripts(db, part, where)
            futures = []
            for row in part:
                script, why = scripts[int(row["id"])]
                if script is None:
                    yield row, "no script", why
                else:
                    futures.append((row, pool.submit(run_script, row, script, where)))
            for row, fut in futures:
                outcome, said = fut.result()
                yield row, outcome, said


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", required=True, type=Path)
    ap.add_argument("--run", required=True)
    ap.add_argument("--limit", type=int, default=30)
    ap.add_argument("--not-upstream", action="store_true", help="leave out op x dtype pairs upstream already lists")
    # contract findings are left out by default: their scripts check the contract with harness code
    ap.add_argument("--statuses", default="mismatch,error,crash,timeout,unsupported_dtype,unsupported_layout")
    ap.add_argument("--with-uncompiled", action="store_true",
                    help="also items whose compiler compiled no graph (infrastructure errors, not findings)")
    ap.add_argument("--seed", type=int, default=0, help="which findings the random choice takes")
    ap.add_argument("--first", action="store_true", help="the first findings in op order, not a random choice")
    ap.add_argument("--jobs", type=int, default=1, help="scripts run at a time, each in its own interpreter")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = _findings(args.db, args.run, args.limit, args.not_upstream, tuple(args.statuses.split(",")),
                     compiled_only=not args.with_uncompiled, seed=None if args.first else args.seed)
    print(f"{len(rows)} findings of run {args.run} (one per op x variant, {'the first in op order' if args.first else f'seeded choice {args.seed}'}{', not listed upstream' if args.not_upstream else ''})")
    counts: Counter[str] = Counter()
    results = []
    with tempfile.TemporaryDirectory(prefix="findings-") as tmp:
        for row, outcome, said in reproduce_many(args.db, rows, Path(tmp), args.jobs):
            counts[outcome] += 1
            results.append({**row, "outcome": outcome, "script_said": said})
            err = re.sub(r"\s+", " ", row["error"] or "")[:70]
            print(f"  {row['id']:>7} {row['op']:34s} {row['variant']:9s} {row['status']:9s} {outcome:15s} {said[:80]}"
                  f"\n          harness: {err}", flush=True)
    print("outcomes:", ", ".join(f"{k} {v}" for k, v in counts.most_common()))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
