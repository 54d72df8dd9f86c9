"""Which k (num_speculative_tokens)? Longer drafts accept less per position; the speedup peaks and falls.

k comes from the profile's matrix (cpu: 1, 3; GPUs: 1, 3, 5). Per-position acceptance is in the results
and in the report's k charts.
"""

from __future__ import annotations

import pytest
from conftest import enough_pairs


@pytest.mark.specdec(method="eagle3", temperature=0.0, concurrency=1)
def test_k_sweep(specdec):
    enough_pairs(specdec)
    per_position = specdec.summary["per_position_acceptance"]
    assert per_position is not None and len(per_position) == specdec.params["k"]
