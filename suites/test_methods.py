"""Which speculation method wins on this profile, at low concurrency, greedy decoding?

Each method is measured against interleaved no-spec reference runs on the same workload.
"""

from __future__ import annotations

import pytest


@pytest.mark.specdec(method=["ngram", "draft_model", "eagle3"], k=3, temperature=0.0, concurrency=1,
                     num_prompts=16, max_tokens=128)
def test_methods(specdec):
    summary = specdec.summary
    invalid = [(r.arm, r.index, r.invalid) for r in specdec.result.invalid_runs]
    assert not invalid, f"invalid runs: {invalid}"
    assert summary["acceptance_rate"] is not None, "no spec-decode counters: did the server speculate?"
    assert summary["speedup"] is not None
