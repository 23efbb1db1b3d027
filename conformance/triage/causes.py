"""Error causes: every failing item of a run grouped into its cause, stored with its reach, and
read back with its history across builds and targets.

A sweep of one build records thousands of failing items; behind them stand a few dozen causes.
Each failing item (op or model result) gets a :class:`conformance.triage.signature.Signature`;
items with equal signatures share a cause, named by the signature's stable key. A value mismatch
is localised first, so that a wrong kernel reached by twenty OpInfos is one cause, not twenty:
by the item itself where the sweep localised it (:func:`local_blame`: the kernel that diverges
alone on its own inputs, ``proof.locus`` from :mod:`conformance.check.localize`), else on the
native ATen overload most suspicious across the run (:func:`blame`, spectrum-based fault
localisation: among the overloads an item ran on the device that can change values, the one
with the highest Ochiai score); then the rules of :func:`_op_signatures` that need the whole run
(double precision apart, dtype-level causes, variants of one sample together).

Causes are derived data: :func:`ensure` computes a run's causes when they are missing or were
computed by other normaliser rules (``cause_rules.toml`` changed), and re-applies the knowledge
file (``causes.toml``) every time, so an entry added today explains last month's runs.

Example::

    >>> from opdb import Store
    >>> st = Store.memory()
    >>> rid = st.start_run(target="t", build="1", torch_version="x", config={})
    >>> _ = st.insert("op_results", [{"run_id": rid, "item_key": f"a|function|float32|{i}", "op": "a",
    ...     "variant": "function", "dtype": "float32", "status": "error",
    ...     "error": f"RuntimeError: size {i} is too big"} for i in range(3)])
    >>> s = ensure(st, rid)
    >>> s.failing, s.causes
    (3, 1)
    >>> [(c.items, c.pattern) for c in run_cause_list(st, rid)]
    [(3, 'size <n> is too big')]
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conformance.check.blame import LOCAL_BLAME, LOCAL_TWIN_FACTOR, local_blame, no_values  # noqa: F401  (re-exported)
from opdb import Store
from opdb import queries_causes as qc

from . import knowledge as kn
from .signature import Rules, Signature, op_signature, rules, signature_of

_TENSOR = re.compile(r"\b[a-z]+\d*\[([\d,]*)\]")


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    failing: int
    causes: int
    computed: bool  # False: the stored causes were current


def blame(native_ops: Any, counts: dict[str, tuple[int, int]], never: tuple[str, ...] = ()) -> str:
    """The native overload a mismatching item is blamed on: of those it ran on the device that
    can change values (not a view, nor an allocation ``never`` names), the most suspicious by
    the Ochiai score of spectrum-based fault localisation, ``bad / sqrt(bad + good)`` over the
    run's items that reached it (so an overload failing often *and* mostly outranks one that
    failed once in one item), then the name; '' when it ran none natively."""
    try:
        ops = json.loads(native_ops) if isinstance(native_ops, str) else (native_ops or [])
    except ValueError:
        ops = []
    best, score = "", -1.0
    for op in sorted(ops):
        if not isinstance(op, str) or no_values(op, never):
            continue
        bad, total = counts.get(op, (0, 0))
        s = bad / math.sqrt(total) if total else 0.0
        if s > score:
            best, score = op, s
    return best


#: A dtype whose value mismatches (where float32 passes on the same sample) reach at least this
#: many blamed overloads is wrong as a dtype, not per kernel: a device that computes float64 in
#: float32, or narrows int64. Its items share one cause, "<dtype> only", without an overload.
DTYPE_LEVEL_OVERLOADS = 5
#: A float32 item that passes within this RMS error (eps of float32, against the CPU) is exact:
#: its kernel is right in float32.
EXACT_EPS = 2.0
#: Double-precision dtypes: a mismatch there is kept apart from the same overload's mismatches
#: in single precision (a device that computes float64 in float32 and one whose kernel is wrong
#: fail the same overload for different reasons, fixed in different places).
DOUBLE = ("float64", "complex128")


def input_size(signature: str | None) -> int:
    """Elements in a sample's tensors, read from its stored signature (``f32[2,3], f32[]``: 7)."""
    total = 0
    for dims in _TENSOR.findall(signature or ""):
        n = 1
        for d in filter(None, dims.split(",")):
            n *= int(d)
        total += n
    return total


