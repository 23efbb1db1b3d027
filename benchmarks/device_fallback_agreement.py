"""How far the generic ``device:neuron --import neuron_emu`` agrees with ``neuron-emu`` on the
emulator's active build (the one ``device:neuron`` runs), item by item.

Prints the statuses of both, how many items have the same status (exactly, and with
``pass_fallback`` read as ``pass``), and how many agree on "was there a CPU fallback" (the
emulator's own tracking vs the generic device<->host copy detection), with the disagreements.

    PYTHONPATH=. python benchmarks/device_fallback_agreement.py [--ops abs,add,cumsum,index_select]
"""

from __future__ import annotations

import argparse
import warnings
from collections import Counter

from conformance.sweep.opinfo import SweepConfig, run_group
from conformance.targets import get_target
from conformance.work import Group


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", default="abs,add,cumsum,index_select,sin,cos,exp,mm,linalg.det,logsumexp")
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    dev = get_target("device:neuron", imports=("neuron_emu",))
    emu = get_target("neuron-emu")  # its default: the emulator's active build, as device:neuron runs
    config = SweepConfig()
    rows: dict[str, dict[str, dict]] = {}
    for side, target in (("emu", emu), ("dev", dev)):
        for op in args.ops.split(","):
            for r in run_group(target, Group(op, args.dtype), config):
                rows.setdefault(r["item_key"], {})[side] = r
    fold = {"pass_fallback": "pass"}
    same = folded = agree = 0
    table: Counter[tuple[bool, bool]] = Counter()
    for key, v in sorted(rows.items()):
        e, d = v["emu"], v["dev"]
        same += e["status"] == d["status"]
        folded += fold.get(e["status"], e["status"]) == fold.get(d["status"], d["status"])
        ef, df = bool(e["fallback_ops"]), bool(d["fallback_ops"])
        agree += ef == df
        table[(ef, df)] += 1
        if ef != df or fold.get(e["status"], e["status"]) != fold.get(d["status"], d["status"]):
            print(f"  {key}: neuron-emu {e['status']} {e['fallback_ops']} | device:neuron {d['status']} {d['fallback_ops']}")
    n = len(rows)
    print(f"build {emu.build}; ops {args.ops}; {args.dtype}; {n} items")
    print("neuron-emu statuses:   ", dict(Counter(v["emu"]["status"] for v in rows.values())))
    print("device:neuron statuses:", dict(Counter(v["dev"]["status"] for v in rows.values())))
    print(f"same status: {same}/{n}; same with pass_fallback read as pass: {folded}/{n}")
    print(f"fallback yes/no agree: {agree}/{n}; (emulator says fallback, generic sees one) -> items: "
          + ", ".join(f"{k}: {c}" for k, c in sorted(table.items())))


if __name__ == "__main__":
    main()
