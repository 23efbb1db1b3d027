"""Every count the report shows, one named query each: the index, a build's summary, the matrix,
the lists and the diff all take their numbers from here, so no two pages can disagree.

What each count means, and why it is made that way:

- :func:`result_counts`: a run's results by status, **canaries aside**, exactly as the console's
  run summary (``conformance.run.Summary``) counts them. Canary items check the harness, not the
  build; they are stored (variant ``canary``) but belong to no selection.
- :func:`fallback_overloads` / :func:`failing_overloads`: the ATen overloads some sample fell
  back to the CPU on / some failing sample reached. From the run's ``coverage`` table when it has
  one (what ``conformance ops --coverage`` prints), else from the op results' overload lists.
- :func:`coverage_share`: exercised over backend-reachable overloads, the console's coverage line.
- :func:`opinfo_ops`: OpInfo ops the run swept (schema-driven items and canaries are not OpInfo ops).
- :func:`backend_share`: a compiler target's items whose backend ran none of it (everything ran in
  PyTorch), by status, canaries aside. Such an item's status is right by the harness's rule
  (``pass_fallback`` when its values pass), but "nothing ran on the backend" is a count of its own.
- :func:`gate_counts`: the gate's stored decisions for a pair of runs, by category, as the
  console's gate summary prints them.

Example::

    >>> from opdb import Store
    >>> from opdb.queries_counts import result_counts, fallback_overloads
    >>> st = Store.memory()
    >>> result_counts(st, ["r"]), fallback_overloads(st, "r")
    ({'r': {}}, [])
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .status import FAILING, FAILS_GATE
from .store import Store

CANARY = "canary"  # the variant of canary items (conformance.run.run_canaries)
#: The custom-op lane's variants (conformance.customops.VARIANTS; a test holds the two equal): its
#: items are a target's own ops, reported on their own (the build page's custom-op section)
CUSTOM_OP_VARIANTS = ("opcheck", "custom_fwd", "custom_bwd", "custom_compile")
NOT_OPINFO = (CANARY, "schema", "traced", *CUSTOM_OP_VARIANTS)  # variants whose items are not samples of an OpInfo op
UNREACHABLE = ("composite_implicit", "no_cpu_kernel")  # coverage states a backend cannot be asked for


def _names(text: Any) -> list[str]:
    if not text or text == "[]":
        return []
    try:
        value = json.loads(text) if isinstance(text, str) else text
    except ValueError:
        return []
    return [str(v) for v in value] if isinstance(value, list) else []


def result_counts(store: Store, run_ids: Sequence[str], table: str = "op_results") -> dict[str, dict[str, int]]:
    """``{run_id: {status: count}}`` of ``table`` (op_results or model_results), canaries aside."""
    if table not in ("op_results", "model_results"):
        raise ValueError(f"not a result table: {table!r}")
    out: dict[str, dict[str, int]] = {r: {} for r in run_ids}
    if not run_ids:
        return out
    marks = ", ".join("?" for _ in run_ids)
    canary = " and coalesce(variant, '') != 'canary'" if table == "op_results" else ""
    for run, status, n in store.db.execute(
            f"select run_id, status, count(*) from [{table}] where run_id in ({marks}){canary} "
            f"group by run_id, status", list(run_ids)):
        out[run][status or "?"] = n
    return out


def failing_total(counts: dict[str, int]) -> int:
    """Results with a failing status (the console's, the gate's and the report's failing set)."""
    return sum(n for s, n in counts.items() if s in FAILING)


@dataclass
class OverloadRow:
    """One overload of a fallback or failing list."""

    name: str
    samples: int  # op samples that fell back to it / failing samples that reached it
    ops: list[str] = field(default_factory=list)  # OpInfo ops (or schema groups) whose samples did
    graphs: int = 0  # model graphs of the build whose fallback (failing) lists name it
    dtypes: list[str] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)  # of the samples counted


