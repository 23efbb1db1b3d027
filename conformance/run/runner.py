"""A run: select work -> execute in isolated worker processes (:mod:`conformance.run.supervisor`)
-> record into opdb.

A run interrupted at any point (even kill -9) resumes with ``--resume RUN_ID``: recorded item
keys are skipped, nothing is run twice. Shards of one run share its id and its spec.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch

from conformance import datafiles
from conformance.check.verdict import Status
from conformance.select import SelectionError, parse_shard, shard_of
from conformance.targets import Target
from conformance.work import Group, ItemKey, Selection
from opdb import Store
from opdb.queries import group_seconds

from .executor import Summary, Work, executor
from .kinds import TABLES, groups_of, kind_of, kind_of_item
from .progress import Console
from .spec import RunSpec
from .supervisor import CPU_CRASHED, Supervisor, start_worker_server, worker_context

__all__ = ["CodeChangedWarning", "EmptyRun", "KilledRunResumed", "Prepared", "RunSpec", "Summary", "Supervisor", "check", "execute_run",
           "prepare", "rerun_items", "run_canaries", "run_into", "run_together", "stderr_progress"]


def _done_by_group(keys: set[str], groups: Sequence[Group] = ()) -> dict[str, set[str]]:
    out: dict[str, set[str]] = collections.defaultdict(set)
    parsed = [(k, ItemKey.parse(k)) for k in keys]
    for k, key in parsed:
        out[key.group_key].add(k)
    # a kind whose group holds items named otherwise (the custom-op lane's glob x dtype group,
    # an item per op its worker found) says which are its own
    for g in groups:
        holds = getattr(kind_of(g), "holds", None)
        if holds is not None:
            out[g.key] = {k for k, key in parsed if holds(g, key)}
    return out


def _git_sha(checkout: Path | None = None) -> str:
    """The harness checkout's commit (12 hex digits), read from its files (no git needed): a
    clone's ``.git`` folder or a worktree's ``.git`` file (``gitdir: …``), the branch's ref loose
    or in ``packed-refs``; "" when there is none."""
    git = (checkout or Path(__file__).resolve().parents[2]) / ".git"  # conformance/run/ -> the checkout
    try:
        if git.is_file():  # a worktree: its own HEAD there, the refs in the common folder
            git = Path(git.read_text().split(":", 1)[1].strip())
        common = git / (git / "commondir").read_text().strip() if (git / "commondir").is_file() else git
        ref = (git / "HEAD").read_text().strip()
        if not ref.startswith("ref: "):
            return ref[:12]
        name = ref[5:]
        for folder in (git, common):
            if (folder / name).is_file():
                return (folder / name).read_text().strip()[:12]
        for line in (common / "packed-refs").read_text().splitlines():
            sha, _, packed = line.partition(" ")
            if packed == name:
                return sha[:12]
    except (OSError, IndexError):
        pass
    return ""


class KilledRunResumed(UserWarning):
    """``--resume`` of a run whose process was killed (kill -9, a lost machine): it says so."""


class CodeChangedWarning(UserWarning):
    """A run resumed with other harness code than it was started with: the items recorded
    before keep the old code's verdicts, the rest get the new one's."""


def _warn_if_code_changed(run: dict[str, Any]) -> None:
    import warnings

    started, now = run.get("git_sha") or "", _git_sha()
    if started and now and started != now:
        warnings.warn(CodeChangedWarning(
            f"run {run['id']} was started with harness commit {started} and resumes with {now}: the "
            "items it recorded before keep that code's verdicts (start a new --run-id for one code's)"),
            stacklevel=2)


def run_canaries(spec: RunSpec, store: Store, run_id: str) -> str | None:
    """Run the canary items; store them (variant ``canary``); return why they failed, or None."""
    data = datafiles.canaries()
    # Values only: a broken install shows in values and errors; a contract failure of a canary op
    # is the build's finding, reported by the run's own items of that op.
    cspec = spec.replace(variants=("function",), max_samples=data.samples, workers=1, contracts=("none",),
                         sizes="samples")  # a few small samples: the ladder is the sweep's
    groups = [Group(op, data.dtype) for op in data.ops]
    rows: list[dict[str, Any]] = []
    sup = executor(Work(cspec, run_id, groups), sink=lambda row, table: rows.append(row))
    sup.run()
    bad = []
    for r in rows:
        r["item_key"] = str(ItemKey.parse(r["item_key"]).with_variant("canary"))
        r["variant"] = "canary"
        if not Status(r["status"]).passed:
            bad.append(f"{r['op']} sample {r['sample']}: {r['status']} ({(r.get('error') or '')[:120]})")
    store.insert("op_results", rows)
    if not rows:
        return "no canary produced a result"
    return "; ".join(bad) or None


def _rerun_status(row: dict[str, Any]) -> str:
    from conformance.check.selfcheck import NOT_REPRODUCIBLE
    from opdb.status import UNREPRODUCIBLE

    # a schema item's re-run searches again: "no valid input" with rejections of that reason means
    # the input it failed on before is not reproducible on the CPU now; a reference that now kills
    # its worker on an input it ran before does not agree with itself either (heap corruption by
    # an input outside the op's contract)
    error = str(row.get("error") or "")
    if row["status"] == "skip" and (NOT_REPRODUCIBLE in error or error.startswith(CPU_CRASHED)):
        return UNREPRODUCIBLE
    return row["status"]


def rerun_items(spec: RunSpec, run_id: str, keys: Sequence[str], attempts: int,
                replay: dict[str, dict[str, Any]] | None = None) -> dict[str, list[str]]:
    """Re-run chosen items ``attempts`` times each (same seeds, isolated workers); returns the
    statuses per item key (:data:`opdb.status.UNREPRODUCIBLE` for a re-run whose CPU reference did not agree
    with itself). ``replay``: by group key, what a group replays (:func:`traced_replays`).
    Nothing is written."""
    by_group: dict[str, set[str]] = collections.defaultdict(set)
    of_group: dict[str, Group] = {}
    for text in keys:
        key = ItemKey.parse(text)
        by_group[key.group_key].add(text)
        of_group[key.group_key] = Group(key.name, key.dtype, kind_of_item(key).name)
    groups = [of_group[g] for g in sorted(by_group)]
    only = {g: frozenset(v) for g, v in by_group.items()}
    out: dict[str, list[str]] = collections.defaultdict(list)
    for _ in range(attempts):
        sup = executor(Work(spec, run_id, groups, only=only, corpus=replay),
                       sink=lambda row, table: out[row["item_key"]].append(_rerun_status(row)))
        sup.run()
    return dict(out)


def _selection_text(spec: RunSpec) -> str:
    parts = [f"--ops {','.join(spec.ops)}" if spec.ops else "every op",
             f"--dtypes {','.join(spec.dtypes)}" if spec.dtypes else "default dtypes"]
    if spec.models:
        parts.append(f"--models {','.join(spec.models)}")
    if spec.generate:
        parts.append(f"--generate {','.join(spec.generate)}")
    return ", ".join(parts)


#: The module whose import (the OpInfo database, seconds of CPU) listing the groups needs.
_OP_DB = "torch.testing._internal.common_methods_invocations"


def _listed(selection: Selection) -> list[Group]:
    """The groups of ``selection`` (:func:`~conformance.run.kinds.groups_of`), listed where the
    OpInfo database is loaded already: here when it is, else in a process forked from the
    worker server, which loads it for the workers anyway (importing it here as well cost the
    supervisor ~3 s of CPU beside the workers, for nothing else). If that process fails to
    answer, they are listed here."""
    if _OP_DB in sys.modules:
        return groups_of(selection)
    start_worker_server()
    ctx = worker_context()
    reader, writer = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_list_groups, args=(selection, writer), daemon=True)
    proc.start()
    writer.close()
    try:
        ok, value = reader.recv()
    except (EOFError, OSError):
        ok, value = None, None
    finally:
        reader.close()
        proc.join()
    if ok is None:
        return groups_of(selection)
    if not ok:
        raise value
    return value


def _list_groups(selection: Selection, conn: Any) -> None:
    """In a process forked from the worker server: send back ``(True, groups)`` or ``(False, error)``."""
    try:
        answer: tuple[bool, Any] = (True, groups_of(selection))
    except Exception as exc:  # noqa: BLE001 - raised in the supervisor (listed there again if it cannot travel)
        answer = (False, exc)
    conn.send(answer)


def _select(spec: RunSpec) -> list[Group]:
    """The run's groups; a selection or shard that holds none is refused, naming why."""
    every = _listed(spec.selection)
    if not every:
        raise SelectionError(f"{_selection_text(spec)}: the selection holds no (op, dtype) pair the CPU supports")
    k, n = parse_shard(spec.shard)
    groups = shard_of(every, (k, n))
    if not groups:
        raise SelectionError(f"--shard {spec.shard}: shard {k} of {n} is empty (the selection has only "
                             f"{len(every)} group{'s' if len(every) != 1 else ''}; use N <= {len(every)})")
    return groups


