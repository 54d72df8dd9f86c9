"""The two figures every layer derives from runs, each written once here: τ (tokens per verification step)
and the geometric mean.

Pure and at the bottom of `measure/`, so the counters (`metrics.py`), the run record (`record.py`), the
summary, the explain split, the gate and the output all compute them by the same rule: a second copy is how
two readers come to disagree about one run (the same reason the run record is one type).
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def tau(drafts: float | None, accepted: float | None) -> float | None:
    """Tokens per verification step, vLLM's acceptance length: 1 + accepted tokens ÷ drafts (each step makes
    one token of its own, the bonus token, plus the draft tokens it accepted). Under chain acceptance this is
    also 1 + Σ the per-position acceptance rates, so ``accepted`` may be the per-position counts' sum. None
    without drafts (no speculation, or no counters read)."""
    if not drafts or drafts <= 0 or accepted is None:
        return None
    return 1.0 + accepted / drafts


def geomean(values: Iterable[float | None]) -> float | None:
    """The geometric mean of the positive values (None and values <= 0 left out; None when none is left):
    how rates, speedups and latencies average, their changes being multiplicative."""
    vals = [v for v in values if v is not None and v > 0]
    return math.exp(mean_log(vals)) if vals else None


def mean_log(values: Iterable[float]) -> float:
    """The mean of the logs of positive values: the log of their geometric mean (what the gate compares on)."""
    vals = list(values)
    if not vals or any(v <= 0 for v in vals):
        raise ValueError(f"mean_log needs positive values, got {vals!r}")
    return sum(map(math.log, vals)) / len(vals)
