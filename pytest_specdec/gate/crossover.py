"""The crossover concurrency of a concurrency sweep: where the speedup falls below 1.0, with a CI, and its
verdict against a stored night (pure functions over per-run values).

A sweep is one line of tests that differ only in concurrency; each point holds its paired per-run
speedups. The crossover is interpolated on log concurrency in the points' mean log speedup, between the
last point at or above 1.0 and the first below it ("where the speedup first falls below 1"). Not crossing
is a value too: above 1.0 at every swept concurrency reads ``> c_max``, below 1.0 already at the smallest
``< c_min``. The CI is a percentile bootstrap over each point's pairs (scipy.stats.bootstrap, seeded), with
censored resamples held at the swept range's ends: a crossover that leaves the range is never moved less
than it did.

The verdict compares tonight's crossover with the stored night's on the log scale and states the change
in %: ``regressed`` when it moved down by more than `FACTOR` (-33 %) and the bootstrap's one-sided p is
below alpha, ``unchanged`` when the CI lies inside -33 % .. +50 %, as `stats.decide` rules every metric.
docs/validation.md#the-crossover-concurrency says why a factor of 1.5 and what it catches.

The axis is a parameter: a concurrency sweep's (`CONCURRENCY`) or a rate sweep's (`RATE`: the offered request
rate as a fraction of the reference's saturation, where the speedup is latency-based, `load_speedups`, and the
crossover is the rate where speculation stops paying). One statistic, one bootstrap, one verdict for both.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_specdec.errors import ConfigError
from pytest_specdec.gate.kinds import INCONCLUSIVE, NIGHT, PERCENT, SHOWN, Family

if TYPE_CHECKING:
    import numpy as np

    from pytest_specdec.gate.stats import Verdict
    from pytest_specdec.measure.record import ArmRun

#: The metric's name in verdicts, the gate (``specdec_gate = crossover``) and the JSON.
NAME = "crossover"
#: A move down by more than this factor in concurrency is a regression (and up by as much an improvement).
FACTOR = 1.5
RESAMPLES = 2000
SEED = 0
#: Per point: (concurrency, its valid pairs' speedups).
Points = Sequence[tuple[float, Sequence[float]]]
#: The swept parameters: concurrency, or the request rate as a fraction of the reference's saturation.
CONCURRENCY, RATE = "concurrency", "rate_fraction"
#: Per axis: (its symbol in a crossover's text, its word in messages, its plural).
AXIS_WORDS = {CONCURRENCY: ("c", "concurrency", "concurrencies"), RATE: ("rate", "rate", "rates")}


def axis_words(axis: str) -> tuple[str, str, str]:
    """The axis's (symbol, word, plural); an unknown axis is an error naming the ones there are."""
    if axis not in AXIS_WORDS:
        raise ConfigError(f"crossover axis {axis!r} is unknown; one of {', '.join(AXIS_WORDS)}")
    return AXIS_WORDS[axis]


@dataclass(frozen=True)
class Crossover:
    """One night's crossover. ``side``: "crossed" (``value`` is the concurrency), "above" (speedup above
    1.0 at every swept concurrency: ``> c_max``) or "below" (below 1.0 already at ``c_min``). ``ci`` is the
    bootstrap CI in concurrency, clamped to the swept range; ``level`` its confidence in %. On a rate sweep
    (``axis`` `RATE`) the values are fractions of the reference's saturation, ``saturation`` its req/s."""

    side: str
    value: float | None
    ci: tuple[float, float] | None
    level: float
    c_min: float
    c_max: float
    pairs: tuple[tuple[float, int], ...]  # (concurrency, valid pairs) of the points used
    axis: str = CONCURRENCY
    saturation: float | None = None  # a rate sweep's: the reference's req/s with every prompt in flight

    def text(self) -> str:
        """How the report and the terminal state it: ``c ≈ 14.2 (90% CI 9.8 – 20.1)`` or ``c > 32 (...)``; on a
        rate sweep ``rate ≈ 0.62 × saturation (≈ 3.1 req/s) (90% CI ...)``."""
        sym, word, _ = axis_words(self.axis)
        unit = " × saturation" if self.axis == RATE else ""
        if self.side == "above":
            head = f"{sym} > {self.c_max:g}{unit} (speedup above 1.0 at every swept {word})"
        elif self.side == "below":
            head = f"{sym} < {self.c_min:g}{unit} (speedup below 1.0 already at the smallest {word})"
        else:
            head = f"{sym} ≈ {self.value:.3g}{unit}"
            if self.saturation is not None and self.value is not None:
                head += f" (≈ {self.value * self.saturation:.3g} req/s)"
        if self.ci is None:
            return head
        lo, hi = self.ci
        lo_s = f"≤ {lo:g}" if lo <= self.c_min else f"{lo:.3g}"
        hi_s = f"≥ {hi:g}" if hi >= self.c_max else f"{hi:.3g}"
        return f"{head} ({self.level:.3g}% CI {lo_s} – {hi_s})"


