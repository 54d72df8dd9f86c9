"""The machine factor: how fast this machine ran tonight against the stored nights, from the reference arms.

Each stored night gets its own factor (its reference speed against its file's mean night, averaged over the
files holding it), tonight one per compared test, and the session the mean of those. It divides out of the
absolute figures (tok/s, latencies); the gated within-session ratios never use it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_specdec.gate.nights import Night
    from pytest_specdec.gate.stats import Thresholds


def absolute_scale(name: str, log_factor: float) -> float:
    """Multiply an absolute figure by this to remove a machine factor exp(log_factor): a machine that runs
    slower (factor < 1) gives lower tok/s and longer latencies."""
    from pytest_specdec.gate.scale import kind_of

    return math.exp(-log_factor) if kind_of(name) == "rate" else math.exp(log_factor)


def ref_log(night: Night) -> float | None:
    """Mean log reference tok/s of one night (valid runs), the machine's speed that night."""
    vals = [r.output_tok_s for r in night.reference if r.valid and r.output_tok_s]
    return sum(math.log(v) for v in vals) / len(vals) if vals else None


def night_factors(files: Iterable[dict[str, Any]]) -> dict[str, float]:
    """Each stored night's machine factor (log, by its session's ``started``): the mean over every file
    holding that night of its reference speed's deviation from the file's mean night. Pure storage in,
    so it is fixed before any test runs."""
    from pytest_specdec.gate.nights import Night

    devs: dict[str, list[float]] = {}
    for data in files:
        logs = [(e.get("started", ""), ref_log(Night.from_entry(e))) for e in data["sessions"]]
        logs = [(k, x) for k, x in logs if x is not None]
        if len(logs) < 2:
            continue
        mean = sum(x for _, x in logs) / len(logs)
        for k, x in logs:
            devs.setdefault(k, []).append(x - mean)
    return {k: sum(v) / len(v) for k, v in devs.items()}


def tonight_deviation(baseline: dict[str, Any], now: Night, factors: Mapping[str, float]) -> float | None:
    """log(tonight's reference speed ÷ the baseline's machine-neutral level) for one test: one term of the
    session's machine factor."""
    from pytest_specdec.gate.nights import Night

    now_log = ref_log(now)
    logs = [(x - factors.get(e.get("started", ""), 0.0)) for e in baseline["sessions"]
            if (x := ref_log(Night.from_entry(e))) is not None]
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

    def to_dict(self) -> dict[str, Any]:
        return {"factor": self.factor, "log": self.log, "ci": [math.exp(self.ci_low), math.exp(self.ci_high)],
                "ci_level": self.level, "n_tests": self.n_tests, "threshold": self.threshold,
                "beyond_threshold": self.beyond}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MachineFactor:
        """The inverse of `to_dict` (the CI bounds are stored as factors, kept as logs here)."""
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


