"""Drift within a session: one test's early runs against its late runs on one server process.

vLLM users have seen acceptance fall over hours on a long-running server, restored by a restart (vllm#11188), and
step time grow. The nightly gate compares tonight with stored nights, so a server that degrades while it serves
is averaged into tonight's figures; this check compares a test's own runs in the order they ran, needs no
baseline and is judged within tonight only.

Two metrics, each a figure per run the plugin already defines:

* ``acceptance_drift``: the spec arm's acceptance rate (`ArmRun.acceptance_rate`), late minus early, in points.
* ``step_time_drift``: per interleaved pair, the spec step in reference steps: τ × the spec run's median TPOT ÷
  the reference run's median TPOT (`measure.explain`'s step times, one pair at a time). A slower spec step
  raises it; the machine's speed that hour, which both arms share, cancels, as it does in the speedup.

The statistic is Welch's t-test of the late half of the runs against the early half (on the log scale for the
step ratio), with its 1 − 2α interval and its p one-sided in the estimate's direction (as every verdict's), decided by
the gate's rule (`stats.decision`: significant and beyond the
threshold is regressed; the interval inside the threshold and its mirror is unchanged). Halves rather than a
Theil-Sen or Spearman slope: the reported failure is a step (a restart restores it) as often as a trend, a test
has 4 to 20 runs, and a difference of halves reads in the metric's own unit against the same kind of threshold
as every other verdict. Only runs on one server process count: a restart starts a new segment, and the longest
segment is judged (the others are left out, and said so), as are invalid runs.

A drift verdict is a member of the session's family of its kind (`check.adjusted_all`): a gated one's p is adjusted
with the other gated verdicts at the test's end and at the session's end, so a suite that gates its drift keeps the
suite's false-alarm rate; a shown one with the shown verdicts, as every shown metric is (at the raw α, 2 of the
22 step-time drifts of a quiet README session read `regressed` or `improved`). Whether it fails the test is the
one failure rule's (`check.FailRule.decide`, its ``drift``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Final

from pytest_specdec.gate.kinds import EXACT, GATED, INCONCLUSIVE, PERCENT, POINTS, SHOWN, Decision, Family, Unit
from pytest_specdec.measure.record import ArmRun

if TYPE_CHECKING:
    from pytest_specdec.gate.stats import Verdict

ACCEPTANCE_DRIFT: Final = "acceptance_drift"
STEP_TIME_DRIFT: Final = "step_time_drift"
#: The drift metrics, as `specdec_verdicts(gate=[...])` names them.
DRIFT_METRICS: Final[tuple[str, ...]] = (ACCEPTANCE_DRIFT, STEP_TIME_DRIFT)
#: Late minus early beyond which a drift is regressed: acceptance 5 points lower, a spec step 10 % longer.
THRESHOLDS: Final[Mapping[str, float]] = {ACCEPTANCE_DRIFT: -5.0, STEP_TIME_DRIFT: 10.0}
UNITS: Final[Mapping[str, Unit]] = {ACCEPTANCE_DRIFT: POINTS, STEP_TIME_DRIFT: PERCENT}
LABELS: Final[Mapping[str, str]] = {ACCEPTANCE_DRIFT: "acceptance", STEP_TIME_DRIFT: "step time"}
#: Fewer runs per half than this: no variance to test, the drift is inconclusive.
MIN_PER_HALF: Final = 2
#: Halves that each vary by no more than this (points, or the log of the step ratio): judged exactly, no t.
EXACT_TOL: Final = 1e-9


@dataclass(frozen=True)
class DriftVerdict:
    """One drift metric of one test: early and late halves of one server's runs, and what they decided."""

    metric: str
    verdict: Decision
    family: Family
    unit: Unit
    threshold: float
    early: float | None  # the early half's mean (acceptance) or geometric mean (step ratio)
    late: float | None
    delta: float | None  # late against early: points or %
    ci: tuple[float, float] | None  # the 1 − 2α interval of delta
    p: float | None
    early_runs: tuple[int, ...]  # run indices (from 0) of each half
    late_runs: tuple[int, ...]
    left_out: tuple[str, ...]  # the runs not judged, each with why
    note: str = ""

    def as_verdict(self) -> Verdict:
        """This drift as the gate's `stats.Verdict` (early as the baseline, late as now): the form in which it is a
        member of the session's gated family, adjusted and failed as every gated verdict is."""
        from pytest_specdec.gate.stats import Verdict

        lo, hi = self.ci if self.ci is not None else (None, None)
        method = "welch" if self.p is not None else EXACT if self.note.startswith(EXACT) else "none"
        return Verdict(self.metric, self.verdict, self.early, self.late, self.delta, lo, hi, self.p,
                       len(self.early_runs), len(self.late_runs), self.unit, method, self.threshold, self.note,
                       family=self.family)


