"""The temperature > 0 distribution check's client against the simulated server's toy model: what it sends, what
it reads back, and a biased sampler found (the statistic alone: tests/unit/test_distribution.py)."""

from __future__ import annotations

import pytest

from fakes import FakeConfig, FakeServer, toy_lm
from pytest_specdec.measure.lossless import DistributionError, Sample, _read_logprobs, collect, sample, score
from pytest_specdec.measure.types import Prompt, Sampling
from pytest_specdec.servers.pool import Endpoint

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


