"""The `--update-baselines` summary reaches the results JSON and the HTML report, not only the terminal:
a CI job that opens a pull request with the new files, and whoever reviews it, read it there. Sessions
run against simulated vLLM servers (endpoint mode): created, then updated (old → new headline figures),
unchanged under `=missing`, and a failed test's file not written with the reason; a session without the
flag records none. A file without the field (recorded before it existed) still loads.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from session import specdec_session

from fakes import FakeServer
from pytest_specdec.gate.baselines import hardware_key
from pytest_specdec.gate.conditions import cpu_machine
from pytest_specdec.output.report import render_html
from pytest_specdec.output.schema import ResultsError, load

Servers = tuple[FakeServer, FakeServer]
SUITE = {"concurrency": 4, "num_prompts": 8, "max_tokens": 24, "body": "assert specdec.result.reference_runs"}
HERE = hardware_key(cpu_machine())  # this machine's folder
FILE = f"baselines/fake/{HERE}/test_suite/test_ngram[ngram-k3-t0.0-c4].json"
FAILING = f"baselines/fake/{HERE}/test_suite/test_fails[ngram-k3-t0.0-c4].json"


@pytest.fixture
def servers(fake_server: Callable[..., FakeServer]) -> Servers:
    return (fake_server(k=3, output_tokens=24, step_s=0.001, acceptance=(0.8, 0.6, 0.4)),
            fake_server(k=0, step_s=0.002, output_tokens=24))


def run(pytester: pytest.Pytester, profile: Path, servers: Servers, *extra: str) -> tuple[dict, str]:
    """One session; returns its results JSON and HTML report."""
    # wide: what these sessions check is the update summary; on a busy CI host the stand-in's spec path once ran at
    # 0.4x its speed for a session (speedup 3.87 -> 1.86), which a 40 % threshold read as a change being accepted
    session = specdec_session(pytester, profile, servers, *extra, runs=2,
                              thresholds=("rate=80", "latency=150", "acceptance=15"))
    return session.results, session.html


def test_the_update_summary_is_in_the_results_and_the_report(
    pytester: pytest.Pytester, fake_profile: Path, servers: Servers, make_suite: Callable[..., str]
) -> None:
    pytester.makepyfile(test_suite=make_suite(**SUITE)
                        + make_suite(name="test_fails", **{**SUITE, "body": "assert False, 'on purpose'"}))

    data, html = run(pytester, fake_profile, servers, "--update-baselines")
    update = data["baseline_update"]
    assert update == {"root": "baselines", "mode": "all", "created": [FILE], "updated": [], "unchanged": [],
                      "unused": [], "not_written": [{"path": FAILING, "reason": "the test failed"}]}
    assert "Baselines written (--update-baselines)" in html
    assert "1 created, 0 updated, 0 unchanged, 0 unused, 1 not written" in html
    # the test id's brackets and the reason come through escaped text, once per row
    assert f'<td class="l id">{FILE}</td><td class="l">created</td>' in html
    assert f'<td class="l id">{FAILING}</td><td class="l">not written</td><td class="l">the test failed</td>' in html
    typed = load(data)
    assert typed.baseline_update is not None and typed.baseline_update.created == (FILE,)

    data, html = run(pytester, fake_profile, servers, "--update-baselines", "-k", "test_ngram")
    [(path, change)] = [(u["path"], u["change"]) for u in data["baseline_update"]["updated"]]
    assert path == FILE and change.startswith("speedup ") and " → " in change and "2 session(s) kept" in change
    assert data["baseline_update"]["created"] == []
    assert '<td class="l">updated</td>' in html and "speedup " in html

    data, html = run(pytester, fake_profile, servers, "--update-baselines=missing", "-k", "test_ngram")
    assert data["baseline_update"]["mode"] == "missing"
    assert [u["path"] for u in data["baseline_update"]["unchanged"]] == [FILE]
    assert "Baselines written (--update-baselines=missing)" in html
    assert "exists (--update-baselines=missing writes only missing files)" in html

    data, html = run(pytester, fake_profile, servers, "-k", "test_ngram")
    assert data["baseline_update"] is None
    assert "Baselines written" not in html

    # A file recorded before the field existed loads and renders; a malformed one names the field.
    del data["baseline_update"]
    assert load(data).baseline_update is None
    assert "Baselines written" not in render_html(data)
    data["baseline_update"] = {"created": "baselines/x.json"}
    with pytest.raises(ResultsError, match=r"baseline_update\.created: expected a list of paths"):
        load(data, "latest.json")
