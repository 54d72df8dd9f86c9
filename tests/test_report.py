"""The HTML report and the pytest-benchmark export.

Most tests render `tests/data/report_results.json`, recorded by `tests/data/record_report_results.py`
from two real plugin sessions against simulated servers (`tests/fake_vllm_spec.py`): a concurrency
sweep of ngram and draft_model (the speedup crosses 1.0), a temperature and a k sweep, one injected
regression (ngram k=2), invalid runs (ngram k=5), a server that fails to start (eagle3, its log holds
`<script>`) and a test id holding `<script>`. Nothing in the file was edited by hand.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# pytester's in-process runs drop modules first imported inside them; numpy warns when imported twice.
import filelock  # noqa: F401
import jinja2  # noqa: F401
import numpy  # noqa: F401
import pytest_benchmark.stats  # noqa: F401
import pytest_specdec.baselines  # noqa: F401
import pytest_specdec.stats  # noqa: F401
import pytest_specdec.verdicts  # noqa: F401
import scipy.special  # noqa: F401
import scipy.stats  # noqa: F401
from pytest_specdec import report

DATA = Path(__file__).parent / "data" / "report_results.json"


@pytest.fixture(scope="module")
def recorded() -> dict[str, Any]:
    data = json.loads(DATA.read_text())
    # What the file must hold for these tests to mean anything (re-record if one of these fails).
    tests = data["tests"]
    assert {t["params"]["method"] for t in tests} >= {"ngram", "draft_model", "eagle3"}
    assert len({t["params"]["concurrency"] for t in tests if "test_concurrency" in t["nodeid"]}) >= 4
    assert [report.status(t) for t in tests].count("regressed") == 1
    assert any(not t["validity"]["valid"] for t in tests if "validity" in t)
    assert any(t["outcome"] == "failed (setup)" and t.get("server_logs") for t in tests)
    assert any("<script>" in t["nodeid"] for t in tests)
    return data


@pytest.fixture(scope="module")
def html(recorded: dict[str, Any]) -> str:
    return report.render_html(recorded)


def _statuses_in_summary(html: str) -> list[str]:
    """The status badge that opens each row of the summary table."""
    table = html.split('<table class="summary">', 1)[1].split("</table>", 1)[0]
    rows = table.split("</tr>")[1:-1]
    return [re.findall(r'<span class="badge b-[\w-]+">([\w -]+)</span>', row)[0] for row in rows]


def test_summary_puts_regressions_first_then_failures(html: str, recorded: dict[str, Any]) -> None:
    statuses = _statuses_in_summary(html)
    assert statuses[:3] == ["regressed", "failed", "invalid"]
    assert len(statuses) == len(recorded["tests"])
    order = [report.STATUS_ORDER.index(s) for s in statuses]
    assert order == sorted(order)
    regressed = next(t for t in recorded["tests"] if report.status(t) == "regressed")
    first_row = html.split('<table class="summary">', 1)[1].split("</tr>")[1]
    assert report.test_name(regressed["nodeid"])[1] in first_row
    assert 'class="badge b-regressed">regressed' in first_row  # the per-metric badge of acceptance


def test_header_totals_and_environment(html: str, recorded: dict[str, Any]) -> None:
    env = recorded["environment"]
    assert f"<b>vLLM</b> {env['vllm_version']}" in html
    assert f"<b>plugin</b> {env['plugin_version']}" in html
    assert f"pytest-specdec · {recorded['profile']} · " in html
    if env.get("commit"):
        assert env["commit"]["id"][:12] in html
    totals = report.totals(recorded["tests"])
    assert sum(totals.values()) == len(recorded["tests"])
    for name, n in totals.items():
        assert f">{n} {name}</span>" in html


def test_charts_only_for_swept_params_with_their_marks(html: str, recorded: dict[str, Any]) -> None:
    sweeps = {(s.function.split("::")[-1], s.axis): s for s in report.sweeps(recorded["tests"])}
    assert set(sweeps) == {("test_concurrency", "concurrency"), ("test_temperature", "temperature"),
                           ("test_k", "k")}  # test_label and test_eagle3 sweep nothing
    assert set(sweeps["test_concurrency", "concurrency"].lines) == {"ngram k=3", "draft_model k=3"}
    for title in ("speedup vs concurrency", "acceptance rate vs temperature", "acceptance rate vs k",
                  "speedup vs k", "per-position acceptance", "draft coverage vs concurrency",
                  "TPOT percentiles vs concurrency"):
        assert f'aria-label="{title}' in html, title
    assert html.count('<svg class="chart"') == 3 * 5
    assert "1.0 = no gain" in html
    # The recorded speedups fall below 1 at c=16 for both methods: each crossing is marked.
    notes = _chart_notes(html)
    crossings = [m.groups() for n in notes
                 if (m := re.fullmatch(r"[①②] (ngram|draft_model) k=3 crosses 1.0 at concurrency ≈ ([\d.]+)", n))]
    assert sorted(m for m, _ in crossings) == ["draft_model", "ngram"]
    assert all(8 < float(c) < 16 for _, c in crossings)  # between the last point above 1 and the first below
    # c × (1 + k) passes the capture size 16 at c = 4 (k=3); max_num_batched_tokens 256 lies beyond c=16.
    assert "┆ from concurrency 4: c×(1+k) > 16 (CUDA-graph capture size, k=3)" in notes
    assert 'class="regt" text-anchor="start">c×(1+k) &gt; 16</text>' in html  # the dashed line, labelled
    assert "c×(1+k) > 256 (max_num_batched_tokens, k=3): only from concurrency 64, beyond the swept range" in notes
    # Per-position legends name the swept value shortly enough not to be cut: "draft_model k=3 T=0.5".
    assert 'class="lg">draft_model k=3 T=0.5</text>' in html


def _chart_notes(html: str) -> list[str]:
    """The notes under the charts, unescaped, with wrapped continuation lines joined back."""
    import html as html_mod

    notes: list[str] = []
    for line in re.findall(r'class="note" xml:space="preserve">([^<]*)</text>', html):
        line = html_mod.unescape(line)
        if line.startswith("   ") and notes:
            notes[-1] += " " + line.strip()
        else:
            notes.append(line)
    return notes


def test_each_test_shows_ci_n_p_thresholds_attribution_commands_and_logs(html: str, recorded: dict[str, Any]) -> None:
    regressed = next(t for t in recorded["tests"] if report.status(t) == "regressed")
    section = html.split(f'id="t1"', 1)[1].split("</details>", 1)[0]
    assert "90% CI of Δ" in section and "n baseline / now" in section and "threshold" in section
    v = regressed["verdicts"]["acceptance_rate"]
    assert f"{v['delta']:+.2f} pt" in section and f"{v['ci'][0]:+.2f} pt .. {v['ci'][1]:+.2f} pt" in section
    assert f"{v['n_baseline']} / {v['n_now']}" in section and f"{v['threshold']:g} pt" in section
    assert "attribution:</b> " + regressed["baseline"]["attribution"].replace("'", "&#39;") in section
    assert "under test, baseline → now" in section
    spec = recorded["servers"][regressed["servers"]["spec"]]
    assert "--speculative-config" in section and spec["command"][-1] in section
    assert "&#34;num_speculative_tokens&#34;: 2" in section  # the exact command, escaped
    failed = html.split('id="t2"', 1)[1].split("</details>", 1)[0]
    assert "vLLM server (eagle3) exited with code 1 while starting" in failed
    assert "spec server log (tail," in failed and "hidden size 512 does not match" in failed
    invalid = html.split('id="t3"', 1)[1].split("</details>", 1)[0]
    assert "invalid runs (shown, never averaged in)" in invalid and "1/16 requests failed" in invalid


def test_distribution_check_is_shown_with_its_control(recorded: dict[str, Any]) -> None:
    """Temperature > 0 tests carry the distribution check (issue 6): verdict, both comparisons, alpha."""
    from pytest_specdec.distribution import compare

    data = copy.deepcopy(recorded)
    t = next(t for t in data["tests"] if "test_temperature" in t["nodeid"] and t["params"]["temperature"] > 0)
    # A real `compare` over made-up per-prompt scores: the spec arm sits 0.5 nats above both reference sets.
    ref = {f"p{i}": [-4.0 - 0.1 * i - 0.01 * j for j in range(4)] for i in range(8)}
    spec = {p: [v + 0.5 for v in vs] for p, vs in ref.items()}
    t["distribution"] = {**compare(spec, ref, {p: [v + 0.001 for v in vs] for p, vs in ref.items()}),
                         "samples_per_prompt": 4}
    t["distribution"]["why"] = "<script>alert('why')</script>"
    html = report.render_html(data)
    section = html.split("distribution check", 1)[1].split("</details>", 1)[0]
    assert t["distribution"]["verdict"] == "shifted"
    assert 'distribution check (temperature &gt; 0): <span class="v-regressed">shifted</span>' in html
    assert "spec vs reference" in html and "control: reference vs reference" in html
    assert "alpha 0.001" in html and "8 prompts × 4 samples" in html
    assert "+0.500" in html  # the spec arm's shift, in nats per token
    assert "&lt;script&gt;alert(&#39;why&#39;)&lt;/script&gt;" in section


def test_everything_from_prompts_ids_configs_and_logs_is_escaped(html: str) -> None:
    assert "<script" not in html.lower()
    assert "test_label[ngram-k3-t0.0-c1-&lt;script&gt;alert(&#39;id&#39;)]" in html
    assert "&lt;script&gt;alert(&#39;log&#39;)&lt;/script&gt;" in html


def test_escaping_of_every_field_a_user_controls(recorded: dict[str, Any]) -> None:
    data = copy.deepcopy(recorded)
    evil = "<script>alert(1)</script><img src=x onerror=alert(2)>"
    data["profile"] = evil
    data["environment"]["hardware"] = evil
    data["environment"]["workarounds"] = [{"name": evil, "detail": evil, "applied": True}]
    t = data["tests"][0]
    t["nodeid"] = f"suite.py::test_x[{evil}]"
    t["params"]["dataset"] = evil
    t["error"] = evil
    t["baseline"]["attribution"] = evil
    t["baseline"]["under_test_diff"] = {"draft.id": [evil, evil]}
    t["validity"]["invalid_runs"] = [{"arm": "spec", "index": 0, "reasons": [evil]}]
    t["server_logs"] = [{"arm": "spec", "server": "x", "path": evil, "tail": evil}]
    for s in data["servers"].values():
        s["command"] = [*s["command"], evil]
    html = report.render_html(data)
    assert "<script" not in html.lower() and "<img" not in html.lower()
    assert html.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 10


def test_cost_per_million_tokens_at_each_concurrency_and_peak(html: str, recorded: dict[str, Any]) -> None:
    price = recorded["price"]
    assert price == {"usd_per_hour": 2.5, "usd_per_gpu_hour": 2.5, "gpus": 1,
                     "source": "profile fake-gpu price_per_hour_usd"}
    rows = report.cost_rows(recorded["tests"], price)
    assert len(rows) == sum(1 for t in recorded["tests"] if t.get("summary"))
    row = next(r for r in rows if r["method"] == "ngram" and r["concurrency"] == 16)
    assert row["cost"] == pytest.approx(2.5 / (row["tps"] * 3600) * 1e6)
    peaks = [r for r in rows if r["peak"]]
    assert {r["method"] for r in peaks} == {"ngram", "draft_model"}
    for p in peaks:
        assert p["tps"] == max(r["tps"] for r in rows if r["method"] == p["method"])
    assert "Cost per 1M output tokens" in html and f"{row['cost']:.3g}" in html and "★" in html
    assert report.cost_rows(recorded["tests"], None) == []
    assert "No cost: give a price" in report.render_html({**recorded, "price": None})


# ---- pure pieces --------------------------------------------------------------------------------------


def test_crossovers_interpolate_on_the_log_axis() -> None:
    assert report.crossovers([(1, 2.0), (2, 1.5), (4, 1.25), (8, 0.75)]) == [(pytest.approx(2 ** 2.5), 1.0)]
    assert report.crossovers([(1, 2.0), (3, 0.0)], log_x=False) == [(2.0, 1.0)]
    assert report.crossovers([(1, 2.0), (2, 1.5)]) == []


def test_regime_limits_from_engine_config_then_command() -> None:
    real = {"engine_config": {"compilation_config": "{'level': 3, 'cudagraph_capture_sizes': [1, 2, 4, 8, 512], "
                                                    "'pass_config': {}}"},
            "command": ["vllm", "serve", "m", "--max-num-batched-tokens", "8192"]}
    assert report.regime_limits(real) == [(512, "CUDA-graph capture size"), (8192, "max_num_batched_tokens")]
    printed = {"engine_config": {"compilation_config": "{'max_cudagraph_capture_size': 256}",
                                 "max_num_batched_tokens": "2048"}, "command": []}
    assert report.regime_limits(printed) == [(256, "CUDA-graph capture size"), (2048, "max_num_batched_tokens")]
    assert report.regime_limits({"engine_config": {}, "command": ["vllm"]}) == []
    assert report.regime_limits(None) == []


def _test(nodeid: str, **params: Any) -> dict[str, Any]:
    base = {"method": "ngram", "k": 3, "temperature": 0.0, "concurrency": 1, "dataset": "builtin",
            "max_tokens": None, "num_prompts": None, "speculative_config": None}
    return {"nodeid": nodeid, "params": {**base, **params}, "outcome": "passed",
            "summary": {"speedup": 1.2, "acceptance_rate": 0.5, "output_tps": 100.0}}


def test_sweeps_need_two_values_and_keep_other_params_fixed() -> None:
    tests = [_test("s.py::t[a]", concurrency=1), _test("s.py::t[b]", concurrency=4),
             _test("s.py::t[c]", concurrency=1, temperature=1.0), _test("s.py::u[a]", temperature=0.5)]
    found = report.sweeps(tests)
    assert [(s.function, s.axis) for s in found] == [("s.py::t", "concurrency"), ("s.py::t", "temperature")]
    assert found[0].fixed["temperature"] == 0.0 and found[1].fixed["concurrency"] == 1  # t[c] is T=1: not in it
    conc = found[0]
    assert [t["params"]["concurrency"] for t in conc.lines["ngram k=3"]] == [1, 4]
    assert report.sweeps([_test("s.py::t[a]")]) == []


def test_status_and_order() -> None:
    ok = {**_test("a"), "verdicts": {"speedup": {"verdict": "unchanged"}}}
    bad = {**_test("b"), "verdicts": {"speedup": {"verdict": "regressed"}}, "outcome": "failed"}
    err = {**_test("c"), "outcome": "failed (setup)"}
    inv = {**_test("d"), "validity": {"valid": False, "invalid_runs": []}}
    assert [report.status(t) for t in (ok, bad, err, inv)] == ["unchanged", "regressed", "failed", "invalid"]
    assert [t["nodeid"] for t in report.sort_tests([ok, inv, err, bad])] == ["b", "c", "d", "a"]


# ---- the plugin writes it -------------------------------------------------------------------------------


SUITE = """
import pytest

