"""Baselines and verdicts end to end through pytester, against simulated vLLM servers (endpoint mode):
missing → --update-baselines → unchanged passes → injected slowdown + acceptance drop fails with the
table and the attribution → --update-baselines accepts it → passes; plus strictness and opt-out."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_server import FakeConfig, FakeServer

# pytester's in-process runs drop modules first imported inside them; numpy warns when imported twice.
import filelock  # noqa: F401
import numpy  # noqa: F401
import pytest_specdec.gate.baselines  # noqa: F401
import pytest_specdec.gate.sequential
import pytest_specdec.gate.slo  # noqa: F401
import pytest_specdec.gate.stats  # noqa: F401
import pytest_specdec.gate.verdicts  # noqa: F401
import scipy.special  # noqa: F401
import scipy.stats  # noqa: F401

SUITE = """
import pytest

@pytest.mark.specdec(method="ngram", k=3, temperature=0.0, concurrency=4, num_prompts=8, max_tokens={max_tokens})
def test_ngram(specdec):
    assert specdec.valid
"""
ID = "test_ngram[ngram-k3-t0.0-c4]"
FILE = f"fake/test_suite/{ID}.json"


def esc(text: str) -> str:
    """Literal text inside an fnmatch pattern ('[' opens a character class there)."""
    return text.replace("[", "[[]")


GOOD = {"step_s": 0.001, "acceptance": (0.8, 0.6, 0.4)}
BAD = {"step_s": 0.006, "acceptance": (0.5, 0.3, 0.1)}  # ~6x slower steps, acceptance 0.6 -> 0.3


@pytest.fixture
def servers() -> Iterator[tuple[FakeServer, FakeServer]]:
    """(spec, reference) fake servers that the test can reconfigure between sessions."""
    spec = FakeServer(FakeConfig(k=3, output_tokens=24, **GOOD))  # type: ignore[arg-type]
    ref = FakeServer(FakeConfig(k=0, step_s=0.002, output_tokens=24))
    spec.start()
    ref.start()
    yield spec, ref
    spec.stop()
    ref.stop()


def run(pytester: pytest.Pytester, profile: Path, servers: tuple[FakeServer, FakeServer], *extra: str
        ) -> pytest.RunResult:
    spec, ref = servers
    return pytester.runpytest(
        f"--specdec-profile={profile}", f"--specdec-endpoint={spec.base_url}",
        f"--specdec-reference-endpoint={ref.base_url}", f"--specdec-reports={pytester.path / 'reports'}",
        "--specdec-runs=3", "-p", "no:cacheprovider",
        # The fake server's timing shares 2 busy cores with everything else, and its acceptance varies by
        # ~4 points per run (salted prompts): wide thresholds keep "unchanged" from flaking (6 points gave a
        # false `regressed` in a few % of sessions); the injected changes (-83 % speedup, -30 points) are far beyond.
        "--specdec-threshold=rate=40", "--specdec-threshold=latency=150", "--specdec-threshold=acceptance=15",
        *extra,
    )


def results(pytester: pytest.Pytester) -> dict:
    return json.loads((pytester.path / "reports" / "latest.json").read_text())["tests"][0]


def test_workflow_update_regress_accept(
    pytester: pytest.Pytester, fake_profile: Path, servers: tuple[FakeServer, FakeServer]
) -> None:
    pytester.makepyfile(test_suite=SUITE.format(max_tokens=24))
    path = pytester.path / "baselines" / FILE

    # 1. No baseline: the test fails with the path and the command that creates it.
    r = run(pytester, fake_profile, servers)
    r.assert_outcomes(failed=1)
    r.stdout.fnmatch_lines([esc(f"*no baseline for this test at baselines/{FILE}"),
                            esc(f"*create it with: pytest 'test_suite.py::{ID}' --update-baselines=missing")])
    assert not path.exists()  # nothing is written without the flag

    # 2. --update-baselines: passes, writes once at the end, says so.
    r = run(pytester, fake_profile, servers, "--update-baselines")
    r.assert_outcomes(passed=1)
    r.stdout.fnmatch_lines(["specdec baselines (*): 1 created, 0 updated, 0 unchanged, 0 unused",
                            esc(f"  created   {FILE}")])
    data = json.loads(path.read_text())
    assert data["schema"] == 1 and len(data["sessions"]) == 1
    assert data["comparability"]["workload"] == {"concurrency": 4, "max_tokens": 24, "num_prompts": 8, "rate": None,
                                                  "api": "chat"}
    assert data["under_test"]["plugin"] and "engine_config" in data["under_test"]
    runs = data["sessions"][0]["runs"]
    assert len(runs["spec"]) == len(runs["reference"]) == 3 and runs["spec"][0]["accepted_per_pos"]
    assert path.read_text() == json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n"

    # 3. Unchanged servers: passes, with verdicts in the JSON results.
    r = run(pytester, fake_profile, servers)
    r.assert_outcomes(passed=1)
    verdicts = results(pytester)["verdicts"]
    assert {"speedup", "output_tok_s", "reference_tok_s", "acceptance_rate", "per_position_acceptance[0]",
            "draft_coverage", "tpot_p95_ms", "ttft_p95_ms", "e2e_p95_ms"} <= set(verdicts)
    v = verdicts["speedup"]
    assert set(v) >= {"verdict", "baseline", "now", "delta", "ci", "p", "n_baseline", "n_now", "unit"}
    assert v["unit"] == "run" and v["n_baseline"] == 3 and v["n_now"] == 3
    assert all(x["verdict"] != "regressed" for x in verdicts.values()), verdicts

    # 4. Inject a slowdown and an acceptance drop into the spec server: the test fails with the table.
    servers[0].reconfigure(**BAD)
    r = run(pytester, fake_profile, servers)
    r.assert_outcomes(failed=1)
    r.stdout.fnmatch_lines([
        "*specdec: * metric(s) regressed: speedup, *acceptance_rate*",
        esc(f"*baseline: baselines/{FILE} (1 session(s); unit of comparison: runs*"),
        "*metric * baseline * now * Δ * 90% CI * p * verdict",
        "speedup *gated *x *x *-* % *-* % .. -* % *regressed",
        "acceptance *gated *0.* 0.* -* pt *regressed",
        # One test: the machine factor is its own reference deviation, so reference tok/s is +0.0 % by
        # construction and unchanged or inconclusive only as its run noise allows.
        "reference tok/s *shown *",
        "attribution: reference decoding * +0.0 %; speedup regressed -* %; acceptance regressed -* pt*: "
        "speculation gains less because fewer drafted tokens are accepted*",
        "under test, baseline (*) → now:",
        "*to accept this change: --update-baselines*",
    ])
    assert results(pytester)["verdicts"]["acceptance_rate"]["verdict"] == "regressed"
    assert len(json.loads(path.read_text())["sessions"]) == 1  # a failing run never writes

    # 5. Accept the change; 6. the new state passes.
    r = run(pytester, fake_profile, servers, "--update-baselines")
    r.assert_outcomes(passed=1)
    r.stdout.fnmatch_lines(["specdec baselines (*): 0 created, 1 updated, 0 unchanged, 0 unused",
                            esc(f"  updated   {FILE}: speedup * → *, *acceptance_rate 0.* → 0.*")
                            + "accepted a change*"])
    assert len(json.loads(path.read_text())["sessions"]) == 1
    r = run(pytester, fake_profile, servers)
    r.assert_outcomes(passed=1)


def test_not_comparable_warns_or_fails_strict_and_opt_out(
    pytester: pytest.Pytester, fake_profile: Path, servers: tuple[FakeServer, FakeServer]
) -> None:
    pytester.makepyfile(test_suite=SUITE.format(max_tokens=24))
    run(pytester, fake_profile, servers, "--update-baselines=missing").assert_outcomes(passed=1)
    r = run(pytester, fake_profile, servers, "--update-baselines=missing")  # exists: left alone
    r.stdout.fnmatch_lines(["*0 created, 0 updated, 1 unchanged*", esc(f"*unchanged {FILE}: exists*")])

    pytester.makepyfile(test_suite=SUITE.format(max_tokens=20))  # same test id, another workload
    # (the outer run's filterwarnings=error reaches in-process pytester runs: let this one show as a warning)
    r = run(pytester, fake_profile, servers, "-W", "default::pytest_specdec.session.SpecDecWarning")
    r.assert_outcomes(passed=1, warnings=1)
    r.stdout.fnmatch_lines(["*SpecDecWarning*not-comparable*", "*workload.max_tokens: 24 → 20*",
                            "  test_ngram*: not comparable with its baseline (workload.max_tokens 24 → 20)"])
    got = results(pytester)["verdicts"]
    assert got["speedup"]["verdict"] == got["output_tok_s"]["verdict"] == "not-comparable"
    assert (got["speedup"]["family"], got["output_tok_s"]["family"]) == ("gated", "shown")
    r = run(pytester, fake_profile, servers, "--specdec-strict")
    r.assert_outcomes(failed=1)
    r.stdout.fnmatch_lines(["*specdec: baseline * was measured under different conditions (not-comparable):",
                            "*workload.max_tokens: 24 → 20"])

    # Opt-out: the regression is recorded but does not fail the test.
    pytester.makepyfile(test_suite=SUITE.format(max_tokens=24).replace(
        "def test_ngram", "@pytest.mark.specdec_verdicts(check=False)\ndef test_ngram"))
    servers[0].reconfigure(**BAD)
    r = run(pytester, fake_profile, servers)
    r.assert_outcomes(passed=1)
    assert results(pytester)["verdicts"]["acceptance_rate"]["verdict"] == "regressed"
    assert results(pytester)["baseline"]["checked"] is False


def test_slo_helper_message(pytester: pytest.Pytester, fake_profile: Path,
                            servers: tuple[FakeServer, FakeServer]) -> None:
    pytester.makepyfile(test_suite="""
