"""The report's sweep charts: tests of one function that differ in one numeric param, grouped and drawn.

Reads the typed results (`schema.TestEntry`, and the servers by spec key); draws with `charts`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_specdec.gate.kinds import MOVED
from pytest_specdec.output.charts import PALETTE, Chart, Series, crossovers, svg_chart, tick_text
from pytest_specdec.output.fields import number, test_name

if TYPE_CHECKING:
    from pytest_specdec.gate.crossover_gate import CrossoverEnd, SweepOutcome
    from pytest_specdec.output.schema import CrossoverEntry, TestEntry

#: Params a sweep chart can take as its x axis (numeric), with the axis label.
SWEEP_AXES = {"concurrency": "concurrency (requests in flight)", "temperature": "temperature",
              "k": "k (num_speculative_tokens)"}
#: Short names in legend labels (they are cut at 30 characters): "draft_model k=3 T=0.5".
_AXIS_SHORT = {"concurrency": "c", "temperature": "T"}


def _count(x: Any) -> int | None:
    """A whole number from the engine config (None for anything else)."""
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def regime_limits(server: dict[str, Any] | None) -> list[tuple[int, str]]:
    """Token budgets of a spec server beyond which a decode step changes regime: the largest CUDA-graph
    capture size and max_num_batched_tokens, from its recorded engine config's flat keys (the command as
    fallback for the token budget)."""
    if not server:
        return []
    config = server.get("engine_config") or {}
    out: list[tuple[int, str]] = []
    capture = _count(config.get("max_cudagraph_capture_size"))
    sizes = config.get("cudagraph_capture_sizes")
    if capture is None and isinstance(sizes, list):
        capture = max((n for n in map(_count, sizes) if n is not None), default=None)
    if capture is not None:
        out.append((capture, "CUDA-graph capture size"))
    budget = _count(config.get("max_num_batched_tokens"))
    cmd = [str(c) for c in server.get("command") or []]
    if budget is None and "--max-num-batched-tokens" in cmd[:-1]:
        arg = cmd[cmd.index("--max-num-batched-tokens") + 1]
        budget = int(arg) if arg.isdecimal() else None
    if budget is not None:
        out.append((budget, "max_num_batched_tokens"))
    return out


def _k_of(test: TestEntry) -> int:
    params = test.params
    k = params.get("k")
    if k is None and isinstance(params.get("speculative_config"), dict):
        k = params["speculative_config"].get("num_speculative_tokens")
    return int(k) if isinstance(k, int) else 0


@dataclass
class ChartSweep:
    """Tests of one test function that differ only in `axis` (and the method: one line each)."""

    function: str
    axis: str
    fixed: dict[str, Any]
    lines: dict[str, list[TestEntry]]  # line label → tests sorted by the axis value


def _line_label(test: TestEntry, axis: str) -> str:
    p = test.params
    return str(p.get("method")) + ("" if axis == "k" or p.get("method") == "none" or p.get("k") is None
                                   else f" k={p.get('k')}")


def sweeps(tests: Iterable[TestEntry]) -> list[ChartSweep]:
    """Group the measured tests by the params that vary: one sweep per test function, axis and the
    other params held fixed, with a line per method; only where an axis has at least two values."""
    measured = [t for t in tests if t.summary]
    out: list[ChartSweep] = []
    for axis in SWEEP_AXES:
        groups: dict[tuple[str, str], ChartSweep] = {}
        for t in measured:
            params = t.params
            if number(params.get(axis)) is None:
                continue
            fn = test_name(t.nodeid)[0]
            fixed = {k: v for k, v in params.items() if k not in (axis, "method") and not (axis != "k" and k == "k")}
            fixed.update(t.callspec)  # the test's other parametrize values: a sweep each (gate.crossover_gate)
            key = (fn, repr(sorted((k, repr(v)) for k, v in fixed.items())))
            sweep = groups.setdefault(key, ChartSweep(fn, axis, fixed, {}))
            sweep.lines.setdefault(_line_label(t, axis), []).append(t)
        for sweep in groups.values():
            for items in sweep.lines.values():
                items.sort(key=lambda t: t.params[axis])
            if any(len({t.params[axis] for t in items}) >= 2 for items in sweep.lines.values()):
                out.append(sweep)
    return out


def _points(items: list[TestEntry], axis: str, get: Any) -> list[tuple[float, float]]:
    pts = []
    for t in items:
        y = number(get(t.summary))
        if y is not None:
            pts.append((float(t.params[axis]), y))
    return pts


def _reference(metric: str, pct: str) -> Any:
    """A reference-arm latency the way the summary gives the spec arm's: the median over the valid runs
    whose stream was not coalesced of each run's percentile (`summary` has no reference latencies; the
    runs do). A burst against a stream would compare the client's lateness, not the engines."""
    from statistics import median

    def get(test: TestEntry) -> float | None:
        values = [v for r in test.reference_runs if r["valid"] and not r["latency_untrusted"]
                  if (v := number((r.get(metric) or {}).get(pct))) is not None]
        return median(values) if values else None

    return get


def _ref_points(items: list[TestEntry], axis: str, get: Any) -> list[tuple[float, float]]:
    return [(float(t.params[axis]), y) for t in items if (y := number(get(t))) is not None]


