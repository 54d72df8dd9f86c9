"""The HTML report and the pytest-benchmark export, both from the JSON results dict.

Pure functions: a results dict (what `SpecDecSession.results()` builds and `reports/*.json` hold) in,
an HTML string or a JSON-able dict out. Charts are inline SVG strings built here, every text in them
escaped; the page is a jinja2 template shipped in the package with autoescape on, so a test id, a
prompt or a log line holding `<script>` shows as text. No network: inline CSS and SVG only.
"""

from __future__ import annotations

import math
import re
import shlex
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Any

#: Worst first: the order of the summary table and of the per-test sections.
STATUS_ORDER = ("regressed", "failed", "invalid", "inconclusive", "not-comparable", "no baseline", "improved",
                "unchanged", "passed")
#: Verdict badges in the summary table: (column, verdict metric). The gated three first: they decide the
#: test; then two shown-family figures a reader looks for (drawn lighter: they never fail a test).
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22")
#: Params a sweep chart can take as its x axis (numeric), with the axis label.
SWEEP_AXES = {"concurrency": "concurrency (requests in flight)", "temperature": "temperature",
              "k": "k (num_speculative_tokens)"}
#: Short names in legend labels (they are cut at 30 characters): "draft_model k=3 T=0.5".
_AXIS_SHORT = {"concurrency": "c", "temperature": "T"}


# ---- reading the results --------------------------------------------------------------------------


def test_name(nodeid: str) -> tuple[str, str]:
    """`path::test_fn[id]` → (`path::test_fn`, `id`)."""
    base, sep, rest = nodeid.partition("[")
    return base, rest[:-1] if sep and rest.endswith("]") else rest


def family(verdict: dict[str, Any]) -> str:
    """A verdict's family: "gated" (it can fail the test) or "shown" (judged and shown, never fails).
    Older result files have no family; every verdict of theirs could fail a test, so they count as gated."""
    return "shown" if verdict.get("family") == "shown" else "gated"


def _verdicts(test: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in (test.get("verdicts") or {}).items() if isinstance(v, dict)}


def status(test: dict[str, Any]) -> str:
    """One word per test: what the morning reader must look at first. Only the gated family decides
    regressed, inconclusive and improved, as it decides whether the test fails; a shown-family change is
    listed with the test's metrics but does not colour the test."""
    verdicts = list(_verdicts(test).values())
    gated = [v.get("verdict") for v in verdicts if family(v) == "gated"]
    if "regressed" in gated:
        return "regressed"
    if str(test.get("outcome", "")).startswith(("failed", "error")):
        return "failed"
    if test.get("validity") and not test["validity"].get("valid", True):
        return "invalid"
    if "inconclusive" in gated:
        return "inconclusive"
    if any(v.get("verdict") == "not-comparable" for v in verdicts):
        return "not-comparable"
    baseline = test.get("baseline") or {}
    if baseline.get("status") in ("missing", "error"):
        return "no baseline"
    if "improved" in gated:
        return "improved"
    return "unchanged" if verdicts else "passed"


