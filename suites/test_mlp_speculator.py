"""IBM's MLP speculator: faster than the reference, and lossless?

Collected only on profiles with an mlp_speculator preset (suites/conftest.py: PRESETS): not the cpu profile,
and not the L40S, whose servers have no room for its 6.4 GB. One point (k 3: its four heads refuse k 5),
16 prompts, as the other GPU-only methods (test_gpu_methods.py).
"""

from __future__ import annotations

import pytest
from conftest import enough_pairs


@pytest.mark.specdec(method="mlp_speculator", k=3, temperature=0.0, concurrency=1, num_prompts=16)
def test_mlp_speculator(specdec):
    enough_pairs(specdec)
    specdec.assert_lossless()
