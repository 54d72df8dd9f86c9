"""Per-run figures of tonight's session vs the stored baseline → one verdict per metric (pure functions).

Why it is built this way:

* **Scale.** Rates (speedup, tok/s) and P95 latencies are compared on the log scale: run-to-run noise
  on a machine is multiplicative, and a difference of mean logs is a ratio of geometric means, reported
  as a relative change in %. Acceptance figures are already rates in [0, 1] with additive noise, so
  they are compared raw and reported in percentage points. Per-run rates, never a pooled test over
  tokens: tokens within a run share the run's conditions and are not independent.
* **Unit.** A baseline holding one session is compared run by run (Welch's t, ``method`` ends in
  ``/run``). A baseline holding several sessions (nights) is compared by session means, because the
  night-to-night shift is real noise a run-level test would call a change; tonight's single session
  then gets the between-night variance too (``/session``, see :func:`_session_core`).
* **Decision** (all in the metric's natural unit, ``threshold`` is the signed limit on the bad side,
  e.g. -5 % for speedup, -2 points for acceptance, +10 % for a P95 latency; ``p`` is the one-sided
  p-value in the direction of the estimate, after the look correction):

  - ``regressed``: ``p < alpha`` **and** the point estimate is beyond the threshold on the bad side
    (a 1 % drop that is significant is *not* a regression);
  - ``improved``: ``p < alpha`` and the estimate is beyond the mirrored threshold on the good side
    (:func:`mirror`: the same distance on the log scale for ratios, -25 % ↔ +33.3 %);
  - ``unchanged``: otherwise, when the whole two-sided ``1 - 2*alpha`` CI (90 % at alpha 0.05) lies
    strictly between the threshold and its mirror (an equivalence test: both one-sided tests at alpha);
  - ``inconclusive``: anything else, and whenever a side has fewer than 2 units.

  ``p < alpha`` one-sided is the same event as "the 90 % CI excludes 0 on that side".
* **Near-deterministic** metrics (acceptance at temperature 0 on the CPU repeats exactly) break a t-test
  (zero variance). When the sd of the units on *both* sides is at most ``Thresholds.exact_sd`` (natural
  units, default 0.1 % or 0.1 points) the exact rule decides on the difference of means:
  ``|delta| <= exact_tolerance`` → unchanged, beyond the threshold → regressed/improved, else
  inconclusive. Its ``p`` is None and its "CI" is the range of all pairwise differences.
* **Moderated variance** (optional ``prior``): with 5 runs a side a t-test has ~8 df, and the smallest BH
  step over a family of m metric tests (alpha/m) then needs a large t. Run-to-run noise is mostly a
  property of the machine and the metric, so, like limma (Smyth 2004), the variance of one test is shrunk
  towards a prior estimated from the variances in *all* stored baselines of the profile
  (:func:`estimate_prior`, empirical Bayes, by the method of moments on log variances): ``s~² = max((d0
  s0² + d s²) / (d0 + d), s²)`` with ``d0 + d`` df (the max is a conservative departure from limma: a test
  noisier than the profile's typical one keeps its own variance; plain shrinkage false-alarms there, 7.8 %
  of A/A suites at a 1.5x spread). When the stored variances disagree (heterogeneous noise) ``d0`` comes
  out small and the test falls back to the plain t. The prior comes from the baselines only, never from
  tonight's runs, so it is fixed before any test runs. With a prior the run unit uses the pooled
  (equal-variance) t: under "no change" both sides are draws of the same distribution, so the variances
  are equal exactly when it matters.
* **Many metrics** per session: :func:`adjust` (Benjamini–Hochberg by default) re-decides on adjusted p;
  ``family_size`` pads the p-values not seen yet with 1 (BH and Holm are monotone, so what is rejected
  with the padding stays rejected once the rest is known: a test can fail itself before the session ends).
* **Sequential looks**: Bonferroni over the planned looks (:func:`alpha_for_look`); valid whatever the
  spacing of looks and however correlated they are, at a small cost in power against Pocock.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import stats as sps

from pytest_specdec.errors import ConfigError
from pytest_specdec.gate.registry import Kind
from pytest_specdec.gate.registry import metric as registry_metric

VERDICTS: tuple[str, ...] = ("improved", "unchanged", "regressed", "inconclusive", "not-comparable")

_LOG_KINDS = ("rate", "latency")


def kind_of(metric: str) -> Kind:
    """The comparison kind of a metric name; ``per_position_acceptance*`` is acceptance, ``*_ms`` latency."""
    known = registry_metric(metric)
    if known is not None:
        return known.kind
    if metric.endswith("_ms"):
        return "latency"
    raise ConfigError(f"metric {metric!r}: unknown kind; pass kind='rate', 'acceptance' or 'latency'")


def _check_kind(metric: str, kind: str | None) -> Kind:
    if kind is None:
        return kind_of(metric)
    if kind not in ("rate", "acceptance", "latency"):
        raise ConfigError(f"metric {metric!r}: kind must be 'rate', 'acceptance' or 'latency', got {kind!r}")
    return kind  # type: ignore[return-value]


def _unit(kind: Kind) -> str:
    return "points" if kind == "acceptance" else "%"


@dataclass(frozen=True)
class Thresholds:
    """Practical limits in natural units (magnitudes: % for rates and latencies, points for acceptance).

    ``per_metric`` overrides the kind's default for one metric name. ``exact_sd`` is the sd (natural
    units, both sides) at or below which a metric counts as near-deterministic; ``exact_tolerance`` is
    the difference such a metric may show and still be ``unchanged``.
    """

    rate_pct: float = 5.0
    acceptance_points: float = 2.0
    latency_pct: float = 10.0
    per_metric: Mapping[str, float] = field(default_factory=dict)
    exact_sd: float = 0.1
    exact_tolerance: float = 0.5

    def __post_init__(self) -> None:
        named = {"rate_pct": self.rate_pct, "acceptance_points": self.acceptance_points,
                 "latency_pct": self.latency_pct, "exact_sd": self.exact_sd,
                 **{f"per_metric[{k!r}]": v for k, v in self.per_metric.items()}}
        for name, v in named.items():
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ConfigError(f"Thresholds.{name} must be a positive number, got {v!r}")
        if not (math.isfinite(self.exact_tolerance) and self.exact_tolerance >= 0):
            raise ConfigError(f"Thresholds.exact_tolerance must be >= 0, got {self.exact_tolerance!r}")
        smallest = min(v for k, v in named.items() if k != "exact_sd")
        if self.exact_tolerance >= smallest:
            raise ConfigError(f"Thresholds.exact_tolerance ({self.exact_tolerance}) must be below every "
                              f"threshold (smallest {smallest})")

    def bad_side(self, metric: str, kind: Kind) -> float:
        """The signed threshold: negative for higher-is-better kinds, positive for latencies."""
        mag = self.per_metric.get(metric)
        if mag is None:  # `per_position_acceptance` covers every `per_position_acceptance[i]`
            mag = self.per_metric.get(metric.split("[", 1)[0])
        if mag is None:
            mag = {"rate": self.rate_pct, "acceptance": self.acceptance_points, "latency": self.latency_pct}[kind]
        return float(mag) if kind == "latency" else -float(mag)


DEFAULT_THRESHOLDS = Thresholds()


@dataclass(frozen=True)
class Verdict:
    """One metric's comparison. ``delta``/CI in ``unit`` (% relative or points); ``baseline``/``now`` in
    the metric's own unit (geometric mean for rates and latencies, mean for acceptance); ``n_*`` count
    the units compared (runs, or sessions for the baseline when ``method`` ends in ``/session``)."""

    metric: str
    verdict: str
    baseline: float | None
    now: float | None
    delta: float | None
    ci_low: float | None
    ci_high: float | None
    p: float | None
    n_baseline: int
    n_now: int
    unit: str
    method: str
    threshold: float | None
    note: str
    #: se(n)² = var_fixed + var_run / n on the comparison scale, n = runs (pairs) tonight: what more runs
    #: could buy (:func:`can_settle`) and what the baseline can catch (:func:`detectable`). None: no model.
    var_fixed: float | None = None
    var_run: float | None = None
    df: float | None = None
    family: str = "gated"
    mde: float | None = None  # smallest bad-side change (natural units) caught with power 0.9, see detectable()

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able values (for baselines and reports)."""
        return dataclasses.asdict(self)


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
    kind = _check_kind(metric, kind)
    xs = [_scale(kind, s) for s in _sessions(metric, baseline, kind)]
    out: dict[str, tuple[float, int]] = {}
    df = sum(len(x) - 1 for x in xs)
    if df > 0:
        out["run"] = (sum(float(((x - x.mean()) ** 2).sum()) for x in xs) / df, df)
    if len(xs) > 1:
        out["session"] = (float(np.var([x.mean() for x in xs], ddof=1)), len(xs) - 1)
    return out


