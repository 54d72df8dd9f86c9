"""Secrets are masked in everything the plugin writes; names stay, values go."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_specdec import redact

TOKEN = "hf_" + "a1B2c3D4e5F6g7H8i9J0kLmN"


def test_flags_env_and_token_shapes_are_masked() -> None:
    argv = ["vllm", "serve", "m", "--hf-token", "secret-one", "--api-key=secret-two", "--dtype", "float32",
            f"--note={TOKEN}"]
    assert redact.args(argv) == ["vllm", "serve", "m", "--hf-token", "<redacted>", "--api-key=<redacted>",
                                 "--dtype", "float32", "--note=<redacted>"]
    env = {"HF_TOKEN": "x1y2", "OPENAI_API_KEY": "k", "AWS_SECRET_ACCESS_KEY": "s", "DB_PASSWORD": "p",
           "CUDA_VISIBLE_DEVICES": "0,1", "NOTE": f"see {TOKEN}"}
    assert redact.env(env) == {"HF_TOKEN": "<redacted>", "OPENAI_API_KEY": "<redacted>",
                               "AWS_SECRET_ACCESS_KEY": "<redacted>", "DB_PASSWORD": "<redacted>",
                               "CUDA_VISIBLE_DEVICES": "0,1", "NOTE": "see <redacted>"}
    assert redact.secret_values(argv, env) == {"secret-one", "secret-two", "x1y2"}  # "k", "s", "p": too short
    assert redact.text("args: {'hf_token': 'secret-one'} and x1y2", {"secret-one", "x1y2"}) == (
        "args: {'hf_token': '<redacted>'} and <redacted>")


def test_underscore_flags_and_bare_key_pass_auth_names_are_secrets_but_token_counts_are_not() -> None:
    """vLLM's parser reads `--api_key` as `--api-key`, so both spellings carry the secret; `*_KEY`,
    `*_PASS` and `*_AUTH` names hold one; a count of tokens or a tokenizer setting does not."""
    argv = ["vllm", "serve", "m", "--api_key", "k3y-one", "--hf_token=k3y-two", "--max_num_seqs", "8"]
    assert redact.args(argv) == ["vllm", "serve", "m", "--api_key", "<redacted>", "--hf_token=<redacted>",
                                 "--max_num_seqs", "8"]
    assert redact.secret_values(argv, {}) == {"k3y-one", "k3y-two"}
    secret = {name: "<redacted>" for name in ("AZURE_OPENAI_KEY", "WANDB_KEY", "KEY", "DB_PASS", "PROXY_AUTH",
                                              "HUGGING_FACE_HUB_TOKEN", "GITHUB_TOKEN")}
    harmless = {"VLLM_MAX_TOKENS": "4096", "TOKENIZERS_PARALLELISM": "false", "VLLM_SSL_KEYFILE": "/k.pem",
                "KEYBOARD": "us", "PASSAGE_COUNT": "3", "AUTHOR": "me", "MONKEY": "1"}
    assert redact.env({**dict.fromkeys(secret, "v4lue"), **harmless}) == {**secret, **harmless}


def test_names_the_user_adds_are_masked_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redact, "_extra", set())
    assert redact.args(["--lora-url", "http://user:pw@host"]) == ["--lora-url", "http://user:pw@host"]
    redact.extend(["--lora-url", "MY_URL"])
    assert redact.args(["--lora-url", "http://user:pw@host"]) == ["--lora-url", "<redacted>"]
    assert redact.args(["--lora_url=http://user:pw@host"]) == ["--lora_url=<redacted>"]
    assert redact.env({"MY_URL": "http://user:pw@host"}) == {"MY_URL": "<redacted>"}


def test_the_zoo_summary_shows_no_secret(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`python -m pytest_specdec.zoo.measure` writes each server's command into its summary."""
    from pytest_specdec.zoo import measure as zoo_measure

    def measured(method: str, *_args: object, **_kw: object) -> zoo_measure.MethodResult:
        return zoo_measure.MethodResult(method=method, startup_s=1.0,
                                        command=["vllm", "serve", "m", "--hf_token", TOKEN, "--api-key=k3y-k3y"])

    monkeypatch.setattr(zoo_measure, "measure_method", measured)
    summary = zoo_measure.measure(tmp_path, methods=("ngram",), no_fix_method=None)
    assert summary["methods"]["ngram"]["command"] == ["vllm", "serve", "m", "--hf_token", "<redacted>",
                                                      "--api-key=<redacted>"]
