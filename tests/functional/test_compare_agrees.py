"""`pytest-specdec compare BASELINES RESULTS` re-judges a session's results file exactly as the session judged it:
the same stored nights (their night factors, pooled night variances with the profile's floor, priors), each
test at the look it ended on with the thresholds it recorded, the same machine factor and BH over the same
family, because both go through `gate/pipeline.py`. Real plugin sessions against simulated vLLM servers.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from command import specdec_cli as cli
from session import specdec_session

from fakes import FakeServer

THRESHOLDS = ("rate=40", "latency=150", "acceptance=15")  # wide: the fake servers share 2 busy cores


def test_compare_against_the_baselines_gives_the_sessions_verdicts(
    pytester: pytest.Pytester, make_profile: Callable[..., Path], fake_server: Callable[..., FakeServer],
    make_suite: Callable[..., str]
) -> None:
    profile = make_profile()
    profile.write_text(profile.read_text() + "[verdicts]\nmin_night_sd = 6\nmax_runs = 4\n")
    pytester.makepyfile(test_suite=make_suite(concurrency=[2, 4], num_prompts=8, max_tokens=24,
                                              body="assert specdec.result.reference_runs"))
    spec = fake_server(k=3, output_tokens=24, step_s=0.001, acceptance=(0.8, 0.6, 0.4))
    ref = fake_server(k=0, step_s=0.002, output_tokens=24)

    def session(*extra: str) -> dict:
        return specdec_session(pytester, profile, (spec, ref), *extra, runs=2, thresholds=THRESHOLDS).results

    def nights() -> list[int]:
        files = sorted((pytester.path / "baselines").rglob("*.json"))
        return [len(json.loads(f.read_text())["sessions"]) for f in files]

    # Stored nights per file (three, unless one moved): night factors and night variances are in play. A night that a
    # busy CI machine slowed can read as a change (measured: one run of spec tok/s -47 %, speedup regressed), which
    # --update-baselines accepts by dropping the older nights, as it should: another session then stores one more.
    for _ in range(3):
        session("--update-baselines")
    for _ in range(3):
        if min(nights()) >= 2:
            break
        session("--update-baselines")
    assert len(nights()) == 2 and min(nights()) >= 2, nights()
    spec.reconfigure(step_s=0.0014)  # a slower spec path tonight: verdicts of several kinds
    tonight = session()
    assert tonight["gate"]["night_variance"], "the session pooled no night variance: nothing is tested"

    r = cli("compare", pytester.path / "baselines", pytester.path / "reports" / "latest.json", "--json", "--all")
    assert r.returncode in (0, 1), r.stdout + r.stderr
    ours = json.loads(r.stdout)
    judged = [t for t in tonight["tests"] if t.get("verdicts")]
    assert len(judged) == 2
    by_id = {t["nodeid"]: t for t in ours["tests"]}
    for test in judged:
        mine = by_id[test["nodeid"]]
        assert mine["status"] == test["baseline"]["status"] == "compared"
        assert set(mine["verdicts"]) == set(test["verdicts"]), test["nodeid"]
        for metric, v in test["verdicts"].items():
            got = mine["verdicts"][metric]
            assert (got["verdict"], got["family"], got["method"], got["per"]) == (
                v["verdict"], v["family"], v["method"], v["per"]), metric
            for key in ("delta", "p", "baseline", "now", "mde"):
                if v[key] is None:
                    assert got[key] is None, (metric, key)
                else:
                    assert got[key] == pytest.approx(v[key], rel=1e-9, abs=1e-12), (metric, key)
            assert (got["ci"] is None) == (v["ci"] is None)
            if v["ci"]:
                assert got["ci"] == pytest.approx(v["ci"], rel=1e-9, abs=1e-12), metric
    assert ours["machine_factor"]["factor"] == pytest.approx(tonight["machine_factor"]["factor"], rel=1e-12)

    # The profile's own folder names the same baselines; a folder of another profile is an error naming it.
    again = cli("compare", pytester.path / "baselines" / "fake", pytester.path / "reports" / "latest.json", "--json",
                "--all")
    assert json.loads(again.stdout)["tests"] == ours["tests"]
    (pytester.path / "other").mkdir()
    bad = cli("compare", pytester.path / "other", pytester.path / "reports" / "latest.json")
    assert bad.returncode == 2 and "no baselines of profile 'fake'" in bad.stderr

    # One machine's folder names the same baselines, and the closing lines name the folder and its machine.
    [folder] = [d for d in (pytester.path / "baselines" / "fake").iterdir() if d.is_dir()]
    mine = cli("compare", folder, pytester.path / "reports" / "latest.json", "--json", "--all")
    assert json.loads(mine.stdout)["tests"] == ours["tests"]
    assert json.loads(mine.stdout)["baselines"] == [{"folder": str(folder), "hardware": json.loads(mine.stdout)
                                                     ["baselines"][0]["hardware"]}]
    text = cli("compare", pytester.path / "baselines", pytester.path / "reports" / "latest.json").stdout
    assert f"specdec compare: {pytester.path / 'reports' / 'latest.json'}'s tests judged against {folder}, the " \
           "baselines of " in text

    # NEW measured on another machine: judged against that machine's folder, which holds none; only acceptance is
    # compared with this machine's files (as the session would), and the closing lines say which machine has them.
    for t in tonight["tests"]:
        t["baseline"]["comparability"]["hardware"] = "Other CPU"
    other = pytester.path / "other.json"
    other.write_text(json.dumps(tonight))
    r = cli("compare", pytester.path / "baselines", other)
    assert r.returncode in (0, 1) and "holds no baselines, so NEW's speed could not be judged, its acceptance only " \
        "against other machines' nights of the same software; the profile's baselines were measured on: " in \
        r.stdout and f"({folder.name})" in r.stdout, r.stdout
    compared = json.loads(cli("compare", pytester.path / "baselines", other, "--json", "--all").stdout)
    for t in compared["tests"]:
        assert t["status"] == "compared", t
        assert {m: v["method"] for m, v in t["verdicts"].items() if m in ("speedup", "output_tok_s")} == {
            "speedup": "another machine", "output_tok_s": "another machine"}, t["verdicts"]
        assert t["verdicts"]["acceptance_rate"]["method"] != "another machine"
