"""The open loop's arrivals and the synthetic prompts against vLLM's own code (`vllm bench serve`'s
``get_request`` and ``RandomDataset``), run in a child: importing vLLM takes seconds and torch."""

from __future__ import annotations

import pytest
from vllm_child import run_vllm_script

from pytest_specdec.measure.arrivals import arrival_times
from pytest_specdec.measure.datasets.synthetic import synthetic_prompts
from pytest_specdec.measure.tokens import load
from pytest_specdec.zoo import zoo_path

# As bench serve's main_async: np.random.seed(seed) first, the dataset sampled with its own generator, then
# get_request's draws; the schedule is get_request's precomputed delay_ts (read from its frame, no sleeping).
_VLLM_SCRIPT = r"""
import asyncio, json, sys
import numpy as np
from vllm.benchmarks.datasets import RandomDataset
from vllm.benchmarks.serve import get_request
from vllm.tokenizers import get_tokenizer
a = json.load(sys.stdin)
out = {"arrivals": {}, "prompts": {}}
for shape in a["shapes"]:
    np.random.seed(a["seed"])
    tok = get_tokenizer(a["target"])
    reqs = RandomDataset(random_seed=a["seed"]).sample(tok, a["n"], input_len=a["input_len"],
                                                        output_len=a["output_len"], range_ratio=a["range_ratio"])
    gen = get_request(reqs, a["rate"], float(shape))
    async def first():  # run it to its first yield (its first arrival's sleep), then read its schedule
        await gen.__anext__()
        return [float(x) for x in gen.ag_frame.f_locals["delay_ts"]]
    out["arrivals"][str(shape)] = asyncio.run(first())
    out["prompts"] = [[r.prompt, r.expected_output_len] for r in reqs]
print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow
def test_arrivals_and_prompts_equal_bench_serves_for_the_same_seed() -> None:
    target = str(zoo_path("target"))
    args = {"shapes": [0.5, 1.0, 4.0], "seed": 0, "n": 12, "rate": 50.0, "input_len": 64, "output_len": 16,
            "range_ratio": 0.5, "target": target}
    theirs = run_vllm_script(_VLLM_SCRIPT, args, "vllm's get_request / RandomDataset")
    for shape in args["shapes"]:
        assert arrival_times(12, 50.0, shape, 0) == theirs["arrivals"][str(shape)]  # exactly, not approximately
    prompts, _ = synthetic_prompts(load(target).hf, 12, 64, 16, 0.5, seed=0)
    assert [[q.prompt, q.max_tokens] for q in prompts] == theirs["prompts"]
