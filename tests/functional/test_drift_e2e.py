"""Drift within a session end to end: the plugin starts the `vllm serve` stand-in for the reference and the ngram
arm, and the spec server slows down after half the runs (`slow_posts` from the first late run's first request on,
`FakeConfig`). Its step time drift is `regressed`, shown in the terminal, the results (`drift`, documented) and the
report, and fails the test where `specdec_verdicts(gate=["step_time_drift"])` gates it; with nothing changed it is
never `regressed`. No baseline is read: drift is judged within tonight's runs (`--update-baselines` writes the
first night's, so the baseline gate passes either way)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from command import specdec_cli as cli
from session import specdec_session, undocumented

from fakes import FakeVllm
from pytest_specdec.measure.schedule import warmup_requests

PROMPTS, CONCURRENCY, PAIRS = 4, 1, 8
SERVERS: dict[str, dict[str, Any]] = {"ngram": {"k": 3, "acceptance": [1.0, 1.0, 1.0], "step_s": 0.01,
                                                "output_tokens": 16},
                                      "none": {"step_s": 0.005, "output_tokens": 16}}
#: The spec server's first request of the first late run (warm-up requests count: the stand-in counts every POST).
FIRST_LATE = warmup_requests(PROMPTS, CONCURRENCY) + PAIRS // 2 * PROMPTS + 1


def session(pytester: pytest.Pytester, make_suite: Callable[..., str], make_profile: Callable[..., Path],
            verdicts: str | None) -> Any:
    pytester.makepyfile(test_suite=make_suite(num_prompts=PROMPTS, concurrency=CONCURRENCY, max_tokens=16,
                                              verdicts=verdicts))
    profile = make_profile("fakedrift", methods=("ngram",))
    return specdec_session(pytester, profile, None, "--specdec-settle-timeout=0", "--update-baselines",
                           runs=PAIRS, max_runs=PAIRS)


def test_a_server_slower_late_fails_where_gated(pytester: pytest.Pytester, fake_vllm: FakeVllm,
                                                make_suite: Callable[..., str],
                                                make_profile: Callable[..., Path]) -> None:
    slow = {"slow_posts": [FIRST_LATE, 10**6], "slow_factor": 1.6}
    fake_vllm.configure({**SERVERS, "ngram": {**SERVERS["ngram"], **slow}})
    # check=False opts out of the baseline assertion only, as the soak suite does: a gated drift still fails
    run = session(pytester, make_suite, make_profile, 'check=False, gate=["step_time_drift"]')
    run.result.assert_outcomes(failed=1)
    # said once the test's end has adjusted it over the family so far, as the failure, results and report say it
    run.result.stdout.fnmatch_lines([
        "specdec: drift *test_ngram* (early vs late half of one server's runs):",
        "  acceptance unchanged: early 1.000 → late 1.000, *",
        "  step time regressed (gated): early * ref steps → late * ref steps, Δ +*CI*threshold +10 %, 4+4 runs); "
        "Benjamini-Hochberg over 4 tests (3 without a p-value*",
        "*drift within the session regressed: step_time_drift*"])
    test = run.test
    step = test["drift"]["verdicts"]["step_time_drift"]
    assert step["verdict"] == "regressed" and step["family"] == "gated", step
    assert step["early_runs"] == [0, 1, 2, 3] and step["late_runs"] == [4, 5, 6, 7], step
    # 1.6x slower steps, the step ratio +60 %; the client shares 2 busy cores in CI (seen: +81.9 %)
    assert 40 < step["delta"] < 100 and step["ci"][0] > 10, step
    assert "drift" in test["error"], test["error"]
    # a member of the gated family: at the test's end padded to what the collected test can add (its 3 gated
    # metrics, unmeasured without a baseline, and its gated drift), at the session's end over the members measured
    assert "Benjamini-Hochberg over 4 tests (3 without a p-value" in test["error"], test["error"]
    assert "Benjamini-Hochberg over 1 tests" in step["note"], step
    assert step["unadjusted"]["verdict"] == "regressed" and step["unadjusted"]["p"] <= step["p"], step
    shown = test["drift"]["verdicts"]["acceptance_drift"]  # shown: adjusted with the shown family
    assert shown["family"] == "shown" and shown["unadjusted"]["verdict"] == shown["verdict"] == "unchanged", shown
    assert not undocumented(run.results)
    assert "drift within the session" in run.html and "step time regressed" in run.html


def test_nothing_changes_is_never_regressed(pytester: pytest.Pytester, fake_vllm: FakeVllm,
                                            make_suite: Callable[..., str],
                                            make_profile: Callable[..., Path]) -> None:
    fake_vllm.configure(SERVERS)
    run = session(pytester, make_suite, make_profile, 'gate=["step_time_drift", "acceptance_drift"]')
    run.result.assert_outcomes(passed=1)
    verdicts = run.test["drift"]["verdicts"]
    assert verdicts["acceptance_drift"]["verdict"] == "unchanged", verdicts
    assert verdicts["step_time_drift"]["verdict"] in ("unchanged", "inconclusive"), verdicts
    assert all(v["family"] == "gated" and v["left_out"] == [] for v in verdicts.values()), verdicts


def test_an_inconclusive_gated_drift_fails_under_fail_inconclusive(
        pytester: pytest.Pytester, fake_vllm: FakeVllm, make_suite: Callable[..., str],
        make_profile: Callable[..., Path]) -> None:
    """Two runs on one server are too few to split in halves: the gated step time drift is `inconclusive`. Under
    --specdec-fail-inconclusive it fails the test as any gated metric still inconclusive does, its reason naming the
    drift verdict in the terminal and the results; without the option the test passes."""
    fake_vllm.configure(SERVERS)
    pytester.makepyfile(test_suite=make_suite(num_prompts=PROMPTS, concurrency=CONCURRENCY, max_tokens=16,
                                              verdicts='gate=["step_time_drift"]'))
    profile = make_profile("fakedrift", methods=("ngram",))

    def run(*extra: str) -> Any:
        return specdec_session(pytester, profile, None, "--specdec-settle-timeout=0", "--update-baselines", *extra,
                               runs=2, max_runs=2)

    failing = run("--specdec-fail-inconclusive")
    failing.result.assert_outcomes(failed=1)
    reason = "drift within the session inconclusive (--specdec-fail-inconclusive): step_time_drift"
    failing.result.stdout.fnmatch_lines([f"*{reason}*", "*step_time_drift: step time inconclusive (gated): "
                                         "2 run(s) on one server: fewer than 4 to split in halves*"])
    step = failing.test["drift"]["verdicts"]["step_time_drift"]
    assert (step["verdict"], step["family"]) == ("inconclusive", "gated"), step
    assert reason in failing.test["error"], failing.test["error"]
    passing = run()
    passing.result.assert_outcomes(passed=1)  # without the option: a warning naming it, as a gated metric gets
    passing.result.stdout.fnmatch_lines(["*SpecDecWarning: *test_ngram*: gated drift within the session "
                                         "inconclusive: step_time_drift (step time inconclusive (gated): 2 run(s) on "
                                         "one server: fewer than 4 to split in halves*); the test passes "
                                         "(--specdec-fail-inconclusive fails it)*"])


def test_a_restart_mid_test_starts_a_new_segment(pytester: pytest.Pytester, fake_vllm: FakeVllm,
                                                 monkeypatch: pytest.MonkeyPatch, make_suite: Callable[..., str],
                                                 make_profile: Callable[..., Path]) -> None:
    """The spec server hangs at its third run's first request: that run is invalid, the server is restarted, and
    the drift judges the fresh server's runs alone, naming the others and why."""
    fake_vllm.configure(SERVERS)
    hang = warmup_requests(PROMPTS, CONCURRENCY) + 2 * PROMPTS
    monkeypatch.setenv("FAKE_VLLM_HANG_ONCE", f"ngram:{hang}:{pytester.path / 'hung-once'}")
    pytester.makepyfile(test_suite=make_suite(num_prompts=PROMPTS, concurrency=CONCURRENCY, max_tokens=16))
    run = specdec_session(pytester, make_profile("fakedrift", methods=("ngram",)), None, "--specdec-settle-timeout=0",
                          "--specdec-hung-timeout=1", "--update-baselines", runs=PAIRS, max_runs=PAIRS)
    run.result.assert_outcomes(passed=1)
    for v in run.test["drift"]["verdicts"].values():
        assert v["early_runs"] + v["late_runs"] == [3, 4, 5, 6, 7], v
        restarted = "another server start (a restart begins a new segment)"
        assert v["left_out"][:2] == [f"run 1: {restarted}", f"run 2: {restarted}"], v["left_out"]
        assert v["left_out"][2].startswith("run 3: spec run invalid (server hung"), v["left_out"]
    # a shown drift too is said once the test's end has adjusted it over the family so far (padded)
    run.result.stdout.fnmatch_lines(["specdec: drift *test_ngram* (early vs late half of one server's runs):",
                                     "  acceptance unchanged: *",
                                     "  step time *, 2+3 runs); Benjamini-Hochberg over * tests (* without a p-value*",
                                     "  left out: run 1: another server start*; run 3: spec run invalid (server hung*"])


