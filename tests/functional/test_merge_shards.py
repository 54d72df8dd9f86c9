"""`pytest-specdec merge` on the results files of real plugin sessions against simulated vLLM servers (endpoint
mode): one suite's three tests run as one session and as three shards (`-k`, each its own `--specdec-json`).

The merged night redoes the session's BH adjustment over every shard's verdicts together: the one session's file cut
into three shards merges back to that session's own verdicts and p-values, and the real shards merge to BH over the
union of their unadjusted p-values. A shard left out fails the merge with its tests `insufficient-data`; shards of
two profiles, and a test in two shards, are refused naming the field and the files; `history` reads the merged
night.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from command import specdec_cli as cli
from scipy import stats as sps
from session import SessionRun, specdec_session, undocumented

from fakes import FakeServer
from pytest_specdec.gate.drift import ACCEPTANCE_DRIFT, Drift, DriftVerdict
from pytest_specdec.output.schema import drift_entry

THRESHOLDS = ("rate=40", "latency=150", "acceptance=15")  # wide: the fake servers share 2 busy cores
CONCURRENCY = [1, 2, 3]
SHARDS = {"a": "c1", "b": "c2", "c": "c3"}  # -k: one test each



def gated_p(data: dict[str, Any], key: str = "p") -> dict[tuple[str, str], float]:
    """Each test's gated p-values (``key``: the adjusted `p`, or `unadjusted` for the one before adjustment)."""
    return {(t["nodeid"], m): (v["unadjusted"]["p"] if key == "unadjusted" else v["p"])
            for t in data["tests"] for m, v in (t.get("verdicts") or {}).items()
            if v["family"] == "gated" and v["p"] is not None}


def cut(data: dict[str, Any], tests: list[str], path: Path) -> Path:
    """The one session's file with only ``tests``: a shard that measured exactly what the session measured."""
    path.write_text(json.dumps({**data, "tests": [t for t in data["tests"] if t["nodeid"] in tests]}))
    return path


