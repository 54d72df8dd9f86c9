"""Honest verdicts on a host whose nights move: through pytester, against simulated vLLM servers (endpoint mode).

The machine's speed moves from session to session (both arms alike) and a fixed per-step draft overhead makes the
speedup move with it, as on a small CPU host. One stored night cannot tell that move from a change under test: the
gate must not call it `improved` or `regressed`. Several sessions measure it (`--specdec-calibrate`, or
`pytest-specdec calibrate` on their results): a noisy host's calibration must be wider than a quiet one's, and the
next session judges with it and says so.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from session import latest, specdec_session

from fakes import FakeServer

Servers = tuple[FakeServer, FakeServer]
SUITE = {"concurrency": 8, "num_prompts": 8, "max_tokens": 24, "body": "assert specdec.result.reference_runs"}
REF_STEP_S = 0.01  # per decode step at machine speed 1.0
SPEC_STEP_S = 0.016  # k=3, every draft accepted: 4 tokens a step
OVERHEAD_S = 0.008  # a spec step's part that does not scale with the machine: speedup ~1.5x at 1.0, ~1.66x at 0.6
#: The prefill before a request's first token, at machine speed 1.0 (both arms; it follows the machine's speed). With
#: none, TTFT is one step (10-16 ms) plus the client's own event-loop delay, which a busy CI host moves several-fold
#: between two sessions: a move of the test host, not of the machine the test simulates.
TTFT_S = 0.05


@pytest.fixture
def servers(fake_server: Callable[..., FakeServer]) -> Servers:
    spec = fake_server(k=3, acceptance=(1.0, 1.0, 1.0), step_s=SPEC_STEP_S, output_tokens=24, drift_sd=0.02,
                       draft_overhead_s=OVERHEAD_S, seed=1, ttft_s=TTFT_S)
    ref = fake_server(k=0, step_s=REF_STEP_S, output_tokens=24, drift_sd=0.02, seed=2, ttft_s=TTFT_S)
    return spec, ref


def night(pytester: pytest.Pytester, profile: Path, servers: Servers, speed: float, where: str,
          *extra: str) -> pytest.RunResult:
    """One session on a machine running at ``speed``; its baselines and reports under ``where``."""
    spec, ref = servers
    spec.reconfigure(step_s=SPEC_STEP_S / speed, ttft_s=TTFT_S / speed)
    ref.reconfigure(step_s=REF_STEP_S / speed, ttft_s=TTFT_S / speed)
    folder = pytester.path / where
    return specdec_session(pytester, profile, servers, *extra, runs=3, max_runs=3, reports=folder / "reports",
                           baselines=folder / "baselines").result


def calibrate(pytester: pytest.Pytester, where: str, *extra: str) -> dict:
    files = sorted((pytester.path / where / "reports").glob("specdec-*.json"))
    r = subprocess.run([sys.executable, "-m", "pytest_specdec.cli", "calibrate", *map(str, files), "--json",
                        "--baselines", str(pytester.path / where / "baselines"), *extra],
                       capture_output=True, text=True, timeout=60, cwd=pytester.path)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.slow
def test_a_night_that_moved_is_no_verdict_and_a_calibration_measures_the_move(
    pytester: pytest.Pytester, make_profile: Callable[..., Path], servers: Servers, make_suite: Callable[..., str]
) -> None:
    profile = make_profile()
    pytester.makepyfile(test_suite=make_suite(**SUITE))

    # A noisy host: night 1 at full speed, stored; night 2 at 0.6x with nothing under test changed. The speedup
    # moves by ~+11 % and the spec tok/s by ~-30 %: with one stored night no family may call either a change.
    night(pytester, profile, servers, 1.0, "noisy", "--update-baselines").assert_outcomes(passed=1)
    r = night(pytester, profile, servers, 0.6, "noisy")
    r.assert_outcomes(passed=1)
    results = latest(pytester, "noisy")
    assert results["machine_factor"]["factor"] < 0.85, results["machine_factor"]  # the night really moved
    [test] = results["tests"]
    speedup = test["verdicts"]["speedup"]
    assert speedup["per"] == "night" and "as no stored baseline has 2 nights" in speedup["note"], speedup
    confident = {m: v["verdict"] for m, v in test["verdicts"].items() if v["verdict"] in ("improved", "regressed")}
    assert not confident, confident
    r.stdout.fnmatch_lines(["specdec gate: night-to-night sd speedup 10 % (4 df)*: the default night prior (assumed, "
                            "measured on no host), as no stored baseline has 2 nights",
                            "specdec gate: no stored baseline of this machine has 2 nights yet*"
                            "--specdec-base-draft*--specdec-calibrate*"])

    # Night 3 at 2x (speedup ~1.2x against ~1.5x and ~1.66x); then a quiet host of three nights at full speed. Each
    # calibration measures its own host (under a busy CI the quiet one picks up some noise too: compared, not zero).
    # The quiet host calibrates as a mode of its sessions (--specdec-calibrate): the first says it needs a second,
    # each later one writes the record of all of them, once, at its end.
    night(pytester, profile, servers, 2.0, "noisy").assert_outcomes(passed=1)
    r = night(pytester, profile, servers, 1.0, "quiet", "--update-baselines", "--specdec-calibrate")
    r.assert_outcomes(passed=1)
    r.stdout.fnmatch_lines(["specdec calibration: 1 calibration session of profile * on this machine so far (this "
                            "one, in quiet/reports); run the same command again*the record is written to "
                            "quiet/baselines/*/host.calibration"])
    records = sorted((pytester.path / "quiet" / "baselines").glob("*/*/host.calibration"))
    assert not records
    for n in (2, 3):
        r = night(pytester, profile, servers, 1.0, "quiet", "--specdec-calibrate")
        r.assert_outcomes(passed=1)
        r.stdout.fnmatch_lines(["specdec calibration (quiet/baselines/*/host.calibration): 3 sessions*" if n == 3
                                else "specdec calibration (quiet/baselines/*/host.calibration): 2 sessions*",
                                "  speedup: run sd *",
                                f"specdec calibration: {'replaced' if n == 3 else 'wrote'} quiet/baselines/*/"
                                f"host.calibration from {n} sessions in quiet/reports; commit it beside the baselines"])
    [record] = (pytester.path / "quiet" / "baselines").glob("*/*/host.calibration")
    quiet = json.loads(record.read_text())
    assert quiet["command"].startswith("pytest --specdec-calibrate: specdec-")
    noisy = calibrate(pytester, "noisy", "--write")
    assert len(noisy["sessions"]) == len(quiet["sessions"]) == 3
    n, q = noisy["metrics"]["speedup"], quiet["metrics"]["speedup"]
    # Wider on the noisy host: it catches less. Where the nights moved apart the night sd shows it; on a busy CI host
    # the runs' own noise can explain the same spread (twice seen: night sd 0, a lone test catching -49 % and -59 %),
    # and the calibration is wider through its run sd instead: either way it resolves less than the quiet one.
    # (a fresh-clone CI read 56.6 % against the quiet host's 30.0 %: 1.9x, so 1.5x, not 2x)
    assert n["catches"] > max(1.5 * q["catches"], 5.0), (n, q)
    assert n["night_sd"] > max(2 * q["night_sd"], 5.0) or n["run_sd"] > 2 * q["run_sd"], (n, q)
    assert noisy["metrics"]["acceptance_rate"]["night_sd"] == 0.0  # every draft accepted, every night

    # The next noisy session judges with the record, and says so; the verdict notes name it.
    r = night(pytester, profile, servers, 1.0, "noisy")
    r.assert_outcomes(passed=1)
    r.stdout.fnmatch_lines(["specdec gate: night-to-night sd speedup *: this machine's calibration *host.calibration "
                            "blended with the default night prior (assumed, measured on no host), as no stored "
                            "baseline has 2 nights",
                            "specdec gate: judged with this machine's calibration *host.calibration (3 sessions): "
                            "a lone test catches speedup -* %, acceptance exact, P95 E2E spec/ref +* % at power 0.9",
                            "specdec gate: thresholds raised to what this host resolves: speedup 5 → * %, *"])
    assert "no stored baseline of this machine has 2 nights yet" not in r.stdout.str()
    [test] = latest(pytester, "noisy")["tests"]
    assert "this machine's calibration" in test["verdicts"]["speedup"]["note"]
    settings = latest(pytester, "noisy")["gate"]["settings"]
    assert settings["night_prior"]["source"].startswith("this machine's calibration")
    assert settings["calibration"]["sessions"] == 3 and settings["calibration"]["catches"].startswith("speedup -")
    # the report says the same as the terminal, from the results file
    html = (pytester.path / "noisy" / "reports" / "latest.html").read_text()
    assert "judged with this machine&#39;s calibration" in html and settings["calibration"]["catches"] in html
