"""The data model of the temperature > 0 distribution check's simulation: per-sample log-probs of three arms.

tests/unit/test_distribution.py checks the statistic on it; scripts/distribution_simulation.py prints how often
the check calls a sound sampler `shifted`, and finds a shifted one, from it.
"""

from __future__ import annotations

import random


def arms(rng: random.Random, n_prompts: int, shift: float, *, samples: int = 4,
         noise: float = 0.3) -> tuple[dict[str, list[float]], ...]:
    """Per-sample mean log-probs of three arms (spec, reference_a, reference_b): prompts differ (mean
    -2.5 ± 0.5 nats), samples scatter by `noise`, and the spec arm is `shift` nats off."""
    out: tuple[dict[str, list[float]], ...] = ({}, {}, {})
    for i in range(n_prompts):
        mu = rng.gauss(-2.5, 0.5)
        for j, arm in enumerate(out):
            arm[f"p{i}"] = [rng.gauss(mu + (shift if j == 0 else 0.0), noise) for _ in range(samples)]
    return out
