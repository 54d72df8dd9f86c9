"""Does speculation still pay under the loads `vllm bench serve` shapes? Bursty arrivals, goodput under SLOs and
synthetic prompts of exact token lengths (docs/load.md).

On the cpu profile each test is one EAGLE-3 point of ~1 s runs: 8 prompts at 4 req/s (the reference serves
~10 req/s of 64 tokens at 8 in flight, so the loop stays open), capped at 8 in flight. The GPU profiles add a
rate sweep to the reference's saturation, with the rate where speculation stops paying gated as the crossover is
(test_gpu_methods.py). Its synthetic prompts are made when the test first runs.
"""

from __future__ import annotations

import pytest
from conftest import enough_pairs

RATE = 4.0  # req/s: below the cpu reference's saturation, so arrivals, not the server, pace the run


# burstiness 0.5: gamma intervals with CV 1.4 (Poisson's is 1), requests arriving in clumps
@pytest.mark.specdec(method="eagle3", k=3, temperature=0.0, concurrency=8, request_rate=RATE, burstiness=0.5)
def test_bursty_arrivals(specdec):
    enough_pairs(specdec)


# The SLOs: a TTFT and a TPOT the cpu reference meets for most requests at this load (docs/load.md), so its
# goodput is measured, not 0, and a slower spec arm shows as good requests lost.
@pytest.mark.specdec(method="eagle3", k=3, temperature=0.0, concurrency=8, request_rate=RATE,
                     goodput={"ttft": 1000, "tpot": 100})
def test_goodput(specdec):
    enough_pairs(specdec)


# vllm bench serve --dataset-name random: 256 +- 25 % prompt tokens and 64 +- 25 % output tokens (ignore_eos),
# within the cpu profile's --max-model-len 1024.
@pytest.mark.specdec(method="eagle3", k=3, temperature=0.0, concurrency=8, input_len=256, output_len=64,
                     range_ratio=0.25)
def test_synthetic_lengths(specdec):
    enough_pairs(specdec)
