"""Shared fixtures: simulated vLLM servers for fast end-to-end tests of the plugin."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fake_server import FakeConfig, FakeServer  # noqa: E402

FAKE_PROFILE = """
name = "fake"
device = "cpu"
[target]
model = "fake-model"
[methods.ngram]
speculative_config = { method = "ngram", prompt_lookup_max = 4, prompt_lookup_min = 2 }
[methods.eagle3]
speculative_config = { method = "eagle3", model = "/nonexistent/head" }
[matrix]
k = [3]
runs = 2
# The simulated servers answer from a thread of the test's own process, so the client's event loop shares
# the GIL with them and with pytester's in-process sessions: a lag that marks a real run client-bound is
# ordinary here, and an invalid run made these tests flaky.
[validity]
max_loop_lag_mean_ms = 250
# For the same reason the client often reads two of their 1-2 ms steps at once; tests/test_coalescing.py
# checks the coalescing detector with its own profile and slower steps.
max_coalesced_share = 0.5
"""


@pytest.fixture
def fake_endpoints() -> Iterator[tuple[str, str]]:
    """(spec URL, reference URL): a fake spec server (k=3) and a fake no-spec server."""
    spec_cfg = FakeConfig(k=3, acceptance=(0.8, 0.6, 0.4), step_s=0.001, output_tokens=24)
    ref_cfg = FakeConfig(k=0, step_s=0.002, output_tokens=24)
    with FakeServer(spec_cfg) as spec_url, FakeServer(ref_cfg) as ref_url:
        yield spec_url, ref_url


@pytest.fixture
def fake_profile(pytester: pytest.Pytester) -> Path:
    path = pytester.path / "fake.toml"
    path.write_text(FAKE_PROFILE)
    return path
