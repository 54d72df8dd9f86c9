"""The noise model of pytest_specdec.gate.stats' simulation: synthetic per-run values of simulated suites, and
the verdicts ``stats.compare`` and ``stats.adjust`` give them, computed for whole batches at once.

tests/unit/test_stats.py checks the false-alarm rate and power on it at a small size (and that this batch path
agrees with the per-metric API); scripts/stats_simulation.py prints the full-size figures from it.
Values are drawn directly on the comparison scale (log for rates and latencies, raw rate for acceptance).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pytest_specdec.gate.registry import Kind
from pytest_specdec.gate.scale import to_natural
from pytest_specdec.gate.sequential import adjusted_p
from pytest_specdec.gate.stats import (
    DEFAULT_THRESHOLDS,
    _moderated_core,
    _session_core,
    _welch_core,
    alpha_for_look,
)
from pytest_specdec.gate.stats import decide as decide_each
from pytest_specdec.gate.variance import estimate_prior

# The six metrics of one simulated benchmark test.
METRICS: tuple[tuple[str, Kind], ...] = (
    ("speedup", "rate"), ("output_tok_s", "rate"), ("reference_tok_s", "rate"),
    ("acceptance_rate", "acceptance"), ("tpot_p95_ms", "latency"), ("ttft_p95_ms", "latency"),
)
COL = {name: i for i, (name, _) in enumerate(METRICS)}
DROP_10 = math.log(0.9)  # a true 10 % throughput drop on the log scale


@dataclass(frozen=True)
class Noise:
    """sd on the comparison scale: log (≈ relative) for rates/latencies, rate units for acceptance.

    ``shared_night``: one night effect per session for the whole machine (all tests move together),
    instead of an independent one per test.
    """

    run_log: float = 0.03
    night_log: float = 0.0
    run_acc: float = 0.01
    night_acc: float = 0.0
    shared_night: bool = False
    hetero: float = 1.0  # each test's run sd is the above x exp(U(-log h, log h)): heterogeneous noise
    shift_all: float = 0.0  # a fixed shift of every rate (log) tonight, e.g. -0.03: a slower night


Draws = dict[str, tuple[np.ndarray, np.ndarray]]


def draw(rng: np.random.Generator, suites: int, tests: int, *, runs_base: int = 5, runs_now: int = 5,
         sessions: int = 1, noise: Noise = Noise(), shift: dict[str, float] | None = None,
         shift_tests: int | None = None) -> Draws:
    """metric → (baseline (suites, tests, sessions, runs), now (suites, tests, runs)).

    Tonight gets its own night effect. ``shift`` adds a true change (scale units) to tonight's runs of
    the first ``shift_tests`` tests (all when None).
    """
    out: Draws = {}
    nt = 1 if noise.shared_night else tests
    for name, kind in METRICS:
        run_sd, night_sd = ((noise.run_acc, noise.night_acc) if kind == "acceptance"
                            else (noise.run_log, noise.night_log))
        if noise.hetero > 1.0:
            h = math.log(noise.hetero)
            run_sd = run_sd * np.exp(rng.uniform(-h, h, (suites, tests, 1)))
        base = rng.normal(0.0, run_sd[..., None] if np.ndim(run_sd) else run_sd, (suites, tests, sessions, runs_base))
        now = rng.normal(0.0, run_sd, (suites, tests, runs_now))
        if noise.shift_all and kind == "rate":
            now += noise.shift_all
        if night_sd:
            base += rng.normal(0.0, night_sd, (suites, nt, sessions, 1))
            now += rng.normal(0.0, night_sd, (suites, nt, 1))
        if shift and name in shift:
            now[:, : (tests if shift_tests is None else shift_tests)] += shift[name]
        out[name] = (base, now)
    return out


def priors(base: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per suite, the empirical-Bayes prior (var, df) from its tests' baselines, as the plugin estimates it
    from the profile's stored baseline files: within-session run variance for one session, else the
    variance of session means. No prior (df 0) when ``estimate_prior`` gives none."""
    suites, tests, sessions, runs_base = base.shape
    if sessions == 1:
        v, d = base[:, :, 0, :].var(-1, ddof=1), runs_base - 1
    else:
        v, d = base.mean(-1).var(-1, ddof=1), sessions - 1
    var0, df0 = np.ones(suites), np.zeros(suites)
    for s in range(suites):
        pr = estimate_prior(v[s], np.full(tests, d))
        if pr is not None:
            var0[s], df0[s] = pr.var, pr.df
    return var0[:, None], df0[:, None]


