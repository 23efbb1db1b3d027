"""Inline SVG charts drawn by the report itself (no CDN, no JS): line charts and histograms.

Every label is escaped; the functions return :class:`markupsafe.Markup` ready for templates.

Example::

    >>> from reports.charts import histogram
    >>> svg = histogram([("1e-3", 4), ("<script>", 1)], title="rel err")
    >>> "<svg" in svg and "&lt;script&gt;" in svg
    True
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

from markupsafe import Markup, escape

_PALETTE = ("#2b7a3d", "#5aa9e6", "#d1495b", "#edae49", "#6a4c93", "#00798c")


def _fmt(v: float, digits: int = 3) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1000 or a < 0.01:
        return f"{v:.{digits - 1}g}"
    return f"{v:.{digits}g}"


def tick_labels(ticks: Sequence[float]) -> list[str]:
    """One label per tick, with as many significant digits as it takes for no two to read alike
    (ticks 0.6925 and 0.6930 at 3 digits both read 0.693).

        >>> tick_labels([0.6925, 0.693, 0.6935])
        ['0.6925', '0.693', '0.6935']
    """
    labels = [_fmt(t) for t in ticks]
    for digits in range(4, 16):
        if len(set(labels)) == len(labels):
            break
        labels = [_fmt(t, digits) for t in ticks]
    return labels


def _ticks(lo: float, hi: float, n: int = 4) -> list[float]:
    if hi <= lo:
        return [lo]
    step = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(step))
    for m in (1, 2, 2.5, 5, 10):
        if m * mag >= step:
            step = m * mag
            break
    start = math.floor(lo / step) * step
    out, v = [], start
    while v <= hi + step * 1e-9:
        if v >= lo - step * 1e-9:
            out.append(round(v, 12))
        v += step
    return out


def line_chart(series: Sequence[tuple[str, Sequence[float | None]]], x_labels: Sequence[str], *,
               title: str, y_label: str = "", y_min: float | None = None, y_max: float | None = None,
               highlight: int | None = None, width: int = 640, height: int = 240,
               css_class: str = "chart", dashed: Collection[str] = ()) -> Markup:
    """Lines over categorical x positions; ``None`` values leave gaps. ``highlight`` marks one x.

    Series are drawn in order, the last on top; those named in ``dashed`` are dashed (and their
    dots smaller), so a series drawn over an identical one still shows the one beneath."""
    values = [v for _, vs in series for v in vs if v is not None and math.isfinite(v)]
    if not values or not x_labels:
        return Markup(f'<p class="empty">{escape(title)}: no data yet</p>')
    lo = min(values) if y_min is None else y_min
    hi = max(values) if y_max is None else y_max
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    left, right, top, bottom = 52, 16, 28, 48
    pw, ph = width - left - right, height - top - bottom
    n = len(x_labels)

    def x(i: int) -> float:
        return left + (pw * (i + 0.5) / n)

    def y(v: float) -> float:
        return top + ph - (min(max(v, lo), hi) - lo) / (hi - lo) * ph

    out = [f'<svg class="{escape(css_class)}" role="img" viewBox="0 0 {width} {height}" '
           f'width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg">',
           f'<title>{escape(title)}</title>',
           f'<text x="{left}" y="16" class="ct">{escape(title)}</text>']
    ticks = _ticks(lo, hi)
    for t, label in zip(ticks, tick_labels(ticks), strict=True):
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{y(t):.1f}" y2="{y(t):.1f}" class="grid"/>'
                   f'<text x="{left - 6}" y="{y(t) + 4:.1f}" class="yl">{escape(label)}</text>')
    if y_label:
        out.append(f'<text x="12" y="{top + ph / 2:.0f}" class="yl" '
                   f'transform="rotate(-90 12 {top + ph / 2:.0f})">{escape(y_label)}</text>')
    if highlight is not None and 0 <= highlight < n:
        out.append(f'<rect x="{x(highlight) - pw / n / 2:.1f}" y="{top}" width="{pw / n:.1f}" '
                   f'height="{ph}" class="hl"/>')
    every = max(1, math.ceil(n / 12))
    for i, lab in enumerate(x_labels):
        if i % every == 0 or i == n - 1:
            short = lab if len(lab) <= 14 else lab[:13] + "…"
            out.append(f'<text x="{x(i):.1f}" y="{top + ph + 16}" class="xl">{escape(short)}</text>')
    xs = [f"{x(i):.1f}" for i in range(n)]
    scale = ph / (hi - lo)
    base = top + ph
    dots = n <= 24  # per-point dots with tooltips only on short series (loss curves stay small)
    for k, (name, vs) in enumerate(series):
        colour = _PALETTE[k % len(_PALETTE)]
        ename = escape(name)
        dash = ' stroke-dasharray="6 4"' if name in dashed else ""
        radius = 2 if dash else 3
        segs: list[list[str]] = [[]]
        for i, v in enumerate(vs[:n]):
            if v is None or not math.isfinite(v):
                if segs[-1]:
                    segs.append([])
                continue
            yv = base - (min(max(v, lo), hi) - lo) * scale
            segs[-1].append(f"{xs[i]},{yv:.1f}")
            if dots:
                out.append(f'<circle cx="{xs[i]}" cy="{yv:.1f}" r="{radius}" fill="{colour}">'
                           f'<title>{ename} @ {escape(x_labels[i])}: {escape(_fmt(v))}</title></circle>')
        for seg in segs:
            if seg:
                out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2"{dash} points="{" ".join(seg)}"/>')
        lx = left + 4 + k * 150
        out.append(f'<line x1="{lx}" x2="{lx + 18}" y1="{height - 11}" y2="{height - 11}" stroke="{colour}" '
                   f'stroke-width="3"{dash}/><text x="{lx + 22}" y="{height - 7}" class="lg">{ename}</text>')
    out.append("</svg>")
    return Markup("".join(out))


def histogram(bins: Sequence[tuple[str, int]], *, title: str, x_label: str = "",
              width: int = 560, height: int = 200) -> Markup:
    """Vertical bars, one per ``(label, count)``; every bar carries a tooltip with its count."""
    if not bins or not any(c for _, c in bins):
        return Markup(f'<p class="empty">{escape(title)}: no data yet</p>')
    left, right, top, bottom = 44, 8, 24, 40
    pw, ph = width - left - right, height - top - bottom
    hi = max(c for _, c in bins)
    bw = pw / len(bins)
    out = [f'<svg class="chart hist" role="img" viewBox="0 0 {width} {height}" width="{width}" '
           f'height="{height}" xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>',
           f'<text x="{left}" y="14" class="ct">{escape(title)}</text>',
           f'<text x="{left - 6}" y="{top + 4}" class="yl">{hi}</text>'
           f'<text x="{left - 6}" y="{top + ph + 4}" class="yl">0</text>'
           f'<line x1="{left}" x2="{left + pw}" y1="{top + ph}" y2="{top + ph}" class="grid"/>']
    for i, (label, count) in enumerate(bins):
        h = ph * count / hi if hi else 0
        bx = left + i * bw
        out.append(f'<rect class="bar" x="{bx + 1:.1f}" y="{top + ph - h:.1f}" width="{max(bw - 2, 1):.1f}" '
                   f'height="{h:.1f}"><title>{escape(label)}: {count}</title></rect>')
        out.append(f'<text x="{bx + bw / 2:.1f}" y="{top + ph + 14}" class="xl">{escape(label)}</text>')
    if x_label:
        out.append(f'<text x="{left + pw / 2:.0f}" y="{height - 6}" class="xl">{escape(x_label)}</text>')
    out.append("</svg>")
    return Markup("".join(out))


def log10_bins(values: Sequence[float | None]) -> list[tuple[str, int]]:
    """Histogram bins of log10(value): 'exact' for 0, one bin per decade, 'n/a' for missing."""
    exact = missing = 0
    decades: dict[int, int] = {}
    for v in values:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            missing += 1
        elif v <= 0:
            exact += 1
        elif math.isinf(v):
            decades[99] = decades.get(99, 0) + 1
        else:
            d = max(math.floor(math.log10(v)), -12)
            decades[d] = decades.get(d, 0) + 1
    bins: list[tuple[str, int]] = []
    if exact:
        bins.append(("0", exact))
    if decades:
        finite = [d for d in decades if d != 99]
        if finite:
            for d in range(min(finite), max(finite) + 1):
                bins.append((f"1e{d}", decades.get(d, 0)))
        if 99 in decades:
            bins.append(("inf", decades[99]))
    if missing:
        bins.append(("n/a", missing))
    return bins
