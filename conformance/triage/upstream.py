"""Upstream projects' own expectations for a backend, and the triage of each against a harness run.

``data/upstream_inductor.toml`` holds PyTorch's expected failures and skips for Inductor on the
CPU (from ``test/inductor/test_torchinductor_opinfo.py``), ``data/upstream_onnxruntime.toml``
ONNX Script's for the exporter's torch_lib functions run in ONNX Runtime (from
``tests/function_libs/torch_lib/ops_test_data.py``), one fact per op x dtype with its source
(repo@commit path, and the harness targets its list is about); ``data/upstream_triage.toml``
what a standalone check (``tools/upstream_inductor_check.py``,
``tools/upstream_onnx_check.py``) or a reading of the failure showed about each one that
the harness alone cannot tell (stale under the installed versions, or untestable and why).
:func:`triage` joins both with a run's stored statuses: every upstream-known failure is
``stale`` or ``untestable`` (as the triage file says), else ``re-found`` (the run holds a failing
status for the op x dtype),
``not swept`` (the run has no item of it), or ``missed``; :func:`unknown_findings` lists the
run's failing op x dtype pairs upstream does not list.

A fact upstream expects of some samples only (``samples = "some"``: its test picks them with a
matcher) is checked standalone on the samples its ``matchers`` pick (:func:`sample_picker`).
Where the stored list does not say which samples (no ``matchers``), the check runs every sample,
and a failure it finds may be another sample's than the one upstream means: :func:`claim` words
such a note "holds on some sample", and one checked on the matched samples "holds on the
matched samples", so no verdict claims more than was checked (``TriageRow.standalone``).

Example::

    >>> from conformance.triage.upstream import expectations, triage
    >>> facts = [e for e in expectations() if e.source.name == "newest" and e.dtype == "float32"]
    >>> sorted({e.expectation for e in facts})
    ['skip', 'xfail']
    >>> rows = triage({("to_sparse", "float32"): {"error": 2}}, source="newest", dtype="float32")
    >>> next(r for r in rows if r.op == "to_sparse").outcome
    're-found'
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from conformance import datafiles
from conformance.datafiles import DataFileError
from opdb.status import FAILING

EXPECTATIONS = datafiles.UPSTREAM_FILES
OUTCOMES = ("re-found", "stale", "untestable", "not swept", "missed")
expectations = datafiles.upstream_expectations
checked = datafiles.upstream_checks


@dataclass(frozen=True)
class TriageRow:
    op: str
    dtype: str
    expectation: str
    outcome: str  # one of OUTCOMES
    statuses: dict[str, int]  # the run's statuses of the op x dtype (all variants)
    why: str  # the triage file's reason, or the upstream reason
    samples: str = "all"  # "some": upstream expects it of the samples it matches only
    # what a standalone check showed (:func:`claim`: "holds on some sample" where it ran every
    # sample of a fact of some samples); "" where the triage file has no note for it
    standalone: str = ""


def claim(fact: datafiles.Expectation, outcome: str, checked_on: str = "every") -> str:
    """A standalone check's ``outcome`` for ``fact``, worded to claim no more than it checked.

    A failure found on a fact of every sample ``holds``; on a fact of some samples it ``holds on
    the matched samples`` only where the check ran the samples upstream's matchers pick
    (``checked_on`` "matched"), else it ``holds on some sample`` (every sample was run, and the
    failing one may be another than upstream means). ``stale`` needs no such words: every sample
    that ran passed, the matched ones with them.

    >>> some = next(e for e in expectations() if e.source.name == "onnxscript" and e.op == "scatter_add")
    >>> claim(some, "holds"), claim(some, "stale")
    ('holds on some sample', 'stale')
    """
    if outcome != "holds" or fact.samples != "some":
        return outcome
    return "holds on the matched samples" if checked_on == "matched" else "holds on some sample"


def sample_picker(fact: datafiles.Expectation) -> Callable[[Any], bool] | None:
    """Whether a sample is one ``fact`` is about (any of its matchers true; a matcher that raises
    on a sample does not pick it), or None where every sample is: a fact of every sample, or one
    of some samples whose list records no matchers (its check runs every sample; see :func:`claim`)."""
    if fact.samples != "some" or not fact.matchers:
        return None
    import torch

    tests = [eval(compile(f"lambda sample: ({m})", f"{fact.source.name}:{fact.op}", "eval"),  # noqa: S307
                  {"torch": torch}) for m in fact.matchers]

    def picks(sample: Any) -> bool:
        for test in tests:
            try:
                if test(sample):
                    return True
            except Exception:  # noqa: BLE001 - a matcher that cannot read the sample does not pick it
                continue
        return False

    return picks


def statuses_by_pair(cells: Iterable[tuple[str, str, str, int]]) -> dict[tuple[str, str], dict[str, int]]:
    """``(op, dtype) -> {status: items}`` from ``opdb.queries_report.matrix_cells`` rows."""
    out: dict[tuple[str, str], dict[str, int]] = {}
    for op, dtype, status, n in cells:
        out.setdefault((op, dtype), {})[status] = out.get((op, dtype), {}).get(status, 0) + n
    return out


def _failing(statuses: Mapping[str, int]) -> bool:
    return any(s in FAILING and n for s, n in statuses.items())


def triage(pairs: Mapping[tuple[str, str], Mapping[str, int]], *, source: str = "newest", dtype: str = "float32",
           device: str = "cpu", target: str | None = None) -> list[TriageRow]:
    """Every upstream-known failure of ``source`` in ``dtype`` on ``device``, triaged against a
    run's statuses (``pairs``: see :func:`statuses_by_pair`) on ``target``. A stale or untestable
    note wins where it holds for the target: the upstream failure does not hold (or cannot be
    seen) outside the harness, so a failing status of the run there has another cause and is no
    re-finding (the row still shows it). A note scoped to other targets (untestable on
    ``inductor``, where only ``implicit_fallbacks=False`` shows it) does not apply."""
    if source not in {e.source.name for e in expectations()}:
        raise DataFileError(f"{' or '.join(str(p) for p in EXPECTATIONS)}: no source {source!r}; expected one of "
                            f"{', '.join(sorted({e.source.name for e in expectations()}))}")
    notes = checked()
    rows = []
    for e in sorted((e for e in expectations() if e.source.name == source and e.dtype == dtype
                     and e.device == device), key=lambda e: e.op):
        st = dict(pairs.get((e.op, dtype), {}))
        note = notes.get((source, e.op, dtype))
        note = note if note is not None and note.holds_for(target) else None
        why = note.reason if note else e.reason
        if note and note.outcome in ("stale", "untestable"):
            outcome = note.outcome  # shown outside the harness: a failing status here has another cause
        elif _failing(st):
            outcome = "re-found"
        elif not st:
            outcome = "not swept"
        else:
            outcome = "missed"
        rows.append(TriageRow(e.op, dtype, e.expectation, outcome, st, why, e.samples,
                              claim(e, note.outcome, note.checked_on) if note else ""))
    return rows


def sources() -> dict[str, datafiles.Source]:
    """Every stored upstream list by name, in file order."""
    return {e.source.name: e.source for e in expectations()}


def default_source(target: str | None) -> str:
    """The first stored list about ``target``'s runs (``[source.NAME] targets``)."""
    for name, src in sources().items():
        if target in src.targets:
            return name
    lists = "; ".join(f"{n} ({', '.join(s.targets) or 'any target'})" for n, s in sources().items())
    raise DataFileError(f"{' or '.join(str(p) for p in EXPECTATIONS)}: no upstream list is about target "
                        f"{target!r}; the lists are {lists}")


