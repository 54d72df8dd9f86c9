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
#: Verdict badges in the summary table: (column, verdict metric).
BADGE_METRICS = (("speedup", "speedup"), ("spec tok/s", "output_tok_s"), ("acceptance", "acceptance_rate"),
                 ("P95 TPOT", "tpot_p95_ms"), ("P95 TTFT", "ttft_p95_ms"))
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


def status(test: dict[str, Any]) -> str:
    """One word per test: what the morning reader must look at first."""
    verdicts = [v.get("verdict") for v in (test.get("verdicts") or {}).values()]
    if "regressed" in verdicts:
        return "regressed"
    if str(test.get("outcome", "")).startswith(("failed", "error")):
        return "failed"
    if test.get("validity") and not test["validity"].get("valid", True):
        return "invalid"
    for word in ("inconclusive", "not-comparable"):
        if word in verdicts:
            return word
    baseline = test.get("baseline") or {}
    if baseline.get("status") in ("missing", "error"):
        return "no baseline"
    if "improved" in verdicts:
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
    """One line of a chart: points sorted by x; `dashed` for a second statistic of the same thing."""

    label: str
    points: list[tuple[float, float]]
    color: str = ""
    dashed: bool = False


@dataclass
class Chart:
    title: str
    x_label: str
    y_label: str
    series: list[Series]
    log_x: bool = False
    hlines: list[tuple[float, str]] = field(default_factory=list)  # (y, label)
    vmarks: list[tuple[float, str]] = field(default_factory=list)  # (x, label): regime changes
    marks: list[tuple[float, float, str]] = field(default_factory=list)  # (x, y, label): crossovers
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


