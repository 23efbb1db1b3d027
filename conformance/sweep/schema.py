"""The schema search, a work kind: for each ATen overload no OpInfo reaches, a derandomized,
bounded Hypothesis search over calls drawn from its schema (:mod:`conformance.inputs.schema`).

Examples the CPU reference rejects are discarded; accepted ones run on the target through the
same execute/compare/decide path as OpInfo samples (:func:`conformance.sweep.evaluate`); on a
mismatch Hypothesis shrinks to a minimal failing input, and that input is stored (``inputs``
blob) so ``conformance repro`` reproduces it. One group is one overload; it has one item,
``{overload}|schema|any|0``.

When a search finds no input the CPU accepts, the CPU's own error messages are read for what
it wanted (:func:`~conformance.inputs.hints.hints_from_errors`) and up to ``STEERED_PASSES``
more searches are steered by them. An input that crashes the reference kernel kills its worker;
the supervisor then re-sends the overload with a crash-safe :class:`~conformance.work.Skip`
and every input's CPU run is first tried in a forked child (:func:`cpu_preflight`).

Example::

    >>> from conformance.sweep.schema import SCHEMA
    >>> [g.key for g in SCHEMA.groups(Selection(ops=("aten::_foreach_abs.default",)))]
    ['aten::_foreach_abs.default|any']
"""

from __future__ import annotations

import collections
import dataclasses
import os
import signal
import time
from collections.abc import Callable, Container, Iterator
from functools import cache
from typing import Any

import torch
from hypothesis import HealthCheck, Phase, given, reject, settings
from hypothesis import strategies as st

from conformance.catalog import overloads as catalog
from conformance.catalog.overloads import packet_of
from conformance.check import contracts
from conformance.check.compare import leaves
from conformance.check.execute import clone_sample, on_device, phase, signature
from conformance.check.verdict import Status, decide, decide_unrun
from conformance.inputs import corpus
from conformance.inputs.hints import Hints, hints_from_errors
from conformance.inputs.opinfo import by_name, cpu_dtypes
from conformance.inputs.schema import NOARG, Call, DeviceArg, call_strategy
from conformance.select import DEFAULT_DTYPES, matching
from conformance.work import NOTHING, Group, ItemKey, Selection
from opdb.blobs import dump_inputs

from .opinfo import evaluate
from .opinfo import evaluate as evaluate_item

MAX_EXAMPLES = 12
REJECTED_CHECKED = 3  # inputs the CPU rejected that are also run on the target (contract "errors")
REJECT_CAP = 120  # calls rejected by the CPU in one search before it is given up
STEERED_PASSES = 2  # further searches steered by the rejections' hints


class SchemaSearch:
    """The work kind: one group per candidate overload (``aten::`` globs in ``--ops`` choose
    among them and, alone, select nothing else)."""

    name = "schema"
    table = "op_results"
    variants = ("schema",)
    crash_safe_factor = 3  # a crash-safe search forks twice per input

    def groups(self, selection: Selection) -> list[Group]:
        if not (selection.schema or selection.aten_globs):
            return []
        return [Group(name, "any", self.name) for name in select_overloads(selection.aten_globs)]

    def run(self, target: Any, group: Group, config: Any, *, skip: Container[str] = NOTHING,
            on_start: Callable[[str], None] | None = None) -> Iterator[dict[str, Any]]:
        """As :func:`run_schema_group`, each row carrying its ``_corpus`` side record for the
        supervisor (which pops it before the row is stored)."""
        side: list[dict[str, Any]] = []
        for row in run_schema_group(target, group, config, skip=skip, on_start=on_start, side=side):
            yield {**row, "_corpus": side.pop()} if side else row

    def synthetic_row(self, key: ItemKey) -> dict[str, Any]:
        return {"op": key.name, "variant": key.variant, "dtype": key.dtype, "sample": int(key.sample)}


