"""Read queries of the static report (:mod:`reports`). Every statement the report runs is here.

They are aggregate-first: the report never loads a whole results table into Python at once,
except :func:`op_sample_stream`, which streams one run's rows ordered by op with each row already
encoded as a JSON array by SQLite (so a 200k-result run renders in seconds).

Example::

    >>> from opdb import Store
    >>> from opdb.queries_report import builds
    >>> builds(Store.memory())
    []
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .queries_counts import NOT_OPINFO
from .queries_dtypes import DTYPE_PROBE
from .status import FAILING, PASSED, Status
from .store import Store

OP_KINDS = ("ops", "mixed")
MODEL_KINDS = ("models", "mixed")


@dataclass(frozen=True)
class BuildRuns:
    """One build of one target and the runs the report shows for it."""

    build: str  # as stored ("-": the target's default, which names no build)
    op_run: dict[str, Any] | None  # latest finished op run (latest of any status if none finished)
    model_run: dict[str, Any] | None  # likewise, for model runs
    target: str = ""  # the runs' target (neuron-emu, inductor, cpu, device:neuron, ...)

    @property
    def started_at(self) -> str:
        runs = [r["started_at"] or "" for r in (self.op_run, self.model_run) if r]
        return min(runs) if runs else ""


def _pick(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The latest finished run, else the latest run of any status (``runs`` ordered oldest first)."""
    finished = [r for r in runs if r["status"] == "finished"]
    pool = finished or runs
    return pool[-1] if pool else None


def builds(store: Store) -> list[BuildRuns]:
    """Every (target, build) in the DB with its latest op and model run, oldest build first.

    Runs of different targets never share a build: an inductor run and a cpu run both store
    build ``-`` (their default), and a run of neuron-emu 2.33.0 is no run of device:neuron.
    """
    by_build: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in store.runs():
        by_build.setdefault((r["target"] or "", r["build"] or "-"), []).append(r)
    out = []
    for (target, build), runs in by_build.items():
        op = _pick([r for r in runs if r["kind"] in OP_KINDS])
        model = _pick([r for r in runs if r["kind"] in MODEL_KINDS])
        if op is None and model is None:
            continue
        out.append(BuildRuns(build, op, model, target))
    out.sort(key=lambda b: (b.started_at, b.build, b.target))
    return out


def catalog_total(store: Store, torch_version: str) -> int:
    return store.db.execute("select count(*) from ops where torch_version = ?",
                            [torch_version]).fetchone()[0]


def coverage_count(store: Store, run_id: str) -> int:
    return store.db.execute("select count(*) from coverage where run_id = ?", [run_id]).fetchone()[0]


def coverage_by_class(store: Store, run_id: str, torch_version: str) -> list[dict[str, Any]]:
    """Per op class: catalog overloads, exercised, native, fallback, failing (from ``coverage``)."""
    return list(store.db.query(
        """select c.value as class, count(*) as total,
                  sum(cv.state = 'exercised') as exercised,
                  sum(coalesce(cv.native_samples, 0) > 0) as native,
                  sum(coalesce(cv.fallback_samples, 0) > 0) as fallback,
                  sum(coalesce(cv.failing_samples, 0) > 0) as failing
           from ops o join json_each(o.classes) c
           left join coverage cv on cv.run_id = ? and cv.name = o.name
           where o.torch_version = ? group by c.value order by total desc, class""",
        [run_id, torch_version]))


def coverage_totals(store: Store, run_id: str) -> dict[str, int]:
    row = store.db.execute(
        """select count(*), sum(state = 'exercised'), sum(coalesce(native_samples, 0) > 0),
                  sum(coalesce(fallback_samples, 0) > 0), sum(coalesce(failing_samples, 0) > 0)
           from coverage where run_id = ?""", [run_id]).fetchone()
    keys = ("listed", "exercised", "native", "fallback", "failing")
    return {k: int(v or 0) for k, v in zip(keys, row, strict=True)}


def coverage_states(store: Store, run_id: str) -> dict[str, int]:
    return {r[0]: r[1] for r in store.db.execute(
        "select state, count(*) from coverage where run_id = ? group by state order by 2 desc", [run_id])}


def _names(text: str | None) -> list[str]:
    if not text or text == "[]":
        return []
    try:
        value = json.loads(text)
    except ValueError:
        return []
    return [str(v) for v in value] if isinstance(value, list) else []


