"""PyTorch's own TestCommon on the device against the harness, per build: the recall, every miss
with its cause, and every harness-only finding reproduced standalone or called a false alarm.

For each build (default the three shipped ones and ``ideal``):

1. **TestCommon.** ``tools/testcommon_neuron.py`` runs PyTorch's device-generic TestCommon tests
   (test_compare_cpu, test_out, test_out_warning, test_noncontiguous_samples,
   test_variant_consistency_eager, test_dtypes) over the whole OpInfo database on the ``neuron``
   device *and* on the CPU device (``--cpu-too``). A pair op x dtype is a **TestCommon failure on
   the device** when some test fails on ``neuron`` that the same op and dtype neither fail nor xfail
   (an OpInfo's expected failure) on the CPU: a test that fails on the CPU too says nothing about
   the device.
2. **The harness.** One ``conformance run`` of the build: the OpInfo sweep (every OpInfo, the same
   dtypes, default contracts and budget), with every op's ``reference_inputs`` (``--reference-inputs
   all``; the nightly sweeps a rotating slice of them), no schema search (TestCommon has none).
3. **Recall.** Of the TestCommon failures on the device, the share the harness gives a non-pass
   verdict to (some item of that op x dtype fails: mismatch, error, crash, timeout, contract,
   unsupported dtype or layout, xpass), per test and overall; each pair it misses, with
   TestCommon's cause and the harness's statuses for that pair.
4. **Harness-only findings.** Pairs the harness flags where TestCommon ran the op x dtype on the
   device and passed every test (and the CPU device failed none of them). One failing item per
   pair (the first, by id; a value or error finding before a contract one) is written out as a
   standalone script with ``conformance repro`` and run in a fresh interpreter
   (``tools/findings_repro.py``): ``reproduced`` (the difference is real, outside the harness: a
   value difference, the same exception, or for a layout or variants contract what torch calls
   alone show),
   ``contract only`` (the script's harness-side contract re-check failed: real by the contract's own
   evidence), ``not reproduced`` (a false alarm to fix), or another outcome to look at.

The scripts are written about forty to a ``conformance repro`` call and run two at a time
(``--jobs``), each in a fresh interpreter: 3-4 s a finding on 2 cores.

Everything is kept in ``--work`` and reused, so an interrupted benchmark resumes where it stopped:
TestCommon's JSON per build, the harness's runs (``--resume`` of an interrupted one), the repro
outcomes. The CPU device's TestCommon results are the same for every build: the first build runs
them, the others reuse them. Cost on 2 cores (``-n 2``): TestCommon ~40 minutes for the first build
(both devices), less for the others; the harness sweep ~10 minutes.

Example (the whole figure; ``--builds 2.33.0`` for one build)::

    python benchmarks/testcommon_recall.py --work /tmp/tcr --builds 2.31.0,2.32.0,2.33.0,ideal
    python benchmarks/testcommon_recall.py --work /tmp/tcr --ops 'nn.functional.max_pool*,rsqrt,mvlgamma'

Prints per build ``recall B: H of N TestCommon failures on the device (P%)``, per test and
contract, the misses, and ``harness-only B: ...`` with the outcomes; writes ``--work/recall.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

#: Statuses that are a non-pass verdict on an item.
FAILING = ("xpass", "contract", "unsupported_dtype", "unsupported_layout", "mismatch", "error", "timeout", "crash")
#: Which failing item of a pair is reproduced first: a value or error finding before a contract one.
REPRO_ORDER = {"mismatch": 0, "error": 1, "crash": 2, "timeout": 3, "unsupported_dtype": 4, "unsupported_layout": 5,
               "xpass": 6, "contract": 7}
TESTS = ("test_compare_cpu", "test_out", "test_out_warning", "test_noncontiguous_samples",
         "test_variant_consistency_eager", "test_dtypes")
CONTRACTS = ("metadata", "aliasing", "noncontiguous", "variants", "out", "errors", "determinism")


def _say(msg: str) -> None:
    print(msg, flush=True)


def _cpu_part(work: Path) -> Path | None:
    """The CPU device's TestCommon results, kept from the first build run with ``--cpu-too``: they
    do not depend on the build (the CPU device never calls the emulator), so later builds run the
    tests on ``neuron`` only and are merged with these."""
    cpu = work / "tc-cpu.json"
    if cpu.exists():
        return cpu
    for raw in sorted(work.glob("tc-*.raw.json")):
        d = json.loads(raw.read_text())
        if d.get("cpu_too"):
            mine = {k: [f for f in d.get(k, []) if f["device"] == "cpu"] for k in ("failures", "xfailed", "passed")}
            counts = {kind: {"cpu": c["cpu"]} for kind, c in d["counts"].items() if "cpu" in c}
            cpu.write_text(json.dumps({**{k: d[k] for k in ("build", "dtypes", "dtype_policy", "ops", "shard")},
                                       "cpu_too": True, "timed_out": d["timed_out"], "wall_s": 0.0,
                                       "counts": counts, **mine}, indent=1) + "\n")
            return cpu
    return None


def testcommon(build: str, work: Path, dtypes: str, ops: str, jobs: int) -> dict:
    """TestCommon's merged JSON for ``build`` (run once, then read from ``work``)."""
    merged = work / f"tc-{build}.json"
    if merged.exists():
        return json.loads(merged.read_text())
    raw_json, log = work / f"tc-{build}.raw.json", work / f"tc-{build}.log"
    tool = str(ROOT / "tools" / "testcommon_neuron.py")
    cpu = _cpu_part(work)
    if not raw_json.exists():
        _say(f"  TestCommon on {build} (whole op_db{'' if not ops else ': ' + ops}, "
             f"{'neuron device; the CPU device kept from an earlier build' if cpu else 'neuron and cpu devices'}) ...")
        t0 = time.monotonic()
        cmd = [sys.executable, tool, "--build", build, "--dtypes", dtypes, *([] if cpu else ["--cpu-too"]),
               "--json", str(raw_json), "--raw", str(log), *(["--ops", ops] if ops else []), "--", "-n", str(jobs)]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if done.returncode not in (0, 1) or not raw_json.exists():
            sys.exit(f"testcommon_recall: TestCommon on {build} failed (exit {done.returncode}): "
                     f"{(done.stderr or done.stdout).strip()[-600:]}")
        _say(f"  TestCommon on {build}: {time.monotonic() - t0:.0f} s")
    cpu = cpu or _cpu_part(work)
    if cpu is None:
        sys.exit(f"testcommon_recall: no CPU device results in {work}: run one build with --cpu-too first")
    ins = [str(raw_json)] + ([str(cpu)] if not json.loads(raw_json.read_text()).get("cpu_too") else [])
    done = subprocess.run([sys.executable, tool, "--merge", str(merged), *ins], cwd=ROOT,
                          capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"testcommon_recall: merging {raw_json}: {(done.stderr or done.stdout).strip()[-400:]}")
    return json.loads(merged.read_text())


