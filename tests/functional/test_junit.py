"""--junitxml carries each specdec test's figures and verdicts as properties, and the session's machine
factor as the suite's, so a CI tool's test view shows them (read back with the standard library)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest
from session import specdec_session

from fakes import FakeServer

GOOD = {"step_s": 0.001, "acceptance": (0.8, 0.6, 0.4)}
BAD = {"step_s": 0.012, "acceptance": (0.2, 0.1, 0.05)}  # ~12x slower steps, acceptance 0.6 -> ~0.1
# Drops far past the thresholds: on a busy CI machine three runs' 90 % CI spanned -90 % .. -26 % for a 6x step
# (inconclusive against 40 %), and -45 .. -7 pt for acceptance 0.6 -> 0.3 (inconclusive against 15 pt): a short
# run drafts few tokens.
# Two tests on the same servers: one with the default thresholds, one told to let anything through.
SUITE = """
import pytest

@pytest.mark.specdec(method="ngram", k=3, temperature=0.0, concurrency=4, num_prompts=8, max_tokens=24)
def test_gated(specdec):
    pass

@pytest.mark.specdec(method="ngram", k=3, temperature=0.0, concurrency=4, num_prompts=8, max_tokens=24)
@pytest.mark.specdec_verdicts(thresholds={"rate": 99, "acceptance": 99, "latency": 10000})
def test_lenient(specdec):
    pass
"""


def test_junit_properties_of_a_regressed_and_an_unchanged_test(
        pytester: pytest.Pytester, fake_server: Callable[..., FakeServer], fake_profile: Path) -> None:
    spec = fake_server(k=3, output_tokens=24, **GOOD)
    ref = fake_server(k=0, step_s=0.002, output_tokens=24)
    pytester.makepyfile(test_suite=SUITE)
    junit = pytester.path / "junit.xml"

    def session(*extra: str) -> pytest.RunResult:
        return specdec_session(pytester, fake_profile, (spec, ref), f"--junitxml={junit}", *extra, runs=3,
                               thresholds=("rate=20", "latency=150", "acceptance=15")).result

    session("--update-baselines").assert_outcomes(passed=2)
    spec.reconfigure(**BAD)
    session().assert_outcomes(failed=1, passed=1)

    root = ET.parse(junit).getroot()
    cases = {c.get("name"): c for c in root.iter("testcase")}
    props = {name.split("[")[0]: {p.get("name"): p.get("value") for p in case.iter("property")}
             for name, case in cases.items()}
    gated, lenient = props["test_gated"], props["test_lenient"]
    assert cases[next(n for n in cases if n.startswith("test_gated"))].find("failure") is not None
    for p in (gated, lenient):
        assert float(p["specdec_speedup"].rstrip("x")) > 0 and 0 < float(p["specdec_acceptance_rate"]) < 1
        assert float(p["specdec_e2e_p95_ms"]) > 0 and p["specdec_runs_spec"] == "3 valid of 3"
        assert p["specdec_baseline"].startswith("compared: ") and p["specdec_baseline"].endswith(".json")
        assert "specdec_reference_vs_baseline" in p
        assert "specdec_baseline_machines" not in p  # this machine's own nights
        assert p["specdec_drift_acceptance_drift"].startswith("acceptance ")  # early against late, as the terminal
        assert p["specdec_drift_step_time_drift"].startswith("step time ")
    assert gated["specdec_verdict_speedup"].startswith("regressed -") and " (CI -" in gated["specdec_verdict_speedup"]
    assert gated["specdec_verdict_acceptance_rate"].startswith("regressed -")
    assert lenient["specdec_verdict_speedup"].startswith(("unchanged", "inconclusive"))
    suite = {p.get("name"): p.get("value") for p in root.iter("property") if p.get("name", "").startswith("specdec_")
             and p in list(root.find("testsuite").find("properties") or [])}
    assert suite["specdec_tests"] == "2" and suite["specdec_machine_factor"].split()[0].replace(".", "").isdigit()
