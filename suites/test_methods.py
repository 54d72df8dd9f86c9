"""Which speculation method wins on this profile, at low concurrency, greedy decoding?

Each method is measured against interleaved no-spec reference runs on the same workload.
"""

from __future__ import annotations

import pytest


@pytest.mark.specdec(method=["ngram", "draft_model", "eagle3"], k=3, temperature=0.0, concurrency=1,
                     num_prompts=16, max_tokens=128)
def test_methods(specdec):
    summary = specdec.summary
    # Invalid runs are shown in the results and left out of the summary; the test needs enough valid pairs.
    valid_pairs = [s for s in specdec.result.speedup_per_pair if s is not None]
    invalid = [(r.arm, r.index, r.invalid) for r in specdec.result.invalid_runs]
    assert len(valid_pairs) >= 2, f"fewer than 2 valid reference/spec pairs; invalid runs: {invalid}"
    assert summary["acceptance_rate"] is not None, "no spec-decode counters: did the server speculate?"
