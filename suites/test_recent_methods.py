"""vLLM's newest methods on the GPU profiles: DFlash (a block-diffusion draft), PARD (a parallel draft model) and
dynamic k (EAGLE-3 with a draft length chosen from the batch size). Is each faster than the reference, and lossless?

Collected only on profiles with all three presets (suites/conftest.py: PRESETS): the GPU profiles; the cpu and
gpu-zoo profiles' zoo has none of them. Each is measured at one point (k 3, greedy, one request at a time) on 16
prompts, as the other GPU-only methods (test_gpu_methods.py). At one request at a time dynamic k drafts k = 3, as
EAGLE-3 does at k 3: this point checks that the schedule's path serves and stays lossless; its gain over a fixed k
is at higher concurrencies. The three add ~13.2 min to an H100 nightly (the dry run's estimate of
`pytest suites/ --gpu=h100`: 39 tests and ~172.8 min before, 42 tests and ~186.0 min after; this module ~13.2 min,
4 server starts).
"""

from __future__ import annotations

import pytest
from conftest import enough_pairs


@pytest.mark.specdec(method=["dflash", "pard", "eagle3_dynamic"], k=3, temperature=0.0, concurrency=1,
                     num_prompts=16)
def test_recent_methods(specdec):
    enough_pairs(specdec)
    specdec.assert_lossless()