@dataclass(frozen=True)
class Drift:
    """A test's drift verdicts (one per metric its runs have) as judged at the α they were judged at, and, once the
    session's gated family has adjusted them (at the test's end, then at the session's end), as they stand."""

    verdicts: tuple[DriftVerdict, ...]
    alpha: float
    #: every verdict after its family's adjustment (gated or shown); None: not adjusted yet
    adjusted: tuple[DriftVerdict, ...] | None = None

    @property
    def shown(self) -> tuple[DriftVerdict, ...]:
        """The verdicts as they stand: adjusted over the family when they have been, else as judged."""
        return self.adjusted if self.adjusted is not None else self.verdicts

    @property
    def members(self) -> tuple[Verdict, ...]:
        """The drift verdicts as judged (before any adjustment): the test's members of the session's families, each
        of its own (gated or shown), as every other verdict is."""
        return tuple(v.as_verdict() for v in self.verdicts)

    @property
    def gated(self) -> tuple[Verdict, ...]:
        """The gated drift verdicts as they stand: what the failure rule reads (`check.FailRule.decide`)."""
        return tuple(v.as_verdict() for v in self.shown if v.family == GATED)

    def with_family(self, adjusted: Sequence[Verdict]) -> Drift:
        """The drift with its members as the family's adjustment left them (their word, p and note)."""
        by = {v.metric: v for v in adjusted}
        return replace(self, adjusted=tuple(
            replace(v, verdict=a.verdict, p=a.p, note=a.note) if (a := by.get(v.metric)) is not None else v
            for v in self.verdicts))


def gated_drift(drift: Drift | None) -> tuple[Verdict, ...]:
    """A test's gated drift verdicts as they stand (`Drift.gated`), none without a drift: what every caller of the
    failure rule passes as its ``drift``."""
    return () if drift is None else drift.gated


def _segment(instances: Sequence[str | None]) -> tuple[set[int], dict[int, str]]:
    """The positions on the longest stretch of one server identity (the later one on a tie), and why each other
    was left out."""
    spans: list[tuple[int, int]] = []
    start = 0
    for i in range(1, len(instances) + 1):
        if i == len(instances) or instances[i] != instances[start]:
            spans.append((start, i))
            start = i
    if not spans:
        return set(), {}
    lo, hi = max(reversed(spans), key=lambda s: s[1] - s[0])
    kept = set(range(lo, hi))
    return kept, {i: "another server start (a restart begins a new segment)" for i in range(len(instances))
                  if i not in kept}


def _welch(early: Sequence[float], late: Sequence[float], alpha: float) -> tuple[float, float, float, float]:
    """Late minus early: the difference of means, its 1 − 2α Welch interval and the p one-sided in the estimate's
    direction (half the two-sided: the t is symmetric), as every verdict's p is, so it sits in one family with
    theirs and p < α exactly when the interval excludes 0."""
    import warnings

    from scipy import stats as sps

    with warnings.catch_warnings():  # a half of equal values up to rounding: its variance is 0, as it should be
        warnings.filterwarnings("ignore", "Precision loss occurred", RuntimeWarning)
        res = sps.ttest_ind(late, early, equal_var=False)
    ci = res.confidence_interval(1.0 - 2.0 * alpha)
    d = float(sum(late) / len(late) - sum(early) / len(early))
    return d, float(ci.low), float(ci.high), float(res.pvalue) / 2.0


