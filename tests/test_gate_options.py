"""The gate's options end to end through pytester, against the simulated vLLM servers of
test_baselines_e2e (endpoint mode, one test of 8 prompts): what `gate=[...]` (marker) and the ini key
`specdec_gate` move into the gated family, `--specdec-fail-inconclusive`, `--specdec-fail-machine` (and their
ini keys), and the runs a skipped look leaves unspent in the JSON results.

Each scenario is deterministic: it injects a change far beyond its threshold while the other gated metrics get
thresholds far beyond what they move, or (for "inconclusive") compares with a baseline of a single run, which no
number of runs tonight can settle.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from fake_server import FakeServer
from test_baselines_e2e import ID, esc, results, run, servers  # noqa: F401 (servers: a fixture)

Servers = tuple[FakeServer, FakeServer]
# test_baselines_e2e's test (same id), without its `assert specdec.valid`: a run the client lagged through
# (two busy cores under -n 2) is left out of the verdicts, which is all these tests need.
SUITE = """
import pytest

@pytest.mark.specdec(method="ngram", k=3, temperature=0.0, concurrency=4, num_prompts=8, max_tokens=24)
def test_ngram(specdec):
    assert specdec.result.reference_runs
"""
WARN = ("-W", "default::pytest_specdec.session.SpecDecWarning")  # a SpecDecWarning shows, never raises
NAME = ID.split("::")[-1]


def latest(pytester: pytest.Pytester) -> dict:
    """The whole JSON results of the last session (`results` gives its one test)."""
    return json.loads((pytester.path / "reports" / "latest.json").read_text())


def baseline(pytester: pytest.Pytester, profile: Path, servers: Servers, *extra: str) -> None:
    run(pytester, profile, servers, "--update-baselines", *extra).assert_outcomes(passed=1)


def tail(r: pytest.RunResult, n: int = 8) -> list[str]:
    """The terminal's last lines (the gate summary, then the results' paths and the report line)."""
    return r.outlines[-n:]


# ---- gate=[...] and specdec_gate: a shown metric moved into the gated family ------------------------

# The spec server answers its first token 200 ms late instead of 20 ms: its P95 TTFT grows ~10x, far beyond the
# 150 % latency threshold (the 20 ms keep the baseline's TTFT above the client's own jitter), while the
# always-gated metrics get thresholds wide enough to hold (the speedup drops ~85 %, the P95 E2E ratio rises ~7x;
# acceptance varies run to run on the fake, as its prompts are salted).
WIDE_GATED = ("--specdec-threshold=speedup=99", "--specdec-threshold=e2e_p95_ratio=10000",
              "--specdec-threshold=acceptance=30")
GATED = ["speedup", "acceptance_rate", "e2e_p95_ratio"]


@pytest.mark.parametrize("how", ["none", "marker", "ini", "pyproject"])
def test_gate_moves_a_shown_metric_into_the_gated_family(
    pytester: pytest.Pytester, fake_profile: Path, servers: Servers, how: str
) -> None:
    suite = SUITE
    if how == "marker":
        suite = suite.replace("def test_ngram", "@pytest.mark.specdec_verdicts(gate=['ttft_p95_ms'])\ndef test_ngram")
    elif how == "ini":
        pytester.makeini("[pytest]\nspecdec_gate =\n    ttft_p95_ms\n")
    elif how == "pyproject":
        pytester.makepyprojecttoml("[tool.pytest.ini_options]\nspecdec_gate = ['ttft_p95_ms']\n")
    pytester.makepyfile(test_suite=suite)
    servers[0].reconfigure(ttft_s=0.02)
    baseline(pytester, fake_profile, servers, *WIDE_GATED)

    servers[0].reconfigure(ttft_s=0.2)
    r = run(pytester, fake_profile, servers, *WIDE_GATED, *WARN)
    test = results(pytester)
    v = test["verdicts"]["ttft_p95_ms"]
    assert v["verdict"] == "regressed", v
    assert all(test["verdicts"][m]["verdict"] != "regressed" for m in GATED), test["verdicts"]
    if how == "none":  # shown: judged and reported, never a failure
        r.assert_outcomes(passed=1)
        assert v["family"] == "shown" and test["baseline"]["gate"] == GATED
        assert test["outcome"] == "passed"
        return
    r.assert_outcomes(failed=1)
    assert v["family"] == "gated" and v["mde"] is not None
    assert test["baseline"]["gate"] == [*GATED, "ttft_p95_ms"]
    assert test["outcome"] == "failed"
    r.stdout.fnmatch_lines(["*specdec: 1 metric(s) regressed: ttft_p95_ms",
                            "P95 TTFT *gated *regressed"])
    # the gate summary lists it with the always-gated three
    r.stdout.fnmatch_lines([esc(f"  {NAME}: speedup *; P95 TTFT regressed (catches a rise >= *")])


# ---- --specdec-fail-inconclusive / ini specdec_fail_inconclusive --------------------------------

# A baseline of one run has no run-to-run variance: tonight's verdicts are all inconclusive ("too little data"),
# whatever the runs measure, so this is deterministic; and more runs tonight cannot settle them.
THIN = "--specdec-runs=1"


@pytest.mark.parametrize("how", ["default", "flag", "ini"])
def test_fail_inconclusive(pytester: pytest.Pytester, fake_profile: Path, servers: Servers, how: str) -> None:
    pytester.makepyfile(test_suite=SUITE)
    baseline(pytester, fake_profile, servers, THIN)
    if how == "ini":
        pytester.makepyprojecttoml("[tool.pytest.ini_options]\nspecdec_fail_inconclusive = true\n")
    flag = ("--specdec-fail-inconclusive",) if how == "flag" else ()
    r = run(pytester, fake_profile, servers, *WARN, *flag)
    data = latest(pytester)
    test = data["tests"][0]
    open_ = test["baseline"]["inconclusive_gated"]
    assert open_ == GATED and all(v["verdict"] == "inconclusive" for v in test["verdicts"].values())
    assert data["gate"]["fail_inconclusive"] is (how != "default")
    count = f"specdec gate: inconclusive gated metrics per test: {NAME} ({len(open_)})"
    if how == "default":
        r.assert_outcomes(passed=1)
        assert test["outcome"] == "passed"
        r.stdout.fnmatch_lines([esc(f"*SpecDecWarning: *{NAME}: {len(open_)} gated metric(s) inconclusive after "
                                    "3 run(s) per arm: *; the test passes (--specdec-fail-inconclusive fails it)")])
        assert count + " (they fail with --specdec-fail-inconclusive)" in tail(r), tail(r)
        return
    r.assert_outcomes(failed=1)
    assert test["outcome"] == "failed"
    r.stdout.fnmatch_lines([f"*specdec: {len(open_)} gated metric(s) inconclusive after 3 run(s) per arm: "
                            "speedup no variance model; * (--specdec-fail-inconclusive)",
                            "*metric * baseline * now * Δ * 90% CI * p * verdict",
                            "speedup *gated *inconclusive"])
    assert count in tail(r), tail(r)


# ---- --specdec-fail-machine / ini specdec_fail_machine ------------------------------------------


@pytest.mark.parametrize("how", ["default", "flag", "ini"])
def test_fail_machine(pytester: pytest.Pytester, fake_profile: Path, servers: Servers, how: str) -> None:
    pytester.makepyfile(test_suite=SUITE)
    baseline(pytester, fake_profile, servers)
    if how == "ini":
        pytester.makeini("[pytest]\nspecdec_fail_machine = true\n")
    # Both servers 3x slower: the machine, not speculation (the ratios hold); reference tok/s ~ -65 %.
    spec, ref = servers
    spec.reconfigure(step_s=spec.config.step_s * 3)
    ref.reconfigure(step_s=ref.config.step_s * 3)
    flag = ("--specdec-fail-machine",) if how == "flag" else ()
    r = run(pytester, fake_profile, servers, *WIDE_GATED, "--specdec-threshold=reference_tok_s=20", *WARN, *flag)
    r.assert_outcomes(passed=1)  # the test itself passes either way: it is the session that fails
    data = latest(pytester)
    machine = data["machine_factor"]
    assert machine["factor"] < 0.6 and machine["beyond_threshold"] and machine["threshold"] == 20, machine
    line = "specdec: this machine ran * % slower than the baseline nights (*); beyond ±20 %*"
    if how == "default":
        assert r.ret == pytest.ExitCode.OK
        assert data["gate"] == {**data["gate"], "fail_machine": False, "machine_failed": False}
        r.stdout.fnmatch_lines([line])
        r.stdout.fnmatch_lines(["*SpecDecWarning: this machine ran * % slower than the baseline nights*beyond ±20 %*"])
        r.stdout.no_fnmatch_line("*the session fails on the machine factor*")
        return
    assert r.ret == pytest.ExitCode.TESTS_FAILED
    assert data["gate"] == {**data["gate"], "fail_machine": True, "machine_failed": True}
    r.stdout.fnmatch_lines([line, "specdec: the session fails on the machine factor (--specdec-fail-machine)"])
    r.stdout.no_fnmatch_line("*SpecDecWarning: this machine ran*")


# ---- unspent_runs in the JSON results ---------------------------------------------------------------


def test_unspent_runs_are_recorded(pytester: pytest.Pytester, fake_profile: Path, servers: Servers) -> None:
    pytester.makepyfile(test_suite=SUITE)
    looks = ("--specdec-runs=2", "--specdec-max-runs=4")
    baseline(pytester, fake_profile, servers, THIN)

    # A thin baseline (see THIN): no number of runs tonight settles it, so the second look is skipped.
    run(pytester, fake_profile, servers, *looks, *WARN).stdout.fnmatch_lines([
        "*: 2 run(s) per arm not spent: speedup, acceptance_rate, e2e_p95_ratio inconclusive, but 4 runs could not "
        "settle it",
        "specdec gate: 1 test(s), gated verdicts 3 inconclusive; 2 run(s) per arm not spent (no look could change "
        "a verdict)"])
    b = results(pytester)["baseline"]
    assert (b["looks"], b["max_looks"], b["unspent_runs"]) == ([2], 2, 2), b
    assert b["stop_reason"] == "speedup, acceptance_rate, e2e_p95_ratio inconclusive, but 4 runs could not settle it"
    assert results(pytester)["verdicts"]["speedup"]["n_now"] == 2

    # A baseline of 3 runs, and every gated verdict conclusive at the first look (thresholds far wider than
    # the runs' spread): nothing to gain from the second either.
    shutil.rmtree(pytester.path / "baselines")
    baseline(pytester, fake_profile, servers)
    r = run(pytester, fake_profile, servers, "--specdec-max-runs=5", *WIDE_GATED, "--specdec-threshold=acceptance=60",
            *WARN)
    r.assert_outcomes(passed=1)
    b = results(pytester)["baseline"]
    assert (b["looks"], b["unspent_runs"], b["stop_reason"]) == ([3], 2, "every gated verdict is conclusive"), b
    assert b["inconclusive_gated"] == []

    # A session with a single planned look has nothing to leave unspent.
    run(pytester, fake_profile, servers, *WIDE_GATED, *WARN).assert_outcomes(passed=1)
    b = results(pytester)["baseline"]
    assert (b["looks"], b["max_looks"], b["unspent_runs"], b["stop_reason"]) == ([3], 1, 0, ""), b
