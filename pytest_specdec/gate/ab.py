"""A base and a candidate spec config measured interleaved in one session → one verdict per metric (pure).

The candidate is judged against the base pair by pair: each pair is a base run and the candidate run next
to it, so the slow drift of a machine (and any night effect) cancels inside the pair and no stored night
enters. :func:`paired` is a one-sample t on the per-pair difference on the comparison scale (the log ratio
candidate/base for rates and latencies, the difference in points for acceptance), decided by the same rule
as :func:`.stats.compare` so an A/B verdict reads like a nightly one. A test looks after a few pairs and stops
once every gated verdict is conclusive at the level the session's end judges it (:func:`at_family_level`);
scripts/ab_simulation.py chose the looks (model: tests/sims/ab.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any, cast

import numpy as np
from scipy import stats as sps

from pytest_specdec.errors import ConfigError
from pytest_specdec.gate.kinds import (
    CANNOT_SETTLE,
    EQUIVALENCE,
    EXACT,
    GATED,
    IMPROVED,
    INCONCLUSIVE,
    MOVED,
    PAIR,
    REGRESSED,
    UNCHANGED,
    Decision,
    Stop,
)
from pytest_specdec.gate.registry import LOG_KINDS, Kind
from pytest_specdec.gate.scale import center, check_kind, checked_values, delta_unit, on_scale, to_natural
from pytest_specdec.gate.sequential import detectable
from pytest_specdec.gate.sequential import until_settled as settled_or_stop
from pytest_specdec.gate.stats import (
    DEFAULT_THRESHOLDS,
    Thresholds,
    Verdict,
    alpha_for_look,
    decide,
    decision,
    exact_rule,
    explain_decision,
    fmt_delta,
    inconclusive_verdict,
)

#: Any valid value of a kind: stands in for a missing run while the others are checked at their own index.
_STAND_IN: dict[Kind, float] = {"rate": 1.0, "latency": 1.0, "acceptance": 0.5}


def paired_core(mean: Any, var: Any, n: Any, a: float) -> tuple[np.ndarray, ...]:
    """One-sample t of per-pair differences from their mean, sample variance and count (elementwise, so a
    simulation passes whole batches): estimate, 1−2a CI and the one-sided p in the estimate's direction."""
    mean, var, n = (np.asarray(v, dtype=float) for v in (mean, var, n))
    se = np.sqrt(var / n)
    q = sps.t.ppf(1.0 - a, n - 1)
    p = sps.t.sf(np.abs(mean) / se, n - 1)
    return mean, mean - q * se, mean + q * se, p


