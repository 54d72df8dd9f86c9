"""The `vllm serve` stand-in (tests/fakes/serve.py) serves what its command line and environment ask for: the
other tests rely on it, through the plugin, without seeing its configuration."""

from __future__ import annotations

import json

import pytest

from fakes import FakeConfig
from fakes.serve import _configured, parse_args, server_config

NGRAM = json.dumps({"method": "ngram", "num_speculative_tokens": 3})


def _config(argv: list[str]) -> FakeConfig:
    args = parse_args(argv)
    return server_config(args, _configured(args))


def test_a_configured_server_gets_its_methods_fields_and_k_from_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_VLLM_CONFIG", json.dumps({"*": {"acceptance": [0.8, 0.6, 0.4, 0.3], "step_s": 0.001},
                                                       "none": {"step_s": 0.002}}))
    spec = _config(["serve", "m", "--port", "1", "--generation-config", "vllm", "--speculative-config", NGRAM])
    assert (spec.model, spec.k, spec.acceptance, spec.step_s) == ("m", 3, (0.8, 0.6, 0.4), 0.001)
    assert (spec.capacity, spec.temperature_decay, spec.fail_request) == (0, 0.0, 0)  # nothing simulated
    ref = _config(["serve", "m", "--served-model-name", "n", "--no-enable-prefix-caching"])
    assert (ref.model, ref.k, ref.acceptance, ref.step_s) == ("n", 0, (), 0.002)
    # The flag's fields win over the variable's.
    flagged = _config(["serve", "m", "--speculative-config", NGRAM, "--fake-config", '{"step_s": 0.5}'])
    assert flagged.step_s == 0.5 and flagged.acceptance == (0.8, 0.6, 0.4)
    # A misspelt field is an error, not a method nobody asks for.
    monkeypatch.setenv("FAKE_VLLM_CONFIG", '{"step_s": 0.1, "stepz": 1}')
    with pytest.raises(ValueError, match=r"unknown FakeConfig field\(s\) \['stepz'\]"):
        _config(["serve", "m"])
    monkeypatch.setenv("FAKE_VLLM_CONFIG", '{"stepz": 1}')
    with pytest.raises(ValueError, match="expected FakeConfig fields, or objects of them keyed by method"):
        _config(["serve", "m"])


def test_without_a_configuration_the_server_is_the_gpu_like_simulation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FAKE_VLLM_CONFIG", raising=False)
    monkeypatch.delenv("SPECDEC_FAKE_DEGRADE", raising=False)
    ngram5 = _config(["serve", "m", "--speculative-config",
                      json.dumps({"method": "ngram", "num_speculative_tokens": 5})])
    assert ngram5.k == 5 and ngram5.capacity == 16 and ngram5.temperature_decay == 0.9 and ngram5.fail_request == 30
    assert ngram5.acceptance == pytest.approx([0.75 * 0.8 ** i for i in range(5)]) and ngram5.draft_share == 0.85
    monkeypatch.setenv("SPECDEC_FAKE_DEGRADE", "ngram:5")
    degraded = _config(["serve", "m", "--speculative-config",
                        json.dumps({"method": "ngram", "num_speculative_tokens": 5})])
    assert degraded.acceptance == pytest.approx([a / 2 for a in ngram5.acceptance])
    reference = _config(["serve", "m"])
    assert (reference.k, reference.capacity, reference.fail_request) == (0, 16, 0)
    with pytest.raises(SystemExit, match="no simulated behaviour for method 'suffix'"):
        _config(["serve", "m", "--speculative-config", '{"method": "suffix"}'])


def test_failing_request_and_temperature_decay_reach_the_streams() -> None:
    """fail_request and temperature_decay, the simulation's two request-level behaviours, reach the app."""
    from fakes import FakeServer
    from pytest_specdec.measure.client import run_load_sync
    from pytest_specdec.measure.types import Prompt, Sampling

    prompts = [Prompt(id=f"p{i}", messages=[{"role": "user", "content": f"q {i}"}], max_tokens=64) for i in range(3)]
    with FakeServer(FakeConfig(k=3, acceptance=(0.9, 0.9, 0.9), output_tokens=64, fail_request=2)) as url:
        res = run_load_sync(url, "fake-model", prompts, Sampling(temperature=0.0), concurrency=1, collect_metrics=False)
    assert [s.error is not None for s in res.samples].count(True) == 1
    assert "injected error (fake vLLM: request 2)" in next(s.error for s in res.samples if s.error)

    def accepted(temperature: float) -> float:
        with FakeServer(FakeConfig(k=3, acceptance=(0.9, 0.9, 0.9), output_tokens=64, temperature_decay=2.0)) as url:
            res = run_load_sync(url, "fake-model", prompts, Sampling(temperature=temperature), concurrency=1)
        tokens = sum(s.output_tokens for s in res.samples)
        chunks = sum(len(s.chunks) for s in res.samples)
        return tokens / chunks  # tokens per streamed step: 1 + accepted drafts

    # 1 + 3 x 0.9 = 3.7 tokens per step at temperature 0; at 1, acceptance 0.9 x e^-2: 1.37.
    assert accepted(0.0) > 2.5 > 2.0 > accepted(1.0)
