"""Line charts as inline SVG strings, every text in them escaped (no network: the page inlines them).

Generic drawing only: `sweeps` builds the report's charts from the results and hands them here.
"""

from __future__ import annotations

import itertools
import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

from pytest_specdec.gate.kinds import REGRESSED

#: Line colours, in series order.
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22")


@dataclass
class Series:
    """One line of a chart: points sorted by x; `dashed` for a second statistic of the same thing (P95 beside
    P50), `dotted` (hollow markers) for the reference arm beside the spec arm."""

    label: str
    points: list[tuple[float, float]]
    color: str = ""
    dashed: bool = False
    dotted: bool = False

    def dash(self) -> str:
        if self.dotted:
            return ' stroke-dasharray="1.5 3.5" stroke-linecap="round"'
        return ' stroke-dasharray="5 3"' if self.dashed else ""


@dataclass
class Chart:
    title: str
    x_label: str
    y_label: str
    series: list[Series]
    log_x: bool = False
    hlines: list[tuple[float, str]] = field(default_factory=list)  # (y, label)
    #: regime changes (x, short label, description): the condition holds for every x *above* x, so the line
    #: goes between the last swept point within and the first beyond it
    vmarks: list[tuple[float, str, str]] = field(default_factory=list)
    marks: list[tuple[float, float, str]] = field(default_factory=list)  # (x, y, label): crossovers
    #: points whose test regressed (or improved) against its baseline on this chart's metric: (x, y, verdict, label)
    flags: list[tuple[float, float, str, str]] = field(default_factory=list)
    y_min: float | None = None
    y_max: float | None = None
    note: str = ""


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(s * mag for s in (1, 2, 2.5, 5, 10) if s * mag >= raw)
    start = math.ceil(lo / step) * step
    return [round(start + i * step, 10) for i in range(int((hi - start) / step + 1e-9) + 1)]


def tick_text(x: float) -> str:
    """A number as the axes, the point tooltips and the chart notes print it: "16", "0.5", "0.333"."""
    return f"{x:.0f}" if abs(x) >= 100 or float(x).is_integer() else f"{x:.3g}"


def _legend(chart: Chart, left: int, width: int) -> tuple[list[tuple[int, int, Series, str]], int]:
    """Legend entries laid out in rows under the plot: (x, row, series, color) and the number of rows."""
    out, lx, row = [], left, 0
    for n, s in enumerate(chart.series):
        w = 30 + int(6.2 * len(s.label[:30]))
        if lx > left and lx + w > width:
            lx, row = left, row + 1
        out.append((lx, row, s, s.color or PALETTE[n % len(PALETTE)]))
        lx += w
    return out, row + 1 if chart.series else 0


_CIRCLED = "①②③④⑤⑥⑦⑧⑨"


def _regimes(chart: Chart, xs: Sequence[float]) -> tuple[list[tuple[float, float, str]], list[str]]:
    """Where each regime mark goes: ((x of the last swept point within, x of the first beyond, short label)
    for the marks passed inside the swept range, notes for all of them)."""
    axis = chart.x_label.split(" ")[0]
    swept = sorted(set(xs))
    placed, notes = [], []
    for x, short, what in chart.vmarks:
        within = [v for v in swept if v <= x]
        beyond = [v for v in swept if v > x]
        if within and beyond:
            placed.append((within[-1], beyond[0], short))
            notes.append(f"┆ {what}: from {axis} {tick_text(beyond[0])} on ({axis} {tick_text(within[-1])} is within)")
        elif beyond:
            notes.append(f"{what}: at every swept {axis}")
        else:
            notes.append(f"{what}: only above {axis} {tick_text(x)}, beyond the swept range")
    return placed, notes


