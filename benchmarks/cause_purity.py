"""Purity of the error causes against ground truth from ablation: how many causes are one real
cause, and how many causes each real cause is split over.

Ground truth comes from the emulator, which is what makes it ground truth: each mechanism of a
build that can fail an item (a numerics rule, a dtype or layout rule, a seeded defect) is
switched on *alone* in an ablation build (every other rule at the control build's setting, the
same native list), and the OpInfos with failing items in the full build are run again on each.
An item's label is the set of mechanisms it needs (those whose leaving out, one at a time from
the full build, makes it pass; asked where no single mechanism, or several, fail it alone), or
else the set of mechanisms that fail it alone. The benchmark reads the build's
manifest to make the ablation builds: it measures the harness against the truth, and the
harness itself never sees either.

A cause is *pure* when one mechanism explains all its items (their labels share one), or all
its items have the same label (the empty one included: items no single mechanism fails). A real
cause (a mechanism) is *split* over the causes holding items that it alone fails.

The causes are computed twice on the same stored run: as the harness does (each mismatch's own
localisation, ``proof.locus``, first) and with the run-wide blame alone (the previous method),
so the figure says what the localisation bought.

Examples::

    python benchmarks/cause_purity.py --keep /tmp/purity          # 2.33.0, about 30 min on 2 cores
    python benchmarks/cause_purity.py --ops 'nn.functional.*' --dtypes float32,float64   # smaller
    python benchmarks/cause_purity.py --keep /tmp/purity --reuse   # re-score stored runs
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

from conformance.triage import causes as ca
from opdb import Store
from opdb import queries as q

NOT_FAILING = ("pass", "pass_fallback", "skip", "xfail", "xpass")


def mechanisms(build: str) -> dict[str, str]:
    """The build's failure mechanisms, each as the TOML of an ablation build's body: its numerics
    and dtype rules that differ from the control build's, and each seeded defect."""
    from neuron_emu.manifest import DtypeRules, Numerics, load_build

    b, ideal = load_build(build), load_build("ideal")
    found: dict[str, str] = {}
    for f in dataclasses.fields(Numerics):
        mine, theirs = getattr(b.numerics, f.name), getattr(ideal.numerics, f.name)
        if mine != theirs:
            found[f"numerics.{f.name}"] = f"[numerics]\n{f.name} = {json.dumps(mine)}\n"
    for f in dataclasses.fields(DtypeRules):
        mine, theirs = getattr(b.dtypes, f.name), getattr(ideal.dtypes, f.name)
        if mine != theirs:
            mine = "narrow" if (f.name, mine) == ("int64", "downcast") else mine  # as manifests spell it
            found[f"dtypes.{f.name}"] = f"[dtypes]\n{f.name} = {json.dumps(mine)}\n"
    for i, d in enumerate(b.defects):
        body = {"op": d.op, "kind": d.kind, "magnitude": d.magnitude, "min_numel": d.min_numel,
                "probability": d.probability}
        if d.dtypes is not None:
            body["dtypes"] = list(d.dtypes)
        lines = "".join(f"{k} = {json.dumps(v)}\n" for k, v in body.items())
        found[f"defect[{i}] {d.kind} {d.op}"] = f"[[defects]]\n{lines}"
    return found


def _defaults(build: str) -> tuple[dict[str, object], dict[str, object]]:
    """The control build's numerics and dtype rules, spelled as manifests spell them."""
    from neuron_emu.manifest import DtypeRules, Numerics, load_build

    ideal = load_build("ideal")
    return ({f.name: getattr(ideal.numerics, f.name) for f in dataclasses.fields(Numerics)},
            {f.name: getattr(ideal.dtypes, f.name) for f in dataclasses.fields(DtypeRules)})


def _table(name: str, values: dict[str, object]) -> str:
    return f"[{name}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items()) + "\n"


def alone_manifest(folder: Path, build: str, name: str, body: str | None) -> Path:
    """A build with ``build``'s native list and runtime, everything else at the control's, and
    ``body`` (one mechanism) on top (None: no mechanism)."""
    from neuron_emu.manifest import load_build

    numerics, dtypes = _defaults(build)
    text = f'[build]\nname = "{name}"\ninherits = "{load_build(build).path}"\nreset_defects = true\n\n'
    for table, values in (("numerics", numerics), ("dtypes", dtypes)):
        if body and body.startswith(f"[{table}]"):
            key, _, value = body.split("\n")[1].partition(" = ")
            values = {**values, key: json.loads(value)}
        text += _table(table, values)
    if body and body.startswith("[[defects]]"):
        text += body
    path = folder / f"{name}.toml"
    path.write_text(text, encoding="utf-8")
    return path


def without_manifest(folder: Path, build: str, name: str, mech: dict[str, str], left_out: str) -> Path:
    """``build`` itself with one mechanism at the control's setting (a defect: left out)."""
    from neuron_emu.manifest import load_build

    numerics, dtypes = _defaults(build)
    text = f'[build]\nname = "{name}"\ninherits = "{load_build(build).path}"\nreset_defects = true\n\n'
    body = mech[left_out]
    for table, values in (("numerics", numerics), ("dtypes", dtypes)):
        if body.startswith(f"[{table}]"):
            key = body.split("\n")[1].split(" = ")[0]
            text += _table(table, {key: values[key]})
    text += "".join(b for m, b in mech.items() if m != left_out and b.startswith("[[defects]]"))
    path = folder / f"{name}.toml"
    path.write_text(text, encoding="utf-8")
    return path