# Config keys that may differ between shards of one run (everything else defines the run).
_PER_SHARD = ("shard",)


def config_difference(stored: dict[str, Any], mine: dict[str, Any]) -> tuple[str, Any, Any] | None:
    """The first key (sorted) whose value differs between a stored run config and another one,
    as (key, stored value, other value); keys that may differ between shards are not compared."""
    for key in sorted(set(stored) | set(mine)):
        if key not in _PER_SHARD and stored.get(key) != mine.get(key):
            return key, stored.get(key), mine.get(key)
    return None


def _check_run_id(store: Store, spec: RunSpec, config: dict[str, Any], where: str) -> None:
    """A reused --run-id joins the run only as another shard of the same spec: another selection,
    seed or build would mix two runs under one id, and a shard already recorded would be silently
    skipped (that is what --resume is for)."""
    assert spec.run_id is not None
    existing = store.get_run(spec.run_id)
    if existing is None:
        return
    differ = config_difference(json.loads(existing.get("config") or "{}"), json.loads(json.dumps(config, sort_keys=True)))
    if differ is not None:
        key, theirs, mine = differ
        raise SelectionError(f"--run-id {spec.run_id}: {where} holds that run with {key}={theirs!r}, this "
                             f"run has {key}={mine!r}; use a new --run-id (or --resume {spec.run_id})")
    from opdb.queries import results_by_key

    recorded = sum(1 for table in TABLES
                   for r in results_by_key(store, spec.run_id, table, ("shard",)).values()
                   if r["shard"] == spec.shard)
    if recorded or existing.get("status") == "finished":
        raise SelectionError(f"--run-id {spec.run_id}: {where} already holds shard {spec.shard} of that run "
                             f"({recorded} results, status {existing.get('status')}); continue it with "
                             f"--resume {spec.run_id} or use a new --run-id")


