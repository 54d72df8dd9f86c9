"""A server that fails to start shows no secret: the start error, its log and the log tail (the simulated
`vllm serve` crashing; the masking itself: tests/unit/test_redact.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fakes import LAUNCHER
from pytest_specdec.errors import ServerStartError
from pytest_specdec.servers.process import VllmServer
from pytest_specdec.vllm.command import ServerSpec

TOKEN = "hf_" + "a1B2c3D4e5F6g7H8i9J0kLmN"


def test_a_failed_start_shows_no_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The start error, the log's command line and the log tail attached to the failure: all masked,
    also where vLLM itself printed the token."""
    monkeypatch.setenv("FAKE_VLLM_MODE", "crash")
    monkeypatch.setenv("FAKE_VLLM_LEGACY", "1")
    spec = ServerSpec(model="m", args=("--hf-token", TOKEN.replace("hf_", "tok-")), env=(("HF_TOKEN", "env-secret-1"),))
    server = VllmServer(spec, log_dir=tmp_path, launcher=LAUNCHER, startup_timeout_s=30)
    with pytest.raises(ServerStartError) as info:
        server.start()
    # What the server printed itself, as vLLM prints its non-default args:
    with open(server.log_path, "a") as log:
        log.write(f"non-default args: {{'hf_token': '{TOKEN.replace('hf_', 'tok-')}'}} env-secret-1\n")
    message, tail, log = str(info.value), server.log_tail(), server.log_path.read_text()
    for secret in (TOKEN.replace("hf_", "tok-"), "env-secret-1"):
        assert secret not in message and secret not in tail
    assert "--hf-token '<redacted>'" in message or "--hf-token <redacted>" in message
    assert "<redacted>" in tail and log.splitlines()[0].endswith("--hf-token '<redacted>'")