def test_compare_shows_the_files_drift_and_fails_as_the_session_did(
        pytester: pytest.Pytester, fake_vllm: FakeVllm, make_suite: Callable[..., str],
        make_profile: Callable[..., Path]) -> None:
    """`pytest-specdec compare` of the results file (against itself, so no baseline verdict moves): its drift verdicts
    in the terminal and in --json, and exit 1 for the gated drift that regressed, as the session failed the test."""
    fake_vllm.configure({**SERVERS, "ngram": {**SERVERS["ngram"], "slow_posts": [FIRST_LATE, 10**6],
                                              "slow_factor": 1.6}})
    run = session(pytester, make_suite, make_profile, 'check=False, gate=["step_time_drift"]')
    run.result.assert_outcomes(failed=1)
    results = run.reports / "latest.json"
    nodeid = run.test["nodeid"]
    text = cli("compare", results, results)
    assert text.returncode == 1, text.stdout + text.stderr
    assert "  drift within NEW's session (early vs late half of one server's runs):" in text.stdout, text.stdout
    assert "    step time regressed (gated): early " in text.stdout, text.stdout
    assert f"test(s) whose gated drift within NEW's session (late runs against early runs on one server) regressed, " \
           f"or stayed inconclusive under --specdec-fail-inconclusive, failed as the session fails them: {nodeid}" \
           in text.stdout, text.stdout
    data = json.loads(cli("compare", results, results, "--json").stdout)
    assert data["drifted"] == [nodeid] and data["failed"] == [nodeid], data
    step = data["tests"][0]["drift"]["verdicts"]["step_time_drift"]
    recorded = run.test["drift"]["verdicts"]["step_time_drift"]
    # its raw p adjusted again, with the comparison's gated family: the file's verdicts against itself join it here
    assert (step["verdict"], step["unadjusted"]) == ("regressed", recorded["unadjusted"]), step
    gated = [v for v in data["tests"][0]["verdicts"].values() if v["family"] == "gated" and v["p"] is not None]
    assert f"Benjamini-Hochberg over {1 + len(gated)} tests" in step["note"] and step["p"] >= recorded["p"], step