def known_by_target() -> dict[str, dict[tuple[str, str], str]]:
    """``target -> (op, dtype) -> "xfail (newest)"``: what every stored list about a target says,
    for the report's cross-backend page (several lists: joined)."""
    out: dict[str, dict[tuple[str, str], str]] = {}
    for e in expectations():
        for target in e.source.targets:
            cell = out.setdefault(target, {})
            said = f"{e.expectation} ({e.source.name}{', some samples' if e.samples == 'some' else ''})"
            key = (e.op, e.dtype)
            if key not in cell:
                cell[key] = said
            elif said not in cell[key]:
                cell[key] += f"; {said}"
    return out


def recall(rows: Iterable[TriageRow]) -> tuple[int, int]:
    """(re-found, total - stale - not swept): the recall of upstream-known failures among the
    swept ops, untestable ones counted as not re-found."""
    rows = list(rows)
    found = sum(r.outcome == "re-found" for r in rows)
    return found, sum(r.outcome not in ("stale", "not swept") for r in rows)


def unknown_findings(pairs: Mapping[tuple[str, str], Mapping[str, int]], *, source: str = "newest",
                     device: str = "cpu") -> list[tuple[str, str, dict[str, int]]]:
    """The run's failing op x dtype pairs that ``source`` does not list (xfail or skip)."""
    known = {(e.op, e.dtype) for e in expectations() if e.source.name == source and e.device == device}
    return sorted((op, dt, dict(st)) for (op, dt), st in pairs.items() if _failing(st) and (op, dt) not in known)
