"""An A/B session (`--specdec-base-draft`) end to end: the reference, the base and the candidate served by the pool
through the `vllm serve` stand-in, interleaved run by run, and the candidate judged against the base pair by pair.

The stand-in gives each draft model its own behaviour (`METHOD:MODEL` keys of its config): an A/A session (two
drafts that behave alike) passes with tok/s not regressed; a candidate whose steps are 30 % slower at the same
acceptance fails on tok/s, attributed to step time, where the marker's thresholds say so and not where the ini's
do, and on P95 TPOT where the marker gates it, after more than one look; one with a lower acceptance is attributed
to acceptance. --specdec-max-runs caps the pairs and --specdec-fail-inconclusive fails an open verdict. Usage errors
(and what an A/B cannot apply) stop the session before anything starts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest
from session import latest, specdec_session, undocumented

from fakes import DISTURBED_RULE_ON, FakeVllm
from pytest_specdec.measure.schedule import warmup_requests

PROMPTS, CONCURRENCY, PAIRS = 4, 2, 6
REF_STEP_S, SPEC_STEP_S = 0.005, 0.01  # every draft accepted (k=3): 4 tokens a spec step, a 2x speedup
# Every server: 16 tokens a request; the reference one token a step; eagle3 accepts every draft unless told.
SERVERS: dict[str, dict[str, Any]] = {"*": {"acceptance": [1.0, 1.0, 1.0], "step_s": SPEC_STEP_S, "output_tokens": 16},
                                      "none": {"step_s": REF_STEP_S, "output_tokens": 16}}
SUITE = {"name": "test_head", "method": "eagle3", "num_prompts": PROMPTS, "concurrency": CONCURRENCY,
         "max_tokens": 16, "body": "assert specdec.result.base_runs"}


@pytest.fixture
def project(pytester: pytest.Pytester, fake_vllm: FakeVllm, make_suite: Callable[..., str],
            make_profile: Callable[..., Path]) -> Path:
    pytester.makepyfile(test_suite=make_suite(**SUITE))
    # The disturbed-run rule on: steps of 5-10 ms make runs long enough to measure. A look every 2 pairs.
    path = make_profile("fakeab", methods=("eagle3",), validity=DISTURBED_RULE_ON)
    path.write_text(path.read_text().replace("[matrix]\n", "[matrix]\nab_look_step = 2\n"))
    return path


def session(pytester: pytest.Pytester, profile: Path, *extra: str, runs: tuple[int, int] = (PAIRS, PAIRS)
            ) -> pytest.RunResult:
    """An A/B session of the suite: ``runs`` pairs
    at the first look and at most (by default one look of PAIRS)."""
    return specdec_session(pytester, profile, None, "--specdec-settle-timeout=0", *extra, runs=runs[0],
                           max_runs=runs[1]).result


def ab_sections(pytester: pytest.Pytester) -> dict[str, dict[str, Any]]:
    """Each test's `ab` section of the results, by test function name."""
    tests = latest(pytester)["tests"]
    return {t["nodeid"].split("::")[-1].split("[")[0]: t["ab"] for t in tests}


def ab_section(pytester: pytest.Pytester) -> dict[str, Any]:
    (ab,) = ab_sections(pytester).values()
    return ab