def svg_chart(chart: Chart, width: int = 430, height: int = 250) -> str:
    """A line chart as inline SVG; every text escaped. Empty string when there is nothing to draw.

    Marks that fall outside the swept range are not drawn in the plot but listed under it, like the
    crossovers, so nothing is silently dropped and labels never overlap the lines. Crossovers closer
    than a marker's width share one label (①②) instead of printing over each other."""
    pts = [p for s in chart.series for p in s.points]
    if not pts:
        return ""
    left, right, top = 52, 12, 30
    pw, ph = width - left - right, height - top - 44
    legend, rows = _legend(chart, left, width)
    xs = [x for x, _ in pts]
    fx = (lambda v: math.log2(v)) if chart.log_x else (lambda v: v)
    placed, regime_notes = _regimes(chart, xs)
    flag_notes = [f"{'▼' if verdict == REGRESSED else '▲'} {verdict} vs baseline: {label}"
                  for _, _, verdict, label in chart.flags]
    notes = [lb for _, _, lb in chart.marks] + flag_notes + regime_notes + ([chart.note] if chart.note else [])
    kinds = ["note"] * len(chart.marks) + [f"note n-{v}" for _, _, v, _ in chart.flags] + ["note"] * len(notes)
    # Notes wrap inside the chart (9 px text, ~5 px a character) instead of running past its edge.
    note_lines = [(line, kinds[i]) for i, note in enumerate(notes)
                  for line in textwrap.wrap((_CIRCLED[i % 9] + " " if i < len(chart.marks) else "") + note,
                                            width=max(20, (width - left - 8) // 5), subsequent_indent="   ")]
    total_h = top + ph + 44 + 13 * rows + 13 * len(note_lines) + 4
    ys = [y for _, y in pts] + [y for y, _ in chart.hlines]
    x0, x1 = min(map(fx, xs)), max(map(fx, xs))
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    pad = (x1 - x0) * 0.04
    x0, x1 = x0 - pad, x1 + pad
    y0 = chart.y_min if chart.y_min is not None else min(0.0, min(ys))
    y1 = chart.y_max if chart.y_max is not None else max(ys) * 1.08 if max(ys) > 0 else 1.0
    if y1 <= y0:
        y1 = y0 + 1

    def pxf(f: float) -> float:
        return left + (f - x0) / (x1 - x0) * pw

    def px(v: float) -> float:
        return pxf(fx(v))

    def py(v: float) -> float:
        return top + (1 - (v - y0) / (y1 - y0)) * ph

    out = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{total_h}" '
           f'viewBox="0 0 {width} {total_h}" role="img" aria-label="{escape(chart.title)}">',
           f'<text x="{left}" y="16" class="ct">{escape(chart.title)}</text>',
           f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" class="plot"/>']
    for t in _ticks(y0, y1):
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{py(t):.1f}" y2="{py(t):.1f}" class="grid"/>'
                   f'<text x="{left - 4}" y="{py(t) + 4:.1f}" class="yt">{tick_text(t)}</text>')
    last = -math.inf  # a label per distinct x, but none within 32 px of the last (two arms' near-equal req/s)
    for t in sorted(set(xs)):
        if px(t) - last >= 32:
            out.append(f'<text x="{px(t):.1f}" y="{top + ph + 14}" class="xt">{tick_text(t)}</text>')
            last = px(t)
    out.append(f'<text x="{left + pw / 2}" y="{top + ph + 28}" class="xl">{escape(chart.x_label)}</text>')
    out.append(f'<text x="12" y="{top + ph / 2}" class="yl" transform="rotate(-90 12 {top + ph / 2})">'
               f'{escape(chart.y_label)}</text>')
    for y, label in chart.hlines:
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{py(y):.1f}" y2="{py(y):.1f}" class="ref"/>'
                   f'<text x="{left + 4}" y="{py(y) - 3:.1f}" class="rt">{escape(label)}</text>')
    for i, (within, beyond, label) in enumerate(placed):
        # Halfway (on the axis' scale) between the last point within the limit and the first beyond it;
        # the label sits on the side beyond, where it holds, unless it would run off the plot.
        x = pxf((fx(within) + fx(beyond)) / 2)
        fits = x + 6 + 5.6 * len(label) < left + pw
        anchor, text = ("start", f"{label} →") if fits else ("end", f"← {label}")
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + ph}" class="regime"/>'
                   f'<text x="{x + (3 if fits else -3):.1f}" y="{top + 11 + 11 * i}" class="regt" '
                   f'text-anchor="{anchor}">{escape(text)}</text>')
    for n, s in enumerate(chart.series):
        color = s.color or PALETTE[n % len(PALETTE)]
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in s.points)
        width_ = "2" if s.dotted else "2.2"
        out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="{width_}"{s.dash()}/>')
        fill = f'fill="#fff" stroke="{color}" stroke-width="1.5"' if s.dotted else f'fill="{color}"'
        out += [f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" {fill}><title>{escape(s.label)}: '
                f'{tick_text(x)} → {y:.3g}</title></circle>' for x, y in s.points]
    for x, y, verdict, label in chart.flags:
        out.append(f'<rect x="{px(x) - 7:.1f}" y="{py(y) - 7:.1f}" width="14" height="14" class="flag f-{verdict}">'
                   f'<title>{escape(verdict)} vs baseline: {escape(label)}</title></rect>')
    clusters: list[list[tuple[float, float, int, str]]] = []
    for mx, my, i, label in sorted(((px(x), py(y), i, lb) for i, (x, y, lb) in enumerate(chart.marks)),
                                   key=lambda m: m[0]):
        if clusters and abs(mx - clusters[-1][-1][0]) < 16 and abs(my - clusters[-1][-1][1]) < 16:
            clusters[-1].append((mx, my, i, label))
        else:
            clusters.append([(mx, my, i, label)])
    for cluster in clusters:
        for mx, my, _, label in cluster:
            out.append(f'<circle cx="{mx:.1f}" cy="{my:.1f}" r="6" class="cross"><title>{escape(label)}</title>'
                       f'</circle>')
        cx = sum(m[0] for m in cluster) / len(cluster)
        cy = max(m[1] for m in cluster)
        nums = "".join(_CIRCLED[i % 9] for _, _, i, _ in sorted(cluster, key=lambda m: m[2]))
        out.append(f'<text x="{cx:.1f}" y="{cy + 18:.1f}" class="crt">{nums}</text>')
    base = top + ph + 44
    for lx, row, s, color in legend:
        label = escape(s.label if len(s.label) <= 30 else s.label[:29] + "…")
        ly = base + 13 * row
        out.append(f'<line x1="{lx}" x2="{lx + 16}" y1="{ly - 4}" y2="{ly - 4}" stroke="{color}" stroke-width="2.5"'
                   f'{s.dash()}/><text x="{lx + 20}" y="{ly}" class="lg">{label}</text>')
    for i, (line, kind) in enumerate(note_lines):
        out.append(f'<text x="{left}" y="{base + 13 * rows + 13 * i}" class="{kind}" xml:space="preserve">'
                   f'{escape(line)}</text>')
    out.append("</svg>")
    return "".join(out)


def crossovers(points: Sequence[tuple[float, float]], level: float = 1.0, log_x: bool = True
               ) -> list[tuple[float, float]]:
    """Where a line crosses `level`, linearly interpolated (in log2 x on a log axis)."""
    out = []
    for (xa, ya), (xb, yb) in itertools.pairwise(points):
        if (ya - level) * (yb - level) < 0:
            t = (level - ya) / (yb - ya)
            if log_x:
                x = 2 ** (math.log2(xa) + t * (math.log2(xb) - math.log2(xa)))
            else:
                x = xa + t * (xb - xa)
            out.append((x, level))
    return out
