"""Results across nights rendered: per test and gated metric its nightly levels and change points (built by
`app/history.py`, decided by `gate.trend`) as a table, JSON and a self-contained HTML page with one small chart per
metric, and the speedup explained and each test's drift within the session night by night (table and JSON).

A night is one results file (`NightFile`); a series (`NightSeries`) is one test's metric across the ordered nights, its
levels (`Point`, a gap saying why) and its change points. Nights measured on several machines give one series per
machine, named ``<test id> on <hardware>``; an A/B night's base follows as a test of its own,
``<test id> (A/B base)`` (`AB_BASE`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_specdec.output.schema import Results, drift_verdict_entry

if TYPE_CHECKING:
    from pytest_specdec.gate.drift import DriftVerdict
    from pytest_specdec.gate.trend import Trend

#: How the history names the base of an A/B night's test, after the test's id (the test's own series is the
#: candidate's).
AB_BASE = " (A/B base)"
#: How the nights' table marks an A/B session's night.
AB_NIGHT = "  (A/B: candidates, and their bases as <test>" + AB_BASE + ")"


@dataclass(frozen=True)
class NightFile:
    """One results file read: its path and typed data."""

    path: Path
    results: Results

    @property
    def started(self) -> str:
        return self.results.started

    @property
    def hardware(self) -> str:
        """The machine the night was measured on, as its results recorded it."""
        return str(self.results.environment.get("hardware") or "unknown hardware")

    @property
    def ab(self) -> bool:
        """An A/B session's night: its tests' series are the candidates', and their bases follow (`AB_BASE`)."""
        return any(t.ab is not None for t in self.results.tests)


@dataclass
class Point:
    """One night of one metric: its level (None: a gap, and why), and the runs it came from."""

    night: int  # 0-based, in the ordered nights
    value: float | None
    runs: int = 0
    gap: str = ""


@dataclass
class NightSeries:
    """One test's metric across the nights, and its change points (night indices, 0-based)."""

    nodeid: str
    metric: str
    points: list[Point]
    trend: Trend | None
    change_nights: list[int] = field(default_factory=list)
    hardware: str = ""  # the machine of the series' nights, when the nights span several machines

    @property
    def name(self) -> str:
        """The series' test as the table, the JSON and the page name it: its id, and its machine when the
        nights span several."""
        return f"{self.nodeid} on {self.hardware}" if self.hardware else self.nodeid


def table_lines(nights: Sequence[NightFile], rows: Sequence[NightSeries]) -> list[str]:
    """The nights, then per test and metric its levels night by night and its change points."""
    from pytest_specdec.gate.registry import label
    from pytest_specdec.output.wording import format_delta, format_value

    out = [f"nights ({len(nights)}, by session start):"]
    out += [f"  {k + 1:>3}  {n.started}  {n.hardware}  {n.path}" + (AB_NIGHT if n.ab else "")
            for k, n in enumerate(nights)]
    out.append("")
    current = None
    for s in rows:
        if s.name != current:
            current = s.name
            out.append(s.name)
        values = "  ".join(format_value(s.metric, p.value) if p.value is not None else "—" for p in s.points)
        out.append(f"  {label(s.metric):<17} {values}")
        tr = s.trend
        if tr is None:
            out.append("    no night has a value")
        elif tr.note:
            out.append(f"    {tr.note}")
        elif not tr.change_points:
            out.append(f"    no change point (noise sd {_noise(s)})")
        for c, night in zip(tr.change_points if tr else (), s.change_nights, strict=True):
            out.append(f"    change point at night {night + 1} ({nights[night].started}): "
                       f"{format_value(s.metric, c.before)} → {format_value(s.metric, c.after)} "
                       f"({format_delta(c.change, c.unit)})")
        gaps = [f"{p.night + 1}: {p.gap}" for p in s.points if p.value is None]
        if gaps and len(gaps) < len(s.points):
            out.append(f"    gaps: {'; '.join(gaps)}")
    return out + explained_lines(nights) + drift_lines(nights)


#: The figures of the speedup explained (`measure.explain.Explained`) that the history follows, with their labels.
EXPLAINED: tuple[tuple[str, str], ...] = (("tau", "τ"), ("tau_iid", "τ i.i.d."), ("predicted_speedup", "predicted x"),
                                          ("speedup", "measured x"), ("efficiency", "efficiency"),
                                          ("draft_overhead", "draft overhead"))


def explained(nights: Sequence[NightFile]) -> dict[str, list[dict[str, Any] | None]]:
    """Per test (first seen first), night by night, its speedup explained (`gate.verdicts.explained`, the one
    definition): None where the night lacks the test or a spec arm that drafted."""
    from pytest_specdec.gate.verdicts import explained as of
    from pytest_specdec.output.schema import explained_entry

    out: dict[str, list[dict[str, Any] | None]] = {}
    for k, night in enumerate(nights):
        for t in night.results.tests:
            e = of([t.night])
            out.setdefault(t.nodeid, [None] * len(nights))[k] = None if e is None else explained_entry(e)
    return {n: v for n, v in out.items() if any(v)}


