"""The gate's statistics as pure functions: the log-symmetric mirror threshold, threshold layering,
pooled night-to-night variance, and when another look can settle a verdict."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pytest_specdec.gate.sequential import can_settle
from pytest_specdec.gate.stats import Verdict, decide, mirror
from pytest_specdec.gate.thresholds import build_thresholds
from pytest_specdec.gate.variance import estimate_night_variance


def test_mirror_is_the_same_distance_on_the_log_scale() -> None:
    assert mirror(-25.0, "%") == pytest.approx(100 / 0.75 - 100)  # a 25 % drop mirrors to a 33.3 % rise
    assert mirror(40.0, "%") == pytest.approx(100 / 1.4 - 100)  # a 40 % latency rise mirrors to -28.6 %
    assert mirror(-2.0, "points") == 2.0  # acceptance is compared on its raw scale


@pytest.mark.parametrize(("delta", "lo", "hi", "p", "expected"), [
    (30.0, 26.0, 32.0, 0.001, "unchanged"),  # significant, inside -25 .. +33.3 %: not an improvement
    (30.0, 20.0, 40.0, 0.001, "inconclusive"),  # the CI reaches past +33.3 %
    (36.0, 34.0, 38.0, 0.001, "improved"),
    (-26.0, -30.0, -22.0, 0.001, "regressed"),
    (-26.0, -30.0, -22.0, 0.2, "inconclusive"),  # beyond the threshold but not significant
    (-20.0, -24.0, -16.0, 0.001, "unchanged"),
])
def test_decision_uses_the_threshold_and_its_mirror(delta: float, lo: float, hi: float, p: float,
                                                    expected: str) -> None:
    assert str(decide(delta, lo, hi, p, -25.0, 0.05, "%")) == expected


def test_latency_band_is_mirrored_below() -> None:
    # +40 % is the bad side of a latency; the good side ends at -28.6 %, so a CI down to -30 % is not inside.
    assert str(decide(-10.0, -30.0, 10.0, 0.3, 40.0, 0.05, "%")) == "inconclusive"
    assert str(decide(-10.0, -28.0, 10.0, 0.3, 40.0, 0.05, "%")) == "unchanged"


@pytest.mark.parametrize("layer", [{"speedup": 15.0, "rate": 40.0}, {"rate": 40.0, "speedup": 15.0}])
def test_a_metric_beats_its_kind_within_one_layer(layer: dict[str, float]) -> None:
    t = build_thresholds(layer)
    assert t.bad_side("speedup", "rate") == -15.0 and t.bad_side("output_tok_s", "rate") == -40.0


def test_a_later_kind_still_beats_an_earlier_metric() -> None:
    t = build_thresholds({"speedup": 15.0}, {"rate": 40.0})
    assert t.bad_side("speedup", "rate") == -40.0


def test_pooled_night_variance_recovers_known_components() -> None:
    """100 files of 3 nights x 4 runs, night sd 0.05 and run sd 0.10 on the log scale."""
    rng = np.random.default_rng(1)
    files = []
    for _ in range(100):
        nights = []
        for _ in range(3):
            shift = rng.normal(0.0, 0.05)
            nights.append(list(np.exp(1.0 + shift + rng.normal(0.0, 0.10, 4))))
        files.append(nights)
    nv = estimate_night_variance("speedup", files)
    assert nv is not None and nv.df_between == 200 and nv.df_within == 900 and nv.n_sources == 100
    assert math.sqrt(nv.within) == pytest.approx(0.10, rel=0.15)
    assert math.sqrt(nv.between) == pytest.approx(0.05, rel=0.35)


def test_no_night_variance_without_two_nights() -> None:
    assert estimate_night_variance("speedup", [[[1.0, 1.1, 1.2]]]) is None


def inconclusive_verdict(delta: float, var_fixed: float, var_run: float, n_now: int, df: float) -> Verdict:
    return Verdict("speedup", "inconclusive", 1.0, 1.0, delta, None, None, 0.5, 3, n_now, "%", "nights-t-log",
                   -25.0, "", var_fixed=var_fixed, var_run=var_run, df=df, per="night")


def test_a_look_is_useful_only_when_it_can_settle() -> None:
    # Near zero with a run variance that dominates: more runs narrow the CI inside the band.
    assert can_settle(inconclusive_verdict(1.0, 0.001, 0.03, 3, 4.0), 12, 0.05)
    # The night-to-night part alone is wider than the band: no number of runs helps.
    assert not can_settle(inconclusive_verdict(1.0, 0.05, 0.03, 3, 4.0), 12, 0.05)
    # A run-level comparison at 2 runs has 1 df; the planned runs bring their own df.
    assert can_settle(inconclusive_verdict(1.0, 0.0005, 0.02, 2, 1.0), 12, 0.05)
    # Not inconclusive: nothing to settle.
    assert not can_settle(Verdict("speedup", "unchanged", 1.0, 1.0, 0.0, -1.0, 1.0, 0.5, 3, 3, "%", "m", -25.0, ""),
                          12, 0.05)


def test_only_gated_verdicts_fail() -> None:
    """A shown metric that regresses (alone, or only once the session's whole family is known) is reported
    but never fails the test or the session: the test's end and the session's end ask one rule."""
    from pytest_specdec.gate.check import FailRule
    from pytest_specdec.gate.verdicts import gated_with

    def v(metric: str, verdict: str, family: str) -> Verdict:
        return Verdict(metric, verdict, 1.0, 0.5, -50.0, -60.0, -40.0, 0.001, 5, 3, "%", "m", -25.0, "",
                       family=family)

    shown = v("ttft_p95_ms", "regressed", "shown")
    gated = v("speedup", "regressed", "gated")
    assert gated_with([shown, v("speedup", "unchanged", "gated")], "regressed") == []
    assert gated_with([shown, gated], "regressed") == [gated]
    rule = FailRule()
    assert rule.decide(checked=True, status="compared", verdicts=[shown]).outcome == "pass"
    assert rule.decide(checked=True, status="compared", verdicts=[shown, gated]).fails


def test_night_floor_widens_log_metrics_only_and_says_so() -> None:
    """Nights recorded minutes apart barely spread; the profile's floor (min_night_sd) stands in for the
    night-to-night variance they cannot show, so the same small shift is no longer significant."""
    from pytest_specdec.gate.stats import compare
    from pytest_specdec.gate.variance import NightVariance
    from pytest_specdec.gate.verdicts import with_floor

    tight = NightVariance(between=0.0001, df_between=40, within=0.0004, df_within=100, n_sources=20)
    floored = with_floor({"speedup": tight, "acceptance_rate": tight}, 6.0)
    assert floored["speedup"].between == pytest.approx(math.log1p(0.06) ** 2) and floored["speedup"].floor
    assert floored["acceptance_rate"] == tight  # acceptance is not on the log scale
    assert with_floor({"speedup": tight}, 0.5)["speedup"] == tight  # a floor below the estimate changes nothing
    nights = [[2.0, 2.02, 1.98], [2.01, 1.99, 2.0], [2.0, 2.01, 1.99]]
    now = [1.80, 1.81, 1.79]  # -10 %
    loose = compare("speedup", nights, now, nights=floored["speedup"])
    assert compare("speedup", nights, now, nights=tight).p < 0.001 < loose.p
    assert "the profile's floor, min_night_sd" in loose.note


def test_detectable_is_unbounded_without_overflow_and_says_so() -> None:
    """One run and a tiny alpha on a latency: no rise is caught at all. That is `inf` (no numpy overflow
    warning, which is an error here), null in the JSON, and the same words in the terminal and the report."""
    from pytest_specdec.gate.sequential import detectable
    from pytest_specdec.output.report import catches
    from pytest_specdec.output.results import verdict_entry
    from pytest_specdec.output.schema import VerdictEntry
    from pytest_specdec.output.wording import guard_text

    assert detectable("latency", 1.0, 0.16, 1.0, 0.001 / 6) == float("inf")
    assert detectable("rate", -25.0, 0.16, 1.0, 0.001 / 6) <= 100.0  # a drop saturates at -100 %, no warning
    v = Verdict("ttft_p95_ms", "inconclusive", 10.0, 30.0, 200.0, -50.0, 900.0, 0.2, 1, 1, "%", "m", 40.0, "",
                family="shown", mde=float("inf"), var_fixed=0.1, var_run=0.06, df=1.0)
    stored = verdict_entry(v)
    assert stored["mde"] is None and stored["se"] is not None
    assert (guard_text(v) == "catches no rise: too few runs for any bound"
            == catches(VerdictEntry.from_dict(v.metric, stored)))


def test_a_zero_change_reads_plus_zero() -> None:
    """A machine factor that is one test's own deviation leaves exactly 0 up to rounding: "+0.0 %"."""
    from pytest_specdec.output.wording import format_delta

    assert [format_delta(x, "%") for x in (-1e-12, 0.0, -0.06)] == ["+0.0 %", "+0.0 %", "-0.1 %"]
    assert format_delta(-1e-9, "points") == "+0.00 pt" and format_delta(None, "%") == "—"


def test_the_machine_line_names_a_ci_only_where_several_tests_give_one() -> None:
    """One test's reference arm gives a factor and no CI: the line says so once (an H200 session printed "one test,
    1 test(s)"); several give a CI and their count."""
    from pytest_specdec.gate.machine import MachineFactor
    from pytest_specdec.output.wording import machine_sentence

    one = machine_sentence(MachineFactor(math.log(0.876), math.log(0.876), math.log(0.876), 1, 5.0, 90.0))
    assert "(reference tok/s, factor 0.876, from one test, no CI); beyond ±5 %" in one, one
    three = machine_sentence(MachineFactor(math.log(0.9), math.log(0.85), math.log(0.95), 3, 5.0, 90.0))
    assert "(reference tok/s, factor 0.900, 90% CI -15.0 % to -5.0 %, 3 test(s)); beyond ±5 %" in three, three
