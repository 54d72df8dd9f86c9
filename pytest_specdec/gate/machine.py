"""The machine factor: how fast this machine ran tonight against the stored nights, from the reference arms.

Each stored night gets its own factor (its reference speed against its file's mean night, averaged over the
files holding it), tonight one per compared test, and the session the mean of those. It divides out of the
absolute figures (tok/s, latencies); the gated within-session ratios never use it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeGuard

from pytest_specdec.gate.kinds import GATED
from pytest_specdec.gate.registry import ABSOLUTE, GOODPUT, TAIL_RATIOS

if TYPE_CHECKING:
    from pytest_specdec.gate.nights import Night
    from pytest_specdec.gate.stats import Thresholds, Verdict


def absolute_scale(name: str, log_factor: float) -> float:
    """Multiply an absolute figure by this to remove a machine factor exp(log_factor): a machine that runs
    slower (factor < 1) gives lower tok/s and longer latencies."""
    from pytest_specdec.gate.scale import kind_of

    return math.exp(-log_factor) if kind_of(name) == "rate" else math.exp(log_factor)


def ref_log(night: Night) -> float | None:
    """Mean log reference tok/s of one night (valid runs), the machine's speed that night."""
    from pytest_specdec.measure.figures import mean_log

    vals = [r.output_tok_s for r in night.reference if r.valid and r.output_tok_s]
    return mean_log(vals) if vals else None


def night_factors(files: Iterable[dict[str, Any]]) -> dict[str, float]:
    """Each stored night's machine factor (log, by its session's ``started``): the mean over every file
    holding that night of its reference speed's deviation from the file's mean night. Pure storage in,
    so it is fixed before any test runs."""
    from pytest_specdec.gate.baselines import night_of

    devs: dict[str, list[float]] = {}
    for data in files:
        read = [(e.get("started", ""), ref_log(night_of(e))) for e in data["sessions"]]
        logs = [(k, x) for k, x in read if x is not None]
        if len(logs) < 2:
            continue
        mean = sum(x for _, x in logs) / len(logs)
        for k, x in logs:
            devs.setdefault(k, []).append(x - mean)
    return {k: sum(v) / len(v) for k, v in devs.items()}


def tonight_deviation(baseline: dict[str, Any], now: Night, factors: Mapping[str, float]) -> float | None:
    """log(tonight's reference speed ÷ the baseline's machine-neutral level) for one test: one term of the
    session's machine factor."""
    from pytest_specdec.gate.baselines import night_of

    now_log = ref_log(now)
    logs = [(x - factors.get(e.get("started", ""), 0.0)) for e in baseline["sessions"]
            if (x := ref_log(night_of(e))) is not None]
    if now_log is None or not logs:
        return None
    return now_log - sum(logs) / len(logs)


@dataclass(frozen=True)
class MachineFactor:
    """How fast this machine ran tonight against the baseline nights, from every reference arm of the
    session (mean of the tests' log deviations). It divides out of absolute figures; it never moves the
    gated, within-session ratios."""

    log: float
    ci_low: float
    ci_high: float
    n_tests: int
    threshold: float  # % either way before it warns
    level: float

    @property
    def factor(self) -> float:
        return math.exp(self.log)

    @property
    def beyond(self) -> bool:
        return abs(self.factor - 1.0) * 100.0 > self.threshold

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MachineFactor:
        """A results file's ``machine_factor`` (`output.results.machine_factor_entry`: the CI bounds are stored as
        factors, kept as logs here)."""
        lo, hi = d["ci"]
        return cls(float(d["log"]), math.log(lo), math.log(hi), int(d["n_tests"]), float(d["threshold"]),
                   float(d["ci_level"]))


def warn_threshold(thresholds: Thresholds) -> float:
    """How far (%, either way) the machine factor may be from 1 before it warns: the reference's threshold."""
    return abs(thresholds.bad_side("reference_tok_s", "rate"))


def machine_factor(deviations: Iterable[float], threshold: float, alpha: float) -> MachineFactor | None:
    """The session's machine factor from the tests' log deviations (t interval over tests)."""
    from scipy import stats as sps

    d = [float(x) for x in deviations]
    if not d:
        return None
    mean = sum(d) / len(d)
    if len(d) > 1:
        sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1))
        q = float(sps.t.ppf(1 - alpha, len(d) - 1)) * sd / math.sqrt(len(d))
    else:
        q = 0.0
    return MachineFactor(mean, mean - q, mean + q, len(d), threshold, 100 * (1 - 2 * alpha))


