"""Published claims vs measured verdicts: a vendor's per-API compatibility table held against what
a build did in a stored run.

A vendor publishes, each release, which ATen ops run natively (``Y``), run on the CPU fallback
(``CPU_FALLBACK``, with the dtypes) or are not supported (``N``). Users plan migrations from it;
it is documentation and may be wrong. :func:`load` reads such a table from Markdown: one table
with the columns ``API | Status | Dtypes | Notes``, API an ATen name (``aten::cumsum`` for every
overload, or ``aten::cumsum.default``), Dtypes comma-separated dtype names (empty: every dtype).
:func:`measure` reads what a run's items dispatched per overload and dtype (natively, on the
CPU fallback, or failing there), never a manifest; :func:`check` says, per claim and dtype,
whether the run kept it, disagreed (:data:`KINDS`), or had nothing to say (unchecked: never
counted as kept).

Example::

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "c.md"
    >>> _ = p.write_text("| API | Status | Dtypes | Notes |\\n|---|---|---|---|\\n| aten::mm | Y | float32 | |\\n")
    >>> [(c.api, c.status, c.dtypes) for c in load(p)]
    [('aten::mm', 'Y', ('float32',))]
"""

from __future__ import annotations

import collections
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance.datafiles import DataFileError

COLUMNS = ("API", "Status", "Dtypes", "Notes")
STATUSES = ("Y", "CPU_FALLBACK", "N")
#: What a disagreement between a claim and a run is.
KINDS = {
    "not_native": "claimed native (Y); ran on the CPU fallback",
    "fails": "claimed to run (Y or CPU_FALLBACK); fails on the device (an error: with the device's "
             "silent recovery a user sees it run on the CPU instead)",
    "dtype_not_delivered": "claimed for this dtype; the device refuses the dtype",
    "native_not_claimed": "claimed CPU_FALLBACK; ran natively",
    "works_not_claimed": "claimed not supported (N); works",
}
DTYPES = ("float16", "bfloat16", "float32", "float64", "complex32", "complex64", "complex128", "bool",
          "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
          "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
_API = re.compile(r"^aten::([A-Za-z_][A-Za-z0-9_]*)(?:\.([A-Za-z_][A-Za-z0-9_]*))?$")
_NAMED = re.compile(r"aten::[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)?")
# an item that ends in one of these ran on the device and failed there (not a wrong value)
_FAILS = ("error", "crash", "timeout")


@dataclass(frozen=True)
class Claim:
    api: str  # aten::name or aten::name.overload
    status: str  # Y | CPU_FALLBACK | N
    dtypes: tuple[str, ...]  # empty: every dtype
    notes: str
    line: int  # 1-based, in the file

    def covers(self, overload: str) -> bool:
        """Whether ``overload`` (``aten::name.overload``) is what this claim is about."""
        return overload == self.api if "." in self.api else overload.rsplit(".", 1)[0] == self.api


def _cells(line: str) -> list[str]:
    text = line.strip()
    if text.startswith("|"):
        text = text[1:]
    if text.endswith("|"):
        text = text[:-1]
    return [c.strip() for c in text.split("|")]


def _strip_code(text: str) -> str:
    return text.strip().strip("`").strip()


def load(path: str | Path) -> list[Claim]:
    """The claims of the compatibility table in the Markdown file ``path``; a malformed table or
    row is one :class:`DataFileError` naming the file, the line and the value."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataFileError(f"{path}: cannot be read as UTF-8 Markdown ({exc})") from None
    heads = [i for i, ln in enumerate(lines) if ln.strip().startswith("|")
             and tuple(c.lower() for c in _cells(ln)) == tuple(c.lower() for c in COLUMNS)]
    if len(heads) != 1:
        raise DataFileError(f"{path}: expected exactly one table with the columns {' | '.join(COLUMNS)}; "
                            f"found {len(heads)}")
    head = heads[0]
    if head + 1 >= len(lines) or not re.fullmatch(r"\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?", lines[head + 1].strip()):
        raise DataFileError(f"{path}:{head + 2}: expected the table's separator row (|---|---|---|---|) "
                            "under its header")
    import torch

    known = {n.split("::", 1)[1].split(".", 1)[0] for n in torch._C._dispatch_get_all_op_names()
             if n.startswith("aten::")}
    overloads = set(torch._C._dispatch_get_all_op_names())
    claims: list[Claim] = []
    seen: dict[str, int] = {}
    for i in range(head + 2, len(lines)):
        raw = lines[i]
        if not raw.strip().startswith("|"):
            break  # the table ends
        where = f"{path}:{i + 1}"
        cells = _cells(raw)
        if len(cells) != len(COLUMNS):
            raise DataFileError(f"{where}: a row has {len(cells)} cells, expected {len(COLUMNS)} "
                                f"({' | '.join(COLUMNS)}): {raw.strip()!r}")
        api, status, dtypes, notes = _strip_code(cells[0]), cells[1].strip(), cells[2], cells[3]
        m = _API.match(api)
        if not m:
            raise DataFileError(f"{where}: API {api!r}: expected an ATen name, aten::name or aten::name.overload")
        name, overload = m.group(1), m.group(2)
        if name not in known or (overload and f"aten::{name}{'' if overload == 'default' else '.' + overload}"
                                 not in overloads):
            raise DataFileError(f"{where}: API {api!r}: no such ATen {'overload' if overload else 'op'} in this "
                                f"torch ({torch.__version__})")
        if status not in STATUSES:
            raise DataFileError(f"{where}: Status {status!r}: expected one of {', '.join(STATUSES)}")
        names = tuple(d.strip().removeprefix("torch.") for d in dtypes.split(",") if d.strip())
        bad = [d for d in names if d not in DTYPES]
        if bad:
            raise DataFileError(f"{where}: Dtypes {bad[0]!r}: expected dtype names such as float32, bfloat16, int64 "
                                "(comma-separated; empty: every dtype)")
        if api in seen:
            raise DataFileError(f"{where}: API {api!r} is claimed twice (first on line {seen[api]})")
        seen[api] = i + 1
        claims.append(Claim(api, status, names, notes.strip(), i + 1))
    if not claims:
        raise DataFileError(f"{path}:{head + 1}: the table has no rows")
    return claims


@dataclass
class Measured:
    """What one overload did in one dtype over a run's items."""

    native: int = 0  # items in which it ran natively
    fallback: int = 0  # ... on the CPU fallback
    fails: int = 0  # failing items whose error names it (or a schema item of it)
    refused: int = 0  # unsupported_dtype items whose error names it
    example: str = ""  # an item key and error of a failure

    def describe(self) -> str:
        parts = [f"{n} {what}" for n, what in ((self.native, "native"), (self.fallback, "CPU fallback"),
                                               (self.fails, "failing"), (self.refused, "dtype refused")) if n]
        return ", ".join(parts) + " item(s)" if parts else "not reached"


def measure(rows: Iterable[dict[str, Any]]) -> dict[tuple[str, str], Measured]:
    """Per (ATen overload, dtype): what the items ``rows`` (``op_results`` rows of one run) did.
    A failing item counts against the overloads its error names (what the device says failed; a
    schema item's is its own overload): an error that names none is not attributed."""
    out: dict[tuple[str, str], Measured] = collections.defaultdict(Measured)
    for r in rows:
        dtype = r.get("dtype") or ""
        if dtype not in DTYPES:
            continue
        native = set(json.loads(r.get("native_ops") or "[]"))
        fallback = set(json.loads(r.get("fallback_ops") or "[]"))
        for o in native:
            out[(o, dtype)].native += 1
        for o in fallback:
            out[(o, dtype)].fallback += 1
        status = r.get("status") or ""
        if status not in (*_FAILS, "unsupported_dtype"):
            continue
        error = r.get("error") or ""
        reached = set(json.loads(r.get("reached_ops") or "[]")) | native | fallback
        if r.get("variant") in ("schema", "traced"):  # items of one ATen overload
            blamed = {r["op"]}
        else:
            blamed = {n if "." in n else n + ".default" for n in _NAMED.findall(error)} & reached
        for o in blamed:
            m = out[(o, dtype)]
            if status == "unsupported_dtype":
                m.refused += 1
            else:
                m.fails += 1
            m.example = m.example or f"{r.get('item_key')}: {error[:200]}"
    return dict(out)


@dataclass(frozen=True)
class Finding:
    claim: Claim
    dtype: str  # "" for a claim the run has nothing on at all
    kind: str  # one of KINDS, "kept" or "unchecked"
    measured: str
    example: str = ""

    def as_json(self) -> dict[str, Any]:
        return {"api": self.claim.api, "dtype": self.dtype or None, "claimed": self.claim.status,
                "claimed_dtypes": list(self.claim.dtypes) or None, "measured": self.measured, "kind": self.kind,
                "what": KINDS.get(self.kind, self.kind), "line": self.claim.line, "example": self.example or None}


def _judge(status: str, m: Measured) -> str:
    if status == "N":
        return "works_not_claimed" if (m.native or m.fallback) and not (m.fails or m.refused) else "kept"
    if m.fails:
        return "fails"
    if m.refused:
        return "dtype_not_delivered"
    if status == "Y":
        return "not_native" if m.fallback and not m.native else "kept"
    return "native_not_claimed" if m.native and not m.fallback else "kept"  # CPU_FALLBACK


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)

    @property
    def disagreements(self) -> list[Finding]:
        return [f for f in self.findings if f.kind in KINDS]

    def count(self, kind: str) -> int:
        return sum(f.kind == kind for f in self.findings)


