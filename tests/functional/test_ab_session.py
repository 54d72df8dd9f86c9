"""An A/B session (`--specdec-base-draft`) end to end: the reference, the base and the candidate served by the pool
through the `vllm serve` stand-in, interleaved run by run, and the candidate judged against the base pair by pair.

The stand-in gives each draft model its own behaviour (`METHOD:MODEL` keys of its config): an A/A session (two
drafts that behave alike) passes with tok/s not regressed; a candidate whose steps are 30 % slower at the same
acceptance fails on tok/s, attributed to step time; one with a lower acceptance is attributed to acceptance.
Usage errors stop the session before anything starts.
"""

from __future__ import annotations

import json
import re
from xml.etree import ElementTree
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
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
    # The disturbed-run rule on: steps of 5-10 ms make runs long enough to measure.
    return make_profile("fakeab", methods=("eagle3",), validity=DISTURBED_RULE_ON)


def session(pytester: pytest.Pytester, profile: Path, *extra: str) -> pytest.RunResult:
    """An A/B session of the suite's one test (a subprocess: the project's conftest replaces vLLM's launcher)."""
    return pytester.runpytest_subprocess(
        f"--specdec-profile={profile}", f"--specdec-reports-dir={pytester.path / 'reports'}", "-p", "no:cacheprovider",
        "--specdec-settle-timeout=0", f"--specdec-runs={PAIRS}", *extra)


def ab_section(pytester: pytest.Pytester) -> dict[str, Any]:
    (test,) = json.loads((pytester.path / "reports" / "latest.json").read_text())["tests"]
    return test["ab"]  # type: ignore[no-any-return]