# ---- input checking -------------------------------------------------------------------------------


def _values(metric: str, values: Iterable[Any], kind: Kind, where: str) -> np.ndarray:
    """Checked float array; None/NaN/inf/out-of-domain raise (nothing is silently dropped)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise ConfigError(f"metric {metric!r}: {where} must be a list of per-run values, got {values!r}")
    out = []
    for i, v in enumerate(values):
        if v is None or isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise ConfigError(f"metric {metric!r}: {where}[{i}] is {v!r}, not a number; "
                              "drop failed runs before comparing, never pass None")
        fv = float(v)
        if not math.isfinite(fv):
            raise ConfigError(f"metric {metric!r}: {where}[{i}] is {fv}; NaN/inf values are rejected")
        if kind in _LOG_KINDS and fv <= 0:
            raise ConfigError(f"metric {metric!r}: {where}[{i}] is {fv}; a {kind} must be > 0")
        if kind == "acceptance" and not 0.0 <= fv <= 1.0:
            raise ConfigError(f"metric {metric!r}: {where}[{i}] is {fv}; acceptance must lie in [0, 1]")
        out.append(fv)
    return np.asarray(out, dtype=float)


def _sessions(metric: str, baseline: Sequence[Sequence[Any]], kind: Kind) -> list[np.ndarray]:
    """The baseline's non-empty sessions; a flat list of numbers is refused (it hides the unit)."""
    if isinstance(baseline, (str, bytes)) or not isinstance(baseline, Iterable):
        raise ConfigError(f"metric {metric!r}: baseline must be a list of sessions, got {baseline!r}")
    out = []
    for j, s in enumerate(baseline):
        if s is None or isinstance(s, (int, float, np.number)):
            raise ConfigError(f"metric {metric!r}: baseline must be a list of sessions (lists of run "
                              f"values); baseline[{j}] is {s!r}")
        arr = _values(metric, s, kind, f"baseline[{j}]")
        if arr.size:
            out.append(arr)
    return out