def reached_cells(store: Store, run_id: str) -> list[tuple[str, str, str, str, int]]:
    """``(overload, dtype, status, how, samples)`` for every overload the run's op results reached,
    ``how`` being 'native' or 'fallback' (from their native_ops / fallback_ops lists).

    One grouped scan: samples of an op mostly share their overload lists, so SQLite groups the
    rows by (lists, dtype, status) and only the distinct lists are decoded here. The report
    derives coverage totals, per-class and per-dtype figures and matrix rows from the result.
    """
    counts: dict[tuple[str, str, str, str], int] = {}
    for native, fallback, dtype, status, n in store.db.execute(
            """select native_ops, fallback_ops, dtype, status, count(*) from op_results
               where run_id = ? group by native_ops, fallback_ops, dtype, status""", [run_id]):
        for how, text in (("native", native), ("fallback", fallback)):
            for name in _names(text):
                key = (name, dtype, status, how)
                counts[key] = counts.get(key, 0) + n
    return [(*k, n) for k, n in sorted(counts.items(), key=lambda kv: tuple(x or "" for x in kv[0]))]


def claim_rows(store: Store, run_id: str) -> list[dict[str, Any]]:
    """The stored claims of a published compatibility table held against the run (empty: none)."""
    if "claims" not in store.db.table_names():
        return []
    return list(store.db.query("select * from claims where run_id = ? order by line, dtype", [run_id]))


def replace_claims(store: Store, run_id: str, rows: Sequence[dict[str, Any]]) -> None:
    """Store a run's claims, replacing what it had (one transaction)."""
    with store._transaction():
        store.db.execute("delete from claims where run_id = ?", [run_id])
        store.insert("claims", rows)


def dispatch_rows(store: Store, run_id: str) -> Iterator[dict[str, Any]]:
    """A run's op items with what each dispatched (native, fallback, reached) and how it ended:
    what published claims are held against (``conformance.catalog.claims``)."""
    cur = store.db.execute("select item_key, op, variant, dtype, status, error, native_ops, fallback_ops, "
                           "reached_ops from op_results where run_id = ?", [run_id])
    names = [d[0] for d in cur.description]
    for row in cur:
        yield dict(zip(names, row, strict=True))


def coverage_rows(store: Store, run_id: str) -> list[dict[str, Any]]:
    return list(store.db.query("select * from coverage where run_id = ? order by name", [run_id]))


def overload_classes(store: Store, torch_version: str) -> dict[str, list[str]]:
    return {r[0]: json.loads(r[1] or "[]") for r in store.db.execute(
        "select name, classes from ops where torch_version = ?", [torch_version])}


def opinfo_classes(store: Store, torch_version: str) -> dict[str, list[str]]:
    """OpInfo name -> the classes of the catalog overloads its first sample reaches."""
    out: dict[str, list[str]] = {}
    for name, cls in store.db.execute(
            """select distinct j.value, c.value from ops o, json_each(o.opinfos) j, json_each(o.classes) c
               where o.torch_version = ? order by 1, 2""", [torch_version]):
        out.setdefault(name, []).append(cls)
    return out


def slowest_ops(store: Store, run_id: str, limit: int = 15) -> list[dict[str, Any]]:
    return list(store.db.query(
        """select op, count(*) as samples, sum(duration_s) as total_s, max(duration_s) as max_s
           from op_results where run_id = ? group by op order by total_s desc limit ?""",
        [run_id, limit]))


def matrix_cells(store: Store, run_id: str, variants: Sequence[str] = ()) -> list[tuple[str, str, str, int]]:
    """``(op, dtype, status, samples)`` of the OpInfo ops for the op × dtype matrix (schema-driven
    items and canaries are no OpInfo op's samples: they count on the ATen rows they reach; nor is
    a dtype probe, which the matrix marks apart, :mod:`opdb.queries_dtypes`); of those ``variants``
    only (function, out, backward, ...) when given."""
    marks = ", ".join("?" for _ in (*NOT_OPINFO, DTYPE_PROBE))
    only = f" and variant in ({', '.join('?' for _ in variants)})" if variants else ""
    return [tuple(r) for r in store.db.execute(
        f"select op, dtype, status, count(*) from op_results where run_id = ? and coalesce(variant, '') "
        f"not in ({marks}){only} group by op, dtype, status", [run_id, *NOT_OPINFO, DTYPE_PROBE, *variants])]