SCHEMA = SchemaSearch()


def select_overloads(globs: list[str]) -> list[str]:
    """Schema-driven candidates (overloads no OpInfo reaches) matching ``aten::`` globs (all
    candidates when there are none)."""
    return matching(schema_candidates(), globs, "overload", "matches no schema-driven candidate (an overload no "
                    "OpInfo reaches, e.g. 'aten::_foreach_*'; see `conformance ops --json`)")


@cache
def schema_candidates() -> tuple[str, ...]:
    """Overloads a backend can see that no OpInfo the sweep runs reaches (the map is measured
    from each OpInfo's first sample; an OpInfo with no default dtype on the CPU runs nothing).
    Layout-specific overloads are candidates too: most take strided inputs, and those that do
    not are told apart by the CPU's own rejections."""
    infos = by_name()

    def runs(name: str) -> bool:
        info = infos.get(name)
        return info is not None and any(str(d).removeprefix("torch.") in DEFAULT_DTYPES for d in cpu_dtypes(info))

    skip = ("composite_implicit", "no_cpu_kernel")
    return tuple(o.name for o in catalog.overloads(with_opinfos=True)
                 if not any(runs(i) for i in o.opinfos) and not any(o.has(c) for c in skip))


PREFLIGHT_TIMEOUT_S = 30.0
CRASH_SAFE_SHRINK_STEPS = 60


def _in_child(run: Callable[[], None]) -> str | None:
    """Run ``run`` in a forked child; how it died ("crashed (signal X)", "hung"), or None."""
    pid = os.fork()
    if pid == 0:  # child: run, then leave without cleanup (exceptions are reported by the real run)
        import faulthandler
        import gc

        faulthandler.disable()  # an expected crash, reported by the parent; no traceback dump
        # what the parent had is not this child's to free: collecting it (inherited tensors of other
        # devices, compiler pools, threads' locks) could crash or hang the child for reasons that
        # have nothing to do with the input, and turn a valid input into a "crash"
        gc.freeze()
        try:
            run()
            gc.collect()  # free now: heap corruption often only shows when memory is freed
        except BaseException:  # noqa: BLE001, S110
            pass
        os._exit(0)
    deadline = time.monotonic() + PREFLIGHT_TIMEOUT_S
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return f"hung (over {PREFLIGHT_TIMEOUT_S:g} s)"
        time.sleep(0.002)
    if os.WIFSIGNALED(status):
        return f"crashed (signal {signal.Signals(os.WTERMSIG(status)).name})"
    return None


def cpu_preflight(info: Any, sample: Any) -> str | None:
    """Run the CPU reference on ``sample`` in a forked child first; the reason when the child
    died (a crashing reference kernel is a rejected input, not the end of the search)."""
    cpu = clone_sample(sample, lambda t: t.clone())
    died = _in_child(lambda: info.op(cpu.input, *cpu.args, **cpu.kwargs))
    return None if died is None else f"CPU reference {died}"


def target_preflight(target: Any, info: Any, sample: Any) -> str | None:
    """Run ``sample`` on the target alone in a forked child (no CPU reference ran in that
    process, so nothing the reference corrupted can fail there); how the target died, or None."""

    def run() -> None:
        dev = on_device(sample, target.device)
        target.wrap(info.op)(dev.input, *dev.args, **dev.kwargs)
        target.synchronize()

    return _in_child(run)