# ---- the shared (vectorised) cores ---------------------------------------------------------------


def _scale(kind: Kind, x: np.ndarray) -> np.ndarray:
    return np.log(x) if kind in _LOG_KINDS else np.asarray(x, dtype=float)


def _natural(kind: Kind, d: Any) -> Any:
    """A difference on the comparison scale → % relative change (log kinds) or points."""
    return 100.0 * np.expm1(d) if kind in _LOG_KINDS else 100.0 * np.asarray(d)


def _center(kind: Kind, m: float) -> float:
    return float(np.exp(m)) if kind in _LOG_KINDS else float(m)


def _welch_core(xb: np.ndarray, xn: np.ndarray, a: float) -> tuple[np.ndarray, ...]:
    """Welch's t of now − baseline along the last axis: estimate, 1−2a CI, one-sided p in its direction."""
    with warnings.catch_warnings():
        # One side may be constant (acceptance at temperature 0 against a sampled session): its zero
        # variance is right and the other side carries the test, but scipy warns on any constant
        # sample. Both sides near-constant never get here (the exact rule takes them).
        warnings.filterwarnings("ignore", message="Precision loss occurred", category=RuntimeWarning)
        res = sps.ttest_ind(xn, xb, equal_var=False, axis=-1)
        ci = res.confidence_interval(confidence_level=1.0 - 2.0 * a)
    d = np.mean(xn, axis=-1) - np.mean(xb, axis=-1)
    return d, np.asarray(ci.low), np.asarray(ci.high), np.asarray(res.pvalue) / 2.0


def _moderated_core(xb: np.ndarray, xn: np.ndarray, var0: Any, df0: Any, a: float) -> tuple[np.ndarray, ...]:
    """Pooled t of now − baseline (last axis) with the variance shrunk towards a prior (var0, df0)."""
    nb, nn = xb.shape[-1], xn.shape[-1]
    ss = ((xb - xb.mean(-1, keepdims=True)) ** 2).sum(-1) + ((xn - xn.mean(-1, keepdims=True)) ** 2).sum(-1)
    d = nb + nn - 2
    df = np.asarray(df0, dtype=float) + d
    # Never below the test's own variance: the prior only adds df. A test noisier than the profile's
    # typical one keeps its own noise (plain moderation under-states it and false-alarms, see the script).
    s2 = np.maximum((np.asarray(df0, dtype=float) * np.asarray(var0, dtype=float) + ss) / df, ss / d)
    se = np.sqrt(s2 * (1.0 / nb + 1.0 / nn))
    est = xn.mean(-1) - xb.mean(-1)
    q = sps.t.ppf(1.0 - a, df)
    p = sps.t.sf(np.abs(est) / se, df)
    return est, est - q * se, est + q * se, p


def _session_core(means: np.ndarray, inv_r: np.ndarray, ss_within: np.ndarray, df_within: np.ndarray,
                  now_mean: np.ndarray, n_now: int, a: float, var0: Any = 0.0,
                  df0: Any = 0.0) -> tuple[np.ndarray, ...]:
    """t of tonight's session mean against the mean of k baseline session means (last axis of ``means``).

    ``Var(baseline mean) = s_B²/k`` (s_B² = variance of the session means). Tonight is one draw of a
    session, so its mean varies like a baseline session's: ``s_B²``, adjusted by ``s_W²(1/n_now −
    mean(1/r_j))`` when tonight has a different number of runs (s_W² = pooled within-session variance,
    tonight included; the night part is floored at 0). df = k − 1 (the between-night estimate), plus
    ``df0`` when s_B² is shrunk towards a prior ``var0`` (the spread of session means in other baselines).
    """
    k = means.shape[-1]
    df0 = np.asarray(df0, dtype=float)
    own = np.var(means, axis=-1, ddof=1)
    s_b2 = np.maximum((df0 * np.asarray(var0, dtype=float) + (k - 1) * own) / (df0 + k - 1), own)
    s_w2 = np.divide(ss_within, df_within, out=np.zeros_like(ss_within, dtype=float), where=df_within > 0)
    var_now = np.maximum(s_b2 + s_w2 * (1.0 / n_now - inv_r), s_w2 / n_now)
    se = np.sqrt(s_b2 / k + var_now)
    d = now_mean - np.mean(means, axis=-1)
    df = df0 + k - 1
    q = sps.t.ppf(1.0 - a, df)
    p = sps.t.sf(np.abs(d) / se, df)
    return d, d - q * se, d + q * se, p