class _Cause:
    __slots__ = ("sig", "items", "statuses", "ops", "dtypes", "models", "example", "example_key", "repro")

    def __init__(self, sig: Signature) -> None:
        self.sig, self.items = sig, 0
        self.statuses: Counter[str] = Counter()
        self.ops: dict[str, None] = {}
        self.dtypes: dict[str, None] = {}
        self.models: dict[str, None] = {}
        self.example = self.example_key = ""
        self.repro: tuple[int, int, str] | None = None  # (size, id, signature)

    def add(self, table: str, row: dict[str, Any]) -> None:
        self.items += 1
        self.statuses[row["status"]] += 1
        if row.get("dtype"):
            self.dtypes[row["dtype"]] = None
        if not self.example:
            self.example, self.example_key = (row.get("error") or "")[:2000], row["item_key"]
        if table == "model_results":
            self.models[row["model_id"]] = None
            return
        self.ops[row["op"]] = None
        size = (input_size(row.get("signature")), row["id"], row.get("signature") or "")
        if self.repro is None or size[:2] < self.repro[:2]:
            self.repro = size

    def reach(self, run_id: str) -> dict[str, Any]:
        return {"run_id": run_id, "cause": self.sig.key, "items": self.items, "statuses": dict(self.statuses),
                "ops": sorted(self.ops), "dtypes": sorted(self.dtypes), "models": sorted(self.models),
                "example": self.example, "example_key": self.example_key,
                "repro_id": self.repro[1] if self.repro else None, "repro_signature": self.repro[2] if self.repro else None}


def _op_signatures(store: Store, run_id: str, rows: list[dict[str, Any]], rx: Rules) -> list[Signature]:
    """The signatures of a run's failing op rows, with three steps that need the whole run:

    - a value mismatch is blamed on its most suspicious native overload (:func:`blame`);
    - a mismatch in double precision (or a contract failure at an op) is kept apart from the
      single-precision ones;
    - a mismatch in a dtype where the float32 item of the same op, variant and sample passes
      exactly (:func:`_exact32`) is that dtype's own ("<dtype> only") when such mismatches reach
      :data:`DTYPE_LEVEL_OVERLOADS` overloads or more (the device's handling of the dtype, not one
      kernel), unless its own localisation found the kernel, or single precision, to blame (that
      evidence is the item's own, the float32 twin's only a neighbour's);
    - an in-place or out= item, or a variants contract, whose function item on the same sample
      mismatches takes that item's cause (it is the same wrong value, met again)."""
    counts = qc.native_counts(store, run_id)
    passes32 = qc.float32_passing(store, run_id)
    sigs: list[Signature] = []
    dtype_only: dict[str, set[str]] = {}
    localised: set[int] = set()  # rows whose own localisation decided their cause
    for row in rows:
        if row["status"] != "mismatch":
            sig = op_signature(row, rx=rx)
            if row["dtype"] in DOUBLE and sig.locus and sig.kind.startswith("contract:"):
                sig = Signature(sig.kind, sig.exc, sig.pattern + " in double precision", sig.locus)
            sigs.append(sig)
            continue
        blamed, single = local_blame(row.get("proof"), rx.never_blamed)
        if single is not None:
            localised.add(len(sigs))
        sig = op_signature(row, blamed=blamed or blame(row.get("native_ops"), counts, rx.never_blamed),
                           rx=rx, single=single)
        if row["dtype"] in DOUBLE and sig.locus:
            sig = Signature(sig.kind, sig.exc, sig.pattern + " in double precision", sig.locus)
        if row["dtype"] not in ("float32", "any") and sig.locus and _exact32(passes32, row) \
                and len(sigs) not in localised:
            dtype_only.setdefault(row["dtype"], set()).add(sig.locus)
        sigs.append(sig)
    wide = {d for d, loci in dtype_only.items() if len(loci) >= DTYPE_LEVEL_OVERLOADS}
    function: dict[tuple[str, str, Any], Signature] = {}
    for i, (row, sig) in enumerate(zip(rows, sigs, strict=True)):
        if (sig.kind == "mismatch" and sig.locus and row["dtype"] in wide and _exact32(passes32, row)
                and i not in localised):
            what = sig.pattern.removesuffix(" in double precision")
            sigs[i] = sig = Signature("mismatch", "", f"{what} in {row['dtype']} only (float32 passes exactly)")
        if row["variant"] == "function" and sig.kind == "mismatch":
            function[(row["op"], row["dtype"], row["sample"])] = sig
    for i, (row, sig) in enumerate(zip(rows, sigs, strict=True)):
        same = function.get((row["op"], row["dtype"], row["sample"]))
        if same is not None and (sig.kind == "contract:variants"
                                 or (sig.kind == "mismatch" and row["variant"] in ("inplace", "out"))):
            sigs[i] = same
    return sigs


def _exact32(passes32: dict[tuple[str, str, int], float | None], row: dict[str, Any]) -> bool:
    """Whether the float32 item of the row's op, variant and sample passes with the CPU's own
    precision (RMS error within :data:`EXACT_EPS` eps): the kernel is right in float32, so a
    mismatch in another dtype is that dtype's. A float32 item that passes only within its
    tolerance (a kernel of reduced precision) says nothing of the sort."""
    key = (row["op"], row["variant"], row["sample"])
    if key not in passes32:
        return False
    rms = passes32[key]
    return rms is None or rms <= EXACT_EPS


