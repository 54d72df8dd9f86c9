"""Coalesced streams: tokens that arrive more per chunk than one engine step makes mark a run's latency
figures untrusted; they leave the latency verdicts (through the plugin: tests/functional/test_coalescing_session.py)."""

from __future__ import annotations

import pytest

from pytest_specdec.measure.metrics import chunking
from pytest_specdec.measure.types import RequestSample
from pytest_specdec.measure.validity import ValidityRules, latency_untrusted


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


def test_the_reports_reference_latency_skips_coalesced_runs() -> None:
    """The TTFT/E2E charts draw the reference arm from its runs: a burst must not be drawn against a stream."""
    from pytest_specdec.formats import RESULTS_SCHEMA
    from pytest_specdec.measure.record import RUN_FIELDS
    from pytest_specdec.output.schema import load
    from pytest_specdec.output.sweeps import _reference

    run = {**dict.fromkeys(RUN_FIELDS), "index": 0, "invalid_reasons": [], "hd_p95_ms": {}}
    test = {"nodeid": "t", "outcome": "passed", "reference_runs": [
        {**run, "valid": True, "latency_untrusted": [], "ttft_ms": {"p95": 10.0}},
        {**run, "valid": True, "latency_untrusted": ["coalesced stream"], "ttft_ms": {"p95": 200.0}},
        {**run, "valid": False, "latency_untrusted": [], "ttft_ms": {"p95": 300.0}},
        {**run, "valid": True, "latency_untrusted": [], "ttft_ms": {"p95": 12.0}},
    ]}
    assert _reference("ttft_ms", "p95")(load({"schema": RESULTS_SCHEMA, "tests": [test]}).tests[0]) == 11.0
