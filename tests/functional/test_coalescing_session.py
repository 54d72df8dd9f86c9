"""Coalesced streams through pytester: a bursty simulated server's runs are flagged and their latencies leave the
verdicts, with the reason in the terminal, the JSON and the report (the detector: tests/unit/test_coalescing.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from session import specdec_session

from fakes import FakeConfig, FakeServer

LATENCY_METRICS = {"ttft_p95_ms", "tpot_p95_ms", "e2e_p95_ms", "e2e_p95_ratio"}


@pytest.mark.parametrize("bursty, blamed", [
    ("reference", "the API server was the bottleneck"),  # the server merges 16 steps into one event
    ("spec", "the client read up to"),  # events of one step each, written 16 at a time: one read
])
def test_a_bursty_server_is_flagged_and_its_latencies_leave_the_verdicts(
        pytester: pytest.Pytester, bursty: str, blamed: str, make_suite: Callable[..., str],
        make_profile: Callable[..., Path]) -> None:
    pytester.makepyfile(test_suite=make_suite(concurrency=1, num_prompts=4, max_tokens=16))
    # The in-process validity limits without the allowance for coalesced streams: these servers step slowly.
    profile = make_profile(validity={"max_loop_lag_mean_ms": 250})
    assert "max_coalesced_share" not in profile.read_text()
    # Steps of 20 ms: a client that shares the CPU with other tests is never late by a whole step.
    spec = FakeServer(FakeConfig(k=3, acceptance=(0.8, 0.6, 0.4), step_s=0.02, output_tokens=16))
    ref = FakeServer(FakeConfig(step_s=0.02, output_tokens=16))
    with spec as spec_url, ref as ref_url:
        first = specdec_session(pytester, profile, (spec_url, ref_url), "--update-baselines=missing")
        first.result.assert_outcomes(passed=1)
        test = first.results["tests"][0]
        assert not test["validity"]["latency_untrusted_runs"]  # both servers stream step by step
        assert all(r["chunking"]["merged_events"] == 0 for r in test["runs"] + test["reference_runs"])

        if bursty == "reference":
            ref.reconfigure(merge_steps=16)
        else:
            spec.reconfigure(batch_events=16)
        second = specdec_session(pytester, profile, (spec_url, ref_url))
    result = second.result
    result.assert_outcomes(passed=1)  # throughput and acceptance are right: the test still runs and passes
    test = second.results["tests"][0]
    flagged = test["validity"]["latency_untrusted_runs"]
    assert [r["arm"] for r in flagged] == [bursty, bursty] and test["validity"]["valid"]
    assert all(blamed in r["reasons"][0] for r in flagged)
    runs = test["reference_runs"] if bursty == "reference" else test["runs"]
    assert all(r["valid"] and r["latency_untrusted"] and r["chunking"]["over_limit_share"] > 0.5 for r in runs)
    if bursty == "spec":  # the summary's latencies are the spec arm's: none of its runs is timed right
        assert test["summary"]["latency_runs"] == 0 and test["summary"]["ttft_ms"]["p95"] is None
    else:
        assert test["summary"]["latency_runs"] == 2 and test["summary"]["ttft_ms"]["p95"] is not None
    verdicts = test["verdicts"]
    assert "speedup" in verdicts and "acceptance_rate" in verdicts  # still judged
    left_out = LATENCY_METRICS if bursty == "spec" else {"e2e_p95_ratio"}  # the spec arm's own P95s stay
    assert not left_out & set(verdicts), sorted(verdicts)
    assert LATENCY_METRICS - left_out <= set(verdicts)
    result.stdout.fnmatch_lines([f"*run 1/2 {bursty}*LATENCY UNTRUSTED: coalesced stream*{blamed}*",
                                 "*2 run(s) of 1 test(s) had a coalesced stream; their latency figures are left out*",
                                 f"*test_ngram*: {bursty} run 2: latency left out: coalesced stream*",
                                 "*test_ngram*: speedup *; P95 E2E spec/ref not judged (coalesced streams*"])
    html = (pytester.path / "reports" / "latest.html").read_text()  # this session's, not the first one's
    assert "latency untrusted" in html and blamed in html