def harness(build: str, db: Path, dtypes: str, ops: str, jobs: int, extra: list[str]) -> str:
    """The harness run of ``build`` in ``db`` (run, resumed or reused), its id."""
    run_id = f"tc-recall-{build}"
    status = None
    if db.exists():
        with sqlite3.connect(db) as con:
            row = con.execute("select status from runs where id = ?", [run_id]).fetchone()
            status = row[0] if row else None
    if status == "finished":
        return run_id
    _say(f"  harness on {build} ({'resumed' if status else 'OpInfo sweep'}) ...")
    t0 = time.monotonic()
    cmd = [sys.executable, "-m", "conformance", "run", "--build", build, "--no-schema", "--dtypes", dtypes,
           "--reference-inputs", "all", "--quiet", "--exit-zero", "--db", str(db), "--workers", str(jobs),
           *(["--resume", run_id] if status else ["--run-id", run_id]),
           *[x for name in _full_names(ops) for x in ("--ops", name)], *extra]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"testcommon_recall: the harness run of {build} failed (exit {done.returncode}): "
                 f"{(done.stderr or done.stdout).strip()[-600:]}")
    _say(f"  harness on {build}: {time.monotonic() - t0:.0f} s")
    return run_id


def _full_names(ops: str) -> list[str]:
    """The OpInfos' full names (``name.variant``) that ``--ops`` selects, as TestCommon selects
    them: by name or by full name."""
    if not ops:
        return []
    from torch.testing._internal.common_methods_invocations import op_db

    want = {o.strip() for o in ops.split(",") if o.strip()}
    names = [(o.name, o.name + ("." + o.variant_test_name if o.variant_test_name else "")) for o in op_db]
    return sorted({full for name, full in names if name in want or full in want})


def _pairs_of(items: list[dict]) -> set[tuple[str, str | None]]:
    return {(f["op"], f["dtype"]) for f in items}