def test_aa_passes_and_records_three_arms(pytester: pytest.Pytester, project: Path, fake_vllm: FakeVllm) -> None:
    # The base's second run is disturbed (its requests at a third of the speed): the rule covers the third arm too.
    second = warmup_requests(PROMPTS, CONCURRENCY) + PROMPTS + 1
    fake_vllm.configure({**SERVERS, "eagle3:/heads/a": {"slow_posts": [second, second + PROMPTS - 1],
                                                        "slow_factor": 3.0}})
    r = session(pytester, project, "--specdec-base-draft=eagle3=/heads/a", "--specdec-draft=eagle3=/heads/b")
    r.assert_outcomes(passed=1)
    r.stdout.fnmatch_lines(["specdec A/B: *test_head*: candidate /heads/b vs base /heads/a (? pairs)",
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
    # No stored baseline is read or written in an A/B session.
    assert not (pytester.path / "baselines").exists()
    started = {(s["method"], s["pid"]) for s in fake_vllm.records()}
    assert len(started) == 3, started  # reference, base and candidate: one server each, alive together


def test_slower_candidate_regresses_on_step_time(pytester: pytest.Pytester, project: Path,
                                                  fake_vllm: FakeVllm) -> None:
    fake_vllm.configure({**SERVERS, "eagle3:/heads/slow": {"step_s": SPEC_STEP_S * 1.3}})
    r = session(pytester, project, "--specdec-base-draft=eagle3=/heads/a", "--specdec-draft=eagle3=/heads/slow",
                f"--junitxml={pytester.path / 'junit.xml'}")
    r.assert_outcomes(failed=1)
    r.stdout.fnmatch_lines(["*specdec A/B: the candidate regressed against the base: output_tok_s*",
                            "*attribution: step time (the candidate drafts the same tokens more slowly); speedup -*: "
                            "acceptance unchanged (τ 4.00 → 4.00, +0.0 %), spec step time +* % (in reference steps); "
                            "mostly step time",
                            "specdec A/B: 1 test(s) judged candidate vs base, 1 regressed (test_head*: step time)*"])
    # the test's line: what its (candidate's) speedup is made of
    r.stdout.fnmatch_lines(["specdec: *test_head*: * tok/s vs reference *, speedup *x, acceptance 1.000; τ 4.00 "
                            "(k 3; i.i.d. 4.00 from α 1.000), predicted speedup *x vs measured *x, efficiency *"])
    ab = ab_section(pytester)
    assert "output_tok_s" in ab["regressed"] and ab["attribution"] == "step time", ab["verdicts"]
    # the candidate's steps are 30 % dearer at the same τ: the split finds it in the step time
    assert ab["split"]["cause"] == "step time" and ab["split"]["tau_change_pct"] == 0.0, ab["split"]
    assert 10 < ab["split"]["step_change_pct"] < 60, ab["split"]
    assert ab["verdicts"]["acceptance_rate"]["verdict"] == "unchanged"
    junit = ElementTree.parse(pytester.path / "junit.xml")
    properties = {p.get("name"): p.get("value") for p in junit.iter("property")}
    assert properties["specdec_ab"] == "candidate /heads/slow vs base /heads/a", properties
    assert properties["specdec_ab_verdict_output_tok_s"].startswith("regressed -"), properties
    assert properties["specdec_ab_attribution"] == "step time" and properties["specdec_runs_base"].endswith(" of 6")
    report = (pytester.path / "reports" / "latest.html").read_text()
    assert "A/B: candidate /heads/slow vs base /heads/a" in report and "step time (the candidate drafts" in report
    assert re.search(r"runs: reference \d valid of 6; base \d valid of 6; candidate \d valid of 6", report)
    # the A/B's table worded as the nightly's (`output.wording`): the metric's label, Δ and its CI alike
    assert re.search(r"<td class=\"l\">spec tok/s</td><td class=\"l\">gated</td><td>[\d.]+</td><td>[\d.]+</td>"
                     r"<td>-[\d.]+ %</td><td>-[\d.]+ % \.\. [-+][\d.]+ %</td>", report)


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
    assert ab["verdicts"]["output_tok_s"]["n_now"] >= 2 and ab["regressed"] == [], ab["verdicts"]


def test_lower_acceptance_is_attributed_to_acceptance(pytester: pytest.Pytester, project: Path,
                                                      fake_vllm: FakeVllm) -> None:
    fake_vllm.configure({**SERVERS, "eagle3:/nonexistent/head": {"acceptance": [0.5, 0.4, 0.3]}})
    r = session(pytester, project, "--specdec-base-draft=eagle3=/heads/a")  # the candidate: the profile's head
    r.assert_outcomes(failed=1)
    r.stdout.fnmatch_lines(["*attribution: acceptance (the candidate's drafts are accepted less often); speedup -*: "
                            "acceptance lower (τ 4.00 → 2.*, -*), spec step time * (in reference steps); "
                            "mostly acceptance"])
    ab = ab_section(pytester)
    assert "acceptance_rate" in ab["regressed"] and ab["attribution"] == "acceptance", ab["verdicts"]
    # τ 4 → 2.2 (1 + 0.5 + 0.4 + 0.3) at the same step cost
    assert ab["split"]["cause"] == "acceptance" and -50 < ab["split"]["tau_change_pct"] < -40, ab["split"]


@pytest.mark.parametrize(("extra", "message"), [
    (("--specdec-base-draft=eagle3=/heads/a", "--update-baselines"),
     "ERROR: --update-baselines with --specdec-base-draft: an A/B session judges the candidate against the base*"),
    (("--specdec-base-draft=medusa=/heads/a",),
     "ERROR: --specdec-base-draft medusa=...: method 'medusa' is not in profile 'fakeab'; allowed: eagle3"),
    (("--specdec-base-draft=eagle3",), "ERROR: --specdec-base-draft expects METHOD=MODEL*, got 'eagle3'"),
])
def test_usage_errors(pytester: pytest.Pytester, project: Path, fake_vllm: FakeVllm, extra: tuple[str, ...],
                      message: str) -> None:
    r = session(pytester, project, *extra)
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    r.stderr.fnmatch_lines([message])
    assert fake_vllm.records() == []  # nothing started


def test_dry_run_lists_the_base_server(pytester: pytest.Pytester, project: Path, fake_vllm: FakeVllm) -> None:
    r = session(pytester, project, "--specdec-base-draft=eagle3=/heads/a", "--specdec-dry-run")
    r.assert_outcomes(skipped=1)
    r.stdout.fnmatch_lines(["    spec [[]*]: * serve fake-model *\"model\": \"/nonexistent/head\"*",
                            "    base [[]*]: * serve fake-model *\"model\": \"/heads/a\"*",
                            "specdec dry run: 3 distinct server(s): *"])
    assert fake_vllm.records() == []
