"""What the numerics gate detects, and its false alarms, measured on seeded builds.

For each (op, magnitude) a build inheriting ``--build`` scales the op's float32 results by
``1 + magnitude`` (the emulator's ``wrong_result`` defect), is swept over ``--ops`` and gated
against a clean twin of the same base build; two clean runs give the false-alarm figure. The table
says, per seeded build, what the gate decided at the seeded op x float32 (the categories and tests
of its findings there) and how many findings it made anywhere else (false alarms: the seeded op's
own other variants that reach the scaled overload are not counted, e.g. mm's backward runs mm).

``--default`` sweeps the whole default selection (every OpInfo, dtype and variant, the schema
search) twice instead and reports the gate's findings between the two identical runs.

Examples::

    python benchmarks/numerics_gate.py                      # mm (already failing on 2.33.0) and exp (passing)
    python benchmarks/numerics_gate.py --default            # identical runs of the default sweep (~30 min)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

SEEDED = """[build]
name = "{name}"
inherits = "{base}"

[[defects]]
op = "{overload}"
dtypes = ["float32"]
kind = "wrong_result"
magnitude = {m}
note = "seeded for benchmarks/numerics_gate.py"
"""
CASES = [  # (OpInfo, its overload, magnitudes)
    ("mm", "aten::mm.default", (0.001, 0.002, 0.005)),
    ("exp", "aten::exp.default", (3e-7, 1e-6, 3e-6, 0.001, 0.002, 0.005)),
]
CONTEXT_OPS = ("mm", "exp", "matmul", "addmm", "nn.functional.linear", "sin", "add", "sum", "softmax")


def _run(db: Path, build: str, run_id: str, ops: tuple[str, ...] | None, workers: int) -> float:
    from conformance.run.runner import RunSpec, execute_run

    t = time.perf_counter()
    if ops is None:
        spec = RunSpec(target="neuron-emu", build=build, workers=workers, run_id=run_id)
    else:
        spec = RunSpec(target="neuron-emu", build=build, ops=ops, dtypes=("float32",), workers=workers,
                       run_id=run_id)
    execute_run(spec, db)
    return time.perf_counter() - t


def _gate(db: Path, base: str, cand: str):
    from conformance.gate.core import run_gate
    from opdb import Store

    with Store.open(db) as st:
        return run_gate(st, base, cand, attempts=0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="2.33.0")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--default", action="store_true", help="two identical runs of the default sweep")
    ap.add_argument("--dir", default="", help="work directory (default: a temporary one)")
    args = ap.parse_args()
    work = Path(args.dir or tempfile.mkdtemp(prefix="numerics-gate-"))
    work.mkdir(parents=True, exist_ok=True)
    db = work / "n.sqlite"
    ops = None if args.default else CONTEXT_OPS
    clean = work / "clean.toml"
    clean.write_text(f'[build]\nname = "{args.build}-clean"\ninherits = "{args.build}"\n')
    t1 = _run(db, str(clean), "clean-1", ops, args.workers)
    t2 = _run(db, str(clean), "clean-2", ops, args.workers)
    same = _gate(db, "clean-1", "clean-2")
    what = "default sweep" if args.default else f"ops {', '.join(CONTEXT_OPS)} (float32)"
    print(f"identical runs of {what} on {args.build}: {len(same.findings)} finding(s) "
          f"({', '.join(f'{f.category} {f.name}/{f.variant}/{f.dtype}' for f in same.findings[:10]) or 'none'}); "
          f"runs took {t1:.0f} s and {t2:.0f} s")
    if args.default:
        return 0 if not same.findings else 1
    print(f"\n{'op':<6} {'magnitude':>9}  {'at op/float32 (function)':<44} {'other variants':<28} false alarms")
    for op, overload, mags in CASES:
        for m in mags:
            path = work / f"{op}-{m}.toml"
            path.write_text(SEEDED.format(name=f"{args.build}-{op}-{m}", base=args.build, overload=overload, m=m))
            run_id = f"{op}-{m}"
            _run(db, str(path), run_id, ops, args.workers)
            res = _gate(db, "clean-1", run_id)
            at = [f for f in res.findings if f.name == op and f.dtype == "float32"]
            fn = [f for f in at if f.variant == "function"]
            said = "; ".join(f"{f.category} ({f.baseline} -> {f.candidate}"
                             + (f", {f.evidence.get('test')}" if f.evidence.get("test") else "") + ")"
                             for f in fn[:1]) + (f" +{len(fn) - 1} items" if len(fn) > 1 else "")
            others = sorted({f"{f.variant}:{f.category}" for f in at if f.variant != "function"})
            # ops that reach the seeded overload are not false alarms (matmul, linear, addmm's
            # backward run mm); the false alarms are the findings on ops that never call it
            reach = _reaches(db, run_id, overload)
            false = [f for f in res.findings if f.name != op and f.name not in reach]
            print(f"{op:<6} {m:>9g}  {said or 'not detected':<44} {','.join(others) or '-':<28} "
                  f"{len(false)}" + (f" ({', '.join(sorted({f.name for f in false}))})" if false else ""))
    print(f"\nwork directory: {work}")
    return 0


def _reaches(db: Path, run_id: str, overload: str) -> set[str]:
    """The OpInfos whose items reached ``overload`` on the target in ``run_id``."""
    import json

    from opdb import Store

    with Store.open(db) as st:
        from opdb.queries import results_by_key

        rows = results_by_key(st, run_id, "op_results", ("op", "reached_ops"))
    out = set()
    for r in rows.values():
        try:
            if overload in json.loads(r.get("reached_ops") or "[]"):
                out.add(r["op"])
        except ValueError:
            continue
    return out


if __name__ == "__main__":
    sys.exit(main())