def compute(store: Store, run_id: str, rx: Rules | None = None) -> RunSummary:
    """Compute and store the causes of a run (replacing what it had)."""
    rx = rx or rules()
    found: dict[str, _Cause] = {}
    assigned: dict[str, list[tuple[str, int]]] = {"op_results": [], "model_results": []}
    failing = 0
    for table in assigned:
        rows = list(qc.failing_rows(store, run_id, table))
        sigs = (_op_signatures(store, run_id, rows, rx) if table == "op_results"
                else [signature_of(table, row, rx=rx) for row in rows])
        for row, sig in zip(rows, sigs, strict=True):
            failing += 1
            cause = found.get(sig.key)
            if cause is None:
                cause = found[sig.key] = _Cause(sig)
            cause.add(table, row)
            assigned[table].append((sig.key, row["id"]))
    qc.replace_run_causes(store, run_id, rules=rx.version,
                          causes=[{k: v for k, v in c.sig.as_json().items()} for c in found.values()],
                          reach=[c.reach(run_id) for c in found.values()], assigned=assigned, failing=failing)
    return RunSummary(run_id, failing, len(found), True)


def ensure(store: Store, run_id: str, *, knowledge: Path | None = None) -> RunSummary:
    """A run's causes, computed unless stored by the current rules; the knowledge file is applied
    to every stored cause each time."""
    return ensure_runs(store, [run_id], knowledge=knowledge)[0]


def ensure_runs(store: Store, run_ids: list[str], *, knowledge: Path | None = None) -> list[RunSummary]:
    """:func:`ensure` for several runs, the knowledge file applied once at the end."""
    rx = rules()
    out = []
    for run_id in run_ids:
        have = qc.cause_run(store, run_id)
        out.append(RunSummary(run_id, have["failing"], have["causes"], False)
                   if have is not None and have["rules"] == rx.version else compute(store, run_id, rx))
    apply_knowledge(store, knowledge)
    return out


def ensure_latest(store: Store, *, knowledge: Path | None = None) -> list[RunSummary]:
    """The causes of the latest finished run of each target x build x kind (what the report
    shows), computed where missing."""
    latest: dict[tuple[str, str, str], str] = {}
    for run in store.runs():  # oldest first: the last one of each key wins
        if run["status"] == "finished":
            latest[(run["target"], run["build"], run["kind"])] = run["id"]
    return ensure_runs(store, list(latest.values()), knowledge=knowledge)


def apply_knowledge(store: Store, path: Path | None = None) -> None:
    """Write the knowledge file's fields into every stored cause (NULL where none matches)."""
    k = kn.load(Path(path) if path else kn.default_path())
    notes: dict[str, dict[str, str | None]] = {}
    ops = qc.cause_ops(store)
    for c in qc.all_causes(store):
        sig = Signature(c["kind"], c["exc"] or "", c["pattern"], c["locus"] or "")
        entry = k.find(c["key"], sig.text(), ops.get(c["key"]))
        new = entry.as_json() if entry else dict.fromkeys(("explanation", "workaround", "upstream", "owner", "knowledge"))
        if any(c.get(f) != v for f, v in new.items()):
            notes[c["key"]] = new
    if notes:
        qc.set_knowledge(store, notes)


def explain(found: list[tuple[Signature, str]], db_path: str | None = None,
            knowledge: Path | None = None) -> list[dict[str, Any]]:
    """What is known of the causes ``found`` ((signature, where) pairs, e.g. an audit's failing
    ops): one entry per cause with the places it was seen, the knowledge file's entry and, with
    a database, the builds of its target's runs that show it (the sweep has met it before)."""
    k = kn.load(Path(knowledge) if knowledge else kn.default_path())
    by: dict[str, dict[str, Any]] = {}
    for sig, where in found:
        entry = by.setdefault(sig.key, {**sig.as_json(), "text": sig.text(), "where": [], "seen_in": []})
        entry["where"].append(where)
    for key, entry in by.items():
        note = k.find(key, entry["text"], entry["where"])
        entry.update(note.as_json() if note else dict.fromkeys(("explanation", "workaround", "upstream", "owner",
                                                                 "knowledge")))
    if db_path and Path(db_path).is_file() and by:
        with Store.open(db_path, create=False) as st:
            seen = qc.cause_builds(st, list(by))
        for key, entry in by.items():
            entry["seen_in"] = seen.get(key, [])
    return list(by.values())


def run_cause_list(store: Store, run_id: str, *, history: bool = True) -> list[qc.CauseReach]:
    """The causes of a run (computed if needed), widest first, with their history."""
    ensure(store, run_id)
    return qc.run_causes(store, run_id, history=history)


def new_causes(store: Store, baseline_run: str, candidate_run: str) -> tuple[list[qc.CauseReach], list[str]]:
    """The candidate's causes the baseline does not have (widest first), and the keys of the
    baseline's causes the candidate no longer has."""
    ensure_runs(store, [baseline_run, candidate_run])
    before = qc.cause_keys(store, baseline_run)
    after = qc.run_causes(store, candidate_run, history=False)
    keys = {c.key for c in after}
    return [c for c in after if c.key not in before], sorted(k for k in before if k not in keys)


__all__ = ["RunSummary", "apply_knowledge", "blame", "compute", "ensure", "ensure_latest", "ensure_runs", "explain",
           "input_size",
           "new_causes", "run_cause_list"]