@dataclass(frozen=True)
class OnlyFailure:
    """The OpInfo samples of one op × dtype that fail on one run's target and pass on every other
    run compared that holds them (the same item key: the same seeded sample)."""

    run_id: str  # the run they fail in
    op: str
    dtype: str
    items: int  # samples failing there and passing elsewhere
    statuses: tuple[str, ...]  # their statuses on the failing run, sorted
    compared: int  # the fewest other runs any of them was compared with (>= 1)


def fails_only_on(store: Store, run_ids: list[str]) -> list[OnlyFailure]:
    """Per run, the op × dtype groups whose samples fail in that run only: each counted item
    fails (a failing status) in exactly one of ``run_ids`` and passes (pass, pass_fallback) in
    every other run holding the same item key, at least one. An item skipped or expected to fail
    elsewhere is no "fails only" item: nothing says the others would pass it. Schema-driven
    items and canaries are left out, as in :func:`matrix_cells`. Largest groups first per run.
    """
    if len(run_ids) < 2:
        return []
    failing, passed = sorted(FAILING), sorted(PASSED)
    runs, bad, good, skip = (", ".join("?" for _ in x) for x in (run_ids, failing, passed, NOT_OPINFO))
    rows = store.db.execute(
        f"""select run, op, dtype, count(*), group_concat(distinct status), min(n) - 1 from (
                select item_key, min(op) as op, min(dtype) as dtype, count(*) as n,
                       max(case when status in ({bad}) then run_id end) as run,
                       max(case when status in ({bad}) then status end) as status,
                       sum(status in ({bad})) as bad, sum(status in ({good})) as good
                from op_results
                where run_id in ({runs}) and coalesce(variant, '') not in ({skip})
                group by item_key)
            where bad = 1 and good = n - 1 and n >= 2
            group by run, op, dtype order by run, count(*) desc, op, dtype""",
        [*failing, *failing, *failing, *passed, *run_ids, *NOT_OPINFO])
    return [OnlyFailure(run, op, dtype or "-", n, tuple(sorted((st or "").split(","))), compared)
            for run, op, dtype, n, st, compared in rows]


def run_ops(store: Store, run_id: str) -> list[str]:
    """Every op name of a run's op results (one op page each), sorted."""
    return [r[0] for r in store.db.execute("select distinct op from op_results where run_id = ? order by op",
                                           [run_id])]


#: Columns of one op sample row as :func:`op_sample_stream` encodes it (a JSON array).
SAMPLE_COLUMNS = ("id", "variant", "dtype", "sample", "status", "max_abs_err", "max_rel_err", "ulp_err",
                  "mismatch_frac", "worst", "arbiter_err", "cpu_arbiter_err", "atol", "rtol", "tol_source",
                  "comparator", "checks", "contracts", "native_ops", "fallback_ops", "signature", "error",
                  "duration_s", "seed", "proof", "cause")


@dataclass(frozen=True)
class LadderSizes:
    """The size ladder of one op x dtype in a run (``ladder`` items; conformance.sweep.ladder):
    how many sizes ran, the largest element count that passed below the first failure, and the
    smallest that failed (None: none failed) with its status and item id."""

    op: str
    dtype: str
    sizes: int
    largest_passing: int | None
    first_failing: int | None
    failing_status: str | None
    failing_id: int | None
    note: str | None = None  # why there is no ladder (its skip row's reason)

    def describe(self) -> str:
        if self.note is not None:
            return self.note
        if self.first_failing is not None and self.largest_passing is None:
            return f"{self.failing_status} at every size tried, the smallest {self.first_failing:,} elements"
        if self.first_failing is not None:
            return f"{self.failing_status} from {self.first_failing:,} elements"
        return f"passes up to {self.largest_passing:,} elements" if self.largest_passing else "no size passed"