def explained_lines(nights: Sequence[NightFile]) -> list[str]:
    """The explained figures' table: per test, one line per figure, night by night."""
    per_test = explained(nights)
    if not per_test:
        return []
    out = ["", "speedup explained (τ, step times, efficiency: docs/analysis.md), night by night:"]
    for nodeid, per_night in per_test.items():
        out.append(nodeid)
        for key, name in EXPLAINED:
            cells = ["—" if e is None or e[key] is None else f"{e[key]:.3g}" for e in per_night]
            out.append(f"  {name:<17} {'  '.join(cells)}")
    return out


def drifts(nights: Sequence[NightFile]) -> dict[str, dict[str, list[DriftVerdict | None]]]:
    """Per test (first seen first) and drift metric, night by night, its drift within that night's session as the
    session left it (`schema.drift_of`, the reading `compare` shares; JUnit and the report word the same entry):
    None where the night lacks the test or its drift (no spec arm, a file from before drift)."""
    out: dict[str, dict[str, list[DriftVerdict | None]]] = {}
    for k, night in enumerate(nights):
        for i, t in enumerate(night.results.tests):
            d = t.drift_judged(f"{night.path}: tests[{i}]")
            for v in d.shown if d is not None else ():
                out.setdefault(t.nodeid, {}).setdefault(v.metric, [None] * len(nights))[k] = v
    return out


#: The drift table's heading, in the text history and on the page alike.
DRIFT_HEADING = ("drift within each night's session (early vs late half of one server's runs: docs/gate.md), night "
                 "by night")


def drift_cells(nights: Sequence[NightFile]) -> dict[str, list[tuple[str, list[str]]]]:
    """Per test, each drift metric's label and, night by night, its cell (`output.drift.cell_text`: its verdict and
    change; "—" where the night has none): the one wording of the text table and the page."""
    from pytest_specdec.gate.drift import LABELS
    from pytest_specdec.output.drift import cell_text

    return {nodeid: [(LABELS.get(metric, metric), ["—" if v is None else cell_text(v) for v in per_night])
                     for metric, per_night in metrics.items()] for nodeid, metrics in drifts(nights).items()}


def drift_lines(nights: Sequence[NightFile]) -> list[str]:
    """The drift table: per test, one line per drift metric, night by night its verdict and change."""
    per_test = drift_cells(nights)
    if not per_test:
        return []
    out = ["", f"{DRIFT_HEADING}:"]
    for nodeid, metrics in per_test.items():
        out.append(nodeid)
        out += [f"  {name:<17} {'  '.join(cells)}" for name, cells in metrics]
    return out


def _noise(s: NightSeries) -> str:
    from pytest_specdec.gate.scale import kind_of, to_natural

    sd = s.trend.noise_sd if s.trend else None
    if sd is None:
        return "—"
    kind = kind_of(s.metric)
    return f"{float(to_natural(kind, sd)):.3g} %" if kind != "acceptance" else f"{100 * sd:.3g} pt"


def to_json(nights: Sequence[NightFile], rows: Sequence[NightSeries],
            duplicates: Sequence[tuple[NightFile, NightFile]] = (),
            skipped: Sequence[tuple[Path, str]] = ()) -> dict[str, Any]:
    """The history as data (`--json`): the nights, the duplicates left out, the files of a directory skipped
    as no results files (with why), and per test and metric the levels (null for a gap, with why), the noise
    sd on the comparison scale and the change points, each with its p (the confirming t-test, Bonferroni over
    the split's positions; the adjustment over all series is in which change points are kept); and per test the
    speedup explained night by night (`explained`) and its drift within each night's session (`drifts`, each
    verdict in the results' drift format; null where the night has none)."""
    tests: dict[str, dict[str, Any]] = {}
    for s in rows:
        tr = s.trend
        tests.setdefault(s.name, {})[s.metric] = {
            "levels": [p.value for p in s.points],
            "runs": [p.runs for p in s.points],
            "gaps": {str(p.night + 1): p.gap for p in s.points if p.value is None},
            "noise_sd": tr.noise_sd if tr else None,
            "penalty": tr.penalty if tr else None,
            "note": tr.note if tr else "no night has a value",
            "change_points": [{"night": night + 1, "started": nights[night].started, "before": c.before,
                               "after": c.after, "change": c.change, "unit": c.unit, "p": c.p}
                              for c, night in zip(tr.change_points if tr else (), s.change_nights, strict=True)],
        }
    return {
        "nights": [{"night": k + 1, "started": n.started, "hardware": n.hardware, "file": str(n.path), "ab": n.ab}
                   for k, n in enumerate(nights)],
        "duplicates": [{"file": str(d.path), "same_session_as": str(k.path)} for d, k in duplicates],
        "skipped": [{"file": str(path), "why": why} for path, why in skipped],
        "tests": tests,
        "explained": explained(nights),
        "drift": {nodeid: {metric: [None if v is None else drift_verdict_entry(v) for v in per_night]
                           for metric, per_night in metrics.items()} for nodeid, metrics in drifts(nights).items()},
    }