def stored_summary(store: Store, run_id: str, shard: str = "1/1") -> Summary:
    """The summary of a run (shard) swept by an earlier session, from what the store holds."""
    summary = Summary(run_id)
    _whole_run(store, run_id, shard, summary)
    return summary


def _whole_run(store: Store, run_id: str, shard: str, summary: Summary) -> None:
    """Counts and items of everything the run (this shard) holds, earlier sessions included:
    a resumed run's exit code and summary are about the whole run, not the part run now."""
    from opdb.queries import results_by_key

    counts: collections.Counter[str] = collections.Counter()
    for table, cols in (("op_results", ("status", "shard", "variant")), ("model_results", ("status", "shard")),
                        ("gen_results", ("status", "shard"))):
        for r in results_by_key(store, run_id, table, cols).values():
            if r["shard"] == shard and r.get("variant") != "canary":
                counts[r["status"]] += 1
    summary.counts = counts
    summary.items = sum(counts.values())


def _run_kind(spec: RunSpec) -> str:
    """``runs.kind``: ops, models, generate (the generation lane alone) or mixed (more than one of them)."""
    parts = [k for k, on in (("ops", spec.opinfo or spec.schema or bool(spec.ops)), ("models", bool(spec.models)),
                             ("generate", bool(spec.generate))) if on]
    return parts[0] if len(parts) == 1 else ("mixed" if parts else "ops")


class EmptyRun(SelectionError):
    """A run that recorded no item: there is nothing to check, which is never a pass."""


class Prepared(NamedTuple):
    """A run checked before anything is written: its spec (a resumed run's as it was started),
    its groups and, for a new run, its set-up target."""

    spec: RunSpec
    groups: list[Group]
    target: Target | None


def execute_run(spec: RunSpec, db_path: str | os.PathLike[str], *, resume: str | None = None,
                progress: Callable[[str], None] | None = None) -> Summary:
    """Run (or resume) a sweep into the database at ``db_path`` (:func:`run_into`); a bad spec
    or selection is refused before the database is created or written."""
    start_worker_server(spec.target)  # its imports overlap with the selection's
    run = None
    if resume:
        with Store.open(db_path, create=False) as store:  # a missing database is not created
            run = store.get_run(resume)
        if run is None:
            raise SelectionError(f"{db_path}: no run with id {resume!r} to resume")
    prepared = prepare(spec, resumed=run)
    with Store.open(db_path) as store:
        return run_into(spec, store, resume=resume, progress=progress, prepared=prepared)


def check(spec: RunSpec) -> list[Group]:
    """The run's groups, once the ledger loads, the executor can start and the selection and
    shard hold some (else raises)."""
    spec.sweep_config()
    if spec.executor == "ray":
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            raise SelectionError("--executor ray needs Ray, an optional extra: pip install -e '.[ray]' -c constraints.txt")
    return _select(spec)


