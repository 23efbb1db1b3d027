"""PyTorch's own TestCommon failures on a device, side by side with the harness's findings.

Reads the JSON that ``tools/testcommon_neuron.py --json`` writes (one record per failed
test item: test, op, dtype, device, cause) and one harness run in an opdb database, and answers:
of the op x dtype pairs PyTorch's TestCommon fails on the device (leaving out every test item
that fails the same way on the CPU device: no finding about the device), how many does the
harness flag (some item of that op x dtype with a failing status), per test and overall; which
it does not flag, with TestCommon's cause; and how many op x dtype pairs each contract flags.

Example::

    python tools/testcommon_vs_harness.py --testcommon /work/tc/tc233.json \\
        --db results/contracts.sqlite --run RUN_ID [--list]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

import sqlite_utils

DTYPES = "(dtype set)"  # the dtype of a test_dtypes item, which tests all of an op's dtypes
FAILING = ("xpass", "contract", "unsupported_dtype", "mismatch", "error", "timeout", "crash")


def load_testcommon(path: Path) -> tuple[list[dict], dict]:
    data = json.loads(path.read_text())
    failures = data["failures"] if isinstance(data, dict) else data
    counts = data.get("counts", {}) if isinstance(data, dict) else {}
    return failures, counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--testcommon", required=True, type=Path, nargs="+",
                    help="JSON file(s) of testcommon_neuron.py --json (shards are merged)")
    ap.add_argument("--db", required=True, type=Path)
    ap.add_argument("--run", required=True, help="the harness run id (same build and dtypes)")
    ap.add_argument("--list", action="store_true", help="list every pair the harness does not flag")
    a = ap.parse_args()

    failures: list[dict] = []
    merged_pairs: list[dict] = []
    for p in a.testcommon:
        f, _ = load_testcommon(p)
        failures.extend(f)
        data = json.loads(p.read_text())
        merged_pairs += data.get("device_only", []) if isinstance(data, dict) else []
    on_cpu = {(f["test"], f["op"], f["dtype"]) for f in failures if f.get("device") == "cpu"}
    device = [f for f in failures if f.get("device") != "cpu" and (f["test"], f["op"], f["dtype"]) not in on_cpu]
    excluded = sum(1 for f in failures if f.get("device") != "cpu" and (f["test"], f["op"], f["dtype"]) in on_cpu)

    db = sqlite_utils.Database(a.db)
    if not db.execute("select 1 from runs where id = ?", [a.run]).fetchone():
        sys.exit(f"testcommon_vs_harness: no run {a.run!r} in {a.db}")
    flagged: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    contract_pairs: dict[str, set[tuple[str, str]]] = defaultdict(set)
    ran: set[tuple[str, str]] = set()
    for op, dtype, status, failed in db.execute(
            "select op, dtype, status, contract_failed from op_results where run_id = ? and variant != 'canary'",
            [a.run]).fetchall():
        ran.add((op, dtype))
        if status in FAILING:
            flagged[(op, dtype)][status] += 1
        for c in (failed or "").split(","):
            if c:
                contract_pairs[c].add((op, dtype))

    # test_dtypes is about an op's dtype set, not one dtype: it is covered when the harness finds
    # some dtype of the op unsupported or raising.
    dtype_ops = {op for (op, d) in flagged if {"unsupported_dtype", "error"} & set(flagged[(op, d)])}
    by_test: dict[str, set[tuple[str, str]]] = defaultdict(set)
    causes: dict[tuple[str, str], list[str]] = defaultdict(list)
    for f in device:
        f["dtype"] = f["dtype"] or DTYPES
        by_test[f["test"]].add((f["op"], f["dtype"]))
        causes[(f["op"], f["dtype"])].append(f"{f['test']}: {f.get('cause', '')[:140]}")
    if merged_pairs:  # a --merge file: its own list (CPU xfails left out, test_dtypes by the dtypes it names)
        by_test = defaultdict(set)
        for m in merged_pairs:
            for test in m["tests"]:
                by_test[test].add((m["op"], m["dtype"]))
    pairs = set().union(*by_test.values()) if by_test else set()
    print(f"TestCommon on the device: {len(device)} failed test items on {len(pairs)} op x dtype pairs "
          f"({excluded} more failed the same test on the CPU device too: left out)")
    print(f"{'test':34s} {'pairs':>6s} {'flagged':>8s} {'not run':>8s}")
    for test, ps in sorted(by_test.items()):
        hit = sum(1 for p in ps if p in flagged or (p[1] == DTYPES and p[0] in dtype_ops))
        print(f"{test:34s} {len(ps):6d} {hit:8d} {sum(1 for p in ps if p not in ran):8d}")
    hit = {p for p in pairs if p in flagged or (p[1] == DTYPES and p[0] in dtype_ops)}
    missed = sorted(pairs - hit)
    print(f"{'all':34s} {len(pairs):6d} {len(hit):8d}   covered {100 * len(hit) / max(len(pairs), 1):.1f}%")
    print("\nop x dtype pairs each contract flags in the harness run:")
    for c in ("metadata", "aliasing", "noncontiguous", "variants", "out", "errors", "determinism"):
        inside = len(contract_pairs[c] & pairs)
        print(f"  {c:14s} {len(contract_pairs[c]):5d}  ({inside} of them also failed by TestCommon)")
    only_harness = {p for p in flagged if p not in pairs}
    print(f"harness-flagged op x dtype pairs TestCommon passes: {len(only_harness)}")
    if missed:
        print(f"\nnot flagged by the harness ({len(missed)}):")
        for p in missed if a.list else missed[:40]:
            print(f"  {p[0]} {p[1]}{'' if p in ran else ' [not run by the harness]'}")
            for c in causes[p][:2]:
                print(f"      {c}")


if __name__ == "__main__":
    main()
