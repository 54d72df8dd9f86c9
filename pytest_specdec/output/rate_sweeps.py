"""The report's rate sweep charts: per rate sweep, its speedup against load with the stop-paying rate marked, and
a throughput–latency curve per arm (achieved req/s against E2E P50 and P95), drawn with `charts`.

Reads the results' crossover entries of rate sweeps (`output.results.crossover_entry`: the points' latency speedups,
the stop-paying rate) and their tests' runs; a concurrency sweep's charts stay `sweeps`'.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from statistics import median
from typing import TYPE_CHECKING, Any

from pytest_specdec.output.charts import PALETTE, Chart, Series, svg_chart
from pytest_specdec.output.fields import number

if TYPE_CHECKING:
    from pytest_specdec.output.schema import CrossoverEntry, TestEntry

X_LABEL = "offered rate (fraction of the reference's saturation)"


def speedup_chart(entry: CrossoverEntry) -> Chart:
    """The sweep's speedup against load: each point's geometric mean of its pairs' latency speedups (the
    reference's E2E P50 over the spec's), the 1.0 line, and the stop-paying rate where the gate found it; on a log
    axis, as the gate interpolates, so the mark sits on the line."""
    pts = []
    for p in entry.points:
        values = [v for v in p.speedups if v > 0]
        if p.at is not None and values:
            pts.append((p.at, math.exp(sum(map(math.log, values)) / len(values))))
    chart = Chart("speedup vs load (reference ÷ spec E2E P50, per pair)", X_LABEL, "speedup (×)",
                  [Series(entry.line, sorted(pts))], log_x=True, hlines=[(1.0, "1.0 = no gain")])
    stop = entry.crossover or {}
    if stop.get("side") == "crossed" and number(stop.get("value")) is not None:
        chart.marks.append((float(stop["value"]), 1.0, f"stops paying: {entry.crossover_text or ''}"))
    else:
        chart.note = entry.crossover_text or "too few valid pairs for a stop-paying rate"
    return chart


def _arm_point(runs: Sequence[Mapping[str, Any]], pct: str) -> tuple[float, float] | None:
    """An arm's (achieved req/s, E2E ``pct`` ms): the medians over its valid runs."""
    xs = [x for r in runs if r.get("valid") and (x := number(r.get("request_s"))) is not None]
    ys = [y for r in runs if r.get("valid") and (y := number((r.get("e2e_ms") or {}).get(pct))) is not None]
    return (median(xs), median(ys)) if xs and ys else None


def latency_charts(tests: Sequence[TestEntry]) -> list[Chart]:
    """Throughput against latency per arm, one chart per percentile: the spec arm solid, the reference dotted,
    a point per test of the sweep in the order of its rate."""
    charts = []
    for pct in ("p50", "p95"):
        series = []
        for n, (arm, dotted) in enumerate((("spec", False), ("reference", True))):
            pts = [pt for t in tests if (pt := _arm_point(t.runs if arm == "spec" else t.reference_runs, pct))]
            series.append(Series(arm, pts, PALETTE[n], dotted=dotted))
        charts.append(Chart(f"achieved req/s vs E2E {pct.upper()}",
                            "achieved req/s", f"E2E {pct.upper()} ms", series))
    return charts


def rate_sections(tests: Iterable[TestEntry], crossovers: Iterable[CrossoverEntry], errors: list[dict[str, str]]
                  ) -> list[dict[str, Any]]:
    """The report's rate sweep sections, shaped as `sweeps.chart_sections`' (title, fixed, chart groups); a
    sweep whose charts cannot be drawn is an error naming it, not a report lost."""
    from markupsafe import Markup

    by_id = {t.nodeid: t for t in tests}
    out = []
    for e in crossovers:
        if e.axis != "rate_fraction":
            continue
        title = f"{e.sweep}: rate sweep"
        sat = e.saturation_req_s
        fixed = f"{e.line}; saturation {sat:.3g} req/s" if sat is not None else e.line
        try:
            members = [by_id[n] for n in e.tests if n in by_id]
            groups = [("speedup against load", [svg_chart(speedup_chart(e))]),
                      ("throughput and latency", [svg_chart(c) for c in latency_charts(members)])]
        except Exception as exc:  # noqa: BLE001 - one sweep's charts, not the report
            errors.append({"what": f"the charts of {title}", "error": f"{type(exc).__name__}: {exc}"})
            continue
        out.append({"title": title, "fixed": fixed,
                    "groups": [(g, [Markup(s) for s in svgs if s]) for g, svgs in groups]})
    return out