def test_aa_passes_and_records_three_arms(pytester: pytest.Pytester, project: Path, fake_vllm: FakeVllm) -> None:
    # The base's second run is disturbed (its requests at a third of the speed): the rule covers the third arm too.
    second = warmup_requests(PROMPTS, CONCURRENCY) + PROMPTS + 1
    fake_vllm.configure({**SERVERS, "eagle3:/heads/a": {"slow_posts": [second, second + PROMPTS - 1],
                                                        "slow_factor": 3.0}})
    r = session(pytester, project, "--specdec-base-draft=eagle3=/heads/a", "--specdec-draft=eagle3=/heads/b")
    r.assert_outcomes(passed=1)
    r.stdout.fnmatch_lines(["specdec A/B: *test_head*: candidate /heads/b vs base /heads/a (6 of 6 pairs, max reached)",
                            "  spec tok/s *: Δ * (CI * .. *), p *, catches a drop >= *, threshold -5 %",
                            "specdec A/B: 1 test(s) judged candidate vs base, 0 regressed; verdicts: *"])
    r.stdout.fnmatch_lines(["specdec:   run 2/6 base      DISTURBED: *"])
    # The order within a pair: the reference first, then base and candidate, swapped from pair to pair.
    r.stdout.fnmatch_lines([f"specdec:   run {i}/6 {arm} *" for i, arms in ((1, ("base", "candidate")),
                                                                        (2, ("candidate", "base")))
                            for arm in ("reference", *arms)])
    ab = ab_section(pytester)
    assert ab["regressed"] == [] and ab["attribution"] is None, ab
    assert ab["verdicts"]["output_tok_s"]["verdict"] != "regressed", ab["verdicts"]["output_tok_s"]
    assert ab["verdicts"]["output_tok_s"]["family"] == "gated" and ab["adjusted"] == "session"
    assert (ab["base"]["draft"], ab["candidate"]["draft"]) == ("/heads/a", "/heads/b")
    arms = [(run["arm"], run["index"]) for run in ab["runs"]]
    assert sorted(arms) == sorted((arm, i) for arm in ("reference", "base", "candidate") for i in range(PAIRS)), arms
    disturbed = [(run["arm"], run["index"]) for run in ab["runs"]
                 if any(x.startswith("disturbed: ") for x in run["invalid_reasons"])]
    assert ("base", 1) in disturbed, disturbed  # (a busy machine may disturb another run too)
    assert ab["verdicts"]["output_tok_s"]["n_now"] <= PAIRS - 1
    # The candidate's drift within the session is shown in an A/B session too (not gated here).
    drift = latest(pytester)["tests"][0]["drift"]["verdicts"]
    assert drift["acceptance_drift"]["verdict"] == "unchanged" and drift["acceptance_drift"]["family"] == "shown"
    assert drift["step_time_drift"]["verdict"] != "regressed", drift
    # No stored baseline is read or written in an A/B session.
    assert not (pytester.path / "baselines").exists()
    started = {(s["method"], s["pid"]) for s in fake_vllm.records()}
    assert len(started) == 3, started  # reference, base and candidate: one server each, alive together


#: The marker's, the ini's and the gate's fields in one session: the candidate's steps 60 % slower (tok/s about
#: -37 %, P95 TPOT and E2E about +60 %); the ini loosens tok/s to 70 % and P95 E2E to 200 %.
SLOW_INI = "[pytest]\nspecdec_thresholds =\n    output_tok_s=70\n    e2e_p95_ms=200\n"
SLOW_SUITE = {"test_head": 'thresholds={"output_tok_s": 5}', "test_ini": None, "test_gate": 'gate=["tpot_p95_ms"]'}


