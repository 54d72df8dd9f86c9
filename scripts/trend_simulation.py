"""How `pytest-specdec history` finds change points, simulated: the false-alarm rate on flat series and the
power on a step, through the same function (`pytest_specdec.gate.trend.trend`).

    .venv/bin/python -m scripts.trend_simulation [--series 200] [--seed 0] [--penalty 6] [--alpha 0.05]

Flat series: N nights of speedup levels with log-normal noise whose sd is drawn per series from 10-30 %.
Step series: 6 nights, the level moving at night 4 by a drop of D % (nights 1-3 at 1.0, 4-6 at 1 - D).
A flat series with any change point is a false alarm; a step series is found when a change point lies at
night 4 (index 3). Then whole histories as `pytest-specdec history` judges them (`trends`, Benjamini-Hochberg
over every series): 60 series (20 tests x 3 gated metrics) of 6 nights, all flat (a history with any change
point is a false alarm), or one of them with the step at night 4 of 6 or 10 nights: is the step found, and
is any flat series flagged beside it.
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from pytest_specdec.gate.trend import ALPHA, PENALTY, trend, trends


def false_alarms(nights: int, series: int, rng: np.random.Generator, penalty: float, alpha: float) -> float:
    hits = 0
    for _ in range(series):
        sd = math.log1p(rng.uniform(0.10, 0.30))
        levels = np.exp(rng.normal(0.0, sd, nights)).tolist()
        hits += bool(trend("speedup", levels, penalty=penalty, alpha=alpha).change_points)
    return hits / series


def power(drop_pct: float, noise_pct: float, series: int, rng: np.random.Generator, penalty: float, alpha: float,
          nights: int = 6, at: int = 3) -> float:
    found = 0
    sd = math.log1p(noise_pct / 100)
    for _ in range(series):
        shift = np.where(np.arange(nights) >= at, math.log1p(-drop_pct / 100), 0.0)
        levels = np.exp(shift + rng.normal(0.0, sd, nights)).tolist()
        found += any(c.index == at for c in trend("speedup", levels, penalty=penalty, alpha=alpha).change_points)
    return found / series


def histories(drop_pct: float, noise_pct: float, histories: int, rng: np.random.Generator, alpha: float,
              series: int = 60, nights: int = 6, at: int = 3) -> tuple[float, float]:
    """Over histories of ``series`` series (series 0 stepped by ``drop_pct`` at night ``at`` + 1 unless 0): the
    share where series 0 has a change point there, and the share with a change point in any other series."""
    found_step = other = 0
    for _ in range(histories):
        levels: dict[int, tuple[str, list[float]]] = {}
        for i in range(series):
            sd = math.log1p(rng.uniform(0.10, 0.30)) if i or not drop_pct else math.log1p(noise_pct / 100)
            shift = np.where(np.arange(nights) >= at, math.log1p(-drop_pct / 100), 0.0) if i == 0 else 0.0
            levels[i] = ("speedup", np.exp(shift + rng.normal(0.0, sd, nights)).tolist())
        found = {i: [c.index for c in t.change_points] for i, t in trends(levels, alpha).items() if t.change_points}
        found_step += at in found.pop(0, []) if drop_pct else 0
        other += bool(found)
    return found_step / histories, other / histories


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--series", type=int, default=200, help="simulated series per figure (default 200)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--penalty", type=float, default=PENALTY, help=f"penalty in noise variances (default {PENALTY})")
    ap.add_argument("--alpha", type=float, default=ALPHA, help=f"level of the confirming t-test (default {ALPHA})")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    print(f"penalty {args.penalty:g} x noise variance, alpha {args.alpha:g}; {args.series} series per figure, "
          f"seed {args.seed}")
    print("flat series, noise sd 10-30 % (drawn per series): share with any change point")
    for nights in (6, 8, 10, 15, 20, 30):
        print(f"  {nights:2d} nights: {100 * false_alarms(nights, args.series, rng, args.penalty, args.alpha):5.1f} %")
    print("6 nights, step at night 4: share where a change point is found at night 4")
    for noise in (5.0, 10.0):
        row = ", ".join(f"drop {d:g} %: {100 * power(d, noise, args.series, rng, args.penalty, args.alpha):5.1f} %"
                        for d in (10.0, 20.0, 30.0, 50.0))
        print(f"  noise sd {noise:g} %: {row}")
    print("histories of 60 series (BH over all), noise 10-30 %: share with a change point in any flat series")
    print(f"  all flat, 6 nights: {100 * histories(0.0, 0.0, args.series, rng, args.alpha)[1]:5.1f} %")
    print("the same with series 0 stepped at night 4 (its noise 5 %): step found / any flat series flagged")
    for n in (6, 10):
        cells = []
        for d in (20.0, 30.0, 50.0):
            hit, other = histories(d, 5.0, args.series, rng, args.alpha, nights=n)
            cells.append(f"drop {d:g} %: {100 * hit:5.1f} % / {100 * other:4.1f} %")
        print(f"  {n:2d} nights: {', '.join(cells)}")


if __name__ == "__main__":
    main()
