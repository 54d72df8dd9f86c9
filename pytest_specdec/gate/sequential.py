"""Many metrics and more runs (pure functions): the p-value adjustment over a session's family
(Benjamini-Hochberg or Holm), the planned looks and whether another one can change a gated verdict, and
the smallest change a baseline can catch. The level of one look (:func:`.stats.alpha_for_look`) stays
beside :func:`.stats.compare`, which applies it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from scipy import special
from scipy import stats as sps

from pytest_specdec.errors import ConfigError
from pytest_specdec.gate.kinds import GATED, INCONCLUSIVE, NOT_COMPARABLE, POINTS
from pytest_specdec.gate.registry import LOG_KINDS, Kind
from pytest_specdec.gate.scale import to_natural, to_scale
from pytest_specdec.gate.stats import Verdict, alpha_for_look, check_alpha, decision


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
    check_alpha(alpha)
    idx = [i for i, v in enumerate(verdicts) if v.p is not None and v.verdict != NOT_COMPARABLE]
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
    unseen = f" ({m - len(idx)} without a p-value, taken as p=1: not measured yet, or exact)" if m > len(idx) else ""
    for i, pa in zip(idx, padj, strict=True):
        v = verdicts[i]
        new = decision(v.delta, v.ci_low, v.ci_high, pa, v.threshold, alpha, v.unit)
        change = f", {v.verdict} -> {new}" if new != v.verdict else ""
        note = f"{v.note}; {name} over {m} tests{unseen}: p {v.p:.3g} -> {pa:.3g}{change}"
        out[i] = dataclasses.replace(v, verdict=new, p=float(pa), note=note)
    return out


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
        if v.family != GATED or v.verdict != INCONCLUSIVE or n_now >= max_runs:
            continue
        if v.var_fixed is None:
            if v.p is not None and should_continue(v, n_now, max_runs):
                return True
        elif can_settle(v, max_runs, alpha_look):
            return True
    return False


def until_settled(verdicts: Sequence[Verdict], n_now: int, n_max: int, alpha_look: float) -> str | None:
    """The default stop rule (`protocol.StopRule`): look again while a gated verdict is inconclusive and more
    runs could settle it (:func:`next_look_useful`); else why it stops."""
    if next_look_useful(verdicts, n_now, n_max, alpha_look):
        return None
    open_ = [v.metric for v in verdicts if v.family == GATED and v.verdict == INCONCLUSIVE]
    return (f"{', '.join(open_)} inconclusive, but {n_max} runs could not settle it" if open_
            else "every gated verdict is conclusive")


def next_look(looks: Sequence[int], look: int, n_now: int, verdicts: Sequence[Verdict], alpha: float,
              stop: Callable[[Sequence[Verdict], int, int, float], str | None]) -> tuple[int | None, str]:
    """After look ``look`` (1-based) of the planned ``looks`` (runs per arm at each), with ``n_now`` runs and
    these ``verdicts``: the runs of the next look, or None and why it stops before its planned runs ("" when
    the planned runs are all taken). ``stop`` (a `protocol.StopRule`) is asked at this look's level."""
    if look >= len(looks) or n_now >= looks[-1]:
        return None, ""
    why = stop(verdicts, n_now, looks[-1], alpha_for_look(alpha, look, len(looks)))
    return (looks[look], "") if why is None else (None, why)


def should_continue(verdict: Verdict, n_now: int, max_runs: int) -> bool:
    """True when more interleaved runs could settle an inconclusive verdict: under the run budget, and the
    baseline has the 2 units a test needs (more runs tonight cannot fix a thin baseline)."""
    return verdict.verdict == INCONCLUSIVE and n_now < max_runs and verdict.n_baseline >= 2


def can_settle(v: Verdict, n_max: int, alpha: float) -> bool:
    """Whether ``n_max`` runs per arm could turn an inconclusive verdict into a conclusive one, taking the
    estimate where it is now: its CI inside ±threshold, or significant and beyond the threshold."""
    if v.verdict != INCONCLUSIVE or v.var_fixed is None or v.var_run is None or v.delta is None:
        return False
    kind: Kind = "acceptance" if v.unit == POINTS else "rate"  # only the scale matters: both log kinds share it
    return bool(settle_possible(to_scale(kind, v.delta), to_scale(kind, v.threshold or 0.0), v.var_fixed,
                                v.var_run, v.df or 1.0, v.n_now, n_max, alpha))


def settle_possible(delta: Any, threshold: Any, var_fixed: Any, var_run: Any, df: Any, n_now: Any, n_max: int,
                    alpha: float) -> np.ndarray:
    """:func:`can_settle`'s rule, elementwise on the comparison scale (a simulation passes whole batches): with
    ``n_max`` runs and the estimate where it is, the CI fits inside ±threshold or clears it."""
    se = np.sqrt(np.asarray(var_fixed, dtype=float) + np.asarray(var_run, dtype=float) / n_max)
    dof = np.asarray(df, dtype=float) + np.maximum(0, n_max - np.asarray(n_now))  # the extra runs add their df
    q = special.stdtrit(dof, 1.0 - alpha) * se
    d, thr = np.abs(np.asarray(delta, dtype=float)), np.abs(np.asarray(threshold, dtype=float))
    return (d + q < thr) | ((d > thr) & (d > q))


def detectable(kind: Kind, bad: float, var: float, df: float, alpha: float, power: float = 0.9) -> float:
    """The smallest bad-side change (magnitude, natural units) that is called ``regressed`` with
    probability ``power`` when tests are at one-sided level ``alpha``: the estimate must be significant
    and beyond the threshold, so the effect must exceed max(threshold, t_α·se) by t_power·se."""
    se = math.sqrt(var)
    thr = abs(to_scale(kind, bad))
    eff = max(thr, float(special.stdtrit(df, 1.0 - alpha)) * se) + float(special.stdtrit(df, power)) * se
    if kind in LOG_KINDS and bad > 0 and eff > 700.0:  # exp would overflow: no rise is caught at all
        return math.inf
    sign = math.copysign(1.0, bad)
    return abs(float(to_natural(kind, sign * eff)))