_WORST = ("fails", "dtype_not_delivered", "not_native", "native_not_claimed", "works_not_claimed")


def check(claims: list[Claim], measured: dict[tuple[str, str], Measured]) -> Report:
    """Each claim, per dtype it names (or every dtype the run reached its overloads in), held
    against ``measured``: overload by overload (a claim on ``aten::name`` speaks for every
    overload of it), the worst disagreement wins and names its overload."""
    by_overload: dict[str, dict[str, Measured]] = collections.defaultdict(dict)
    for (o, d), m in measured.items():
        by_overload[o][d] = m
    report = Report()
    for c in claims:
        mine = {o: per for o, per in sorted(by_overload.items()) if c.covers(o)}
        dtypes = c.dtypes or tuple(sorted({d for per in mine.values() for d in per}))
        if not dtypes:
            report.findings.append(Finding(c, "", "unchecked", "no item reached it"))
            continue
        for d in dtypes:
            judged = [(o, per[d], _judge(c.status, per[d])) for o, per in mine.items() if d in per]
            if not judged:
                report.findings.append(Finding(c, d, "unchecked", f"no {d} item reached it"))
                continue
            bad = sorted((j for j in judged if j[2] != "kept"), key=lambda j: _WORST.index(j[2]))
            if bad:
                o, m, kind = bad[0]
                more = f" (and {len(bad) - 1} more overload(s))" if len(bad) > 1 else ""
                report.findings.append(Finding(c, d, kind, f"{o}: {m.describe()}{more}", m.example))
            else:
                total = ", ".join(f"{o}: {m.describe()}" for o, m, _ in judged[:3])
                report.findings.append(Finding(c, d, "kept", total + (" ..." if len(judged) > 3 else "")))
    return report


