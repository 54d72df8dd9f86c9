"""Tonight's per-run values against a stored baseline → one verdict per metric (pure functions).

:func:`compare` compares tonight's mean with the baseline's night means, given the profile's
night-to-night variance (else with its runs or session means), and calls the metric regressed,
improved, unchanged or inconclusive against its practical threshold; docs/gate.md has the rule and why.
Beside it: :mod:`.scale` (kinds and scales), :mod:`.variance` (variance models from the stored
baselines), :mod:`.sequential` (multiplicity, looks, what a baseline can catch) and :mod:`.slo`
(absolute bounds).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
from scipy import stats as sps

from pytest_specdec.errors import ConfigError
from pytest_specdec.gate.kinds import (
    EXACT,
    FAMILIES,
    GATED,
    IMPROVED,
    INCONCLUSIVE,
    NIGHT,
    NOT_COMPARABLE,
    PERCENT,
    PERS,
    REGRESSED,
    RUN,
    SESSION,
    UNCHANGED,
    UNITS,
    Decision,
    Family,
    Per,
    Unit,
    check_decision,
    check_word,
    unit_mark,
)
from pytest_specdec.gate.registry import LOG_KINDS, Kind
from pytest_specdec.gate.scale import (
    THRESHOLD_FIELD,
    center,
    check_kind,
    checked_sessions,
    checked_values,
    delta_unit,
    kind_of,
    on_scale,
    to_natural,
)
from pytest_specdec.gate.variance import HOMOGENEITY_P, NightVariance, Prior


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
            mag = getattr(self, THRESHOLD_FIELD[kind])
        return float(mag) if kind == "latency" else -float(mag)


DEFAULT_THRESHOLDS = Thresholds()


@dataclass(frozen=True)
class Verdict:
    """One metric's comparison. ``delta``/CI in ``unit`` (% relative or points); ``baseline``/``now`` in
    the metric's own unit (geometric mean for rates and latencies, mean for acceptance); ``n_*`` count
    the units compared (``per``: runs, pairs, or the baseline's sessions or nights). ``method`` is the rule
    alone ("welch-log", "exact", "none", ...): the unit it compared is ``per``, never a suffix of it."""

    metric: str
    verdict: Decision
    baseline: float | None
    now: float | None
    delta: float | None
    ci_low: float | None
    ci_high: float | None
    p: float | None
    n_baseline: int
    n_now: int
    unit: Unit
    method: str
    threshold: float | None
    note: str
    #: se(n)² = var_fixed + var_run / n on the comparison scale, n = runs (pairs) tonight: what more runs
    #: could buy (:func:`.sequential.can_settle`) and what the baseline can catch
    #: (:func:`.sequential.detectable`). None: no model.
    var_fixed: float | None = None
    var_run: float | None = None
    df: float | None = None
    family: Family = GATED
    mde: float | None = None  # smallest bad-side change (natural units) caught with power 0.9, see detectable()
    per: Per = RUN

    def __post_init__(self) -> None:
        """A word outside its vocabulary is a bug where the verdict was built: fail there, not in a reader."""
        where = f"Verdict({self.metric!r})"
        check_decision(self.verdict, where)
        check_word(self.family, FAMILIES, "family", where)
        check_word(self.unit, UNITS, "unit", where)
        check_word(self.per, PERS, "per", where)
        if "/" in self.method:
            raise ValueError(f"{where}: method {self.method!r} names its comparison unit; pass it as per=")

    @property
    def exact(self) -> bool:
        """Decided by the exact rule (near-deterministic figures): no p, and its interval is the range of the
        differences, not a CI."""
        return self.method == EXACT


# ---- the shared (vectorised) cores ---------------------------------------------------------------


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
    # typical one keeps its own noise (plain moderation under-states it and false-alarms, see
    # scripts/stats_simulation.py).
    s2 = np.maximum((np.asarray(df0, dtype=float) * np.asarray(var0, dtype=float) + ss) / df, ss / d)
    se = np.sqrt(s2 * (1.0 / nb + 1.0 / nn))
    est = xn.mean(-1) - xb.mean(-1)
    q = sps.t.ppf(1.0 - a, df)
    p = sps.t.sf(np.abs(est) / se, df)
    return est, est - q * se, est + q * se, p


def _session_core(means: np.ndarray, inv_r: Any, ss_within: Any, df_within: Any,
                  now_mean: Any, n_now: int, a: float, var0: Any = 0.0,
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


def mirror(bad: float, unit: str) -> float:
    """The good-side limit: the same distance as ``bad`` on the comparison scale. For ratios that is the
    log scale, so a -25 % speedup threshold mirrors to +33.3 % and a +40 % latency one to -28.6 %."""
    if unit == "%":
        return 100.0 / (1.0 + bad / 100.0) - 100.0
    return -bad


def decide(delta: Any, lo: Any, hi: Any, p: Any, bad: Any, alpha: float, unit: str = "%") -> np.ndarray:
    """The decision rule (docs/gate.md), elementwise; all arguments in natural units."""
    delta, lo, hi, p, bad = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (delta, lo, hi, p, bad)))
    good = np.vectorize(lambda b: mirror(float(b), unit), otypes=[float])(bad) if bad.size else bad
    sign = np.sign(bad)
    sig = p < alpha
    regressed = sig & (sign * delta > sign * bad)
    improved = sig & (sign * delta < sign * good)
    inside = np.where(sign < 0, (lo > bad) & (hi < good), (lo > good) & (hi < bad))
    unchanged = ~regressed & ~improved & inside
    return np.select([regressed, improved, unchanged], [REGRESSED, IMPROVED, UNCHANGED], INCONCLUSIVE)


def decision(delta: Any, lo: Any, hi: Any, p: Any, bad: Any, alpha: float, unit: str = "%") -> Decision:
    """`decide` for one verdict: its word, typed."""
    return cast(Decision, str(decide(delta, lo, hi, p, bad, alpha, unit)))


def exact_rule(d: float, bad: float, unit: str, tol: float) -> tuple[Decision, str]:
    """The verdict of a near-deterministic metric and why: its difference ``d`` against the tolerance,
    the threshold and its mirror, no p (noise too small for a t)."""
    good, sign = mirror(bad, unit), math.copysign(1.0, bad)
    if abs(d) <= tol:
        return UNCHANGED, f"|{d:.3g}| <= tolerance {tol:g}"
    if sign * d > sign * bad:
        return REGRESSED, f"worse than the {fmt_delta(bad, unit)} threshold"
    if sign * d < sign * good:
        return IMPROVED, f"better than the {fmt_delta(good, unit)} mirror threshold"
    return INCONCLUSIVE, f"beyond tolerance {tol:g} but within {fmt_delta(bad, unit)} .. {fmt_delta(good, unit)}"


def fmt_delta(x: float, unit: str) -> str:
    return f"{x:+.2f}{unit_mark(unit)}"


def explain_decision(verdict: str, delta: float, lo: float, hi: float, p: float, bad: float, alpha: float,
             unit: str, ci_level: float) -> str:
    ci = f"{ci_level:.4g}% CI {fmt_delta(lo, unit)} to {fmt_delta(hi, unit)}"
    head = f"{fmt_delta(delta, unit)} ({ci}), p={p:.3g}"
    band = f"{fmt_delta(min(bad, mirror(bad, unit)), unit)} .. {fmt_delta(max(bad, mirror(bad, unit)), unit)}"
    if verdict == REGRESSED:
        return f"{head} < {alpha:g} and beyond the {fmt_delta(bad, unit)} threshold"
    if verdict == IMPROVED:
        return f"{head} < {alpha:g} and beyond the {fmt_delta(mirror(bad, unit), unit)} mirror threshold"
    if verdict == UNCHANGED:
        extra = " (significant, but smaller than the threshold)" if p < alpha else ""
        return f"{head}; the CI lies inside {band}{extra}"
    if p < alpha:
        return f"{head}: significant but the estimate is within {band} and the CI is not; need more runs"
    return f"{head}: not significant at {alpha:g} and the CI reaches beyond {band}; need more runs"


def inconclusive_verdict(metric: str, kind: Kind, n_b: int, n_n: int, bad: float, per: Per, note: str,
                  baseline: float | None = None, now: float | None = None) -> Verdict:
    """Too little data for any rule (method "none"): ``per`` names what there was too little of."""
    return Verdict(metric, INCONCLUSIVE, baseline, now, None, None, None, None, n_b, n_n,
                   delta_unit(kind), "none", bad, note, per=per)


# ---- public API ----------------------------------------------------------------------------------


def compare(metric: str, baseline: Sequence[Sequence[float]], now: Sequence[float], *,
            kind: Kind | None = None, thresholds: Thresholds = DEFAULT_THRESHOLDS, alpha: float = 0.05,
            look: int = 1, max_looks: int = 1, prior: Prior | None = None,
            nights: NightVariance | None = None) -> Verdict:
    """One metric's verdict: ``baseline`` is a list of sessions (each a list of per-run values), ``now``
    tonight's runs. ``look``/``max_looks`` apply the sequential split (:func:`alpha_for_look`): the
    reported ``p`` is multiplied by ``max_looks`` so it stays comparable with ``alpha`` in :func:`.sequential.adjust`.
    ``prior`` moderates the variance (docs/gate.md): of the runs for a one-session baseline, of the
    session means for several sessions. ``nights`` (the profile's pooled night-to-night variance, see
    :class:`NightVariance`) compares tonight's mean with the baseline's night means, whatever their number,
    and takes precedence over ``prior``.
    """
    kind = check_kind(metric, kind)
    sessions = checked_sessions(metric, baseline, kind)
    xn_raw = checked_values(metric, now, kind, "now")
    a = alpha_for_look(alpha, look, max_looks)
    bad = thresholds.bad_side(metric, kind)
    unit = delta_unit(kind)
    by_session = len(sessions) > 1
    per: Per = SESSION if by_session else RUN
    log = "-log" if kind in LOG_KINDS else ""
    xs = [on_scale(kind, s) for s in sessions]
    xn = on_scale(kind, xn_raw)
    units_b = np.array([s.mean() for s in xs]) if by_session else (xs[0] if xs else np.array([]))
    n_b, n_n = len(units_b), len(xn)
    base_c = center(kind, units_b.mean()) if n_b else None
    now_c = center(kind, xn.mean()) if n_n else None
    what = (f"unit: session mean (baseline {n_b} sessions of {sum(len(s) for s in xs)} runs)" if by_session
            else f"unit: run (baseline 1 session of {n_b} runs)")
    var_fixed: float | None = None  # the comparison's variance split (None where a session mean has none)
    var_run: float | None = None
    df_v: float | None = None

    if n_b < 2 or n_n < 2:
        need = "sessions" if by_session else "runs"
        return inconclusive_verdict(metric, kind, n_b, n_n, bad, per,
                             f"too little data: {n_b} baseline {need}, {n_n} runs now (need 2 each); {what}",
                             base_c, now_c)

    sd_b = float(100.0 * np.std(units_b, ddof=1))  # natural units: % (log sd ≈ relative sd) or points
    sd_n = float(100.0 * np.std(xn, ddof=1))
    if max(sd_b, sd_n) <= thresholds.exact_sd:
        d = float(to_natural(kind, xn.mean() - units_b.mean()))
        # min/max so rounding in the means cannot put delta outside its own range
        lo = min(d, float(to_natural(kind, xn.min() - units_b.max())))
        hi = max(d, float(to_natural(kind, xn.max() - units_b.min())))
        v, why = exact_rule(d, bad, unit, thresholds.exact_tolerance)
        note = (f"near-deterministic (sd {sd_b:.2f}/{sd_n:.2f} <= {thresholds.exact_sd:g} {unit}): exact rule, "
                f"{fmt_delta(d, unit)} {why}; CI is the range of differences; {what}")
        return Verdict(metric, v, base_c, now_c, d, lo, hi, None, n_b, n_n, unit, EXACT, bad, note, per=per)

    if nights is not None:
        means = np.array([s.mean() for s in xs])
        ss = sum(float(((s - s.mean()) ** 2).sum()) for s in xs) + float(((xn - xn.mean()) ** 2).sum())
        dfw = sum(len(s) - 1 for s in xs) + n_n - 1
        own_w = ss / dfw if dfw > 0 else 0.0
        s_w2 = max((nights.df_within * nights.within + ss) / (nights.df_within + dfw), own_w)
        df_w = nights.df_within + dfw
        sig_n2, df_n = nights.between, nights.df_between
        whose = nights.source()
        h_b = float(np.mean([1.0 / len(s) for s in xs]))
        if (len(xs) > 1 and nights.homogeneity_p is not None and nights.homogeneity_p < HOMOGENEITY_P):
            own_b = float(np.var(means, ddof=1)) - own_w * h_b
            if own_b > sig_n2:
                sig_n2, df_n, whose = own_b, float(len(xs) - 1), "this test's own (files disagree)"
        d, lo, hi, p, var_fixed, var_run, df = _nights_core(means, h_b, xn, s_w2, df_w, sig_n2, df_n, a)
        p_rep = float(min(1.0, p * max_looks))
        d_n, lo_n, hi_n = (float(to_natural(kind, v)) for v in (d, lo, hi))
        v = decision(d_n, lo_n, hi_n, p_rep, bad, alpha, unit)
        level = 100.0 * (1.0 - 2.0 * a)
        what = (f"unit: night mean (baseline {len(xs)} night(s) of {sum(len(s) for s in xs)} runs, "
                f"{n_n} runs now); night-to-night sd {100 * math.sqrt(sig_n2):.3g} {unit} ({whose}; {df_n:.0f} df), "
                f"run sd {100 * math.sqrt(s_w2):.3g} {unit}")
        note = explain_decision(v, d_n, lo_n, hi_n, p_rep, bad, alpha, unit, level) + f"; {what}"
        if max_looks > 1:
            note += f"; look {look} of {max_looks}: p x{max_looks} (Bonferroni over looks)"
        return Verdict(metric, v, base_c, now_c, d_n, lo_n, hi_n, p_rep, len(xs), n_n, unit,
                       f"nights-t{log}", bad, note, var_fixed=var_fixed, var_run=var_run, df=df, per=NIGHT)

    if by_session:
        inv_r = np.mean([1.0 / len(s) for s in xs])
        ss = sum(float(((s - s.mean()) ** 2).sum()) for s in xs) + float(((xn - xn.mean()) ** 2).sum())
        dfw = sum(len(s) - 1 for s in xs) + n_n - 1
        d, lo, hi, p = (float(x) for x in _session_core(units_b, np.float64(inv_r), np.float64(ss), np.float64(dfw),
                                                        np.float64(xn.mean()), n_n, a,
                                                        *((prior.var, prior.df) if prior else ())))
        method = f"{'moderated-' if prior else ''}session-t{log}"
    elif prior is not None:
        d, lo, hi, p = (float(x) for x in _moderated_core(units_b, xn, prior.var, prior.df, a))
        method = f"moderated-t{log}"
        ss = float(((units_b - units_b.mean()) ** 2).sum() + ((xn - xn.mean()) ** 2).sum())
        df_v = prior.df + n_b + n_n - 2
        var_run = max((prior.df * prior.var + ss) / df_v, ss / (n_b + n_n - 2))
        var_fixed = var_run / n_b
    else:
        d, lo, hi, p = (float(x) for x in _welch_core(units_b, xn, a))
        method = f"welch{log}"
        vb, vn = float(np.var(units_b, ddof=1)) / n_b, float(np.var(xn, ddof=1))
        var_fixed, var_run = vb, vn
        den = vb ** 2 / (n_b - 1) + (vn / n_n) ** 2 / (n_n - 1)
        df_v = (vb + vn / n_n) ** 2 / den if den > 0 else float(n_b + n_n - 2)
    p_rep = float(min(1.0, float(p) * max_looks))
    d_n, lo_n, hi_n = (float(to_natural(kind, v)) for v in (d, lo, hi))
    v = decision(d_n, lo_n, hi_n, p_rep, bad, alpha, unit)
    level = 100.0 * (1.0 - 2.0 * a)
    note = explain_decision(v, d_n, lo_n, hi_n, p_rep, bad, alpha, unit, level) + f"; {what}"
    if prior is not None:
        note += f"; variance moderated by a prior from {prior.n_sources} stored baselines ({prior.df:.0f} df)"
    if max_looks > 1:
        note += f"; look {look} of {max_looks}: p x{max_looks} (Bonferroni over looks)"
    return Verdict(metric, v, base_c, now_c, d_n, lo_n, hi_n, p_rep, n_b, n_n, unit, method, bad, note,
                   var_fixed=var_fixed, var_run=var_run, df=df_v, per=per)


def not_comparable(metric: str, fields: Mapping[str, tuple[Any, Any]]) -> Verdict:
    """The verdict when the baseline was measured under different conditions (``field: (old, new)``)."""
    diff = "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in fields.items())
    try:
        unit = delta_unit(kind_of(metric))
    except ConfigError:  # a metric outside the registry: no change is shown, so its unit is never read
        unit = PERCENT
    return Verdict(metric, NOT_COMPARABLE, None, None, None, None, None, None, 0, 0, unit, "none", None,
                   f"baseline not comparable: {diff or 'comparability keys differ'}")


#: What a one-sided level may be, in words: every place that takes an alpha (options, the CLI, the gate) says it so.
ALPHA_RANGE = "a number in (0, 0.5) like 0.05"


def alpha_ok(alpha: object) -> bool:
    """Whether ``alpha`` is a one-sided level the gate can use: in (0, 0.5), so a two-sided CI 1 - 2·alpha exists."""
    return isinstance(alpha, (int, float)) and not isinstance(alpha, bool) and 0.0 < alpha < 0.5


def check_alpha(alpha: float) -> None:
    if not alpha_ok(alpha):
        raise ConfigError(f"alpha must be {ALPHA_RANGE}, got {alpha!r}")


def alpha_for_look(alpha: float, look: int, max_looks: int) -> float:
    """The one-sided level for one of ``max_looks`` planned looks: Bonferroni, ``alpha / max_looks``.

    Chosen over Pocock's constant because it needs no assumption about how runs are spaced between
    looks or how correlated the looks are, and the chance of any false call over all looks stays
    <= alpha; it costs little power for 2-3 looks (Pocock's constant for 2 looks is ~0.6 alpha vs 0.5).
    """
    check_alpha(alpha)
    if not (isinstance(max_looks, int) and max_looks >= 1 and isinstance(look, int) and 1 <= look <= max_looks):
        raise ConfigError(f"look must satisfy 1 <= look <= max_looks, got look={look!r}, max_looks={max_looks!r}")
    return alpha / max_looks
