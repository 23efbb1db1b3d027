"""Purity of the error causes against ground truth from ablation: how many causes are one real
cause, and how many causes each real cause is split over.

Ground truth comes from the emulator, which is what makes it ground truth: each mechanism of a
build that can fail an item (a numerics rule, a dtype or layout rule, a seeded defect) is
switched on *alone* in an ablation build (every other rule at the control build's setting, the
same native list), and the OpInfos of the items to label are run again on each. An item's label
is the set of mechanisms it needs (those whose leaving out, one at a time from the full build,
makes it pass; asked where no single mechanism, or several, fail it alone), or else the set of
mechanisms that fail it alone. The benchmark reads the build's manifest to make the ablation
builds: it measures the harness against the truth, and the harness itself never sees either.

The full build is swept once (the whole OpInfo database by default); its causes are computed,
and a seeded sample of causes (``--sample``, up to ``--members`` items of each) is labelled: the
hand check of purity, done by ablation instead of by eye. Only the sampled items run on the
ablation builds, each in a worker process with the full run's settings (a crash or hang there
labels that item and the worker restarts past it); labels are kept in ``--keep`` per build.

A cause is *pure* when one mechanism explains all its items (their labels share one), or all
its items have the same label (the empty one included: items no single mechanism fails). A real
cause (a mechanism) is *split* over the causes holding items that it alone fails.

The causes are computed twice on the same stored run: as the harness does (each mismatch's own
localisation, ``proof.locus``, first) and with the run-wide blame alone (the previous method),
so the figure says what the localisation bought.

Examples::

    python benchmarks/cause_purity.py --keep /tmp/purity          # 2.33.0, about an hour on 2 cores
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


def label_worker(build: str, run_db: str, want_file: str, timeout: float) -> None:
    """In a process of its own: the chosen items of ``want_file`` ({"op|dtype": [item keys]}) run
    on ``build`` with the full run's settings, one JSON line per item started and finished."""
    import signal

    from conformance.run.spec import RunSpec
    from conformance.sweep import run_group
    from conformance.targets import get_target
    from conformance.work import Group, Skip

    with Store.open(run_db) as st:
        config = RunSpec.from_run(st.runs()[-1], refcache="none").sweep_config()
    target = get_target("neuron-emu", build)
    target.setup()

    def started(key: str) -> None:
        signal.alarm(int(timeout))  # a hang ends the process; the driver names the item
        print(json.dumps(["start", key]), flush=True)

    for group, keys in json.loads(Path(want_file).read_text()).items():
        op, dtype = group.rsplit("|", 1)
        for row in run_group(target, Group(op, dtype), config, skip=Skip(only=frozenset(keys)), on_start=started):
            print(json.dumps(["done", row["item_key"], row["status"]]), flush=True)
        signal.alarm(0)


