"""A rate sweep end to end through pytester, against simulated vLLM servers (endpoint mode): one session.

Three points (1/3, 2/3 and all of the reference's saturation) of one spec config whose verification cost rises
with the requests in flight (`FakeConfig.spec_cost_per_request`, 1/4: a spec step costs the reference's at 4 in
flight). The saturation is measured once, at the sweep's first test, and every test records it with the rate it
offered; the sweep's latency speedups give the stop-paying rate, written to the JSON, the record beside the
baselines and the report. How it is judged against a stored night is the crossover's gate (tests/unit).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from session import specdec_session

from fakes import FakeServerProcess
from pytest_specdec.cli import main
from pytest_specdec.gate.kinds import INCONCLUSIVE, UNCHANGED

REF_STEP_S, SPEC_STEP_S = 0.032, 0.016  # as the crossover session's: 2.0x before the verification cost
SUITE = {"rate_sweep": 3, "concurrency": 8, "num_prompts": 8, "max_tokens": 5,
         "body": "assert specdec.result.runs"}


@pytest.fixture
def servers(fake_server_process: Callable[..., FakeServerProcess]) -> Callable[..., FakeServerProcess]:
    return fake_server_process


def test_rate_sweep_records_its_rates_and_the_stop_paying_rate(
    pytester: pytest.Pytester, fake_profile: Any, servers: Callable[..., FakeServerProcess],
    make_suite: Callable[..., str], capsys: pytest.CaptureFixture[str],
) -> None:
    ref = servers(k=0, step_s=REF_STEP_S, seed=2)
    spec = servers(k=3, acceptance=(0.0, 0.0, 0.0), step_s=SPEC_STEP_S, seed=1, spec_cost_per_request=1 / 4)
    pytester.makepyfile(test_suite=make_suite(name="test_load", **SUITE))
    session = specdec_session(pytester, fake_profile, (spec, ref), "--update-baselines", runs=3, max_runs=3)
    result = session.result
    result.assert_outcomes(passed=3)
    data = session.results

    tests = {t["nodeid"].rpartition("-")[2].rstrip("]"): t for t in data["tests"]}
    assert sorted(tests) == ["sat100", "sat33", "sat67"]
    points = {k: t["rate_sweep"] for k, t in tests.items()}
    sat = points["sat33"]["saturation"]
    assert sat["measured_by"].endswith("sat33]") and sat["req_s"] > 0  # once, at the sweep's first test
    assert all(p["saturation"] == sat for p in points.values())
    for name, fraction in (("sat33", 1 / 3), ("sat67", 2 / 3), ("sat100", 1.0)):
        p = points[name]
        assert p["fraction"] == pytest.approx(fraction, abs=1e-6) and p["points"] == 3
        assert p["request_rate"] == pytest.approx(fraction * sat["req_s"], rel=1e-4)
        # the rate the runs offered is the one recorded
        offered = [r["request_rate"] for r in [*tests[name]["runs"], *tests[name]["reference_runs"]]]
        assert offered == pytest.approx([p["request_rate"]] * 6, rel=1e-4)
    assert sum("rate sweep saturation" in line for line in result.outlines) == 1

    (entry,) = data["crossovers"]
    assert entry["axis"] == "rate_fraction" and entry["saturation_req_s"] == sat["req_s"]
    assert [p["rate_fraction"] for p in entry["points"]] == pytest.approx([1 / 3, 2 / 3, 1.0])
    # latency speedups: reference ÷ spec E2E P50
    for p, name in zip(entry["points"], ("sat33", "sat67", "sat100"), strict=True):
        t = tests[name]
        ratios = [r["e2e_ms"]["p50"] / s["e2e_ms"]["p50"] for r, s in zip(t["reference_runs"], t["runs"], strict=True)
                  if r["valid"] and s["valid"]]
        assert (p["speedups"] == pytest.approx(ratios, rel=1e-4)
                and p["speedups"] != pytest.approx(t["speedup_per_pair"]))
    stop = entry["crossover"]
    assert stop["axis"] == "rate_fraction" and stop["side"] in ("crossed", "above", "below") and stop["ci"], stop
    if stop["side"] == "crossed":
        assert stop["value_req_s"] == pytest.approx(stop["value"] * sat["req_s"], rel=1e-4)
    (line,) = [x for x in result.outlines if x.startswith("specdec stop-paying rate test_suite.py::test_load[")]
    assert stop["text"] in line
    (record,) = (pytester.path / "baselines").rglob("test_load*.crossover")
    stored = json.loads(record.read_text())
    assert record.name == "test_load[ngram-k3-t0.0-c8].crossover" and stored["axis"] == "rate_fraction"
    assert stored["nights"][0]["saturation_req_s"] == pytest.approx(sat["req_s"], rel=1e-4)

    html = (pytester.path / "reports" / "latest.html").read_text()
    assert "speedup vs load" in html and "achieved req/s vs E2E P95" in html and stop["text"].split(" (")[0] in html

    # `compare` reads the stop-paying rate back from the results on its axis: a night against itself has not moved
    # (unchanged, or inconclusive where three runs a point on a loaded host leave the CI wider than the ±33 %)
    capsys.readouterr()
    latest = str(pytester.path / "reports" / "latest.json")
    assert main(["compare", latest, latest, "--json"]) == 0
    (cmp,) = json.loads(capsys.readouterr().out)["crossovers"].values()
    assert cmp["verdict"] in (UNCHANGED, INCONCLUSIVE) and cmp["delta"] == 0, cmp
