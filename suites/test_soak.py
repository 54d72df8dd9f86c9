"""Does the spec server drift while it serves? One test holds one server for many runs and gates its drift within
the session: acceptance and step time, early half of its runs against the late half (docs/gate.md, "Drift within a
session"). vLLM users have seen acceptance fall over hours on a long-running server, restored by a restart
(vllm#11188), and step time grow.

Opt-in, so the quickstart's `pytest suites/` stays as long as it was: collected when named
(`pytest suites/test_soak.py`) or asked for by marker (`pytest suites/ -m soak`), never by `pytest suites/` alone
(suites/conftest.py). Its run count is the session's: `--specdec-runs N --specdec-max-runs N` (docs/suites.md).
It opts out of the stored-baseline assertion (`check=False`): what it judges needs no baseline.
"""

from __future__ import annotations

import pytest
from conftest import enough_pairs

#: Fewer pairs than this give halves too small to tell a drift from noise.
MIN_PAIRS = 8

pytestmark = pytest.mark.soak


@pytest.mark.specdec(method="ngram", k=3, temperature=0.0, concurrency=1)
@pytest.mark.specdec_verdicts(check=False, gate=["acceptance_drift", "step_time_drift"])
def test_soak(specdec):
    runs = len(specdec.runs)
    assert runs >= MIN_PAIRS, (f"a soak needs at least {MIN_PAIRS} run pairs on one server, got {runs}: run it with "
                               f"--specdec-runs {MIN_PAIRS} --specdec-max-runs {MIN_PAIRS} (or more)")
    enough_pairs(specdec, MIN_PAIRS // 2)
