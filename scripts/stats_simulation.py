"""Simulated false-alarm rate and power of pytest_specdec.gate.stats on synthetic per-run values.

    .venv/bin/python -m scripts.stats_simulation [--suites 2000] [--seed 20240611]

Values are drawn directly on the comparison scale (log for rates and latencies, raw rate for
acceptance) and go through the same cores, decision rule and p-value adjustment as ``stats.compare``
and ``stats.adjust`` (tests/unit/test_stats.py checks that this batch path and the per-metric API agree).
A suite is ``tests`` benchmark tests x the 6 metrics below; "any regressed" is decided after
Benjamini-Hochberg over the whole suite, as the plugin does at session end.

The plugin's design (the "moderated" figures): variances shrunk towards an empirical-Bayes prior from
all of the profile's stored baselines (``stats.estimate_prior``; here from the suite's 30 simulated
baselines), never below a test's own variance. Plain Welch with BH over 180 metric tests finds a lone
-10 % drop at 3 % noise with 5 v 5 runs only ~45 % of the time; moderation brings that above 90 %.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from pytest_specdec.gate.sequential import adjusted_p
from pytest_specdec.gate.stats import decide as decide_each

# The noise model is the tests' (tests/sims/stats.py): the figures printed here are the ones they check, smaller.
from tests.sims.stats import (
    COL,
    DROP_10,
    METRICS,
    Noise,
    any_regressed,
    bad_side_rate,
    decide,
    draw,
    natural,
    sequential,
)


def figures(suites: int = 2000, tests: int = 30, seed: int = 20240611) -> dict[str, float]:
    """Every figure the report quotes, keyed by a short name; deterministic for a seed."""
    rng = np.random.default_rng(seed)
    f: dict[str, float] = {}

    # A/A, single-session baseline of 5 runs vs 5 runs tonight, run noise only.
    nat = natural(draw(rng, suites, tests))
    bh = decide(nat)
    f["aa_single_bh_any_regressed"] = any_regressed(bh)
    f["aa_single_bh_any_improved"] = float((bh == "improved").any(axis=(1, 2)).mean())
    f["aa_single_holm_any_regressed"] = any_regressed(decide(nat, "holm"))
    f["aa_single_unadjusted_any_regressed"] = any_regressed(decide(nat, "none"))
    f["aa_single_share_metrics_unchanged"] = float((bh == "unchanged").mean())
    f["aa_single_share_tests_inconclusive"] = float((bh == "inconclusive").any(-1).mean())

    # A/A, baseline of 5 nights x 5 runs, night sd 3 % (1 pt acceptance) + run sd 3 % (1 pt); tonight
    # has its own night effect. Session unit (what compare does), and the run unit for contrast.
    night = Noise(night_log=0.03, night_acc=0.01)
    dr = draw(rng, suites, tests, sessions=5, noise=night)
    f["aa_nights_session_bh_any_regressed"] = any_regressed(decide(natural(dr)))
    f["aa_nights_session_unadjusted_any_regressed"] = any_regressed(decide(natural(dr), "none"))
    f["aa_nights_pooled_runs_bh_any_regressed"] = any_regressed(decide(natural(dr, pool_sessions=True)))
    shared = Noise(night_log=0.03, night_acc=0.01, shared_night=True)
    f["aa_nights_shared_session_bh_any_regressed"] = any_regressed(decide(natural(
        draw(rng, suites, tests, sessions=5, noise=shared))))

    # A/A, sequential looks at 3 then 5 runs (Bonferroni over 2 looks), baseline 5 runs.
    nat_seq, runs = sequential(draw(rng, suites, tests), (3, 5))
    f["aa_sequential_bh_any_regressed"] = any_regressed(decide(nat_seq))
    f["aa_sequential_mean_runs"] = float(runs.mean())

    # Calibration of the one-sided test alone (no threshold): share of A/A metric tests with p < 0.05
    # on the bad side; a calibrated test gives 5 %.
    f["calib_welch_bad_side_p"] = bad_side_rate(natural(draw(rng, suites, tests)))
    f["calib_session_bad_side_p"] = bad_side_rate(natural(draw(rng, suites, tests, sessions=5, noise=night)))
    f["calib_session_now3_bad_side_p"] = bad_side_rate(natural(draw(rng, suites, tests, sessions=5,
                                                                     runs_now=3, noise=night)))

    # A/A with BH per test (6 metrics) instead of per suite, for contrast.
    delta, lo, hi, p, bad = natural(draw(rng, suites, tests))
    f["aa_single_bh_per_test_any_regressed"] = any_regressed(
        decide_each(delta, lo, hi, adjusted_p(p, "bh"), bad, 0.05))

    # A/A, a longer sequential budget: looks at 3, 5, 7, 9 runs (alpha/4 each).
    nat_seq, runs = sequential(draw(rng, suites, tests, runs_now=9), (3, 5, 7, 9))
    v = decide(nat_seq)
    f["aa_sequential_3_9_bh_any_regressed"] = any_regressed(v)
    f["aa_sequential_3_9_mean_runs"] = float(runs.mean())
    f["aa_sequential_3_9_share_metrics_unchanged"] = float((v == "unchanged").mean())

    # The plugin's design: moderated variances (prior from the suite's baselines), BH over the suite.
    f["mod_aa_single_bh_any_regressed"] = any_regressed(decide(natural(draw(rng, suites, tests), moderate=True)))
    for h in (1.5, 2.0, 3.0):
        f[f"mod_aa_hetero{h:g}_bh_any_regressed"] = any_regressed(decide(natural(
            draw(rng, suites, tests, noise=Noise(hetero=h)), moderate=True)))
    f["mod_aa_nights_session_bh_any_regressed"] = any_regressed(decide(natural(
        draw(rng, suites, tests, sessions=5, noise=night), moderate=True)))
    f["mod_aa_nights_shared_session_bh_any_regressed"] = any_regressed(decide(natural(
        draw(rng, suites, tests, sessions=5, noise=shared), moderate=True)))
    nat_seq, runs = sequential(draw(rng, suites, tests), (3, 5), moderate=True)
    f["mod_aa_sequential_bh_any_regressed"] = any_regressed(decide(nat_seq))
    # A fixed slower night: every rate 3 % lower tonight (a real change, below the 5 % threshold).
    f["mod_aa_fixed_shift3_single_bh_any_regressed"] = any_regressed(decide(natural(
        draw(rng, suites, tests, noise=Noise(shift_all=-0.03)), moderate=True)))
    f["welch_aa_fixed_shift3_single_bh_any_regressed"] = any_regressed(decide(natural(
        draw(rng, suites, tests, noise=Noise(shift_all=-0.03)))))
    f["mod_aa_fixed_shift3_nights_bh_any_regressed"] = any_regressed(decide(natural(
        draw(rng, suites, tests, sessions=5, noise=Noise(night_log=0.03, night_acc=0.01, shift_all=-0.03)),
        moderate=True)))
    drop1 = {"output_tok_s": DROP_10}
    c1 = COL["output_tok_s"]
    f["mod_power_5v5_one_of_suite_bh"] = float((decide(natural(draw(
        rng, suites, tests, shift=drop1, shift_tests=1), moderate=True))[:, 0, c1] == "regressed").mean())
    f["mod_power_3v3_one_of_suite_bh"] = float((decide(natural(draw(
        rng, suites, tests, runs_base=3, runs_now=3, shift=drop1, shift_tests=1), moderate=True))[:, 0, c1]
        == "regressed").mean())
    f["mod_power_5v5_one_of_suite_hetero1.5_bh"] = float((decide(natural(draw(
        rng, suites, tests, noise=Noise(hetero=1.5), shift=drop1, shift_tests=1), moderate=True))[:, 0, c1]
        == "regressed").mean())
    nat_seq, runs = sequential(draw(rng, suites, tests, shift=drop1, shift_tests=1), (3, 5), moderate=True)
    f["mod_power_sequential_3_5_one_of_suite_bh"] = float((decide(nat_seq)[:, 0, c1] == "regressed").mean())
    f["mod_power_nights_5x5_one_of_suite_bh"] = float((decide(natural(draw(
        rng, suites, tests, sessions=5, noise=night, shift=drop1, shift_tests=1), moderate=True))[:, 0, c1]
        == "regressed").mean())

    # Power: a true 10 % drop of output tok/s at 3 % run noise, single-session baseline.
    drop = {"output_tok_s": DROP_10}
    col = COL["output_tok_s"]
    dr = draw(rng, suites, tests, shift=drop, shift_tests=1)
    nat = natural(dr)
    f["power_5v5_single_test"] = float((decide(nat, "none")[:, 0, col] == "regressed").mean())
    f["power_5v5_one_of_suite_bh"] = float((decide(nat)[:, 0, col] == "regressed").mean())
    f["power_3v3_single_test"] = float((decide(natural(draw(rng, suites, 1, runs_base=3, runs_now=3,
                                                            shift=drop)), "none")[:, 0, col] == "regressed").mean())
    nat_seq, runs = sequential(dr, (3, 5))
    f["power_sequential_3_5_single_test"] = float((decide(nat_seq, "none")[:, 0, col] == "regressed").mean())
    f["power_sequential_3_5_mean_runs"] = float(runs[:, 0].mean())
    everywhere = {"output_tok_s": DROP_10, "speedup": DROP_10}
    v = decide(natural(draw(rng, suites, tests, shift=everywhere)))
    f["power_5v5_all_tests_drop_bh"] = float((v[..., [COL["output_tok_s"], COL["speedup"]]] == "regressed").mean())
    f["power_nights_5x5_single_test"] = float((decide(natural(draw(
        rng, suites, 1, sessions=5, noise=night, shift=drop)), "none")[:, 0, col] == "regressed").mean())
    return f


DESCRIPTIONS = {
    "aa_single_bh_any_regressed": "A/A 1 baseline session, 5 v 5 runs, BH: suites with any regressed",
    "aa_single_bh_any_improved": "  ... suites with any improved",
    "aa_single_holm_any_regressed": "  ... Holm instead of BH: any regressed",
    "aa_single_unadjusted_any_regressed": "  ... no adjustment: any regressed",
    "aa_single_share_metrics_unchanged": "  ... share of metric verdicts 'unchanged'",
    "aa_single_share_tests_inconclusive": "  ... share of tests with an inconclusive metric",
    "aa_nights_session_bh_any_regressed": "A/A 5 nights x 5 runs, night 3 % + run 3 %, session unit, BH",
    "aa_nights_session_unadjusted_any_regressed": "  ... no adjustment",
    "aa_nights_pooled_runs_bh_any_regressed": "  ... WRONG unit (runs pooled over nights), BH",
    "aa_nights_shared_session_bh_any_regressed": "  ... night effect shared by all tests, session unit, BH",
    "aa_sequential_bh_any_regressed": "A/A sequential looks at 3 and 5 runs (alpha/2 each), BH",
    "aa_sequential_mean_runs": "  ... mean runs tonight per test",
    "calib_welch_bad_side_p": "calibration: A/A metric tests with p < 0.05 on the bad side, Welch (want 5)",
    "calib_session_bad_side_p": "  ... session unit, 5 nights x 5 runs v 5 runs, night 3 %",
    "calib_session_now3_bad_side_p": "  ... session unit, 5 nights x 5 runs v 3 runs, night 3 %",
    "aa_single_bh_per_test_any_regressed": "A/A 1 session, BH within each test only (not the suite): any regressed",
    "aa_sequential_3_9_bh_any_regressed": "A/A sequential looks at 3, 5, 7, 9 runs (alpha/4 each), BH",
    "aa_sequential_3_9_mean_runs": "  ... mean runs tonight per test",
    "aa_sequential_3_9_share_metrics_unchanged": "  ... share of metric verdicts 'unchanged'",
    "power_5v5_single_test": "power, -10 % tok/s, 3 % noise, 5 v 5 runs, one test, no adjustment",
    "power_5v5_one_of_suite_bh": "  ... the only changed test of 30 x 6, after BH",
    "power_5v5_all_tests_drop_bh": "  ... every test's tok/s and speedup drop, after BH",
    "power_3v3_single_test": "  ... 3 v 3 runs, one test",
    "power_sequential_3_5_single_test": "  ... sequential 3 then 5 runs (alpha/2 each), one test",
    "power_sequential_3_5_mean_runs": "  ... mean runs tonight",
    "power_nights_5x5_single_test": "  ... baseline 5 nights x 5 runs (night 3 %), session unit, one test",
    "mod_aa_single_bh_any_regressed": "PLUGIN DESIGN (moderated variance, BH over the suite): A/A 5 v 5, any regressed",
    "mod_aa_hetero1.5_bh_any_regressed": "  ... A/A, each test's noise x0.67..x1.5 of 3 %",
    "mod_aa_hetero2_bh_any_regressed": "  ... A/A, each test's noise x0.5..x2",
    "mod_aa_hetero3_bh_any_regressed": "  ... A/A, each test's noise x0.33..x3",
    "mod_aa_nights_session_bh_any_regressed": ("  ... A/A 5 nights x 5 runs, night sd 3 % + run 3 %, "
                                               "session unit (not moderated)"),
    "mod_aa_nights_shared_session_bh_any_regressed": "  ... same, night effect shared by all tests",
    "mod_aa_sequential_bh_any_regressed": "  ... A/A sequential looks at 3 and 5 runs",
    "mod_aa_fixed_shift3_single_bh_any_regressed": ("  ... every rate 3 % lower tonight, 1-session baseline: "
                                                    "any regressed"),
    "welch_aa_fixed_shift3_single_bh_any_regressed": "  ... (plain Welch instead, same data)",
    "mod_aa_fixed_shift3_nights_bh_any_regressed": "  ... every rate 3 % lower, baseline 5 nights (night sd 3 %)",
    "mod_power_5v5_one_of_suite_bh": "  ... power: the only -10 % test of 30 x 6, 5 v 5 runs, 3 % noise",
    "mod_power_3v3_one_of_suite_bh": "  ... power: same, 3 v 3 runs",
    "mod_power_5v5_one_of_suite_hetero1.5_bh": "  ... power: same, 5 v 5, noise x0.67..x1.5",
    "mod_power_sequential_3_5_one_of_suite_bh": "  ... power: same, sequential 3 then 5 runs",
    "mod_power_nights_5x5_one_of_suite_bh": "  ... power: same, baseline 5 nights x 5 runs (night sd 3 %)",
}


def main(argv: list[str] | None = None) -> int:
    """Print the figures with their Monte Carlo standard errors (per suite; per metric test for calib)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suites", type=int, default=2000, help="simulated suites per figure (default 2000)")
    ap.add_argument("--tests", type=int, default=30, help="benchmark tests per suite, 6 metrics each (default 30)")
    ap.add_argument("--seed", type=int, default=20240611)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    f = figures(args.suites, args.tests, args.seed)
    print(f"{args.suites} suites of {args.tests} tests x {len(METRICS)} metrics, seed {args.seed}; "
          f"alpha 0.05 one-sided (90 % CIs); thresholds -5 % rates, -2 pt acceptance, +10 % P95")
    for key, text in DESCRIPTIONS.items():
        v = f[key]
        if key.endswith("_runs"):
            print(f"{text:<78} {v:6.2f}")
        else:
            n = args.suites * (args.tests * len(METRICS) if key.startswith("calib") else 1)
            se = math.sqrt(max(v * (1 - v), 1e-12) / n)
            print(f"{text:<78} {100 * v:6.2f} %  (± {100 * se:.2f})")
    print(f"({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