def prepare(spec: RunSpec, resumed: dict[str, Any] | None = None) -> Prepared:
    """Check a run (the stored run ``resumed`` continues, when given) and set up its target."""
    from conformance.targets import get_target

    if resumed is not None:
        spec = RunSpec.from_run(resumed, workers=spec.workers)
        return Prepared(spec, check(spec), None)
    groups = check(spec)
    target = get_target(spec.target, spec.build, spec.imports, spec.env)
    return Prepared(spec.replace(build=spec.build.resolved()), groups, target)


def run_into(spec: RunSpec, store: Store, *, resume: str | None = None,
             progress: Callable[[str], None] | None = None, prepared: Prepared | None = None) -> Summary:
    """Run (or resume) a sweep into an open store; returns the summary of the whole run (this
    shard), earlier sessions of a resumed run included. A run that ends with no item raises
    :class:`EmptyRun` (after recording it). Nothing is written when the spec or selection is bad."""
    return run_together([(spec, resume, prepared)], store, progress=progress)[0]


def run_together(runs: Sequence[tuple[RunSpec, str | None, Prepared | None]], store: Store, *,
                 progress: Callable[[str], None] | None = None) -> list[Summary]:
    """Several runs (spec, run id to resume or None, prepared or None) into one store, as
    :func:`run_into` runs one: each is started (or resumed) and its canaries run first; then an
    executor that takes several runs' work (Ray) runs them all in one queue, any other runs them
    one after the other. A run whose canaries failed gets its infra summary and no sweep. An
    interruption ends every run still sweeping (each is marked interrupted). An empty run raises
    :class:`EmptyRun` after every run is recorded."""
    started = [_start(spec, store, resume, prepared) for spec, resume, prepared in runs]
    works = [w for w in started if isinstance(w, Work)]
    summaries: dict[str, Summary] = {}
    if len(works) > 1 and works[0].spec.executor != "local":
        sup = executor(works[0], store, progress=progress, also=works[1:])
        for w, summary in zip(works, _execute(sup, store), strict=True):
            summaries[w.run_id] = summary
    else:
        for w in works:
            sup = executor(w, store, progress=progress)
            summary = summaries[w.run_id] = _execute(sup, store)[0]
            if summary.interrupted:
                break
    out: list[Summary] = []
    empty = None
    for w in started:
        if not isinstance(w, Work):
            out.append(w)
            continue
        # a run after an interrupted one (one after the other) was never swept: it is interrupted too
        summary = summaries.get(w.run_id) or Summary(w.run_id, interrupted=True)
        store.finish_run(w.run_id, shard=w.spec.shard, status="interrupted" if summary.interrupted else "finished")
        _whole_run(store, w.run_id, w.spec.shard, summary)
        if not summary.items and not summary.interrupted and empty is None:
            empty = EmptyRun(f"run {w.run_id}: {_selection_text(w.spec)}, --variants {','.join(w.spec.variants)}: "
                             "the run recorded no item, so nothing was checked")
        out.append(summary)
    if empty is not None:
        raise empty
    return out


def _start(spec: RunSpec, store: Store, resume: str | None, prepared: Prepared | None) -> Work | Summary:
    """Start (or resume) a run in the store and run its canaries: its work, or (canaries failed)
    its infra summary."""
    where = str(store.path or ":memory:")
    start_worker_server(spec.target)
    if prepared is None:
        run = store.get_run(resume) if resume else None
        if resume and run is None:
            raise SelectionError(f"{where}: no run with id {resume!r} to resume")
        prepared = prepare(spec, resumed=run)
    # the session's choices (executor, cluster) are not stored: a resumed run takes this session's
    session = {"executor": spec.executor, "ray_address": spec.ray_address, "task_resources": spec.task_resources}
    spec, groups, target = prepared
    spec = spec.replace(refcache=spec.refcache_for(store.path), **session)
    if resume:
        _warn_if_code_changed(store.get_run(resume) or {"id": resume})
        if store.killed(resume):
            import warnings

            warnings.warn(KilledRunResumed(
                f"run {resume} was killed: its process is gone and nothing marked its end; it resumes from "
                "the items it recorded (the item in flight when it died runs again)"), stacklevel=2)
        store.resume_run(resume, shard=spec.shard)
        run_id = resume
    else:
        assert target is not None
        config = {**spec.to_config(), "layouts": target.probe_layouts()}
        if spec.run_id:
            _check_run_id(store, spec, config, where)
        run_id = store.start_run(
            target=spec.target, build=target.build, torch_version=torch.__version__,
            kind=_run_kind(spec),
            config=config, run_id=spec.run_id, shard=spec.shard, git_sha=_git_sha())
    infra = run_canaries(spec, store, run_id)
    if infra:
        store.set_run_status(run_id, "infra")
        store.finish_run(run_id, shard=spec.shard, status="infra")
        return Summary(run_id, infra=infra)
    done = _done_by_group(set().union(*(store.done_keys(table, run_id) for table in TABLES)), groups)
    failed = _done_by_group(set().union(*(store.done_keys(table, run_id, failing=True) for table in TABLES)), groups)
    history = group_seconds(store, target=spec.target, torch_version=torch.__version__, exclude_run=run_id)
    build = (store.get_run(run_id) or {}).get("build") or str(spec.build)  # the build the target reported
    traced_groups, signatures = _traced(spec, store)
    groups = [*groups, *traced_groups]
    return Work(spec, run_id, groups, done, failed=failed, history=history, stage=f"sweep {spec.target} {build}".rstrip(),
                corpus={**_corpus(spec, store, groups), **signatures})


