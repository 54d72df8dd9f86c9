"""Change points in one metric's series across nights (pure functions over per-night values).

A night contributes one level per metric: the mean of its valid runs on the comparison scale (log for rates
and latencies, raw for acceptance; :mod:`.scale`), shown as a geometric mean or a mean. PELT (`ruptures`,
L2 cost) proposes splits where a shift of level pays more than a penalty set from the series' own noise,
estimated robustly from successive differences (their MAD: a step is one outlying difference and moves it
little). With 6 to 10 nights that estimate rests on a handful of differences and is often too small, so each
proposed split must also pass a test: the pooled t-test between the nights on its two sides (to the
neighbouring splits), Bonferroni over the positions a split could take there. A flat series then stays
quiet at any noise level; a step that stands out of the noise is found. `docs/validation.md` has the
false-alarm rate and the power, simulated.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from pytest_specdec.errors import ConfigError
from pytest_specdec.gate.registry import Kind
from pytest_specdec.gate.scale import delta_unit, kind_of, to_natural

#: PELT's penalty per change point, in units of the noise variance (sd²) estimated from the series itself
#: (BIC-like; the t-test below, not this, holds the false alarms down: scripts/trend_simulation.py).
PENALTY = 6.0
#: Level of the t-test that confirms each proposed split (two-sided, Bonferroni over its positions).
ALPHA = 0.05
#: Nights a level must last on each side of a change point: one odd night is an outlier, not a new level.
MIN_NIGHTS = 2
#: The smallest noise sd on the comparison scale (0.1 % or 0.1 points): a series that repeats exactly
#: (acceptance at temperature 0) would otherwise make every difference a change.
NOISE_FLOOR = 0.001

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class ChangePoint:
    """A shift of level: ``index`` is the first night (0-based, in the series given) of the new level."""

    index: int
    before: float  # the level before, in the metric's own unit (geometric mean, or mean for acceptance)
    after: float
    change: float  # in % (log kinds) or points
    unit: str  # "%" or "pt"
    p: float  # `split_p`: Bonferroni over the split's positions, before any adjustment over many series


@dataclass(frozen=True)
class Trend:
    """One metric's series: its per-night levels, the noise the penalty came from, and the change points."""

    metric: str
    levels: tuple[float, ...]  # per night, in the metric's own unit
    noise_sd: float | None  # on the comparison scale (log ratio or fraction); None: too short to judge
    penalty: float | None
    change_points: tuple[ChangePoint, ...]
    note: str = ""


def _scaled(metric: str, kind: Kind, x: float) -> float:
    if not math.isfinite(x) or (kind != "acceptance" and x <= 0):
        raise ConfigError(f"metric {metric!r}: a night's level is {x!r}; a {kind} level must be a finite number"
                          + (" > 0" if kind != "acceptance" else ""))
    return math.log(x) if kind != "acceptance" else x


def noise_sd(values: Sequence[float]) -> float:
    """The sd of the nights' noise from successive differences: 1.4826 · MAD(d) / √2 (a difference of two
    independent nights has √2 times their sd; the MAD is about its median, so a slow drift does not count
    as noise and one step is one outlier among the differences)."""
    import numpy as np

    d = np.diff(np.asarray(values, dtype=float))
    if d.size == 0:
        return 0.0
    return float(1.4826 * np.median(np.abs(d - np.median(d))) / math.sqrt(2.0))


def split_p(left: Sequence[float], right: Sequence[float], positions: int, floor: float = NOISE_FLOOR) -> float:
    """Bonferroni-adjusted two-sided p of a split: the pooled t-test between the nights on its two sides
    (comparison scale), times the ``positions`` the split could have taken. The pooled variance is at least
    ``floor``², so two exactly repeating levels that differ are a change and two equal ones are not."""
    import numpy as np
    from scipy import stats as sps

    a, b = np.asarray(left, dtype=float), np.asarray(right, dtype=float)
    df = a.size + b.size - 2
    ss = float(((a - a.mean()) ** 2).sum() + ((b - b.mean()) ** 2).sum())
    var = max(ss / df if df > 0 else 0.0, floor * floor)
    t = float(b.mean() - a.mean()) / math.sqrt(var * (1.0 / a.size + 1.0 / b.size))
    return min(1.0, positions * 2.0 * float(sps.t.sf(abs(t), max(df, 1))))


