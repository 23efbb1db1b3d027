"""Repro of a custom-op lane item (:mod:`conformance.customops`): a script that sets up the
target the run used (its ``--env``, ``--import`` modules and build), makes the item's sample
again as the lane made it (the reference registry's seeded generator, or the derandomized walk of
the op's schema for an op with no reference), runs the same check at the tolerance the run held
it to (opcheck's tests, the eager forward or backward, or the compiled op against the reference:
:func:`conformance.customops.items.item_row`) and prints what differs. It exits 1 while the item
still fails, 0 once it passes (or is checked structurally only, as an op without a reference is);
a value difference is printed as ``MISMATCH: ...`` and a raised error as ``target raised: ...``,
as the other repro scripts print them (``tools/findings_repro.py`` reads those lines).

The lane's samples come from code (a reference's generator, a device package's registrations),
so the script calls the harness to make them again; it keeps no inputs file. As for every repro,
each stored value enters the script as a checked Python literal or as escaped docstring text, and
the op is resolved in the script through ``torch.ops`` by a name checked to be ``ns::op.overload``.

Example (shell): ``conformance repro 1234 --db results/opdb.sqlite`` on a ``custom_fwd`` result.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path
from typing import Any

from conformance.customops import VARIANTS
from conformance.work import ItemKey

from .repro_fields import (
    check_script,
    doc_text,
    dtype_field,
    env_pairs,
    int_field,
    literal,
    module_names,
    opt_str,
    str_field,
    tol_field,
)

#: A custom op's overload name as the lane stores it: namespace, op and overload, identifiers each.
_OVERLOAD = re.compile(r"[A-Za-z_]\w*::[A-Za-z_]\w*\.[A-Za-z_]\w*\Z")

_TEMPLATE = '''"""{doc}
"""
from __future__ import annotations

import warnings

from conformance.check.ledger import Entry, Ledger
from conformance.customops.items import item_row
from conformance.sweep.opinfo import SweepConfig
from conformance.targets import get_target
from opdb.status import Status

RECORD = {record}

warnings.simplefilter("ignore")
# the target as the run set it up: its environment variables, --import modules and build
target = get_target(RECORD["target"], RECORD["build_spec"], tuple(RECORD["imports"]), tuple(RECORD["env"]))
# the item held to the tolerance the run held it to (the run's ledger resolved it)
held = Entry("override", 0, "the run", op=RECORD["op"], variant=RECORD["variant"], dtype=RECORD["dtype"],
             atol=RECORD["atol"], rtol=RECORD["rtol"], reason="the tolerance the run held this item to")
config = SweepConfig(seed=RECORD["seed"], ledger=Ledger(overrides=(held,)))
print(f"{{RECORD['item']}} on {{target.name}} (build {{target.build}}); the run recorded: {{RECORD['status']}}")
row = item_row(target, RECORD["item"], config)
status = Status(row["status"])
print(f"sample: {{row.get('signature')}}")
print(f"status now: {{status.value}}")
if RECORD["variant"] == "opcheck":
    for name, check in (row.get("contracts") or {{}}).items():
        print(f"opcheck {{name}}: {{check['outcome']}}" + (f": {{check['detail']}}" if check["detail"] else ""))
        if check["outcome"] == "fail":
            print(f"OPCHECK FAILED: {{name}}")
else:
    print(f"max abs error {{row.get('max_abs_err')}}, max rel error {{row.get('max_rel_err')}}, float64 arbiter's "
          f"error {{row.get('arbiter_err')}} (atol={{RECORD['atol']!r}}, rtol={{RECORD['rtol']!r}})")
error = row.get("error") or ""
if status is Status.MISMATCH:
    print(f"MISMATCH: {{error}}")
elif status is Status.ERROR and error:
    kind, _, said = error.partition(": ")
    print(f"target raised: {{kind}} {{said}}")
elif error:
    print(f"{{status.value.upper()}}: {{error}}")
if status.failed:
    print(f"FAILS: {{RECORD['item']}} is {{status.value}}")
else:
    print(f"does not fail now: {{RECORD['item']}} is {{status.value}}")
raise SystemExit(1 if status.failed else 0)
'''


def write_custom_repro(row: dict[str, Any], run: dict[str, Any], config: dict[str, Any], result_id: int,
                       out_dir: str | Path) -> Path:
    """Write ``repro_<id>.py`` for the custom-op item ``row`` of ``run`` (its stored ``config``)
    into ``out_dir``; returns the script. ValueError (one line naming the result and the field)
    for a field a custom-op result cannot hold."""
    where = f"result {int(result_id)}"
    variant = str_field(row, "variant", where)
    if variant not in VARIANTS:
        raise ValueError(f"{where}: unknown variant {variant!r} (expected one of {', '.join(VARIANTS)})")
    op = str_field(row, "op", where)
    sample = int_field(row.get("sample"), where, "sample")
    if sample < 0:  # its op may be the group's glob (the lane could not look for the target's ops)
        raise ValueError(f"{where}: sample {sample} is the row saying why the items of {op!r} could not be made "
                         f"({str(row.get('error') or '')[:200]!r}); there is no item to reproduce")
    if not _OVERLOAD.match(op):
        raise ValueError(f"{where}: op {op!r} is not a custom op's overload name (e.g. 'neuron::rms_norm.default')")
    dtype = str(dtype_field(row.get("dtype"), where)).removeprefix("torch.")
    build = opt_str(config.get("build_spec") or run.get("build"), where, "build")
    if build is not None and build.endswith(".toml"):  # a manifest path: the script may run elsewhere
        build = str(Path(build).resolve())
    record = {"result": int(result_id), "item": str(ItemKey(op, variant, dtype, sample)), "op": op,
              "variant": variant, "dtype": dtype, "sample": sample,
              "seed": int_field(row.get("seed") if row.get("seed") is not None else config.get("seed"), where, "seed"),
              "atol": tol_field(row.get("atol"), where, "atol"), "rtol": tol_field(row.get("rtol"), where, "rtol"),
              "status": str_field(row, "status", where), "target": str_field(run, "target", f"{where}: its run"),
              "build_spec": build, "imports": module_names(config.get("imports"), where),
              "env": list(env_pairs(config.get("env"), where))}
    script = Path(out_dir) / f"repro_{int(result_id)}.py"
    doc = doc_text(
        f"Reproduces opdb result {int(result_id)}: the custom op {op} ({variant}, {dtype}, sample {sample}) on "
        f"target {run.get('target')}\n(build {run.get('build')}). Recorded status: {row.get('status')}.\n"
        f"Recorded error: {str(row.get('error') or '')[:500]}\n"
        f"It makes the item again with the harness (the custom-op lane's samples come from code), so run it\n"
        f"with the Python that wrote it (torch, the harness and the target's package are installed there):\n"
        f"  {shlex.join([sys.executable, str(script.resolve())])}")
    text = _TEMPLATE.format(doc=doc, record=literal(record))
    check_script(text, record)
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(text, encoding="utf-8")
    return script