def judge_drift(metric: str, indexed: Sequence[tuple[int, float | None, str, str | None]], alpha: float,
                gated: bool) -> DriftVerdict:
    """One drift metric over ``indexed`` (run index, its value or None, why it has none, its server identity), in
    the order the runs ran."""
    unit, bad = UNITS[metric], THRESHOLDS[metric]
    family: Family = GATED if gated else SHOWN
    left: dict[int, str] = {i: why for i, v, why, _ in indexed if v is None}
    usable = [(i, v, inst) for i, v, _, inst in indexed if v is not None]
    kept, other = _segment([inst for _, _, inst in usable])
    left.update({usable[pos][0]: why for pos, why in other.items()})
    values = [(i, v) for pos, (i, v, _) in enumerate(usable) if pos in kept]
    half = len(values) // 2
    early, late = values[:half], values[half:]
    left_out = tuple(f"run {i + 1}: {left[i]}" for i in sorted(left))
    runs = (tuple(i for i, _ in early), tuple(i for i, _ in late))

    def verdict(decision: Decision, e: float | None, la: float | None, delta: float | None,
                ci: tuple[float, float] | None, p: float | None, note: str = "") -> DriftVerdict:
        return DriftVerdict(metric, decision, family, unit, bad, e, la, delta, ci, p, *runs, left_out, note)

    if half < MIN_PER_HALF:
        return verdict(INCONCLUSIVE, None, None, None, None, None,
                       f"{len(values)} run(s) on one server: fewer than {2 * MIN_PER_HALF} to split in halves")
    from pytest_specdec.gate.stats import decision, exact_rule

    xs_e, xs_l = [v for _, v in early], [v for _, v in late]
    if metric == STEP_TIME_DRIFT:  # a ratio: its halves compared on the log scale, the change in %
        logs_e, logs_l = [math.log(v) for v in xs_e], [math.log(v) for v in xs_l]
        e, la = math.exp(sum(logs_e) / len(logs_e)), math.exp(sum(logs_l) / len(logs_l))
        scaled_e, scaled_l = logs_e, logs_l
    else:  # a proportion: its halves compared in points
        e, la = sum(xs_e) / len(xs_e), sum(xs_l) / len(xs_l)
        scaled_e, scaled_l = [100.0 * v for v in xs_e], [100.0 * v for v in xs_l]

    def natural(x: float) -> float:
        return 100.0 * math.expm1(x) if unit == PERCENT else x

    if max(scaled_e) - min(scaled_e) <= EXACT_TOL and max(scaled_l) - min(scaled_l) <= EXACT_TOL:  # no t (T = 0)
        d = natural(scaled_l[0] - scaled_e[0])
        word, why = exact_rule(d, bad, unit, 1e-6)
        return verdict(word, e, la, d, (d, d), None, f"exact: {why}")
    d, lo, hi, p = _welch(scaled_e, scaled_l, alpha)
    d, lo, hi = natural(d), natural(lo), natural(hi)
    return verdict(decision(d, lo, hi, p, bad, alpha, unit), e, la, d, (lo, hi), p)


def _median_tpot(run: ArmRun) -> float | None:
    return (run.latencies_ms.get("tpot_ms") or {}).get("p50")


def step_ratio(reference: ArmRun, spec: ArmRun) -> float | None:
    """One pair's spec step in reference steps: τ × the spec run's median TPOT ÷ the reference run's."""
    tau, t_spec, t_ref = spec.acceptance_length, _median_tpot(spec), _median_tpot(reference)
    if tau is None or not t_spec or not t_ref or t_spec <= 0 or t_ref <= 0:
        return None
    return tau * t_spec / t_ref


def _why_invalid(run: ArmRun, arm: str) -> str:
    return f"{arm} run invalid ({'; '.join(run.invalid_reasons)})"


def drift(reference: Sequence[ArmRun], spec: Sequence[ArmRun], reference_servers: Sequence[str | None],
          spec_servers: Sequence[str | None], *, alpha: float, gate: Iterable[str] = ()) -> Drift | None:
    """A test's drift verdicts from its runs in the order they ran, each with the server identity it ran on (a
    server's start: its pid for the pool's). None for a test without a spec arm. ``gate``: the drift metrics
    the test gates (the others are shown)."""
    if not spec:
        return None
    if len(spec_servers) != len(spec) or len(reference_servers) != len(reference):
        raise ValueError(f"drift: {len(spec)} spec runs with {len(spec_servers)} server identities, "
                         f"{len(reference)} reference runs with {len(reference_servers)}")
    gated = set(gate)
    acceptance = []
    for run, server in zip(spec, spec_servers, strict=True):
        why = (_why_invalid(run, "spec") if not run.valid
               else "no acceptance rate" if run.acceptance_rate is None else "")
        acceptance.append((run.index, None if why else run.acceptance_rate, why, server))
    refs = {r.index: (r, s) for r, s in zip(reference, reference_servers, strict=True)}
    steps = []
    for run, server in zip(spec, spec_servers, strict=True):
        ref, ref_server = refs.get(run.index, (None, None))
        why = ("no reference run" if ref is None else _why_invalid(run, "spec") if not run.valid
               else _why_invalid(ref, "reference") if not ref.valid
               else "its latencies are untrusted" if not (run.timed and ref.timed) else "")
        ratio = None if why or ref is None else step_ratio(ref, run)
        if not why and ratio is None:
            why = "no median TPOT or acceptance length"
        pair_server = None if server is None and ref_server is None else f"{ref_server}/{server}"
        steps.append((run.index, ratio, why, pair_server))
    return Drift((judge_drift(ACCEPTANCE_DRIFT, acceptance, alpha, ACCEPTANCE_DRIFT in gated),
                  judge_drift(STEP_TIME_DRIFT, steps, alpha, STEP_TIME_DRIFT in gated)), alpha)