def _scan(store: Store, run_id: str, how: str) -> dict[str, OverloadRow]:
    """Overloads the op results reached, ``how``: 'fallback' (via the CPU) or 'failing' (by a
    failing sample, either way). One grouped scan; only distinct overload lists are decoded."""
    out: dict[str, OverloadRow] = {}
    for op, native, fallback, dtype, status, n in store.db.execute(
            """select op, native_ops, fallback_ops, dtype, status, count(*) from op_results
               where run_id = ? and coalesce(variant, '') != 'canary'
               group by op, native_ops, fallback_ops, dtype, status""", [run_id]):
        if how == "fallback":
            names = _names(fallback)
        elif status in FAILING:
            names = list(dict.fromkeys(_names(native) + _names(fallback)))
        else:
            continue
        for name in names:
            row = out.setdefault(name, OverloadRow(name, 0))
            row.samples += n
            if op not in row.ops:
                row.ops.append(op)
            if dtype and dtype not in row.dtypes:
                row.dtypes.append(dtype)
            row.statuses[status] = row.statuses.get(status, 0) + n
    return out


def _graphs(store: Store, model_run: str | None, how: str) -> dict[str, int]:
    """Model graphs naming each overload: in their fallback list, or (failing graphs) as the first
    divergent op."""
    if not model_run:
        return {}
    out: dict[str, int] = {}
    if how == "fallback":
        for text, n in store.db.execute("select fallback_ops, count(*) from model_results where run_id = ? "
                                        "group by fallback_ops", [model_run]):
            for name in _names(text):
                out[name] = out.get(name, 0) + n
    else:
        failing = sorted(FAILING)
        marks = ", ".join("?" for _ in failing)
        for name, n in store.db.execute(
                f"select first_divergent_op, count(*) from model_results where run_id = ? and status in ({marks}) "
                f"and coalesce(first_divergent_op, '') != '' group by first_divergent_op", [model_run, *failing]):
            out[name] = n
    return out


def _overloads(store: Store, run_id: str, model_run: str | None, how: str) -> list[OverloadRow]:
    scanned = _scan(store, run_id, how)
    column = "fallback_samples" if how == "fallback" else "failing_samples"
    covered = list(store.db.execute(f"select name, {column}, dtypes, statuses from coverage "
                                    f"where run_id = ? and coalesce({column}, 0) > 0", [run_id]))
    has_coverage = store.db.execute("select 1 from coverage where run_id = ? limit 1", [run_id]).fetchone()
    if has_coverage:  # the coverage table decides which overloads and how many samples
        rows = []
        for name, n, dtypes, statuses in covered:
            seen = scanned.get(name)
            st = json.loads(statuses) if statuses else {}
            if how == "failing":
                st = {s: k for s, k in st.items() if s in FAILING}
            rows.append(OverloadRow(name, int(n), seen.ops if seen else [], 0, _names(dtypes), st))
    else:
        rows = list(scanned.values())
    graphs = _graphs(store, model_run, how)
    for r in rows:
        r.graphs = graphs.get(r.name, 0)
        r.ops.sort()
        r.dtypes.sort()
    rows.sort(key=lambda r: (-r.graphs, -r.samples, r.name))
    return rows


def fallback_overloads(store: Store, run_id: str, model_run: str | None = None) -> list[OverloadRow]:
    """Overloads some op sample fell back to the CPU on, the most reached first (by model graphs
    whose fallback lists name it, then by samples)."""
    return _overloads(store, run_id, model_run, "fallback")


def failing_overloads(store: Store, run_id: str, model_run: str | None = None) -> list[OverloadRow]:
    """Overloads some failing op sample reached, the most reached first (by failing model graphs
    whose first divergent op it is, then by failing samples)."""
    return _overloads(store, run_id, model_run, "failing")


def coverage_share(store: Store, run_id: str) -> dict[str, int]:
    """``listed`` catalog overloads, ``reachable`` by a backend (every coverage state but
    composite_implicit and no_cpu_kernel) and ``exercised`` (all 0 without a coverage table)."""
    states = dict(store.db.execute("select state, count(*) from coverage where run_id = ? group by state",
                                   [run_id]).fetchall())
    listed = sum(states.values())
    return {"listed": listed, "reachable": listed - sum(states.get(s, 0) for s in UNREACHABLE),
            "exercised": states.get("exercised", 0)}


def opinfo_ops(store: Store, run_id: str) -> int:
    """OpInfo ops the run holds samples of (schema-driven items and canaries aside)."""
    marks = ", ".join("?" for _ in NOT_OPINFO)
    return store.db.execute(f"select count(distinct op) from op_results where run_id = ? "
                            f"and coalesce(variant, '') not in ({marks})", [run_id, *NOT_OPINFO]).fetchone()[0]


