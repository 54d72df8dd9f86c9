"""The model of scripts/ab_simulation.py: suites of A/B tests (a base and a candidate spec config, pairs of
adjacent runs in one session), each judged by ``gate.ab.paired``'s core and decision rule, the suite's gated
family adjusted with BH or Holm as the plugin adjusts a session's family.

Per test the gated family is the candidate's spec tok/s against the base's, the acceptance rate and the P95
E2E ratio. Each pair's difference is drawn on the comparison scale: log(candidate/base) for the two ratios,
points/100 for acceptance. Assumption: the per-pair sd of log(candidate/base) tok/s equals the measured
per-pair sd of log speedup (spec/ref, adjacent runs, docs/validation.md); the P95 E2E ratio's is larger by
the measured factor 0.129/0.095, and acceptance's is the measured 0.004 of the one sampled test. A lone
regression moves only the first test's tok/s. Runs of a batch share their draws over pair counts (the
first n pairs of the longest draw), so the figures for n and n + 1 differ by the model, not by the luck of
a fresh draw.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pytest_specdec.gate.ab import family_level, paired_core
from pytest_specdec.gate.kinds import INCONCLUSIVE, REGRESSED, UNCHANGED
from pytest_specdec.gate.registry import Kind
from pytest_specdec.gate.scale import delta_unit, to_natural, to_scale
from pytest_specdec.gate.sequential import adjusted_p, settle_possible
from pytest_specdec.gate.stats import Thresholds, alpha_for_look, decide

#: The A/B's gated family of one test, in column order (tok/s first: the lone regression moves it).
GATED: tuple[tuple[str, Kind], ...] = (
    ("output_tok_s", "rate"), ("acceptance_rate", "acceptance"), ("e2e_p95_ratio", "latency"))
TESTS = 19
SPEEDUP_SD = 0.095  # per-pair sd of log speedup on the CPU (baselines/cpu, docs/validation.md)
E2E_PER_RATE = 0.129 / SPEEDUP_SD  # the P95 E2E ratio's per-pair sd, relative to the speedup's
ACCEPTANCE_SD = 0.004  # per-pair sd of the acceptance rate (fraction) where it varies (T=1)


@dataclass(frozen=True)
class Noise:
    """One row of the simulation: the per-pair sd of log(candidate/base) tok/s, its distribution (normal, or
    Student's t with ``tails_df`` scaled to the same sd), the tok/s threshold judged against (%), and the
    lone drop (%) that must be caught with power 0.9."""

    label: str
    sd: float
    tails_df: float | None = None
    rate_threshold: float = 5.0
    target: float = -10.0

    def sds(self) -> np.ndarray:
        """Per gated column, the per-pair sd on the comparison scale."""
        return np.array([self.sd, ACCEPTANCE_SD, self.sd * E2E_PER_RATE])

    def thresholds(self) -> Thresholds:
        return Thresholds(per_metric={"output_tok_s": self.rate_threshold})


def gpu_sd(run_cv: float) -> float:
    """The per-pair sd of a log ratio of two independent runs that each vary by ``run_cv``."""
    return math.sqrt(2.0) * run_cv


@dataclass(frozen=True)
class Sums:
    """Running sums over pairs of the per-pair differences, (suites, tests, gated, pairs): what the first n
    pairs give for every n at once."""

    s1: np.ndarray
    s2: np.ndarray

    @classmethod
    def of(cls, x: np.ndarray) -> Sums:
        """From per-pair differences on the comparison scale, pairs on the last axis."""
        return cls(np.cumsum(x, -1), np.cumsum(x * x, -1))

    def moments(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Mean and sample variance of the first ``n`` pairs, (suites, tests, gated)."""
        s1, s2 = self.s1[..., n - 1], self.s2[..., n - 1]
        return s1 / n, np.maximum(s2 - s1 * s1 / n, 0.0) / (n - 1)


def draw(rng: np.random.Generator, noise: Noise, suites: int, pairs: int, tests: int = TESTS) -> Sums:
    """A/A per-pair differences of ``suites`` suites, ``pairs`` pairs per test."""
    shape = (suites, tests, len(GATED), pairs)
    if noise.tails_df is None:
        z = rng.standard_normal(shape)
    else:
        df = noise.tails_df
        z = rng.standard_t(df, shape) / math.sqrt(df / (df - 2.0))
    return Sums.of(z * noise.sds()[:, None])


def judge(sums: Sums, n: int, noise: Noise, *, shift_pct: float = 0.0, multiplicity: str = "bh", alpha: float = 0.05,
          lone_only: bool = False) -> np.ndarray:
    """Verdicts after the family's adjustment, (suites, tests, gated); the first test's tok/s moved by
    ``shift_pct`` %. ``lone_only``: decide that one cell only, (suites,) (the p-values of all still adjust)."""
    mean, var = sums.moments(n)
    if shift_pct:
        mean = mean.copy()
        mean[:, 0, 0] += math.log1p(shift_pct / 100.0)
    d, lo, hi, p = paired_core(mean, var, n, alpha_for_look(alpha, 1, 1))
    suites = p.shape[0]
    padj = adjusted_p(p.reshape(suites, -1), multiplicity).reshape(p.shape)
    thr = noise.thresholds()
    cols = []
    for j, (name, kind) in enumerate(GATED[: 1 if lone_only else None]):
        at = (slice(None), 0, j) if lone_only else (slice(None), slice(None), j)
        nat = [to_natural(kind, v[at]) for v in (d, lo, hi)]
        cols.append(decide(*nat, padj[at], thr.bad_side(name, kind), alpha, delta_unit(kind)))
    return cols[0] if lone_only else np.stack(cols, -1)


@dataclass(frozen=True)
class Figures:
    """One noise row at one pair count."""

    pairs: int
    false_regressed: float  # A/A suites with any gated verdict `regressed`
    any_call: float  # A/A suites with any gated verdict `regressed` or `improved`
    unchanged: float  # A/A tok/s verdicts `unchanged`
    power: dict[float, float]  # lone drop (%) → share of suites where that test's tok/s is `regressed`

    def meets(self, target: float, fwer: float = 0.05, power: float = 0.9) -> bool:
        return self.false_regressed <= fwer and self.power[target] >= power


def figures(sums: Sums, n: int, noise: Noise, drops: tuple[float, ...] = (-10.0, -5.0),
            multiplicity: str = "bh") -> Figures:
    """The false alarms, the A/A share unchanged and the power at each lone drop, with ``n`` pairs per test."""
    v = judge(sums, n, noise, multiplicity=multiplicity)
    power = {drop: float((judge(sums, n, noise, shift_pct=drop, multiplicity=multiplicity, lone_only=True)
                          == "regressed").mean())
             for drop in drops}
    return Figures(n, float((v == "regressed").any(axis=(1, 2)).mean()),
                   float(np.isin(v, ("regressed", "improved")).any(axis=(1, 2)).mean()),
                   float((v[..., 0] == "unchanged").mean()), power)


def smallest(sums: Sums, noise: Noise, max_pairs: int, multiplicity: str = "bh") -> Figures | None:
    """The fewest pairs per test (2..``max_pairs``) meeting the row's targets, with its figures; None: none do."""
    for n in range(2, max_pairs + 1):
        f = figures(sums, n, noise, multiplicity=multiplicity)
        if f.meets(noise.target):
            return f
    return None


#: The gated family of a simulated suite: what the plugin's stop rule pads a look to (`ab.at_family_level`).
FAMILY = TESTS * len(GATED)


@dataclass(frozen=True)
class Stops:
    """One suite batch run through a look schedule: each test's verdicts after the session's adjustment
    (suites, tests, gated) and the pairs it used (suites, tests)."""

    verdicts: np.ndarray
    pairs: np.ndarray


def sequential(sums: Sums, looks: Sequence[int], noise: Noise, *, shift_pct: float = 0.0, multiplicity: str = "bh",
               alpha: float = 0.05) -> Stops:
    """The plugin's sequential A/B on a batch: at each planned look (pairs in ``looks``) every test still going is
    judged at alpha / looks (``paired``'s core, p x looks), and stops when no gated verdict is left that is
    inconclusive at the family's level (`ab.family_level`) and could still settle (`sequential.settle_possible`),
    as `ab.until_pairs_settle` does; the figures of each test's last look are then BH/Holm-adjusted over the suite."""
    k, a = len(looks), alpha_for_look(alpha, 1, len(looks))
    thr = noise.thresholds()
    bads = [thr.bad_side(name, kind) for name, kind in GATED]
    units = [delta_unit(kind) for _, kind in GATED]
    shape = sums.s1.shape[:2]
    going = np.ones(shape, dtype=bool)
    pairs = np.full(shape, looks[-1])
    kept = [np.zeros((*shape, len(GATED))) for _ in range(4)]  # d, lo, hi, p (scale) at each test's last look
    for i, n in enumerate(looks):
        mean, var = sums.moments(n)
        if shift_pct:
            mean = mean.copy()
            mean[:, 0, 0] += math.log1p(shift_pct / 100.0)
        d, lo, hi, p = paired_core(mean, var, n, a)
        p = np.minimum(1.0, p * k)
        for dst, src in zip(kept, (d, lo, hi, p), strict=True):
            dst[going] = src[going]
        if i == k - 1:
            break
        useful = np.zeros(shape, dtype=bool)
        for j, (_, kind) in enumerate(GATED):
            nat = [to_natural(kind, v[..., j]) for v in (d, lo, hi)]
            open_ = family_level(*nat, p[..., j], bads[j], alpha, units[j], FAMILY) == INCONCLUSIVE
            useful |= open_ & settle_possible(d[..., j], to_scale(kind, bads[j]), 0.0, var[..., j], n - 1.0, n,
                                              looks[-1], a)
        stop = going & ~useful
        pairs[stop] = n
        going &= useful
    d, lo, hi, p = kept
    suites = p.shape[0]
    padj = adjusted_p(p.reshape(suites, -1), multiplicity).reshape(p.shape)
    cols = [decide(*(to_natural(kind, v[..., j]) for v in (d, lo, hi)), padj[..., j], bads[j], alpha, units[j])
            for j, (_, kind) in enumerate(GATED)]
    return Stops(np.stack(cols, -1), pairs)


@dataclass(frozen=True)
class Schedule:
    """One noise row under one look schedule: the A/A false alarms and pairs, and at each lone drop its power and
    the pairs the dropped test used (means over suites)."""

    looks: tuple[int, ...]
    false_regressed: float  # A/A suites with any gated verdict `regressed`
    unchanged: float  # A/A tok/s verdicts `unchanged`
    pairs_aa: float  # mean pairs per A/A test
    power: dict[float, float]
    pairs_drop: dict[float, float]


def schedule(sums: Sums, looks: Sequence[int], noise: Noise, drops: tuple[float, ...] = (-10.0, -5.0),
             multiplicity: str = "bh") -> Schedule:
    """:func:`sequential`'s figures for one row and schedule: A/A, then each lone drop on the first test."""
    aa = sequential(sums, looks, noise, multiplicity=multiplicity)
    moved = {drop: sequential(sums, looks, noise, shift_pct=drop, multiplicity=multiplicity) for drop in drops}
    return Schedule(tuple(looks), float((aa.verdicts == REGRESSED).any(axis=(1, 2)).mean()),
                    float((aa.verdicts[..., 0] == UNCHANGED).mean()), float(aa.pairs.mean()),
                    {drop: float((s.verdicts[:, 0, 0] == REGRESSED).mean()) for drop, s in moved.items()},
                    {drop: float(s.pairs[:, 0].mean()) for drop, s in moved.items()})