def test_slower_candidate_judged_by_the_marker_ini_and_gate_over_looks(
        pytester: pytest.Pytester, project: Path, fake_vllm: FakeVllm, make_suite: Callable[..., str],
        capsys: pytest.CaptureFixture[str]) -> None:
    pytester.makepyfile(test_suite="".join(make_suite(**{**SUITE, "name": name, "verdicts": verdicts})
                                           for name, verdicts in SLOW_SUITE.items()))
    pytester.makeini(SLOW_INI)
    fake_vllm.configure({**SERVERS, "eagle3:/heads/slow": {"step_s": SPEC_STEP_S * 1.6}})
    # One pair at the first look (too little data, always inconclusive), then 3 and 5: --specdec-max-runs caps it
    # below the profile's 8 A/B pairs.
    r = session(pytester, project, "--specdec-base-draft=eagle3=/heads/a", "--specdec-draft=eagle3=/heads/slow",
                f"--junitxml={pytester.path / 'junit.xml'}", runs=(1, 5))
    # What the session decided, over its whole A/B family (a regression may show at its test's end, or, as BH pads
    # the family with the tests to come, only once every p-value is in: a late one fails the session).
    assert r.ret == pytest.ExitCode.TESTS_FAILED
    outcomes = {t["nodeid"].split("::")[-1].split("[")[0]: t["outcome"]
                for t in latest(pytester)["tests"]}
    assert outcomes["test_ini"] == "passed", outcomes
    ab = ab_sections(pytester)
    assert all(x["adjusted"] == "session" for x in ab.values())
    # The marker's threshold (5 %) over the ini's (70 %): tok/s regressed, attributed to step time.
    r.stdout.fnmatch_lines(["*the candidate regressed against the base: output_tok_s*",
                            "*attribution: step time (the candidate drafts the same tokens more slowly); speedup -*: "
                            "acceptance unchanged (τ 4.00 → 4.00, +0.0 %), spec step time +* % (in reference steps); "
                            "mostly step time"])
    head = ab["test_head"]
    assert head["thresholds"]["per_metric"]["output_tok_s"] == 5.0 and head["regressed"] == ["output_tok_s"], head
    assert head["attribution"] == "step time" and head["verdicts"]["acceptance_rate"]["verdict"] == "unchanged"
    # the candidate's steps are 60 % dearer at the same τ: the split finds it in the step time
    assert head["split"]["cause"] == "step time" and head["split"]["tau_change_pct"] == 0.0, head["split"]
    assert 30 < head["split"]["step_change_pct"] < 100, head["split"]
    # The ini's thresholds where the marker says none: the same drop is inside 70 %, and the test passes.
    ini = ab["test_ini"]
    assert ini["thresholds"]["per_metric"] == {**ini["thresholds"]["per_metric"], "output_tok_s": 70.0,
                                               "e2e_p95_ms": 200.0}, ini["thresholds"]
    assert ini["regressed"] == [] and ini["verdicts"]["output_tok_s"]["verdict"] in ("unchanged", "inconclusive")
    # More than one look: the first (one pair) is inconclusive, so pairs are added, alpha split over 3 looks.
    for name in SLOW_SUITE:
        assert ab[name]["looks"][:2] == [1, 3] and ab[name]["planned_looks"] == [1, 3, 5], ab[name]
        assert ab[name]["ci_level"] == pytest.approx(1 - 2 * 0.05 / 3)
    r.stdout.fnmatch_lines(["specdec A/B: *test_ini*: inconclusive at look 1 of 3: 3 pairs"])
    # The marker's gate=[...]: P95 TPOT judged pair by pair in the gated family (an A/B judges no TPOT otherwise),
    # and only it may fail the test (tok/s and E2E are within the ini's). Whether its +60 % clears BH over the
    # session's family at 3 to 5 pairs depends on the machine's noise: regressed, or inconclusive.
    gate = ab["test_gate"]
    assert gate["gate"] == ["output_tok_s", "acceptance_rate", "e2e_p95_ms", "tpot_p95_ms"], gate
    tpot = gate["verdicts"]["tpot_p95_ms"]
    assert tpot["family"] == "gated" and tpot["delta"] > 10 and tpot["verdict"] in ("regressed", "inconclusive"), tpot
    assert gate["regressed"] == (["tpot_p95_ms"] if tpot["verdict"] == "regressed" else []), gate["verdicts"]
    junit = ElementTree.parse(pytester.path / "junit.xml")
    properties = {p.get("name"): p.get("value") for p in junit.iter("property")}
    assert properties["specdec_ab"] == "candidate /heads/slow vs base /heads/a", properties
    assert properties["specdec_ab_verdict_output_tok_s"].split()[0] in ("regressed", "unchanged", "inconclusive")
    report = (pytester.path / "reports" / "latest.html").read_text()
    assert "A/B: candidate /heads/slow vs base /heads/a" in report and "step time (the candidate drafts" in report
    assert re.search(r"runs: reference \d valid of [35]; base \d valid of [35]; candidate \d valid of [35]", report)
    # the A/B's table worded as the nightly's (`output.wording`): the metric's label, Δ and its CI alike
    assert re.search(r"<td class=\"l\">spec tok/s</td><td class=\"l\">gated</td><td>[\d.]+</td><td>[\d.]+</td>"
                     r"<td>-[\d.]+ %</td><td>-[\d.]+ % \.\. [-+][\d.]+ %</td>", report)
    check_compare_and_history(pytester.path / "reports", ab, capsys)