def test_compare_against_another_results_file_adjusts_drift_with_its_gated_verdicts(
        pytester: pytest.Pytester, fake_vllm: FakeVllm, make_suite: Callable[..., str],
        make_profile: Callable[..., Path]) -> None:
    """`pytest-specdec compare OLD.json NEW.json` of two sessions' files: NEW's gated drift is a member of the one
    gated family the comparison adjusts NEW's gated verdicts against OLD's in, as against stored baselines: each
    gated verdict with a p and the drift are adjusted over the same number of tests, and the drift's raw p is NEW's
    session's."""
    fake_vllm.configure(SERVERS)
    session(pytester, make_suite, make_profile, 'check=False, gate=["step_time_drift"]').result.assert_outcomes(
        passed=1)
    old = pytester.path / "old.json"
    old.write_bytes((pytester.path / "reports" / "latest.json").read_bytes())
    fake_vllm.configure({**SERVERS, "ngram": {**SERVERS["ngram"], "slow_posts": [FIRST_LATE, 10**6],
                                              "slow_factor": 1.6}})
    run = session(pytester, make_suite, make_profile, 'check=False, gate=["step_time_drift"]')
    data = json.loads(cli("compare", old, run.reports / "latest.json", "--json").stdout)
    [test] = data["tests"]
    assert test["status"] == "compared", test
    gated = [v for v in test["verdicts"].values() if v["family"] == "gated" and v["p"] is not None]
    assert gated, test["verdicts"]  # NEW's gated verdicts against OLD's runs, each with its p
    family = f"Benjamini-Hochberg over {1 + len(gated)} tests"
    assert all(family in v["note"] for v in gated), [v["note"] for v in gated]
    step = test["drift"]["verdicts"]["step_time_drift"]
    recorded = run.test["drift"]["verdicts"]["step_time_drift"]
    assert family in step["note"] and step["unadjusted"] == recorded["unadjusted"], step
    # it fails the comparison exactly when the rule fails NEW's test on it (`TestEnd.drifted`)
    assert data["drifted"] == data["failed"] == ([run.test["nodeid"]] if step["verdict"] == "regressed" else []), data