def _execute(sup: Any, store: Store) -> list[Summary]:
    """Run an executor (SIGTERM taken as Ctrl-C); its group times are stored whatever happens.
    Returns each of its runs' summaries."""
    previous = signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        summary = sup.run()
    finally:
        signal.signal(signal.SIGTERM, previous)
        store.insert("group_times", sup.group_times)  # a resumed group keeps its first timing
    return list(getattr(sup, "summaries", [summary]))


def _traced(spec: RunSpec, store: Store) -> tuple[list[Group], dict[str, dict[str, Any]]]:
    """The run's traced groups (:mod:`conformance.sweep.traced`: the signatures the database holds
    for this torch, as ``--sizes``, ``--ops``, ``--dtypes`` and ``--shard`` select them) and, by
    group key, what each replays (``{"signatures": [...]}``, each with the models using it)."""
    from conformance.sweep.ladder import traced_wanted
    from conformance.sweep.traced import TRACED, selects

    if not traced_wanted(spec.sizes) or not (spec.opinfo or spec.selection.aten_globs):
        return [], {}
    chosen = _signatures(store, lambda op, dtype: selects(spec.selection, op, dtype))
    groups = shard_of([Group(op, dtype, TRACED.name) for op, dtype in chosen], parse_shard(spec.shard))
    return groups, _replays(store, groups, chosen)


def traced_replays(spec: RunSpec, store: Store, keys: Sequence[str]) -> dict[str, dict[str, Any]]:
    """What re-running these item keys of a run of ``spec`` replays: for those of traced groups,
    the group's signatures as the run had them (:func:`rerun_items`' ``replay``)."""
    from conformance.sweep.traced import TRACED

    wanted = {ItemKey.parse(k).group_key for k in keys if kind_of_item(k) is TRACED}
    if not wanted:
        return {}
    chosen = _signatures(store, lambda op, dtype: Group(op, dtype).key in wanted)
    return _replays(store, [Group(op, dtype, TRACED.name) for op, dtype in chosen], chosen)


def _signatures(store: Store, keep: Callable[[str, str], bool]) -> dict[tuple[str, str], list[Any]]:
    """The signatures a run replays (:func:`conformance.sweep.traced.replayed`) of the (overload,
    dtype) pairs ``keep`` accepts."""
    from conformance.sweep.traced import replayed
    from opdb import traced as stored

    return {k: sigs for k, sigs in replayed(stored.selected(store, torch.__version__)).items() if keep(*k)}


def _replays(store: Store, groups: Sequence[Group], chosen: dict[tuple[str, str], list[Any]]) -> dict[str, dict[str, Any]]:
    from opdb import traced as stored

    users = stored.uses(store, torch.__version__, [s["key"] for g in groups for s in chosen[(g.op, g.dtype)]])
    return {g.key: {"signatures": [{**s, "used_by": [m for m, _ in users.get(s["key"], [])][:10]}
                                   for s in chosen[(g.op, g.dtype)]]} for g in groups}


def _corpus(spec: RunSpec, store: Store, groups: Sequence[Group]) -> dict[str, dict[str, Any]]:
    """The stored corpus entries of the run's schema searches, by group key (none when off)."""
    if not spec.corpus:
        return {}
    from conformance.sweep.schema import SCHEMA
    from opdb.corpus import corpus_entries

    searches = {g.op: g.key for g in groups if g.kind == SCHEMA.name}
    if not searches:
        return {}
    return {searches[name]: row for name, row in corpus_entries(store, searches).items()}


def stderr_progress() -> Console:
    """The console's progress writer (stderr): one line redrawn per stage on a terminal, a line
    every 10 s in a log."""
    return Console()
