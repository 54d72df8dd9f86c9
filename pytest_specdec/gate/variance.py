"""Variance models estimated from a profile's stored baselines, fixed before any test runs (pure functions).

:class:`Prior` moderates one test's variance (empirical Bayes over every stored baseline, as in limma);
:class:`NightVariance` is the night-to-night variance pooled over them. :func:`.stats.compare` takes
either; docs/gate.md says how they enter a verdict.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats as sps

from pytest_specdec.errors import ConfigError
from pytest_specdec.gate.registry import Kind
from pytest_specdec.gate.scale import check_kind, checked_sessions, on_scale


@dataclass(frozen=True)
class Prior:
    """A prior variance on the comparison scale (log for rates/latencies, raw for acceptance) and its df."""

    var: float
    df: float
    n_sources: int = 0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.var) and self.var > 0 and math.isfinite(self.df) and self.df > 0):
            raise ConfigError(f"Prior needs a finite var > 0 and df > 0, got var={self.var!r}, df={self.df!r}")


def _trigamma_inverse(x: float) -> float:
    """y with trigamma(y) = x (Smyth's Newton iteration, limma's ``trigammaInverse``)."""
    from scipy.special import polygamma

    if x > 1e7:
        return 1.0 / math.sqrt(x)
    if x < 1e-6:
        return 1.0 / x
    y = 0.5 + 1.0 / x
    for _ in range(50):
        tri = float(polygamma(1, y))
        dif = tri * (1.0 - tri / x) / float(polygamma(2, y))
        y += dif
        if -dif / y < 1e-8:
            break
    return y


def estimate_prior(variances: Sequence[float], dfs: Sequence[float]) -> Prior | None:
    """The empirical-Bayes prior (s0², d0) from many tests' sample variances, each with its df (Smyth 2004,
    limma's ``fitFDist`` without covariates). None with fewer than 3 usable variances. ``d0`` is capped at
    the total df of the sources (the prior cannot know more than the data it came from)."""
    from scipy.special import digamma, polygamma

    s2 = np.asarray(variances, dtype=float)
    d = np.asarray(dfs, dtype=float)
    ok = np.isfinite(s2) & (s2 > 0) & np.isfinite(d) & (d > 0)
    s2, d = s2[ok], d[ok]
    g = s2.size
    if g < 3:
        return None
    e = np.log(s2) - digamma(d / 2) + np.log(d / 2)
    emean = float(e.mean())
    evar = float(((e - emean) ** 2).sum() / (g - 1) - polygamma(1, d / 2).mean())
    cap = float(d.sum())
    d0 = cap if evar <= 0 else min(cap, 2.0 * _trigamma_inverse(evar))
    s0 = math.exp(emean + float(digamma(d0 / 2)) - math.log(d0 / 2))
    return Prior(var=s0, df=d0, n_sources=g)


def variance_sources(metric: str, baseline: Sequence[Sequence[Any]], *, kind: Kind | None = None
                     ) -> dict[str, tuple[float, int]]:
    """What one stored baseline contributes to the priors of :func:`estimate_prior`, on the comparison scale:
    ``run``: the pooled within-session variance of the runs and its df; ``session``: the variance of the
    session means and its df (only with 2+ sessions)."""
    kind = check_kind(metric, kind)
    xs = [on_scale(kind, s) for s in checked_sessions(metric, baseline, kind)]
    out: dict[str, tuple[float, int]] = {}
    df = sum(len(x) - 1 for x in xs)
    if df > 0:
        out["run"] = (sum(float(((x - x.mean()) ** 2).sum()) for x in xs) / df, df)
    if len(xs) > 1:
        out["session"] = (float(np.var([x.mean() for x in xs], ddof=1)), len(xs) - 1)
    return out


# ---- night-to-night variance pooled over a profile's baselines --------------------------------------


@dataclass(frozen=True)
class NightVariance:
    """Variance components of one metric on the comparison scale, pooled over a profile's baselines.

    ``between`` (σ_N²) is the night-to-night variance of a test's night mean beyond what its runs' noise
    explains; ``within`` (s_W²) the run-to-run (pair-to-pair) variance inside a night. Each stored file
    has only a few nights, so σ_N² is estimated from all of them (method of moments, df = Σ(nights − 1)),
    never from tonight. ``homogeneity_p`` is Bartlett's test that the files share one night variance;
    below ``HOMOGENEITY_P`` a test whose own nights spread wider keeps its own (larger) estimate.
    """

    between: float
    df_between: float
    within: float
    df_within: float
    n_sources: int
    homogeneity_p: float | None = None
    floor: bool = False  # ``between`` is the profile's floor (min_night_sd), not the pooled estimate
    #: The night prior blended in (`NightPrior`): its sd in the metric's unit (% or points), its df, where it
    #: came from. ``df_between`` counts its df beside the stored nights' (``df_between - prior_df``).
    prior_sd: float = 0.0
    prior_df: float = 0.0
    prior_source: str = ""
    prior_unit: str = "%"

    def origin(self) -> str:
        """Where the night-to-night sd comes from, without figures: the stored nights pooled, the night prior
        alone (its source names itself: a profile's, the default's guess, a machine's calibration), both blended,
        or the profile's floor."""
        pooled_df = self.df_between - self.prior_df
        pooled = f"pooled over {self.n_sources} stored baselines ({pooled_df:.0f} df)"
        if not self.prior_df:
            below = pooled
        elif pooled_df < 1:
            below = f"{self.prior_source}, as no stored baseline has 2 nights"
        else:
            below = f"{pooled} blended with {self.prior_source}"
        return f"the profile's floor, min_night_sd, above {below}" if self.floor else below

    def source(self) -> str:
        """`origin` with the prior's own figures, for a verdict's note."""
        if not self.prior_df:
            return self.origin()
        return f"{self.origin()}: prior {self.prior_sd:.3g} {self.prior_unit} at {self.prior_df:g} df"


HOMOGENEITY_P = 0.01


def sd_as_var(sd: float, log: bool) -> float:
    """An sd as a prior, a record or the profile's floor give it (% for log-scale metrics, points for acceptance) as
    a variance on the comparison scale: the one conversion, both ways (`var_as_sd`)."""
    return math.log1p(sd / 100.0) ** 2 if log else (sd / 100.0) ** 2


def var_as_sd(var: float, log: bool) -> float:
    """`sd_as_var`'s inverse (a variance that is a float's rounding of 0 is 0: exact metrics read exact)."""
    sd = math.sqrt(var) if var > 1e-24 else 0.0
    return 100.0 * math.expm1(sd) if log else 100.0 * sd

#: The classes a `NightPrior` gives an sd for: ratios of the two arms of a pair (speedup, E2E ratio, goodput),
#: absolute figures (tok/s, latencies: they follow the machine's speed) and acceptance (in points).
PRIOR_CLASSES = ("ratio", "absolute", "acceptance")


@dataclass(frozen=True)
class NightPrior:
    """How far a test's night mean is assumed to move from night to night before the stored nights can say.

    A first night cannot measure night-to-night variance, and a few nights measure it poorly: comparing runs
    alone then takes a quiet evening's noise for the host's (a new host gave 5 confident `improved` with
    nothing changed). The prior enters as ``df`` pseudo-nights of sd ``sd[class]`` (scaled-chi-square
    pooling, as `estimate_prior`'s), so one stored night is judged with the prior's wide t quantile and
    the stored nights take over as they accumulate. ``source`` names where it came from (a profile's
    ``[verdicts] night_prior``, or a host's calibration record).
    """

    sd: Mapping[str, float]  # a class of PRIOR_CLASSES or a metric name -> sd (% for ratios/absolute, points)
    df: float
    source: str
    #: A metric's own df where it differs from ``df`` (a calibration measures each metric with its own).
    dfs: Mapping[str, float] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> NightPrior:
        """A results file's ``gate.settings.night_prior`` as `output.schema.night_prior_entry` wrote it."""
        try:
            return cls(dict(d["sd"]), float(d["df"]), str(d["source"]), dict(d.get("dfs") or {}))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: night_prior {dict(d)!r} cannot be read ({exc})") from None

    def df_of(self, metric: str) -> float:
        return float(self.dfs.get(metric, self.dfs.get(metric.split("[", 1)[0], self.df)))

    def __post_init__(self) -> None:
        bad = [k for k, v in self.sd.items() if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0)]
        bad += [k for k, v in self.dfs.items() if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0)]
        if bad or not (math.isfinite(self.df) and self.df > 0):
            raise ConfigError(f"{self.source}: a night prior needs sds >= 0 and df > 0, got sd={dict(self.sd)!r}, "
                              f"df={self.df!r}")

    def sd_of(self, metric: str, absolute: bool) -> float:
        """The prior sd of ``metric`` (its own entry, its base name's, else its class's; 0: none)."""
        base = metric.split("[", 1)[0]
        kind = check_kind(metric, None)
        cls = "acceptance" if kind == "acceptance" else "absolute" if absolute else "ratio"
        return float(self.sd.get(metric, self.sd.get(base, self.sd.get(cls, 0.0))))

    def var_of(self, metric: str, absolute: bool) -> float:
        """The prior variance on the comparison scale (log for rates and latencies, raw for acceptance)."""
        return sd_as_var(self.sd_of(metric, absolute), check_kind(metric, None) != "acceptance")