def test_an_ab_sessions_candidate_drift_is_gated_and_compare_fails_it_again(
        pytester: pytest.Pytester, fake_vllm: FakeVllm, make_suite: Callable[..., str],
        make_profile: Callable[..., Path]) -> None:
    """An A/B session judges the candidate's runs: its late runs slower, its gated step time drift regressed (its p
    in the A/B family), failing the test though check=False; `compare` of the file fails it again and shows it."""
    late = warmup_requests(PROMPTS, CONCURRENCY) + PAIRS // 2 * PROMPTS + 1
    fake_vllm.configure({"eagle3": SERVERS["ngram"], "none": SERVERS["none"],
                         "eagle3:/heads/b": {**SERVERS["ngram"], "slow_posts": [late, 10**6], "slow_factor": 1.6}})
    pytester.makepyfile(test_suite=make_suite(method="eagle3", num_prompts=PROMPTS, concurrency=CONCURRENCY,
                                              max_tokens=16, verdicts='check=False, gate=["step_time_drift"]'))
    run = specdec_session(pytester, make_profile("fakeabdrift", methods=("eagle3",)), None,
                          "--specdec-settle-timeout=0", "--specdec-base-draft=eagle3=/heads/a",
                          "--specdec-draft=eagle3=/heads/b", runs=PAIRS, max_runs=PAIRS)
    run.result.assert_outcomes(failed=1)
    step = run.test["drift"]["verdicts"]["step_time_drift"]
    assert step["verdict"] == "regressed" and "Benjamini-Hochberg over" in step["note"], step
    assert "drift within the session regressed: step_time_drift" in run.test["error"], run.test["error"]
    results = run.reports / "latest.json"
    text = cli("compare", results)
    assert text.returncode == 1, text.stdout + text.stderr
    assert "    step time regressed (gated): early " in text.stdout, text.stdout
    data = json.loads(cli("compare", results, "--json").stdout)
    assert data["drifted"] == [run.test["nodeid"]] == data["failed"], data