def check_compare_and_history(reports: Path, ab: dict[str, dict[str, Any]], capsys: pytest.CaptureFixture[str]
                              ) -> None:
    """`pytest-specdec compare` and `history` read the A/B session's results: compare judges each test again
    through the A/B gate's functions (the session's very verdicts), alone or beside another A/B file; history
    lists the candidate and its base."""
    from pytest_specdec.cli import main

    capsys.readouterr()  # what pytester printed so far
    latest = reports / "latest.json"
    (stamped,) = [p for p in reports.glob("specdec-*.json") if not p.name.endswith(".outputs.json")]
    assert main(["compare", str(latest), "--json"]) == 1  # its regressions fail, as they failed the session
    out = json.loads(capsys.readouterr().out)
    assert sorted(out["failed"]) == sorted(t for t in out["regressed"]), out
    for t in out["tests"]:
        name = t["nodeid"].split("::")[-1].split("[")[0]
        recorded = {m: (v["verdict"], v["delta"], v["p"]) for m, v in ab[name]["verdicts"].items()}
        assert {m: (v["verdict"], v["delta"], v["p"]) for m, v in t["verdicts"].items()} == recorded, name
    assert main(["compare", str(stamped), str(latest)]) == 1
    text = capsys.readouterr().out
    assert "specdec compare: 3 A/B test(s) of " in text and "output_tok_s: Δ -" in text, text
    assert f" in {stamped} (candidate /heads/slow vs base /heads/a) → Δ " in text, text
    assert main(["history", str(reports)]) == 0
    text = capsys.readouterr().out
    assert "(A/B: candidates, and their bases as <test> (A/B base))" in text, text
    assert re.search(r"test_suite.py::test_ini\[\S+\] \(A/B base\)\n  speedup ", text), text


#: Thresholds wide enough that a few pairs of the stand-in settle each gated verdict: what these tests check is
#: the stop, not the noise of a shared machine.
WIDE = 'thresholds={"output_tok_s": 15, "e2e_p95_ms": 100}'


@pytest.mark.parametrize(("candidate", "step_s", "stop", "verdict"),
                         [("/heads/b", SPEC_STEP_S, "equivalence", "unchanged"),
                          ("/heads/slow", SPEC_STEP_S / 0.7, "regressed", "regressed")], ids=["aa", "minus30"])
def test_a_test_stops_early_both_ways(pytester: pytest.Pytester, project: Path, fake_vllm: FakeVllm,
                                      make_suite: Callable[..., str], candidate: str, step_s: float, stop: str,
                                      verdict: str) -> None:
    # Looks at 4, 6, 8, 10 pairs: an A/A stops with tok/s unchanged, a candidate 30 % slower with tok/s
    # regressed, each before the maximum, and says so (terminal, session line, JSON).
    pytester.makepyfile(test_suite=make_suite(**{**SUITE, "verdicts": WIDE}))
    fake_vllm.configure({**SERVERS, f"eagle3:{candidate}": {"step_s": step_s}})
    r = session(pytester, project, "--specdec-base-draft=eagle3=/heads/a", f"--specdec-draft=eagle3={candidate}",
                runs=(4, 10))
    ab = ab_section(pytester)
    assert ab["stop"] == stop and ab["pairs"] < ab["max_pairs"] == 10 and ab["unspent_runs"] > 0, ab
    assert ab["planned_looks"] == [4, 6, 8, 10] and ab["looks"][-1] == ab["pairs"], ab
    assert ab["verdicts"]["output_tok_s"]["verdict"] == verdict, ab["verdicts"]["output_tok_s"]
    r.stdout.fnmatch_lines([f"specdec A/B: *test_head*: stopped at {ab['pairs']} of 10 pairs ({stop}): *",
                            f"specdec A/B: *test_head*: candidate {candidate} vs base /heads/a ({ab['pairs']} of 10 "
                            "pairs*stopped: *",
                            f"specdec A/B: pairs used {ab['pairs']} of at most 10; stopped: 1 {stop}"])
    r.assert_outcomes(**({"passed": 1} if stop == "equivalence" else {"failed": 1}))


