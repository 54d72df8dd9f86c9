"""The temperature > 0 distribution check: the statistic on synthetic data (scripts/distribution_simulation.py's
model), the client against the fake server's toy model (through the plugin:
tests/functional/test_distribution_session.py)."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from types import ModuleType

import pytest
from fakes import FakeConfig, FakeServer, toy_lm

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


Arms = Callable[..., tuple[dict[str, list[float]], ...]]


@pytest.fixture(scope="module")
def arms(load_script: Callable[[str], ModuleType]) -> Arms:
    """Simulated per-sample log-probs of the three arms: scripts/distribution_simulation.py's data model."""
    return load_script("distribution_simulation").arms  # type: ignore[no-any-return]


@pytest.mark.parametrize("n_prompts", [8, 16])
def test_a_sound_sampler_is_rarely_called_shifted(n_prompts: int, arms: Arms) -> None:
    # 200 simulated sessions with no shift at alpha 0.01: the signed-rank test over (prompt, sample) pairs
    # holds its level (measured: 2000 sessions at 8 prompts × 4 samples 1.2 % shifted, 1000 at 16 0.9 %).
    rng = random.Random(1)
    verdicts = [compare(*arms(rng, n_prompts, 0.0))["verdict"] for _ in range(200)]
    assert verdicts.count("shifted") <= 6  # P(more than 6 of 200 | a true rate of 1 %) < 0.5 %
    assert verdicts.count("inconclusive") <= 1


def test_a_shifted_sampler_is_found(arms: Arms) -> None:
    # A 0.3-nat shift (the fake server's sampler_bias=0.2 shifts its samples ~0.3 nats) at 16 prompts × 4
    # samples (measured: 397/400 shifted); at 8 prompts 329/400, at 8 prompts and 0.15 nats 86/400.
    rng = random.Random(1)
    found = [compare(*arms(rng, 16, 0.3))["verdict"] for _ in range(200)]
    assert found.count("shifted") >= 180
    d = compare(*arms(random.Random(3), 16, -0.5))
    assert d["verdict"] == "shifted" and d["diff"] < 0 and d["ci"][1] < 0 and d["p"] < 0.01
    assert d["n_prompts"] == 16 and d["n_samples"] == {"spec": 64, "reference_a": 64, "reference_b": 64}
    json.dumps(d)


def test_a_shift_within_the_tolerance_is_the_same(arms: Arms) -> None:
    d = compare(*arms(random.Random(3), 32, 0.03, noise=0.01))
    assert d["p"] < 0.01 and abs(d["diff"]) < 0.05 and d["verdict"] == "same"


def test_too_few_prompts_or_a_drifting_control_is_inconclusive(arms: Arms) -> None:
    assert min_prompts(0.01) == 8 and min_prompts(0.05) == 6  # the exact test's smallest p is 2 / 2^n
    spec, ref_a, ref_b = arms(random.Random(4), 7, 1.0, samples=1)
    d = compare(spec, ref_a, ref_b, alpha=0.01)
    assert d["verdict"] == "inconclusive" and d["p"] is None
    assert "7 (prompt, sample) pair(s)" in d["why"] and "at least 8" in d["why"]
    # A prompt without scored samples in one arm is left out of the pairing.
    spec, ref_a, ref_b = arms(random.Random(4), 9, 1.0)
    ref_b["p0"] = []
    assert compare(spec, ref_a, ref_b)["n_prompts"] == 8
    # The reference disagrees with itself as much as with the spec arm: nothing to blame on the sampler.
    spec, ref_a, ref_b = arms(random.Random(4), 16, 1.0)
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