def sweep_chart_groups(sweep: ChartSweep, servers: Mapping[str, Any]) -> list[tuple[str, list[str]]]:
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
        for items in lines.values():
            k = _k_of(items[0])
            spec_key = items[0].servers.get("spec")
            for limit, what in regime_limits(servers.get(spec_key) if spec_key else None):
                x = limit / (1 + k)  # c × (1 + k) tokens per decode step pass `limit` for every c above x
                if (x, what) not in seen:
                    seen.add((x, what))
                    speed.vmarks.append((x, f"c×(1+k) > {limit}", f"c×(1+k) > {limit} ({what}, k={k})"))
    charts.append(speed)
    flagged: list[tuple[Chart, tuple[str, ...], str]] = [(speed, ("speedup", "output_tok_s", "reference_tok_s"), "")]
    if any(t.summary.get("acceptance_rate") is not None for it in lines.values() for t in it):
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
            pp = t.summary.get("per_position_acceptance") or []
            if pp:
                pos.append(Series(f"{lb} {_AXIS_SHORT.get(axis, axis)}={tick_text(float(t.params[axis]))}",
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


def chart_sections(tests: Sequence[TestEntry], servers: Mapping[str, Any], errors: list[dict[str, str]]
                   ) -> list[dict[str, Any]]:
    """The report's sweep sections: title, fixed params and chart groups (built escaped); a sweep whose charts
    cannot be drawn is an error naming it in ``errors``, not a report lost."""
    from markupsafe import Markup

    out = []
    for sw in sweeps(tests):
        fixed = ", ".join(f"{k}={v}" for k, v in sw.fixed.items() if v is not None)
        title = f"{sw.function}: {sw.axis} sweep"
        try:
            groups = sweep_chart_groups(sw, servers)
        except Exception as exc:  # noqa: BLE001 - one sweep's charts, not the report
            errors.append({"what": f"the charts of {title} ({fixed})", "error": f"{type(exc).__name__}: {exc}"})
            continue
        out.append({"title": title, "fixed": fixed,
                    "groups": [(t, [Markup(svg) for svg in svgs]) for t, svgs in groups]})
    return out


def _flag(chart: Chart, lines: dict[str, list[TestEntry]], axis: str, metrics: Sequence[str],
          suffix: str) -> None:
    """Mark the points of tests whose verdict on one of `metrics` (what this chart shows) is regressed or
    improved, on the series `line label + suffix`, with the metrics' Δ in the note."""
    from pytest_specdec.gate.registry import label as metric_label
    from pytest_specdec.output.wording import format_delta

    by_label = {s.label: s for s in chart.series}
    for label, items in lines.items():
        series = by_label.get(label + suffix)
        if series is None:
            continue
        at = dict(series.points)
        for t in items:
            x = float(t.params[axis])
            for verdict in MOVED:
                moved = [v for m in metrics if (v := t.verdicts.get(m)) is not None and v.verdict == verdict]
                if moved and x in at:
                    what = ", ".join(f"{metric_label(v.metric)} {format_delta(v.delta, v.unit)}" for v in moved)
                    where = f"{label} at {_AXIS_SHORT.get(axis, axis)}={tick_text(x)}"
                    chart.flags.append((x, at[x], verdict, f"{where}: {what}"))


def sweep_charts(sweep: ChartSweep, servers: dict[str, Any]) -> list[str]:
    """All the charts of one sweep, in the order of `sweep_chart_groups`."""
    return [svg for _, svgs in sweep_chart_groups(sweep, servers) for svg in svgs]


# ---- the crossover concurrency: its outcomes worded (`app.compare` judges a results file's sweeps) ---------


def crossover_line(x: SweepOutcome) -> str:
    """The terminal's line of one sweep: its crossover, then its verdict against the stored night, or its error."""
    from pytest_specdec.gate.crossover import RATE
    from pytest_specdec.gate.kinds import REGRESSED
    from pytest_specdec.output.wording import format_verdict

    head = f"specdec {'stop-paying rate' if x.axis == RATE else 'crossover'} {x.sweep} ({x.line}): "
    if x.error is not None:
        return head + f"ERROR: {x.error} — the session fails"
    head += x.crossover.text() if x.crossover else "too few valid pairs"
    if x.note:
        head += f"; {x.note}"
    v = x.verdict
    if v is not None and x.stored is not None:
        head += f"; {format_verdict(v)} against {x.stored.started} ({x.family})"
        if x.failed and v.verdict == REGRESSED:
            head += " — the session fails (crossover is in the gate)"
    return head


def crossover_lines(end: CrossoverEnd, written: Sequence[tuple[str, str]]) -> list[str]:
    """Every sweep's line, each followed by what became of its record (``written``: `CrossoverGate.write`'s)."""
    done = dict(written)
    out = []
    for x in end.sweeps:
        out.append(crossover_line(x))
        if x.path in done:
            out.append(f"  crossover record {x.path}: {done[x.path]}")
    return out


def crossover_rows(entries: Iterable[CrossoverEntry]) -> list[dict[str, str]]:
    """The report's crossover lines, one per sweep line (strings; the template escapes them); a sweep that could not
    be judged shows its error."""
    from pytest_specdec.gate.kinds import PERCENT
    from pytest_specdec.output.wording import format_delta

    rows = []
    for e in entries:
        v, stored, error = e.verdict, e.stored, e.error
        now = e.crossover_text or "too few valid pairs"
        rows.append({"sweep": e.sweep, "line": e.line,
                     "now": f"error: {error}" if error else now,
                     "stored": f"{stored.get('text')} ({stored.get('started')})" if stored else "no stored night",
                     "change": format_delta(v.delta if v else None, PERCENT),
                     "verdict": "error" if error else (v.verdict if v else ""),
                     "family": e.family,
                     "note": str(error or (v.note if v else "") or e.note or "")})
    return rows