def ladder_sizes(store: Store, run_id: str) -> dict[tuple[str, str], LadderSizes]:
    """Each op x dtype's size ladder in run ``run_id`` (:class:`LadderSizes`), by (op, dtype)."""
    by: dict[tuple[str, str], list[tuple[Any, ...]]] = {}
    for row in store.db.execute(
            """select op, dtype, status, json_extract(proof, '$.ladder.numel'), id, error from op_results
               where run_id = ? and variant = 'ladder' order by op, dtype, sample""", [run_id]):
        by.setdefault((row[0], row[1]), []).append(row[2:])
    out = {}
    for (op, dtype), rows in by.items():
        sized = [r for r in rows if r[1] is not None]
        if not sized:  # the op's one skip row: no sample of it grows
            out[op, dtype] = LadderSizes(op, dtype, 0, None, None, None, None, note=rows[0][3] or rows[0][0])
            continue
        failing = [r for r in sized if r[0] in FAILING]
        first = min(failing, key=lambda r: r[1]) if failing else None
        passing = [r[1] for r in sized if Status(r[0]).passed and (first is None or r[1] < first[1])]
        out[op, dtype] = LadderSizes(op, dtype, len(sized), max(passing, default=None),
                                     first[1] if first else None, first[0] if first else None,
                                     first[2] if first else None)
    return out


@dataclass(frozen=True)
class TracedSizes:
    """The traced signatures of one ATen overload x dtype replayed in a run (``traced`` items;
    conformance.sweep.traced): how many, how many failed, the largest passing and the smallest
    failing one (elements of their tensor arguments), and the models calling the failing ones."""

    overload: str
    dtype: str
    signatures: int
    failing: int
    largest_passing: int | None
    smallest_failing: int | None
    failing_status: str | None
    failing_id: int | None
    calls: int  # of all its signatures, in the traced models
    failing_calls: int
    models: tuple[str, ...]  # calling a failing signature (the first few)

    def describe(self) -> str:
        if not self.failing:
            return f"all {self.signatures} pass, up to {self.largest_passing or 0:,} elements"
        return (f"{self.failing} of {self.signatures} fail ({self.failing_calls:,} of {self.calls:,} traced calls), "
                f"the smallest at {self.smallest_failing or 0:,} elements")


def traced_sizes(store: Store, run_id: str) -> dict[tuple[str, str], TracedSizes]:
    """Each traced overload x dtype of run ``run_id`` (:class:`TracedSizes`), by (overload, dtype)."""
    by: dict[tuple[str, str], list[tuple[Any, ...]]] = {}
    for row in store.db.execute(
            """select op, dtype, status, json_extract(proof, '$.traced.numel'), id,
                      coalesce(json_extract(proof, '$.traced.calls'), 0), json_extract(proof, '$.traced.used_by')
               from op_results where run_id = ? and variant = 'traced' order by op, dtype, sample""", [run_id]):
        by.setdefault((row[0], row[1]), []).append(row[2:])
    out = {}
    for (op, dtype), rows in by.items():
        bad = [r for r in rows if r[0] in FAILING]
        good = [r[1] or 0 for r in rows if Status(r[0]).passed]
        first = min(bad, key=lambda r: r[1] or 0) if bad else None
        models = tuple(dict.fromkeys(m for r in bad for m in json.loads(r[4] or "[]")))[:5]
        out[op, dtype] = TracedSizes(op, dtype, len(rows), len(bad), max(good, default=None),
                                     first[1] if first else None, first[0] if first else None,
                                     first[2] if first else None, sum(r[3] for r in rows), sum(r[3] for r in bad),
                                     models)
    return out


def traced_share(store: Store, run_id: str) -> tuple[int, int]:
    """(traced calls whose signature's values pass, traced calls judged) in run ``run_id``: the
    share of the models' calls, weighted by how often the models make them, that the build gets
    right. A ``contract`` item's values passed (its failed contract checked a variant of the call,
    a channels_last or out= form, that the model does not make: the op page shows it); a skipped
    signature, which no verdict judged, counts in neither."""
    passed = (*(s.value for s in Status if s.passed), Status.CONTRACT.value)
    row = store.db.execute(
        f"""select coalesce(sum(case when status in ({', '.join('?' * len(passed))})
                                 then json_extract(proof, '$.traced.calls') else 0 end), 0),
                  coalesce(sum(json_extract(proof, '$.traced.calls')), 0)
           from op_results where run_id = ? and variant = 'traced' and status != ?""",
        [*passed, run_id, Status.SKIP.value]).fetchone()
    return int(row[0]), int(row[1])