@pytest.mark.specdec(method="ngram", k=3, temperature=0.0, concurrency=[1, 2], num_prompts=4, max_tokens=16)
def test_ngram(specdec):
    assert specdec.summary["acceptance_rate"] is not None
    assert specdec.params["concurrency"] == 1, "fails on purpose: the report is written anyway"
"""


def test_plugin_writes_report_and_ends_the_summary_with_its_uri(
    pytester: pytest.Pytester, fake_endpoints: tuple[str, str], fake_profile: Path
) -> None:
    pytester.makepyfile(test_suite=SUITE)
    spec, ref = fake_endpoints
    reports = pytester.path / "reports"
    args = [f"--specdec-profile={fake_profile}", f"--specdec-endpoint={spec}", f"--specdec-reference-endpoint={ref}",
            f"--specdec-reports={reports}", "-p", "no:cacheprovider", "--update-baselines=missing"]
    result = pytester.runpytest(*args, "--specdec-gpu-hourly-usd=3", "--specdec-benchmark-json=bench/out.json")
    result.assert_outcomes(passed=1, failed=1)
    latest = reports / "latest.html"
    stamped = list(reports.glob("specdec-*.html"))
    assert latest.is_file() and len(stamped) == 1 and stamped[0].read_text() == latest.read_text()
    lines = [line for line in result.outlines if line.strip()]
    assert re.fullmatch(r"-+ specdec report: file://\S+/reports/latest\.html -+", lines[-2]), lines[-3:]
    assert lines[-1].startswith("=") and "1 failed, 1 passed" in lines[-1]
    html = latest.read_text()
    data = json.loads((reports / "latest.json").read_text())
    assert data["price"]["usd_per_hour"] == 3.0 and data["price"]["source"] == "--specdec-gpu-hourly-usd"
    assert "Cost per 1M output tokens" in html and "speedup vs concurrency" in html
    assert "fails on purpose: the report is written anyway" in html  # the failure text is recorded
    bench = json.loads((pytester.path / "bench" / "out.json").read_text())
    assert {b["group"] for b in bench["benchmarks"]} == {"seconds per output token", "TPOT P50 (s)", "E2E P50 (s)"}

    own = pytester.path / "nightly" / "r.html"
    result = pytester.runpytest(*args, f"--specdec-report={own}")
    assert own.is_file() and latest.read_text() == html  # --specdec-report replaces both default paths
    result.stdout.fnmatch_lines([f"*specdec report: {own.as_uri()} *"])


def test_help_lists_the_report_options(pytester: pytest.Pytester) -> None:
    pytester.runpytest("--help").stdout.fnmatch_lines([
        "*--specdec-report=PATH*", "*--specdec-gpu-hourly-usd=USD*", "*--specdec-benchmark-json=PATH*"])
    bad = pytester.runpytest("--specdec-gpu-hourly-usd=free")
    bad.stderr.fnmatch_lines(["*--specdec-gpu-hourly-usd: expected a number > 0, got 'free'"])


def test_bad_profile_price_is_a_clear_error(pytester: pytest.Pytester, fake_profile: Path,
                                            fake_endpoints: tuple[str, str]) -> None:
    fake_profile.write_text('price_per_hour_usd = "cheap"\n' + fake_profile.read_text())
    pytester.makepyfile(test_suite=SUITE)
    spec, ref = fake_endpoints
    result = pytester.runpytest(f"--specdec-profile={fake_profile}", f"--specdec-endpoint={spec}",
                                f"--specdec-reference-endpoint={ref}", "-p", "no:cacheprovider",
                                f"--specdec-reports={pytester.path / 'reports'}", "--update-baselines=missing")
    result.stdout.fnmatch_lines(["*price_per_hour_usd must be a number > 0 (USD per GPU hour), got 'cheap'*"])


# ---- pytest-benchmark ---------------------------------------------------------------------------------


def test_benchmark_export_is_read_by_pytest_benchmark_compare(recorded: dict[str, Any], tmp_path: Path) -> None:
    data = report.benchmark_json(recorded)
    measured = [t for t in recorded["tests"] if t.get("summary")]
    assert len(data["benchmarks"]) == len(measured) * 2 * len(report.BENCH_METRICS)
    first = next(b for b in data["benchmarks"] if b["name"].endswith("::spec::s_per_output_token"))
    test = next(t for t in measured if t["nodeid"] in first["fullname"])
    valid = [r for r in test["runs"] if r["valid"]]
    assert first["stats"]["data"] == [pytest.approx(1 / r["output_tok_s"]) for r in valid]
    assert first["stats"]["mean"] == pytest.approx(sum(first["stats"]["data"]) / len(valid))
    assert first["extra_info"]["vllm_version"] == recorded["environment"]["vllm_version"]
    assert "speculative_config" in first["extra_info"] and data["machine_info"]["python_version"]
    path = tmp_path / "0001_specdec.json"
    path.write_text(json.dumps(data))
    cli = shutil.which("pytest-benchmark", path=str(Path(sys.executable).parent)) or "pytest-benchmark"
    out = subprocess.run([cli, "compare", str(path), "--group-by=group", "--columns=min,mean,max,rounds"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "benchmark 'seconds per output token'" in out.stdout
    assert re.search(r"test_k\[ngram-k2-t0\.0-c2\]::spec::tpot_p50", out.stdout), out.stdout[:2000]
    for b in data["benchmarks"]:
        assert b["name"][:40] in out.stdout


# ---- headless Chromium ------------------------------------------------------------------------------------


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def test_report_renders_in_headless_chromium(html: str, tmp_path: Path, pytestconfig: pytest.Config) -> None:
    browser = _chromium()
    if browser is None:
        if os.environ.get("SPECDEC_REQUIRE_CHROMIUM") == "1":
            pytest.fail("SPECDEC_REQUIRE_CHROMIUM=1 but no chromium on PATH: apt-get install -y chromium")
        pytest.skip("chromium not installed (apt-get install -y chromium); CI sets SPECDEC_REQUIRE_CHROMIUM=1")
    from PIL import Image

    page = tmp_path / "report.html"
    page.write_text(html, encoding="utf-8")
    shot = tmp_path / "report.png"
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1400,2600",
           page.as_uri()]
    subprocess.run(cmd, capture_output=True, timeout=120, check=True)
    # The artifact a reviewer looks at (reports/ is git-ignored; CI keeps the tree).
    artifact = pytestconfig.rootpath / "reports" / "test-artifacts" / "report-screenshot.png"
    artifact.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shot, artifact)
    print(f"report screenshot: {artifact}")
    img = Image.open(shot).convert("RGB")
    assert img.size == (1400, 2600)
    counts = {rgb: n for n, rgb in img.getcolors(maxcolors=1 << 24)}

    def pixels(hex_color: str, tol: int = 12) -> int:
        want = tuple(int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
        return sum(n for rgb, n in counts.items() if all(abs(a - b) <= tol for a, b in zip(rgb, want)))

    assert pixels("#1d2b3a") > 1400 * 30  # the header bar
    assert pixels("#e8edf2") > 5000  # table header cells: the summary table is laid out
    assert pixels("#c62828") > 300  # red badges: the regression and the failure
    # The chart lines (first two palette colours) are drawn in the swept charts, not just declared.
    assert pixels(report.PALETTE[0], 30) > 2000 and pixels(report.PALETTE[1], 30) > 2000
    top = img.crop((0, 0, 1400, 1000))
    assert len(top.getcolors(maxcolors=1 << 24)) > 200  # text and anti-aliased lines, not a blank or error page