import pytest

@pytest.mark.specdec_verdicts(check=False)
@pytest.mark.specdec(method="ngram", k=3, temperature=0.0, concurrency=4, num_prompts=8, max_tokens=24)
def test_slo(specdec):
    specdec.assert_slo(speedup=1.01, acceptance=0.9, p95_tpot_ms=1000)
""")
    r = run(pytester, fake_profile, servers)
    r.assert_outcomes(failed=1)
    r.stdout.fnmatch_lines([
        esc("*specdec SLO: 1 of 3 check(s) failed for test_suite.py::test_slo[ngram-k3-t0.0-c4]"),
        "*check * statistic * value * runs * result",
        "*speedup >= 1.01 * geometric mean * pass",
        "*acceptance >= 0.9 * mean * 0.* 3 * FAIL",
        "*P95 TPOT ms <= 1000 * median * pass",
        "*acceptance_rate: [[]0.*",
    ])


def test_bad_threshold_and_marker_are_clear_errors(pytester: pytest.Pytester, fake_profile: Path) -> None:
    pytester.makepyfile(test_suite=SUITE.format(max_tokens=24))
    r = pytester.runpytest(f"--specdec-profile={fake_profile}", "--specdec-threshold=sped=5")
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    r.stderr.fnmatch_lines(["*--specdec-threshold: unknown metric 'sped'; allowed: rate, acceptance, latency, speedup*"])
    r = pytester.runpytest(f"--specdec-profile={fake_profile}", "--specdec-threshold=speedup=-1")
    r.stderr.fnmatch_lines(["*threshold of speedup must be a positive number*got '-1'"])
    r = pytester.runpytest(f"--specdec-profile={fake_profile}", "--update-baselines=some")
    r.stderr.fnmatch_lines(["*expected --update-baselines (all) or --update-baselines=missing, got 'some'"])


def test_inconclusive_takes_more_runs_up_to_the_maximum(
    pytester: pytest.Pytester, fake_profile: Path, servers: tuple[FakeServer, FakeServer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytester.makepyfile(test_suite=SUITE.format(max_tokens=24))
    spec, ref = servers
    common = [f"--specdec-profile={fake_profile}", f"--specdec-endpoint={spec.base_url}",
              f"--specdec-reference-endpoint={ref.base_url}", f"--specdec-reports={pytester.path / 'reports'}",
              "--specdec-runs=2", "-p", "no:cacheprovider"]
    pytester.runpytest(*common, "--update-baselines").assert_outcomes(passed=1)
    # When a look can settle a verdict (sequential.next_look_useful, tested on its own in test_gate_stats),
    # the runs are added and the alpha is split. Whether 2 v 2 fake runs leave one open depends on the
    # machine's timing noise, so the decision is pinned here (pytester runs in this process).
    with monkeypatch.context() as m:
        m.setattr(pytest_specdec.gate.sequential, "next_look_useful", lambda *args, **kwargs: True)
        r = pytester.runpytest(*common, "--specdec-max-runs=4")
    r.stdout.fnmatch_lines(["*inconclusive at look 1 of 2: 4 interleaved runs",
                            "*run 4/4 spec*"])
    test = results(pytester)
    assert test["baseline"]["looks"] == [2, 4] and test["baseline"]["max_looks"] == 2
    assert test["baseline"]["unspent_runs"] == 0
    assert test["verdicts"]["output_tok_s"]["n_now"] == 4
    assert "look 2 of 2: p x2" in test["verdicts"]["output_tok_s"]["note"]
    # When no look can change a gated verdict the runs are not spent, and the terminal and JSON say so.
    with monkeypatch.context() as m:
        m.setattr(pytest_specdec.gate.sequential, "next_look_useful", lambda *args, **kwargs: False)
        r = pytester.runpytest(*common, "--specdec-max-runs=4")
    r.stdout.fnmatch_lines(["*: 2 run(s) per arm not spent: *"])
    test = results(pytester)
    assert test["baseline"]["looks"] == [2] and test["baseline"]["unspent_runs"] == 2
    r = pytester.runpytest(*common, "--specdec-max-runs=1")
    r.stdout.fnmatch_lines(["*--specdec-max-runs / [[]verdicts] max_runs (1) is below the runs per test (2)*"])