def op_sample_stream(store: Store, run_id: str) -> Iterator[tuple[str, int, str, str, float | None, str]]:
    """``(op, id, dtype, status, max_rel_err, row_json)`` for every op result of a run, ordered by
    op, each op's failing samples first.

    ``row_json`` is a JSON array in :data:`SAMPLE_COLUMNS` order; ``worst`` the element that
    failed worst, as text (``out 0 [1, 0]: target 3.5, CPU 3, float64 3``); ``checks`` is a string of the
    failed structural checks (nan/dtype/shape/stride) or ''; ``contracts`` the names of the
    contracts the item failed (a list, in the order they were checked); ``proof`` says what ran the item
    (``inductor: 1 graphs on cpu`` for a compiler target, else the outputs' device).
    """
    failing = sorted(FAILING)
    yield from store.db.execute(
        """select op, id, dtype, status, max_rel_err, json_array(
                  id, variant, dtype, sample, status, max_abs_err, max_rel_err, ulp_err,
                  mismatch_frac, {worst}, arbiter_err, cpu_arbiter_err, atol, rtol, tol_source, comparator,
                  trim(case when nan_agree = 0 then 'nan ' else '' end ||
                       case when dtype_ok = 0 then 'dtype ' else '' end ||
                       case when shape_ok = 0 then 'shape ' else '' end ||
                       case when stride_ok = 0 then 'stride' else '' end),
                  json(case when json_valid(contracts) and json_type(contracts) = 'object' then (
                      select json_group_array(c.key) from json_each(contracts) c
                      where c.type = 'object' and json_extract(c.value, '$.outcome') = 'fail') else '[]' end),
                  case when json_valid(native_ops) then json(native_ops) else native_ops end,
                  case when json_valid(fallback_ops) then json(fallback_ops) else fallback_ops end,
                  signature, error, duration_s, seed,
                  case when json_valid(proof) then coalesce(
                      json_extract(proof, '$.backend') || ': ' || json_extract(proof, '$.graphs') || ' graphs on '
                          || coalesce(json_extract(proof, '$.device[0]'), 'no output'),
                      json_extract(proof, '$.device[0]')) end, cause)
           from op_results where run_id = ?
           order by op, status not in ({marks}), variant, dtype, sample, id""".replace(
            "{marks}", ", ".join("?" for _ in failing)).replace("{worst}", _WORST_TEXT), [run_id, *failing])


def _num(path: str) -> str:
    """SQL: the number at ``path`` of the ``worst`` JSON with 7 significant digits ('nan'/'inf' kept)."""
    return (f"case when json_type(worst, '{path}') in ('real', 'integer') then printf('%.7g', json_extract(worst, '{path}')) "
            f"else json_extract(worst, '{path}') end")


_WORST_TEXT = (
    "case when json_valid(worst) and worst != 'null' then 'out ' || json_extract(worst, '$.output') || ' ' || "
    "replace(json_extract(worst, '$.index'), ',', ', ') || ': target ' || " + _num("$.target") + " || ', CPU ' || "
    + _num("$.cpu") + " || coalesce(', float64 ' || " + _num("$.arbiter") + ", '') end")


def model_rows(store: Store, run_id: str) -> list[dict[str, Any]]:
    return list(store.db.query(
        "select * from model_results where run_id = ? order by family, model_id, dtype, mode, id", [run_id]))


def blocking_ops(store: Store, run_id: str, limit: int = 25) -> list[dict[str, Any]]:
    """First divergent ops ranked by how many failing graphs they block."""
    failing = sorted(FAILING)
    marks = ", ".join("?" for _ in failing)
    return list(store.db.query(
        f"""select first_divergent_op as op, count(*) as graphs,
                   count(distinct family) as families, replace(group_concat(distinct family), ',', ', ') as family_list
            from model_results
            where run_id = ? and status in ({marks})
              and first_divergent_op is not null and first_divergent_op != ''
            group by first_divergent_op order by graphs desc, op limit ?""",
        [run_id, *failing, limit]))


def localized_counts(store: Store, run_id: str) -> tuple[int, int]:
    """``(failing graphs, those of them localized to a first divergent op)`` of a model run."""
    failing = sorted(FAILING)
    marks = ", ".join("?" for _ in failing)
    n, localized = store.db.execute(
        f"""select count(*), sum(coalesce(first_divergent_op, '') != '') from model_results
            where run_id = ? and status in ({marks})""", [run_id, *failing]).fetchone()
    return int(n or 0), int(localized or 0)


def gate_items(store: Store, baseline_run: str, candidate_run: str) -> list[dict[str, Any]]:
    return list(store.db.query(
        """select * from gate_items where baseline_run = ? and candidate_run = ?
           order by category, kind, op, item_key""", [baseline_run, candidate_run]))

