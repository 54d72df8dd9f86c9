"""Which workloads favour which method?

Per category, one test each: vLLM's spec-decode counters are global, so a category's acceptance can only
be read from runs that send that category alone.  Code editing repeats most of its prompt in the answer,
the workload where n-gram (prompt lookup) should do best.
"""

from __future__ import annotations

import pytest
from conftest import CATEGORIES, enough_pairs


@pytest.mark.specdec(method="ngram", k=3, temperature=0.0, concurrency=1, num_prompts=4,
                     dataset=[f"builtin#{c}" for c in CATEGORIES])
def test_category(specdec):
    enough_pairs(specdec)


# 8 of the category's 16 prompts on every profile (the GPU profiles' default of 64 per run is more than
# the category has, which is a collection error).
@pytest.mark.specdec(method=["ngram", "eagle3"], k=3, temperature=0.0, concurrency=1, num_prompts=8,
                     dataset="builtin#code_editing")
def test_prompt_overlap(specdec):
    enough_pairs(specdec)
    assert specdec.summary["draft_coverage"] is not None
