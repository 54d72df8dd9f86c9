"""gate/ab.py: a base and a candidate spec config paired run by run, known answers for each branch of
`paired` (log ratio, points, the exact rule, missing runs, too few pairs, looks, the MDE), the simulation's
batch path against `paired` + `adjust`, and (marked slow, fixed seed) the false alarms and power that
scripts/ab_simulation.py prints, on the same model (tests/sims/ab.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps
from sims import ab as sim

from pytest_specdec.errors import ConfigError
from pytest_specdec.gate.ab import paired
from pytest_specdec.gate.sequential import adjust, detectable
from pytest_specdec.gate.stats import Thresholds

#: Zero-mean log jitter of ~2 % per pair: the candidate's geometric mean ratio to the base is exactly the
#: factor it is scaled by.
JITTER = np.array([0.02, -0.01, 0.03, -0.02, 0.0, -0.03, 0.01, 0.015, -0.015, 0.0])
BASE = [100.0, 104.0, 97.0, 101.0, 99.0, 103.0, 96.0, 100.0, 102.0, 98.0]  # tok/s, machine drift across pairs


def candidate(factor: float, base: list[float] = BASE) -> list[float]:
    return [b * factor * math.exp(j) for b, j in zip(base, JITTER, strict=True)]


def test_same_config_is_unchanged() -> None:
    v = paired("output_tok_s", BASE, candidate(1.0))
    assert v.verdict == "unchanged", v.note
    assert v.delta == pytest.approx(0.0, abs=1e-9)
    assert v.n_baseline == v.n_now == 10 and (v.method, v.per) == ("paired-t-log", "pair") and v.unit == "%"


def test_a_clear_drop_is_regressed_with_the_paired_t() -> None:
    v = paired("output_tok_s", BASE, candidate(0.7))
    assert v.verdict == "regressed", v.note
    assert v.delta == pytest.approx(-30.0)  # the mean log ratio, back to %: the jitter averages out
    res = sps.ttest_1samp(np.log(np.array(candidate(0.7)) / BASE), 0.0)
    ci = res.confidence_interval(0.9)  # alpha 0.05 one-sided: a 90 % CI
    assert (v.ci_low, v.ci_high) == pytest.approx((100 * math.expm1(ci.low), 100 * math.expm1(ci.high)))
    assert v.p == pytest.approx(res.pvalue / 2, rel=1e-6, abs=0)  # one-sided in the estimate's direction
    assert v.baseline == pytest.approx(math.exp(np.mean(np.log(BASE))))
    assert "-30.00 % (90% CI" in v.note and "10 pairs" in v.note


def test_a_clear_rise_is_improved() -> None:
    assert paired("output_tok_s", BASE, candidate(1.3)).verdict == "improved"


def test_latency_ratio_higher_is_worse() -> None:
    v = paired("e2e_p95_ratio", [1.0] * 10, candidate(1.3, [1.0] * 10))
    assert v.verdict == "regressed" and v.delta == pytest.approx(30.0)


def test_missing_runs_leave_their_pair_out_and_are_counted() -> None:
    base: list[float | None] = list(BASE)
    cand: list[float | None] = list(candidate(0.7))
    base[1], cand[3] = None, None
    cand[1] = 1e6  # its base run is missing: this pair must not count
    v = paired("output_tok_s", base, cand)
    assert v.n_now == v.n_baseline == 8
    assert "2 pair(s) left out (a run missing on one side)" in v.note
    kept = [i for i in range(10) if i not in (1, 3)]
    assert v.delta == pytest.approx(100 * (0.7 * math.exp(float(np.mean(JITTER[kept]))) - 1))


def test_fewer_than_two_pairs_is_inconclusive() -> None:
    v = paired("output_tok_s", [100.0, None, 90.0], [70.0, 70.0, None])
    assert v.verdict == "inconclusive" and v.p is None and v.delta is None
    assert v.note.startswith("too little data: 1 usable pair(s), need 2") and "2 pair(s) left out" in v.note
    assert paired("output_tok_s", [], []).verdict == "inconclusive"


def test_acceptance_is_judged_in_points() -> None:
    base = [0.60, 0.62, 0.61, 0.59, 0.63, 0.60, 0.61, 0.62, 0.58, 0.64]
    cand = [b - 0.05 + j / 10 for b, j in zip(base, JITTER, strict=True)]
    v = paired("acceptance_rate", base, cand)
    assert v.unit == "points" and (v.method, v.per) == ("paired-t", "pair")
    assert v.delta == pytest.approx(-5.0)  # points: the mean difference x 100, not a ratio
    assert v.verdict == "regressed", v.note  # beyond the 2-point threshold
    small = paired("acceptance_rate", base, [b - 0.01 + j / 10 for b, j in zip(base, JITTER, strict=True)])
    assert small.delta == pytest.approx(-1.0) and small.verdict != "regressed"


def test_constant_differences_take_the_exact_rule() -> None:
    """Acceptance at temperature 0 repeats exactly run to run: no t, the tolerance and the threshold."""
    v = paired("acceptance_rate", [0.6] * 4, [0.55] * 4)
    assert (v.verdict, v.method, v.per, v.p, v.exact) == ("regressed", "exact", "pair", None, True)
    assert v.delta == pytest.approx(-5.0)
    same = paired("acceptance_rate", [0.6] * 4, [0.6] * 4)
    assert same.verdict == "unchanged" and "exact rule" in same.note


def test_looks_split_alpha_and_scale_p() -> None:
    one = paired("output_tok_s", BASE, candidate(0.9))
    two = paired("output_tok_s", BASE, candidate(0.9), look=1, max_looks=2)
    assert two.p == pytest.approx(min(1.0, 2 * one.p))
    assert two.ci_low < one.ci_low and "look 1 of 2" in two.note  # 95 % CI instead of 90 %


def test_mde_is_detectable_at_the_pair_variance() -> None:
    v = paired("output_tok_s", BASE, candidate(0.95))
    var = float(np.var(JITTER, ddof=1))
    assert (v.var_fixed, v.var_run, v.df) == (0.0, pytest.approx(var), 9.0)
    assert v.mde == pytest.approx(detectable("rate", -5.0, var / 10, 9.0, 0.05))
    more = paired("output_tok_s", BASE * 4, candidate(0.95) * 4)
    assert more.mde is not None and v.mde is not None and more.mde < v.mde  # more pairs, smaller MDE


def test_thresholds_and_bad_input() -> None:
    assert paired("output_tok_s", BASE, candidate(0.93), thresholds=Thresholds(rate_pct=10.0)).verdict != "regressed"
    with pytest.raises(ConfigError, match="base has 2 runs and candidate 1"):
        paired("output_tok_s", [1.0, 2.0], [1.0])
    with pytest.raises(ConfigError, match=r"candidate\[2\] is -1.0"):
        paired("output_tok_s", [1.0, 2.0, 3.0], [1.0, None, -1.0])
    with pytest.raises(ConfigError, match="must be lists"):
        paired("output_tok_s", "abc", "abc")  # type: ignore[arg-type]  # bad input on purpose: the error is under test
    with pytest.raises(ConfigError, match="must be lists"):
        paired("output_tok_s", [1.0], None)  # type: ignore[arg-type]  # bad input on purpose: the error is under test


# ---- the simulation's batch path, and its figures (slow; full size: scripts/ab_simulation.py) ----


def test_batch_path_matches_paired_and_adjust() -> None:
    rng = np.random.default_rng(5)
    noise = sim.Noise("cpu", sim.SPEEDUP_SD)
    x = rng.standard_normal((3, 4, len(sim.GATED), 6)) * noise.sds()[:, None] * 3
    x[:, 0, 0] += math.log(0.6)  # something to find
    mean, var = sim.Sums.of(x).moments(4)  # the first 4 pairs, from the running sums
    assert np.allclose(mean, x[..., :4].mean(-1)) and np.allclose(var, x[..., :4].var(-1, ddof=1))
    for multiplicity in ("bh", "holm"):
        batch = sim.judge(sim.Sums.of(x), 6, noise, multiplicity=multiplicity)
        for s in range(3):
            verdicts = []
            for t in range(4):
                for j, (name, kind) in enumerate(sim.GATED):
                    base = [0.6] * 6 if kind == "acceptance" else [100.0] * 6
                    cand = (0.6 + x[s, t, j] if kind == "acceptance" else 100.0 * np.exp(x[s, t, j])).tolist()
                    verdicts.append(paired(name, base, cand, kind=kind, thresholds=noise.thresholds()))
            got = [v.verdict for v in adjust(verdicts, multiplicity)]
            assert got == batch[s].reshape(-1).tolist()
        assert (batch == "regressed").any()


@pytest.mark.slow
def test_simulated_false_alarms_and_power_meet_the_design() -> None:
    """At the CPU's measured noise 20 pairs per test keep false alarms near 3 % and find a lone -10 % in
    ~90 % of suites; heavy tails do not raise the false alarms; at GPU-like noise 18 pairs find -5 %."""
    rng = np.random.default_rng(20261126)
    cpu = sim.Noise("cpu", sim.SPEEDUP_SD)
    f = sim.figures(sim.draw(rng, cpu, 400, 20), 20, cpu)
    assert f.false_regressed <= 0.06 and 0.82 <= f.power[-10.0] <= 0.97, f
    tails = sim.Noise("cpu t4", sim.SPEEDUP_SD, tails_df=4.0)
    f = sim.figures(sim.draw(rng, tails, 400, 20), 20, tails)
    assert f.false_regressed <= 0.05 and f.power[-10.0] >= 0.8, f
    few = sim.figures(sim.draw(rng, cpu, 400, 8), 8, cpu)
    assert few.power[-10.0] <= 0.35, few  # the pairs matter: 8 are far from enough
    gpu = sim.Noise("gpu", sim.gpu_sd(0.03), rate_threshold=2.5, target=-5.0)
    f = sim.figures(sim.draw(rng, gpu, 400, 18), 18, gpu)
    assert f.false_regressed <= 0.05 and f.power[-5.0] >= 0.82, f


def test_sequential_batch_path_stops_where_the_plugin_stops() -> None:
    """The simulation's sequential looks (`sims.ab.sequential`) stop each test at the look the plugin's rule
    does (`ab.at_family_level` over a family of 57, then `ab.until_pairs_settle` via `sequential.next_look`)."""
    from pytest_specdec.gate.ab import at_family_level, until_pairs_settle
    from pytest_specdec.gate.sequential import next_look

    rng = np.random.default_rng(7)
    noise = sim.Noise("gpu", sim.gpu_sd(0.03))
    x = rng.standard_normal((3, 4, len(sim.GATED), 8)) * noise.sds()[:, None]
    x[:, 0, 0] += math.log(0.8)  # one test to stop on regressed
    looks = (4, 8)
    got = sim.sequential(sim.Sums.of(x), looks, noise)
    for s in range(3):
        for t in range(4):
            used = looks[-1]
            for look, n in enumerate(looks, start=1):
                verdicts = []
                for j, (name, kind) in enumerate(sim.GATED):
                    base = [0.6] * n if kind == "acceptance" else [100.0] * n
                    cand = (0.6 + x[s, t, j, :n] if kind == "acceptance" else 100.0 * np.exp(x[s, t, j, :n])).tolist()
                    verdicts.append(paired(name, base, cand, kind=kind, thresholds=noise.thresholds(), look=look,
                                           max_looks=len(looks)))
                seen = at_family_level(verdicts, sim.FAMILY, 0.05)
                nxt, why = next_look(looks, look, n, seen, 0.05, until_pairs_settle)
                if nxt is None:
                    used = n
                    break
            assert got.pairs[s, t] == used, (s, t)
    assert (got.pairs < looks[-1]).any() and (got.verdicts[:, 0, 0] == "regressed").any()
