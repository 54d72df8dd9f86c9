"""Which speculation method wins on this profile at low concurrency, greedy decoding, and is each still
lossless?

Each method is measured against interleaved no-spec reference runs on the same workload; the stored
baselines catch a method that got slower or accepts less after an upgrade.

Losslessness: at temperature 0 the spec server must produce the reference's output as often as two
reference runs agree with each other (batching can flip near-ties, so bitwise equality is not the bar),
judged by a one-sided Fisher test of the two match rates.  At temperature > 0 the temperature suite's
per-position and distribution checks catch a broken rejection sampler.
"""

from __future__ import annotations

import pytest
from conftest import enough_pairs


@pytest.mark.specdec(method=["ngram", "draft_model", "eagle3"], k=3, temperature=0.0, concurrency=1)
def test_methods(specdec):
    enough_pairs(specdec)
    specdec.assert_lossless()