def night_prior_from(table: Mapping[str, float], source: str) -> NightPrior:
    """A profile's or results file's ``night_prior`` table (class sds and ``df``) as a `NightPrior`."""
    if "df" not in table:
        raise ConfigError(f"{source}: night_prior has no df: {dict(table)!r}")
    return NightPrior({k: float(v) for k, v in table.items() if k != "df"}, float(table["df"]), source)


def blend_prior(metric: str, nv: NightVariance | None, prior: NightPrior, absolute: bool) -> NightVariance | None:
    """``nv`` (the stored nights pooled; None: none has 2 nights) with ``prior`` blended in as its df in
    pseudo-nights: ``between = (d0 s0² + d σ̂²) / (d0 + d)``, with ``d0 + d`` df. A class's sd of 0 (a profile's
    acceptance) leaves ``nv``; a metric's own 0 (a calibration measured no night effect) is a measurement, and
    blends like any other."""
    v0, d0 = prior.var_of(metric, absolute), prior.df_of(metric)
    if v0 <= 0 and metric not in prior.sd and metric.split("[", 1)[0] not in prior.sd:
        return nv
    sd, unit = prior.sd_of(metric, absolute), "points" if check_kind(metric, None) == "acceptance" else "%"
    if nv is None:
        return NightVariance(between=v0, df_between=d0, within=0.0, df_within=0.0, n_sources=0, prior_sd=sd,
                             prior_df=d0, prior_source=prior.source, prior_unit=unit)
    d = nv.df_between
    return dataclasses.replace(nv, between=(d0 * v0 + d * nv.between) / (d0 + d), df_between=d + d0, prior_sd=sd,
                               prior_df=d0, prior_source=prior.source, prior_unit=unit)


