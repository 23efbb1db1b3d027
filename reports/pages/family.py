"""``<build>/models/<family>.html``: one card per graph, split in parts above FAMILY_PART_GRAPHS."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from markupsafe import Markup

from .. import charts
from ..contexts import FamilyPage, GraphCard, Link, ShapeRow
from ..html import Slugger, parse_json
from ..scope import BuildScope

TEMPLATE = "family.html"
CONTEXT = FamilyPage
PER_BUILD = True
NAV = None
FAMILY_PART_GRAPHS = 100  # graph cards per family page part


@dataclass
class Family:
    """A model family of one build: its result rows, their cards and the file names of its parts."""

    name: str
    graphs: list[dict[str, Any]]
    cards: list[GraphCard]
    files: list[str]  # one per part, relative to <build>/models/

    def parts(self) -> Iterator[tuple[str, list[GraphCard]]]:
        for k, name in enumerate(self.files):
            yield name, self.cards[k * FAMILY_PART_GRAPHS:(k + 1) * FAMILY_PART_GRAPHS]


def families(b: BuildScope) -> list[Family]:
    """The build's model families in result order (computed once; the models page lists them)."""
    def make() -> list[Family]:
        slug = Slugger()
        out = []
        for fam, grp in itertools.groupby(b.model_rows(), key=lambda r: r["family"] or "-"):
            graphs = list(grp)
            s = slug(fam)
            nparts = max(1, -(-len(graphs) // FAMILY_PART_GRAPHS))
            files = [f"{s}.html"] + [f"{s}.{k}.html" for k in range(2, nparts + 1)]
            out.append(Family(fam, graphs, [card(g) for g in graphs], files))
        return out
    return b.memo("families", make)


def latency_note(b: BuildScope) -> str:
    """What latencies mean on the build's target ('' when nothing to say)."""
    run = b.info.model_run
    if run and (run.get("target") or "").startswith("neuron-emu"):
        return ("Latencies on the emulator (target neuron-emu) are CPU time of the emulated device, "
                "not device time.")
    return ""


def pages(b: BuildScope) -> Iterator[tuple[str, FamilyPage]]:
    info, note = b.info, latency_note(b)
    for fam in families(b):
        parts = [Link(n, f"part {k + 1}") for k, n in enumerate(fam.files)] if len(fam.files) > 1 else []
        for k, (name, chunk) in enumerate(fam.parts()):
            yield f"{info.slug}/models/{name}", FamilyPage(
                **b.base(f"{fam.name} — {info.build}", "../../"), info=info, family=fam.name,
                latency_note=note, graphs=chunk, n_graphs=len(fam.cards), part=k + 1, parts=parts)


def card(g: dict[str, Any]) -> GraphCard:
    """One model result as its card shows it."""
    curve = parse_json(g["loss_curve"], {})
    series = []
    n = 0
    if isinstance(curve, dict):
        for key in ("cpu", "target"):  # the target's line drawn last, dashed: on top of an identical CPU line
            vals = curve.get(key)
            if isinstance(vals, list):
                vals = [float(v) if isinstance(v, (int, float)) else None for v in vals]
                series.append((key, vals))
                n = max(n, len(vals))
    loss_svg = (charts.line_chart(series, [str(i) for i in range(n)], title="loss curve (target vs cpu)",
                                  width=360, height=180, css_class="chart small", dashed=("target",))
                if n else Markup('<p class="empty">no loss curve</p>'))
    shapes = _shapes(g["shapes"])
    native = parse_json(g["native_ops"], [])
    fallback = parse_json(g["fallback_ops"], [])
    recompiles = g["recompiles"] or 0
    return GraphCard(
        id=g["id"], anchor=f"g{g['id']}", model_id=g["model_id"] or "", family=g["family"] or "-",
        dtype=g["dtype"] or "", mode=g["mode"] or "", status=g["status"] or "?",
        graph_hash=g["graph_hash"] or "", params=g["params"] or "", fwd_rel_err=g["fwd_rel_err"],
        max_abs_err=g["max_abs_err"],
        max_rel_err=g["max_rel_err"], grad_max_rel_err=g["grad_max_rel_err"], loss_svg=loss_svg,
        compiles=_compiles(g["mode"], recompiles, shapes), recompiles=recompiles,
        compile_s=g["compile_s"], p50_ms=g["p50_ms"], p99_ms=g["p99_ms"], shapes=shapes,
        first_divergent_op=g["first_divergent_op"] or "", first_divergent_detail=g["first_divergent_detail"] or "",
        native_ops=len(native) if isinstance(native, list) else 0,
        fallback_ops=[str(x) for x in fallback] if isinstance(fallback, list) else [str(fallback)],
        error=g["error"] or "", cause=g.get("cause") or "")


def _shapes(text: Any) -> list[ShapeRow]:
    """The records of a graph's shape sweep (a list of records, or a mapping shape -> record)."""
    shapes = []
    raw = parse_json(text, [])
    if isinstance(raw, dict):
        raw = [{"shape": k, **(v if isinstance(v, dict) else {"value": v})} for k, v in raw.items()]
    if isinstance(raw, list):
        for rec in raw:
            if not isinstance(rec, dict):
                rec = {"shape": rec}
            known = ("shape", "compiles", "recompiled", "recompiles", "p50_ms", "p99_ms")
            recompiled = rec.get("recompiled")
            if recompiled is None and rec.get("recompiles") is not None:
                recompiled = bool(_int(rec.get("recompiles")))
            compiles = _int(rec.get("compiles"))
            if compiles is None and rec.get("recompiles") is not None:
                compiles = _int(rec.get("recompiles"))
            shapes.append(ShapeRow(
                shape=_shape_text(rec.get("shape", "")), compiles=compiles,
                recompiled=None if recompiled is None else bool(recompiled),
                p50_ms=_float(rec.get("p50_ms")), p99_ms=_float(rec.get("p99_ms")),
                extra=", ".join(f"{k}={v}" for k, v in rec.items() if k not in known)))
    return shapes


def _shape_text(shape: Any) -> str:
    """``[[2, 8], [8]]`` -> ``[2, 8], [8]``; a flat list of ints is one shape."""
    if isinstance(shape, (list, tuple)):
        if all(isinstance(x, int) for x in shape):
            return "[" + ", ".join(map(str, shape)) + "]"
        return ", ".join(_shape_text(x) for x in shape)
    return str(shape)


def _compiles(mode: str | None, recompiles: int, shapes: list[ShapeRow]) -> int:
    if mode != "compile":
        return 0
    known = [s.compiles for s in shapes if s.compiles is not None]
    if known and any(s.recompiled is not None for s in shapes):
        return sum(known)
    return 1 + recompiles


def _int(v: Any) -> int | None:
    try:
        return int(v) if v is not None else None
    except (TypeError, ValueError):
        return None


def _float(v: Any) -> float | None:
    try:
        return float(v) if v is not None else None
    except (TypeError, ValueError):
        return None
