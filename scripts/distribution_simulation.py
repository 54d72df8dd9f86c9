"""How often the temperature > 0 distribution check calls a sound sampler `shifted`, and how often it
finds a shifted one, on simulated per-sample log-probs (the README's figures).

    .venv/bin/python scripts/distribution_simulation.py

The data model is tests/test_distribution.py's `_arms`: prompts at -2.5 ± 0.5 nats, samples scattered
by 0.3 nats, 4 samples per prompt, the spec arm shifted by `shift`.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from test_distribution import _arms  # noqa: E402

from pytest_specdec.measure.lossless import compare  # noqa: E402

CASES = ((0.01, 8, 0.0, 2000), (0.01, 16, 0.0, 1000), (0.01, 8, 0.3, 400), (0.01, 16, 0.3, 400),
         (0.01, 8, 0.15, 400), (0.001, 8, 0.0, 4000), (0.001, 8, 0.3, 400), (0.001, 16, 0.3, 400),
         (0.001, 8, 0.5, 400))

for alpha, prompts, shift, n in CASES:
    rng = random.Random(1)
    verdicts = [compare(*_arms(rng, prompts, shift), alpha=alpha)["verdict"] for _ in range(n)]
    counts = {v: verdicts.count(v) for v in sorted(set(verdicts))}
    print(f"alpha {alpha}, {prompts} prompts x 4 samples, shift {shift} nats, {n} comparisons: {counts}")