# ---- the machine's state: what the ratio metrics are conditioned on ----------------------------------------

#: The metrics whose verdict holds only between nights of a comparable machine state: the within-session ratios,
#: which the machine factor cannot divide a state's shift out of (a fixed per-step draft cost does not scale with
#: the machine's speed), and the absolute figures, which it divides by the reference's speed (so a spec tok/s so
#: divided is the speedup again). Acceptance (and τ, the accepted tokens a step) at T = 0 does not move with the
#: machine: judged on every night.
STATE_BOUND: tuple[str, ...] = ("speedup", *(m.name for m in TAIL_RATIOS), GOODPUT, *ABSOLUTE)
#: How the reason names the condition, and the `Verdict.method` of a metric no stored night of tonight's state
#: could judge.
MACHINE_STATE = "machine state"


def _positive_number(x: object) -> TypeGuard[float]:
    """A number > 0 read from a file (a bool is not one)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0


@dataclass(frozen=True)
class StateTolerance:
    """±% within which a stored night's machine state counts as tonight's, per kind of state-bound metric.

    Ratios of the two arms of a pair (speedup, E2E ratio, goodput) and absolute figures (tok/s, latencies, the
    machine factor divided out) follow the machine's state differently; a calibration that saw the state move
    measures how steeply each does (`calibration.state_tolerance_of`). Without one, both take the profile's
    ``[verdicts] machine_state_tolerance``. ``source`` says which."""

    ratio: float
    absolute: float
    source: str

    @classmethod
    def of_profile(cls, profile: str, pct: float) -> StateTolerance:
        """A profile's ``[verdicts] machine_state_tolerance``, one for every kind."""
        return cls(pct, pct, f"profile {profile}'s machine_state_tolerance")

    @property
    def profiles(self) -> bool:
        """A profile's (`of_profile`, or a number in a results file before tolerances per kind), not measured."""
        return not self.source or self.source.startswith("profile ")

    def of(self, name: str) -> float:
        """The tolerance of one state-bound metric."""
        return self.absolute if name.split("[", 1)[0] in ABSOLUTE else self.ratio

    @property
    def uniform(self) -> bool:
        return self.ratio == self.absolute

    def phrase(self) -> str:
        """``±15 %`` or ``±40 % for ratios, ±8 % for absolute figures``."""
        if self.uniform:
            return f"±{self.ratio:g} %"
        return f"±{self.ratio:.3g} % for ratios, ±{self.absolute:.3g} % for absolute figures"

    @classmethod
    def from_setting(cls, value: Any, where: str) -> StateTolerance:
        """A results file's ``machine_state_tolerance``: a number (one for both kinds, as before calibrations
        measured them) or the mapping `output.schema.state_tolerance_entry` writes; anything else is an error naming
        ``where``."""
        from pytest_specdec.errors import ConfigError

        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return cls(float(value), float(value), "")
        if isinstance(value, Mapping):
            r, a = value.get("ratio"), value.get("absolute")
            if _positive_number(r) and _positive_number(a):
                return cls(float(r), float(a), str(value.get("source", "")))
        raise ConfigError(f"{where}: machine_state_tolerance is {value!r}, not a number of % > 0 nor "
                         "{ratio, absolute, source}")


def state_distance(a: Mapping[str, float], b: Mapping[str, float]) -> float:
    """How far apart two probe readings are: the largest |log ratio| over their figures (0 when equal)."""
    return max(abs(math.log(a[k] / b[k])) for k in a if k in b)


def state_comparable(tonight: Mapping[str, float] | None, stored: Mapping[str, float] | None,
                     tolerance_pct: float) -> bool:
    """Whether a stored night's state is tonight's within the tolerance: both probed and every figure within
    ±``tolerance_pct`` %, or neither probed (endpoint mode on both nights, where the servers' machine is
    not this one). A night probed on one side only is of an unknown state to the other."""
    if tonight is None or stored is None:
        return tonight is None and stored is None
    return state_distance(tonight, stored) <= math.log1p(tolerance_pct / 100.0)


