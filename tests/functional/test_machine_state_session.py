"""The machine's state as a condition of the ratio verdicts, end to end through pytester on the simulated vLLM.

The spec server's step has a fixed part (``draft_overhead_s``) that does not scale with the machine's speed, as a
draft's per-step overhead on a small CPU host: a machine 3x slower raises the speedup by ~60 %, one 3x faster
lowers it by ~40 %, with nothing changed in the software. Against nights stored at speed 1.0, neither may be a
conclusive speedup verdict: the probe (SPECDEC_MACHINE_PROBE, the simulated machine's) says the state differs,
so the speedup and the E2E ratio are `not-comparable` (machine state) and acceptance is still judged. A session
whose reference path alone got 3x slower, on a machine in the stored state, is still judged: the probe tells
the machine from vLLM.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from session import specdec_session

from fakes import FakeServer
from pytest_specdec.output.hardware_wording import machine_state_lines
from pytest_specdec.output.schema import load

SUITE = {"num_prompts": 4, "max_tokens": 16, "concurrency": 1}
REF_STEP_S = 0.008  # per decode step of the reference at speed 1.0
SPEC_STEP_S = 0.010  # the spec step's part that scales with the machine (k=3, every draft accepted: 4 tokens)
OVERHEAD_S = 0.012  # and its fixed part
Servers = tuple[FakeServer, FakeServer]


@pytest.fixture
def servers(fake_server: Callable[..., FakeServer]) -> Servers:
    spec = fake_server(k=3, acceptance=(1.0, 1.0, 1.0), step_s=SPEC_STEP_S, draft_overhead_s=OVERHEAD_S,
                       output_tokens=16, seed=1)
    ref = fake_server(k=0, step_s=REF_STEP_S, output_tokens=16, seed=2)
    return spec, ref


def night(pytester: pytest.Pytester, profile: Path, servers: Servers, speed: float, *extra: str,
          reference_slower: float = 1.0) -> dict:
    """One session on a machine at ``speed`` (both servers' scaling parts); its results file."""
    spec, ref = servers
    spec.reconfigure(step_s=SPEC_STEP_S / speed)
    ref.reconfigure(step_s=REF_STEP_S / speed * reference_slower)
    session = specdec_session(pytester, profile, servers, "--specdec-settle-timeout=0", *extra, runs=3, max_runs=3)
    session.result.assert_outcomes(passed=1)
    return {**session.results, "stdout": session.result.stdout.str()}


def verdict(data: dict, metric: str) -> dict:
    (test,) = data["tests"]
    return test["verdicts"][metric]


def test_a_slower_or_faster_machine_gives_no_conclusive_speedup_verdict(
    pytester: pytest.Pytester, fake_profile: Path, servers: Servers, make_suite: Callable[..., str],
    machine_state: Callable[..., None]
) -> None:
    pytester.makepyfile(test_suite=make_suite(**SUITE))
    machine_state(cores=2.0, hash=2.0)
    for _ in range(2):
        stored = night(pytester, fake_profile, servers, 1.0, "--update-baselines")
    (test,) = stored["tests"]
    assert test["machine_state"]["cores"] == 2.0 and len(test["machine_state"]["probes"]) == 2

    # 3x slower: two of the machine's two cores taken by something else (the probe gets a third of them)
    machine_state(cores=0.67)
    slow = night(pytester, fake_profile, servers, 1 / 3)
    # 3x faster: a faster host of the same name would change the folder; a faster clock does not
    machine_state(hash=6.0)
    fast = night(pytester, fake_profile, servers, 3.0)
    for data, moved in ((slow, "up"), (fast, "down")):
        (test,) = data["tests"]
        assert test["summary"]["speedup"] and test["machine_state"]["probes"]
        for metric in ("speedup", "e2e_p95_ratio"):
            v = verdict(data, metric)
            assert v["verdict"] == "not-comparable" and v["method"] == "machine state", (moved, v)
            assert "tolerance ±15 %" in v["note"]
        assert verdict(data, "acceptance_rate")["verdict"] == "unchanged"
        state = data["machine_state"]
        assert state["not_comparable"] == [{"nodeid": "test_suite.py::test_ngram[ngram-k3-t0.0-c1]",
                                            "metrics": ["speedup", "e2e_p95_ratio"]}]
        assert "specdec: machine state: tonight cores" in data["stdout"]
        assert "1 of 1 compared test(s) have no stored night in this state" in data["stdout"]
        # the file's section, read by the typed reader, says the terminal's block word for word (the report's)
        block = machine_state_lines(load({k: v for k, v in data.items() if k != "stdout"}).machine_state)
        assert len(block) == 6 and all(line in data["stdout"].splitlines() for line in block), block
    # the speedup did move, the way the fixed draft cost makes it move: the condition is what kept it unjudged
    assert verdict(slow, "speedup")["now"] > 1.4 * verdict(slow, "speedup")["baseline"]
    assert verdict(fast, "speedup")["now"] < 0.8 * verdict(fast, "speedup")["baseline"]

    # The machine in the stored state, vLLM's reference path 3x slower: the probe says it is not the machine,
    # so the speedup is judged, and the change is conclusive.
    machine_state(cores=1.95, hash=2.04)  # within the ±15 % tolerance of the stored nights
    software = night(pytester, fake_profile, servers, 1.0, reference_slower=3.0)
    assert verdict(software, "speedup")["verdict"] == "improved"
    assert software["machine_state"]["not_comparable"] == []

    # A calibration over these sessions saw the state move (cores 2 → 0.67, hash 2 → 6) and the speedup follow it:
    # it narrows the ratios' tolerance below the profile's 15 %, and the next session says so and judges with it.
    import subprocess
    import sys

    files = sorted((pytester.path / "reports").glob("specdec-*.json"))
    r = subprocess.run([sys.executable, "-m", "pytest_specdec.cli", "calibrate", *map(str, files), "--write",
                        "--baselines", str(pytester.path / "baselines")],
                       capture_output=True, text=True, timeout=60, cwd=pytester.path)
    assert r.returncode == 0, r.stderr
    assert "speedup: run sd" in r.stdout and "follows the machine's capacity with slope -" in r.stdout, r.stdout
    machine_state(cores=1.95, hash=2.04)
    again = night(pytester, fake_profile, servers, 1.0)
    tol = again["gate"]["settings"]["machine_state_tolerance"]
    assert 0 < tol["ratio"] < 15.0 and tol["source"].startswith("this machine's calibration"), tol
    assert (f"a stored night counts as tonight's machine state within ±{tol['ratio']:.3g} % for ratios"
            in again["stdout"])
    assert f"within ±{tol['ratio']:.3g} % for ratios" in again["stdout"].split("specdec: machine state:")[1]
    assert verdict(again, "speedup")["verdict"] != "not-comparable"  # 2.5 % off the stored state: within it
    # 10 % off: within the profile's 15 %, not within what this host's speedup allows
    machine_state(cores=1.8, hash=2.0)
    off = night(pytester, fake_profile, servers, 1.0)
    assert verdict(off, "speedup")["verdict"] == "not-comparable", verdict(off, "speedup")
    assert f"tolerance ±{tol['ratio']:g} %" in verdict(off, "speedup")["note"]