def mirror(bad: float, unit: str) -> float:
    """The good-side limit: the same distance as ``bad`` on the comparison scale. For ratios that is the
    log scale, so a -25 % speedup threshold mirrors to +33.3 % and a +40 % latency one to -28.6 %."""
    if unit == "%":
        return 100.0 / (1.0 + bad / 100.0) - 100.0
    return -bad


def _decide(delta: Any, lo: Any, hi: Any, p: Any, bad: Any, alpha: float, unit: str = "%") -> np.ndarray:
    """The decision rule (module docstring), elementwise; all arguments in natural units."""
    delta, lo, hi, p, bad = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (delta, lo, hi, p, bad)))
    good = np.vectorize(lambda b: mirror(float(b), unit), otypes=[float])(bad) if bad.size else bad
    sign = np.sign(bad)
    sig = p < alpha
    regressed = sig & (sign * delta > sign * bad)
    improved = sig & (sign * delta < sign * good)
    inside = np.where(sign < 0, (lo > bad) & (hi < good), (lo > good) & (hi < bad))
    unchanged = ~regressed & ~improved & inside
    return np.select([regressed, improved, unchanged], ["regressed", "improved", "unchanged"], "inconclusive")


def _fmt(x: float, unit: str) -> str:
    return f"{x:+.2f}{' %' if unit == '%' else ' pt'}"


def _explain(verdict: str, delta: float, lo: float, hi: float, p: float, bad: float, alpha: float,
             unit: str, ci_level: float) -> str:
    ci = f"{ci_level:.4g}% CI {_fmt(lo, unit)} to {_fmt(hi, unit)}"
    head = f"{_fmt(delta, unit)} ({ci}), p={p:.3g}"
    band = f"{_fmt(min(bad, mirror(bad, unit)), unit)} .. {_fmt(max(bad, mirror(bad, unit)), unit)}"
    if verdict == "regressed":
        return f"{head} < {alpha:g} and beyond the {_fmt(bad, unit)} threshold"
    if verdict == "improved":
        return f"{head} < {alpha:g} and beyond the {_fmt(mirror(bad, unit), unit)} mirror threshold"
    if verdict == "unchanged":
        extra = " (significant, but smaller than the threshold)" if p < alpha else ""
        return f"{head}; the CI lies inside {band}{extra}"
    if p < alpha:
        return f"{head}: significant but the estimate is within {band} and the CI is not; need more runs"
    return f"{head}: not significant at {alpha:g} and the CI reaches beyond {band}; need more runs"