def trend(metric: str, levels: Sequence[float], *, penalty: float = PENALTY, alpha: float = ALPHA,
          min_nights: int = MIN_NIGHTS, floor: float = NOISE_FLOOR) -> Trend:
    """Change points of one metric's per-night levels (in the metric's unit, oldest first).

    PELT proposes the splits; each must then pass `split_p` < ``alpha`` against its neighbours, the
    weakest failing one dropped first until every split left passes. Fewer than 2 · ``min_nights`` nights
    cannot hold a change point with a level on each side; the Trend says so in its note rather than
    claiming the series is flat."""
    kind = kind_of(metric)
    levels = [float(x) for x in levels]
    xs = [_scaled(metric, kind, x) for x in levels]
    if len(xs) < 2 * min_nights:
        return Trend(metric, tuple(levels), None, None, (),
                     note=f"{len(xs)} night(s): a change point needs {min_nights} on each side")
    import numpy as np

    from pytest_specdec.errors import import_extra

    ruptures = import_extra("ruptures", "change points across nights (`pytest-specdec history`)")

    sd = max(noise_sd(xs), floor)
    pen = penalty * sd * sd
    signal = np.asarray(xs, dtype=float).reshape(-1, 1)
    cuts = [c for c in ruptures.Pelt(model="l2", min_size=min_nights, jump=1).fit(signal).predict(pen=pen)
            if c < len(xs)]
    ps: list[float] = []
    while cuts:
        bounds = [0, *cuts, len(xs)]
        ps = [split_p(xs[a:c], xs[c:b], (b - a) - 2 * min_nights + 1, floor)
              for a, c, b in zip(bounds, bounds[1:], bounds[2:], strict=False)]  # each cut with its neighbours
        worst = max(range(len(cuts)), key=lambda i: ps[i])
        if ps[worst] < alpha:
            break
        del cuts[worst]
    bounds = [0, *cuts, len(xs)]

    def center(m: float) -> float:
        return math.exp(m) if kind != "acceptance" else m

    points = []
    # `ps` are the kept splits' p-values: the loop ended on them (or no split is left, and `ps` is the last one's)
    for (a, c, b), p in zip(zip(bounds, bounds[1:], bounds[2:], strict=False), ps if cuts else [], strict=True):
        before, after = float(np.mean(xs[a:c])), float(np.mean(xs[c:b]))
        points.append(ChangePoint(index=c, before=center(before), after=center(after),
                                  change=float(to_natural(kind, after - before)),
                                  unit="%" if delta_unit(kind) == "%" else "pt", p=p))
    return Trend(metric, tuple(levels), sd, pen, tuple(points))


def trends(series: Mapping[K, tuple[str, Sequence[float]]], alpha: float = ALPHA) -> dict[K, Trend]:
    """Change points of many series at once (every test and metric of a history), with the false-discovery
    rate over all of them held at ``alpha`` (Benjamini-Hochberg, as the gate adjusts a session's verdicts):
    each series first at ``alpha``, then, when BH keeps only R of the K splits found among m series, all again
    at alpha·R/m, the level of BH's last rejection. A suite of 60 flat series then flags none in about
    1 - alpha of the histories instead of three of them in each."""
    out = {key: trend(metric, levels, alpha=alpha) for key, (metric, levels) in series.items()}
    ps = sorted(c.p for t in out.values() for c in t.change_points)
    m = max(len(ps), sum(1 for t in out.values() if t.noise_sd is not None))
    kept = max((i for i, p in enumerate(ps, start=1) if p <= alpha * i / m), default=0)
    if kept == len(ps):
        return out
    level = alpha * kept / m
    return {key: (trend(metric, levels, alpha=level) if out[key].change_points and level > 0
                  else dataclasses.replace(out[key], change_points=()))
            for key, (metric, levels) in series.items()}
