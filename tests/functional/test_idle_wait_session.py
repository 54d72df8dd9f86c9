"""The wait before each run ends when the servers are idle, through pytester with servers the plugin starts
(the `vllm serve` stand-in): a server that still holds a run's requests is waited for, and the session's time
split (runs, server starts, waits, efficiency) is in the terminal and the results JSON."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from session import specdec_session

from fakes import STAND_IN_VALIDITY, FakeVllm

LINGER_S = 0.6  # the reference server holds each finished request this long in vllm:num_requests_running


def test_a_server_still_holding_requests_is_waited_for(
        pytester: pytest.Pytester, fake_vllm: FakeVllm, make_profile: Callable[..., Path],
        make_suite: Callable[..., str]) -> None:
    """Runs go reference, spec, spec, reference (the lead swaps from pair to pair): the first spec run follows
    a reference run whose server still reports its requests running for LINGER_S, so it starts only once they
    are gone; the runs that follow the spec server (which lets go at once) wait far less. The time split adds
    up from the runs' records."""
    fake_vllm.configure({"*": {"acceptance": [0.8, 0.6, 0.4], "step_s": 0.002, "output_tokens": 16},
                         "none": {"step_s": 0.004, "output_tokens": 16, "linger_s": LINGER_S}})
    profile = make_profile("fakecpu", methods=("ngram",), runs=2, validity=STAND_IN_VALIDITY)
    pytester.makepyfile(test_suite=make_suite(num_prompts=4, max_tokens=16))
    session = specdec_session(pytester, profile, None, "--update-baselines=missing", max_runs=2)
    r = session.result
    r.assert_outcomes(passed=1)
    r.stdout.fnmatch_lines(["specdec: wall * s: runs * s (4 runs), server starts * s, waits for idle servers * s, "
                            "other * s; efficiency (runs / wall) *%"])
    data = session.results
    test = data["tests"][0]
    after_ref = [test["runs"][0]["settle"]]
    after_spec = [test["runs"][1]["settle"], test["reference_runs"][1]["settle"]]
    for s in after_ref:  # the reference server's requests counted until they were gone
        assert s["quiet"] and s["requests"] == 0 and s["how"] == "cpu"
        assert s["after_run_s"] + s["waited_s"] >= LINGER_S - 0.05, s
    assert test["reference_runs"][0]["settle"]["after_run_s"] is None  # the test's first run follows none
    assert max(s["waited_s"] for s in after_spec) < min(s["waited_s"] for s in after_ref), (after_spec, after_ref)

    t = data["time"]
    runs = [*test["runs"], *test["reference_runs"]]
    assert t["runs"] == 4
    assert t["runs_s"] == pytest.approx(sum(run["duration_s"] for run in runs), abs=0.1)
    assert t["waits_s"] == pytest.approx(sum(run["settle"]["waited_s"] for run in runs), abs=0.1)
    assert t["server_starts_s"] == pytest.approx(sum(s["startup_s"] for s in data["servers"].values()), abs=0.2)
    assert t["efficiency"] == pytest.approx(t["runs_s"] / t["wall_s"], abs=0.01)
    assert t["runs_s"] + t["waits_s"] + t["server_starts_s"] <= t["wall_s"]