def compare(tc: dict, db: Path, run: str) -> dict:
    """Recall, misses, contracts and harness-only pairs of one build."""
    by_test: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for m in tc["device_only"]:
        for test in m["tests"]:
            by_test[test].add((m["op"], m["dtype"]))
    device_only = set().union(*by_test.values()) if by_test else set()
    causes: dict[tuple[str, str], list[str]] = defaultdict(list)
    for f in tc["failures"]:
        if f["device"] == "neuron":
            for p in ([(f["op"], f["dtype"])] if f["test"] != "test_dtypes" else
                      [(f["op"], d) for (o, d) in device_only if o == f["op"]]):
                causes[p].append(f"{f['test']}: {f['cause'][:160]}")
    # pairs TestCommon ran on the device (a test passed, failed or xfailed there) and those the CPU
    # device failed or xfailed (a harness finding there may be the CPU's own matter)
    ran_tc = _pairs_of(tc.get("passed", []) + tc["failures"] + tc["xfailed"])
    ran_tc = {p for p in ran_tc if p[1] is not None}
    cpu_bad = {(f["op"], f["dtype"]) for f in tc["failures"] + tc["xfailed"] if f["device"] == "cpu"}

    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    statuses: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    contract_pairs: dict[str, set[tuple[str, str]]] = defaultdict(set)
    first_failing: dict[tuple[str, str], tuple[int, int]] = {}
    for rid, op, dtype, status, failed in con.execute(
            "select id, op, dtype, status, contract_failed from op_results where run_id = ? and variant != 'canary'",
            [run]):
        statuses[(op, dtype)][status] += 1
        if status in FAILING:
            rank = (REPRO_ORDER[status], rid)
            if (op, dtype) not in first_failing or rank < first_failing[(op, dtype)]:
                first_failing[(op, dtype)] = rank
        for c in (failed or "").split(","):
            if c:
                contract_pairs[c].add((op, dtype))
    flagged = set(first_failing)
    hit = device_only & flagged
    misses = sorted(device_only - flagged, key=str)
    per_test = {t: {"pairs": len(ps), "flagged": len(ps & flagged)} for t, ps in sorted(by_test.items())}
    per_contract = {c: {"pairs": len(contract_pairs[c]), "also_testcommon": len(contract_pairs[c] & device_only)}
                    for c in CONTRACTS}
    harness_only = sorted((flagged & ran_tc) - device_only - cpu_bad, key=str)
    return {
        "testcommon_pairs": len(device_only), "flagged": len(hit),
        "recall": round(100 * len(hit) / max(len(device_only), 1), 1),
        "per_test": per_test, "per_contract": per_contract,
        "misses": [{"op": op, "dtype": dt, "testcommon": causes[(op, dt)][:3],
                    "harness": dict(statuses.get((op, dt), Counter())) or "not run"} for op, dt in misses],
        "harness_only": [{"op": op, "dtype": dt, "item": first_failing[(op, dt)][1],
                          "statuses": {k: v for k, v in statuses[(op, dt)].items() if k in FAILING}}
                         for op, dt in harness_only],
        "flagged_outside_testcommon": len(flagged - ran_tc - device_only),
    }


def reproduce(db: Path, run: str, findings: list[dict], work: Path, cache: dict[str, list[str]],
              jobs: int = 1) -> None:
    """Each harness-only finding's item as a standalone script (``tools/findings_repro.py``): the
    scripts written in batches, ``jobs`` of them run at a time, each outcome kept in
    ``repro.json`` as it comes (an interrupted benchmark goes on from there)."""
    from findings_repro import reproduce_many

    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    con.row_factory = sqlite3.Row
    scripts = work / "repro"
    scripts.mkdir(exist_ok=True)
    rows = [dict(con.execute("select id, op, variant, dtype, sample, status, error from op_results where id = ?",
                             [f["item"]]).fetchone()) for f in findings if f"{run}|{f['item']}" not in cache]
    t0, done = time.monotonic(), 0
    for row, outcome, said in reproduce_many(db, rows, scripts, jobs):
        key = f"{run}|{row['id']}"
        cache[key] = [outcome, said, row["variant"], row["status"]]
        _merge_into(work / "repro.json", {key: cache[key]})
        done += 1
        _say(f"    [{done}/{len(rows)}, {time.monotonic() - t0:.0f} s] {row['op']} {row['dtype']} {row['variant']} "
             f"{row['status']}: {outcome} ({said[:90]})")
    for f in findings:
        f["outcome"], f["script_said"], f["variant"], f["status"] = cache[f"{run}|{f['item']}"]