def sort_tests(tests: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Regressions first, then failures, invalid runs, ...; the suite's order within each."""
    items = list(tests)
    return sorted(items, key=lambda t: (STATUS_ORDER.index(status(t)), items.index(t)))


def totals(tests: Iterable[dict[str, Any]]) -> dict[str, int]:
    """Tests per status, in STATUS_ORDER, zeros left out."""
    counts = {s: 0 for s in STATUS_ORDER}
    for t in tests:
        counts[status(t)] += 1
    return {s: n for s, n in counts.items() if n}


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def regime_limits(server: dict[str, Any] | None) -> list[tuple[int, str]]:
    """Token budgets of a spec server beyond which a decode step changes regime: the largest CUDA-graph
    capture size and max_num_batched_tokens, from its recorded engine config (the command as fallback)."""
    if not server:
        return []
    config = server.get("engine_config") or {}
    blob = " ".join(f"{k}={v}" for k, v in config.items())
    out: list[tuple[int, str]] = []
    m = re.search(r"max_cudagraph_capture_size['\"]?\s*[:=]\s*(\d+)", blob)
    sizes = re.search(r"cudagraph_capture_sizes['\"]?\s*[:=]\s*\[([^\]]*)\]", blob)
    if m:
        out.append((int(m.group(1)), "CUDA-graph capture size"))
    elif sizes and re.findall(r"\d+", sizes.group(1)):
        out.append((max(int(x) for x in re.findall(r"\d+", sizes.group(1))), "CUDA-graph capture size"))
    m = re.search(r"max_num_batched_tokens['\"]?\s*[:=]\s*(\d+)", blob)
    if m is None:
        cmd = list(server.get("command") or [])
        if "--max-num-batched-tokens" in cmd[:-1]:
            value = cmd[cmd.index("--max-num-batched-tokens") + 1]
            m = re.fullmatch(r"(\d+)", value)
    if m:
        out.append((int(m.group(1)), "max_num_batched_tokens"))
    return out


def _k_of(test: dict[str, Any]) -> int:
    params = test.get("params") or {}
    k = params.get("k")
    if k is None and isinstance(params.get("speculative_config"), dict):
        k = params["speculative_config"].get("num_speculative_tokens")
    return int(k) if isinstance(k, int) else 0


# ---- SVG charts -------------------------------------------------------------------------------------


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


def _fmt(x: float) -> str:
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
            notes.append(f"┆ {what}: from {axis} {_fmt(beyond[0])} on ({axis} {_fmt(within[-1])} is within)")
        elif beyond:
            notes.append(f"{what}: at every swept {axis}")
        else:
            notes.append(f"{what}: only above {axis} {_fmt(x)}, beyond the swept range")
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
    flag_notes = [f"{'▼' if verdict == 'regressed' else '▲'} {verdict} vs baseline: {label}"
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
                   f'<text x="{left - 4}" y="{py(t) + 4:.1f}" class="yt">{_fmt(t)}</text>')
    for t in sorted(set(xs)):
        out.append(f'<text x="{px(t):.1f}" y="{top + ph + 14}" class="xt">{_fmt(t)}</text>')
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
                f'{_fmt(x)} → {y:.3g}</title></circle>' for x, y in s.points]
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
    for (xa, ya), (xb, yb) in zip(points, points[1:]):
        if (ya - level) * (yb - level) < 0:
            t = (level - ya) / (yb - ya)
            if log_x:
                x = 2 ** (math.log2(xa) + t * (math.log2(xb) - math.log2(xa)))
            else:
                x = xa + t * (xb - xa)
            out.append((x, level))
    return out


# ---- sweeps -------------------------------------------------------------------------------------------


@dataclass
class Sweep:
    """Tests of one test function that differ only in `axis` (and the method: one line each)."""

    function: str
    axis: str
    fixed: dict[str, Any]
    lines: dict[str, list[dict[str, Any]]]  # line label → tests sorted by the axis value


def _line_label(test: dict[str, Any], axis: str) -> str:
    p = test.get("params") or {}
    return str(p.get("method")) + ("" if axis == "k" or p.get("method") == "none" or p.get("k") is None
                                   else f" k={p.get('k')}")


def sweeps(tests: Iterable[dict[str, Any]]) -> list[Sweep]:
    """Group the measured tests by the params that vary: one sweep per test function, axis and the
    other params held fixed, with a line per method; only where an axis has at least two values."""
    measured = [t for t in tests if t.get("summary")]
    out: list[Sweep] = []
    for axis in SWEEP_AXES:
        groups: dict[tuple[str, str], Sweep] = {}
        for t in measured:
            params = t.get("params") or {}
            if _num(params.get(axis)) is None:
                continue
            fn = test_name(t["nodeid"])[0]
            fixed = {k: v for k, v in params.items() if k not in (axis, "method") and not (axis != "k" and k == "k")}
            key = (fn, repr(sorted((k, repr(v)) for k, v in fixed.items())))
            sweep = groups.setdefault(key, Sweep(fn, axis, fixed, {}))
            sweep.lines.setdefault(_line_label(t, axis), []).append(t)
        for sweep in groups.values():
            for label, items in sweep.lines.items():
                items.sort(key=lambda t: t["params"][axis])
            if any(len({t["params"][axis] for t in items}) >= 2 for items in sweep.lines.values()):
                out.append(sweep)
    return out


def _points(items: list[dict[str, Any]], axis: str, get: Any) -> list[tuple[float, float]]:
    pts = []
    for t in items:
        y = _num(get(t["summary"]))
        if y is not None:
            pts.append((float(t["params"][axis]), y))
    return pts


def _reference(metric: str, pct: str) -> Any:
    """A reference-arm latency the way the summary gives the spec arm's: the median over the valid runs
    whose stream was not coalesced of each run's percentile (`summary` has no reference latencies; the
    runs do). A burst against a stream would compare the client's lateness, not the engines."""
    from statistics import median

    def get(test: dict[str, Any]) -> float | None:
        values = [v for r in test.get("reference_runs") or [] if r.get("valid", True)
                  and not r.get("latency_untrusted")
                  if (v := _num((r.get(metric) or {}).get(pct))) is not None]
        return median(values) if values else None

    return get


def _ref_points(items: list[dict[str, Any]], axis: str, get: Any) -> list[tuple[float, float]]:
    return [(float(t["params"][axis]), y) for t in items if (y := _num(get(t))) is not None]


