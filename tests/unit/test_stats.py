"""stats.py: every verdict branch, the sign conventions, input checks, p-value adjustment, look splitting,
and (with fixed seeds, marked slow) the simulated false-alarm rate and power that scripts/stats_simulation.py
prints, on the same model (tests/sims/stats.py)."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from scipy.stats import false_discovery_control
from sims import stats as sim

from pytest_specdec.errors import ConfigError
from pytest_specdec.gate.scale import kind_of
from pytest_specdec.gate.sequential import adjust, adjusted_p, planned_looks, should_continue
from pytest_specdec.gate.slo import check_slo
from pytest_specdec.gate.stats import Thresholds, Verdict, alpha_for_look, compare, not_comparable
from pytest_specdec.measure.metrics import harrell_davis_p95
from pytest_specdec.output.results import verdict_entry

BASE = [100.0, 101.0, 99.0, 100.5, 99.5]  # tok/s, ~0.8 % run noise
JITTER = np.array([0.0, 1.0, -1.0, 0.5, -0.5]) / 100  # the same relative noise for "now"


def scaled(factor: float, values: list[float] = BASE) -> list[float]:
    return [v * factor for v in values]


# ---- kinds and thresholds -------------------------------------------------------------------------


def test_kind_of() -> None:
    assert kind_of("speedup") == "rate"
    assert kind_of("acceptance_rate") == "acceptance"
    assert kind_of("per_position_acceptance[2]") == "acceptance"
    assert kind_of("tpot_p95_ms") == "latency"
    assert kind_of("queue_p95_ms") == "latency"
    with pytest.raises(ConfigError, match="'mystery'.*kind="):
        kind_of("mystery")


def test_thresholds_signs_and_overrides() -> None:
    t = Thresholds(per_metric={"speedup": 3.0})
    assert t.bad_side("output_tok_s", "rate") == -5.0
    assert t.bad_side("speedup", "rate") == -3.0
    assert t.bad_side("acceptance_rate", "acceptance") == -2.0
    assert t.bad_side("tpot_p95_ms", "latency") == 10.0


@pytest.mark.parametrize("kw", [{"rate_pct": 0}, {"latency_pct": -1}, {"exact_sd": 0},
                                {"per_metric": {"x": float("nan")}}, {"exact_tolerance": 2.0},
                                {"exact_tolerance": -0.1}])
def test_thresholds_rejects_bad_values(kw: dict) -> None:
    with pytest.raises(ConfigError, match="Thresholds"):
        Thresholds(**kw)


# ---- verdict branches and conventions -------------------------------------------------------------


def test_regressed_rate_and_ci_direction() -> None:
    v = compare("output_tok_s", [BASE], scaled(0.9))
    assert v.verdict == "regressed"
    assert v.unit == "%" and v.threshold == -5.0 and (v.method, v.per) == ("welch-log", "run")
    assert v.delta == pytest.approx(-10.0, abs=0.01)  # a relative change of the geometric means
    assert v.ci_low < v.delta < v.ci_high < -5.0
    assert v.now / v.baseline - 1 == pytest.approx(v.delta / 100)
    assert v.p < 0.05 and (v.n_baseline, v.n_now) == (5, 5)
    assert "unit: run" in v.note and "90% CI" in v.note


def test_improved_rate() -> None:
    v = compare("speedup", [scaled(0.01)], scaled(0.011))
    assert v.verdict == "improved" and v.delta == pytest.approx(10.0, abs=0.01) and 5.0 < v.ci_low


def test_unchanged_rate() -> None:
    v = compare("output_tok_s", [BASE], [b * (1 + j) for b, j in zip(BASE, JITTER[::-1], strict=True)])
    assert v.verdict == "unchanged" and -5.0 < v.ci_low < v.ci_high < 5.0


def test_small_significant_change_is_not_a_regression() -> None:
    base = [100.0, 100.4, 99.6, 100.2, 99.8]  # 0.3 % noise (above the 0.1 % near-deterministic limit)
    v = compare("output_tok_s", [base], scaled(0.98, base))  # -2 %, tiny noise: highly significant
    assert v.p < 1e-4 and v.verdict == "unchanged"
    assert "significant, but smaller than the threshold" in v.note
    # -4.5 % with enough noise that the CI crosses -5 %: significant, still not a regression.
    v = compare("output_tok_s", [BASE], scaled(0.955))
    assert v.p < 0.05 and v.ci_low < -5.0 and v.verdict == "inconclusive"
    assert "significant but the estimate is within" in v.note


def test_inconclusive_when_noisy() -> None:
    noisy = [100.0, 120.0, 85.0, 110.0, 90.0]
    v = compare("output_tok_s", [noisy], scaled(0.93, noisy))
    assert v.verdict == "inconclusive" and v.p > 0.05 and v.ci_low < -5.0
    assert should_continue(v, n_now=5, max_runs=9)


def test_latency_is_lower_is_better() -> None:
    base = [20.0, 20.4, 19.6, 20.2, 19.8]
    worse = compare("tpot_p95_ms", [base], scaled(1.2, base))
    assert worse.verdict == "regressed" and worse.threshold == 10.0
    assert 10.0 < worse.ci_low < worse.delta < worse.ci_high and worse.delta == pytest.approx(20.0, abs=0.01)
    better = compare("tpot_p95_ms", [base], scaled(0.8, base))
    assert better.verdict == "improved" and better.delta == pytest.approx(-20.0, abs=0.01)
    assert compare("tpot_p95_ms", [base], scaled(1.05, base)).verdict == "unchanged"  # within +10 %


def test_acceptance_in_points_with_welch() -> None:
    base = [0.70, 0.71, 0.69, 0.705, 0.695]
    v = compare("acceptance_rate", [base], [b - 0.05 for b in base])
    assert v.verdict == "regressed" and v.unit == "points" and (v.method, v.per) == ("welch", "run")
    assert v.delta == pytest.approx(-5.0) and v.ci_high < -2.0
    assert v.baseline == pytest.approx(0.70) and v.now == pytest.approx(0.65)
    assert compare("acceptance_rate", [base], [b - 0.005 for b in base]).verdict == "unchanged"


@pytest.mark.parametrize(("now", "verdict"), [
    ([0.6, 0.6, 0.6], "regressed"),  # a 10-point drop at temperature 0
    ([0.7, 0.7, 0.7], "unchanged"),
    ([0.703, 0.703, 0.703], "unchanged"),  # within the 0.5-point tolerance
    ([0.69, 0.69, 0.69], "inconclusive"),  # beyond the tolerance, within the 2-point threshold
    ([0.8, 0.8, 0.8], "improved"),
    ([0.6, 0.6005, 0.5995], "regressed"),  # sd 0.05 points: still near-deterministic
])
def test_near_deterministic_acceptance(now: list[float], verdict: str) -> None:
    v = compare("acceptance_rate", [[0.7, 0.7, 0.7]], now)
    assert v.verdict == verdict and (v.method, v.per) == ("exact", "run") and v.exact and v.p is None
    assert "near-deterministic" in v.note
    assert v.ci_low <= v.delta <= v.ci_high


def test_one_sided_zero_variance_uses_welch() -> None:
    v = compare("acceptance_rate", [[0.7, 0.7, 0.7]], [0.60, 0.62, 0.58])
    assert (v.method, v.per) == ("welch", "run") and v.verdict == "regressed"


@pytest.mark.parametrize(("baseline", "now"), [
    ([[100.0]], [100.0, 101.0]),
    ([[100.0, 101.0]], [100.0]),
    ([], [100.0, 101.0]),
    ([[]], [100.0, 101.0]),
    ([[100.0, 101.0]], []),
    ([[100.0], [101.0]], [99.0]),  # two sessions but one run tonight
])
def test_too_little_data_is_inconclusive(baseline: list, now: list) -> None:
    v = compare("output_tok_s", baseline, now)
    assert v.verdict == "inconclusive" and v.p is None and "too little data" in v.note


@pytest.mark.parametrize(("baseline", "now", "match"), [
    ([[100.0, float("nan")]], [100.0, 101.0], r"'output_tok_s'.*baseline\[0\]\[1\].*NaN"),
    ([[100.0, 101.0]], [100.0, None], r"'output_tok_s'.*now\[1\] is None"),
    ([[100.0, 101.0]], [100.0, math.inf], r"'output_tok_s'.*now\[1\]"),
    ([[100.0, 101.0]], [100.0, -1.0], r"'output_tok_s'.*must be > 0"),
    ([100.0, 101.0], [100.0, 101.0], r"'output_tok_s'.*list of sessions"),
])
def test_bad_values_rejected(baseline: list, now: list, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        compare("output_tok_s", baseline, now)


def test_explicit_kind() -> None:
    assert compare("custom", [[0.5, 0.52]], [0.3, 0.31], kind="acceptance").unit == "points"
    with pytest.raises(ConfigError, match="'custom'.*kind must be"):
        compare("custom", [[0.5, 0.52]], [0.3, 0.31], kind="ratio")  # type: ignore[arg-type]  # bad kind on purpose


def test_acceptance_out_of_range_rejected() -> None:
    with pytest.raises(ConfigError, match=r"'draft_coverage'.*\[0, 1\]"):
        compare("draft_coverage", [[0.5, 0.6]], [0.5, 1.2])


def test_session_unit_absorbs_night_to_night_shift() -> None:
    nights = [scaled(f) for f in (1.0, 1.06, 0.95, 1.03, 0.97)]  # ~4 % between nights, 0.8 % within
    tonight = scaled(0.94)
    by_session = compare("output_tok_s", nights, tonight)
    assert (by_session.method, by_session.per) == ("session-t-log", "session") and by_session.n_baseline == 5
    assert "unit: session mean (baseline 5 sessions of 25 runs)" in by_session.note
    assert by_session.verdict == "inconclusive"  # -6 % is within what nights do
    assert by_session.baseline == pytest.approx(math.exp(np.mean([np.log(s).mean() for s in nights])))
    # The same runs pooled as one session would call it a regression.
    assert compare("output_tok_s", [sum(nights, [])], tonight).verdict == "regressed"
    # A drop well beyond the nights' spread is still found.
    assert compare("output_tok_s", nights, scaled(0.8)).verdict == "regressed"


def test_not_comparable() -> None:
    v = not_comparable("speedup", {"model": ("a", "b"), "k": (3, 4)})
    assert v.verdict == "not-comparable" and v.p is None and v.unit == "%"
    assert "model: 'a' -> 'b'; k: 3 -> 4" in v.note


def test_verdict_is_frozen_and_json_able() -> None:
    v = compare("output_tok_s", [BASE], scaled(0.9))
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.verdict = "unchanged"  # type: ignore[misc]  # writing a frozen field on purpose: the error is under test
    # the results file's entry of it (the one writer of a verdict)
    d = json.loads(json.dumps(verdict_entry(v)))
    assert d["verdict"] == "regressed" and d["p"] == v.p and d["ci"] == [v.ci_low, v.ci_high]


# ---- adjustment ------------------------------------------------------------------------------------


def _pv(p: float, delta: float = -10.0, verdict: str = "regressed") -> Verdict:
    return Verdict("output_tok_s", verdict, 100.0, 90.0, delta, delta - 3, delta + 3, p, 5, 5, "%",
                   "welch-log", -5.0, "n")


def test_adjust_bh_matches_scipy_and_redecides() -> None:
    ps = [0.001, 0.03, 0.045, 0.3]  # BH: 0.004, 0.06, 0.06, 0.3
    vs = [_pv(p, verdict="regressed" if p < 0.05 else "inconclusive") for p in ps]
    vs.append(not_comparable("speedup", {"k": (3, 4)}))
    vs.append(compare("acceptance_rate", [[0.7, 0.7]], [0.6, 0.6]))  # exact rule: no p
    out = adjust(vs)
    want = false_discovery_control(ps)
    assert [o.p for o in out[:4]] == pytest.approx(list(want))
    assert [o.verdict for o in out[:4]] == ["regressed", "inconclusive", "inconclusive", "inconclusive"]
    assert out[4] == vs[4] and out[5] == vs[5]
    assert "Benjamini-Hochberg over 4 tests" in out[1].note and "regressed -> inconclusive" in out[1].note


def test_adjust_holm() -> None:
    ps = np.array([0.01, 0.04, 0.03, 0.005])
    # sorted 0.005, 0.01, 0.03, 0.04 → x4, x3, x2, x1 = 0.02, 0.03, 0.06, 0.04 → running max
    want = {0.005: 0.02, 0.01: 0.03, 0.03: 0.06, 0.04: 0.06}
    assert list(adjusted_p(ps, "holm")) == pytest.approx([want[p] for p in ps])
    out = adjust([_pv(p) for p in ps], method="holm")
    assert [o.verdict for o in out] == ["regressed", "inconclusive", "inconclusive", "regressed"]
    assert "Holm over 4 tests" in out[0].note


def test_adjust_keeps_unchanged_and_validates() -> None:
    v = _pv(0.5, delta=0.0, verdict="unchanged")
    assert adjust([v, _pv(0.001)])[0].verdict == "unchanged"
    assert adjust([]) == []
    with pytest.raises(ConfigError, match="'bonferroni'"):
        adjust([v], method="bonferroni")
    with pytest.raises(ConfigError, match="alpha"):
        adjust([v], alpha=0.7)


# ---- sequential looks ------------------------------------------------------------------------------


def test_alpha_for_look_is_bonferroni() -> None:
    assert alpha_for_look(0.05, 1, 1) == 0.05
    assert alpha_for_look(0.05, 1, 2) == alpha_for_look(0.05, 2, 2) == 0.025
    for look, max_looks in [(0, 2), (3, 2), (1, 0)]:
        with pytest.raises(ConfigError, match="look"):
            alpha_for_look(0.05, look, max_looks)


def test_compare_applies_the_look_split() -> None:
    one = compare("output_tok_s", [BASE], scaled(0.96))
    two = compare("output_tok_s", [BASE], scaled(0.96), look=1, max_looks=2)
    assert two.p == pytest.approx(2 * one.p)
    assert two.ci_low < one.ci_low and two.ci_high > one.ci_high  # 95 % instead of 90 %
    assert "95% CI" in two.note and "look 1 of 2" in two.note


def test_planned_looks_and_should_continue() -> None:
    assert planned_looks(3, 2, 9) == [3, 5, 7, 9]
    assert planned_looks(3, 2, 8) == [3, 5, 7, 8]
    with pytest.raises(ConfigError):
        planned_looks(5, 2, 3)
    inc = compare("output_tok_s", [[100.0, 120.0, 85.0]], [95.0, 110.0])
    assert inc.verdict == "inconclusive"
    assert should_continue(inc, 2, 7) and not should_continue(inc, 7, 7)
    thin = compare("output_tok_s", [[100.0]], [95.0, 110.0])
    assert not should_continue(thin, 2, 7)  # more runs tonight cannot fix a one-run baseline
    assert not should_continue(compare("output_tok_s", [BASE], scaled(0.9)), 5, 9)


# ---- P95 and SLOs ---------------------------------------------------------------------------------


def test_harrell_davis_p95() -> None:
    x = np.random.default_rng(0).exponential(size=4000)
    assert harrell_davis_p95(x) == pytest.approx(math.log(20), rel=0.05)
    assert harrell_davis_p95([]) is None
    assert harrell_davis_p95([3.0]) == 3.0
    assert min(x[:50]) < harrell_davis_p95(x[:50]) < max(x[:50])
    with pytest.raises(ConfigError, match="finite"):
        harrell_davis_p95([1.0, float("nan")])
    with pytest.raises(ConfigError, match="None"):
        harrell_davis_p95([1.0, None])  # type: ignore[list-item]  # a None on purpose: the error is under test


def test_check_slo() -> None:
    r = check_slo("speedup", [1.0, 4.0], ">=", 1.5)
    assert r.passed and r.value == pytest.approx(2.0) and "geometric mean 2 over 2 runs >= 1.5: pass" in r.message
    r = check_slo("acceptance_rate", [0.5, 0.6], ">=", 0.6)
    assert not r.passed and r.statistic == "mean" and "FAIL" in r.message
    r = check_slo("tpot_p95_ms", [10.0, 12.0, 90.0], "<=", 20.0)
    assert r.passed and r.value == 12.0 and "median" in r.message
    r = check_slo("speedup", [], ">=", 1.5)
    assert not r.passed and r.value is None and "no values" in r.message
    with pytest.raises(ConfigError, match="operator"):
        check_slo("speedup", [2.0], "=>", 1.5)
    with pytest.raises(ConfigError, match="'speedup'.*NaN"):
        check_slo("speedup", [float("nan")], ">=", 1.5)
    assert check_slo("speedup", [2.0], ">", 1.5).passed is True


# ---- simulations (fixed seeds, calibration: slow; full size: scripts/stats_simulation.py) ----------


def test_batch_path_matches_compare_and_adjust() -> None:
    rng = np.random.default_rng(7)
    for sessions, noise in [(1, sim.Noise()), (3, sim.Noise(night_log=0.03, night_acc=0.01))]:
        draws = sim.draw(rng, 2, 4, sessions=sessions, noise=noise, shift={"output_tok_s": -0.08},
                         shift_tests=2)
        batch = sim.decide(sim.natural(draws))
        for s in range(2):
            vs = []
            for name, kind in sim.METRICS:
                base, now = draws[name]
                to = (lambda x: 0.7 + x) if kind == "acceptance" else np.exp  # back to natural values
                for t in range(4):
                    vs.append(compare(name, [list(to(r)) for r in base[s, t]], list(to(now[s, t]))))
            got = np.array([v.verdict for v in adjust(vs)]).reshape(len(sim.METRICS), 4).T
            assert (got == batch[s]).all()


@pytest.mark.slow
def test_aa_false_alarms_single_session() -> None:
    rng = np.random.default_rng(11)
    v = sim.decide(sim.natural(sim.draw(rng, 1000, 30)))
    assert sim.any_regressed(v) <= 0.05


@pytest.mark.slow
def test_aa_false_alarms_with_night_effects() -> None:
    rng = np.random.default_rng(12)
    noise = sim.Noise(night_log=0.03, night_acc=0.01)
    v = sim.decide(sim.natural(sim.draw(rng, 1000, 30, sessions=4, noise=noise)))
    assert sim.any_regressed(v) <= 0.05


@pytest.mark.slow
def test_aa_false_alarms_with_sequential_looks() -> None:
    rng = np.random.default_rng(13)
    nat, runs = sim.sequential(sim.draw(rng, 1000, 30, runs_now=7), (3, 5, 7))
    assert sim.any_regressed(sim.decide(nat)) <= 0.05 and 3 <= runs.mean() <= 7


@pytest.mark.slow
def test_one_sided_tests_are_calibrated() -> None:
    rng = np.random.default_rng(14)
    for kw in ({}, {"sessions": 5, "noise": sim.Noise(night_log=0.03, night_acc=0.01)}):
        rate = sim.bad_side_rate(sim.natural(sim.draw(rng, 500, 30, **kw)))  # 90 000 metric tests, MC se 0.07 %
        assert 0.04 <= rate <= 0.055


@pytest.mark.slow
def test_power_for_a_ten_percent_drop() -> None:
    rng = np.random.default_rng(15)
    col = sim.COL["output_tok_s"]
    v = sim.decide(sim.natural(sim.draw(rng, 1000, 1, shift={"output_tok_s": sim.DROP_10})), "none")
    assert (v[:, 0, col] == "regressed").mean() >= 0.90
    v = sim.decide(sim.natural(sim.draw(rng, 1000, 1, runs_base=3, runs_now=3,
                                        shift={"output_tok_s": sim.DROP_10})), "none")
    assert (v[:, 0, col] == "regressed").mean() >= 0.90


def test_session_unit_with_a_different_number_of_runs_tonight() -> None:
    nights = [scaled(f) for f in (1.0, 1.02, 0.98)]
    v = compare("output_tok_s", nights, scaled(0.8)[:3])
    assert (v.method, v.per) == ("session-t-log", "session") and v.verdict == "regressed" and v.n_now == 3
    same = compare("acceptance_rate", [[0.7, 0.7], [0.7, 0.7, 0.7]], [0.7, 0.7])
    assert (same.method, same.per) == ("exact", "session") and same.verdict == "unchanged"


# ---- moderated variance and the session-wide family ----------------------------------------------


def test_estimate_prior_recovers_a_common_variance_and_gives_few_df_when_variances_differ() -> None:
    from pytest_specdec.gate.variance import estimate_prior

    rng = np.random.default_rng(3)
    same = rng.normal(0, 0.03, (200, 5)).var(axis=1, ddof=1)
    prior = estimate_prior(same, [4] * 200)
    assert prior is not None and prior.var == pytest.approx(0.03**2, rel=0.15) and prior.df > 50
    sds = 0.03 * np.exp(rng.uniform(-np.log(3), np.log(3), 200))
    mixed = (rng.normal(0, 1, (200, 5)) * sds[:, None]).var(axis=1, ddof=1)
    low = estimate_prior(mixed, [4] * 200)
    assert low is not None and low.df < 10
    assert estimate_prior([0.001, 0.002], [4, 4]) is None  # too few sources


def test_moderation_adds_df_but_never_shrinks_a_noisy_test() -> None:
    from pytest_specdec.gate.variance import Prior

    base = [100.0, 103.0, 97.0, 101.5, 98.5]  # ~2.4 % noise
    now = scaled(0.9, [98.0, 102.0, 99.0, 101.0, 100.0])
    plain = compare("output_tok_s", [base], now)
    mod = compare("output_tok_s", [base], now, prior=Prior(var=0.024**2, df=100, n_sources=30))
    assert (mod.method, mod.per) == ("moderated-t-log", "run") and "prior from 30 stored baselines" in mod.note
    assert mod.p < plain.p  # same data, more df
    # A prior far quieter than this test's own noise must not make it look significant.
    noisy = [100.0, 120.0, 85.0, 110.0, 90.0]
    v = compare("output_tok_s", [noisy], scaled(0.93, noisy), prior=Prior(var=0.001**2, df=1000))
    assert v.verdict == "inconclusive" and v.p > 0.05


def test_adjust_pads_the_family_and_stays_monotone() -> None:
    vs = [compare("output_tok_s", [BASE], scaled(f)) for f in (0.9, 0.93, 1.0)]
    alone = adjust(vs)
    padded = adjust(vs, family_size=40)
    assert "37 without a p-value, taken as p=1: not measured yet, or exact" in padded[0].note
    assert all(p.p >= a.p for p, a in zip(padded, alone, strict=True))
    # What is regressed with unseen p-values taken as 1 stays regressed once they are known (monotone).
    final = adjust([*vs, *[compare("output_tok_s", [BASE], scaled(1.0))] * 37])
    for p, f in zip(padded, final[:len(vs)], strict=True):  # the three measured
        if p.verdict == "regressed":
            assert f.verdict == "regressed"
    with pytest.raises(ConfigError, match="family_size 2 is smaller than the 3"):
        adjust(vs, family_size=2)


@pytest.mark.slow
def test_plugin_design_false_alarms_and_power() -> None:
    """The figures scripts/stats_simulation.py prints for the plugin's design, at a smaller size."""
    rng = np.random.default_rng(21)
    assert sim.any_regressed(sim.decide(sim.natural(sim.draw(rng, 600, 30), moderate=True))) <= 0.05
    col = sim.COL["output_tok_s"]
    v = sim.decide(sim.natural(sim.draw(rng, 600, 30, shift={"output_tok_s": sim.DROP_10}, shift_tests=1),
                               moderate=True))
    assert (v[:, 0, col] == "regressed").mean() >= 0.90