def run_report(store: Any, run_id: str, table: str | Path) -> Report:
    """The claims of ``table`` held against the stored run ``run_id`` (reads only)."""
    from opdb.queries_report import dispatch_rows

    return check(load(table), measure(dispatch_rows(store, run_id)))


def store_report(store: Any, run_id: str, table: str | Path, report: Report) -> None:
    """Keep ``report`` (of ``table`` against ``run_id``) in the database, for the report site."""
    from opdb.queries_report import replace_claims

    replace_claims(store, run_id, [
        {"run_id": run_id, "tbl": str(table), "api": f.claim.api, "dtype": f.dtype,
         "claimed": f.claim.status + (f" ({', '.join(f.claim.dtypes)})" if f.claim.dtypes else ""),
         "kind": f.kind, "measured": f.measured, "example": f.example, "line": f.claim.line}
        for f in report.findings])


def published_table(target: str, build: str) -> Path | None:
    """The compatibility table the vendor of ``target`` publishes for ``build``, where the target
    knows one (:meth:`conformance.targets.base.Target.published_claims`); None otherwise."""
    from conformance.targets.base import REGISTRY, load_builtin

    load_builtin()
    cls = REGISTRY.get(target)
    return cls.published_claims(build) if cls is not None else None


__all__ = ["COLUMNS", "KINDS", "STATUSES", "Claim", "Finding", "Measured", "Report", "check", "load", "measure", "published_table",
           "run_report", "store_report"]