def chart_svg(s: NightSeries, nights: Sequence[NightFile]) -> str:
    """One metric's small chart: the nightly levels, each level between change points as a dashed line,
    and each change point circled and numbered, its figures listed under the chart."""
    from pytest_specdec.gate.registry import label
    from pytest_specdec.output.charts import Chart, svg_chart
    from pytest_specdec.output.charts import Series as Line
    from pytest_specdec.output.wording import format_delta, format_value

    pts = [(float(p.night + 1), p.value) for p in s.points if p.value is not None]
    if not pts:
        return ""
    lines = [Line("nightly level", pts, color="#1f77b4")]
    marks = []
    present = [p for p in s.points if p.value is not None]
    tr = s.trend
    if tr is not None and tr.change_points:
        # One line through the fitted levels: flat within a level, a ramp where it changes.
        bounds = [0, *(c.index for c in tr.change_points), len(present)]
        levels = [tr.change_points[0].before, *(c.after for c in tr.change_points)]
        fitted = [(float(present[i].night + 1), level)
                  for (a, b), level in zip(itertools.pairwise(bounds), levels, strict=True) for i in (a, b - 1)]
        lines.append(Line("level between change points", fitted, color="#ff7f0e", dashed=True))
        for c, night in zip(tr.change_points, s.change_nights, strict=True):
            value = next(p.value for p in present if p.night == night)
            assert value is not None
            marks.append((float(night + 1), value,
                          f"change point at night {night + 1} ({nights[night].started[:10]}): "
                          f"{format_value(s.metric, c.before)} → {format_value(s.metric, c.after)} "
                          f"({format_delta(c.change, c.unit)})"))
    note = "" if tr is None or tr.change_points else (tr.note or f"no change point (noise sd {_noise(s)})")
    # The axis starts below the lowest level (not at 0), so a change of a few % is visible; the noise sd
    # under a flat chart says how much of the wobble is noise.
    low = min(y for _, y in pts)
    return svg_chart(Chart(title=label(s.metric), x_label="night", y_label=label(s.metric), series=lines,
                           marks=marks, note=note, y_min=0.8 * low if low > 0 else None), width=360, height=220)


def rule(alpha: float | None, per_series: bool, rows: Sequence[NightSeries]) -> str:
    """How the change points were decided, in one line for the table and the page."""
    from pytest_specdec.gate.trend import ALPHA

    a = alpha or ALPHA
    judged = sum(1 for s in rows if s.trend is not None and s.trend.noise_sd is not None)
    how = (f"each series alone at {a:g}" if per_series
           else f"false-discovery rate {a:g} over all {judged} series (Benjamini-Hochberg)")
    return f"change points: PELT (ruptures) confirmed by a t-test, {how}"


def render_html(nights: Sequence[NightFile], rows: Sequence[NightSeries],
                duplicates: Sequence[tuple[NightFile, NightFile]] = (), how: str = "") -> str:
    """The self-contained history page (inline CSS and SVG, autoescaped jinja2 template): the charts, and each test's
    drift within each night's session as the text table words it (`drift_cells`); ``how`` is `rule`."""
    from markupsafe import Markup

    from pytest_specdec.gate.registry import label
    from pytest_specdec.output.report import templates
    from pytest_specdec.output.wording import format_delta

    tests: dict[str, list[dict[str, Any]]] = {}
    changes: dict[str, list[str]] = {}
    for s in rows:
        for c, night in zip(s.trend.change_points if s.trend else (), s.change_nights, strict=True):
            changes.setdefault(s.name, []).append(
                f"{label(s.metric)} at night {night + 1} ({format_delta(c.change, c.unit)})")
        tests.setdefault(s.name, []).append({
            "svg": Markup(chart_svg(s, nights)),  # built escaped
            "changes": len(s.trend.change_points) if s.trend else 0,
            "gaps": [f"night {p.night + 1}: {p.gap}" for p in s.points if p.value is None],
        })
    tests = {n: tests[n] for n in sorted(tests, key=lambda n: n not in changes)}  # changed first, else as run
    return templates().get_template("history.html.j2").render(
        nights=[{"n": k + 1, "started": n.started, "file": str(n.path), "profile": n.results.profile or "—",
                 "hardware": n.hardware,
                 "vllm": n.results.environment.get("vllm_version") or "—",
                 "commit": ((n.results.environment.get("commit") or {}).get("id") or "—")[:10]}
                for k, n in enumerate(nights)],
        duplicates=[(str(d.path), str(k.path)) for d, k in duplicates], tests=tests, changed=changes, how=how,
        drift=drift_cells(nights), drift_heading=DRIFT_HEADING)