def _usable(metric: str, kind: Kind, base: Sequence[float | None], candidate: Sequence[float | None]
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pairs with both runs, on the comparison scale, and which pairs were kept. Every value given is
    checked (a bad one raises, naming its index); a None on either side drops that pair only."""
    if any(isinstance(arm, (str, bytes)) or not isinstance(arm, Iterable) for arm in (base, candidate)):
        raise ConfigError(f"metric {metric!r}: base and candidate must be lists of per-run values")
    base, candidate = list(base), list(candidate)
    if len(base) != len(candidate):
        raise ConfigError(f"metric {metric!r}: base has {len(base)} runs and candidate {len(candidate)}; "
                          "pairs are base[i] with candidate[i], pass None for a missing run")
    keep = np.array([b is not None and c is not None for b, c in zip(base, candidate, strict=True)], dtype=bool)
    arms = [checked_values(metric, [_STAND_IN[kind] if v is None else v for v in arm], kind, where)[keep]
            for arm, where in ((base, "base"), (candidate, "candidate"))]
    return on_scale(kind, arms[0]), on_scale(kind, arms[1]), keep


def block_means(x: np.ndarray, blocks: Sequence[int | None] | None) -> np.ndarray | None:
    """The mean difference of each block of pairs, in block order, where the arms ran in blocks (one server at a
    time, `measure.schedule`) and some block holds more than one pair; None: every pair is its own unit.

    In blocks the pairs of one block share its servers and the machine's state while it ran, and the base's and
    the candidate's i-th runs are a block apart, so a drift within the block moves every pair of it alike: the
    pairs are not independent, the blocks are (the design's unit, as a cluster-randomised trial's)."""
    if blocks is None or len(blocks) != len(x) or any(b is None for b in blocks) or len(set(blocks)) == len(x):
        return None
    ids = np.asarray(blocks, dtype=int)
    return np.array([x[ids == b].mean() for b in dict.fromkeys(blocks)])


def paired(metric: str, base: Sequence[float | None], candidate: Sequence[float | None], *,
           kind: Kind | None = None, thresholds: Thresholds = DEFAULT_THRESHOLDS, alpha: float = 0.05,
           look: int = 1, max_looks: int = 1, blocks: Sequence[int | None] | None = None) -> Verdict:
    """The candidate against the base, one difference per pair ``(base[i], candidate[i])``.

    ``blocks``: each pair's block where the arms ran in blocks (`block_means`): the t is then over the blocks'
    mean differences, one unit a block, and ``var_run`` is a block mean's variance times the pairs a block holds,
    so the stop rule reads it per pair as it reads an interleaved session's.

    ``delta``/CI in % (the candidate's geometric mean ratio to the base's, minus 1) or points; ``baseline``
    and ``now`` are the base's and the candidate's centres over the pairs used; ``n_baseline`` = ``n_now``
    = pairs used. ``p`` is one-sided and multiplied by ``max_looks`` (as in ``compare``), ready for
    :func:`.sequential.adjust`. ``var_run`` is one pair's variance (``var_fixed`` 0), so ``can_settle``
    and ``detectable`` read it as they read a nightly verdict; ``mde`` is what this test alone catches at
    its look's level (the session's family adjustment recomputes it over the family).
    """
    kind = check_kind(metric, kind)
    a = alpha_for_look(alpha, look, max_looks)
    bad, unit = thresholds.bad_side(metric, kind), delta_unit(kind)
    xb, xc, keep = _usable(metric, kind, base, candidate)
    left_out = int((~keep).sum())
    n = len(xb)
    x = xc - xb
    base_c = center(kind, float(xb.mean())) if n else None
    cand_c = center(kind, float(xc.mean())) if n else None
    kept = None if blocks is None else [b for b, k in zip(blocks, keep, strict=True) if k]
    units = block_means(x, kept)
    what = (f"unit: pair of adjacent base/candidate runs ({n} pairs)" if units is None else
            f"unit: block of base/candidate pairs ({len(units)} block(s), {n} pairs: one server at a time, so a "
            "block's pairs share its servers and the machine's drift)")
    if left_out:
        what += f"; {left_out} pair(s) left out (a run missing on one side)"
    if n < 2:
        return inconclusive_verdict(metric, kind, n, n, bad, PAIR,
                                    f"too little data: {n} usable pair(s), need 2; {what}", base_c, cand_c)
    log = "-log" if kind in LOG_KINDS else ""
    sd = float(100.0 * np.std(x, ddof=1))  # natural units: % (log sd ≈ relative sd) or points
    if sd <= thresholds.exact_sd:
        d = float(to_natural(kind, x.mean()))
        lo, hi = min(d, float(to_natural(kind, x.min()))), max(d, float(to_natural(kind, x.max())))
        v, why = exact_rule(d, bad, unit, thresholds.exact_tolerance)
        note = (f"near-deterministic (sd of the pairs' differences {sd:.2f} <= {thresholds.exact_sd:g} {unit}): "
                f"exact rule, {fmt_delta(d, unit)} {why}; CI is the range of differences; {what}")
        return Verdict(metric, v, base_c, cand_c, d, lo, hi, None, n, n, unit, EXACT, bad, note, per=PAIR)
    if units is not None and len(units) < 2:
        return inconclusive_verdict(metric, kind, n, n, bad, PAIR, f"too little data: 1 block, need 2; {what}",
                                    base_c, cand_c)
    x_u = x if units is None else units
    n_u = len(x_u)
    var_u = float(np.var(x_u, ddof=1))
    var = var_u * n / n_u  # per pair: what the stop rule divides by the pairs it would have
    est, lo_s, hi_s, p = paired_core(x_u.mean(), var_u, n_u, a)
    p_rep = float(min(1.0, float(p) * max_looks))
    d_n, lo_n, hi_n = (float(to_natural(kind, v)) for v in (est, lo_s, hi_s))
    v = decision(d_n, lo_n, hi_n, p_rep, bad, alpha, unit)
    note = explain_decision(v, d_n, lo_n, hi_n, p_rep, bad, alpha, unit, 100.0 * (1.0 - 2.0 * a)) + f"; {what}"
    if max_looks > 1:
        note += f"; look {look} of {max_looks}: p x{max_looks} (Bonferroni over looks)"
    return Verdict(metric, v, base_c, cand_c, d_n, lo_n, hi_n, p_rep, n, n, unit, f"paired-t{log}", bad,
                   note, var_fixed=0.0, var_run=var, df=n_u - 1.0, per=PAIR,
                   mde=detectable(kind, bad, var_u / n_u, n_u - 1.0, a))


def until_pairs_settle(verdicts: Sequence[Verdict], n_now: int, n_max: int, alpha_look: float) -> str | None:
    """An A/B test's default stop rule (`protocol.StopRule`): the nightly's (`sequential.until_settled`: look
    again while a gated verdict is inconclusive and more pairs could settle it), and a gated verdict with too little
    data (fewer than 2 usable pairs, or pairs in 1 block) looks again while more are planned: the base is
    measured beside the candidate, so more pairs bring what the first look lacked (a thin stored baseline, the
    nightly's case, never grows)."""
    thin = any(v.family == GATED and v.verdict == INCONCLUSIVE and v.method == "none" for v in verdicts)
    return None if thin and n_now < n_max else settled_or_stop(verdicts, n_now, n_max, alpha_look)


def family_level(delta: Any, lo: Any, hi: Any, p: Any, bad: Any, alpha: float, unit: str, family_size: int
                 ) -> np.ndarray:
    """The verdict a look's figures keep whatever the other tests measure, elementwise: decided on
    ``p`` x ``family_size`` (Bonferroni over the session's planned gated family), which bounds the BH and the Holm
    adjusted p of the test's end (padded to that size) and of the session's end (no larger a family) from above.
    ``regressed``/``improved`` here stay so at both ends; ``unchanged`` never depends on p (its CI is inside
    ±threshold), so an equivalence stop stays too."""
    return decide(delta, lo, hi, np.minimum(1.0, np.asarray(p, dtype=float) * family_size), bad, alpha, unit)


def at_family_level(verdicts: Sequence[Verdict], family_size: int, alpha: float) -> list[Verdict]:
    """What a stop rule reads at an A/B look: each gated ``regressed``/``improved`` re-decided by
    :func:`family_level` (one that would not survive the family's adjustment reads ``inconclusive``, so the test
    takes more pairs instead of stopping on a verdict its end may take back); the others as they are."""
    out = []
    for v in verdicts:
        if v.family == GATED and v.verdict in MOVED and v.p is not None:
            new = cast(Decision, str(family_level(v.delta, v.ci_low, v.ci_high, v.p, v.threshold, alpha, v.unit,
                                                  family_size)))
            if new != v.verdict:
                v = dataclasses.replace(v, verdict=new, note=f"{v.note}; not {v.verdict} at p x {family_size} "
                                        "(the session's gated family), so more pairs")
        out.append(v)
    return out


def stop_kind(verdicts: Sequence[Verdict]) -> Stop:
    """Why a test stopped before its maximum, from the verdicts its stop rule read: a gated verdict regressed
    (first) or improved, all unchanged (equivalence), else an open one no more pairs could settle."""
    gated = {v.verdict for v in verdicts if v.family == GATED}
    if REGRESSED in gated:
        return REGRESSED
    if IMPROVED in gated:
        return IMPROVED
    return EQUIVALENCE if gated <= {UNCHANGED} else CANNOT_SETTLE