@dataclass
class BackendShare:
    """How much of a compiler target's items its backend ran (their ``proof``)."""

    compiled: dict[str, int]  # status -> items with a compiler target's proof
    ran_none: dict[str, int]  # status -> those of them the backend ran none of

    @property
    def total(self) -> int:
        return sum(self.compiled.values())

    @property
    def none(self) -> int:
        return sum(self.ran_none.values())


def ran_none(graphs: Any, backend_ran: Any, graph_ops: Any, fallback_kernels: Any) -> bool:
    """Whether a compiler target's backend ran none of an item, from its proof's fields: its
    ``backend_ran`` count where the target keeps one (a partitioning backend: OpenVINO's
    subgraphs), else no graph at all, or graphs whose every ATen op is a fallback kernel (an empty
    graph, one with no ATen op, is the backend's: nothing in it fell back).

    >>> ran_none(1, 0, '["aten::add.Tensor"]', '[]'), ran_none(1, None, '["aten::add.Tensor"]', '["aten::add.Tensor"]')
    (True, True)
    >>> ran_none(1, None, '["aten::add.Tensor", "aten::sin.default"]', '["aten::sin.default"]'), ran_none(1, None, '[]', '[]')
    (False, False)
    """
    if backend_ran is not None:
        return int(backend_ran) == 0
    if not graphs:
        return True
    ops = set(_names(graph_ops))
    return bool(ops) and ops <= set(_names(fallback_kernels))


def backend_share(store: Store, run_ids: Sequence[str]) -> dict[str, BackendShare]:
    """``{run_id: BackendShare}`` for the runs holding items with a compiler target's proof (the
    others are left out), canaries aside as in :func:`result_counts`. One grouped scan: only
    distinct proofs' fields are decoded."""
    out: dict[str, BackendShare] = {}
    if not run_ids:
        return out
    marks = ", ".join("?" for _ in run_ids)
    for run, status, graphs, ran, ops, fallback, n in store.db.execute(
            f"""select run_id, status, json_extract(proof, '$.graphs'), json_extract(proof, '$.backend_ran'),
                       json_extract(proof, '$.graph_ops'), json_extract(proof, '$.fallback_kernels'), count(*)
                from op_results where run_id in ({marks}) and coalesce(variant, '') != 'canary'
                  and json_valid(proof) and json_type(proof, '$.backend') is not null
                group by 1, 2, 3, 4, 5, 6""", list(run_ids)):
        share = out.setdefault(run, BackendShare({}, {}))
        status = status or "?"
        share.compiled[status] = share.compiled.get(status, 0) + n
        if ran_none(graphs, ran, ops, fallback):
            share.ran_none[status] = share.ran_none.get(status, 0) + n
    return out


@dataclass
class GateCounts:
    """The gate's stored decision for one pair of runs."""

    baseline_run: str
    candidate_run: str
    verdict: str  # pass | fail, from the gate's marker row ('' when only items were stored)
    counts: dict[str, int]  # category -> items (regression, drift, flaky, improvement, new, removed)

    def of(self, category: str) -> int:
        return self.counts.get(category, 0)


def gate_counts(store: Store, baseline_run: str, candidate_run: str) -> GateCounts | None:
    """What the gate decided for the pair (every kind of item), or None when it never judged it."""
    counts: dict[str, int] = {}
    verdict = ""
    for category, candidate, n in store.db.execute(
            "select category, max(candidate), count(*) from gate_items where baseline_run = ? and candidate_run = ? "
            "group by category", [baseline_run, candidate_run]):
        if category == "verdict":
            verdict = candidate or ""
        else:
            counts[category] = n
    if not counts and not verdict:
        return None
    return GateCounts(baseline_run, candidate_run, verdict, counts)


def gate_findings(store: Store, baseline_run: str, candidate_run: str,
                  categories: Sequence[str] = FAILS_GATE) -> list[dict[str, Any]]:
    """The gate's stored items of ``categories`` for the pair (evidence parsed), in the gate's order."""
    marks = ", ".join("?" for _ in categories)
    rows = list(store.db.query(
        f"""select * from gate_items where baseline_run = ? and candidate_run = ? and category in ({marks})
            order by category, kind, op, variant, dtype, item_key""", [baseline_run, candidate_run, *categories]))
    for r in rows:
        try:
            r["evidence"] = json.loads(r["evidence"]) if r["evidence"] else {}
        except ValueError:
            r["evidence"] = {"text": r["evidence"]}
    return rows
