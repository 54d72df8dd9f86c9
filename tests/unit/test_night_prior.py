"""The night prior (`gate.variance.NightPrior`) and a host's calibration (`gate.calibration`): pure functions.

A first stored night cannot measure how far nights move; the prior stands in, blended with the stored nights as
they come, and a calibration measures it on the host. Simulated at the CPU default's noise (per-pair sd of log
speedup 0.095), with night effects drawn from a known sd.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from factories import night, run_entry

from pytest_specdec.gate.baselines import night_entry
from pytest_specdec.gate.calibration import (
    CALIBRATION_FILE,
    CalibrationError,
    as_judged,
    calibrate,
    catches,
    load_calibration,
    prior_of,
    raised_thresholds,
    resolves,
    summary_lines,
)
from pytest_specdec.gate.nights import Night
from pytest_specdec.gate.stats import Thresholds, compare
from pytest_specdec.gate.variance import NightPrior, NightVariance, blend_prior, night_prior_from
from pytest_specdec.output.schema import night_prior_entry
from pytest_specdec.profiles import load_profile

RUN_SD = 0.095  # per-pair sd of log speedup on the CPU default


def test_one_stored_night_is_judged_night_against_night_with_the_priors_uncertainty() -> None:
    """A night that moved +25 % with nothing changed: run against run it is a confident `improved` (the bug);
    against the night with the prior it is not, and the note says what the verdict rests on."""
    rng = np.random.default_rng(0)
    base = [list(np.exp(rng.normal(0, RUN_SD, 4)))]
    now = list(1.25 * np.exp(rng.normal(0, RUN_SD, 4)))
    assert compare("speedup", base, now).verdict == "improved"  # the run unit alone: confidently wrong
    prior = NightPrior({"ratio": 10.0, "absolute": 30.0}, 4.0, "the test's prior")
    v = compare("speedup", base, now, nights=blend_prior("speedup", None, prior, absolute=False))
    assert v.verdict == "inconclusive" and v.per == "night" and v.n_baseline == 1
    assert "baseline 1 night(s) of 4 runs" in v.note
    assert "the test's prior, as no stored baseline has 2 nights: prior 10 % at 4 df" in v.note
    # a drop far beyond what nights do is still caught from one night
    worse = list(0.4 * np.exp(rng.normal(0, RUN_SD, 4)))
    assert compare("speedup", base, worse, nights=blend_prior("speedup", None, prior, absolute=False)
                   ).verdict == "regressed"


def test_the_prior_blends_with_the_stored_nights_and_they_take_over() -> None:
    prior = NightPrior({"ratio": 10.0, "absolute": 30.0, "acceptance": 0.0}, 4.0, "p")
    v0 = math.log1p(0.10) ** 2
    few = NightVariance(between=0.0, df_between=2, within=0.01, df_within=20, n_sources=2)
    many = NightVariance(between=0.0036, df_between=200, within=0.01, df_within=600, n_sources=40)
    b = blend_prior("speedup", few, prior, absolute=False)
    assert b is not None and b.between == pytest.approx(4 * v0 / 6) and b.df_between == 6 and b.prior_df == 4
    assert "pooled over 2 stored baselines (2 df) blended with p" in b.origin()
    m = blend_prior("speedup", many, prior, absolute=False)
    assert m is not None and m.between == pytest.approx((4 * v0 + 200 * 0.0036) / 204)
    # absolute figures take their own sd; a class at 0 leaves the stored nights alone
    a = blend_prior("output_tok_s", None, prior, absolute=True)
    assert a is not None and a.between == pytest.approx(math.log1p(0.30) ** 2)
    assert blend_prior("acceptance_rate", few, prior, absolute=False) is few
    assert blend_prior("acceptance_rate", None, prior, absolute=False) is None


def test_the_profiles_prior_and_its_default() -> None:
    cpu = load_profile("cpu")
    assert cpu.night_prior == {"ratio": 10.0, "absolute": 30.0, "acceptance": 0.0, "df": 4.0}
    assert cpu.night_prior_source == "profile cpu's night_prior"
    h100 = load_profile("h100")
    assert h100.night_prior["df"] == 4.0 and "assumed, measured on no host" in h100.night_prior_source
    p = night_prior_from(cpu.night_prior, cpu.night_prior_source)
    assert p.sd_of("speedup", False) == 10.0 and p.sd_of("reference_tok_s", True) == 30.0
    assert p.sd_of("per_position_acceptance[1]", False) == 0.0 and p.df_of("speedup") == 4.0
    assert NightPrior.from_dict(night_prior_entry(p), "here") == p


def _night(started: str, speedups: list[float], ref_tok_s: list[float], accept: float, hash_gb: float) -> Night:
    def run(i: int, tok_s: float, spec: bool) -> dict[str, Any]:
        counters = {"per_pos": [100 * accept] * 3, "accepted_tokens": 300 * accept, "acceptance_rate": accept}
        return run_entry(i, tok_s, **(counters if spec else {"per_pos": None}), total_output_tokens=512,
                         draft_coverage=None, hd_p95_ms={})
    ref = [run(i, t, False) for i, t in enumerate(ref_tok_s)]
    spec = [run(i, t * s, True) for i, (t, s) in enumerate(zip(ref_tok_s, speedups, strict=True))]
    return night(ref, spec, speedup_per_pair=speedups, started=started, machine_state={"cores": 2.0, "hash": hash_gb})


def _sessions(night_sd: float, n_sessions: int = 4, n_tests: int = 12, seed: int = 0) -> list[dict[str, Night]]:
    """Sessions of ``n_tests`` tests whose speedup's night mean moves by ``night_sd`` (log) from session to session,
    each run by RUN_SD; the machine's speed moves every test's reference alike (the probe follows it)."""
    rng = np.random.default_rng(seed)
    level = {f"t{i}": rng.uniform(0.8, 2.0) for i in range(n_tests)}
    out = []
    for s in range(n_sessions):
        machine = rng.normal(0, 0.2)
        out.append({t: _night(f"2026-01-0{s + 1}T00:00:00", list(lv * np.exp(rng.normal(0, night_sd) +
                                                                          rng.normal(0, RUN_SD, 4))),
                              list(300 * math.exp(machine) * np.exp(rng.normal(0, 0.03, 4))), 0.6,
                              2.0 * math.exp(machine + rng.normal(0, 0.01)))
                    for t, lv in level.items()})
    return out


def test_a_calibration_measures_the_hosts_night_and_run_noise() -> None:
    quiet, noisy = calibrate(_sessions(0.0)), calibrate(_sessions(0.15))
    q, n = quiet["metrics"]["speedup"], noisy["metrics"]["speedup"]
    for m in (q, n):  # the run noise is the same on both hosts, and measured
        assert m["run_sd"] == pytest.approx(100 * math.expm1(RUN_SD), rel=0.2) and m["df_run"] == 12 * 4 * 3
    assert q["night_sd"] < 5.0 and n["night_sd"] == pytest.approx(100 * math.expm1(0.15), rel=0.35)
    assert n["df_night"] == 12 * 3
    assert n["catches"] > q["catches"] > 0  # what a lone test catches widens with the night noise
    # as the gate judges: no night sd below the profile's floor (sessions minutes apart understate it)
    floored = calibrate(_sessions(0.0), min_night_sd=6.0)["metrics"]["speedup"]
    assert floored["night_sd"] == q["night_sd"] and floored["catches"] > q["catches"]
    assert quiet["metrics"]["acceptance_rate"]["night_sd"] == 0.0
    follow = noisy["probe"]["reference_follows_hash"]
    assert follow["slope"] == pytest.approx(1.0, abs=0.15) and follow["r"] > 0.9
    # the record's prior: each metric its night variance blended with the profile's by their df; a metric it did
    # not measure keeps the profile's figure
    base = NightPrior({"ratio": 10.0, "absolute": 30.0, "acceptance": 0.0}, 4.0, "the profile's")
    prior = prior_of(noisy, "cal", base)
    v = (n["df_night"] * math.log1p(n["night_sd"] / 100) ** 2 + 4 * math.log1p(0.10) ** 2) / (n["df_night"] + 4)
    assert prior.var_of("speedup", False) == pytest.approx(v) and prior.df_of("speedup") == n["df_night"] + 4
    assert prior.sd_of("goodput", False) == 10.0 and prior.df_of("goodput") == 4.0
    assert prior.source == "cal blended with the profile's"
    # a quiet calibration narrows the profile's guess by its df, never to nothing
    quiet_prior = prior_of(quiet, "cal", base)
    assert 0 < quiet_prior.sd_of("speedup", False) < 10.0
    # acceptance, which the profile assumes does not move: the measurement alone (0 here), still a night variance
    nv = blend_prior("acceptance_rate", None, quiet_prior, absolute=False)
    assert nv is not None and nv.between == 0 and nv.df_between == q["df_night"]
    assert "cal blended with the profile's, as no stored baseline has 2 nights" in nv.source()
    # what the session says it catches is figured with the night variance it judges with: the blend is wider
    # than the quiet record alone, and the floor widens it further
    judged = as_judged(quiet, quiet_prior, min_night_sd=0.0, alpha=0.05)["metrics"]["speedup"]
    assert judged["catches"] > q["catches"]
    assert (as_judged(quiet, quiet_prior, min_night_sd=12.0, alpha=0.05)["metrics"]["speedup"]["catches"]
            > judged["catches"])
    assert as_judged(quiet, quiet_prior, min_night_sd=0.0, alpha=0.05)["metrics"]["acceptance_rate"]["catches"] == 0.0


def test_thresholds_below_what_the_host_resolves_are_raised_to_it() -> None:
    """A threshold a lone test can never tell from no change only ever gives `inconclusive`: the calibration
    raises it to what the host resolves, and leaves a wider one alone."""
    record = calibrate(_sessions(0.15))
    r = record["metrics"]["speedup"]["resolves"]
    assert 0 < r < record["metrics"]["speedup"]["catches"]
    raised = raised_thresholds(record, Thresholds(rate_pct=5.0))
    assert raised["speedup"] == (5.0, r)
    assert "speedup" not in raised_thresholds(record, Thresholds(per_metric={"speedup": r + 1}))
    assert "acceptance_rate" not in raised  # exact: it resolves any change


def test_catches_shrinks_with_runs_and_grows_with_nights() -> None:
    assert resolves(0.005, 20, 0.009, 100, alpha=0.05, runs=4) < catches(0.005, 20, 0.009, 100, alpha=0.05, runs=4)
    base = catches(0.005, 20, 0.009, 100, alpha=0.05, runs=4)
    assert catches(0.005, 20, 0.009, 100, alpha=0.05, runs=16) < base < catches(0.02, 20, 0.009, 100, alpha=0.05,
                                                                                 runs=4)


def test_bad_calibration_input_and_records_say_what_to_fix(tmp_path: Path) -> None:
    s = _sessions(0.1, n_sessions=2)
    with pytest.raises(CalibrationError, match="needs 2 or more sessions of the same tests, got 1"):
        calibrate(s[:1])
    with pytest.raises(CalibrationError, match="share a start stamp"):
        calibrate([s[0], s[0]])
    with pytest.raises(CalibrationError, match="no test ran in 2 or more of the sessions"):
        calibrate([s[0], {"other": s[1]["t0"]}])
    # a test in one session only (a suite's session beside a file's) is left out; the others count
    three = _sessions(0.1, n_sessions=3)
    mixed = calibrate([three[0], {"t0": three[1]["t0"], "t1": three[1]["t1"]}, three[2]])
    assert (mixed["tests"] == sorted(three[0])
            and mixed["metrics"]["speedup"]["df_night"] == 2 * 2 + 10 * 1)  # t0, t1: 3 nights
    path = tmp_path / "host.calibration"
    assert load_calibration(path) is None
    path.write_text(CALIBRATION_FILE.render(calibrate(s)))
    assert load_calibration(path) is not None
    path.write_text('{"schema": "pytest-specdec/calibration/0"}')
    with pytest.raises(CalibrationError, match="`schema` is 'pytest-specdec/calibration/0'; this plugin reads the "
                                               "calibration record format of schema pytest-specdec/calibration/1 "
                                               ".*pytest-specdec calibrate"):
        load_calibration(path)
    path.write_text(CALIBRATION_FILE.render({**calibrate(s), "metrics": {"speedup": {"night_sd": -1, "df_night": 2,
                                                                           "run_sd": 1, "df_run": 2}}}))
    with pytest.raises(CalibrationError, match=r"metrics.speedup.night_sd is -1, not a number >= 0"):
        load_calibration(path)


def _state_sessions(slope: float, cores: tuple[float, ...], n_tests: int = 8, seed: int = 1) -> list[dict[str, Night]]:
    """Sessions whose machine state differs by ``cores`` (another process spinning on one of two CPUs: 1.1), and
    whose speedup's night mean follows the machine's capacity with ``slope`` (log on log)."""
    rng = np.random.default_rng(seed)
    level = {f"t{i}": rng.uniform(0.8, 2.0) for i in range(n_tests)}
    out = []
    for s, c in enumerate(cores):
        nights = {t: _night(f"2026-01-0{s + 1}T00:00:00", list(lv * (c / 2.0) ** slope
                                                                * np.exp(rng.normal(0, RUN_SD, 4))),
                            list(300 * (c / 2.0) * np.exp(rng.normal(0, 0.03, 4))), 0.6,
                            2.0 * math.exp(rng.normal(0, 0.01))) for t, lv in level.items()}
        out.append({t: dataclasses.replace(n, machine_state={"cores": c * math.exp(rng.normal(0, 0.01)),
                                                             "hash": n.machine_state["hash"]})
                    for t, n in nights.items()})
    return out


def test_the_state_tolerance_per_kind_is_measured_where_the_calibration_saw_the_state_move() -> None:
    """A ratio that does not follow the machine's capacity may be judged across states far apart; one that follows
    it steeply only across close ones; a calibration whose states hardly moved keeps the profile's tolerance."""
    from pytest_specdec.gate.calibration import state_tolerance_of
    from pytest_specdec.gate.machine import StateTolerance

    prior = NightPrior({"ratio": 10.0, "absolute": 30.0, "acceptance": 0.0}, 4.0, "p")
    base = StateTolerance(15.0, 15.0, "the profile's")
    busy = (2.0, 2.0, 1.1, 2.0, 1.1, 1.1)
    flat = calibrate(_state_sessions(0.0, busy))
    assert flat["probe"]["state_range_pct"] == pytest.approx(100 * (2.0 / 1.1 - 1), rel=0.1)
    f = flat["metrics"]["speedup"]["follows_state"]
    assert abs(f["slope"]) < 0.1 and f["df"] == 8 * 6 - 8 - 1
    t = state_tolerance_of(flat, prior, base, "cal")
    assert t.ratio > 40 and t.ratio <= flat["probe"]["state_range_pct"] + 0.1  # never beyond what it saw
    assert t.source.startswith("cal (its states") and t.of("speedup") == t.ratio
    # tok/s follows the cores one for one, but each session's machine factor divides that out, as the gate judges
    assert t.of("output_tok_s") == t.absolute > 40
    steep_record = calibrate(_state_sessions(1.0, busy))
    steep = state_tolerance_of(steep_record, prior, base, "cal")
    assert steep.ratio < 15.0 and steep.ratio < t.ratio
    # the state's moves are not night-to-night moves: grouped by state (the gate judges within one), the speedup's
    # night sd is the quiet host's again; acceptance does not follow the state and keeps every session
    grouped = calibrate(_state_sessions(1.0, busy), state_tolerance=15.0)
    assert steep_record["metrics"]["speedup"]["night_sd"] > 20
    assert grouped["metrics"]["speedup"]["night_sd"] < 5
    assert grouped["metrics"]["speedup"]["same_state"] and "same_state" not in grouped["metrics"]["acceptance_rate"]
    assert grouped["metrics"]["speedup"]["follows_state"] == steep_record["metrics"]["speedup"]["follows_state"]
    # never below what the probe repeats within in one state: else it would set aside nights of tonight's state
    repeat = grouped["probe"]["state_repeat_pct"]
    assert 0 < repeat < 15.0
    assert state_tolerance_of(grouped, prior, base, "cal").ratio >= round(repeat, 1)
    jittery = {**grouped, "probe": {**grouped["probe"], "state_repeat_pct": 12.0}}
    assert state_tolerance_of(jittery, prior, base, "cal").ratio == 12.0 > steep.ratio
    quiet = calibrate(_state_sessions(1.0, (2.0,) * 4))
    assert state_tolerance_of(quiet, prior, base, "cal") is base
    assert "follows the machine's capacity with slope" in "\n".join(summary_lines(flat, "here"))


