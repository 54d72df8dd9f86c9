"""Coalesced streams: tokens that arrive more per chunk than one engine step makes mark a run's latency
figures untrusted; they leave the latency verdicts, with the reason in the terminal, the JSON and the report."""

from __future__ import annotations

import json

import pytest

from conftest import FAKE_PROFILE
from fake_server import FakeConfig, FakeServer
from pytest_specdec.measure.types import RequestSample
from pytest_specdec.measure.runner import ValidityRules, latency_untrusted
from pytest_specdec.measure.metrics import chunking


def _sample(chunks: list[tuple[float, int]]) -> RequestSample:
    s = RequestSample(prompt_id="p", start=0.0, chunks=chunks)
    s.output_tokens = sum(n for _, n in chunks)
    return s


def test_a_stream_that_arrives_step_by_step_is_not_coalesced() -> None:
    plain = chunking([_sample([(0.01 * i, 1) for i in range(1, 65)])], step_limit=1)
    assert plain.over_limit_share == 0.0 and plain.reads == {1: 64} and plain.events == {1: 64}
    # With k = 3 a step makes up to 4 tokens: 4-token events are one step each.
    spec = chunking([_sample([(0.01, 1), *((0.01 * i, 4) for i in range(2, 18))])], step_limit=4)
    assert spec.over_limit_share == 0.0 and spec.merged_events == 0
    assert latency_untrusted(spec, ValidityRules()) == []


def test_merged_events_blame_the_api_server() -> None:
    # 8 tokens per event without speculation: vLLM's API server merged 8 steps per event.
    c = chunking([_sample([(0.01 * i, 8) for i in range(1, 9)])], step_limit=1)
    assert c.over_limit_share == 1.0 and c.merged_events == 8 and c.max_event_tokens == 8
    reasons = latency_untrusted(c, ValidityRules())
    assert len(reasons) == 1 and "100% of tokens arrived more than 1 per chunk" in reasons[0]
    assert "the API server was the bottleneck" in reasons[0]


def test_events_read_together_blame_the_client() -> None:
    # One token per event, but the first 40 events share one arrival time: the client read them at once.
    chunks = [(0.5, 1)] * 40 + [(0.5 + 0.01 * i, 1) for i in range(1, 25)]
    c = chunking([_sample(chunks)], step_limit=1)
    assert c.merged_events == 0 and c.max_read_events == 40 and c.reads[40] == 1
    assert c.over_limit_tokens == 40 and c.over_limit_share == pytest.approx(40 / 64)
    reasons = latency_untrusted(c, ValidityRules())
    assert "the client read up to 40 events at once" in reasons[0] and "not the server" in reasons[0]


def test_the_threshold_is_a_share_of_the_runs_tokens() -> None:
    # 2 of 100 tokens came in one read: 2 %, under the default 5 %; a 1 % limit flags it.
    chunks = [(0.0, 1), (0.0, 1), *((0.01 * i, 1) for i in range(1, 99))]
    c = chunking([_sample(chunks)], step_limit=1)
    assert c.over_limit_share == pytest.approx(0.02)
    assert latency_untrusted(c, ValidityRules()) == []
    assert latency_untrusted(c, ValidityRules(max_coalesced_share=0.01))


def test_failed_requests_and_a_bad_limit() -> None:
    bad = _sample([(0.0, 64)])
    bad.error = "timeout"
    assert chunking([bad], step_limit=1).tokens == 0
    with pytest.raises(ValueError, match="step_limit must be >= 1"):
        chunking([], step_limit=0)


SUITE = """
import pytest

@pytest.mark.specdec(method="ngram", k=3, temperature=0.0, concurrency=1, num_prompts=4, max_tokens=16)
def test_ngram(specdec):
    pass
"""

# The shared fake profile without its allowance for in-process servers: this test's servers step slowly.
PROFILE = FAKE_PROFILE.replace("max_coalesced_share = 0.5", "")
assert PROFILE != FAKE_PROFILE

LATENCY_METRICS = {"ttft_p95_ms", "tpot_p95_ms", "e2e_p95_ms", "e2e_p95_ratio"}


def _session(pytester: pytest.Pytester, spec_url: str, ref_url: str, *extra: str) -> tuple[pytest.RunResult, dict]:
    reports = pytester.path / "reports"
    result = pytester.runpytest(
        f"--specdec-profile={pytester.path / 'fake.toml'}", f"--specdec-endpoint={spec_url}",
        f"--specdec-reference-endpoint={ref_url}", f"--specdec-reports={reports}", "-p", "no:cacheprovider", *extra)
    return result, json.loads((reports / "latest.json").read_text())


@pytest.mark.parametrize("bursty, blamed", [
    ("reference", "the API server was the bottleneck"),  # the server merges 16 steps into one event
    ("spec", "the client read up to"),  # events of one step each, written 16 at a time: one read
])
def test_a_bursty_server_is_flagged_and_its_latencies_leave_the_verdicts(
        pytester: pytest.Pytester, bursty: str, blamed: str) -> None:
    pytester.makepyfile(test_suite=SUITE)
    (pytester.path / "fake.toml").write_text(PROFILE)
    # Steps of 20 ms: a client that shares the CPU with other tests is never late by a whole step.
    spec = FakeServer(FakeConfig(k=3, acceptance=(0.8, 0.6, 0.4), step_s=0.02, output_tokens=16))
    ref = FakeServer(FakeConfig(step_s=0.02, output_tokens=16))
    with spec as spec_url, ref as ref_url:
        first, data = _session(pytester, spec_url, ref_url, "--update-baselines=missing")
        first.assert_outcomes(passed=1)
        test = data["tests"][0]
        assert not test["validity"]["latency_untrusted_runs"]  # both servers stream step by step
        assert all(r["chunking"]["merged_events"] == 0 for r in test["runs"] + test["reference_runs"])

        if bursty == "reference":
            ref.reconfigure(merge_steps=16)
        else:
            spec.reconfigure(batch_events=16)
        result, data = _session(pytester, spec_url, ref_url)
    result.assert_outcomes(passed=1)  # throughput and acceptance are right: the test still runs and passes
    test = data["tests"][0]
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


def test_the_reports_reference_latency_skips_coalesced_runs() -> None:
    """The TTFT/E2E charts draw the reference arm from its runs: a burst must not be drawn against a stream."""
    from pytest_specdec.output.sweeps import _reference

    test = {"reference_runs": [
        {"valid": True, "latency_untrusted": [], "ttft_ms": {"p95": 10.0}},
        {"valid": True, "latency_untrusted": ["coalesced stream"], "ttft_ms": {"p95": 200.0}},
        {"valid": False, "latency_untrusted": [], "ttft_ms": {"p95": 300.0}},
        {"valid": True, "ttft_ms": {"p95": 12.0}},  # a results file from before the flag: trusted
    ]}
    assert _reference("ttft_ms", "p95")(test) == 11.0
