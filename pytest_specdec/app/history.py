"""The history use case: results across nights, per test and gated metric the series of nightly levels, with
change points (`gate.trend`); `output/history.py` renders them as a table, JSON and a self-contained HTML page.

One results file is one night, ordered by the session's recorded start (`started`), never by file name or
date on disk. Two files of the same session (`reports/latest.json` beside its timestamped copy) are one
night, the duplicate listed. A night's level of a metric is the mean of its valid runs on the comparison
scale (geometric mean for rates and latencies, mean for acceptance), from the same per-run values the
verdicts read (`gate.nights.Night.metric_values` of the test's `TestEntry.night`). A night without the test,
or without valid runs for it, is a gap that says why.

Each night was measured on one machine (its `environment.hardware`). Levels of two machines are not one series
(their speedups differ by the hardware alone, which would read as a change point): when the nights span
several machines, each test has one series per machine, named ``<test id> on <hardware>``, and a night of
another machine is a gap in it.

An A/B session's results are a night too: each test's series is its candidate's, and its base follows as a test
of its own, ``<test id> (A/B base)`` (`app.ab_compare.base_night`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pytest_specdec.output.history import AB_BASE, NightFile, NightSeries, Point
from pytest_specdec.output.schema import TestEntry

if TYPE_CHECKING:
    from pytest_specdec.gate.nights import Night as RunNight


def order(nights: Sequence[NightFile]) -> tuple[list[NightFile], list[tuple[NightFile, NightFile]]]:
    """Nights by recorded session start; (duplicate, kept) for files of a session already read, and for the shards
    of a merged night read beside it (the merged file is the night: `pytest-specdec merge`)."""
    kept: dict[str, NightFile] = {}
    dupes: list[tuple[NightFile, NightFile]] = []
    # a merged night first, its shards' starts its own; latest.json is the copy: the timestamped file names the night
    for n in sorted(nights, key=lambda n: (not n.results.merged_from, n.path.name == "latest.json")):
        if n.started in kept:
            dupes.append((n, kept[n.started]))
        else:
            for started in (n.started, *n.results.merged_from):
                kept.setdefault(started, n)
    unique = list({id(n): n for n in kept.values()}.values())
    return sorted(unique, key=lambda n: _when(n.started)), dupes


def _when(started: str) -> tuple[float, str]:
    """A sort key for `started` (ISO 8601, with or without its offset); unreadable ones first, by text."""
    import datetime as dt

    try:
        t = dt.datetime.fromisoformat(started.replace("Z", "+00:00"))
    except ValueError:
        return (-math.inf, started)
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return (t.timestamp(), started)


def _level(metric: str, values: Sequence[float]) -> float:
    from pytest_specdec.gate.scale import kind_of

    if kind_of(metric) == "acceptance":
        return sum(values) / len(values)
    from pytest_specdec.measure.figures import mean_log

    return math.exp(mean_log(values))


def series(nights: Sequence[NightFile], alpha: float | None = None, per_series: bool = False) -> list[NightSeries]:
    """Per test (first seen first) and gated metric (the gate's, plus what a test's recorded gate added),
    the levels across ``nights`` (already ordered) and their change points, the false-discovery rate over all
    series held at ``alpha`` (`gate.trend.trends`; `gate.trend.ALPHA` by default), or each series at ``alpha``
    alone (``per_series``)."""
    from pytest_specdec.app.ab_compare import base_night
    from pytest_specdec.gate.registry import GATED
    from pytest_specdec.gate.trend import ALPHA, trend, trends

    several = len({n.hardware for n in nights}) > 1
    tests: dict[tuple[str, str], dict[int, tuple[TestEntry, RunNight]]] = {}
    gates: dict[str, dict[str, None]] = {}
    for k, night in enumerate(nights):
        for i, t in enumerate(night.results.tests):
            # An A/B night's test is its candidate; its base follows as a test of its own (`AB_BASE`).
            base = base_night(t, f"{night.path}: tests[{i}]")
            for nodeid, runs in ((t.nodeid, t.night), *(((t.nodeid + AB_BASE, base),) if base else ())):
                tests.setdefault((nodeid, night.hardware if several else ""), {})[k] = (t, runs)
                gates.setdefault(nodeid, dict.fromkeys(GATED)).update(
                    dict.fromkeys(t.baseline.gate if t.baseline else ()))
    out: list[NightSeries] = []
    for (nodeid, hardware), per_night in tests.items():
        for metric in gates[nodeid]:
            points = []
            for k in range(len(nights)):
                if hardware and nights[k].hardware != hardware:
                    points.append(Point(k, None, gap=f"measured on other hardware ({nights[k].hardware})"))
                    continue
                if k not in per_night:
                    points.append(Point(k, None, gap="not in this night's results"))
                    continue
                test, runs = per_night[k]
                values = runs.metric_values().get(metric)
                if not values:
                    points.append(Point(k, None, gap=f"no valid run with this metric (test {test.outcome})"))
                    continue
                points.append(Point(k, _level(metric, values), runs=len(values)))
            out.append(NightSeries(nodeid, metric, points, None, hardware=hardware))
    out += crossover_series(nights)
    levels = {i: (s.metric, [p.value for p in s.points if p.value is not None])
              for i, s in enumerate(out) if any(p.value is not None for p in s.points)}
    found = ({i: trend(metric, values, alpha=alpha or ALPHA) for i, (metric, values) in levels.items()}
             if per_series else trends(levels, alpha or ALPHA))
    for i, s in enumerate(out):
        s.trend = found.get(i)
        present = [p for p in s.points if p.value is not None]
        if s.trend is not None:
            s.change_nights = [present[c.index].night for c in s.trend.change_points]
    return out


def crossover_series(nights: Sequence[NightFile]) -> list[NightSeries]:
    """Per sweep line (concurrency or rate: a rate sweep's in fractions of saturation), its crossover night by night
    (`gate.crossover.estimate` without a CI); a night
    on which it did not cross in the swept range is a gap that says on which side."""
    from pytest_specdec.app.compare import sweep_point
    from pytest_specdec.gate.crossover import NAME, estimate
    from pytest_specdec.gate.crossover_gate import group

    per: dict[str, dict[int, Point]] = {}
    for k, night in enumerate(nights):
        found, broken = group(sweep_point(t) for t in night.results.tests)
        for sweep in found:
            est = estimate(sweep.grid(), resamples=0, where=f"{night.path}: {sweep.sweep}", axis=sweep.axis)
            runs = sum(n for _, n in est.pairs) if est else 0
            per.setdefault(sweep.sweep, {})[k] = (Point(k, est.value, runs) if est and est.value is not None
                                                  else Point(k, None, gap=est.text() if est else "too few pairs"))
        for x in broken:  # a sweep its results cannot tell apart: a gap that says why
            per.setdefault(x.sweep, {})[k] = Point(k, None, gap=str(x.error))
    return [NightSeries(sweep, NAME, [pts.get(k, Point(k, None, gap="not in this night's results"))
                                 for k in range(len(nights))], None) for sweep, pts in per.items()]