def _inconclusive(metric: str, kind: Kind, n_b: int, n_n: int, bad: float, method: str, note: str,
                  baseline: float | None = None, now: float | None = None) -> Verdict:
    return Verdict(metric, "inconclusive", baseline, now, None, None, None, None, n_b, n_n,
                   _unit(kind), method, bad, note)


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

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able values."""
        return dataclasses.asdict(self)


HOMOGENEITY_P = 0.01


def night_components(metric: str, baseline: Sequence[Sequence[Any]], *, kind: Kind | None = None
                     ) -> tuple[float, int, float, int, float] | None:
    """One file's (between-night estimate, its df, within ss, within df, mean 1/runs) on the comparison
    scale; the between estimate is ``var(night means) − s_W²·mean(1/n_j)`` (unbiased, may be negative).
    None without 2 nights of 2+ runs... the within part alone is kept when there is one night."""
    kind = _check_kind(metric, kind)
    xs = [_scale(kind, s) for s in _sessions(metric, baseline, kind)]
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
    kind = _check_kind(metric, kind)
    comps = [c for c in (night_components(metric, f, kind=kind) for f in files) if c is not None]
    dfb = sum(c[1] for c in comps)
    dfw = sum(c[3] for c in comps)
    if dfb < 1 or dfw < 1:
        return None
    within = sum(c[2] for c in comps) / dfw
    groups = [np.array([x.mean() for x in xs]) for xs in
              ([_scale(kind, s) for s in _sessions(metric, f, kind) if len(s)] for f in files) if len(xs) >= 2]
    ms = sum(float(((g - g.mean()) ** 2).sum()) for g in groups) / dfb
    h_bar = float(np.mean([c[4] for c in comps if c[1] > 0]))
    between = max(0.0, ms - within * h_bar)
    homog = None
    if len(groups) >= 2 and all(np.ptp(g) > 0 for g in groups):
        homog = float(sps.bartlett(*groups).pvalue)
    return NightVariance(between=between, df_between=float(dfb), within=within, df_within=float(dfw),
                         n_sources=len(comps), homogeneity_p=homog)


def _nights_core(means: np.ndarray, h_b: float, xn: np.ndarray, s_w2: float, df_w: float, sig_n2: float,
                 df_n: float, a: float) -> tuple[float, float, float, float, float, float, float]:
    """Tonight's mean against the mean of J baseline night means, both drawn with a night effect:
    ``Var = σ_N²(1 + 1/J) + s_W²(1/n + mean(1/n_j)/J)``; Satterthwaite df from the two components.
    Returns (estimate, CI low, CI high, one-sided p, var_fixed, var_run, df)."""
    j, n = means.size, xn.size
    var_fixed = sig_n2 * (1.0 + 1.0 / j) + s_w2 * h_b / j
    var = var_fixed + s_w2 / n
    b_term = sig_n2 * (1.0 + 1.0 / j)
    w_term = s_w2 * (1.0 / n + h_b / j)
    denom = (b_term ** 2 / df_n if df_n > 0 and b_term > 0 else 0.0) + (w_term ** 2 / df_w if df_w > 0 else 0.0)
    df = var ** 2 / denom if denom > 0 else max(df_w, 1.0)
    se = math.sqrt(var)
    d = float(xn.mean() - means.mean())
    q = float(sps.t.ppf(1.0 - a, df))
    p = float(sps.t.sf(abs(d) / se, df)) if se > 0 else (0.0 if d else 0.5)
    return d, d - q * se, d + q * se, p, var_fixed, s_w2, df


def _to_scale(kind: Kind, natural: float) -> float:
    """A signed change in natural units (% or points) → the comparison scale (log ratio or fraction)."""
    return math.log1p(natural / 100.0) if kind in _LOG_KINDS else natural / 100.0


def detectable(kind: Kind, bad: float, var: float, df: float, alpha: float, power: float = 0.9) -> float:
    """The smallest bad-side change (magnitude, natural units) that is called ``regressed`` with
    probability ``power`` when tests are at one-sided level ``alpha``: the estimate must be significant
    and beyond the threshold, so the effect must exceed max(threshold, t_α·se) by t_power·se."""
    se = math.sqrt(var)
    thr = abs(_to_scale(kind, bad))
    eff = max(thr, float(sps.t.ppf(1.0 - alpha, df)) * se) + float(sps.t.ppf(power, df)) * se
    if kind in _LOG_KINDS and bad > 0 and eff > 700.0:  # exp would overflow: no rise is caught at all
        return math.inf
    sign = math.copysign(1.0, bad)
    return abs(float(_natural(kind, sign * eff)))


def can_settle(v: Verdict, n_max: int, alpha: float) -> bool:
    """Whether ``n_max`` runs per arm could turn an inconclusive verdict into a conclusive one, taking the
    estimate where it is now: its CI inside ±threshold, or significant and beyond the threshold."""
    if v.verdict != "inconclusive" or v.var_fixed is None or v.var_run is None or v.delta is None:
        return False
    kind: Kind = "acceptance" if v.unit == "points" else "rate"
    se = math.sqrt(v.var_fixed + v.var_run / n_max)
    df = (v.df or 1.0) + max(0, n_max - v.n_now)  # the extra runs add their df too
    q = float(sps.t.ppf(1.0 - alpha, df)) * se
    d = abs(_to_scale(kind, v.delta))
    thr = abs(_to_scale(kind, v.threshold or 0.0))
    return d + q < thr or (d > thr and d > q)


# ---- public API ----------------------------------------------------------------------------------


def compare(metric: str, baseline: Sequence[Sequence[float]], now: Sequence[float], *,
            kind: Kind | None = None, thresholds: Thresholds = DEFAULT_THRESHOLDS, alpha: float = 0.05,
            look: int = 1, max_looks: int = 1, prior: Prior | None = None,
            nights: NightVariance | None = None) -> Verdict:
    """One metric's verdict: ``baseline`` is a list of sessions (each a list of per-run values), ``now``
    tonight's runs. ``look``/``max_looks`` apply the sequential split (:func:`alpha_for_look`): the
    reported ``p`` is multiplied by ``max_looks`` so it stays comparable with ``alpha`` in :func:`adjust`.
    ``prior`` moderates the variance (module docstring): of the runs for a one-session baseline, of the
    session means for several sessions. ``nights`` (the profile's pooled night-to-night variance, see
    :class:`NightVariance`) compares tonight's mean with the baseline's night means, whatever their number,
    and takes precedence over ``prior``.
    """
    kind = _check_kind(metric, kind)
    sessions = _sessions(metric, baseline, kind)
    xn_raw = _values(metric, now, kind, "now")
    a = alpha_for_look(alpha, look, max_looks)
    bad = thresholds.bad_side(metric, kind)
    unit = _unit(kind)
    by_session = len(sessions) > 1
    unit_name = "session" if by_session else "run"
    log = "-log" if kind in _LOG_KINDS else ""
    xs = [_scale(kind, s) for s in sessions]
    xn = _scale(kind, xn_raw)
    units_b = np.array([s.mean() for s in xs]) if by_session else (xs[0] if xs else np.array([]))
    n_b, n_n = len(units_b), len(xn)
    base_c = _center(kind, units_b.mean()) if n_b else None
    now_c = _center(kind, xn.mean()) if n_n else None
    what = (f"unit: session mean (baseline {n_b} sessions of {sum(len(s) for s in xs)} runs)" if by_session
            else f"unit: run (baseline 1 session of {n_b} runs)")

    if n_b < 2 or n_n < 2:
        need = "sessions" if by_session else "runs"
        return _inconclusive(metric, kind, n_b, n_n, bad, f"none/{unit_name}",
                             f"too little data: {n_b} baseline {need}, {n_n} runs now (need 2 each); {what}",
                             base_c, now_c)

    sd_b = float(100.0 * np.std(units_b, ddof=1))  # natural units: % (log sd ≈ relative sd) or points
    sd_n = float(100.0 * np.std(xn, ddof=1))
    if max(sd_b, sd_n) <= thresholds.exact_sd:
        d = float(_natural(kind, xn.mean() - units_b.mean()))
        # min/max so rounding in the means cannot put delta outside its own range
        lo = min(d, float(_natural(kind, xn.min() - units_b.max())))
        hi = max(d, float(_natural(kind, xn.max() - units_b.min())))
        tol, good = thresholds.exact_tolerance, mirror(bad, unit)
        sign = math.copysign(1.0, bad)
        if abs(d) <= tol:
            v, why = "unchanged", f"|{d:.3g}| <= tolerance {tol:g}"
        elif sign * d > sign * bad:
            v, why = "regressed", f"worse than the {_fmt(bad, unit)} threshold"
        elif sign * d < sign * good:
            v, why = "improved", f"better than the {_fmt(good, unit)} mirror threshold"
        else:
            v, why = "inconclusive", f"beyond tolerance {tol:g} but within {_fmt(bad, unit)} .. {_fmt(good, unit)}"
        note = (f"near-deterministic (sd {sd_b:.2f}/{sd_n:.2f} <= {thresholds.exact_sd:g} {unit}): exact rule, "
                f"{_fmt(d, unit)} {why}; CI is the range of differences; {what}")
        return Verdict(metric, v, base_c, now_c, d, lo, hi, None, n_b, n_n, unit, f"exact/{unit_name}",
                       bad, note)

    if nights is not None:
        means = np.array([s.mean() for s in xs])
        ss = sum(float(((s - s.mean()) ** 2).sum()) for s in xs) + float(((xn - xn.mean()) ** 2).sum())
        dfw = sum(len(s) - 1 for s in xs) + n_n - 1
        own_w = ss / dfw if dfw > 0 else 0.0
        s_w2 = max((nights.df_within * nights.within + ss) / (nights.df_within + dfw), own_w)
        df_w = nights.df_within + dfw
        sig_n2, df_n = nights.between, nights.df_between
        whose = "the profile's floor, min_night_sd" if nights.floor else "pooled"
        h_b = float(np.mean([1.0 / len(s) for s in xs]))
        if (len(xs) > 1 and nights.homogeneity_p is not None and nights.homogeneity_p < HOMOGENEITY_P):
            own_b = float(np.var(means, ddof=1)) - own_w * h_b
            if own_b > sig_n2:
                sig_n2, df_n, whose = own_b, float(len(xs) - 1), "this test's own (files disagree)"
        d, lo, hi, p, var_fixed, var_run, df = _nights_core(means, h_b, xn, s_w2, df_w, sig_n2, df_n, a)
        p_rep = float(min(1.0, p * max_looks))
        d_n, lo_n, hi_n = (float(_natural(kind, v)) for v in (d, lo, hi))
        v = str(_decide(d_n, lo_n, hi_n, p_rep, bad, alpha, unit))
        level = 100.0 * (1.0 - 2.0 * a)
        what = (f"unit: night mean (baseline {len(xs)} night(s) of {sum(len(s) for s in xs)} runs, "
                f"{n_n} runs now); night-to-night sd {100 * math.sqrt(sig_n2):.3g} % ({whose}, "
                f"{nights.n_sources} stored baselines, {df_n:.0f} df), run sd {100 * math.sqrt(s_w2):.3g} %")
        note = _explain(v, d_n, lo_n, hi_n, p_rep, bad, alpha, unit, level) + f"; {what}"
        if max_looks > 1:
            note += f"; look {look} of {max_looks}: p x{max_looks} (Bonferroni over looks)"
        return Verdict(metric, v, base_c, now_c, d_n, lo_n, hi_n, p_rep, len(xs), n_n, unit,
                       f"nights-t{log}/night", bad, note, var_fixed=var_fixed, var_run=var_run, df=df)

    if by_session:
        inv_r = np.mean([1.0 / len(s) for s in xs])
        ss = sum(float(((s - s.mean()) ** 2).sum()) for s in xs) + float(((xn - xn.mean()) ** 2).sum())
        dfw = sum(len(s) - 1 for s in xs) + n_n - 1
        d, lo, hi, p = _session_core(units_b, np.float64(inv_r), np.float64(ss), np.float64(dfw),
                                     np.float64(xn.mean()), n_n, a, *((prior.var, prior.df) if prior else ()))
        method = f"{'moderated-' if prior else ''}session-t{log}/session"
        var_fixed = var_run = df_v = None
    elif prior is not None:
        d, lo, hi, p = _moderated_core(units_b, xn, prior.var, prior.df, a)
        method = f"moderated-t{log}/run"
        ss = float(((units_b - units_b.mean()) ** 2).sum() + ((xn - xn.mean()) ** 2).sum())
        df_v = prior.df + n_b + n_n - 2
        var_run = max((prior.df * prior.var + ss) / df_v, ss / (n_b + n_n - 2))
        var_fixed = var_run / n_b
    else:
        d, lo, hi, p = _welch_core(units_b, xn, a)
        method = f"welch{log}/run"
        vb, vn = float(np.var(units_b, ddof=1)) / n_b, float(np.var(xn, ddof=1))
        var_fixed, var_run = vb, vn
        den = vb ** 2 / (n_b - 1) + (vn / n_n) ** 2 / (n_n - 1)
        df_v = (vb + vn / n_n) ** 2 / den if den > 0 else float(n_b + n_n - 2)
    p_rep = float(min(1.0, float(p) * max_looks))
    d_n, lo_n, hi_n = (float(_natural(kind, v)) for v in (d, lo, hi))
    v = str(_decide(d_n, lo_n, hi_n, p_rep, bad, alpha, unit))
    level = 100.0 * (1.0 - 2.0 * a)
    note = _explain(v, d_n, lo_n, hi_n, p_rep, bad, alpha, unit, level) + f"; {what}"
    if prior is not None:
        note += f"; variance moderated by a prior from {prior.n_sources} stored baselines ({prior.df:.0f} df)"
    if max_looks > 1:
        note += f"; look {look} of {max_looks}: p x{max_looks} (Bonferroni over looks)"
    return Verdict(metric, v, base_c, now_c, d_n, lo_n, hi_n, p_rep, n_b, n_n, unit, method, bad, note,
                   var_fixed=var_fixed, var_run=var_run, df=df_v)


def not_comparable(metric: str, fields: Mapping[str, tuple[Any, Any]]) -> Verdict:
    """The verdict when the baseline was measured under different conditions (``field: (old, new)``)."""
    diff = "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in fields.items())
    try:
        unit = _unit(kind_of(metric))
    except ConfigError:
        unit = ""
    return Verdict(metric, "not-comparable", None, None, None, None, None, None, 0, 0, unit, "none", None,
                   f"baseline not comparable: {diff or 'comparability keys differ'}")


def _holm(p: np.ndarray) -> np.ndarray:
    """Holm's step-down adjusted p-values (scipy has BH/BY only)."""
    m = len(p)
    order = np.argsort(p, kind="stable")
    adj = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    out = np.empty(m)
    out[order] = adj
    return out


