"""Load shaped as vllm bench serve shapes it, through whole sessions: gamma arrivals (burstiness) and synthetic
prompts of exact token lengths against the simulated server, and the markers' errors for the new fields."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from pathlib import Path

import pytest
from session import latest, specdec_session

from fakes import FakeConfig, FakeServer

N, RATE = 32, 64.0


def sent_cv(sent: list[float]) -> float:
    """The coefficient of variation of the gaps between the requests as sent (the first from the run's start)."""
    gaps = [b - a for a, b in itertools.pairwise([0.0, *sent])]
    mean = sum(gaps) / len(gaps)
    return math.sqrt(sum((g - mean) ** 2 for g in gaps) / (len(gaps) - 1)) / mean


def test_burstiness_shapes_the_requests_sent_and_synthetic_prompts_have_their_lengths(
        pytester: pytest.Pytester, make_profile: Callable[..., Path]) -> None:
    """burstiness=0.5 and 4 at one rate: the gaps between the requests actually sent have the gamma shape's CV
    (1/sqrt(shape)) within 3 standard errors of the sample CV (sqrt((1 + 1/k) / (2 k n)), tests/unit/
    test_arrivals.py); the synthetic prompts sent count input_len tokens each with the target's tokenizer, as
    vLLM counts a completions prompt (the simulated server counts words, so the test counts them)."""
    from tokenizers import Tokenizer  # the target's own tokenizer.json, without transformers (and torch) here

    from pytest_specdec.zoo import zoo_path

    target = str(zoo_path("target"))
    profile = make_profile("zoo-target", model=target, methods=("ngram",), k=None, runs=1, validity=None)
    pytester.makepyfile(test_shapes=f"""
        import pytest

        @pytest.mark.specdec(method="ngram", k=3, temperature=0.0, concurrency={N}, num_prompts={N},
                             request_rate={RATE}, burstiness=[0.5, 4], input_len=48, output_len=16)
        @pytest.mark.specdec_verdicts(check=False)
        def test_shapes(specdec):
            pass
    """)
    spec_srv = FakeServer(FakeConfig(k=3, acceptance=(0.8, 0.6, 0.4)))
    ref_srv = FakeServer(FakeConfig())
    with spec_srv as spec_url, ref_srv as ref_url:
        result = specdec_session(pytester, profile, (spec_url, ref_url), "-v",
                                 "--specdec-served-model=fake-model").result
        sent, last_run = spec_srv.requests + ref_srv.requests, ref_srv.requests[-N:]
    result.assert_outcomes(passed=2)
    # bench's decode-and-re-encode misses its length on a few prompts of the zoo's tiny tokenizer: said, and kept
    result.stdout.fnmatch_lines(["*dataset random: 32 synthetic prompts (input_len 48, output_len 16, range_ratio 0,"
                                 " seed 0, tokenizer zoo:target); 1 of them not of their drawn length*"])
    tok = Tokenizer.from_file(str(zoo_path("target") / "tokenizer.json"))
    counts = [len(tok.encode(r["prompt"]).ids) for r in last_run]  # the last run's prompts, each once
    assert sum(n == 48 for n in counts) == N - 1 and all(abs(n - 48) <= 4 for n in counts)
    assert {r["max_tokens"] for r in sent} == {16} and all(r["ignore_eos"] for r in sent)
    data = latest(pytester)
    for test in data["tests"]:
        shape = test["params"]["burstiness"]
        se = math.sqrt((1 + 1 / shape) / (2 * shape * N))
        for run in test["runs"] + test["reference_runs"]:
            arrivals = run["arrivals"]
            assert arrivals["scheduled_s"][-1] == pytest.approx(N / RATE)
            assert abs(sent_cv(arrivals["sent_s"]) - 1 / math.sqrt(shape)) < 3 * se, (shape, arrivals)
    described = next(d for name, d in data["datasets"].items() if name.startswith("random:"))
    assert {k: described[k] for k in ("input_len", "output_len", "range_ratio", "seed")} == {
        "input_len": 48, "output_len": 16, "range_ratio": 0.0, "seed": 0}
    assert described["tokenizer"] == "zoo:target" and described["missed_length"] == 1


def test_each_new_fields_bad_value_is_a_collection_error_naming_it(pytester: pytest.Pytester,
                                                                   fake_profile: Path) -> None:
    bad = {"burstiness": 'request_rate=2.0, burstiness=0', "closed": "burstiness=2.0", "alone": "input_len=64",
           "input_len": "input_len=0, output_len=8", "range": "input_len=64, output_len=8, range_ratio=1.5",
           "goodput": 'goodput={"ttfb": 500}'}
    pytester.makepyfile(**{f"test_bad_{name}": f"import pytest\n\n@pytest.mark.specdec(method='ngram', {fields})\n"
                                           f"def test_it(specdec):\n    pass\n" for name, fields in bad.items()})
    result = pytester.runpytest(f"--specdec-profile={fake_profile}", "--co", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines_random([
        "*burstiness must be a number > 0*got 0*",
        "*burstiness=2.0 shapes open-loop arrivals*set request_rate=*",
        "*input_len needs output_len too*",
        "*input_len must be*",
        "*range_ratio must be a number in [[]0, 1)*got 1.5*",
        "*goodput key(s) ttfb unknown*",
    ])
    assert result.ret != 0