def run(db: Path, build: str, ops: list[str], dtypes: str, workers: int) -> None:
    cmd = [sys.executable, "-m", "conformance", "run", "--target", "neuron-emu", "--build", build,
           "--dtypes", dtypes, "--no-schema", "--db", str(db), "--quiet", "--exit-zero", "-n", str(workers)]
    for o in ops:
        cmd += ["--ops", o]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    print(f"  {Path(build).stem}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)


def statuses(db: Path) -> dict[str, str]:
    with Store.open(db) as st:
        run_id = st.runs()[-1]["id"]
        return {k: r["status"] for k, r in q.results_by_key(st, run_id, columns=("status",)).items()}


def score(st: Store, run_id: str, labels: dict[str, frozenset[str]], sample: int, seed: int) -> dict:
    members: dict[str, list[frozenset[str]]] = defaultdict(list)
    for key, r in q.results_by_key(st, run_id, columns=("cause",)).items():
        if r["cause"]:
            members[r["cause"]].append(labels.get(key, frozenset({"?"})))
    pure = {c for c, ls in members.items() if frozenset.intersection(*ls) or len(set(ls)) == 1}
    items_pure = sum(len(members[c]) for c in pure)
    split: dict[str, set[str]] = defaultdict(set)
    for c, ls in members.items():
        for lab in ls:
            if len(lab) == 1:
                split[next(iter(lab))].add(c)
    rng = random.Random(seed)
    picked = rng.sample(sorted(members), min(sample, len(members)))
    return {"causes": len(members), "items": sum(map(len, members.values())), "pure": len(pure),
            "items_in_pure": items_pure, "sample_pure": sum(c in pure for c in picked), "sample": len(picked),
            "split": {m: len(cs) for m, cs in sorted(split.items())},
            "impure": sorted(((c, Counter("+".join(sorted(x)) or "none" for x in ls).most_common(4))
                              for c, ls in members.items() if c not in pure), key=lambda x: -sum(n for _, n in x[1]))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="2.33.0")
    ap.add_argument("--dtypes", default="float32,bfloat16,float64,int64")
    ap.add_argument("--ops", action="append", default=[], help="OpInfo globs (default: every OpInfo)")
    ap.add_argument("--keep", help="keep the databases and manifests here")
    ap.add_argument("--reuse", action="store_true", help="score the databases already in --keep")
    ap.add_argument("--sample", type=int, default=50, help="causes in the seeded sample")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-n", "--workers", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.keep or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        full = folder / "full.sqlite"
        mech = mechanisms(args.build)
        if not args.reuse:
            for f in folder.glob("*.sqlite"):
                f.unlink()
            run(full, args.build, args.ops, args.dtypes, args.workers)
        full_status = statuses(full)
        failing = {k for k, s in full_status.items() if s not in NOT_FAILING}
        ops = sorted({k.split("|")[0] for k in failing})
        print(f"{args.build}: {len(full_status):,} items, {len(failing):,} failing in {len(ops)} OpInfos; "
              f"{len(mech)} mechanisms: {', '.join(mech)}", file=sys.stderr)
        alone: dict[str, set[str]] = {k: set() for k in failing}
        for i, (name, body) in enumerate([*mech.items(), ("none", None)]):
            db = folder / f"alone{i}.sqlite"
            if not args.reuse:
                run(db, str(alone_manifest(folder, args.build, f"alone{i}", body)), ops, args.dtypes, args.workers)
            for k, st in statuses(db).items():
                if k in alone and st not in NOT_FAILING:
                    alone[k].add(name)
        # where no mechanism alone fails an item, or several do: which ones it needs
        unclear = sorted({k.split("|")[0] for k, v in alone.items() if len(v) != 1})
        needed: dict[str, set[str]] = {k: set() for k in failing}
        for i, name in enumerate(mech):
            db = folder / f"without{i}.sqlite"
            if not args.reuse and unclear:
                run(db, str(without_manifest(folder, args.build, f"without{i}", mech, name)), unclear, args.dtypes,
                    args.workers)
            if db.exists():
                for k, st in statuses(db).items():
                    if k in needed and st in NOT_FAILING and st != "skip":
                        needed[k].add(name)
        frozen = {k: frozenset(needed[k] or alone[k]) for k in failing}
        print("labels:", dict(Counter("+".join(sorted(v)) or "none" for v in frozen.values()).most_common()))
        with Store.open(full) as st:
            run_id = st.runs()[-1]["id"]
            ca.compute(st, run_id)
            now = score(st, run_id, frozen, args.sample, args.seed)
            local = ca.local_blame
            ca.local_blame = lambda *a, **k: ("", None)  # the run-wide blame alone: the previous method
            try:
                ca.compute(st, run_id)
                before = score(st, run_id, frozen, args.sample, args.seed)
            finally:
                ca.local_blame = local
                ca.compute(st, run_id)
        for title, s in (("run-wide blame alone (before)", before), ("localised (now)", now)):
            print(f"\n{title}: {s['items']:,} failing items in {s['causes']} causes "
                  f"({s['items'] / max(s['causes'], 1):.0f}:1); pure {s['pure']} of {s['causes']} "
                  f"({100 * s['pure'] / max(s['causes'], 1):.1f}%), items in pure causes "
                  f"{100 * s['items_in_pure'] / max(s['items'], 1):.1f}%; seeded sample of {s['sample']}: "
                  f"{s['sample_pure']} pure")
            print("  split (real cause: causes holding items it alone fails):", s["split"])
            for c, mix in s["impure"][:12]:
                print(f"  impure {c}: {mix}")


if __name__ == "__main__":
    main()
