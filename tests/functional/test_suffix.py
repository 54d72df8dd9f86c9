"""Suffix decoding learns the responses it served, so its runs must never repeat a prompt on one server.

Through pytester with servers the plugin starts itself: the stand-in for `vllm serve` (tests/fakes)
writes, when it is stopped, every prompt it was sent; the test checks that no suffix server ever saw a
prompt twice (warm-ups included), that both arms of a pair get the same prompts, and that the server is
restarted when the dataset has no unseen prompts left.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from session import read_results, specdec_session

from fakes import STAND_IN_VALIDITY, FakeVllm

# Every `vllm serve` the plugin starts: acceptance 0.5 at each of its k positions, steps of 0.5 ms, 8 tokens.
SERVERS = {"acceptance": [0.5] * 8, "step_s": 0.0005, "output_tokens": 8}

# 40 prompts; two suffix tests of 3 runs x 6 prompts plus warm-ups need more than that on one server.
DATASET = "\n".join(json.dumps({"id": f"p{i}", "prompt": f"prompt number {i}", "max_tokens": 8}) for i in range(40))

# k from the profile's matrix.
SUITE = {"name": "test_methods", "method": ["suffix", "ngram"], "k": ..., "concurrency": [1, 2], "num_prompts": 6,
         "dataset": "prompts.jsonl", "body": "assert specdec.valid"}


@pytest.fixture
def project(pytester: pytest.Pytester, fake_vllm: FakeVllm, make_suite: Callable[..., str]) -> Path:
    fake_vllm.configure(SERVERS)
    pytester.makepyfile(test_suite=make_suite(**SUITE))
    (pytester.path / "prompts.jsonl").write_text(DATASET + "\n")
    return pytester.path


def _run(pytester: pytest.Pytester, make_profile: Callable[..., Path], runs: int) -> pytest.RunResult:
    profile = make_profile("fakesuffix", methods=("suffix", "ngram"), runs=runs, validity=STAND_IN_VALIDITY)
    return specdec_session(pytester, profile, None, "--specdec-settle-timeout=0", "-v",
                           "--update-baselines=missing").result  # no baselines: a first session


def test_suffix_runs_get_prompts_their_server_never_saw(pytester: pytest.Pytester, project: Path,
                                                        fake_vllm: FakeVllm, make_profile: Callable[..., Path]) -> None:
    r = _run(pytester, make_profile, runs=3)
    r.assert_outcomes(passed=4)
    r.stdout.fnmatch_lines([
        "*fresh prompts every run (suffix decoding learns what it served)*",
        "*stopping vLLM (suffix, *): every prompt of 'prompts.jsonl' left has been sent to it*",
    ])
    servers = fake_vllm.records()
    suffix = [s for s in servers if s["method"] == "suffix"]
    # 2 tests x (3 runs x 6 + warm-up) > 40 prompts: the second test needs a fresh server.
    assert len(suffix) == 2, [len(s["sent"]) for s in suffix]
    for s in suffix:
        assert len(s["sent"]) == len(set(s["sent"])), "a suffix server was sent a prompt twice"
    # Other methods keep one server and the same prompts every run (and repeat them across tests).
    ngram = [s for s in servers if s["method"] == "ngram"]
    assert len(ngram) == 1 and len(ngram[0]["sent"]) > len(set(ngram[0]["sent"]))

    data = read_results(project / "reports")
    for test in data["tests"]:
        runs, refs = test["runs"], test["reference_runs"]
        if test["params"]["method"] == "suffix":
            # Both arms of a pair share their prompts; no two runs of a test do.
            assert [r["prompt_ids"] for r in runs] == [r["prompt_ids"] for r in refs]
            ids = [i for r in runs for i in r["prompt_ids"]]
            assert len(ids) == len(set(ids)) == 18
        else:
            assert all("prompt_ids" not in r for r in [*runs, *refs])
        assert test["sampling"]["temperature"] == 0.0 and test["sampling"]["ignore_eos"] is False
    # Server starts are printed: the suffix restart is one more than the distinct specs.
    r.stdout.fnmatch_lines(["*specdec: 4 vLLM server start(s), 3 distinct server spec(s)*"])
