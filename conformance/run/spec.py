"""The run spec: everything that defines a run, one frozen record.

What a run stores (``runs.config``) and what ``--resume``, re-runs and the gate read back are
generated from the fields: a field is stored under its name (or the ``config`` key its metadata
names; ``None``: not stored, e.g. the worker count, a per-session choice), and read back with
the field's type. Fields that live in a column of ``runs`` (target, id) are read from there.
Adding a run option is one field here (plus its click option, and the code that uses it).

Example::

    >>> spec = RunSpec(target="cpu", ops=("abs",), dtypes=("float32",))
    >>> config = spec.to_config()
    >>> config["ops"], config["build_spec"], "workers" in config
    (['abs'], None, False)
    >>> RunSpec.from_run({"id": "r1", "target": "cpu", "build": "-", "config": json.dumps(config)}) == \\
    ...     RunSpec(target="cpu", ops=("abs",), dtypes=("float32",), run_id="r1")
    True
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance.check.contracts import DEFAULT_BUDGET, parse_contracts
from conformance.check.ledger import Ledger
from conformance.inputs.opinfo import DEFAULT_SEED
from conformance.select import VARIANTS, SelectionError, parse_dtypes, parse_reference_slice, parse_shard
from conformance.sweep.ladder import SIZES
from conformance.sweep.opinfo import SweepConfig
from conformance.targets import BuildRef
from conformance.work import Selection


def _stored(key: str | None = "", column: str | None = None, *, omit_default: bool = False) -> dict[str, Any]:
    """Field metadata: the ``runs.config`` key ("" = the field's name, None = not stored), the
    ``runs`` column to read the value from when the config holds none, and ``omit_default``: an
    option added later is stored only when set, so the config of a run without it (and the
    identity of stored results) stays as it was; read back, a missing key is the default."""
    return {"config": key, "column": column, "omit_default": omit_default}


@dataclass(frozen=True)
class RunSpec:
    target: str = field(default="neuron-emu", metadata=_stored(None, column="target"))
    # the build asked for (a name or a manifest .toml; the default build when left out)
    build: BuildRef = field(default=BuildRef(), metadata=_stored("build_spec", column="build"))
    # modules imported before the target is set up, in the supervisor and in every worker
    # (``--import``: what registers a ``device:TYPE`` with torch)
    imports: tuple[str, ...] = field(default=(), metadata=_stored(omit_default=True))
    # NAME=VALUE environment variables set before the target loads, in the supervisor and in
    # every worker (``--env``: a device runtime's switches, e.g. one that surfaces errors)
    env: tuple[str, ...] = field(default=(), metadata=_stored(omit_default=True))
    ops: tuple[str, ...] = ()  # OpInfo globs; aten:: globs select schema searches
    dtypes: tuple[str, ...] = ()
    thorough: bool = False  # reference_inputs instead of sample_inputs
    workers: int = field(default=2, metadata=_stored(None))  # a session's choice, not the run's
    shard: str = "1/1"
    timeout_s: float = 60.0
    seed: int = DEFAULT_SEED  # None is taken as the default seed
    max_samples: int | None = None
    ledger: str | None = None
    # join/label a run explicitly (shards of one run share it)
    run_id: str | None = field(default=None, metadata=_stored(None, column="id"))
    variants: tuple[str, ...] = VARIANTS
    opinfo: bool = True  # the OpInfo sweep
    schema: bool = False  # schema-driven inputs for overloads no OpInfo reaches
    models: tuple[str, ...] = ()  # model families ("all" for every family)
    model_limit: int | None = None  # at most this many graphs per family
    model_modes: tuple[str, ...] = ("eager", "compile")
    # the model items of a zoo architecture (hf.*, timm.*, tv.*); empty: model_modes. The nightly's
    # rotating zoo slice runs eager only (its compile path is the zoo session's: README, The model zoo)
    zoo_modes: tuple[str, ...] = field(default=(), metadata=_stored(omit_default=True))
    # contract checks (conformance.check.contracts): "default" (every contract on an eager target, the
    # cheap ones on a compiler target), "all", "none", or contract names
    contracts: tuple[str, ...] = field(default=("default",), metadata=_stored(omit_default=True))
    # the schema search replays each overload's stored corpus entry (opdb schema_corpus) and
    # searches only where none holds for the overload's fingerprint; off: search everything, store
    # nothing (what is found is the same either way)
    corpus: bool = field(default=True, metadata=_stored(omit_default=True))
    # samples per compiled graph on a compiler target that batches them (conformance.check.batching);
    # 1: every item compiles its own graph; None: the target's own default (Target.default_batch).
    # How items run, not what they are: a verdict is always what the sample alone gets (a batched
    # result that does not pass runs again alone)
    compile_batch: int | None = field(default=None, metadata=_stored(omit_default=True))
    # the CPU side's cache (conformance.check.refcache), shared by the runs of one database: "auto"
    # (a file beside the database), "none", or a path. Where results come from, not what they are.
    refcache: str | None = field(default="auto", metadata=_stored(None))
    # samples per op x variant x dtype the costly contracts (noncontiguous, variants) are checked on
    # before only new shape classes are (conformance.check.contracts.Budget); 0: every sample
    # (always stored: a run stored before there was a budget checked every sample)
    contract_budget: int = field(default=DEFAULT_BUDGET, metadata=_stored())
    # where the work runs (conformance.run.executor): "local" (worker processes here) or "ray"
    # (Ray actors on the cluster at ``ray_address``; None: a Ray started here, "auto": the one
    # `ray start` runs on this machine), each actor holding ``task_resources`` ("neuron_cores=1",
    # "CPU=1"). A session's choice, like the worker count: not what the run is.
    executor: str = field(default="local", metadata=_stored(None))
    # which sizes op items run at (conformance.sweep.ladder): "samples" (the OpInfo's samples),
    # "ladder" (one sample per op x dtype grown across kernel size boundaries), "all" (both), or
    # "auto": both on an eager target, the samples alone on a compiler (a rung is a compile).
    # The CLI's run and the nightly ask for "auto"; a spec built in Python runs the samples
    # unless it asks (a run stored before the ladder existed reads back as "samples")
    sizes: str = field(default="samples", metadata=_stored(omit_default=True))
    # whose reference_inputs the ``reference`` variant sweeps (conformance.sweep.reference): "none",
    # "all", or "K/N", the OpInfos whose name hashes to K modulo N (the nightly's slice of the
    # night). Stored, so a resume and a re-run sweep the slice the run started with
    reference_inputs: str = field(default="none", metadata=_stored(omit_default=True))
    # the generation lane (conformance.generate): the causal LMs it decodes with (hf, hf@K/N, ids), its
    # modes, prompt-length buckets and new tokens per sequence (empty/None: conformance/data/generation.toml's)
    generate: tuple[str, ...] = field(default=(), metadata=_stored(omit_default=True))
    gen_modes: tuple[str, ...] = field(default=("eager", "compile"), metadata=_stored(omit_default=True))
    gen_buckets: tuple[int, ...] = field(default=(), metadata=_stored(omit_default=True))
    gen_new_tokens: int | None = field(default=None, metadata=_stored(omit_default=True))
    ray_address: str | None = field(default=None, metadata=_stored(None))
    task_resources: tuple[str, ...] = field(default=(), metadata=_stored(None))

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalise in place, once
        set_(self, "build", BuildRef.parse(self.build))
        if self.seed is None:
            set_(self, "seed", DEFAULT_SEED)
        for f in dataclasses.fields(self):
            if isinstance(f.default, tuple) and isinstance(getattr(self, f.name), list):
                set_(self, f.name, tuple(getattr(self, f.name)))
        # Checked up front, before a database is opened: a bad value writes nothing. A NaN or
        # infinite timeout would disable the timeout; zero or fewer samples would run nothing.
        t = self.timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            raise SelectionError(f"--timeout {t!r}: must be a finite number of seconds above 0 (e.g. 60)")
        b = self.compile_batch
        if b is not None and (isinstance(b, bool) or not isinstance(b, int) or b < 1):
            raise SelectionError(f"--compile-batch {b!r}: must be a whole number of at least 1 (1: no batching)")
        k = self.contract_budget
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise SelectionError(f"--contract-budget {k!r}: must be a whole number of samples (0: every sample)")
        for name, value in (("--max-samples", self.max_samples), ("--model-limit", self.model_limit)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise SelectionError(f"{name} {value!r}: must be a whole number of at least 1 (or left out for all)")
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            raise SelectionError(f"--workers {self.workers!r}: must be a whole number of at least 1")
        if self.sizes not in SIZES:
            raise SelectionError(f"--sizes {self.sizes!r}: unknown (known: {', '.join(SIZES)})")
        if self.executor not in EXECUTOR_NAMES:
            raise SelectionError(f"--executor {self.executor!r}: unknown (known: {', '.join(EXECUTOR_NAMES)})")
        for pair in self.env:
            name, eq, _ = str(pair).partition("=")
            if not eq or not name or not (name[0].isalpha() or name[0] == "_") \
                    or not all(c.isalnum() or c == "_" for c in name):
                raise SelectionError(f"--env {pair!r}: expected NAME=VALUE, NAME a shell variable name")
        bad = [m for m in self.gen_modes if m not in ("eager", "compile")]
        if bad or not self.gen_modes:
            raise SelectionError(f"--gen-modes {bad[0] if bad else '(none)'!r}: eager, compile or both")
        if any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in self.gen_buckets):
            raise SelectionError(f"--buckets {list(self.gen_buckets)}: prompt lengths, whole numbers >= 1")
        n = self.gen_new_tokens
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise SelectionError(f"--new-tokens {n!r}: a whole number of at least 1")
        parse_resources(self.task_resources)
        parse_shard(self.shard)
        parse_dtypes(self.dtypes)
        set_(self, "reference_inputs", parse_reference_slice(self.reference_inputs))
        try:
            parse_contracts(self.contracts)
        except ValueError as exc:
            raise SelectionError(f"--contracts: {exc}") from None

    @property
    def selection(self) -> Selection:
        return Selection(self.ops, self.dtypes, self.opinfo, self.schema, self.models, self.model_limit, self.variants,
                         self.generate)

    def sweep_config(self) -> SweepConfig:
        """What a worker needs of the spec: the fields SweepConfig shares with it, the ledger loaded."""
        shared = {f.name: getattr(self, f.name) for f in dataclasses.fields(SweepConfig)
                  if f.name != "ledger" and hasattr(self, f.name)}  # the rest: a work kind's own (reference_check)
        # "auto" means beside the database, which only the runner knows (it resolves it first)
        shared["refcache"] = self.refcache_for(None)
        shared["generation"] = (self.gen_modes, self.gen_buckets, self.gen_new_tokens)
        return SweepConfig(**shared, ledger=Ledger.load(self.ledger))

    def refcache_for(self, db_path: str | os.PathLike[str] | None) -> str | None:
        """The cache file this run uses with the database at ``db_path`` (None: no cache)."""
        if self.refcache in (None, "none") or (self.refcache == "auto" and db_path in (None, "", ":memory:")):
            return None
        if self.refcache == "auto":
            db = Path(db_path)  # type: ignore[arg-type]
            return str(db.with_name(db.stem + ".refcache.sqlite"))
        return str(self.refcache)

    def replace(self, **changes: Any) -> RunSpec:
        return dataclasses.replace(self, **changes)

    # -- runs.config -----------------------------------------------------------------------
    def to_config(self) -> dict[str, Any]:
        """The stored fields as JSON values (tuples as lists, the build as its spec)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            key, value = _key(f), getattr(self, f.name)
            if key is not None and not (f.metadata.get("omit_default") and value == f.default):
                out[key] = _plain(value)
        return out

    @classmethod
    def from_run(cls, run: dict[str, Any], **overrides: Any) -> RunSpec:
        """The spec a stored run (a ``runs`` row) was started with; ``overrides`` for what is not
        stored (``workers``). Keys an older run lacks, or stored empty, take the field's default;
        keys this version no longer has are ignored."""
        config = json.loads(run.get("config") or "{}")
        kw: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            key, column = _key(f), f.metadata.get("column")
            value = config.get(key) if key is not None else None
            if value in (None, []) and column is not None:
                value = run.get(column)
            if value in (None, []):
                continue  # the default
            kw[f.name] = _typed(f, value)
        kw.update(overrides)
        return cls(**kw)


#: What ``RunSpec.executor`` may name (conformance.run.executor.EXECUTORS has their classes).
EXECUTOR_NAMES = ("local", "ray")


def parse_resources(items: tuple[str, ...] | list[str]) -> dict[str, float]:
    """``--task-resources`` (``NAME=AMOUNT``, repeatable or comma-separated) as Ray's resource
    dict; ``CPU`` defaults to 1 (each task holds one worker process). A bad entry is refused,
    naming it."""
    out: dict[str, float] = {}
    for item in (p.strip() for text in items for p in str(text).split(",")):
        if not item:
            continue
        name, sep, amount = item.partition("=")
        try:
            value = float(amount)
        except ValueError:
            value = float("nan")
        if not sep or not name.strip() or not math.isfinite(value) or value < 0:
            raise SelectionError(f"--task-resources {item!r}: expected NAME=AMOUNT with AMOUNT a number >= 0, "
                                 "e.g. neuron_cores=1 or CPU=1")
        out[name.strip()] = value
    out.setdefault("CPU", 1.0)
    return out


def _key(f: dataclasses.Field[Any]) -> str | None:
    key = f.metadata.get("config", "")
    return f.name if key == "" else key


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, BuildRef):
        return value.spec
    return value


def _typed(f: dataclasses.Field[Any], value: Any) -> Any:
    """A stored JSON value as the field's type (read from its default)."""
    default = f.default
    if isinstance(default, tuple):
        return tuple(value)
    if isinstance(default, BuildRef):
        return BuildRef.parse(value)
    if isinstance(default, bool):
        return bool(value)
    if isinstance(default, float):
        return float(value)
    return value
