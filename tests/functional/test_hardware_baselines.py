"""Baselines per machine, through pytester against simulated vLLM servers (endpoint mode): two machines faked by
their CPU model (`servers.hardware.cpu_model`, which every fingerprint reads) share one checkout's baselines.
Each compares only against its own folder, an update on one leaves the other's files byte-identical, and a
machine without baselines of its own gets one block for the session (not a warning per test), which the
report's top says once. Its acceptance is judged against the other machine's nights (the tokens decide it, not the
machine), its speed is not: a head that accepts less regresses on a machine's first run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from session import latest, specdec_session

from fakes import FakeServer
from pytest_specdec.gate.baselines import hardware_key
from pytest_specdec.gate.conditions import cpu_machine

Servers = tuple[FakeServer, FakeServer]
SUITE = {"concurrency": 4, "num_prompts": 8, "max_tokens": 24, "body": "assert specdec.result.reference_runs"}
A, B = "Fake CPU Alpha(R) Processor", "Fake CPU Beta"
KEY_A, KEY_B = (hardware_key({**cpu_machine(), "hardware": m}) for m in (A, B))


@pytest.fixture
def servers(fake_server: Callable[..., FakeServer]) -> Servers:
    return (fake_server(k=3, output_tokens=24, step_s=0.001, acceptance=(0.8, 0.6, 0.4)),
            fake_server(k=0, step_s=0.002, output_tokens=24))


@pytest.fixture
def on(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """``on(model)``: the sessions from now on run on a machine with this CPU model."""
    import pytest_specdec.servers.hardware as hardware

    def switch(model: str) -> None:
        monkeypatch.setattr(hardware, "cpu_model", lambda: model)

    return switch


def run(pytester: pytest.Pytester, profile: Path, servers: Servers, *extra: str) -> pytest.RunResult:
    return specdec_session(pytester, profile, servers, *extra, runs=2,
                           thresholds=("rate=60", "latency=200", "acceptance=30")).result


def files(pytester: pytest.Pytester, key: str) -> dict[Path, bytes]:
    folder = pytester.path / "baselines" / "fake" / key
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*.json"))}


def test_each_machine_compares_only_against_its_own_and_writes_only_its_own(
    pytester: pytest.Pytester, fake_profile: Path, servers: Servers, make_suite: Callable[..., str],
    on: Callable[[str], None],
) -> None:
    pytester.makepyfile(test_suite=make_suite(**SUITE) + make_suite(name="test_other", **SUITE))
    # the model name, the count and this host's identity (the same on both: only the name is faked)
    assert KEY_A.startswith(f"fake-alpha-{os.cpu_count()}cpu-") and KEY_B.startswith(f"fake-beta-{os.cpu_count()}cpu-")

    on(A)  # A records two nights
    run(pytester, fake_profile, servers, "--update-baselines").assert_outcomes(passed=2)
    run(pytester, fake_profile, servers, "--update-baselines").assert_outcomes(passed=2)
    a_files = files(pytester, KEY_A)
    assert len(a_files) == 2 and all(len(json.loads(b)["sessions"]) == 2 for b in a_files.values())
    assert {json.loads(b)["comparability"]["hardware"] for b in a_files.values()} == {A}  # the full fingerprint

    on(B)  # B records its own night beside A's, with =missing; A's files stay byte-identical
    r = run(pytester, fake_profile, servers, "--update-baselines=missing")
    r.assert_outcomes(passed=2)
    r.stdout.fnmatch_lines([
        f"specdec: this machine, {B}, * CPUs, had no baselines of profile fake: this session recorded its nights in "
        f"baselines/fake/{KEY_B}/, 2 file(s) of 2 test(s) whose speed was not judged (the baseline summary says why "
        "any was not written); the next session compares against them",
        "  acceptance (rate, length, per position, coverage) of 2 test(s) judged against other machines' nights: "
        f"baselines/fake/{KEY_A}/ (2 test(s)); the tokens decide it, not the machine, so their nights hold here*",
        f"specdec baselines (baselines/fake/{KEY_B}, {B}, * CPUs): 2 created, 0 updated, 0 unchanged, 0 unused"])
    for t in latest(pytester)["tests"]:  # acceptance against A's two nights; the speed figures recorded, not judged
        assert t["baseline"]["machines"] == [KEY_A] and t["baseline"]["sessions"] == 2, t["baseline"]
        assert t["verdicts"]["acceptance_rate"]["verdict"] != "not-comparable", t["verdicts"]["acceptance_rate"]
        assert {t["verdicts"][m]["method"] for m in ("speedup", "output_tok_s")} == {"another machine"}, t["verdicts"]
    assert files(pytester, KEY_A) == a_files
    b_files = files(pytester, KEY_B)
    assert set(b_files) == set(a_files) and all(len(json.loads(b)["sessions"]) == 1 for b in b_files.values())
    html = (pytester.path / "reports" / "latest.html").read_text()
    assert html[:html.index("<main>")].count("this session recorded its nights in") == 1

    # B compares against its own night (one session), A against its own two.
    run(pytester, fake_profile, servers).assert_outcomes(passed=2)
    for t in latest(pytester)["tests"]:
        assert t["baseline"]["status"] == "compared" and f"/{KEY_B}/" in t["baseline"]["path"], t["baseline"]
        assert t["baseline"]["sessions"] == 1
    assert files(pytester, KEY_A) == a_files and files(pytester, KEY_B) == b_files  # no flag: nothing written
    on(A)
    run(pytester, fake_profile, servers).assert_outcomes(passed=2)
    for t in latest(pytester)["tests"]:
        assert t["baseline"]["status"] == "compared" and f"/{KEY_A}/" in t["baseline"]["path"], t["baseline"]
        assert t["baseline"]["sessions"] == 2
    assert latest(pytester)["gate"]["settings"]["hardware"]["this"]["key"] == KEY_A

    # =missing on a machine with baselines (README's first command) writes nothing and compares.
    r = run(pytester, fake_profile, servers, "--update-baselines=missing")
    r.assert_outcomes(passed=2)
    assert "no baselines for this machine" not in r.stdout.str() and "had no baselines" not in r.stdout.str()
    assert [t["baseline"]["status"] for t in latest(pytester)["tests"]] == ["compared", "compared"]
    assert latest(pytester)["baseline_update"]["created"] == [] and len(latest(pytester)["baseline_update"]
                                                                       ["unchanged"]) == 2
    assert files(pytester, KEY_A) == a_files

    # An update of everything on A writes A's files only: B's stay byte-identical.
    run(pytester, fake_profile, servers, "--update-baselines").assert_outcomes(passed=2)
    assert files(pytester, KEY_B) == b_files
    assert all(len(json.loads(b)["sessions"]) == 3 for b in files(pytester, KEY_A).values())


def test_a_machine_without_baselines_of_its_own_gets_one_block(
    pytester: pytest.Pytester, fake_profile: Path, servers: Servers, make_suite: Callable[..., str],
    on: Callable[[str], None],
) -> None:
    pytester.makepyfile(test_suite=make_suite(**SUITE) + make_suite(name="test_other", **SUITE))
    # every draft accepted: A's acceptance is the same in every run, so a drop below is judged with B's runs' noise
    # alone (two runs a night: with the stand-in's random draws on both sides a drop of 60 pt was once inconclusive)
    servers[0].reconfigure(acceptance=(1.0, 1.0, 1.0))
    on(A)
    run(pytester, fake_profile, servers, "--update-baselines").assert_outcomes(passed=2)
    stored = files(pytester, KEY_A)

    on(B)
    r = run(pytester, fake_profile, servers)
    r.assert_outcomes(passed=2)  # by default: measured, unjudged, passed (docs/gate.md)
    block = [
        f"specdec: no baselines for this machine, {B}, * CPUs (baselines/fake/{KEY_B}/ holds none): 2 test(s) "
        "measured, the speed of none judged; they pass, their speed unjudged (--specdec-strict fails them)",
        "  acceptance (rate, length, per position, coverage) of 2 test(s) judged against other machines' nights: "
        f"baselines/fake/{KEY_A}/ (2 test(s)); the tokens decide it, not the machine, so their nights hold here*",
        f"  baselines of profile fake were measured on: {A}, * CPUs (baselines/fake/{KEY_A}/, 2 file(s))",
        "  a speedup measured on other hardware says nothing about this one, so no speed figure is compared with "
        "them",
        "  the ways on:",
        "    record this machine's nights (writes only its own folder, and only missing files), then run again to "
        "compare: the same command with --update-baselines=missing",
        "    or judge a change within one session on this machine, candidate against base: --specdec-base-draft "
        'METHOD=MODEL (docs/gate.md, "A/B in one session")',
    ]
    r.stdout.fnmatch_lines(block, consecutive=True)
    out = r.stdout.str()
    assert out.count("no baselines for this machine") == 1
    assert "SpecDecWarning" not in out and "warnings summary" not in out
    assert out.count("not-comparable (not judged: another machine)") == 4  # speedup and E2E ratio, per test
    assert "no baseline for this test" not in out  # no failure, and no line per test
    assert files(pytester, KEY_A) == stored and not (pytester.path / "baselines" / "fake" / KEY_B).exists()

    html = (pytester.path / "reports" / "latest.html").read_text()
    top = html[:html.index("<main>")]
    assert top.count('id="no-own-baselines"') == 1 and html.count("no baselines for this machine") == 1
    assert f"{B}, {os.cpu_count()} CPUs (baselines/fake/{KEY_B}/ holds none)" in top
    assert f"<span><b>baselines</b> baselines/fake/{KEY_B}</span>" in top

    # --specdec-strict fails each test with the command that records this machine's baseline; the block says so.
    r = run(pytester, fake_profile, servers, "--specdec-strict")
    r.assert_outcomes(failed=2)
    r.stdout.fnmatch_lines([f"*no baseline for this test at baselines/fake/{KEY_B}/test_suite/test_ngram*",
                            "*create it with: pytest 'test_suite.py::test_ngram[[]*' --update-baselines=missing",
                            "specdec: no baselines for this machine, *: 2 test(s) measured, the speed of none "
                            "judged; they FAIL (--specdec-strict)"])
    html = (pytester.path / "reports" / "latest.html").read_text()
    assert "they FAIL (--specdec-strict)" in html[:html.index("<main>")]

    # A head that accepts far less fails on acceptance against A's nights, on B's first run, and is not recorded.
    servers[0].reconfigure(acceptance=(0.02, 0.01, 0.01))
    r = run(pytester, fake_profile, servers, "--update-baselines=missing")
    r.assert_outcomes(failed=2)
    r.stdout.fnmatch_lines([f"  acceptance_rate: -* pt (90% CI *), p=* beyond the -30.00 pt threshold; *; against the "
                            f"nights of {KEY_A} (this machine has none of its own)*"])
    assert "speedup -" not in r.stdout.str()  # no split of the speedup across machines
    r.stdout.fnmatch_lines(["attribution: *acceptance regressed *: acceptance dropped; the speedup is not judged here "
                            "(not-comparable)"])
    assert all(t["verdicts"]["acceptance_rate"]["verdict"] == "regressed" for t in latest(pytester)["tests"])
    assert not (pytester.path / "baselines" / "fake" / KEY_B).exists()  # a failed test is never recorded
    # `compare` against the baselines reads A's nights for B's tests as the session did: the same verdicts.
    out = subprocess.run([str(Path(sys.executable).with_name("pytest-specdec")), "compare",
                          str(pytester.path / "baselines"), str(pytester.path / "reports" / "latest.json"), "--json",
                          "--all"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stdout + out.stderr
    got = {t["nodeid"]: t["verdicts"] for t in json.loads(out.stdout)["tests"]}
    for t in latest(pytester)["tests"]:
        assert {m: v["verdict"] for m, v in got[t["nodeid"]].items()} == {
            m: v["verdict"] for m, v in t["verdicts"].items()}, t["nodeid"]
    servers[0].reconfigure(acceptance=(1.0, 1.0, 1.0))

    # With baselines on neither machine's folder there is nothing to point at: each test fails as before.
    on("Fake CPU Gamma")
    (pytester.path / "baselines" / "fake" / KEY_A).rename(pytester.path / "elsewhere")
    r = run(pytester, fake_profile, servers)
    r.assert_outcomes(failed=2)
    assert "no baselines for this machine" not in r.stdout.str()
