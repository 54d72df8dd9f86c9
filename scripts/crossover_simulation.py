"""Simulated false-regressed rate and power of the crossover verdict (pytest_specdec.gate.crossover).

    .venv/bin/python -m scripts.crossover_simulation [--trials 300] [--seed 7]

A sweep's speedup follows ``s0 / (1 + c (s0 - 1) / c*)`` (2.0 at c → 0, 1.0 at the crossover c*: a verification
cost growing with the batch, as the simulated vLLM's ``spec_cost_per_request``). Each point's pairs draw their log
speedup around it with the CPU default's per-pair sd (0.095, docs/validation.md), and each night shifts every
point of the sweep alike by a night effect (sd ``--night-sd``). The stored night has c* = 16; tonight has c* = 16
(no change: how often is it called regressed, and how often unchanged), c* = 8 (a move by 2, past the ×1.5
threshold) or c* = 4 (the move the gate must catch: power). Every decision is `crossover.compare` itself, with the
plugin's resamples and alpha.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from pytest_specdec.gate.crossover import compare

GRIDS = {"cpu-like [1..64], 4 runs": ((1, 2, 4, 8, 16, 32, 64), 4), "h100 [1, 4, 16, 64], 5 runs": ((1, 4, 16, 64), 5)}


def night(rng: np.random.Generator, grid: tuple[int, ...], runs: int, cstar: float, sd: float, night_sd: float,
          s0: float = 2.0) -> list[tuple[float, list[float]]]:
    shift = rng.normal(0.0, night_sd) if night_sd else 0.0
    return [(float(c), list(np.exp(math.log(s0 / (1 + c * (s0 - 1) / cstar)) + shift + rng.normal(0.0, sd, runs))))
            for c in grid]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--sd", type=float, default=0.095, help="per-pair sd of the log speedup")
    ap.add_argument("--night-sds", type=float, nargs="+", default=[0.0, 0.06],
                    help="night-to-night sd of the log speedup, shared by a sweep's points")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    start = time.time()
    print(f"{args.trials} trials per row, per-pair sd {args.sd}; stored night c* = 16")
    print("| grid | night sd | tonight | regressed | unchanged | inconclusive | improved |")
    print("|---|---|---|---|---|---|---|")
    for name, (grid, runs) in GRIDS.items():
        for night_sd in args.night_sds:
            for cstar in (16.0, 8.0, 4.0):
                counts: dict[str, int] = {}
                for i in range(args.trials):
                    base = night(rng, grid, runs, 16.0, args.sd, night_sd)
                    now = night(rng, grid, runs, cstar, args.sd, night_sd)
                    v = compare(base, now, seed=i).verdict
                    counts[v] = counts.get(v, 0) + 1
                share = {k: 100.0 * counts.get(k, 0) / args.trials
                         for k in ("regressed", "unchanged", "inconclusive", "improved")}
                print(f"| {name} | {night_sd:g} | c* = {cstar:g} | " + " | ".join(f"{x:.1f} %" for x in share.values())
                      + " |", flush=True)
    print(f"({time.time() - start:.0f} s)")


if __name__ == "__main__":
    main()