def checked_points(points: Points, where: str, axis: str = CONCURRENCY) -> list[tuple[float, list[float]]]:
    """The points sorted by the axis's value, each with its finite positive speedups; a point with fewer than two
    is left out (a bootstrap needs two), a bad value is an error naming ``where``."""
    word = axis_words(axis)[1]
    out: list[tuple[float, list[float]]] = []
    for c, values in points:
        if not (isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c) and c > 0):
            raise ConfigError(f"{where}: {word} must be a positive number, got {c!r}")
        vals = list(values)
        for v in vals:
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0):
                raise ConfigError(f"{where}: speedup at {word} {c:g} must be a positive number, got {v!r}")
        if len(vals) >= 2:
            out.append((float(c), vals))
    out.sort(key=lambda p: p[0])
    if len({c for c, _ in out}) != len(out):
        raise ConfigError(f"{where}: two points at the same {word}")
    return out


def crossing(y: np.ndarray, logc: np.ndarray) -> np.ndarray:
    """Log concurrency where the mean log speedups ``y`` (last axis: the points) first fall below 0,
    linearly interpolated in log c; censored at the range's ends (``logc[0]`` when already below, ``logc[-1]``
    when never below)."""
    import numpy as np

    below = y < 0
    first = np.argmax(below, axis=-1)
    prev = np.maximum(first - 1, 0)
    ya = np.take_along_axis(y, prev[..., None], -1)[..., 0]
    yb = np.take_along_axis(y, first[..., None], -1)[..., 0]
    with np.errstate(invalid="ignore", divide="ignore"):
        t = np.where(first > 0, ya / (ya - yb), 0.0)
    x = logc[prev] + t * (logc[first] - logc[prev])
    return np.where(below.any(axis=-1), x, logc[-1])  # already below: t = 0 at the first point


def _side(y: np.ndarray) -> str:
    """How the mean log speedups ``y`` (by concurrency) meet 1.0: crossed, above at every point, or below
    already at the first."""
    if not (y < 0).any():
        return "above"
    return "below" if y[0] < 0 else "crossed"


def _bootstrap(samples: list[list[float]], statistic: Any, level: float, seed: int, n: int) -> Any:
    from scipy.stats import bootstrap

    return bootstrap(samples, statistic, n_resamples=n, vectorized=True, paired=False, axis=-1,
                     confidence_level=level, method="percentile", rng=seed)


def estimate(points: Points, *, alpha: float = 0.05, seed: int = SEED, resamples: int = RESAMPLES,
             where: str = "crossover", axis: str = CONCURRENCY) -> Crossover | None:
    """One night's crossover on ``axis`` with its 1 − 2·alpha bootstrap CI (none with ``resamples=0``); None with
    fewer than two usable points."""
    import numpy as np

    pts = checked_points(points, where, axis)
    if len(pts) < 2:
        return None
    logc = np.log([c for c, _ in pts])
    samples = [np.log(v).tolist() for _, v in pts]
    y = np.array([np.mean(s) for s in samples])
    x = float(crossing(y, logc))
    side = _side(y)
    value = float(np.exp(x)) if side == "crossed" else None
    pairs = tuple((c, len(v)) for c, v in pts)
    if not resamples:
        return Crossover(side, value, None, 100.0 * (1.0 - 2.0 * alpha), pts[0][0], pts[-1][0], pairs, axis)

    def stat(*s: np.ndarray, axis: int = -1) -> np.ndarray:
        return crossing(np.stack([a.mean(axis=axis) for a in s], axis=-1), logc)

    level = 1.0 - 2.0 * alpha
    res = _bootstrap(samples, stat, level, seed, resamples)
    ci = (float(np.exp(res.confidence_interval.low)), float(np.exp(res.confidence_interval.high)))
    return Crossover(side, value, ci, 100.0 * level, pts[0][0], pts[-1][0], pairs, axis)


