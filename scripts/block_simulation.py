"""Simulated A/B tests in blocks (one server at a time): false alarms and power with the pair or the block as the
unit of `gate.ab.paired`.

    .venv/bin/python -m scripts.block_simulation [--tests 2000] [--seed 20261129]

Each test: blocks of 3 pairs; each pair's log difference candidate/base is the change, plus a shift shared by the
pairs of its block (sd ``block_sd``: a machine's swing or a server start, which a block's pairs see alike), plus
noise of its own (sd ``pair_sd``). The gate's default tok/s rule (threshold -5 %, one-sided 5 %); one test, no
family. Printed: the share of tests called ``regressed``, pair by pair and block by block.
"""

from __future__ import annotations

import argparse

import numpy as np

from pytest_specdec.gate.ab import paired

#: (blocks, block_sd, pair_sd, change): A/A rows with and without a shared shift, then real drops.
ROWS = ((4, 0.0, 0.05, 0.0), (4, 0.03, 0.01, 0.0), (4, 0.10, 0.01, 0.0), (2, 0.10, 0.01, 0.0),
        (2, 0.0, 0.05, -0.10), (2, 0.0, 0.05, -0.20), (4, 0.0, 0.05, -0.10), (4, 0.03, 0.05, -0.10))


def regressed_share(rng: np.random.Generator, tests: int, blocks: int, block_sd: float, pair_sd: float,
                    change: float) -> tuple[float, float]:
    """The share of ``tests`` simulated tests called regressed with the pair, then the block, as the unit."""
    ids = [b for b in range(blocks) for _ in range(3)]
    base = [100.0] * len(ids)
    hits = [0, 0]
    for _ in range(tests):
        x = change + np.repeat(rng.normal(0.0, block_sd, blocks), 3) + rng.normal(0.0, pair_sd, len(ids))
        cand = list(100.0 * np.exp(x))
        hits[0] += paired("output_tok_s", base, cand).verdict == "regressed"
        hits[1] += paired("output_tok_s", base, cand, blocks=ids).verdict == "regressed"
    return hits[0] / tests, hits[1] / tests


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tests", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=20261129)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    print("| blocks x 3 pairs | block sd | pair sd | change | regressed, unit pair | regressed, unit block |")
    print("|---|---|---|---|---|---|")
    for blocks, block_sd, pair_sd, change in ROWS:
        pairs, per_block = regressed_share(rng, args.tests, blocks, block_sd, pair_sd, change)
        print(f"| {blocks} | {block_sd:.2f} | {pair_sd:.2f} | {change:+.0%} | {pairs:.1%} | {per_block:.1%} |")


if __name__ == "__main__":
    main()