def sweep_chart_groups(sweep: Sweep, servers: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """The charts of one sweep (SVG strings) in two rows: throughput and acceptance (speedup with its 1.0
    line, crossovers and regime marks; acceptance with draft coverage; per-position acceptance), then latency
    (TPOT P50/P95 of the spec arm; TTFT and E2E P95, spec arm solid, reference arm dotted)."""
    axis, log_x = sweep.axis, sweep.axis == "concurrency"
    xl = SWEEP_AXES[axis]
    lines = sweep.lines
    charts: list[Chart] = []
    speed = Chart("speedup vs " + axis + " (spec ÷ reference tok/s)", xl, "speedup (×)",
                  [Series(lb, _points(it, axis, lambda s: s.get("speedup"))) for lb, it in lines.items()],
                  log_x=log_x, hlines=[(1.0, "1.0 = no gain")])
    for s in speed.series:
        for x, y in crossovers(s.points, 1.0, log_x):
            speed.marks.append((x, y, f"{s.label} crosses 1.0 at {axis} ≈ {x:.3g}"))
    if not speed.marks and any(s.points for s in speed.series):
        speed.note = "no line crosses 1.0 in this sweep"
    if axis == "concurrency":
        seen: set[tuple[float, str]] = set()
        for label, items in lines.items():
            k = _k_of(items[0])
            spec_key = (items[0].get("servers") or {}).get("spec")
            for limit, what in regime_limits(servers.get(spec_key) if spec_key else None):
                x = limit / (1 + k)  # c × (1 + k) tokens per decode step pass `limit` for every c above x
                if (x, what) not in seen:
                    seen.add((x, what))
                    speed.vmarks.append((x, f"c×(1+k) > {limit}", f"c×(1+k) > {limit} ({what}, k={k})"))
    charts.append(speed)
    flagged: list[tuple[Chart, tuple[str, ...], str]] = [(speed, ("speedup", "output_tok_s", "reference_tok_s"), "")]
    if any(t["summary"].get("acceptance_rate") is not None for it in lines.values() for t in it):
        ratios = []
        for n, (lb, it) in enumerate(lines.items()):
            color = PALETTE[n % len(PALETTE)]
            ratios.append(Series(f"{lb} acceptance", _points(it, axis, lambda s: s.get("acceptance_rate")), color))
            ratios.append(Series(f"{lb} coverage", _points(it, axis, lambda s: s.get("draft_coverage")), color,
                                 dashed=True))
        charts.append(Chart("acceptance rate and draft coverage vs " + axis, xl, "ratio (0-1)", ratios,
                            log_x=log_x, y_min=0.0, y_max=1.0,
                            note="acceptance = accepted ÷ draft tokens (solid); coverage = drafts ÷ decode steps "
                                 "(dashed)"))
        flagged.append((charts[-1], ("acceptance_rate", "draft_coverage"), " acceptance"))
    pos = []
    for lb, it in lines.items():
        for t in it:
            pp = t["summary"].get("per_position_acceptance") or []
            if pp:
                pos.append(Series(f"{lb} {_AXIS_SHORT.get(axis, axis)}={_fmt(float(t['params'][axis]))}",
                                  [(float(i + 1), float(v)) for i, v in enumerate(pp)]))
    if pos:
        charts.append(Chart("per-position acceptance", "draft position", "accepted at position ÷ drafts", pos,
                            y_min=0.0, y_max=1.0))
    lat = []
    for n, (lb, it) in enumerate(lines.items()):
        color = PALETTE[n % len(PALETTE)]
        lat.append(Series(f"{lb} P50", _points(it, axis, lambda s: (s.get("tpot_ms") or {}).get("p50")), color))
        lat.append(Series(f"{lb} P95", _points(it, axis, lambda s: (s.get("tpot_ms") or {}).get("p95")), color, True))
    latency = [Chart("TPOT P50 / P95 vs " + axis + " (spec arm)", xl, "TPOT ms", lat, log_x=log_x)]
    for metric, name in (("ttft_ms", "TTFT"), ("e2e_ms", "E2E")):
        arms = []
        for n, (lb, it) in enumerate(lines.items()):
            color = PALETTE[n % len(PALETTE)]
            arms.append(Series(f"{lb} spec", _points(it, axis, lambda s, m=metric: (s.get(m) or {}).get("p95")),
                               color))
            arms.append(Series(f"{lb} reference", _ref_points(it, axis, _reference(metric, "p95")), color,
                               dotted=True))
        latency.append(Chart(f"{name} P95 vs {axis} (spec solid, reference dotted)", xl, f"{name} P95 ms", arms,
                             log_x=log_x))
    flagged += [(latency[0], ("tpot_p95_ms",), " P95"), (latency[1], ("ttft_p95_ms",), " spec"),
                (latency[2], ("e2e_p95_ratio", "e2e_p95_ms"), " spec")]
    for chart, metrics, suffix in flagged:
        _flag(chart, lines, axis, metrics, suffix)
    groups = [("throughput and acceptance", charts), ("latency", latency)]
    return [(title, svgs) for title, cs in groups if (svgs := [svg for svg in map(svg_chart, cs) if svg])]


def _flag(chart: Chart, lines: dict[str, list[dict[str, Any]]], axis: str, metrics: Sequence[str],
          suffix: str) -> None:
    """Mark the points of tests whose verdict on one of `metrics` (what this chart shows) is regressed or
    improved, on the series `line label + suffix`, with the metrics' Δ in the note."""
    from pytest_specdec.gate.registry import label as metric_label

    by_label = {s.label: s for s in chart.series}
    for label, items in lines.items():
        series = by_label.get(label + suffix)
        if series is None:
            continue
        at = dict(series.points)
        for t in items:
            verdicts = t.get("verdicts") or {}
            x = float(t["params"][axis])
            for verdict in ("regressed", "improved"):
                moved = [m for m in metrics if (verdicts.get(m) or {}).get("verdict") == verdict]
                if moved and x in at:
                    what = ", ".join(f"{metric_label(m)} "
                                     f"{_delta(verdicts[m].get('delta'), verdicts[m].get('delta_unit') or '%')}"
                                     for m in moved)
                    where = f"{label} at {_AXIS_SHORT.get(axis, axis)}={_fmt(x)}"
                    chart.flags.append((x, at[x], verdict, f"{where}: {what}"))


def sweep_charts(sweep: Sweep, servers: dict[str, Any]) -> list[str]:
    """All the charts of one sweep, in the order of `sweep_chart_groups`."""
    return [svg for _, svgs in sweep_chart_groups(sweep, servers) for svg in svgs]


# ---- cost -----------------------------------------------------------------------------------------------


#: Params that set the configuration a throughput peak is looked for over (every param but concurrency).
_GROUP_SHOWN = ("method", "k", "temperature")


def _workload(params: dict[str, Any]) -> str:
    """The params besides method, k, temperature and concurrency, as `name=value` (None left out)."""
    return ", ".join(f"{k}={v}" for k, v in params.items()
                     if k not in (*_GROUP_SHOWN, "concurrency") and v is not None)


def cost_rows(tests: Iterable[dict[str, Any]], price: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Cost per 1M output tokens of each measured test (spec and reference arm) at the server's hourly
    price; `spec_peak` / `ref_peak` mark the rows where that arm's throughput peaks in its group (method ×
    k × temperature × the rest of the workload, over concurrency: see `cost_peaks`). Empty without a price."""
    if not price or not _num(price.get("usd_per_hour")):
        return []
    usd = float(price["usd_per_hour"])

    def per_m(tps: Any) -> float | None:
        t = _num(tps)
        return usd / (t * 3600) * 1e6 if t else None

    rows = []
    for t in tests:
        s = t.get("summary")
        if not s:
            continue
        params = t.get("params") or {}
        rows.append({"nodeid": t["nodeid"], "method": params.get("method"), "k": params.get("k"),
                     "concurrency": params.get("concurrency"), "temperature": params.get("temperature"),
                     "workload": _workload(params),
                     "tps": _num(s.get("output_tps")), "ref_tps": _num(s.get("reference_output_tps")),
                     "cost": per_m(s.get("output_tps")), "ref_cost": per_m(s.get("reference_output_tps")),
                     "spec_peak": False, "ref_peak": False})
    for group in cost_peaks(rows):
        if group["spec"]:
            group["spec"]["spec_peak"] = True
        if group["ref"]:
            group["ref"]["ref_peak"] = True
    return sorted(rows, key=lambda r: (str(r["method"]), r["k"] or 0, r["temperature"] or 0, r["workload"],
                                       r["concurrency"] or 0))


def cost_peaks(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per method × (k, temperature) and workload: the spec arm's peak-throughput row and the reference
    arm's (each at its own concurrency), so the cost per 1M tokens of the two arms compares at their best;
    `ratio` is spec cost ÷ reference cost (< 1: speculation is cheaper at peak)."""
    groups: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        key = (str(r["method"]), repr(r["k"]), repr(r["temperature"]), r["workload"])
        groups.setdefault(key, []).append(r)
    out = []
    for items in groups.values():
        spec = max((r for r in items if r["tps"]), key=lambda r: r["tps"], default=None)
        ref = max((r for r in items if r["ref_tps"]), key=lambda r: r["ref_tps"], default=None)
        first = items[0]
        ratio = spec["cost"] / ref["ref_cost"] if spec and ref and spec["cost"] and ref["ref_cost"] else None
        out.append({"method": first["method"], "k": first["k"], "temperature": first["temperature"],
                    "workload": first["workload"], "tests": len(items), "spec": spec, "ref": ref, "ratio": ratio})
    return sorted(out, key=lambda g: (str(g["method"]), g["k"] or 0, g["temperature"] or 0, g["workload"]))


# ---- per-test details -----------------------------------------------------------------------------------


def _value(metric: str, x: Any) -> str:
    from pytest_specdec.gate.verdicts import format_value

    return format_value(metric, _num(x), times="×")


def _delta(x: Any, unit: str) -> str:
    from pytest_specdec.gate.verdicts import format_delta

    return format_delta(_num(x), unit)


#: "90% CI" in a verdict's note: `stats.compare` writes the level it used (1 - 2·alpha/max_looks).
_CI_IN_NOTE = re.compile(r"(\d+(?:\.\d+)?)% CI\b")


def ci_level(test: dict[str, Any]) -> float | None:
    """The confidence level (percent) of the test's CIs of Δ: two-sided 1 - 2·alpha/max_looks (the one-sided
    alpha split over the planned looks). From a recorded `ci_level` (verdict or baseline; a fraction or a
    percent), else the baseline's `alpha` and `max_looks`, else the level `stats.compare` wrote in the
    verdict notes; None when nothing says (exact-rule rows give a range, not a CI)."""
    baseline = test.get("baseline") or {}
    verdicts = [v for v in (test.get("verdicts") or {}).values() if isinstance(v, dict)]
    for source in (baseline, *verdicts):
        level = _num(source.get("ci_level"))
        if level is not None and 0 < level < 100:
            return level * 100 if level < 1 else level
    alpha = _num(baseline.get("alpha"))
    if alpha is not None and 0 < alpha < 0.5:
        looks = baseline.get("max_looks")
        return 100 * (1 - 2 * alpha / (looks if isinstance(looks, int) and looks >= 1 else 1))
    for v in verdicts:
        m = _CI_IN_NOTE.search(str(v.get("note") or ""))
        if m:
            return float(m.group(1))
    return None


def ci_header(level: float | None) -> str:
    return f"{level:.4g}% CI of Δ" if level is not None else "CI of Δ"


def catches(v: dict[str, Any]) -> str:
    """What a verdict's comparison can catch, from its JSON (`mde`, `threshold`, `method`): the twin of
    `verdicts.guard_text`, which needs a `stats.Verdict`. "—" when the file predates `mde`."""
    if str(v.get("method", "")).startswith("exact"):
        return "exact: repeats run to run"
    if v.get("verdict") == "not-comparable" or "mde" not in v:
        return "—"
    from pytest_specdec.gate.verdicts import catch_text

    mde = _num(v.get("mde"))  # null beside an se: no bound at all (see verdicts.to_json)
    return catch_text(str(v.get("method", "")), mde, _num(v.get("threshold")), v.get("delta_unit") or "%",
                      modelled=mde is not None or v.get("se") is not None, ge="≥")


def _catches_title(v: dict[str, Any]) -> str:
    """The standard error and degrees of freedom behind `catches` (the cell's tooltip)."""
    se, df = _num(v.get("se")), _num(v.get("df"))
    parts = [f"se {se:.3g} (comparison scale)" if se is not None else "", f"df {df:.3g}" if df is not None else ""]
    return ", ".join(p for p in parts if p) or "smallest bad-side change caught with power 0.9"


def verdict_rows(test: dict[str, Any]) -> list[dict[str, str]]:
    """One row per verdict, the gated family first (what fails the test), each family in metric order."""
    from pytest_specdec.gate.registry import label
    from pytest_specdec.gate.verdicts import metric_order

    rows = []
    verdicts = _verdicts(test)
    for name in sorted(verdicts, key=lambda n: (family(verdicts[n]) != "gated", metric_order(n))):
        v = verdicts[name]
        unit = v.get("delta_unit") or "%"
        ci = v.get("ci") or [None, None]
        p = v.get("p")
        exact = str(v.get("method", "")).startswith("exact")
        rows.append({
            "key": name, "metric": label(name), "baseline": _value(name, v.get("baseline")),
            "now": _value(name, v.get("now")), "delta": _delta(v.get("delta"), unit),
            # The exact rule's interval is the range of the run differences, not a CI at the header's level.
            "ci": "—" if ci[0] is None else f"{_delta(ci[0], unit)} .. {_delta(ci[1], unit)}"
                                            + (" (range)" if exact else ""),
            "p": "exact" if exact else ("—" if _num(p) is None else f"{p:.2g}"),
            "n": f"{v.get('n_baseline', '—')} / {v.get('n_now', '—')}",
            "threshold": "—" if _num(v.get("threshold")) is None else f"{v['threshold']:g} {'%' if unit == '%' else 'pt'}",
            "verdict": str(v.get("verdict")), "note": str(v.get("note") or ""),
            "family": family(v), "catches": catches(v), "catches_title": _catches_title(v),
        })
    return rows


def _change_rank(row: dict[str, str]) -> int:
    """Order of the regressions table: gated regressions, gated improvements, then the shown family's."""
    return 2 * (row["family"] != "gated") + (row["verdict"] != "regressed")


def changed_rows(rows: Sequence[dict[str, str]]) -> list[dict[str, str]]:
    """The regressed and improved rows of one test, in the order of `_change_rank`."""
    moved = [r for r in rows if r["verdict"] in ("regressed", "improved")]
    return sorted(moved, key=_change_rank)


def gate_metrics(tests: Iterable[dict[str, Any]]) -> list[str]:
    """Columns of the "what the gate guards" table: the default gated three, plus any metric a test's
    marker or the ini moved into its gate."""
    from pytest_specdec.gate.registry import GATED
    from pytest_specdec.gate.verdicts import metric_order

    extra = {m for t in tests for m in (t.get("baseline") or {}).get("gate") or [] if m not in GATED}
    return [*GATED, *sorted(extra, key=metric_order)]


def gate_cells(test: dict[str, Any], metrics: Sequence[str]) -> list[dict[str, str | None]]:
    """Per gated column, the test's verdict and what it can catch; `family` "shown" where this test does not
    gate that metric, None where it has no verdict on it."""
    verdicts = _verdicts(test)
    gate = (test.get("baseline") or {}).get("gate")
    out: list[dict[str, str | None]] = []
    for m in metrics:
        v = verdicts.get(m)
        if v is None:
            out.append({"metric": m, "verdict": None, "catches": "", "title": "", "family": None})
            continue
        fam = family(v) if "family" in v or not gate else ("gated" if m in gate else "shown")
        out.append({"metric": m, "verdict": str(v.get("verdict")), "catches": catches(v),
                    "title": _catches_title(v), "family": fam})
    return out


def diff_summary(diff: dict[str, Any]) -> list[str]:
    """The under-test change in a few lines: each version, hash or plugin field `old → new`, then the
    engine-config fields that changed, per arm, by name (their values are long; the test's section has them)."""
    lines, engine = [], {}
    for key, ab in diff.items():
        parts = key.split(".")
        if parts[0] == "engine_config" and len(parts) >= 3:
            engine.setdefault(".".join(parts[2:]), []).append(parts[1])
        else:
            old, new = (list(ab) + [None, None])[:2] if isinstance(ab, (list, tuple)) else (None, ab)
            lines.append(f"{key}: {'—' if old is None else old} → {'—' if new is None else new}")
    lines += [f"engine config {field} ({', '.join(arms)})" for field, arms in engine.items()]
    return lines


def workarounds(env: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The vLLM workarounds the session's servers recorded (`vllm_cpu_fix`: name, applied, reason, ...):
    (applied, checked but not applied), each as `name: reason`. An entry without `applied` counts as
    applied (older results); `detail` is read when there is no `reason`."""
    active: list[str] = []
    inactive: list[str] = []
    for w in env.get("workarounds") or []:
        if not isinstance(w, dict):
            active.append(str(w))
            continue
        why = w.get("reason") or w.get("detail")
        version = w.get("vllm_cpu_version")
        shown = f" (vllm-cpu {version})" if version and str(version) not in str(why or "") else ""
        text = f"{w.get('name', '?')}{shown}{f': {why}' if why else ''}"
        (active if w.get("applied", True) is True else inactive).append(text)
    return list(dict.fromkeys(active)), list(dict.fromkeys(inactive))


def command_line(server: dict[str, Any]) -> str:
    env = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in (server.get("env") or {}).items())
    return (env + " " if env else "") + shlex.join(str(c) for c in server.get("command") or [])


def test_view(test: dict[str, Any], servers: dict[str, Any]) -> dict[str, Any]:
    """What the template shows for one test (strings; the template escapes them)."""
    s = test.get("summary") or {}
    params = test.get("params") or {}
    verdicts = test.get("verdicts") or {}
    base, ident = test_name(test["nodeid"])
    baseline = test.get("baseline") or {}
    runs = []
    pairs = test.get("speedup_per_pair") or []
    for i, ref in enumerate(test.get("reference_runs") or []):
        spec = (test.get("runs") or [])[i] if i < len(test.get("runs") or []) else None
        runs.append({"index": i + 1, "ref_tps": _num(ref.get("output_tok_s")), "ref_valid": ref.get("valid", True),
                     "tps": _num(spec.get("output_tok_s")) if spec else None,
                     "valid": spec.get("valid", True) if spec else True,
                     "acceptance": _num(spec.get("acceptance_rate")) if spec else None,
                     "speedup": _num(pairs[i]) if i < len(pairs) else None})
    from pytest_specdec.gate.registry import BADGES, label
    from pytest_specdec.gate.verdicts import metric_order

    rows = verdict_rows(test)
    open_gated = baseline.get("inconclusive_gated")
    if open_gated is None:  # older result files: every verdict counted as gated
        open_gated = [r["key"] for r in rows if r["family"] == "gated" and r["verdict"] == "inconclusive"]
    deviation = _num(baseline.get("machine_deviation"))
    badges = []
    for b in BADGES:
        v = verdicts.get(b.name) or {}
        badges.append((b.label, v.get("verdict"), family(v) if v else b.family))
    return {
        "nodeid": test["nodeid"], "function": base, "id": ident, "status": status(test),
        "outcome": test.get("outcome"), "params": params,
        "speedup": _num(s.get("speedup")), "acceptance": _num(s.get("acceptance_rate")),
        "acceptance_length": _num(s.get("acceptance_length")),
        "tps": _num(s.get("output_tps")), "ref_tps": _num(s.get("reference_output_tps")),
        "tpot_p95": _num((s.get("tpot_ms") or {}).get("p95")), "ttft_p95": _num((s.get("ttft_ms") or {}).get("p95")),
        "badges": badges,
        "verdict_rows": rows, "changed_rows": changed_rows(rows), "ci_header": ci_header(ci_level(test)),
        "shown_regressed": [r["metric"] for r in rows if r["family"] == "shown" and r["verdict"] == "regressed"],
        "inconclusive_gated": [label(m) for m in sorted(open_gated, key=metric_order)],
        "unspent": baseline.get("unspent_runs") if isinstance(baseline.get("unspent_runs"), int) else 0,
        "stop_reason": str(baseline.get("stop_reason") or ""),
        "runs_per_arm": (baseline.get("looks") or [None])[-1],
        # this test's term of the session's machine factor, as a percentage of the baseline's speed
        "machine_deviation": None if deviation is None else 100 * (math.exp(deviation) - 1),
        "baseline": baseline, "attribution": baseline.get("attribution"),
        # versions, hashes and the plugin first, then the engine config fields (long values)
        "under_test_diff": dict(sorted((baseline.get("under_test_diff") or {}).items(),
                                       key=lambda kv: (kv[0].startswith("engine_config."), kv[0]))),
        "diff_summary": diff_summary(baseline.get("under_test_diff") or {}),
        "not_comparable": baseline.get("not_comparable_fields") or {},
        "invalid": (test.get("validity") or {}).get("invalid_runs") or [],
        "untrusted": (test.get("validity") or {}).get("latency_untrusted_runs") or [],
        "runs": runs,
        "servers": [(arm, key, command_line(servers[key]) if key in servers else "(not recorded)",
                     (servers.get(key) or {}).get("startup_s"))
                    for arm, key in (test.get("servers") or {}).items()],
        "error": test.get("error"),
        "logs": test.get("server_logs") or [],
        "per_position": s.get("per_position_acceptance") or [],
        "distribution": test.get("distribution"),
    }


# ---- the page --------------------------------------------------------------------------------------------


def _env() -> Any:
    from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

    env = Environment(loader=PackageLoader("pytest_specdec.output", "templates"),
                      autoescape=select_autoescape(["html", "j2"], default=True), undefined=StrictUndefined,
                      trim_blocks=True, lstrip_blocks=True)

    def num(x: Any, spec: str = ".3g") -> str:
        v = _num(x)
        return "—" if v is None else format(v, spec)

    env.filters["num"] = num
    env.filters["fmtval"] = lambda v: "—" if v is None else str(v)
    return env


def render_html(results: dict[str, Any]) -> str:
    """The self-contained HTML report of one session's results (an empty session renders too)."""
    from markupsafe import Markup

    tests = list(results.get("tests") or [])
    servers = results.get("servers") or {}
    ordered = sort_tests(tests)
    charts = []
    for sw in sweeps(tests):
        fixed = ", ".join(f"{k}={v}" for k, v in sw.fixed.items() if v is not None)
        charts.append({"title": f"{sw.function}: {sw.axis} sweep", "fixed": fixed,
                       "groups": [(title, [Markup(svg) for svg in svgs])  # built escaped
                                  for title, svgs in sweep_chart_groups(sw, servers)]})
    env = results.get("environment") or {}
    started = str(results.get("started", ""))
    active, inactive = workarounds(env)
    cost = cost_rows(tests, results.get("price"))
    views = [test_view(t, servers) for t in ordered]
    columns = gate_metrics(ordered)
    for i, (v, t) in enumerate(zip(views, ordered)):
        v["anchor"] = f"t{i + 1}"
        v["gate_cells"] = gate_cells(t, columns)
    from pytest_specdec.gate.registry import BADGES, label

    machine = results.get("machine_factor") if isinstance(results.get("machine_factor"), dict) else None
    changed = [v for v in views if v["changed_rows"]]
    changed.sort(key=lambda v: min(_change_rank(r) for r in v["changed_rows"]))  # stable: worst tests first
    return _env().get_template("report.html.j2").render(
        results=results, env=env, started=started.replace("T", " ")[:19] + (" UTC" if started else ""),
        duration=_num(results.get("duration_s")), totals=totals(tests),
        tests=views, charts=charts,
        badge_labels=[(b.label, b.family) for b in BADGES],
        machine=machine, machine_line=str((machine or {}).get("line") or "").removeprefix("specdec: "),
        gate=results.get("gate") if isinstance(results.get("gate"), dict) else {},
        guard_columns=[label(m) for m in columns], guarded=[v for v in views if v["verdict_rows"]],
        changed=changed,
        cost=cost, peaks=cost_peaks(cost), price=results.get("price"),
        workarounds_active=active, workarounds_inactive=inactive,
        commit=env.get("commit") or {}, status_order=STATUS_ORDER,
    )


# ---- pytest-benchmark export -----------------------------------------------------------------------------

#: (name suffix, group, run field → seconds): lower is better, as pytest-benchmark assumes.
BENCH_METRICS = (
    ("s_per_output_token", "seconds per output token", lambda r: 1.0 / r["output_tok_s"] if _num(r.get("output_tok_s")) else None),
    ("tpot_p50", "TPOT P50 (s)", lambda r: (r.get("tpot_ms") or {}).get("p50") and r["tpot_ms"]["p50"] / 1000),
    ("e2e_p50", "E2E P50 (s)", lambda r: (r.get("e2e_ms") or {}).get("p50") and r["e2e_ms"]["p50"] / 1000),
)


def benchmark_json(results: dict[str, Any], *, machine_info: dict[str, Any] | None = None,
                   commit_info: dict[str, Any] | None = None) -> dict[str, Any]:
    """The session's valid runs as a pytest-benchmark JSON file: one benchmark per test, arm and metric,
    its per-run values as `stats.data`. Statistics, machine and commit info come from pytest-benchmark's
    own code; vLLM's version and the draft/head revisions go in `extra_info` (commit_info is the suite's)."""
    from pytest_benchmark import __version__ as bench_version
    from pytest_benchmark.plugin import pytest_benchmark_generate_machine_info
    from pytest_benchmark.stats import Stats
    from pytest_benchmark.utils import get_commit_info

    env = results.get("environment") or {}
    benchmarks = []
    for test in results.get("tests") or []:
        base, ident = test_name(test["nodeid"])
        params = test.get("params") or {}
        under = (test.get("baseline") or {}).get("under_test") or {}
        heads = {arm: (results.get("servers") or {}).get(key, {}).get("engine_config", {}).get("speculative_config")
                 for arm, key in (test.get("servers") or {}).items() if arm == "spec"}
        extra = {"vllm_version": env.get("vllm_version"), "vllm_distribution": env.get("vllm_distribution"),
                 "draft": under.get("draft"), "speculative_config": heads.get("spec"),
                 "hardware": env.get("hardware"), "profile": results.get("profile"),
                 "summary": {k: test.get("summary", {}).get(k) for k in ("speedup", "acceptance_rate")}}
        for arm, runs in (("spec", test.get("runs") or []), ("reference", test.get("reference_runs") or [])):
            valid = [r for r in runs if r.get("valid", True)]
            for suffix, group, get in BENCH_METRICS:
                values = [float(v) for v in (get(r) for r in valid) if _num(v) is not None]
                if not values:
                    continue
                stats = Stats()
                for v in values:
                    stats.update(v)
                name = f"{base.rsplit('::', 1)[-1]}[{ident}]::{arm}::{suffix}"
                benchmarks.append({
                    "group": group, "name": name, "fullname": f"{test['nodeid']}::{arm}::{suffix}",
                    "params": {**{k: v for k, v in params.items() if not isinstance(v, dict)}, "arm": arm},
                    "param": f"{ident}-{arm}", "extra_info": {**extra, "arm": arm},
                    "options": {"disable_gc": False, "timer": "wall clock of a vLLM run", "min_rounds": len(values),
                                "max_time": None, "min_time": None, "warmup": True},
                    "stats": {**stats.as_dict(), "data": values, "iterations": 1},
                })
    return {
        "machine_info": machine_info if machine_info is not None else {
            **pytest_benchmark_generate_machine_info(), "specdec_hardware": env.get("hardware")},
        "commit_info": commit_info if commit_info is not None else (env.get("commit") or get_commit_info()),
        "benchmarks": benchmarks, "datetime": results.get("started"), "version": bench_version,
    }
