"""The schema search, a work kind: for each ATen overload no OpInfo reaches, a derandomized,
bounded Hypothesis search over calls drawn from its schema (:mod:`conformance.inputs.schema`).

Examples the CPU reference rejects are discarded; accepted ones run on the target through the
same execute/compare/decide path as OpInfo samples (:func:`conformance.sweep.evaluate`); on a
mismatch Hypothesis shrinks to a minimal failing input, and that input is stored (``inputs``
blob) so ``conformance repro`` reproduces it. The first inputs the CPU rejects are run on the
target too (contract ``errors``, :func:`~conformance.sweep.schema.rows.check_rejected`); where
only that fails, the first input the target accepted is the one stored. One group is one overload; it has one item,
``{overload}|schema|any|0``.

When a search finds no input the CPU accepts, the CPU's own error messages are read for what
it wanted (:func:`~conformance.inputs.hints.hints_from_errors`) and up to ``STEERED_PASSES``
more searches are steered by them. An input that crashes the reference kernel kills its worker;
the supervisor then re-sends the overload with a crash-safe :class:`~conformance.work.Skip`
and every input's CPU run is first tried in a forked child
(:func:`~conformance.sweep.schema.preflight.cpu_preflight`).

This module holds the work kind, its one group's run and the Hypothesis search itself; the
candidates are :mod:`~conformance.sweep.schema.candidates`, the forked-child preflights
:mod:`~conformance.sweep.schema.preflight`, the result row :mod:`~conformance.sweep.schema.rows`
and the corpus replay :mod:`~conformance.sweep.schema.replay`.

Example::

    >>> from conformance.sweep.schema import SCHEMA
    >>> [g.key for g in SCHEMA.groups(Selection(ops=("aten::_foreach_abs.default",)))]
    ['aten::_foreach_abs.default|any']
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Container, Iterator
from functools import cache
from typing import Any

from hypothesis import HealthCheck, Phase, given, reject, settings
from hypothesis import strategies as st

from conformance.catalog.overloads import packet_of
from conformance.check import contracts
from conformance.check.execute import signature
from conformance.check.verdict import Status, decide_unrun
from conformance.inputs import corpus
from conformance.inputs.hints import Hints, hints_from_errors
from conformance.inputs.schema import NOARG, Call, call_strategy
from conformance.sweep.opinfo import evaluate as evaluate_item
from conformance.work import NOTHING, Group, ItemKey, Selection

from .candidates import select_overloads
from .preflight import CPU_PREFLIGHT_FACTOR, CPU_PREFLIGHT_MIN_S, CPU_PREFLIGHTS, cpu_preflight, target_preflight
from .replay import entry_of, merged, replay, stored_entry
from .rows import REJECTED_CHECKED, check_rejected, row_of

# _search's source is hashed (search_basis) and Hypothesis seeds each search from its prop's
# source, so the names it reads keep their spelling here
from .rows import Found as _Found
from .rows import first_dtype as _first_dtype

MAX_EXAMPLES = 12
REJECT_CAP = 120  # calls rejected by the CPU in one search before it is given up
STEERED_PASSES = 2  # further searches steered by the rejections' hints
CRASH_SAFE_SHRINK_STEPS = 60


class SchemaSearch:
    """The work kind: one group per candidate overload (``aten::`` globs in ``--ops`` choose
    among them and, alone, select nothing else)."""

    name = "schema"
    table = "op_results"
    variants = ("schema",)
    crash_safe_factor = 3  # a crash-safe search forks twice per input
    timeout_factor = 1

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


#: The executor's view of a bare ATen overload (the traced lane's items use it too).
OverloadInfo = _Info


def _sample_of(call: Call) -> Any:
    from torch.testing._internal.opinfo.core import SampleInput  # heavy: only when a search runs

    args, kwargs = call.materialize()
    if args:
        return SampleInput(args[0], args=args[1:], kwargs=kwargs)
    return SampleInput(NOARG, args=(), kwargs=kwargs)


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
        yield {**base_row, "status": decide_unrun("cpu").value, "error": f"no valid input: {exc}",
               "duration_s": 0.0}
        return
    # an input whose CPU result the CPU does not reproduce (memory left unwritten, read past an
    # input, garbage from arguments outside the op's contract) is no test of the target: rejected
    config = dataclasses.replace(config, reference_check="every")
    crash_safe = bool(getattr(skip, "crash_safe", False))
    # The contracts are checked on the first accepted input (each example again would multiply
    # the search's cost); "errors" on the first inputs the CPU rejects.
    check_errors = "errors" in contracts.parse_contracts(config.contracts, target)
    digest, basis = corpus.fingerprint(group.op, search_basis())
    old, why = stored_entry(getattr(skip, "replay", None), digest)
    if old is not None and not crash_safe:  # a crash-safe re-run searches, as it did before
        found, why = replay(target, info, group, config, old, check_errors)
        if found is not None:
            side.append({"how": "replayed"})
            yield row_of(found, base_row)
            return
    elif old is not None:
        why = "crash-safe re-run"
    found = _search(target, info, group, config, crash_safe=crash_safe, check_errors=check_errors)
    row = row_of(found, base_row)
    entry = merged(entry_of(group.op, digest, found, crash_safe, row), old)
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
           "steered_passes": STEERED_PASSES, "crash_safe_shrink_steps": CRASH_SAFE_SHRINK_STEPS,
           "reference_check": "every", "cpu_preflights": CPU_PREFLIGHTS,
           "cpu_preflight_limit": (CPU_PREFLIGHT_FACTOR, CPU_PREFLIGHT_MIN_S)}


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


def _log(found: _Found, seen: list[Call], evaluated: list[tuple[int, bool, dict[str, Any]]],
         crash_safe: bool) -> None:
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
