"""How often the temperature > 0 distribution check calls a sound sampler `shifted`, and how often it
finds a shifted one, on simulated per-sample log-probs.

    .venv/bin/python -m scripts.distribution_simulation [--seed 1] [--scale 1]

The data model is tests/sims/distribution.py's `arms` (tests/unit/test_distribution.py checks the
statistic on it too): prompts at -2.5 ± 0.5 nats, samples scattered by 0.3 nats, 4 samples per prompt,
the spec arm shifted by `shift`.
Each case (alpha, prompts, shift, comparisons) starts from the same seed.
"""

from __future__ import annotations

import argparse
import random

from pytest_specdec.measure.lossless import compare

# The data model is the tests' (tests/sims/distribution.py), so the figures here are of what they check.
from tests.sims.distribution import arms

CASES = ((0.01, 8, 0.0, 2000), (0.01, 16, 0.0, 1000), (0.01, 8, 0.3, 400), (0.01, 16, 0.3, 400),
         (0.01, 8, 0.15, 400), (0.001, 8, 0.0, 4000), (0.001, 8, 0.3, 400), (0.001, 16, 0.3, 400),
         (0.001, 8, 0.5, 400))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1, help="seed of every case (default: %(default)s)")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="run this share of each case's comparisons, at least 1 (default: %(default)s)")
    args = ap.parse_args(argv)
    for alpha, prompts, shift, n in CASES:
        n = max(1, round(n * args.scale))
        rng = random.Random(args.seed)
        verdicts = []
        for _ in range(n):
            spec, ref_a, ref_b = arms(rng, prompts, shift)
            verdicts.append(compare(spec, ref_a, ref_b, alpha=alpha)["verdict"])
        counts = {v: verdicts.count(v) for v in sorted(set(verdicts))}
        print(f"alpha {alpha}, {prompts} prompts x 4 samples, shift {shift} nats, {n} comparisons: {counts}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
