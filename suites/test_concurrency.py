"""How does concurrency erode the gain? Spare compute shrinks as the batch grows; the speedup falls and
crosses 1.0 somewhere (the report marks the crossover and the CUDA-graph / batched-token limits).

Concurrency levels come from the profile's matrix, up to its maximum.
"""

from __future__ import annotations

import pytest
from conftest import enough_pairs


@pytest.mark.specdec(method="eagle3", k=3, temperature=0.0)
def test_concurrency(specdec):
    enough_pairs(specdec)