def compare(base: Points, now: Points, *, alpha: float = 0.05, factor: float = FACTOR, seed: int = SEED,
            resamples: int = RESAMPLES, family: Family = SHOWN, axis: str = CONCURRENCY) -> Verdict:
    """Tonight's crossover against the stored night's: Δ in % of the axis's value, the bootstrap's CI and
    one-sided p (the share of resamples on the far side of no change), decided by `stats.decide` with the
    threshold ``1/factor − 1`` (−33.3 % for 1.5) and its mirror. Both sweeps must cover the same
    points of the axis (else `not-comparable`)."""
    import numpy as np

    from pytest_specdec.gate.stats import Verdict, decision, not_comparable

    if not (isinstance(factor, (int, float)) and factor > 1):
        raise ConfigError(f"crossover factor must be a number above 1, got {factor!r}")
    plural = axis_words(axis)[2]
    b, n = checked_points(base, "stored crossover night", axis), checked_points(now, "tonight's crossover", axis)
    bad = 100.0 * (1.0 / factor - 1.0)
    grid_b, grid_n = [c for c, _ in b], [c for c, _ in n]
    if grid_b != grid_n:
        v = not_comparable("speedup", {plural: (grid_b, grid_n)})
        return Verdict(NAME, v.verdict, None, None, None, None, None, None, len(b), len(n), PERCENT, "none", bad,
                       v.note.replace("comparability keys differ", f"the swept {plural} differ"), family=family,
                       per=NIGHT)
    eb, en = estimate(base, alpha=alpha, resamples=0, axis=axis), estimate(now, alpha=alpha, resamples=0, axis=axis)
    if eb is None or en is None:
        return Verdict(NAME, INCONCLUSIVE, None, None, None, None, None, None, len(b), len(n), PERCENT, "none", bad,
                       f"too little data: a crossover needs two {plural} with two valid pairs each, both nights",
                       family=family, per=NIGHT)
    logc = np.log(grid_b)
    k = len(b)
    samples = [np.log(v).tolist() for _, v in b] + [np.log(v).tolist() for _, v in n]

    def stat(*s: np.ndarray, axis: int = -1) -> np.ndarray:
        means = np.stack([a.mean(axis=axis) for a in s], axis=-1)
        return crossing(means[..., k:], logc) - crossing(means[..., :k], logc)

    d = float(stat(*(np.asarray(s) for s in samples)))
    res = _bootstrap(samples, stat, 1.0 - 2.0 * alpha, seed, resamples)
    dist = np.asarray(res.bootstrap_distribution)
    p = float((1 + np.sum(dist >= 0 if d < 0 else dist <= 0)) / (1 + dist.size)) if d else 1.0
    pct = [100.0 * math.expm1(x) for x in (d, res.confidence_interval.low, res.confidence_interval.high)]
    verdict = decision(pct[0], pct[1], pct[2], p, bad, alpha, PERCENT)
    base_c, now_c = math.exp(float(crossing(_means(b), logc))), math.exp(float(crossing(_means(n), logc)))
    note = (f"crossover {eb.text()} → {en.text()}: {pct[0]:+.1f} % ({100 - 200 * alpha:.3g}% CI {pct[1]:+.1f} % "
            f"to {pct[2]:+.1f} %), p={p:.3g}; regressed beyond {bad:+.1f} % (÷{factor:g}), improved beyond "
            f"{100 * (factor - 1):+.1f} % (×{factor:g}); percentile bootstrap over each point's pairs "
            f"({resamples} resamples, seed {seed}), censored at the swept range {grid_b[0]:g} – {grid_b[-1]:g}")
    return Verdict(NAME, verdict, base_c, now_c, pct[0], pct[1], pct[2], p, sum(len(v) for _, v in b),
                   sum(len(v) for _, v in n), PERCENT, "bootstrap-log", bad, note, family=family, per=NIGHT)


def _means(points: Iterable[tuple[float, Sequence[float]]]) -> np.ndarray:
    import numpy as np

    return np.array([np.mean(np.log(v)) for _, v in points])


def points_of(night: Mapping[str, Any], where: str, axis: str = CONCURRENCY) -> list[tuple[float, list[float]]]:
    """A stored night's points (``{"points": [{"concurrency": c, "speedups": [...]}, ...]}``, a rate sweep's
    ``rate_fraction`` in place of concurrency), checked."""
    raw = night.get("points")
    if not isinstance(raw, list) or not all(isinstance(p, Mapping) for p in raw):
        raise ConfigError(f"{where}: 'points' must be a list of {{{axis}, speedups}} objects")
    out = []
    for i, p in enumerate(raw):
        c, s = p.get(axis), p.get("speedups")
        if not isinstance(s, list):
            raise ConfigError(f"{where}: points[{i}].speedups must be a list of numbers")
        out.append((c, s))
    return checked_points(out, where, axis)


def load_speedups(reference: Sequence[ArmRun], spec: Sequence[ArmRun]) -> list[float]:
    """A rate sweep's speedup per kept interleaved pair: the reference run's median E2E latency over the spec
    run's. In an open loop below saturation both arms finish every request at the offered rate, so tok/s is ~1
    whatever the drafts do; what a user of "spec decode at x req/s" gains is time per request, queueing included
    (it rises toward saturation, where the slower arm queues first). Every run stores its E2E P50; E2E is the
    stream's end, so a coalesced stream does not make it untrustworthy."""
    from pytest_specdec.measure.record import pairs

    out = []
    for p in pairs(reference, spec):
        if not p.kept:
            continue
        assert p.first is not None and p.second is not None
        r, s = ((run.latencies_ms.get("e2e_ms") or {}).get("p50") for run in (p.first, p.second))
        if r and s:
            out.append(r / s)
    return out
