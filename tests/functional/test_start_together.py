"""Servers that co-reside start together on a GPU profile (profiles/starts.py plans it, servers/together.py does
it), through pytester with the `vllm serve` stand-in on a fake GPU: the starts overlap in time, one that fails
names its own cause and log without stopping the others, and where the servers do not fit beside each other, or
would share a GPU, they start one after another. The plan itself: tests/unit/test_start_plan.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from session import specdec_session

from fakes import FakeVllm

SUITE = {"concurrency": 1, "num_prompts": 4, "max_tokens": 16, "body": "assert specdec.valid",
         "verdicts": "check=False"}


@pytest.mark.parametrize("fraction", ["0.3", "0.6"])
def test_servers_start_at_once_on_gpus_of_their_own_and_one_after_another_on_a_shared_gpu(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, fake_vllm: FakeVllm, make_profile: Callable[..., Path],
    make_suite: Callable[..., str], fraction: str,
) -> None:
    """0.6 of the GPU each: no two fit on one GPU, and the leases give the first test's reference and ngram servers
    and the next test's suffix server each its own of GPUs 0-2, so the three start at once (room is where the
    leases find it, not the fractions' sum). 0.3 each: the three fit on GPU 0, but there they start one after
    another: vLLM sizes its KV cache from the memory free while it profiles, and two servers starting at once on
    one H200 left the second none. The stand-in has no suffix decoding, so that server fails at its start in
    both: its own test fails with its own cause and log, and the others measure."""
    monkeypatch.setenv("FAKE_VLLM_MODE", "slow")  # each start takes a second or more: starts at once overlap
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    profile = make_profile("fakegpu", device="cuda", tensor_parallel_size=1, methods=("ngram", "suffix"),
                           validity=None)
    profile.write_text(profile.read_text() + f'[server]\nargs = ["--gpu-memory-utilization", "{fraction}"]\n')
    pytester.makepyfile(test_suite=make_suite(name="test_ngram", **SUITE)
                        + make_suite(name="test_suffix", method="suffix", **SUITE))
    gpus = "0" if fraction == "0.3" else "0,1,2"
    r = specdec_session(pytester, profile, None, f"--specdec-gpus={gpus}", "--specdec-max-servers=3").result
    r.assert_outcomes(passed=1, errors=1)
    r.stdout.fnmatch_lines(["*test_suffix*", "*vLLM server (suffix) exited with code 1 while starting*",
                            "*log: *vllm-suffix-*.log*"])
    assert "not starting it again" not in r.stdout.str()  # its own error, not the pool's memory of it

    starts = {s["method"]: s for s in fake_vllm.records()}
    assert sorted(starts) == ["ngram", "none"]  # the suffix server never served
    a, b = starts["none"], starts["ngram"]
    if fraction == "0.6":  # each on a GPU of its own
        assert a["start"] < b["ready"] and b["start"] < a["ready"], (a, b)  # both were starting at once
        r.stdout.fnmatch_lines(["*specdec: 3 vLLM servers started together in * s*",
                                "*none * ready in * s  GPU 0  together [[]main#1]*",
                                "*ngram * ready in * s  GPU 1  together [[]main#1]*",
                                "*2 start(s) in 1 group(s) started together: * s of wall time for * s of start-ups*"])
    else:  # one GPU: one after another
        assert a["ready"] <= b["start"] or b["ready"] <= a["start"], (a, b)
        assert "together" not in r.stdout.str()
        r.stdout.fnmatch_lines(["*none * ready in * s  GPU 0", "*ngram * ready in * s  GPU 0"])