def label_run(folder: Path, name: str, build: str, run_db: Path, keys: set[str], timeout: float) -> dict[str, str]:
    """The statuses of ``keys`` on ``build`` (cached in ``folder/name.json``): the items run alone,
    in a worker process restarted past an item that killed it (that item: 'crash')."""
    cache = folder / f"{name}.json"
    got: dict[str, str] = json.loads(cache.read_text()) if cache.exists() else {}
    fresh = len(keys - set(got))
    t0 = time.perf_counter()
    while True:
        left: dict[str, list[str]] = defaultdict(list)
        for k in sorted(keys - set(got)):
            op, _, dtype, _ = k.split("|")
            left[f"{op}|{dtype}"].append(k)
        if not left:
            break
        want = folder / f"{name}.want.json"
        want.write_text(json.dumps(left))
        proc = subprocess.run([sys.executable, __file__, "--label-worker", build, str(run_db), str(want), str(timeout)],
                              capture_output=True, text=True)
        last = None
        for line in proc.stdout.splitlines():
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if msg[0] == "start":
                last = msg[1]
            elif msg[0] == "done":
                got[msg[1]] = msg[2]
                last = None
        if proc.returncode == 0:
            for k in keys - set(got):
                got[k] = "absent"  # the group made no such item on this build
            break
        if last is None or last in got:
            raise RuntimeError(f"label worker for {name} failed: {proc.stderr[-2000:]}")
        got[last] = "timeout" if proc.returncode in (-14, 142) else "crash"
    cache.write_text(json.dumps(got))
    if fresh:
        print(f"  {name}: {fresh} items in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return {k: got[k] for k in keys}


def assignments(st: Store, run_id: str) -> dict[str, str]:
    """{item key: cause} of a run's failing op items."""
    return {k: r["cause"] for k, r in q.results_by_key(st, run_id, columns=("cause",)).items() if r["cause"]}


def sample_members(assign: dict[str, str], causes: int, per_cause: int, seed: int) -> dict[str, list[str]]:
    """A seeded sample of ``causes`` causes and, of each, up to ``per_cause`` of its items."""
    by: dict[str, list[str]] = defaultdict(list)
    for key, cause in sorted(assign.items()):
        by[cause].append(key)
    rng = random.Random(seed)
    picked = rng.sample(sorted(by), min(causes, len(by)))
    return {c: sorted(rng.sample(by[c], min(per_cause, len(by[c])))) for c in picked}


def score(members: dict[str, list[str]], labels: dict[str, frozenset[str] | None]) -> dict:
    """Purity of the sampled causes: a cause is pure when one mechanism explains every labelled
    item of it, or all have one label."""
    pure, impure, unlabelled = [], [], 0
    split: dict[str, set[str]] = defaultdict(set)
    for c, keys in members.items():
        ls = [labels[k] for k in keys if labels.get(k) is not None]
        unlabelled += len(keys) - len(ls)
        if not ls:
            continue
        for lab in ls:
            if len(lab) == 1:
                split[next(iter(lab))].add(c)
        if frozenset.intersection(*ls) or len(set(ls)) == 1:
            pure.append(c)
        else:
            impure.append((c, Counter("+".join(sorted(x)) or "none" for x in ls).most_common(4)))
    return {"judged": len(pure) + len(impure), "pure": len(pure), "impure": impure, "unlabelled": unlabelled,
            "split": {m: len(cs) for m, cs in sorted(split.items())}}


def main() -> None:
    if sys.argv[1:2] == ["--label-worker"]:
        label_worker(sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="2.33.0")
    ap.add_argument("--dtypes", default="float32,bfloat16,float64,int64")
    ap.add_argument("--ops", action="append", default=[], help="OpInfo globs (default: every OpInfo)")
    ap.add_argument("--keep", help="keep the databases and manifests here")
    ap.add_argument("--reuse", action="store_true", help="take the full run (and labels) already in --keep")
    ap.add_argument("--sample", type=int, default=50, help="causes in the seeded sample (of each method)")
    ap.add_argument("--members", type=int, default=8, help="items labelled per sampled cause")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-n", "--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=30.0,
                    help="seconds per item in the ablation runs (a quadratic op's largest ladder rungs time out "
                         "at any limit; the output counts how many sampled items did)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.keep or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        full = folder / "full.sqlite"
        mech = mechanisms(args.build)
        if not (args.reuse and full.exists()):
            for f in [*folder.glob("*.sqlite"), *folder.glob("*.json")]:
                f.unlink()
            run(full, args.build, args.ops, args.dtypes, args.workers)
        with Store.open(full) as st:
            run_id = st.runs()[-1]["id"]
            t0 = time.perf_counter()
            ca.compute(st, run_id)
            took = time.perf_counter() - t0
            now = assignments(st, run_id)
            local = ca.local_blame
            ca.local_blame = lambda *a, **k: ("", None)  # the run-wide blame alone: the previous method
            try:
                ca.compute(st, run_id)
                before = assignments(st, run_id)
            finally:
                ca.local_blame = local
                ca.compute(st, run_id)
            loci = [json.loads(p or "{}").get("locus") for p in
                    (r["proof"] for r in q.results_by_key(st, run_id, columns=("proof",)).values())]
        loci = [x for x in loci if x]
        print(f"{args.build}: {len(now):,} failing items in {len(set(now.values()))} causes "
              f"({len(now) / max(len(set(now.values())), 1):.0f}:1; computed in {took:.1f} s); "
              f"the run-wide blame alone: {len(set(before.values()))} causes. "
              f"{len(loci):,} mismatches localised in {sum(x.get('seconds', 0) for x in loci):.1f} s of worker time")
        samples = {"localised (now)": sample_members(now, args.sample, args.members, args.seed),
                   "run-wide blame alone (before)": sample_members(before, args.sample, args.members, args.seed)}
        wanted = {k for m in samples.values() for keys in m.values() for k in keys}
        ops = sorted({k.split("|")[0] for k in wanted})
        print(f"labelling {len(wanted):,} items of {len(ops)} OpInfos; {len(mech)} mechanisms: {', '.join(mech)}",
              file=sys.stderr)
        alone: dict[str, set[str]] = {k: set() for k in wanted}
        seen: set[str] = set()
        timed_out = 0
        for i, (name, body) in enumerate([*mech.items(), ("none", None)]):
            build = str(alone_manifest(folder, args.build, f"alone{i}", body))
            for k, st_ in label_run(folder, f"alone{i}", build, full, wanted, args.timeout).items():
                if st_ == "absent":
                    continue
                seen.add(k)
                timed_out += st_ == "timeout"
                if st_ not in NOT_FAILING:
                    alone[k].add(name)
        # where no mechanism alone fails an item, or several do: which ones it needs
        unclear = {k for k, v in alone.items() if len(v) != 1 and k in seen}
        needed: dict[str, set[str]] = {k: set() for k in wanted}
        for i, name in enumerate(mech):
            if not unclear:
                break
            build = str(without_manifest(folder, args.build, f"without{i}", mech, name))
            for k, st_ in label_run(folder, f"without{i}", build, full, unclear, args.timeout).items():
                if st_ in NOT_FAILING and st_ != "skip":
                    needed[k].add(name)
        labels = {k: frozenset(needed[k] or alone[k]) if k in seen else None for k in wanted}
        print(f"sampled items timed out in an ablation run: {timed_out} (item x run)")
        print("labels:", dict(Counter("+".join(sorted(v)) or "none" for v in labels.values() if v is not None)
                              .most_common()), f"(not in the ablation runs: {sum(v is None for v in labels.values())})")
        for title, members in samples.items():
            s = score(members, labels)
            print(f"\n{title}: {s['pure']} of {s['judged']} sampled causes pure "
                  f"({100 * s['pure'] / max(s['judged'], 1):.1f}%); items not labelled: {s['unlabelled']}")
            print("  split (real cause: sampled causes holding items it alone explains):", s["split"])
            for c, mix in s["impure"]:
                print(f"  impure {c}: {mix}")


if __name__ == "__main__":
    main()