def natural(draws: Draws, *, runs_now: int | None = None, alpha: float = 0.05, look: int = 1,
            max_looks: int = 1, pool_sessions: bool = False, moderate: bool = False) -> tuple[np.ndarray, ...]:
    """(delta, ci_low, ci_high, p, threshold), each (suites, tests, 6), as ``compare`` computes them.

    ``runs_now`` uses only tonight's first runs (a sequential look); ``pool_sessions`` compares a
    multi-session baseline run by run (the wrong unit, shown for contrast); ``moderate`` shrinks the
    variances towards the suite's empirical-Bayes prior (``compare(prior=...)``).
    """
    cols: list[list[np.ndarray]] = [[], [], [], [], []]
    a = alpha_for_look(alpha, look, max_looks)
    for name, kind in METRICS:
        base, now = draws[name]
        now = now[..., :runs_now] if runs_now else now
        n_now, (suites, tests, sessions, runs_base) = now.shape[-1], base.shape
        if moderate and sessions == 1:  # the plugin moderates the run unit only (see verdicts.evaluate)
            var0, df0 = priors(base)
        if sessions == 1 and moderate:
            d, lo, hi, p = _moderated_core(base[:, :, 0, :], now, var0, df0, a)
        elif sessions == 1 or pool_sessions:
            d, lo, hi, p = _welch_core(base.reshape(suites, tests, -1), now, a)
        else:
            means = base.mean(axis=-1)
            ss = (((base - means[..., None]) ** 2).sum(axis=(-1, -2))
                  + ((now - now.mean(-1, keepdims=True)) ** 2).sum(-1))
            dfw = np.full(ss.shape, sessions * (runs_base - 1) + n_now - 1, dtype=float)
            d, lo, hi, p = _session_core(means, np.float64(1.0 / runs_base), ss, dfw, now.mean(-1), n_now, a,
                                         )
        vals = (to_natural(kind, d), to_natural(kind, lo), to_natural(kind, hi), np.minimum(1.0, p * max_looks),
                np.full(d.shape, DEFAULT_THRESHOLDS.bad_side(name, kind)))
        for col, v in zip(cols, vals, strict=True):
            col.append(v)
    return tuple(np.stack(c, -1) for c in cols)


def decide(nat: tuple[np.ndarray, ...], method: str = "bh", alpha: float = 0.05) -> np.ndarray:
    """Verdicts (suites, tests, 6) after BH/Holm over each suite ("none": unadjusted): batch ``adjust``."""
    delta, lo, hi, p, bad = nat
    if method != "none":
        p = adjusted_p(p.reshape(p.shape[0], -1), method).reshape(p.shape)
    return decide_each(delta, lo, hi, p, bad, alpha)


def sequential(draws: Draws, looks: tuple[int, ...], alpha: float = 0.05, moderate: bool = False
               ) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    """Each test stops at the first look where none of its metrics is inconclusive (own verdicts, before
    the session's adjustment), else at the last look; returns the figures it stopped with and its runs."""
    k = len(looks)
    final: tuple[np.ndarray, ...] | None = None
    runs = None
    for i, n in enumerate(looks, start=1):
        nat = natural(draws, runs_now=n, alpha=alpha, look=i, max_looks=k, moderate=moderate)
        if final is None:
            final, runs = nat, np.full(nat[0].shape[:2], n)
            going = (decide(nat, "none", alpha) == "inconclusive").any(-1)
            continue
        final = tuple(np.where(going[..., None], new, old) for new, old in zip(nat, final, strict=True))
        runs = np.where(going, n, runs)
        going &= (decide(nat, "none", alpha) == "inconclusive").any(-1)
    assert final is not None and runs is not None
    return final, runs


def bad_side_rate(nat: tuple[np.ndarray, ...], alpha: float = 0.05) -> float:
    delta, _lo, _hi, p, bad = nat
    return float(((p < alpha) & (np.sign(bad) * delta > 0)).mean())


def any_regressed(verdicts: np.ndarray) -> float:
    """Share of suites where any test x metric is ``regressed``."""
    return float((verdicts == "regressed").any(axis=(1, 2)).mean())