def adjusted_p(p: Any, method: str = "bh") -> np.ndarray:
    """BH (``scipy.stats.false_discovery_control``) or Holm adjusted p-values along the last axis."""
    p = np.asarray(p, dtype=float)
    if method == "bh":
        return sps.false_discovery_control(p, axis=-1, method="bh") if p.size else p
    if method == "holm":
        return np.apply_along_axis(_holm, -1, p) if p.size else p
    raise ConfigError(f"adjust method must be 'bh' or 'holm', got {method!r}")


def adjust(verdicts: Sequence[Verdict], method: str = "bh", alpha: float = 0.05,
           family_size: int | None = None) -> list[Verdict]:
    """Re-decide a session's verdicts on BH- (default) or Holm-adjusted p-values.

    Only verdicts with a p take part (the exact rule, too-little-data and not-comparable verdicts pass
    through). CIs are left as they were: ``unchanged`` does not depend on p, so only regressed/improved
    can fall back to inconclusive (or unchanged). Each p is one-sided in its estimate's direction, so BH
    at alpha here is BH at 2*alpha on two-sided p-values: the expected share of false calls among
    regressed + improved is at most 2*alpha (directional FDR, Benjamini & Yekutieli 2005), about alpha
    per direction; the practical threshold keeps the realised rate far lower (scripts/stats_simulation.py).

    ``family_size`` (>= the number of p-values given) counts metric tests not measured yet; their p-values
    are taken as 1. BH and Holm are monotone in every p-value, so a verdict ``regressed`` here stays
    ``regressed`` when the real p-values arrive and the family is adjusted as a whole.
    """
    _check_alpha(alpha)
    idx = [i for i, v in enumerate(verdicts) if v.p is not None and v.verdict != "not-comparable"]
    out = list(verdicts)
    if not idx:
        adjusted_p(np.array([]), method)  # still validate the method name
        return out
    ps = np.array([verdicts[i].p for i in idx], dtype=float)
    m = len(idx) if family_size is None else family_size
    if m < len(idx):
        raise ConfigError(f"family_size {family_size} is smaller than the {len(idx)} p-values given")
    padj = adjusted_p(np.concatenate([ps, np.ones(m - len(idx))]), method)[: len(idx)]
    name = {"bh": "Benjamini-Hochberg", "holm": "Holm"}[method]
    unseen = f" ({m - len(idx)} not measured yet, taken as p=1)" if m > len(idx) else ""
    for i, pa in zip(idx, padj, strict=True):
        v = verdicts[i]
        new = str(_decide(v.delta, v.ci_low, v.ci_high, pa, v.threshold, alpha, v.unit))
        change = f", {v.verdict} -> {new}" if new != v.verdict else ""
        note = f"{v.note}; {name} over {m} tests{unseen}: p {v.p:.3g} -> {pa:.3g}{change}"
        out[i] = dataclasses.replace(v, verdict=new, p=float(pa), note=note)
    return out


