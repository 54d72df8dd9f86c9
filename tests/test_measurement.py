"""Alternation of the arms: interleaved pairs, or ABBA blocks when the servers cannot co-reside."""

from __future__ import annotations

import pytest
from fake_server import FakeConfig, FakeServer

from pytest_specdec.load import Prompt, Sampling
from pytest_specdec.measurement import extend_case, measure_case, schedule
from pytest_specdec.pool import Endpoint


def test_schedule_interleaves_pairs_by_default() -> None:
    assert schedule(0, 3, None) == [(0, "reference"), (0, "spec"), (1, "reference"), (1, "spec"),
                                    (2, "reference"), (2, "spec")]


def test_schedule_blocks_are_abba_so_one_server_serves_two_blocks_in_a_row() -> None:
    assert schedule(0, 3, 2) == [(0, "reference"), (1, "reference"), (0, "spec"), (1, "spec"),
                                 (2, "spec"), (2, "reference")]
    # A later look continues the parity: block 2 starts with the reference again.
    assert schedule(3, 5, 2, block_index=2) == [(3, "reference"), (4, "reference"), (3, "spec"), (4, "spec")]
    with pytest.raises(ValueError, match="block must be >= 1"):
        schedule(0, 2, 0)


def _prompts(n: int) -> list[Prompt]:
    return [Prompt(id=f"p{i}", messages=[{"role": "user", "content": f"q{i}"}], max_tokens=8) for i in range(n)]


class _Arm:
    """An endpoint source that records when the measurement asked for it (a stand-in for the pool)."""

    def __init__(self, name: str, url: str, calls: list[str]) -> None:
        self.name, self.url, self.calls = name, url, calls

    def __call__(self) -> Endpoint:
        self.calls.append(self.name)
        return Endpoint(self.url, "fake-model", owned=True)


def test_blocks_run_each_arm_in_turn_with_a_warmup_per_block() -> None:
    spec_srv = FakeServer(FakeConfig(k=3, acceptance=(0.8, 0.6, 0.4), output_tokens=8))
    ref_srv = FakeServer(FakeConfig(output_tokens=8))
    with spec_srv as spec_url, ref_srv as ref_url:
        calls: list[str] = []
        lines: list[str] = []
        result = measure_case(_Arm("reference", ref_url, calls), _Arm("spec", spec_url, calls), _prompts(4),
                              Sampling(temperature=0.0), concurrency=2, runs=3, block=2, progress=lines.append)
        assert calls == ["reference", "reference", "spec", "spec", "spec", "reference"]
        assert result.alternation == "blocks of 2" and result.to_dict()["alternation"] == "blocks of 2"
        assert [r.index for r in result.reference_runs] == [0, 1, 2]
        assert [r.index for r in result.runs] == [0, 1, 2]
        assert len(result.speedup_per_pair) == 3 and all(s for s in result.speedup_per_pair)
        assert result.summary["acceptance_rate"] is not None
        # 3 blocks (ref 0-1, spec 0-2, ref 2): each starts with a warm-up of 2 x concurrency requests.
        sent = spec_srv.requests + ref_srv.requests
        assert sum(":warmup" in r.get("cache_salt", "") for r in sent) == 3 * 4
        assert len(sent) == 3 * 4 + 2 * 3 * 4
        assert sum(r.metrics.n_requests for r in [*result.runs, *result.reference_runs]) == 2 * 3 * 4
        # A later look adds two more pairs and continues the ABBA order from where it stopped.
        calls.clear()
        extend_case(result, _Arm("reference", ref_url, calls), _Arm("spec", spec_url, calls), _prompts(4),
                    Sampling(temperature=0.0), concurrency=2, runs=5, block=2)
        assert calls == ["reference", "reference", "spec", "spec"]
        assert len(result.runs) == len(result.reference_runs) == 5


def test_interleaved_is_recorded() -> None:
    with FakeServer(FakeConfig(k=3, acceptance=(0.5, 0.4, 0.3), output_tokens=8)) as spec_url, \
            FakeServer(FakeConfig(output_tokens=8)) as ref_url:
        calls: list[str] = []
        result = measure_case(_Arm("reference", ref_url, calls), _Arm("spec", spec_url, calls), _prompts(2),
                              Sampling(temperature=0.0), concurrency=1, runs=2)
        assert calls == ["reference", "spec", "reference", "spec"]
        assert result.alternation == "interleaved"
