"""Two sessions sharing one reports directory: each keeps its own complete results file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from session import read_results

from fakes import FakeServer

#: A conftest for the pytester project: the session's recorded start is the one the environment names, so two
#: sessions can start "at the same moment" (within one second, as two CI jobs of one night easily do).
START_CONFTEST = """
import os

import pytest


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    from pytest_specdec.plugin import session_key

    session = config.stash.get(session_key, None)
    if session is not None:
        session.started = float(os.environ["SPECDEC_TEST_STARTED"])
"""


def test_two_concurrent_sessions_on_one_reports_directory_keep_both_results(
        pytester: pytest.Pytester, fake_server: Callable[..., FakeServer], fake_profile: Path,
        make_suite: Callable[..., str]) -> None:
    """Both sessions start within the same second and run at once, each against its own pair of simulated
    servers (a shared server would count the other session's tokens): with a per-second stamp in the name one
    results file replaced the other."""
    pytester.makeconftest(START_CONFTEST)
    pytester.makepyfile(test_suite=make_suite(num_prompts=4, max_tokens=8, verdicts="check=False"))
    reports = pytester.path / "reports"

    def session(started: str) -> subprocess.Popen[str]:
        spec = fake_server(k=3, acceptance=(0.8, 0.6, 0.4), step_s=0.001, output_tokens=24).base_url
        ref = fake_server(k=0, step_s=0.002, output_tokens=24).base_url
        args = [sys.executable, "-m", "pytest", f"--specdec-profile={fake_profile}", f"--specdec-endpoint={spec}",
                f"--specdec-reference-endpoint={ref}", f"--specdec-reports-dir={reports}", "--specdec-save-outputs",
                "-p", "no:cacheprovider", "-q"]
        return subprocess.Popen(args, cwd=pytester.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env={**os.environ, "SPECDEC_TEST_STARTED": started}, text=True)

    sessions = [session("1800000000.25"), session("1800000000.75")]
    outputs = [s.communicate(timeout=300)[0] for s in sessions]
    assert [s.returncode for s in sessions] == [0, 0], outputs
    results = sorted(p for p in reports.glob("specdec-*.json") if not p.name.endswith(".outputs.json"))
    assert len(results) == 2, sorted(p.name for p in reports.iterdir())
    started = set()
    for path in results:
        data = json.loads(path.read_text())  # complete: parses, and names its own side file
        assert [t["outcome"] for t in data["tests"]] == ["passed"]
        assert (reports / data["outputs_file"]).is_file()
        assert data["outputs_file"] == path.name.removesuffix(".json") + ".outputs.json"
        assert path.with_suffix(".html").is_file()
        started.add(data["started"])
    assert started == {"2027-01-15T08:00:00.250000+00:00", "2027-01-15T08:00:00.750000+00:00"}
    latest = read_results(reports)
    assert latest["started"] in started
    assert not [p.name for p in reports.iterdir() if p.name.endswith(".tmp")]