def _check_alpha(alpha: float) -> None:
    if not (isinstance(alpha, (int, float)) and 0.0 < alpha < 0.5):
        raise ConfigError(f"alpha must lie in (0, 0.5), got {alpha!r}")


def alpha_for_look(alpha: float, look: int, max_looks: int) -> float:
    """The one-sided level for one of ``max_looks`` planned looks: Bonferroni, ``alpha / max_looks``.

    Chosen over Pocock's constant because it needs no assumption about how runs are spaced between
    looks or how correlated the looks are, and the chance of any false call over all looks stays
    <= alpha; it costs little power for 2-3 looks (Pocock's constant for 2 looks is ~0.6 alpha vs 0.5).
    """
    _check_alpha(alpha)
    if not (isinstance(max_looks, int) and max_looks >= 1 and isinstance(look, int) and 1 <= look <= max_looks):
        raise ConfigError(f"look must satisfy 1 <= look <= max_looks, got look={look!r}, max_looks={max_looks!r}")
    return alpha / max_looks


def planned_looks(first_runs: int, step: int, max_runs: int) -> list[int]:
    """Run counts at each look (e.g. 3, 5, 7 for first 3, step 2, max 7); its length is ``max_looks``."""
    if not (1 <= first_runs <= max_runs and step >= 1):
        raise ConfigError(f"need 1 <= first_runs <= max_runs and step >= 1, got {first_runs}, {step}, {max_runs}")
    looks = list(range(first_runs, max_runs + 1, step))
    if looks[-1] != max_runs:
        looks.append(max_runs)
    return looks


