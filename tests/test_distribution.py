"""The temperature > 0 distribution check: the statistic on synthetic data, the client against the fake
server's toy model, and the fixture methods end to end through pytester."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_server import FakeConfig, FakeServer, toy_lm

from pytest_specdec.measure.lossless import (
    Collected,
    DistributionError,
    Sample,
    _read_logprobs,
    collect,
    compare,
    min_prompts,
    sample,
    score,
)
from pytest_specdec.measure.types import Prompt, Sampling
from pytest_specdec.servers.pool import Endpoint


def _arms(rng: random.Random, n_prompts: int, shift: float, *, samples: int = 4,
          noise: float = 0.3) -> tuple[dict[str, list[float]], ...]:
    """Per-sample mean log-probs of three arms: prompts differ (mean -2.5 ± 0.5 nats), samples scatter by
    `noise`, and the spec arm is `shift` nats off."""
    arms: tuple[dict[str, list[float]], ...] = ({}, {}, {})
    for i in range(n_prompts):
        mu = rng.gauss(-2.5, 0.5)
        for j, arm in enumerate(arms):
            arm[f"p{i}"] = [rng.gauss(mu + (shift if j == 0 else 0.0), noise) for _ in range(samples)]
    return arms


@pytest.mark.parametrize("n_prompts", [8, 16])
def test_a_sound_sampler_is_rarely_called_shifted(n_prompts: int) -> None:
    # 200 simulated sessions with no shift at alpha 0.01: the signed-rank test over (prompt, sample) pairs
    # holds its level (measured: 2000 sessions at 8 prompts × 4 samples 1.2 % shifted, 1000 at 16 0.9 %).
    rng = random.Random(1)
    verdicts = [compare(*_arms(rng, n_prompts, 0.0))["verdict"] for _ in range(200)]
    assert verdicts.count("shifted") <= 6  # P(more than 6 of 200 | a true rate of 1 %) < 0.5 %
    assert verdicts.count("inconclusive") <= 1


def test_a_shifted_sampler_is_found() -> None:
    # A 0.3-nat shift (the fake server's sampler_bias=0.2 shifts its samples ~0.3 nats) at 16 prompts × 4
    # samples (measured: 397/400 shifted); at 8 prompts 329/400, at 8 prompts and 0.15 nats 86/400.
    rng = random.Random(1)
    found = [compare(*_arms(rng, 16, 0.3))["verdict"] for _ in range(200)]
    assert found.count("shifted") >= 180
    d = compare(*_arms(random.Random(3), 16, -0.5))
    assert d["verdict"] == "shifted" and d["diff"] < 0 and d["ci"][1] < 0 and d["p"] < 0.01
    assert d["n_prompts"] == 16 and d["n_samples"] == {"spec": 64, "reference_a": 64, "reference_b": 64}
    json.dumps(d)


def test_a_shift_within_the_tolerance_is_the_same() -> None:
    d = compare(*_arms(random.Random(3), 32, 0.03, noise=0.01))
    assert d["p"] < 0.01 and abs(d["diff"]) < 0.05 and d["verdict"] == "same"


def test_too_few_prompts_or_a_drifting_control_is_inconclusive() -> None:
    assert min_prompts(0.01) == 8 and min_prompts(0.05) == 6  # the exact test's smallest p is 2 / 2^n
    spec, ref_a, ref_b = _arms(random.Random(4), 7, 1.0, samples=1)
    d = compare(spec, ref_a, ref_b, alpha=0.01)
    assert d["verdict"] == "inconclusive" and d["p"] is None
    assert "7 (prompt, sample) pair(s)" in d["why"] and "at least 8" in d["why"]
    # A prompt without scored samples in one arm is left out of the pairing.
    spec, ref_a, ref_b = _arms(random.Random(4), 9, 1.0)
    ref_b["p0"] = []
    assert compare(spec, ref_a, ref_b)["n_prompts"] == 8
    # The reference disagrees with itself as much as with the spec arm: nothing to blame on the sampler.
    spec, ref_a, ref_b = _arms(random.Random(4), 16, 1.0)
    ref_b = {p: [x + 1.0 for x in v] for p, v in ref_b.items()}
    d = compare(spec, ref_a, ref_b)
    assert d["verdict"] == "inconclusive" and d["p"] < 0.01 and d["control_p"] < 0.01
    assert "not reproducible" in d["why"]
    # Identical arms: no evidence at all (scipy would divide by zero).
    same = {f"p{i}": [-2.0] for i in range(8)}
    assert compare(same, same, same, alpha=0.01)["p"] == 1.0


def test_empty_outputs_are_counted_not_averaged() -> None:
    def s(pid: str, out: list[int], lps: list[float]) -> Sample:
        return Sample(pid, [1, 2], out, lps)

    arms = {arm: [s(f"p{i}", [3, 4], [-1.0, -2.0]) for i in range(8)] + [s("p0", [], [])]
            for arm in ("spec", "reference_a", "reference_b")}
    d = Collected(arms, samples_per_prompt=2, prompts=8).summary(alpha=0.01)
    assert d["empty_samples"] == {"spec": 1, "reference_a": 1, "reference_b": 1}
    assert d["n_samples"]["spec"] == 8 and d["mean_logprob"]["spec"] == -1.5
    assert d["output_tokens"]["spec"] == 16


PROMPTS = [Prompt(id=f"p{i}", messages=[{"role": "user", "content": f"tell me about topic {i} and {i * 7}"}],
                  max_tokens=12) for i in range(3)]


def test_samples_carry_token_ids_and_scores_are_the_target_log_probs() -> None:
    import asyncio

    with FakeServer(FakeConfig()) as url:
        samples = asyncio.run(sample(url, "fake-model", PROMPTS, Sampling(temperature=0.8, top_p=0.9), 3))
        assert [s.prompt_id for s in samples] == ["p0"] * 3 + ["p1"] * 3 + ["p2"] * 3
        assert all(s.prompt_token_ids[0] == 1 and 0 < len(s.output_token_ids) <= 12 for s in samples)
        asyncio.run(score(url, "fake-model", samples))
    lm = toy_lm(FakeConfig())
    for s in samples:
        ids = s.prompt_token_ids + s.output_token_ids
        want = [lm.logprob(ids[i - 1], ids[i]) for i in range(len(s.prompt_token_ids), len(ids))]
        assert s.logprobs == pytest.approx(want)


def test_requests_are_the_load_generators_non_streamed_with_n_and_token_ids() -> None:
    import asyncio

    server = FakeServer(FakeConfig())
    with server as url:
        completions = [Prompt(id="c0", prompt="<s>user: hi there</s>", max_tokens=5, add_special_tokens=False)]
        samples = asyncio.run(sample(url, "fake-model", completions, Sampling(temperature=1.0), 2, api="completions"))
        asyncio.run(sample(url, "fake-model", PROMPTS[:1], Sampling(temperature=1.0), 2))
        asyncio.run(score(url, "fake-model", samples))
    comp, chat, scoring = server.requests[0], server.requests[1], server.requests[2]
    assert comp["prompt"] == "<s>user: hi there</s>" and comp["add_special_tokens"] is False
    assert comp["max_tokens"] == 5 and comp["n"] == 2 and comp["return_token_ids"] is True
    assert comp["stream"] is False and "stream_options" not in comp and "cache_salt" not in comp
    assert samples[0].prompt_token_ids[0] != 1  # no BOS added: the rendered prompt holds it
    assert chat["messages"] == PROMPTS[0].messages and chat["max_completion_tokens"] == 12
    for field in ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                  "repetition_penalty", "ignore_eos"):
        assert field in chat and field in comp
    assert scoring == {"model": "fake-model", "prompt": samples[0].prompt_token_ids + samples[0].output_token_ids,
                       "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0, "stream": False}


def test_a_server_without_token_ids_or_prompt_logprobs_is_named() -> None:
    import asyncio

    with FakeServer(FakeConfig(return_token_ids=False)) as url:
        with pytest.raises(DistributionError, match=rf"{url}/v1/chat/completions returned no prompt_token_ids and "
                                                    r"token_ids for prompt 'p0'.*supports return_token_ids"):
            asyncio.run(sample(url, "fake-model", PROMPTS, Sampling(temperature=1.0), 2))
        with pytest.raises(DistributionError, match=rf"sampling prompt 'p0': POST {url}/v1/chat/completions "
                                                    r"answered HTTP 404"):
            asyncio.run(sample(url, "other-model", PROMPTS[:1], Sampling(temperature=1.0), 2))
    s = Sample("p0", [1, 5], [7, 9])
    with pytest.raises(DistributionError, match="returned prompt_logprobs None for a prompt of 4 tokens"):
        _read_logprobs({"choices": [{"prompt_logprobs": None}]}, s, "http://x/v1/completions")
    bad = [None, {"5": {"logprob": -1.0}}, {"8": {"logprob": -2.0}}, {"9": {"logprob": -3.0}}]
    with pytest.raises(DistributionError, match=r"prompt_logprobs\[2\] has no logprob for token 7"):
        _read_logprobs({"choices": [{"prompt_logprobs": bad}]}, s, "http://x/v1/completions")
    with pytest.raises(Exception, match="temperature > 0"):
        collect(lambda: Endpoint("http://x", "m", owned=False), lambda: Endpoint("http://x", "m", owned=False),
                PROMPTS, Sampling(temperature=0.0), 2)


def test_a_biased_fake_sampler_shifts_the_spec_samples() -> None:
    cfg = FakeConfig(k=3, acceptance=(0.8, 0.6, 0.4), sampler_bias=0.5)
    prompts = [Prompt(id=f"p{i}", messages=[{"role": "user", "content": f"q {i} {i * i} {i + 3}"}], max_tokens=16)
               for i in range(10)]
    with FakeServer(cfg) as spec_url, FakeServer(FakeConfig()) as ref_url:
        lines: list[str] = []
        c = collect(lambda: Endpoint(spec_url, "fake-model", owned=False),
                    lambda: Endpoint(ref_url, "fake-model", owned=False),
                    prompts, Sampling(temperature=1.0), 4, progress=lines.append)
    d = c.summary()
    assert d["verdict"] == "shifted" and d["diff"] > 0.3, d  # argmax tokens score higher than draws
    assert d["control_p"] > 0.01
    assert [ln.split("distribution: ", 1)[1] for ln in lines] == [
        "10 prompts x 4 samples from the spec server", "10 prompts x 4 samples from the reference server (reference_a)",
        "10 prompts x 4 samples from the reference server (reference_b)", "scoring 120 samples on the reference server"]
    with pytest.raises(ValueError, match="sampler_bias breaks a spec server's sampler"):
        FakeConfig(sampler_bias=0.1)


SUITE = """
import pytest