def describe_state(state: Mapping[str, float] | None) -> str:
    """A state as the words give it (``cores 1.95, hash 2.02 GB/CPU-s``)."""
    from pytest_specdec.measure.probe import COMPONENTS

    if state is None:
        return "not probed"
    return ", ".join(f"{k} {state[k]:.3g}" + ("" if unit == k else f" {unit}")
                     for k, unit in COMPONENTS.items() if k in state)


def describe_range(states: Iterable[Mapping[str, float] | None]) -> str:
    """The stored nights' states as a range per figure (``cores 1.94–1.99, hash 2.00–2.04 GB/CPU-s``)."""
    from pytest_specdec.measure.probe import COMPONENTS

    states = list(states)
    probed = [s for s in states if s is not None]
    unprobed = len(states) - len(probed)
    if not probed:
        return "not probed"
    parts = []
    for k, unit in COMPONENTS.items():
        vals = [s[k] for s in probed if k in s]
        if vals:
            lo, hi = min(vals), max(vals)
            span = f"{lo:.3g}" if f"{lo:.3g}" == f"{hi:.3g}" else f"{lo:.3g}–{hi:.3g}"
            parts.append(f"{k} {span}" + ("" if unit == k else f" {unit}"))
    return ", ".join(parts) + (f" ({unprobed} not probed)" if unprobed else "")


@dataclass(frozen=True)
class StateCondition:
    """Which of a baseline's nights the ratio metrics may be judged against tonight (their indexes in
    ``sessions``), and tonight's and the stored nights' states for the words when none may."""

    kept: tuple[int, ...]
    tonight: Mapping[str, float] | None
    stored: tuple[Mapping[str, float] | None, ...]
    tolerance_pct: float

    @property
    def reason(self) -> str:
        """Why no night could judge a ratio metric ("" when some can)."""
        if self.kept:
            return ""
        stored = describe_range(self.stored)
        return (f"{MACHINE_STATE}: tonight {describe_state(self.tonight)}; the stored nights {stored}; "
                f"tolerance ±{self.tolerance_pct:g} %")


def state_condition(sessions: Sequence[Mapping[str, Any]], tonight: Mapping[str, float] | None,
                    tolerance_pct: float) -> StateCondition:
    """The stored nights (a baseline's ``sessions`` entries) whose machine state is comparable with tonight's."""
    stored = tuple(e.get("machine_state") for e in sessions)
    kept = tuple(i for i, s in enumerate(stored) if state_comparable(tonight, s, tolerance_pct))
    return StateCondition(kept, tonight, stored, tolerance_pct)


@dataclass(frozen=True)
class StateSummary:
    """The session's machine state against its stored nights, said once (terminal, report, JSON): tonight's state
    (the geometric mean of every test's), the stored nights' states, the tolerance, and the tests whose ratio
    metrics no stored night of a comparable state could judge, with those metrics."""

    tonight: Mapping[str, float] | None
    stored: tuple[Mapping[str, float] | None, ...]
    tolerance: StateTolerance
    not_comparable: tuple[tuple[str, tuple[str, ...]], ...]
    n_compared: int


def state_summary(tonight: Sequence[Night | None],
                  compared: Sequence[tuple[str, Mapping[str, Any], Sequence[Verdict]]],
                  tolerance: StateTolerance | None) -> StateSummary | None:
    """The summary over a session's tests: every test's night (``tonight``), and each compared test's (nodeid,
    stored baseline, final verdicts); None when no test was probed nor compared."""
    if tolerance is None:
        return None
    states = [n.machine_state for n in tonight if n is not None and n.machine_state]
    if not states and not compared:
        return None
    seen: dict[str, Mapping[str, float] | None] = {}
    for i, (_, baseline, _) in enumerate(compared):
        for e in baseline["sessions"]:
            seen.setdefault(f"{e.get('started', '')}#{i}", e.get("machine_state"))
    from pytest_specdec.measure.probe import MachineState, mean_state, state_entry

    bad = tuple((n, tuple(v.metric for v in verdicts if v.method == MACHINE_STATE and v.family == GATED))
                for n, _, verdicts in compared)
    mean = mean_state([MachineState(**s) for s in states])
    return StateSummary(None if mean is None else state_entry(mean), tuple(seen.values()), tolerance,
                        tuple((n, m) for n, m in bad if m), len(compared))
