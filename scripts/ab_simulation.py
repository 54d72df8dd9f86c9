"""Simulated false alarms and power of an A/B in one session (base v candidate), and the pairs per test they take.

    .venv/bin/python -m scripts.ab_simulation [--suites 2000] [--seed 20261126] [--multiplicity bh]

Suites of 19 tests; each test's gated family (candidate v base spec tok/s, acceptance rate, P95 E2E ratio)
is judged pair by pair by ``gate.ab.paired``'s core and decision rule, then BH (or Holm) over the suite's
57 gated verdicts, as the plugin adjusts a session's family (model: tests/sims/ab.py). No night term: both
arms run in the same session, adjacent runs paired. Targets: <= 5 % of A/A suites with a false
``regressed``; a lone -10 % tok/s drop (one test of 19) ``regressed`` in >= 90 % of suites on the CPU
noise rows, a lone -5 % drop on the GPU-like rows. Then the sequential schedules (``--looks``): each test looks
at the planned pair counts and stops as the plugin's A/B does (`gate.ab.until_pairs_settle` on the verdicts at the
family's level, `gate.ab.at_family_level`), its last look's figures adjusted over the suite; with the mean pairs a
test used at no change and at each lone drop.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

# The model is the tests' (tests/sims/ab.py): the figures printed here are the ones they check, smaller.
from tests.sims.ab import GATED, SPEEDUP_SD, TESTS, Figures, Noise, Schedule, draw, figures, gpu_sd, schedule, smallest

#: The noise rows: the CPU's measured per-pair sd, its sensitivity, heavy tails at the same sd, and
#: GPU-like noise (a 3 % CV per run: sqrt(2) x 3 % per pair; 3 % per pair as gate_simulation.py's gpu-like).
ROWS: tuple[Noise, ...] = (
    Noise("cpu, normal, sd 0.095", SPEEDUP_SD),
    Noise("cpu, normal, sd 0.067", 0.067),
    Noise("cpu, normal, sd 0.13", 0.13),
    Noise("cpu, t (df 4), sd 0.095", SPEEDUP_SD, tails_df=4.0),
    Noise("gpu, 3 % CV a run, sd 0.042", gpu_sd(0.03), rate_threshold=5.0, target=-5.0),
    Noise("gpu, 3 % CV a run, sd 0.042", gpu_sd(0.03), rate_threshold=2.5, target=-5.0),
    Noise("gpu, sd 0.03 a pair", 0.03, rate_threshold=2.5, target=-5.0),
)
RUNS_PER_PAIR = 3  # reference, base spec, candidate spec


def _row(noise: Noise, f: Figures, suites: int, mark: str = "") -> str:
    return (f"| {noise.label} | {noise.rate_threshold:g} % | {f.pairs}{mark} | {suites} | {f.false_regressed:.3f} | "
            f"{f.any_call:.3f} | {f.unchanged:.3f} | {f.power[-10.0]:.3f} | {f.power[-5.0]:.3f} |")


def _seq_row(noise: Noise, s: Schedule, suites: int) -> str:
    looks = ", ".join(map(str, s.looks))
    return (f"| {noise.label} | {noise.rate_threshold:g} % | {looks} | {suites} | {s.false_regressed:.3f} | "
            f"{s.unchanged:.3f} | {s.pairs_aa:.1f} | {s.power[-10.0]:.3f} | {s.pairs_drop[-10.0]:.1f} | "
            f"{s.power[-5.0]:.3f} | {s.pairs_drop[-5.0]:.1f} |")


def _schedules(text: str) -> list[tuple[int, ...]]:
    """``--looks``: schedules split by ';', each the pairs at its looks, rising (``12,24;8,16``)."""
    out = []
    for part in text.split(";"):
        looks = tuple(int(x) for x in part.split(","))
        if min(looks) < 2 or list(looks) != sorted(set(looks)):
            raise ValueError(part)
        out.append(looks)
    return out


def main(argv: list[str] | None = None) -> int:
    """Print the table of every row at the shown pair counts, then each row's smallest pair count."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suites", type=int, default=2000, help="simulated suites per noise row (default 2000)")
    ap.add_argument("--seed", type=int, default=20261126)
    ap.add_argument("--multiplicity", dest="multiplicity", choices=("bh", "holm"), default="bh",
                    help="the family's adjustment: bh (false discovery rate) or holm (family-wise error rate); "
                         "default bh")
    ap.add_argument("--pairs", default="8,16,24,32", help="pair counts shown for every row (default 8,16,24,32)")
    ap.add_argument("--max-pairs", type=int, default=48, help="search limit for the smallest pair count (default 48)")
    ap.add_argument("--run-seconds", type=float, default=1.8,
                    help="one run's wall time on the CPU, for the suite time (default 1.8)")
    ap.add_argument("--looks", default="21;11,21;12,24;8;8,16",
                    help="sequential schedules, ';' between them, each the pairs at its looks (default "
                         "21;11,21;12,24;8;8,16: cpu's one look of 21, two looks to 21 and to 24, "
                         "the GPU's 8 and 8,16)")
    args = ap.parse_args(argv)
    try:
        schedules = _schedules(args.looks)
    except ValueError:
        ap.error(f"--looks: schedules like 12,24;8,16 (rising pair counts >= 2), got {args.looks!r}")
    try:
        shown = sorted({int(p) for p in args.pairs.split(",")})
    except ValueError:
        ap.error(f"--pairs: a comma-separated list of pair counts like 8,16,24, got {args.pairs!r}")
    if args.suites < 1 or min(shown) < 2 or args.max_pairs < 2:
        ap.error("--suites must be >= 1, and --pairs and --max-pairs >= 2 (a t needs 2 pairs)")
    t0 = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    print(f"{args.suites} suites of {TESTS} tests x {len(GATED)} gated metrics ({', '.join(m for m, _ in GATED)}), "
          f"seed {args.seed}; {args.multiplicity.upper() if args.multiplicity == 'bh' else 'Holm'} over the suite's "
          f"{TESTS * len(GATED)} verdicts at alpha 0.05; acceptance threshold 2 pt, P95 E2E 10 %")
    print()
    print("| noise (per-pair sd of log candidate/base tok/s) | tok/s threshold | pairs per test | suites | "
          "any false `regressed` (A/A) | any false call (A/A) | tok/s `unchanged` (A/A) | lone -10 % `regressed` "
          "| lone -5 % `regressed` |")
    print("|---|---|---|---|---|---|---|---|---|")
    best: list[tuple[Noise, Figures | None]] = []
    for noise in ROWS:
        sums = draw(rng, noise, args.suites, max(args.max_pairs, *shown))
        least = smallest(sums, noise, args.max_pairs, args.multiplicity)
        best.append((noise, least))
        rows = {n: figures(sums, n, noise, multiplicity=args.multiplicity) for n in shown}
        if least is not None:
            rows[least.pairs] = least
        for n in sorted(rows):
            print(_row(noise, rows[n], args.suites, " (smallest)" if least is not None and n == least.pairs else ""))
    print()
    print(f"Smallest pairs per test with <= 5 % false `regressed` and the lone drop `regressed` in >= 90 % "
          f"(searched 2..{args.max_pairs}); a pair is {RUNS_PER_PAIR} runs; CPU suite time at "
          f"{args.run_seconds:g} s a run:")
    print()
    print("| noise | tok/s threshold | lone drop to catch | smallest pairs per test | runs per suite "
          "| CPU suite time |")
    print("|---|---|---|---|---|---|")
    for noise, least in best:
        if least is None:
            print(f"| {noise.label} | {noise.rate_threshold:g} % | {noise.target:g} % | none up to {args.max_pairs} "
                  "| | |")
            continue
        runs = TESTS * least.pairs * RUNS_PER_PAIR
        when = f"{runs * args.run_seconds / 60:.0f} min" if noise.label.startswith("cpu") else ""
        print(f"| {noise.label} | {noise.rate_threshold:g} % | {noise.target:g} % | {least.pairs} | {runs} "
              f"| {when} |")
    print()
    print("Sequential looks: each test stops once no gated verdict is left open at the family's level that more pairs "
          "could settle; Bonferroni over its looks, BH/Holm over the suite at the end:")
    print()
    print("| noise | tok/s threshold | looks (pairs) | suites | any false `regressed` (A/A) | tok/s `unchanged` (A/A) "
          "| mean pairs (A/A) | lone -10 % `regressed` | its pairs | lone -5 % `regressed` | its pairs |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for noise in ROWS:
        sums = draw(rng, noise, args.suites, max(looks[-1] for looks in schedules))
        for looks in schedules:
            print(_seq_row(noise, schedule(sums, looks, noise, multiplicity=args.multiplicity), args.suites))
    print(f"\n({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
