"""The GPU profiles' other methods: suffix decoding, EAGLE (the first), MTP and Medusa heads. Is each faster
than the reference, and lossless?

Collected only on profiles with all four presets (suites/conftest.py: PRESETS); the cpu profile's zoo has
none of them. Each is measured at one point (k 3, greedy, one request at a time) on 16 prompts, so the
four add ~19 min to an H100 nightly's ~128 (the dry run's estimate, test_mlp_speculator.py ~4 more); the k,
temperature and concurrency sweeps stay with EAGLE-3. The MTP preset serves its own target (MiMo-7B-RL) in both arms.

`test_rate_sweep` adds EAGLE-3 under open-loop load up to the reference's saturation (docs/load.md): ~9.5 min more
for an H100 nightly (the dry run's estimate of `pytest suites/ --gpu=h100`, 148.3 min before, 157.8 after).
"""

from __future__ import annotations

import pytest
from conftest import enough_pairs


@pytest.mark.specdec(method=["suffix", "eagle", "mtp", "medusa"], k=3, temperature=0.0, concurrency=1, num_prompts=16)
def test_gpu_methods(specdec):
    enough_pairs(specdec)
    specdec.assert_lossless()


# A rate sweep (docs/load.md): EAGLE-3 at 5 open-loop rates up to the reference's saturation (its throughput at
# rate inf, 16 in flight: the L40S profile's --max-num-seqs), as vllm bench sweep finds its top; the rate where
# speculation stops paying is gated as the crossover.
@pytest.mark.specdec(method="eagle3", k=3, temperature=0.0, concurrency=16, rate_sweep=5)
def test_rate_sweep(specdec):
    enough_pairs(specdec)