def svg_chart(chart: Chart, width: int = 430, height: int = 250) -> str:
    """A line chart as inline SVG; every text escaped. Empty string when there is nothing to draw.

    Marks that fall outside the swept range are not drawn in the plot but listed under it, like the
    crossovers, so nothing is silently dropped and labels never overlap the lines."""
    pts = [p for s in chart.series for p in s.points]
    if not pts:
        return ""
    left, right, top = 52, 12, 30
    pw, ph = width - left - right, height - top - 44
    legend, rows = _legend(chart, left, width)
    xs = [x for x, _ in pts]
    fx = (lambda v: math.log2(v)) if chart.log_x else (lambda v: v)
    inside = [(x, lb) for x, lb in chart.vmarks if min(xs) <= x <= max(xs)]
    notes = [lb for _, _, lb in chart.marks]
    axis = chart.x_label.split(" ")[0]
    notes += [f"┆ from {axis} {_fmt(x)}: {lb}" if (x, lb) in inside
              else f"{lb}: only from {axis} {_fmt(x)}, beyond the swept range" for x, lb in chart.vmarks]
    notes += [chart.note] if chart.note else []
    # Notes wrap inside the chart (9 px text, ~5 px a character) instead of running past its edge.
    note_lines = [line for i, note in enumerate(notes)
                  for line in textwrap.wrap(("①②③④⑤⑥⑦⑧⑨"[i % 9] + " " if i < len(chart.marks) else "") + note,
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

    def px(v: float) -> float:
        return left + (fx(v) - x0) / (x1 - x0) * pw

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
    for i, (x, label) in enumerate(inside):
        anchor = "end" if px(x) > left + pw * 0.6 else "start"
        dx = -3 if anchor == "end" else 3
        out.append(f'<line x1="{px(x):.1f}" x2="{px(x):.1f}" y1="{top}" y2="{top + ph}" class="regime"/>'
                   f'<text x="{px(x) + dx:.1f}" y="{top + 11 + 11 * i}" class="regt" text-anchor="{anchor}">'
                   f'{escape(label.split(" (")[0])}</text>')
    for n, s in enumerate(chart.series):
        color = s.color or PALETTE[n % len(PALETTE)]
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in s.points)
        dash = ' stroke-dasharray="5 3"' if s.dashed else ""
        out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2.2"{dash}/>')
        out += [f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{color}"><title>{escape(s.label)}: '
                f'{_fmt(x)} → {y:.3g}</title></circle>' for x, y in s.points]
    for i, (x, y, label) in enumerate(chart.marks):
        out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="6" class="cross"><title>{escape(label)}</title>'
                   f'</circle><text x="{px(x):.1f}" y="{py(y) + 18:.1f}" class="crt">{"①②③④⑤⑥⑦⑧⑨"[i % 9]}</text>')
    base = top + ph + 44
    for lx, row, s, color in legend:
        label = escape(s.label if len(s.label) <= 30 else s.label[:29] + "…")
        dash = ' stroke-dasharray="5 3"' if s.dashed else ""
        ly = base + 13 * row
        out.append(f'<line x1="{lx}" x2="{lx + 16}" y1="{ly - 4}" y2="{ly - 4}" stroke="{color}" stroke-width="2.5"'
                   f'{dash}/><text x="{lx + 20}" y="{ly}" class="lg">{label}</text>')
    for i, line in enumerate(note_lines):
        out.append(f'<text x="{left}" y="{base + 13 * rows + 13 * i}" class="note" xml:space="preserve">'
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


def sweep_charts(sweep: Sweep, servers: dict[str, Any]) -> list[str]:
    """The charts of one sweep (SVG strings): speedup with its 1.0 line, crossovers and regime marks,
    acceptance, draft coverage, latency percentiles, per-position acceptance."""
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
                x = limit / (1 + k)
                if (x, what) not in seen:
                    seen.add((x, what))
                    speed.vmarks.append((x, f"c×(1+k) > {limit} ({what}, k={k})"))
    charts.append(speed)
    if any(t["summary"].get("acceptance_rate") is not None for it in lines.values() for t in it):
        charts.append(Chart("acceptance rate vs " + axis, xl, "accepted ÷ draft tokens",
                            [Series(lb, _points(it, axis, lambda s: s.get("acceptance_rate"))) for lb, it in lines.items()],
                            log_x=log_x, y_min=0.0, y_max=1.0))
        charts.append(Chart("draft coverage vs " + axis, xl, "drafts ÷ decode steps",
                            [Series(lb, _points(it, axis, lambda s: s.get("draft_coverage"))) for lb, it in lines.items()],
                            log_x=log_x, y_min=0.0, y_max=1.0))
    lat = []
    for n, (lb, it) in enumerate(lines.items()):
        color = PALETTE[n % len(PALETTE)]
        lat.append(Series(f"{lb} P50", _points(it, axis, lambda s: (s.get("tpot_ms") or {}).get("p50")), color))
        lat.append(Series(f"{lb} P95", _points(it, axis, lambda s: (s.get("tpot_ms") or {}).get("p95")), color, True))
    charts.append(Chart("TPOT percentiles vs " + axis + " (spec arm)", xl, "TPOT ms", lat, log_x=log_x))
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
    return [svg for svg in (svg_chart(c) for c in charts) if svg]


# ---- cost -----------------------------------------------------------------------------------------------


def cost_rows(tests: Iterable[dict[str, Any]], price: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Cost per 1M output tokens of each measured test (spec and reference arm) at the server's hourly
    price, and per method the cheapest point (peak throughput); empty without a price."""
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
        rows.append({"nodeid": t["nodeid"], "method": t["params"].get("method"), "k": t["params"].get("k"),
                     "concurrency": t["params"].get("concurrency"), "temperature": t["params"].get("temperature"),
                     "tps": _num(s.get("output_tps")), "ref_tps": _num(s.get("reference_output_tps")),
                     "cost": per_m(s.get("output_tps")), "ref_cost": per_m(s.get("reference_output_tps")),
                     "peak": False})
    best: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["tps"] and (r["method"] not in best or r["tps"] > best[r["method"]]["tps"]):
            best[r["method"]] = r
    for r in best.values():
        r["peak"] = True
    return sorted(rows, key=lambda r: (str(r["method"]), r["k"] or 0, r["temperature"] or 0, r["concurrency"] or 0))


# ---- per-test details -----------------------------------------------------------------------------------


def _value(metric: str, x: Any) -> str:
    from .verdicts import format_value

    return format_value(metric, _num(x), times="×")


def _delta(x: Any, unit: str) -> str:
    v = _num(x)
    if v is None:
        return "—"
    return f"{v:+.1f} %" if unit == "%" else f"{v:+.2f} pt"


def verdict_rows(test: dict[str, Any]) -> list[dict[str, str]]:
    from .verdicts import LABELS, metric_order

    rows = []
    for name in sorted(test.get("verdicts") or {}, key=metric_order):
        v = test["verdicts"][name]
        unit = v.get("delta_unit") or "%"
        ci = v.get("ci") or [None, None]
        p = v.get("p")
        rows.append({
            "metric": LABELS.get(name, name), "baseline": _value(name, v.get("baseline")),
            "now": _value(name, v.get("now")), "delta": _delta(v.get("delta"), unit),
            "ci": "—" if ci[0] is None else f"{_delta(ci[0], unit)} .. {_delta(ci[1], unit)}",
            "p": "exact" if str(v.get("method", "")).startswith("exact") else ("—" if _num(p) is None else f"{p:.2g}"),
            "n": f"{v.get('n_baseline', '—')} / {v.get('n_now', '—')}",
            "threshold": "—" if _num(v.get("threshold")) is None else f"{v['threshold']:g} {'%' if unit == '%' else 'pt'}",
            "verdict": str(v.get("verdict")), "note": str(v.get("note") or ""),
        })
    return rows


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
    return {
        "nodeid": test["nodeid"], "function": base, "id": ident, "status": status(test),
        "outcome": test.get("outcome"), "params": params,
        "speedup": _num(s.get("speedup")), "acceptance": _num(s.get("acceptance_rate")),
        "acceptance_length": _num(s.get("acceptance_length")),
        "tps": _num(s.get("output_tps")), "ref_tps": _num(s.get("reference_output_tps")),
        "tpot_p95": _num((s.get("tpot_ms") or {}).get("p95")), "ttft_p95": _num((s.get("ttft_ms") or {}).get("p95")),
        "badges": [(label, (verdicts.get(metric) or {}).get("verdict")) for label, metric in BADGE_METRICS],
        "verdict_rows": verdict_rows(test),
        "baseline": baseline, "attribution": baseline.get("attribution"),
        "under_test_diff": baseline.get("under_test_diff") or {},
        "not_comparable": baseline.get("not_comparable_fields") or {},
        "invalid": (test.get("validity") or {}).get("invalid_runs") or [],
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

    env = Environment(loader=PackageLoader("pytest_specdec", "templates"),
                      autoescape=select_autoescape(["html", "j2"], default=True), undefined=StrictUndefined,
                      trim_blocks=True, lstrip_blocks=True)

    def num(x: Any, spec: str = ".3g") -> str:
        v = _num(x)
        return "—" if v is None else format(v, spec)

    env.filters["num"] = num
    env.filters["fmtval"] = lambda v: "—" if v is None else str(v)
    return env


def render_html(results: dict[str, Any]) -> str:
    """The self-contained HTML report of one session's results."""
    from markupsafe import Markup

    tests = list(results.get("tests") or [])
    servers = results.get("servers") or {}
    ordered = sort_tests(tests)
    charts = []
    for sw in sweeps(tests):
        fixed = ", ".join(f"{k}={v}" for k, v in sw.fixed.items() if v is not None)
        charts.append({"title": f"{sw.function}: {sw.axis} sweep", "fixed": fixed,
                       "svgs": [Markup(svg) for svg in sweep_charts(sw, servers)]})  # built escaped
    env = results.get("environment") or {}
    started = str(results.get("started", ""))
    return _env().get_template("report.html.j2").render(
        results=results, env=env, started=started.replace("T", " ")[:19] + (" UTC" if started else ""),
        duration=_num(results.get("duration_s")), totals=totals(tests),
        tests=[test_view(t, servers) for t in ordered], charts=charts,
        cost=cost_rows(tests, results.get("price")), price=results.get("price"),
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