def next_look_useful(verdicts: Sequence[Verdict], n_now: int, max_runs: int, alpha_look: float) -> bool:
    """Take the next look only when it can change a gated verdict: some gated verdict is inconclusive
    and, with ``max_runs`` runs per arm and its estimate where it is, could become conclusive
    (:func:`can_settle`). Verdicts without a variance model fall back to :func:`should_continue`."""
    for v in verdicts:
        if v.family != "gated" or v.verdict != "inconclusive" or n_now >= max_runs:
            continue
        if v.var_fixed is None:
            if v.p is not None and should_continue(v, n_now, max_runs):
                return True
        elif can_settle(v, max_runs, alpha_look):
            return True
    return False


def should_continue(verdict: Verdict, n_now: int, max_runs: int) -> bool:
    """True when more interleaved runs could settle an inconclusive verdict: under the run budget, and the
    baseline has the 2 units a test needs (more runs tonight cannot fix a thin baseline)."""
    return verdict.verdict == "inconclusive" and n_now < max_runs and verdict.n_baseline >= 2


_OPS: dict[str, Callable[[float, float], bool]] = {">=": operator.ge, "<=": operator.le,
                                                   ">": operator.gt, "<": operator.lt}


@dataclass(frozen=True)
class SloResult:
    """An absolute check of one metric: the statistic used, its value and the message to show."""

    metric: str
    passed: bool
    statistic: str
    value: float | None
    op: str
    bound: float
    n: int
    message: str

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able values."""
        return dataclasses.asdict(self)


def check_slo(metric: str, values: Sequence[float], op: str, bound: float, *, kind: Kind | None = None) -> SloResult:
    """Check tonight's runs against an absolute bound (e.g. speedup >= 1.5, P95 TPOT <= 20 ms).

    The statistic follows the kind: geometric mean for rates (ratios average multiplicatively), mean for
    acceptance, median for latencies (robust to one bad run). No values is a failure, not an error.
    """
    kind = _check_kind(metric, kind)
    if op not in _OPS:
        raise ConfigError(f"metric {metric!r}: SLO operator must be one of {sorted(_OPS)}, got {op!r}")
    if not (isinstance(bound, (int, float)) and math.isfinite(bound)):
        raise ConfigError(f"metric {metric!r}: SLO bound must be a finite number, got {bound!r}")
    x = _values(metric, values, kind, "values")
    stat = {"rate": "geometric mean", "acceptance": "mean", "latency": "median"}[kind]
    if x.size == 0:
        return SloResult(metric, False, stat, None, op, float(bound), 0,
                         f"{metric}: no values to check against {op} {bound:g}: FAIL")
    val = {"rate": lambda: float(np.exp(np.log(x).mean())), "acceptance": lambda: float(x.mean()),
           "latency": lambda: float(np.median(x))}[kind]()
    ok = _OPS[op](val, bound)
    msg = f"{metric}: {stat} {val:.4g} over {x.size} runs {op} {bound:g}: {'pass' if ok else 'FAIL'}"
    return SloResult(metric, ok, stat, val, op, float(bound), int(x.size), msg)
