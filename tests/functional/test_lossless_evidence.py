"""A failed lossless check shows its evidence the morning after: the prompts whose temperature-0 outputs
differed from the reference's, with both outputs (cut, and escaped in the report), in the results JSON
and the HTML report. `--specdec-save-outputs` keeps every request's output text in a side file named
after the results file.

The simulated servers stream `" tok"` per token, so their outputs differ only in length: a spec server
that stops after 16 tokens where the reference gives 24 is a spec server whose greedy outputs differ from
the target's, while two reference runs agree. (`sampler_bias` breaks only the non-streamed samples the
distribution check draws; the measured runs stream.)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from session import read_results, specdec_session

from fakes import FakeServer
from pytest_specdec.output.report import render_html

SUITE = {"concurrency": 4, "num_prompts": 6, "max_tokens": 24, "body": "specdec.assert_lossless()"}


@pytest.fixture
def session(pytester: pytest.Pytester, fake_profile: Path, fake_server: Callable[..., FakeServer],
            make_suite: Callable[..., str]) -> Callable[..., pytest.RunResult]:
    """One session of the lossless suite against a spec server that stops after `spec_tokens` tokens and a
    reference server that gives 24 (`verdicts`: the suite's specdec_verdicts marker)."""

    def run(spec_tokens: int, *extra: str, verdicts: str | None = None) -> pytest.RunResult:
        spec = fake_server(k=3, acceptance=(0.8, 0.6, 0.4), step_s=0.001, output_tokens=spec_tokens)
        ref = fake_server(k=0, step_s=0.001, output_tokens=24)
        pytester.makepyfile(test_suite=make_suite(verdicts=verdicts, **SUITE))
        return specdec_session(pytester, fake_profile, (spec, ref), "-p", "no:randomly", *extra, runs=2).result

    return run


def test_a_failed_lossless_check_records_the_differing_outputs(
        pytester: pytest.Pytester, session: Callable[..., pytest.RunResult]) -> None:
    r = session(16)
    r.assert_outcomes(failed=1)
    r.stdout.fnmatch_lines(["*specdec lossless check failed for *: spec output equals the reference's on 0.0% of 12 *"
                            "6 prompt(s) differed:",
                            "  * (run 1, from character 64): spec '…ok tok* tok' vs reference '…ok tok* tok'",
                            "  ... 3 more in the results JSON and the report"])

    reports = pytester.path / "reports"
    data = read_results(reports)
    m = data["tests"][0]["output_match"]
    assert (m["spec_match"], m["control_match"], m["spec_n"], m["control_n"]) == (0.0, 1.0, 12, 6)
    assert m["differing_prompts"] == 6 and len(m["differing"]) == 6
    first = m["differing"][0]
    assert first["spec"] == " tok" * 16 and first["reference"] == " tok" * 24
    assert (first["first_difference"], first["spec_chars"], first["reference_chars"], first["run"]) == (64, 64, 96, 0)
    assert "outputs_file" not in data and not list(reports.glob("*.outputs.json"))  # only with the option

    html = (reports / "latest.html").read_text()
    assert "outputs that differed from the reference (temperature 0)" in html
    assert "6 prompt(s) differed" in html
    for d in m["differing"]:
        assert f'<td class="l id">{d["prompt_id"]}</td>' in html

    # Outputs are model text: the report shows a `<script>` in one as text.
    d = m["differing"][0]
    d["spec"] = "<script>alert('spec')</script>"
    page = render_html(data)
    assert "&lt;script&gt;alert(&#39;spec&#39;)&lt;/script&gt;" in page and "<script>alert" not in page


def test_save_outputs_keeps_every_requests_output_beside_the_results(
        pytester: pytest.Pytester, session: Callable[..., pytest.RunResult]) -> None:
    r = session(24, "--specdec-save-outputs", verdicts="check=False")
    r.assert_outcomes(passed=1)

    reports = pytester.path / "reports"
    [results] = (p for p in reports.glob("specdec-*.json") if not p.name.endswith(".outputs.json"))
    data = json.loads(results.read_text())
    side = reports / data["outputs_file"]
    assert side.name == results.name.replace(".json", ".outputs.json")
    assert read_results(reports)["outputs_file"] == side.name
    saved = json.loads(side.read_text())
    [test] = saved["tests"]
    assert test["nodeid"] == data["tests"][0]["nodeid"]
    assert sorted((run["arm"], run["index"]) for run in test["runs"]) == [
        ("reference", 0), ("reference", 1), ("spec", 0), ("spec", 1)]
    for run_ in test["runs"]:
        assert len(run_["outputs"]) == 6 and set(run_["outputs"].values()) == {" tok" * 24}, run_
        assert run_["output_tokens"] == dict.fromkeys(run_["outputs"], 24), run_  # the server's usage counts
    # Outputs that agree leave no evidence behind, and the report links the side file.
    assert data["tests"][0]["output_match"]["differing_prompts"] == 0
    html = (reports / "latest.html").read_text()
    assert f'href="{side.name}"' in html and "outputs that differed" not in html
