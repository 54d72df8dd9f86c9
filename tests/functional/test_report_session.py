"""The plugin writes the HTML report and the pytest-benchmark export, through pytester against simulated servers
(the report's content: tests/functional/test_report.py)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from session import specdec_session

# Two tests, one failing on purpose: the report is written whatever the outcome.
REPORT_SUITE = {"concurrency": [1, 2], "num_prompts": 4, "max_tokens": 16, "body": """
assert specdec.summary["acceptance_rate"] is not None
assert specdec.params["concurrency"] == 1, "fails on purpose: the report is written anyway"
"""}


def test_plugin_writes_report_and_ends_the_summary_with_its_uri(
    pytester: pytest.Pytester, fake_endpoints: tuple[str, str], fake_profile: Path, make_suite: Callable[..., str]
) -> None:
    pytester.makepyfile(test_suite=make_suite(**REPORT_SUITE))
    session = specdec_session(pytester, fake_profile, fake_endpoints, "--update-baselines=missing",
                              "--specdec-gpu-hourly-usd=3", "--specdec-benchmark-json=bench/0001_night.json")
    result, reports = session.result, session.reports
    result.assert_outcomes(passed=1, failed=1)
    latest = reports / "latest.html"
    stamped = list(reports.glob("specdec-*.html"))
    assert latest.is_file() and len(stamped) == 1 and stamped[0].read_text() == latest.read_text()
    lines = [line for line in result.outlines if line.strip()]
    assert re.fullmatch(r"-+ specdec report: file://\S+/reports/latest\.html -+", lines[-2]), lines[-3:]
    assert lines[-1].startswith("=") and "1 failed, 1 passed" in lines[-1]
    html = latest.read_text()
    data = session.results
    assert data["price"]["usd_per_hour"] == 3.0 and data["price"]["source"] == "--specdec-gpu-hourly-usd"
    assert "Cost per 1M output tokens" in html and "speedup vs concurrency" in html
    assert "fails on purpose: the report is written anyway" in html  # the failure text is recorded
    first = pytester.path / "bench" / "0001_night.json"
    bench = json.loads(first.read_text())
    assert {b["group"] for b in bench["benchmarks"]} == {"seconds per output token", "TPOT P50 (s)", "E2E P50 (s)"}

    own = pytester.path / "nightly" / "r.html"
    result = specdec_session(pytester, fake_profile, fake_endpoints, "--update-baselines=missing",
                             f"--specdec-report-html={own}", "--specdec-benchmark-json=bench/0002_night.json").result
    assert own.is_file() and latest.read_text() == html  # --specdec-report-html replaces both default paths
    result.stdout.fnmatch_lines([f"*specdec report: {own.as_uri()} *"])

    # pytest-benchmark reads what the plugin wrote: one night, two nights (history), and the SVG histograms.
    names = [b["name"] for b in bench["benchmarks"]]
    assert "test_ngram[ngram-k3-t0.0-c1]::spec::s_per_output_token" in names
    one = _bench_compare(pytester.path, str(first))
    assert "benchmark 'seconds per output token'" in one and all(n in one for n in names)
    second = pytester.path / "bench" / "0002_night.json"
    two = _bench_compare(pytester.path, str(first), str(second))
    for n in names:  # each benchmark once per night, labelled by its file (its path shortened by pytest-benchmark)
        for night in ("0001_night", "0002_night"):
            assert re.search(rf"{re.escape(n)} \(\S*{night}\)", two), (n, night)
    hist = pytester.path / "charts" / "night"
    out = _bench_compare(pytester.path, str(first), str(second), f"--histogram={hist}")
    svgs = sorted(hist.parent.glob("night-*.svg"))
    assert [p.name for p in svgs] == ["night-E2E_P50_(s).svg", "night-TPOT_P50_(s).svg",
                                      "night-seconds_per_output_token.svg"], out
    for svg in svgs:
        text = svg.read_text()
        assert text.lstrip().startswith(("<?xml", "<svg")) and "<svg" in text
        assert "test_ngram[ngram-k3-t0.0-c2]" in text  # a pygal chart of the benchmarks, not an empty file


def test_help_lists_the_report_options(pytester: pytest.Pytester) -> None:
    pytester.runpytest("--help").stdout.fnmatch_lines([
        "*--specdec-report-html=PATH*", "*--specdec-gpu-hourly-usd=USD*", "*--specdec-benchmark-json=PATH*"])
    bad = pytester.runpytest("--specdec-gpu-hourly-usd=free")
    bad.stderr.fnmatch_lines(["*--specdec-gpu-hourly-usd: expected a number > 0, got 'free'"])


def test_bad_profile_price_is_a_clear_error(pytester: pytest.Pytester, fake_profile: Path,
                                            fake_endpoints: tuple[str, str], make_suite: Callable[..., str]) -> None:
    fake_profile.write_text('price_per_hour_usd = "cheap"\n' + fake_profile.read_text())
    pytester.makepyfile(test_suite=make_suite(**REPORT_SUITE))
    result = specdec_session(pytester, fake_profile, fake_endpoints, "--update-baselines=missing").result
    result.stdout.fnmatch_lines(["*price_per_hour_usd must be a number > 0 (USD per GPU hour), got 'cheap'*"])


def _bench_compare(cwd: Path, *args: str) -> str:
    """`pytest-benchmark compare` on files (the CLI of this venv); its stdout."""
    cli = shutil.which("pytest-benchmark", path=str(Path(sys.executable).parent)) or "pytest-benchmark"
    out = subprocess.run([cli, "compare", *args, "--group-by=group", "--columns=min,mean,max,rounds"],
                         capture_output=True, text=True, timeout=120, cwd=cwd)
    assert out.returncode == 0, out.stderr
    return out.stdout