def test_merging_shards_is_judging_the_suite_as_one_session(
    pytester: pytest.Pytester, make_profile: Callable[..., Path], fake_server: Callable[..., FakeServer],
    make_suite: Callable[..., str]
) -> None:
    profile = make_profile()
    pytester.makepyfile(test_suite=make_suite(concurrency=CONCURRENCY, num_prompts=3, max_tokens=12))
    spec = fake_server(k=3, output_tokens=12, step_s=0.001, acceptance=(0.8, 0.6, 0.4))
    ref = fake_server(k=0, step_s=0.002, output_tokens=12)

    def session(*extra: str) -> SessionRun:
        run = specdec_session(pytester, profile, (spec, ref), "--specdec-settle-timeout=0", *extra, runs=2,
                              thresholds=THRESHOLDS)
        assert run.result.ret in (0, 1), run.result.stdout.str()
        return run

    session("--update-baselines")
    spec.reconfigure(step_s=0.0013)  # a slower spec path tonight: p-values of every size
    ran = session(f"--specdec-json={pytester.path / 'whole.json'}")
    whole = ran.results
    shards = {name: pytester.path / f"shard-{name}.json" for name in SHARDS}
    for name, selection in SHARDS.items():
        session("-k", selection, f"--specdec-json={shards[name]}")
    collected = pytester.runpytest("--co", "-q", f"--specdec-profile={profile}", "-p", "no:cacheprovider")
    expect = pytester.path / "collected.txt"
    expect.write_text(collected.stdout.str())
    ids = [t["nodeid"] for t in whole["tests"]]
    assert len(ids) == 3 and len(gated_p(whole)) >= 6, whole["tests"]

    # The one session's own runs cut into three shards merge back to its verdicts and adjusted p-values exactly.
    pieces = [cut(whole, [nodeid], pytester.path / f"cut-{i}.json") for i, nodeid in enumerate(ids)]
    out = pytester.path / "merged-cut.json"
    r = cli("merge", *pieces, "--expect", expect, "-o", out)
    assert r.returncode == ran.result.ret, r.stdout + r.stderr  # a failing test, or a late regression, fails both
    merged = json.loads(out.read_text())
    assert gated_p(merged) == gated_p(whole)
    for mine, theirs in zip(merged["tests"], whole["tests"], strict=True):
        assert mine["nodeid"] == theirs["nodeid"]
        assert {m: v["verdict"] for m, v in mine["verdicts"].items()} == {
            m: v["verdict"] for m, v in theirs["verdicts"].items()}, mine["nodeid"]
        assert {m: v["p"] for m, v in mine["verdicts"].items()} == {m: v["p"] for m, v in theirs["verdicts"].items()}
    # A gated drift is a member of the merged family too: a shard's test that failed on its drift alone (p 0.01,
    # regressed at its shard's level) is judged again with every shard's gated p-values, and passes once BH over
    # the union leaves it inconclusive; its merged entry keeps the p it had before any adjustment.
    drift = DriftVerdict(ACCEPTANCE_DRIFT, "regressed", "gated", "points", -5.0, 0.8, 0.6, -20.0, (-30.0, -10.0), 0.01,
                         (0, 1), (2, 3), ())
    drifted = json.loads(pieces[0].read_text())
    first_test = drifted["tests"][0]
    first_test["drift"] = drift_entry(Drift((drift,), 0.05, adjusted=(drift,)))
    first_test["outcome"] = "failed"
    pieces_drift = [pytester.path / "cut-drift.json", *pieces[1:]]
    pieces_drift[0].write_text(json.dumps(drifted))
    out = pytester.path / "merged-drift.json"
    r = cli("merge", *pieces_drift, "-o", out)
    assert r.returncode in (0, 1), r.stdout + r.stderr
    mine = json.loads(out.read_text())["tests"][0]["drift"]["verdicts"][ACCEPTANCE_DRIFT]
    union = sorted([*gated_p(whole, "unadjusted").values(), 0.01])
    bh = sps.false_discovery_control(np.array(union), method="bh")
    assert mine["p"] == pytest.approx(bh[union.index(0.01)], rel=1e-12) and mine["unadjusted"]["p"] == 0.01, mine
    assert (mine["verdict"] == "regressed") is (mine["p"] < 0.05), mine
    merged_first = json.loads(out.read_text())["tests"][0]
    fails = mine["verdict"] == "regressed" or any(v["verdict"] == "regressed" and v["family"] == "gated"
                                                  for v in merged_first["verdicts"].values())
    assert (merged_first["outcome"] == "failed") is fails, merged_first["outcome"]

    # Each shard alone adjusts over its own tests: the merged family is not the shards'.
    alone = cli("merge", pieces[0], "-o", pytester.path / "alone.json")
    assert alone.returncode in (0, 1), alone.stderr
    first = gated_p(json.loads((pytester.path / "alone.json").read_text()))
    assert any(first[k] != gated_p(whole)[k] for k in first), "the family did not change the p-values: nothing tested"

    # The real shards: the merged p-values are BH over the union of their unadjusted ones.
    out = pytester.path / "night.json"
    r = cli("merge", *shards.values(), "--expect", expect, "-o", out)
    assert r.returncode in (0, 1), r.stdout + r.stderr
    night = json.loads(out.read_text())
    raw = {}
    for path in shards.values():
        raw |= gated_p(json.loads(path.read_text()), "unadjusted")
    keys = sorted(raw)
    bh = sps.false_discovery_control(np.array([raw[k] for k in keys]), method="bh")
    assert gated_p(night) == pytest.approx(dict(zip(keys, bh, strict=True)), rel=1e-12)
    assert [s["file"] for s in night["merged_from"]] == [str(p) for p in shards.values()]
    assert not undocumented(night)
    assert {t["shard"] for t in night["tests"]} == {str(p) for p in shards.values()}
    assert r.returncode == (1 if any(t["outcome"] == "failed" for t in night["tests"]) else 0)
    assert f"over the {len(keys)} gated p-value(s) of every shard together" in r.stdout
    # the JUnit file and the report beside it
    cases = list(ET.parse(out.with_suffix(".junit.xml")).getroot().iter("testcase"))
    assert sorted(c.get("name") or "" for c in cases) == sorted(i.split("::")[1] for i in ids)
    assert all(any(p.get("name") == "specdec_verdict_speedup" for p in c.iter("property")) for c in cases)
    # the properties a session's own --junitxml gives, drift included, from the results file
    assert all(any(p.get("name") == "specdec_drift_acceptance_drift" for p in c.iter("property")) for c in cases)
    assert out.with_suffix(".html").read_text().count("test_suite.py::test_ngram[") >= 3

    # history reads the merged night beside a session's own.
    h = cli("history", out, pytester.path / "whole.json", "--json")
    assert h.returncode == 0, h.stderr
    assert [n["file"] for n in json.loads(h.stdout)["nights"]] == [str(pytester.path / "whole.json"), str(out)]
    assert set(ids) <= set(json.loads(h.stdout)["tests"])
    # ... and its shards beside it as its parts, not as nights of their own
    h = cli("history", out, *shards.values(), "--json")
    assert h.returncode == 0, h.stderr
    assert [n["file"] for n in json.loads(h.stdout)["nights"]] == [str(out)], h.stdout

    # A shard left out: its tests are insufficient-data, named, and the merge fails (unless --allow-missing).
    lost = pytester.path / "lost.json"
    r = cli("merge", shards["a"], shards["b"], "--expect", expect, "-o", lost)
    assert r.returncode == 1, r.stdout + r.stderr
    gone = [i for i in ids if i.endswith("c3]")]
    for nodeid in gone:
        assert f"specdec merge: insufficient-data: {nodeid}: expected" in r.stdout
    assert {t["nodeid"] for t in json.loads(lost.read_text())["tests"] if t["outcome"] == "insufficient-data"} == \
        set(gone)
    def junit_of_lost() -> dict[str, list[str]]:
        cases = ET.parse(lost.with_suffix(".junit.xml")).getroot().iter("testcase")
        return {c.get("name") or "": [e.tag for e in c if e.tag != "properties"] for c in cases}

    assert junit_of_lost()[gone[0].split("::")[1]] == ["failure"]
    r = cli("merge", shards["a"], shards["b"], "--expect", expect, "--allow-missing", "-o", lost)
    assert "insufficient-data" in r.stdout and "--allow-missing: not failed" in r.stdout
    assert junit_of_lost()[gone[0].split("::")[1]] == ["skipped"]

    # Shards of two profiles (or two levels) are refused, naming the field and each file's value.
    other = pytester.path / "other.json"
    data = json.loads(shards["c"].read_text())
    other.write_text(json.dumps({**data, "profile": "h100", "gate": {**data["gate"], "settings": {
        **data["gate"]["settings"], "alpha": 0.01}}}))
    r = cli("merge", shards["a"], other, "-o", pytester.path / "refused.json")
    assert r.returncode == 2 and not (pytester.path / "refused.json").exists(), r.stdout + r.stderr
    assert f"`profile` differs: {shards['a']}: 'fake'; {other}: 'h100'" in r.stderr
    assert f"`gate.settings.alpha` differs: {shards['a']}: 0.05; {other}: 0.01" in r.stderr

    # The same test in two shards is refused, naming both files.
    twice = pytester.path / "twice.json"
    twice.write_text(shards["a"].read_text())
    r = cli("merge", shards["a"], shards["b"], twice, "-o", pytester.path / "refused.json")
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"is in {shards['a']} and in {twice}" in r.stderr

    # A shard written before verdicts kept their p before adjustment: refused, naming the field.
    old = pytester.path / "old.json"
    for t in data["tests"]:
        for v in (t.get("verdicts") or {}).values():
            del v["unadjusted"]
    old.write_text(json.dumps(data))
    r = cli("merge", shards["a"], old, "-o", pytester.path / "refused.json")
    assert r.returncode == 2 and f"{old}: tests[0].verdicts." in r.stderr and "has no `unadjusted`" in r.stderr


def test_a_collection_list_is_read_from_pytest_co_or_the_dry_run() -> None:
    from pytest_specdec.app.merge import expected_ids

    co = "suites/test_a.py::test_x[ngram-k3]\nsuites/test_a.py::test_y\n\n2 tests collected in 0.01s\n"
    dry = ("specdec dry run: profile cpu\n  suites/test_a.py::test_x[ngram-k3]\n    spec [3f9c]: vllm serve m\n"
           "  suites/test_a.py::test_y\nspecdec dry run: 2 distinct server(s): ngram\n")
    assert expected_ids(co) == expected_ids(dry) == ["suites/test_a.py::test_x[ngram-k3]", "suites/test_a.py::test_y"]