@pytest.mark.specdec_verdicts(check=False)
@pytest.mark.specdec(method="ngram", k=3, temperature=1.0, concurrency=2, num_prompts=12, max_tokens=16)
def test_sampler(specdec):
    d = specdec.assert_same_distribution()
    assert d["verdict"] == "same"
"""


@pytest.fixture
def endpoints(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """(spec URL, reference URL) with the spec server's sampler biased by the test's parameter."""
    bias = getattr(request, "param", 0.0)
    spec = FakeConfig(k=3, acceptance=(0.8, 0.6, 0.4), output_tokens=16, sampler_bias=bias)
    with FakeServer(spec) as spec_url, FakeServer(FakeConfig(output_tokens=16)) as ref_url:
        yield spec_url, ref_url


def _args(profile: Path, endpoints: tuple[str, str], reports: Path) -> list[str]:
    spec, ref = endpoints
    return [f"--specdec-profile={profile}", f"--specdec-endpoint={spec}", f"--specdec-reference-endpoint={ref}",
            f"--specdec-reports={reports}", "-p", "no:cacheprovider"]


def test_a_sound_sampler_passes_and_the_check_is_in_the_json(
    pytester: pytest.Pytester, endpoints: tuple[str, str], fake_profile: Path
) -> None:
    pytester.makepyfile(test_suite=SUITE)
    reports = pytester.path / "reports"
    result = pytester.runpytest(*_args(fake_profile, endpoints, reports), "-v")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*distribution same: mean log-prob per token spec -* vs reference -*, p *"])
    d = json.loads((reports / "latest.json").read_text())["tests"][0]["distribution"]
    assert d["verdict"] == "same" and d["n_prompts"] == 12 and d["samples_per_prompt"] == 4
    assert d["n_samples"] == {"spec": 48, "reference_a": 48, "reference_b": 48}
    assert d["empty_samples"] == {"spec": 0, "reference_a": 0, "reference_b": 0}


@pytest.mark.parametrize("endpoints", [0.4], indirect=True)
def test_a_biased_sampler_fails_with_the_statistic(
    pytester: pytest.Pytester, endpoints: tuple[str, str], fake_profile: Path
) -> None:
    pytester.makepyfile(test_suite=SUITE)
    reports = pytester.path / "reports"
    result = pytester.runpytest(*_args(fake_profile, endpoints, reports))
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*specdec distribution check failed for *test_sampler?ngram-k3-t1.0-c2?: at temperature 1.0 the target's "
        "mean log-prob per token is -* nats for the spec server's samples and -* for the reference server's "
        "(12 prompts, 48 and 48 scored samples, all scored by the reference server): difference +0.* nats, 90% CI "
        "+0.* .. +0.*, Wilcoxon p=* < 0.001 and beyond ±0.05; two reference samples differ by * nats (p=*). The spec "
        "server does not sample from the target's distribution: the rejection sampler is likely broken*",
    ])
    test = json.loads((reports / "latest.json").read_text())["tests"][0]
    assert test["outcome"] == "failed" and test["distribution"]["verdict"] == "shifted"


def test_temperature_0_points_at_assert_lossless(
    pytester: pytest.Pytester, endpoints: tuple[str, str], fake_profile: Path
) -> None:
    pytester.makepyfile(test_suite=SUITE.replace("temperature=1.0", "temperature=0.0"))
    result = pytester.runpytest(*_args(fake_profile, endpoints, pytester.path / "reports"))
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*ConfigError: specdec.distribution_check() compares sampling distributions at "
                                 "temperature > 0, but *test_sampler?ngram-k3-t0.0-c2? runs at temperature 0, *"
                                 "use specdec.assert_lossless()*"])