def test_each_kind_is_judged_against_the_nights_within_its_own_state_tolerance() -> None:
    from pytest_specdec.errors import ConfigError
    from pytest_specdec.gate.machine import StateTolerance
    from pytest_specdec.gate.verdicts import evaluate
    from pytest_specdec.output.schema import state_tolerance_entry

    stored = _state_sessions(0.0, (1.1,), n_tests=1)[0]["t0"]
    now = _state_sessions(0.0, (2.0,), n_tests=1, seed=2)[0]["t0"]
    baseline = {"sessions": [night_entry(stored)]}
    kw = {"thresholds": Thresholds(), "alpha": 0.05}
    by = {v.metric: v for v in evaluate(baseline, now, state_tolerance=StateTolerance(90.0, 15.0, "cal"), **kw)}
    assert by["speedup"].verdict != "not-comparable" and by["output_tok_s"].verdict == "not-comparable"
    assert "tolerance ±15 %" in by["output_tok_s"].note
    one = {v.metric: v for v in evaluate(baseline, now, state_tolerance=15.0, **kw)}
    assert one["speedup"].verdict == one["output_tok_s"].verdict == "not-comparable"
    assert StateTolerance.from_setting(15, "x") == StateTolerance(15.0, 15.0, "")
    assert StateTolerance.from_setting(state_tolerance_entry(StateTolerance(90.0, 15.0, "cal")), "x").ratio == 90.0
    with pytest.raises(ConfigError, match=r"results.json: machine_state_tolerance is 'wide', not a number"):
        StateTolerance.from_setting("wide", "results.json")