def _merge_into(path: Path, new: dict) -> None:
    """``new``'s keys written into the JSON object at ``path``, read again first: two benchmarks
    of other builds may share a work folder."""
    old = json.loads(path.read_text()) if path.exists() else {}
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({**old, **new}, indent=1))
    tmp.replace(path)


def report(build: str, r: dict) -> None:
    _say(f"recall {build}: {r['flagged']} of {r['testcommon_pairs']} TestCommon failures on the device "
         f"({r['recall']}%)")
    for test, c in r["per_test"].items():
        _say(f"  {test:32s} {c['flagged']:4d} of {c['pairs']:4d}")
    _say("  op x dtype pairs each contract fails (of them also TestCommon failures on the device): "
         + ", ".join(f"{c} {v['pairs']} ({v['also_testcommon']})" for c, v in r["per_contract"].items()))
    for m in r["misses"]:
        _say(f"  missed: {m['op']} {m['dtype']}  harness: {m['harness']}")
        for c in m["testcommon"]:
            _say(f"      {c}")
    outcomes = Counter(f["outcome"] for f in r["harness_only"] if "outcome" in f)
    sample = r.get("reproduced_sample", len(r["harness_only"]))
    _say(f"harness-only {build}: {len(r['harness_only'])} pairs flagged by the harness that TestCommon passes on "
         f"the device; {'each' if sample == len(r['harness_only']) else f'a seeded sample of {sample}'} "
         "reproduced standalone: " + (", ".join(f"{k} {v}" for k, v in outcomes.most_common()) or "none")
         + f"; {r['flagged_outside_testcommon']} more flagged pairs TestCommon does not run")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, required=True, help="where everything is kept (and resumed from)")
    ap.add_argument("--builds", default="2.31.0,2.32.0,2.33.0,ideal")
    ap.add_argument("--dtypes", default="float32,bfloat16,int64")
    ap.add_argument("--ops", default="", help="comma-separated OpInfo names (default: the whole op_db)")
    ap.add_argument("--jobs", type=int, default=2, help="pytest-xdist workers and harness workers")
    ap.add_argument("--repro-limit", type=int, default=-1,
                    help="reproduce a seeded sample of at most this many harness-only findings per build (-1: all)")
    ap.add_argument("--seed", type=int, default=0, help="the seed of --repro-limit's sample")
    ap.add_argument("--redo", default="", metavar="OUTCOMES",
                    help="reproduce again the kept findings with these outcomes (comma-separated, e.g. "
                         "'not reproduced,no script' after a fix to the harness or to the repro scripts)")
    ap.add_argument("--testcommon-only", action="store_true", help="run TestCommon for the builds, nothing else")
    ap.add_argument("harness_args", nargs="*", help="after --: passed to conformance run")
    a = ap.parse_args()
    if a.jobs < 1:
        ap.error(f"--jobs: expected 1 or more, got {a.jobs}")
    a.work.mkdir(parents=True, exist_ok=True)
    db = a.work / "harness.sqlite"
    cache_path = a.work / "repro.json"
    cache = json.loads(cache_path.read_text()) if cache_path.exists() else {}
    redo = {o.strip() for o in a.redo.split(",") if o.strip()}
    cache = {k: v for k, v in cache.items() if v[0] not in redo}
    results = {}
    for build in [b.strip() for b in a.builds.split(",") if b.strip()]:
        _say(f"== {build}")
        tc = testcommon(build, a.work, a.dtypes, a.ops, a.jobs)
        if a.testcommon_only:
            continue
        run = harness(build, db, a.dtypes, a.ops, a.jobs, a.harness_args)
        r = compare(tc, db, run)
        todo = r["harness_only"]
        if 0 <= a.repro_limit < len(todo):  # a seeded sample, in op order
            todo = sorted(random.Random(a.seed).sample(todo, a.repro_limit), key=lambda f: (f["op"], f["dtype"]))
        r["reproduced_sample"] = len(todo)
        reproduce(db, run, todo, a.work, cache, a.jobs)
        report(build, r)
        results[build] = r
        _merge_into(a.work / "recall.json", {build: r})
    if results:
        _say("builds: " + ", ".join(f"{b} {r['recall']}% ({r['flagged']}/{r['testcommon_pairs']})"
                                    for b, r in results.items()))


if __name__ == "__main__":
    main()