def test_max_runs_caps_the_pairs_and_fail_inconclusive_fails(pytester: pytest.Pytester, project: Path,
                                                               fake_vllm: FakeVllm) -> None:
    # One pair: every gated verdict has too little data. --specdec-max-runs 1 keeps it there (else the looks would
    # add pairs up to the profile's 8), and --specdec-fail-inconclusive fails the test for it.
    fake_vllm.configure(SERVERS)
    r = session(pytester, project, "--specdec-base-draft=eagle3=/heads/a", "--specdec-fail-inconclusive",
                runs=(1, 1))
    r.assert_outcomes(failed=1)
    r.stdout.fnmatch_lines(["*specdec A/B: 3 gated A/B metric(s) inconclusive after 1 pair(s): *"
                            "(--specdec-fail-inconclusive)"])
    ab = ab_section(pytester)
    assert ab["looks"] == [1] and ab["planned_looks"] == [1] and ab["unspent_runs"] == 0, ab
    assert {v["verdict"] for v in ab["verdicts"].values()} == {"inconclusive"}, ab["verdicts"]


def test_one_server_at_a_time_takes_abba_blocks_of_the_three_arms(pytester: pytest.Pytester, project: Path,
                                                                  fake_vllm: FakeVllm) -> None:
    # Where the servers cannot be alive at once (an 8B target three times on one GPU), blocks of pairs per arm.
    fake_vllm.configure(SERVERS)
    r = session(pytester, project, "--specdec-base-draft=eagle3=/heads/a", "--specdec-draft=eagle3=/heads/b",
                "--specdec-max-servers=1", "--specdec-block-runs=3")
    r.assert_outcomes(passed=1)
    runs = re.finditer(r"run (\d)/6 (reference|base|candidate) +[\d.]+ tok/s", r.stdout.str())
    order = [(int(m[1]), m[2]) for m in runs]
    blocks = [[(i, a) for i in range(first, first + 3)] for first, arms in ((1, ("reference", "base", "candidate")),
                                                                            (4, ("candidate", "base", "reference")))
              for a in arms]
    assert order == [x for block in blocks for x in block], order
    ab = ab_section(pytester)
    # A block's pairs share its servers and the machine's drift: the unit of the speed verdicts is the block (pair
    # by pair, a load change on CI once read -5.1 % here, "regressed"; two blocks give the t one df).
    tok_s = ab["verdicts"]["output_tok_s"]
    assert tok_s["n_now"] == 6 and "unit: block of base/candidate pairs (2 block(s), 6 pairs" in tok_s["note"], tok_s
    assert ab["regressed"] == [] and tok_s["df"] == 1, ab["verdicts"]
    assert [(r["arm"], r["index"], r["block"]) for r in ab["runs"] if r["arm"] == "base"] == [
        ("base", i, i // 3) for i in range(6)], ab["runs"]


def test_lower_acceptance_is_attributed_to_acceptance(pytester: pytest.Pytester, project: Path,
                                                      fake_vllm: FakeVllm) -> None:
    fake_vllm.configure({**SERVERS, "eagle3:/nonexistent/head": {"acceptance": [0.5, 0.4, 0.3]}})
    r = session(pytester, project, "--specdec-base-draft=eagle3=/heads/a")  # the candidate: the profile's head
    r.assert_outcomes(failed=1)
    r.stdout.fnmatch_lines(["*attribution: acceptance (the candidate's drafts are accepted less often); speedup -*: "
                            "acceptance lower (τ 4.00 → *, -*), spec step time * (in reference steps); "
                            "mostly acceptance"])
    ab = ab_section(pytester)
    assert "acceptance_rate" in ab["regressed"] and ab["attribution"] == "acceptance", ab["verdicts"]
    # τ 4 → 2.2 (1 + 0.5 + 0.4 + 0.3) at the same step cost. The fake draws one u a step and accepts the positions
    # with u < acceptance[i]: 0-3 accepted, sd 1.33 a step, over about 170 steps (6 runs x 4 prompts x 7 steps),
    # so τ's sd is about 0.10. ±0.4 (4 sd) around 2.2 is -55 % .. -35 %; ±0.2 failed about one run in nine.
    assert ab["split"]["cause"] == "acceptance" and -55 < ab["split"]["tau_change_pct"] < -35, ab["split"]


@pytest.mark.parametrize(("extra", "message"), [
    (("--specdec-base-draft=eagle3=/heads/a", "--update-baselines"),
     "ERROR: --update-baselines with --specdec-base-draft: an A/B session judges the candidate against the base*"),
    (("--specdec-base-python=/usr/bin/python3", "--specdec-calibrate"),
     "ERROR: --specdec-calibrate with --specdec-base-python: a calibration measures how stored nights move*"),
    (("--specdec-base-draft=eagle3=/heads/a", "--specdec-strict"),
     "ERROR: --specdec-strict with --specdec-base-draft: it fails a session on a stored baseline measured under "
     "other conditions, and an A/B session reads no stored night; drop --specdec-strict for the A/B session"),
    (("--specdec-base-draft=eagle3=/heads/a", "-o", "specdec_gate=e2e_p95_ratio"),
     "ERROR: ini specdec_gate names e2e_p95_ratio, which an A/B session cannot gate*"),
    (("--specdec-base-draft=medusa=/heads/a",),
     "ERROR: --specdec-base-draft medusa=...: method 'medusa' is not in profile 'fakeab'; allowed: eagle3"),
    (("--specdec-base-draft=eagle3",), "ERROR: --specdec-base-draft expects METHOD=MODEL*, got 'eagle3'"),
])
def test_usage_errors(pytester: pytest.Pytester, project: Path, fake_vllm: FakeVllm, extra: tuple[str, ...],
                      message: str) -> None:
    r = pytester.runpytest(f"--specdec-profile={project}", f"--specdec-runs={PAIRS}", *extra)
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    r.stderr.fnmatch_lines([message])
    assert fake_vllm.records() == []  # nothing started


def test_a_marker_field_an_ab_cannot_apply_is_a_usage_error(pytester: pytest.Pytester, project: Path,
                                                           fake_vllm: FakeVllm, make_suite: Callable[..., str]) -> None:
    pytester.makepyfile(test_suite=make_suite(**SUITE, verdicts='gate=["speedup"]'))
    r = session(pytester, project, "--specdec-base-draft=eagle3=/heads/a")
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    r.stderr.fnmatch_lines(["ERROR: test_suite.py::test_head?*?: specdec_verdicts(gate=?'speedup'?): an A/B session "
                            "judges the candidate against the base pair by pair and cannot gate speedup; *"])
    assert fake_vllm.records() == []


def test_dry_run_lists_the_base_server(pytester: pytest.Pytester, project: Path, fake_vllm: FakeVllm) -> None:
    r = session(pytester, project, "--specdec-base-draft=eagle3=/heads/a", "--specdec-dry-run")
    r.assert_outcomes(skipped=1)
    r.stdout.fnmatch_lines(["    spec [[]*]: * serve fake-model *\"model\": \"/nonexistent/head\"*",
                            "    base [[]*]: * serve fake-model *\"model\": \"/heads/a\"*",
                            "specdec dry run: 3 distinct server(s): *"])
    assert fake_vllm.records() == []


#: Goodput: the candidate accepts all three drafts or none, by halves, so its requests take 4 to 15 decode steps where
#: the base's take 4; an E2E SLO above the base's requests and below the candidate's slower half makes its goodput
#: fall by about half (-50 to -65 % over 6 pairs, p < 0.01). Thresholds wide enough that tok/s, acceptance and P95
#: E2E leave the gated family be. (That goodput is shown, never failing, where not gated: tests/unit/test_goodput.py.)
GOODPUT_SLO_MS = 150
GOODPUT_SUITE = {"name": "test_gated", "max_tokens": 16, "goodput": {"e2el": GOODPUT_SLO_MS},
                 "verdicts": ('gate=["goodput"], '
                              'thresholds={"output_tok_s": 95, "acceptance_rate": 95, "e2e_p95_ms": 900}')}


def test_goodput_falls_regressed_and_failing_where_gated(
        pytester: pytest.Pytester, project: Path, fake_vllm: FakeVllm, make_suite: Callable[..., str],
        capsys: pytest.CaptureFixture[str]) -> None:
    pytester.makepyfile(test_suite=make_suite(**{**SUITE, **GOODPUT_SUITE}))
    fake_vllm.configure({**SERVERS, "*": {**SERVERS["*"], "step_s": 0.02},
                         "eagle3:/heads/coin": {"acceptance": [0.5, 0.5, 0.5]}})
    r = session(pytester, project, "--specdec-base-draft=eagle3=/heads/a", "--specdec-draft=eagle3=/heads/coin")
    r.assert_outcomes(failed=1)
    ab = ab_section(pytester)
    goodput = ab["verdicts"]["goodput"]
    assert goodput["family"] == "gated" and goodput["verdict"] == "regressed", goodput
    assert ab["regressed"] == ["goodput"], ab["verdicts"]  # the other gated metrics are inside their thresholds
    # each run's goodput with the SLOs it was counted against, in the results
    run = ab["runs"][0]
    assert run["goodput_slos_ms"] == {"e2el": GOODPUT_SLO_MS} and run["goodput_req_s"] > 0, run
    r.stdout.fnmatch_lines(["specdec: *test_gated*: * tok/s vs reference *, goodput *x (* vs reference * req/s "
                            "meeting the SLOs)*", "  goodput spec/ref regressed: Δ -*",
                            "*the candidate regressed against the base: goodput*"])
    # `pytest-specdec compare` judges the goodput again from the recorded runs, as the session did
    from pytest_specdec.cli import main

    capsys.readouterr()
    assert main(["compare", str(pytester.path / "reports" / "latest.json"), "--json"]) == 1
    (again,) = [t["verdicts"]["goodput"] for t in json.loads(capsys.readouterr().out)["tests"]]
    assert (again["verdict"], again["delta"]) == (goodput["verdict"], goodput["delta"])


def test_an_ab_sweep_judges_the_candidates_crossover_against_the_bases(
        pytester: pytest.Pytester, fake_vllm: FakeVllm, make_suite: Callable[..., str],
        make_profile: Callable[..., Path]) -> None:
    """A concurrency sweep run as an A/B: the candidate's crossover judged against the base arm's, measured in the
    same interleaved pairs; gated (``specdec_gate = crossover``) its regression fails the session while every test's
    own verdicts stay within their loose thresholds. The speedup is 2 / (1 + cost x requests in flight): the base's
    cost 1/16 crosses 1.0 at c = 16, the candidate's 1/4 at c = 4."""
    pytester.makepyfile(test_suite=make_suite(name="test_sweep", method="eagle3", concurrency=[2, 8, 32],
                                              num_prompts=32, max_tokens=5, body="assert specdec.result.base_runs"))
    profile = make_profile("fakeab", methods=("eagle3",))
    fake_vllm.configure({"none": {"step_s": 0.016, "output_tokens": 5},
                         "*": {"acceptance": [1.0, 1.0, 1.0], "step_s": 0.032, "output_tokens": 5},
                         "eagle3:/heads/a": {"spec_cost_per_request": 1 / 16},
                         "eagle3:/heads/b": {"spec_cost_per_request": 1 / 4}})
    r = session(pytester, profile, "--specdec-base-draft=eagle3=/heads/a", "--specdec-draft=eagle3=/heads/b",
                "-o", "specdec_gate=crossover", "--specdec-threshold=rate=90", "--specdec-threshold=latency=900",
                runs=(3, 3))
    r.assert_outcomes(passed=3)
    assert r.ret == pytest.ExitCode.TESTS_FAILED, r.stdout.str()
    r.stdout.fnmatch_lines(["specdec crossover *test_sweep[[]eagle3-k3-t0.0[]] (eagle3 k=3): *; regressed * against "
                            "the base arm, this session (gated) — the session fails (crossover is in the gate)"])
    (entry,) = latest(pytester)["crossovers"]
    assert undocumented(latest(pytester)) == []  # every field an A/B session wrote is in docs/results.md
    assert entry["stored"]["started"] == "the base arm, this session" and entry["failed"], entry
    assert entry["crossover"]["value"] < 8 and entry["verdict"]["verdict"] == "regressed", entry
    # No record is read or written by an A/B session.
    assert not (pytester.path / "baselines").exists()