def night_components(metric: str, baseline: Sequence[Sequence[Any]], *, kind: Kind | None = None
                     ) -> tuple[float, int, float, int, float] | None:
    """One file's (between-night estimate, its df, within ss, within df, mean 1/runs) on the comparison
    scale; the between estimate is ``var(night means) − s_W²·mean(1/n_j)`` (unbiased, may be negative).
    None without 2 nights of 2+ runs... the within part alone is kept when there is one night."""
    kind = check_kind(metric, kind)
    xs = [on_scale(kind, s) for s in checked_sessions(metric, baseline, kind)]
    xs = [x for x in xs if x.size]
    if not xs:
        return None
    ss = sum(float(((x - x.mean()) ** 2).sum()) for x in xs)
    dfw = sum(x.size - 1 for x in xs)
    h = float(np.mean([1.0 / x.size for x in xs]))
    if len(xs) < 2:
        return (0.0, 0, ss, dfw, h)
    s_w2 = ss / dfw if dfw > 0 else 0.0
    between = float(np.var([x.mean() for x in xs], ddof=1)) - s_w2 * h
    return (between, len(xs) - 1, ss, dfw, h)


def estimate_night_variance(metric: str, files: Sequence[Sequence[Sequence[Any]]], *,
                            kind: Kind | None = None) -> NightVariance | None:
    """Pool :func:`night_components` over every stored file of a profile (each a list of nights).

    None when no file has 2 nights and within-night df together (no night-to-night variance is known:
    the caller falls back to comparing runs and says so)."""
    kind = check_kind(metric, kind)
    comps = [c for c in (night_components(metric, f, kind=kind) for f in files) if c is not None]
    dfb = sum(c[1] for c in comps)
    dfw = sum(c[3] for c in comps)
    if dfb < 1 or dfw < 1:
        return None
    within = sum(c[2] for c in comps) / dfw
    groups = [np.array([x.mean() for x in xs]) for xs in
              ([on_scale(kind, s) for s in checked_sessions(metric, f, kind) if len(s)] for f in files) if len(xs) >= 2]
    ms = sum(float(((g - g.mean()) ** 2).sum()) for g in groups) / dfb
    h_bar = float(np.mean([c[4] for c in comps if c[1] > 0]))
    between = max(0.0, ms - within * h_bar)
    homog = None
    if len(groups) >= 2 and all(np.ptp(g) > 0 for g in groups):
        homog = float(sps.bartlett(*groups).pvalue)
    return NightVariance(between=between, df_between=float(dfb), within=within, df_within=float(dfw),
                         n_sources=len(comps), homogeneity_p=homog)