class _Info:
    """The slice of an OpInfo that the executor uses, for a bare ATen overload."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.variant_test_name = ""
        self.packet = packet = packet_of(name)
        self.op = lambda *a, **k: packet(*(x for x in a if x is not NOARG), **k)
        # No other variants, aliases or error inputs: an overload's own contract with rejected
        # inputs is checked on the inputs the CPU rejects during the search (check_rejected).
        self.inplace_variant = None
        self.method_variant = None
        self.aliases = ()
        self.supports_out = False
        self.error_inputs_func = None


def _sample_of(call: Call) -> Any:
    from torch.testing._internal.opinfo.core import SampleInput  # heavy: only when a search runs

    args, kwargs = call.materialize()
    if args:
        return SampleInput(args[0], args=args[1:], kwargs=kwargs)
    return SampleInput(NOARG, args=(), kwargs=kwargs)


@dataclasses.dataclass
class _Found:
    """What a search (or a replay of its corpus entry) saw of one overload, before its row."""

    steered: str = ""  # " (steered by the CPU's errors: ...)" or ""
    accepted: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # rows of accepted inputs
    failing: dict[str, Any] = dataclasses.field(default_factory=dict)  # {"row", "call", "contracts"}
    rejections: list[contracts.Check] = dataclasses.field(default_factory=list)  # contract errors
    rejected: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    # the inputs for the corpus, in the order seen: (role, checked the contracts, Call)
    log: list[tuple[str, bool, Call]] = dataclasses.field(default_factory=list)
    summary: str | None = None  # a replayed no_valid_input's stored error


def run_schema_group(target: Any, group: Group, config: Any, *, skip: Container[str] = NOTHING,
                     on_start: Callable[[str], None] | None = None,
                     side: list[dict[str, Any]] | None = None) -> Iterator[dict[str, Any]]:
    """Search inputs for one overload (or replay its corpus entry, ``skip.replay``) and yield its
    single result row. ``skip`` may ask for a crash-safe search (:attr:`conformance.work.Skip.crash_safe`).

    Before the row, ``side`` (when given) gets the corpus's side record: ``how`` (replayed |
    searched), ``why`` it searched, and ``entry``, the ``schema_corpus`` row to store."""
    side = [] if side is None else side
    key = str(group.item("schema"))
    if key in skip:
        return
    if on_start:
        on_start(key)
    info = _Info(group.op)
    base_row = {"item_key": key, "op": group.op, "variant": "schema", "dtype": "any", "sample": 0,
                "seed": config.seed}
    try:
        call_strategy(info.packet)
    except ValueError as exc:
        yield {**base_row, "status": decide_unrun("cpu").value, "error": f"no valid input: {exc}", "duration_s": 0.0}
        return
    crash_safe = bool(getattr(skip, "crash_safe", False))
    # The contracts are checked on the first accepted input (each example again would multiply
    # the search's cost); "errors" on the first inputs the CPU rejects.
    check_errors = "errors" in contracts.parse_contracts(config.contracts, target)
    digest, basis = corpus.fingerprint(group.op, search_basis())
    old, why = _stored_entry(getattr(skip, "replay", None), digest)
    if old is not None and not crash_safe:  # a crash-safe re-run searches, as it did before
        found, why = _replay(target, info, group, config, old, check_errors)
        if found is not None:
            side.append({"how": "replayed"})
            yield _row_of(found, base_row)
            return
    elif old is not None:
        why = "crash-safe re-run"
    found = _search(target, info, group, config, crash_safe=crash_safe, check_errors=check_errors)
    row = _row_of(found, base_row)
    entry = _merged(_entry_of(group.op, digest, found, crash_safe, row), old)
    side.append({"how": "searched", "why": why, "entry": corpus.encode(entry, basis=basis)})
    yield row


@cache
def search_basis() -> dict[str, Any]:
    """What of the search itself decides the inputs it generates (the corpus fingerprint's part):
    its budgets and the source of :func:`_search`, from which Hypothesis derives its seed."""
    import hashlib
    import inspect

    return {**BUDGETS, "source": hashlib.sha256(inspect.getsource(_search).encode()).hexdigest()}


BUDGETS = {"max_examples": MAX_EXAMPLES, "rejected_checked": REJECTED_CHECKED, "reject_cap": REJECT_CAP,
           "steered_passes": STEERED_PASSES, "crash_safe_shrink_steps": CRASH_SAFE_SHRINK_STEPS}


def _stored_entry(raw: dict[str, Any] | None, digest: str) -> tuple[corpus.Entry | None, str]:
    """The replayable entry of ``raw`` (a ``schema_corpus`` row), or None and why not."""
    if raw is None:
        return None, "no corpus entry"
    try:
        entry = corpus.decode(raw)
    except corpus.CorpusError as exc:  # ignored: the search's entry replaces it
        return None, f"corpus entry ignored: {exc}"
    if entry.fingerprint != digest:
        return None, "schema, CPU kernels, torch or the search changed since the corpus entry was stored"
    return entry, ""


def _search(target: Any, info: Any, group: Group, config: Any, *, crash_safe: bool, check_errors: bool) -> _Found:
    """The bounded, derandomized Hypothesis search over calls drawn from the overload's schema."""
    found = _Found()
    rejected, accepted, failing, rejections = found.rejected, found.accepted, found.failing, found.rejections
    no_contracts = dataclasses.replace(config, contracts=("none",))
    # What the corpus keeps is recorded by these two, which shadow the module's functions for
    # prop: prop's source must stay as it is, since Hypothesis derives a derandomized search's
    # seed from it (an edit there changes every input every search generates).
    seen: list[Call] = []  # every call prop made a sample of, in order
    evaluated: list[tuple[int, bool, dict[str, Any]]] = []  # (index in seen, contracts checked, row)

    def _sample(call: Call) -> Any:  # noqa: F811 - see above
        seen.append(call)
        return _sample_of(call)

    def evaluate(*args: Any) -> dict[str, Any]:  # noqa: F811 - see above
        row = evaluate_item(*args)
        evaluated.append((len(seen) - 1, args[-1] is config, row))
        return row

    def search(strategy: st.SearchStrategy[Call]) -> None:
        # [rejections left, crash-safe shrink steps left]: each crash-safe call costs two forks
        budget = [REJECT_CAP // 3 if crash_safe else REJECT_CAP, CRASH_SAFE_SHRINK_STEPS]

        @settings(max_examples=MAX_EXAMPLES, derandomize=True, database=None, deadline=None, print_blob=False,
                  phases=(Phase.generate, Phase.shrink), suppress_health_check=list(HealthCheck))
        @given(strategy)
        def prop(call: Call) -> None:
            if not accepted and budget[0] <= 0:
                return  # given up: let Hypothesis run out its remaining examples at no cost
            if failing and crash_safe:  # shrinking, two forks a step: bounded
                if budget[1] <= 0:
                    return  # counts as passing: Hypothesis keeps the smallest failure found so far
                budget[1] -= 1
            sample = _sample(call)
            dtype = _first_dtype(sample)
            if crash_safe:
                why = cpu_preflight(info, sample)
                if why is not None:
                    rejected[why] += 1
                    budget[0] -= 1
                    reject()
                died = target_preflight(target, info, sample)
                if died is not None:  # the target's own crash, with no reference run before it
                    row = {"status": decide_unrun("target").value, "dtype": str(dtype).removeprefix("torch.") if dtype else "none",
                           "error": f"the target {died} running this input alone in a forked process "
                                    "(no CPU reference ran there)", "duration_s": 0.0, "signature": signature(sample),
                           "reached_ops": [group.op], "native_ops": [], "fallback_ops": []}
                    accepted.append(row)
                    failing.clear()
                    failing.update(row=row, call=call)
                    raise AssertionError(row["error"])
            row = evaluate(target, info, group.op, "function", str(dtype).removeprefix("torch.") if dtype else "none",
                           0, sample, no_contracts if accepted else config)
            if row["status"] == Status.SKIP.value:
                rejected[(row.get("error") or "")[:200]] += 1
                budget[0] -= 1
                if check_errors and not crash_safe and len(rejections) < REJECTED_CHECKED:
                    rejections.append(check_rejected(target, info, sample, row.get("error") or ""))
                reject()
            accepted.append(row)
            if Status(row["status"]).failed:
                failing.clear()
                failing.update(row=row, call=call)
                raise AssertionError(row.get("error") or row["status"])

        try:
            prop()
        except AssertionError:
            pass
        except Exception as exc:  # noqa: BLE001 - Hypothesis gave up (e.g. Unsatisfiable)
            rejected[f"{type(exc).__name__}: {exc}"[:120]] += 0

    # First an unsteered search; while it finds nothing, the CPU's own rejections (the ranks and
    # dtypes it asked for) steer up to STEERED_PASSES more.
    search(call_strategy(info.packet))
    hints = Hints()
    for _ in range(1 if crash_safe else STEERED_PASSES):
        if accepted:
            break
        more = hints.merge(hints_from_errors(rejected))
        if more == hints:
            break
        hints = more
        search(call_strategy(info.packet, hints))
    found.steered = f" (steered by the CPU's errors: {hints.describe()})" if hints else ""
    _log(found, seen, evaluated, crash_safe)
    return found


def _log(found: _Found, seen: list[Call], evaluated: list[tuple[int, bool, dict[str, Any]]], crash_safe: bool) -> None:
    """The inputs the corpus keeps, in the order the search saw them: the first rejected ones
    (those the ``errors`` contract is checked on), the accepted ones generated before the first
    failure (shrinking steps come after it), and the minimal failing one's contracts flag."""
    call = found.failing.get("call")
    # where the first failure happened: an evaluated failing row, or a target crash (crash-safe)
    first_bad = next((i for i, _, row in evaluated if Status(row["status"]).failed), None)
    if call is not None:
        at = next((i for i, c in enumerate(seen) if c is call), None)
        first_bad = min(x for x in (first_bad, at, len(seen)) if x is not None)
        flags = [checked for i, checked, _ in evaluated if seen[i] is call]
        found.failing["contracts"] = flags[-1] if flags else False
    n_rejected = 0
    for i, checked, row in evaluated:
        if row["status"] == Status.SKIP.value:
            if not crash_safe and n_rejected < REJECTED_CHECKED:
                found.log.append(("rejected", False, seen[i]))
                n_rejected += 1
        elif first_bad is None or i < first_bad:
            found.log.append(("valid", checked, seen[i]))


def _row_of(found: _Found, base_row: dict[str, Any]) -> dict[str, Any]:
    """The overload's one row: its minimal failing input, or its first accepted input with what
    every accepted input reached, or why no input was valid."""
    if found.failing:
        row = dict(found.failing["row"])
        row.update(base_row, dtype=row["dtype"], inputs=_blob(found.failing["call"]))
        _with_rejections(row, found.rejections)
        row["error"] = (f"minimal failing input after shrinking{found.steered}: {row.get('signature')}; "
                        f"{row.get('error') or ''}")
        return row
    accepted = found.accepted
    if accepted:
        row = dict(accepted[0])
        row.update(base_row, dtype=row["dtype"])
        row["reached_ops"] = sorted({o for r in accepted for o in (r.get("reached_ops") or [])})
        row["native_ops"] = sorted({o for r in accepted for o in (r.get("native_ops") or [])})
        row["fallback_ops"] = sorted({o for r in accepted for o in (r.get("fallback_ops") or [])})
        row["error"] = None
        if Status(row["status"]).passed:  # a fallback seen in any accepted call marks the whole search
            row["status"] = decide(cpu_error=None, target_error=None, close=True, fallback=row["fallback_ops"]).value
        _with_rejections(row, found.rejections)
        return row
    if found.summary is not None:
        error = found.summary
    else:
        top = "; ".join(f"{n}x {msg}" for msg, n in found.rejected.most_common(2))
        error = (f"no valid input: {sum(found.rejected.values())} generated calls rejected by the CPU{found.steered} "
                 f"({top})")
    return {**base_row, "status": decide_unrun("cpu").value, "duration_s": 0.0, "error": error}


def _replay(target: Any, info: Any, group: Group, config: Any, entry: corpus.Entry,
            check_errors: bool) -> tuple[_Found | None, str]:
    """Run a corpus entry's inputs on the target and the CPU now, as the search that stored them
    ran them (the same contracts on the same inputs); None, and why, where that cannot stand for
    a search: an input's CPU verdict changed (rejected now accepted, or accepted now rejected),
    a generated input fails on this target (the search shrinks it), or the entry's inputs end at
    another target's failure (they are not all a search generates). A stored minimal failing
    input that fails here is this target's finding, reported as the search reports one."""
    found = _Found(steered=entry.steered)
    no_contracts = dataclasses.replace(config, contracts=("none",))

    def run(stored: corpus.Stored, cfg: Any) -> tuple[dict[str, Any], Any]:
        sample = _stored_sample(stored)
        dtype = _first_dtype(sample)
        return evaluate(target, info, group.op, "function", str(dtype).removeprefix("torch.") if dtype else "none",
                        0, sample, cfg), sample

    for stored in entry.of("rejected"):
        row, sample = run(stored, no_contracts)
        if row["status"] != Status.SKIP.value:
            return None, "an input the CPU rejected when the corpus entry was stored is accepted now"
        found.rejected[(row.get("error") or "")[:200]] += 1
        if check_errors and not entry.crash_safe and len(found.rejections) < REJECTED_CHECKED:
            found.rejections.append(check_rejected(target, info, sample, row.get("error") or ""))
    if entry.outcome == "no_valid_input":
        found.summary = entry.summary
        return found, ""
    for stored in reversed(entry.of("failing")):  # the newest first
        row, _ = run(stored, config if stored.contracts else no_contracts)
        if row["status"] == Status.SKIP.value:
            return None, "a stored failing input is rejected by the CPU now"
        if Status(row["status"]).failed:
            found.failing.update(row=row, call=stored, contracts=stored.contracts)
            return found, ""
    if not entry.complete:
        return None, "the corpus entry's inputs end at a failure on another target or build"
    for stored in entry.of("valid"):
        row, _ = run(stored, config if stored.contracts else no_contracts)
        if row["status"] == Status.SKIP.value:
            return None, "an input the CPU accepted when the corpus entry was stored is rejected now"
        if Status(row["status"]).failed:
            return None, "a stored input fails on this target (the search shrinks it)"
        found.accepted.append(row)
    if not found.accepted:
        return None, "the corpus entry holds no accepted input"
    return found, ""


def _stored_sample(stored: corpus.Stored) -> Any:
    """A SampleInput of copies of a stored input's tensors (the stored ones stay as they are)."""
    from torch.testing._internal.opinfo.core import SampleInput

    def copy(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return v.clone()
        if isinstance(v, list):
            return [copy(x) for x in v]
        return v

    args, kwargs = [copy(a) for a in stored.args], {k: copy(v) for k, v in stored.kwargs.items()}
    if args:
        return SampleInput(args[0], args=tuple(args[1:]), kwargs=kwargs)
    return SampleInput(NOARG, args=(), kwargs=kwargs)


def _stored(role: str, checked: bool, call: Call) -> corpus.Stored:
    args, kwargs = call.materialize()
    return corpus.Stored(role, checked, tuple(args), kwargs)


def _entry_of(op: str, digest: str, found: _Found, crash_safe: bool, row: dict[str, Any]) -> corpus.Entry:
    calls = [_stored(role, checked, call) for role, checked, call in found.log]
    if found.failing:
        failing = found.failing["call"]
        calls.append(failing if isinstance(failing, corpus.Stored)
                     else _stored("failing", found.failing["contracts"], failing))
    outcome = "inputs" if found.accepted else "no_valid_input"
    return corpus.Entry(op, digest, outcome, complete=not found.failing, crash_safe=crash_safe, steered=found.steered,
                        summary=row["error"] if outcome == "no_valid_input" else "", calls=tuple(calls))


def _merged(new: corpus.Entry, old: corpus.Entry | None) -> corpus.Entry:
    """``new`` with what ``old`` (the same fingerprint) adds: its minimal failing inputs and, when
    ``new`` stopped at a failure, its complete generation."""
    if old is None or old.crash_safe != new.crash_safe or old.outcome != new.outcome:
        return new
    base = new
    if not new.complete and old.complete:  # keep what a search generates where nothing fails
        base = dataclasses.replace(old, calls=tuple(c for c in old.calls if c.role != "failing"),
                                   steered=new.steered)
    failing = new.of("failing")
    for c in reversed(old.of("failing")):
        if len(failing) < corpus.MAX_FAILING and not any(corpus.same_input(c, f) for f in failing):
            failing.insert(0, c)  # older first: the replay tries the newest first
    failing = failing[-corpus.MAX_FAILING:]
    return dataclasses.replace(base, calls=tuple(c for c in base.calls if c.role != "failing") + tuple(failing))


def check_rejected(target: Any, info: Any, sample: Any, cpu_error: str) -> contracts.Check:
    """Contract ``errors`` for one input the CPU rejected: the target must raise too."""
    phase("target")
    try:
        moved = on_device(sample, target.device)
        result = target.wrap(info.op)(moved.input, *moved.args, **moved.kwargs)
        target.synchronize()
    except Exception:  # noqa: BLE001 - raised, as the CPU does
        return contracts.Check("pass")
    shapes = [list(x.shape) for x in leaves(result) if isinstance(x, torch.Tensor)]
    return contracts.Check("fail", f"an input the CPU rejects ({signature(sample)}; the CPU: "
                                   f"{cpu_error.removeprefix('CPU reference failed: ')}) returns {shapes or type(result).__name__} on the target")


def _with_rejections(row: dict[str, Any], rejections: list[contracts.Check]) -> None:
    """Put the rejected inputs' ``errors`` contract on the search's row (and into its status)."""
    if not rejections:
        return
    bad = [c for c in rejections if c.outcome == "fail"]
    check = bad[0] if bad else contracts.Check("pass", f"{len(rejections)} inputs the CPU rejects raise on the target")
    checks = {name: contracts.Check(**c) for name, c in (row.get("contracts") or {}).items()}
    checks["errors"] = check
    row["contracts"] = {name: c.as_json() for name, c in checks.items()}
    failed = contracts.failed(checks)
    row["contract_failed"] = ",".join(failed) or None
    if failed and Status(row["status"]).passed:
        row["status"] = Status.CONTRACT.value
        row["error"] = contracts.summary(checks)


def _first_dtype(sample: Any) -> torch.dtype | None:
    for x in leaves((sample.input, sample.args, sample.kwargs)):
        if isinstance(x, torch.Tensor):
            return x.dtype
    return None


DEVICE_MARK = corpus.DEVICE_MARK  # how a stored input spells the device argument (standalone scripts map it)


def _blob(call: Call | corpus.Stored) -> bytes:
    """The row's ``inputs``: a generated call (materialized) or a stored input, as repro reads it."""
    def plain(v: Any) -> Any:
        if isinstance(v, DeviceArg):
            return DEVICE_MARK
        if isinstance(v, torch.memory_format):  # memory formats do not pickle
            return f"<{str(v).removeprefix('torch.')}>"
        if isinstance(v, list):
            return [plain(x) for x in v]
        return v

    args, kwargs = (call.args, call.kwargs) if isinstance(call, corpus.Stored) else call.materialize()
    return dump_inputs({"args": [plain(a) for a in args], "kwargs": {k: plain(v) for k, v in kwargs.items()}})
