"""The opdb schema: tables, their columns, and the migrations between versions.

The schema version lives in ``PRAGMA user_version``. A new version appends one function to
``MIGRATIONS``; opening an older DB applies the missing steps in order, a newer one is refused.

Example::

    >>> import sqlite_utils
    >>> from opdb.schema import migrate, SCHEMA_VERSION
    >>> db = sqlite_utils.Database(memory=True)
    >>> migrate(db) == SCHEMA_VERSION
    True
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable

import sqlite_utils

from .schema_lanes import DIST_RESULTS, DIST_RUNS, GEN_RESULTS, PERF_RESULTS, PERF_RUNS

LOCK_WAIT_S = 60.0  # how long a writer waits for another process's write lock (the busy timeout's length)

# Columns shared by every per-item result table: which run, which shard wrote it, and the
# stable key of the work item (what resume and merge de-duplicate on).
_ITEM = {
    "run_id": str,
    "item_key": str,
    "status": str,
    "error": str,
    "duration_s": float,
    "shard": str,
    "recorded_at": str,
    "output": str,  # what the worker printed (fd 1 and 2) while running the item, shortened (schema v3)
}

RUNS = {
    "id": str,
    "target": str,
    "build": str,
    "torch_version": str,
    "host": str,
    "git_sha": str,
    "started_at": str,
    "finished_at": str,
    "status": str,  # running | finished | interrupted | infra
    "kind": str,  # ops | models | generate (the generation lane alone) | mixed
    "config": str,  # JSON: the normalised run configuration (selection, seeds, tolerances)
}

RUN_SHARDS = {
    "run_id": str,
    "shard": str,  # "K/N"
    "host": str,
    "started_at": str,
    "finished_at": str,
    "status": str,
    "items_total": int,
    "owner": str,  # "pid:start" of the process that runs it (a killed one is found by it)
}

OPS = {
    "torch_version": str,
    "name": str,  # aten::name.overload
    "op": str,  # aten::name
    "overload": str,
    "schema": str,
    "tags": str,  # JSON list
    "classes": str,  # JSON list (functional, inplace, out, view, ...)
    "opinfos": str,  # JSON list of OpInfo names whose first sample reaches it
}

OP_RESULTS = {
    **_ITEM,
    "op": str,  # OpInfo name with variant name, e.g. nn.functional.conv2d
    "variant": str,  # function | inplace | out | backward | schema
    "dtype": str,
    "sample": int,
    "max_abs_err": float,
    "max_rel_err": float,
    "ulp_err": float,
    "mismatch_frac": float,
    "arbiter_err": float,  # target's error against the float64 arbiter
    "cpu_arbiter_err": float,  # the CPU's own error against the arbiter
    "nan_agree": int,
    "dtype_ok": int,
    "shape_ok": int,
    "stride_ok": int,
    "atol": float,
    "rtol": float,
    "tol_source": str,
    "comparator": str,
    "native_ops": str,  # JSON list
    "fallback_ops": str,  # JSON list
    "reached_ops": str,  # JSON list: every overload dispatched on the target (schema v2)
    "inputs": bytes,  # torch.save'd minimal failing input of schema-driven items (schema v2)
    # JSON: proof that the target ran the item (schema v4): "device" (devices of the outputs) and,
    # for a compiler target, "backend", "graphs" (graphs its backend compiled), "frames",
    # "graph_breaks", "graph_ops" (ATen overloads in the compiled graphs), "fallback_kernels"
    "proof": str,
    "signature": str,
    "seed": int,
    # JSON (schema v5): the contract checks of the item, {contract: {"outcome": "pass" | "fail" |
    # "n/a", "detail": why}} -- out=, metadata, aliasing, noncontiguous, variants, errors, determinism
    "contracts": str,
    "contract_failed": str,  # the failed contracts' names, comma-separated (NULL: none failed)
    # JSON (schema v6): the error fingerprint of the item's floating outputs against the float64
    # arbiter (conformance/check/fingerprint.py): "ref", "n", "bias", "rms", "p99", "max" (in eps of the
    # output dtype), "nonfinite", "probes" (base64 float32 signed errors at fixed positions)
    "fingerprint": str,
    # JSON (schema v9): the element that failed worst, {"output": leaf, "index": [...], "target": x,
    # "cpu": y, "arbiter": float64 reference's value (when arbitrated)}; NULL when nothing failed
    "worst": str,
    "cause": str,  # (schema v12) a failing item's cause (causes.key); NULL for the others
}

MODEL_RESULTS = {
    **_ITEM,
    "model_id": str,
    "family": str,
    "params": str,  # JSON
    "graph_hash": str,
    "dtype": str,
    "mode": str,  # eager | compile
    "max_abs_err": float,
    "max_rel_err": float,
    "grad_max_rel_err": float,
    "loss_curve": str,  # JSON {"target": [...], "cpu": [...]}
    "native_ops": str,
    "fallback_ops": str,
    "aten_ops": str,  # JSON histogram
    "first_divergent_op": str,
    "first_divergent_detail": str,
    "recompiles": int,
    "compile_s": float,
    "p50_ms": float,
    "p99_ms": float,
    "shapes": str,  # JSON per-shape latency / recompile record
    # JSON (schema v6): the error fingerprint of the first forward's output and the first step's
    # gradients against the CPU's (conformance/check/fingerprint.py), as op_results.fingerprint
    "fingerprint": str,
    # (schema v6) the target's run-to-run noise: max |second forward - first| / max |first| on the
    # same weights and inputs
    "noise": float,
    # (schema v7) the forward error as the model tolerance judges it: the worst normwise
    # ||t - c|| / ||c|| over the float outputs (fwd_rtol bounds it); max_abs_err / max_rel_err
    # above are element-wise and meaningless near zero
    "fwd_rel_err": float,
    "cause": str,  # (schema v12) a failing item's cause (causes.key); NULL for the others
}

# Per run and ATen overload: exercised (with counts) or not, with a reason from a fixed vocabulary.
COVERAGE = {
    "run_id": str,
    "name": str,  # aten::name.overload
    "state": str,  # exercised | composite_implicit | no_cpu_kernel | layout | random | no_valid_input | ledger
    "detail": str,  # e.g. what was tried when no valid input was found
    "samples": int,  # items that reached it
    "native_samples": int,
    "fallback_samples": int,
    "failing_samples": int,
    "statuses": str,  # JSON {status: count}
    "dtypes": str,  # JSON list
    "sources": str,  # JSON list: opinfo | backward | schema
}

# Re-runs of candidate regressions (flake confirmation).
FLAKES = {
    "run_id": str,
    "item_key": str,
    "kind": str,  # op | model
    "attempts": int,
    "failures": int,
    "statuses": str,  # JSON list, one per attempt
    "verdict": str,  # flaky | confirmed
    "recorded_at": str,
}

# What the gate decided for one (baseline, candidate) pair: the report's build diff reads this.
GATE_ITEMS = {
    "baseline_run": str,
    "candidate_run": str,
    "category": str,  # regression | improvement | flaky | new | removed | drift | verdict (one marker row)
    "kind": str,  # op | model | drift | gate (the marker)
    "item_key": str,
    "op": str,  # OpInfo name or model id
    "variant": str,
    "dtype": str,
    "baseline": str,
    "candidate": str,
    "evidence": str,  # JSON
    "decided_at": str,
}

# Wall seconds each group (op x dtype, an overload's schema search, a model graph) took in a run:
# the next run of the same target prices its groups by them (schedule and ETA; schema v8).
GROUP_TIMES = {
    "run_id": str,
    "shard": str,
    "group_key": str,  # op|dtype
    "kind": str,  # opinfo | schema | model
    "wall_s": float,
}

# The schema search's corpus (schema v11): per ATen overload, the inputs a search found (the
# first inputs the CPU rejected, every input it accepted, the minimal failing ones), replayed by
# later runs instead of searching again while the fingerprint holds (conformance/inputs/corpus.py).
# An entry is inputs only: every verdict is recomputed by running them on the target and the CPU.
TRACED_SIGNATURES = {
    "torch_version": str,  # the torch the signature was traced with (its ATen overloads' own)
    "key": str,  # sha1 of the overload and its arguments' structure (shapes, strides, dtypes, non-tensors)
    "op": str,  # aten::name.overload
    "dtype": str,  # its first floating tensor argument's dtype (else its first tensor's; "none")
    "spec": str,  # JSON: {"args": [...], "kwargs": {...}}, tensors as {"T": {...}} (conformance.sweep.traced)
    "numel": int,  # elements of its tensor arguments
    "nbytes": int,  # bytes of the storage its tensor arguments view
    "calls": int,  # calls of it in the traced models (all of them)
    "models": int,  # models that call it
}

TRACED_USES = {
    "torch_version": str,
    "key": str,  # traced_signatures.key
    "model": str,  # the model graph (its model id) that calls it
    "calls": int,  # how often, in one forward and backward
}

SCHEMA_CORPUS = {
    "overload": str,  # aten::name.overload
    "fingerprint": str,  # sha256 of the basis below: a different one means search again
    "basis": str,  # JSON: schema, CPU-side dispatch keys with kernels, torch version, search version
    "outcome": str,  # inputs | no_valid_input
    "complete": int,  # 1: the accepted inputs are all a search generated (it found no failure)
    "crash_safe": int,  # 1: written by a crash-safe search (no rejected inputs checked)
    "steered": str,  # the hints that steered the search, as its rows say them ("" unsteered)
    "summary": str,  # no_valid_input: what the search tried (the row's error)
    "calls": str,  # JSON list, one per stored input: {"role": rejected|valid|failing, "contracts": bool}
    "inputs": bytes,  # opdb.blobs: {"calls": [{"args": [...], "kwargs": {...}}, ...]}, as "calls"
    "run_id": str,  # the run that wrote it
    "recorded_at": str,
}

# Error causes (schema v12; conformance/triage/causes.py): failing items grouped by their
# normalised signature. Derived from the results, so never merged: a run whose causes are missing
# or were computed by other normaliser rules is recomputed when read.
CAUSES = {
    "key": str,  # "C" + hash of kind, exc, pattern, locus: the same cause has the same key everywhere
    "kind": str,  # the items' status, or contract:<name>
    "exc": str,  # the exception type the messages start with ('' when none)
    "pattern": str,  # the normalised message (placeholders: <n>, <op>, <shape>, ...), or a mismatch's class
    "locus": str,  # the blamed ATen overload of a mismatch, the op or family of a crash; '' otherwise
    # from the knowledge file (conformance/data/causes.toml or --knowledge) when an entry matches
    "explanation": str,
    "workaround": str,
    "upstream": str,
    "owner": str,
    "knowledge": str,  # where the entry is: "FILE:[[cause]] N"; NULL: unexplained
}

# Per run and cause: its reach in that run.
CAUSE_REACH = {
    "run_id": str,
    "cause": str,
    "items": int,
    "statuses": str,  # JSON {status: items}
    "ops": str,  # JSON list: OpInfo names or ATen overloads of its op items
    "dtypes": str,  # JSON list
    "models": str,  # JSON list: model ids of its model items
    "example": str,  # the first item's error as stored (not normalised)
    "example_key": str,  # that item's key
    "repro_id": int,  # op_results.id of its op item with the smallest input (conformance repro ID)
    "repro_signature": str,  # that item's input signature
}

# Which runs have causes, computed by which rules.
CAUSE_RUNS = {
    "run_id": str,
    "rules": str,  # the normaliser's version (a hash of cause_rules.toml)
    "failing": int,  # failing items of the run
    "causes": int,
    "computed_at": str,
}

# A published compatibility table held against a run (conformance.catalog.claims): one row per
# claim x dtype, stored by the nightly for the tables its targets publish (schema v13).
CLAIMS = {
    "run_id": str,
    "tbl": str,  # the table's file
    "api": str,  # aten::name or aten::name.overload, as claimed
    "dtype": str,  # '' for a claim the run has nothing on at all
    "claimed": str,  # Y | CPU_FALLBACK | N, with the claimed dtypes
    "kind": str,  # kept | unchecked | a disagreement (conformance.catalog.claims.KINDS)
    "measured": str,
    "example": str,
    "line": int,  # the claim's line in the table
}

# The generation lane's rows (schema v18): a work kind's, so the run's item columns first.
GEN_RESULTS_TABLE = {**_ITEM, **GEN_RESULTS}

TABLES: dict[str, dict[str, type]] = {
    "runs": RUNS,
    "run_shards": RUN_SHARDS,
    "ops": OPS,
    "op_results": OP_RESULTS,
    "model_results": MODEL_RESULTS,
    "coverage": COVERAGE,
    "flakes": FLAKES,
    "gate_items": GATE_ITEMS,
    "group_times": GROUP_TIMES,
    "schema_corpus": SCHEMA_CORPUS,
    "causes": CAUSES,
    "cause_reach": CAUSE_REACH,
    "cause_runs": CAUSE_RUNS,
    "claims": CLAIMS,
    "traced_signatures": TRACED_SIGNATURES,
    "traced_uses": TRACED_USES,
    "perf_runs": PERF_RUNS,
    "perf_results": PERF_RESULTS,
    "dist_runs": DIST_RUNS,
    "dist_results": DIST_RESULTS,
    "gen_results": GEN_RESULTS_TABLE,
}


# Tables that shard databases contribute to a merge (gate decisions are derived, not merged).
MERGED = ("runs", "run_shards", "ops", "op_results", "model_results", "coverage", "flakes", "group_times",
          "schema_corpus", "traced_signatures", "traced_uses", "perf_runs", "perf_results",
          "dist_runs", "dist_results", "gen_results")


def _v1(db: sqlite_utils.Database) -> None:
    db["runs"].create(RUNS, pk="id", if_not_exists=True)
    db["run_shards"].create(RUN_SHARDS, pk=("run_id", "shard"), if_not_exists=True)
    db["ops"].create(OPS, pk=("torch_version", "name"), if_not_exists=True)
    for table, columns in (("op_results", OP_RESULTS), ("model_results", MODEL_RESULTS)):
        db[table].create({"id": int, **columns}, pk="id", if_not_exists=True)
        db[table].create_index(["run_id", "item_key"], unique=True, if_not_exists=True)
        db[table].create_index(["run_id", "status"], if_not_exists=True)
    db["op_results"].create_index(["run_id", "op", "dtype"], if_not_exists=True)
    db["model_results"].create_index(["run_id", "family"], if_not_exists=True)


def _v2(db: sqlite_utils.Database) -> None:
    db["coverage"].create(COVERAGE, pk=("run_id", "name"), if_not_exists=True)
    db["flakes"].create(FLAKES, pk=("run_id", "item_key"), if_not_exists=True)
    db["gate_items"].create({"id": int, **GATE_ITEMS}, pk="id", if_not_exists=True)
    db["gate_items"].create_index(["baseline_run", "candidate_run", "category"], if_not_exists=True)
    for col, typ in (("reached_ops", str), ("inputs", bytes)):
        if col not in db["op_results"].columns_dict:
            db["op_results"].add_column(col, typ)


def _v3(db: sqlite_utils.Database) -> None:
    for table in ("op_results", "model_results"):
        if "output" not in db[table].columns_dict:
            db[table].add_column("output", str)


def _v4(db: sqlite_utils.Database) -> None:
    if "proof" not in db["op_results"].columns_dict:
        db["op_results"].add_column("proof", str)


def _v5(db: sqlite_utils.Database) -> None:
    for col in ("contracts", "contract_failed"):
        if col not in db["op_results"].columns_dict:
            db["op_results"].add_column(col, str)


def _v6(db: sqlite_utils.Database) -> None:
    for table, col, typ in (("op_results", "fingerprint", str), ("model_results", "fingerprint", str),
                            ("model_results", "noise", float)):
        if col not in db[table].columns_dict:
            db[table].add_column(col, typ)


def _v7(db: sqlite_utils.Database) -> None:
    if "fwd_rel_err" not in db["model_results"].columns_dict:
        db["model_results"].add_column("fwd_rel_err", float)


def _v8(db: sqlite_utils.Database) -> None:
    db["group_times"].create(GROUP_TIMES, pk=("run_id", "shard", "group_key"), if_not_exists=True)


def _v9(db: sqlite_utils.Database) -> None:
    if "worst" not in db["op_results"].columns_dict:
        db["op_results"].add_column("worst", str)


# Indexes for browsing the store with Datasette (``nox -s browse``) and its canned queries
# (opdb/browse.toml), each over a nightly's 600,000 op results: a facet on status across runs
# (without it, Datasette's 200 ms facet limit times out); a run's mismatches by error, read in
# index order by worst_mismatches; a run's items that fell back, for fallbacks_of_a_build.
BROWSE_INDEXES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("op_results", ("status",)),
    ("op_results", ("run_id", "status", "max_rel_err")),
    ("op_results", ("run_id", "fallback_ops")),
)


def _v10(db: sqlite_utils.Database) -> None:
    for table, columns in BROWSE_INDEXES:
        db[table].create_index(list(columns), if_not_exists=True)


def _v11(db: sqlite_utils.Database) -> None:
    db["schema_corpus"].create(SCHEMA_CORPUS, pk="overload", if_not_exists=True)


def _v12(db: sqlite_utils.Database) -> None:
    db["causes"].create(CAUSES, pk="key", if_not_exists=True)
    db["cause_reach"].create(CAUSE_REACH, pk=("run_id", "cause"), if_not_exists=True)
    db["cause_reach"].create_index(["cause"], if_not_exists=True)
    db["cause_runs"].create(CAUSE_RUNS, pk="run_id", if_not_exists=True)
    for table in ("op_results", "model_results"):
        if "cause" not in db[table].columns_dict:
            db[table].add_column("cause", str)


def _v13(db: sqlite_utils.Database) -> None:
    db["claims"].create(CLAIMS, pk=("run_id", "api", "dtype"), if_not_exists=True)


def _v14(db: sqlite_utils.Database) -> None:
    if "owner" not in db["run_shards"].columns_dict:
        db["run_shards"].add_column("owner", str)


def _v15(db: sqlite_utils.Database) -> None:
    db["traced_signatures"].create(TRACED_SIGNATURES, pk=("torch_version", "key"), if_not_exists=True)
    db["traced_signatures"].create_index(["torch_version", "op", "dtype"], if_not_exists=True)
    db["traced_uses"].create(TRACED_USES, pk=("torch_version", "key", "model"), if_not_exists=True)


def _v16(db: sqlite_utils.Database) -> None:
    db["perf_runs"].create(PERF_RUNS, pk="id", if_not_exists=True)
    db["perf_results"].create(PERF_RESULTS, pk=("run_id", "item_key"), if_not_exists=True)
    db["perf_results"].create_index(["subject", "dtype"], if_not_exists=True)


def _v17(db: sqlite_utils.Database) -> None:
    db["dist_runs"].create(DIST_RUNS, pk="id", if_not_exists=True)
    db["dist_results"].create(DIST_RESULTS, pk=("run_id", "item_key"), if_not_exists=True)


def _v18(db: sqlite_utils.Database) -> None:
    db["gen_results"].create({"id": int, **GEN_RESULTS_TABLE}, pk="id", if_not_exists=True)
    db["gen_results"].create_index(["run_id", "item_key"], unique=True, if_not_exists=True)
    db["gen_results"].create_index(["run_id", "status"], if_not_exists=True)
    db["gen_results"].create_index(["run_id", "model_id"], if_not_exists=True)


MIGRATIONS: list[Callable[[sqlite_utils.Database], None]] = [_v1, _v2, _v3, _v4, _v5, _v6, _v7, _v8, _v9, _v10,
                                                             _v11, _v12, _v13, _v14, _v15, _v16, _v17, _v18]
SCHEMA_VERSION = len(MIGRATIONS)


def version(db: sqlite_utils.Database) -> int:
    return db.execute("PRAGMA user_version").fetchone()[0]


def execute_waiting(conn: sqlite3.Connection, sql: str, *, wait_s: float = LOCK_WAIT_S) -> None:
    """Execute ``sql``, retrying up to ``wait_s`` while another process holds the lock it needs.

    For the two statements SQLite's busy timeout does not wait on: ``BEGIN IMMEDIATE`` (a
    deferred transaction that reads first and then writes fails at once with "database is
    locked" in WAL mode when another process wrote in between, so writers take the lock up
    front) and the switch of a new file to WAL (which needs the file to itself)."""
    deadline = time.monotonic() + wait_s
    delay = 0.02
    while True:
        try:
            conn.execute(sql)
            return
        except sqlite3.OperationalError as exc:
            if ("locked" not in str(exc) and "busy" not in str(exc)) or time.monotonic() >= deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.5)


def migrate(db: sqlite_utils.Database) -> int:
    """Bring ``db`` up to ``SCHEMA_VERSION``; returns the version it ends at.

    All missing steps run in one write transaction taken before the version is read, so
    processes opening one new database at once (pytest-xdist workers, shards) migrate it once,
    one after the other, and none of them fails with "database is locked"."""
    if version(db) >= SCHEMA_VERSION:
        return version(db)
    conn = db.conn
    own = not conn.in_transaction
    if own:
        execute_waiting(conn, "BEGIN IMMEDIATE")
    try:
        current = version(db)  # read under the write lock: another process may have migrated meanwhile
        for step, fn in enumerate(MIGRATIONS[current:], start=current + 1):
            fn(db)
            db.execute(f"PRAGMA user_version = {step}")
    except BaseException:
        if own and conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    if own:
        conn.execute("COMMIT")
    return version(db)
