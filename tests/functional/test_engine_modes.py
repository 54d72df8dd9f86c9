"""Engine modes (`specdec(engine=[...])`, the profile's `[engines.NAME]`) end to end through the `vllm serve`
stand-in: each mode is a test of its own, with its servers (both arms in the mode: its args after the profile's, its
env over the profile's), its own baseline file and comparability; an A/B session (`--specdec-base-engine`) judges a
mode against the base mode on one install; a mode vLLM's own parser rejects, or a name the profile lacks, stops the
session at collection.

The stand-in reads its behaviour from FAKE_VLLM_CONFIG, so a mode's env can make its spec steps slower: the
injected "engine-mode regression" (as Model Runner V2's or async scheduling's were, vllm#40551, vllm#39940)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from session import latest, specdec_session, undocumented

from fakes import FakeVllm

PROMPTS, CONCURRENCY = 4, 2
REF_STEP_S, SPEC_STEP_S = 0.005, 0.01  # every draft accepted (k=3): 4 tokens a spec step, a 2x speedup
SERVERS: dict[str, dict[str, Any]] = {"*": {"acceptance": [1.0, 1.0, 1.0], "step_s": SPEC_STEP_S, "output_tokens": 16},
                                      "none": {"step_s": REF_STEP_S, "output_tokens": 16}}
#: The mode `slow`: a real vLLM flag (what vLLM's parser checks at collection) and spec steps 2.5x dearer.
SLOW = {**SERVERS, "*": {**SERVERS["*"], "step_s": 2.5 * SPEC_STEP_S}}
ENGINES = f"""
[engines.slow]
args = ["--max-num-batched-tokens", "512"]
env = {{ FAKE_VLLM_CONFIG = '{json.dumps(SLOW)}' }}
"""


@pytest.fixture
def project(pytester: pytest.Pytester, fake_vllm: FakeVllm, make_suite: Callable[..., str],
            make_profile: Callable[..., Path]) -> Path:
    pytester.makepyfile(test_suite=make_suite(name="test_modes", method="eagle3", num_prompts=PROMPTS,
                                              concurrency=CONCURRENCY, max_tokens=16, engine=["default", "slow"]))
    fake_vllm.configure(SERVERS)
    path = make_profile("fakeengines", methods=("eagle3",), runs=4)
    path.write_text(path.read_text() + ENGINES)
    return path


def test_each_mode_is_its_own_test_servers_and_baseline_and_an_ab_judges_one_against_the_other(
        pytester: pytest.Pytester, project: Path) -> None:
    r = specdec_session(pytester, project, None, "--specdec-settle-timeout=0", "--update-baselines").result
    r.assert_outcomes(passed=2)
    tests = {t["nodeid"].split("[")[1].rstrip("]"): t for t in latest(pytester)["tests"]}
    assert sorted(tests) == ["eagle3-k3-t0.0-c2-default", "eagle3-k3-t0.0-c2-slow"], sorted(tests)
    results = latest(pytester)
    assert undocumented(results) == []
    # Both arms of the slow test run in the mode: its flag after the profile's args; the default test's servers
    # have none of it (four servers in all: each mode's reference and spec).
    commands = {key: s["command"] for key, s in results["servers"].items()}
    assert len(commands) == 4, commands
    for name, t in tests.items():
        for arm in ("reference", "spec"):
            cmd = commands[t["servers"][arm]]
            assert ("--max-num-batched-tokens" in cmd) == (name.endswith("slow")), (name, arm, cmd)
    slow, default = tests["eagle3-k3-t0.0-c2-slow"], tests["eagle3-k3-t0.0-c2-default"]
    assert slow["params"]["engine"] == "slow" and "engine" not in default["params"]
    assert slow["params"]["engine_mode"]["args"] == ["--max-num-batched-tokens", "512"]
    # The mode's env made its spec steps slower: the speedup falls (2x -> about 0.8x).
    assert slow["summary"]["speedup"] < 0.7 * default["summary"]["speedup"], (slow["summary"], default["summary"])
    # Each mode its own baseline file; the mode (env included) in the comparability of the slow one only.
    files = sorted(p.name for p in (pytester.path / "baselines").rglob("*.json"))
    assert files == ["test_modes[eagle3-k3-t0.0-c2-default].json", "test_modes[eagle3-k3-t0.0-c2-slow].json"], files
    stored = {p.stem: json.loads(p.read_text()) for p in (pytester.path / "baselines").rglob("*.json")}
    assert "engine" not in stored["test_modes[eagle3-k3-t0.0-c2-default]"]["comparability"]
    engine = stored["test_modes[eagle3-k3-t0.0-c2-slow]"]["comparability"]["engine"]
    assert engine["name"] == "slow" and json.loads(engine["env"]["FAKE_VLLM_CONFIG"]) == SLOW, engine

    # The A/B: the slow mode against the default one, on this install, each side with its own reference.
    r = specdec_session(pytester, project, None, "--specdec-settle-timeout=0", "--specdec-base-engine=default", "-rs",
                        runs=6, max_runs=6).result
    r.assert_outcomes(failed=1, skipped=1)
    r.stdout.fnmatch_lines(["specdec A/B: *test_modes*slow*: candidate engine mode slow vs base engine mode default "
                            "(/nonexistent/head) (6 of 6 pairs, max reached)"])
    r.stdout.fnmatch_lines(["*SKIPPED*engine mode 'default', the base's (--specdec-base-engine)*"])
    (ab,) = [t["ab"] for t in latest(pytester)["tests"] if t.get("ab")]
    assert ab["engines"] == {"base": "default", "candidate": "slow"}, ab
    # Gated: the candidate's tok/s against the base's; the speedups (each side over its own reference) shown.
    assert "output_tok_s" in ab["regressed"], ab["verdicts"]
    assert ab["verdicts"]["speedup"]["verdict"] == "regressed", ab["verdicts"]["speedup"]
    assert {run["arm"] for run in ab["runs"]} == {"reference", "base_reference", "base", "candidate"}
    assert undocumented(latest(pytester)) == []


@pytest.mark.parametrize(("engines", "marker", "said"), [
    ("", "fast", "engine 'fast' is not an engine mode of the profile; allowed: default"),
    ('[engines.bad]\nargs = ["--max-num-batchd-tokens", "512"]\n', "bad",
     "engine mode 'bad' (args ['--max-num-batchd-tokens', '512']): vLLM's `serve` parser rejects *"
     "unrecognized arguments: --max-num-batchd-tokens*"),
    ('[engines.default]\nargs = ["--seed", "1"]\n', "default",
     "'default' is the profile's server as it is and cannot be redefined"),
])
def test_a_mode_the_profile_or_vllm_does_not_know_stops_the_session_at_collection(
        pytester: pytest.Pytester, fake_vllm: FakeVllm, make_suite: Callable[..., str],
        make_profile: Callable[..., Path], engines: str, marker: str, said: str) -> None:
    pytester.makepyfile(test_suite=make_suite(method="ngram", engine=marker))
    path = make_profile("fakeengines", methods=("ngram",))
    path.write_text(path.read_text() + engines)
    r = specdec_session(pytester, path, None).result
    assert r.ret != 0
    out = " ".join((r.stdout.str() + r.stderr.str()).split())
    assert all(part in out for part in said.split("*")), out[-2000:]
    assert not fake_vllm.records(), "no server starts"
