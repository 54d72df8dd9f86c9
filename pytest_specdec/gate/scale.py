"""Metric kinds, their comparison scale, and the checked per-run input shared by the statistics modules.

Rates (speedup, tok/s) and latencies are compared on the log scale (run-to-run noise on a machine is
multiplicative; a difference of mean logs is a ratio of geometric means, reported in %), acceptance
raw (reported in points). Inputs are per-run values, never pooled over tokens.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from pytest_specdec.errors import ConfigError
from pytest_specdec.gate.kinds import Unit
from pytest_specdec.gate.registry import DELTA_UNITS, KINDS, LOG_KINDS, Kind
from pytest_specdec.gate.registry import metric as registry_metric

#: The `Thresholds` field that holds each kind's default threshold.
THRESHOLD_FIELD: dict[Kind, str] = {"rate": "rate_pct", "acceptance": "acceptance_points", "latency": "latency_pct"}


def kind_of(metric: str) -> Kind:
    """The comparison kind of a metric name; ``per_position_acceptance*`` is acceptance, ``*_ms`` latency."""
    known = registry_metric(metric)
    if known is not None:
        return known.kind
    if metric.endswith("_ms"):
        return "latency"
    raise ConfigError(f"metric {metric!r}: unknown kind; pass kind='rate', 'acceptance' or 'latency'")


def check_kind(metric: str, kind: str | None) -> Kind:
    if kind is None:
        return kind_of(metric)
    if kind not in KINDS:
        raise ConfigError(f"metric {metric!r}: kind must be 'rate', 'acceptance' or 'latency', got {kind!r}")
    return kind


def delta_unit(kind: Kind) -> Unit:
    return DELTA_UNITS[kind]


# ---- input checking -------------------------------------------------------------------------------


def checked_values(metric: str, values: Iterable[Any], kind: Kind, where: str) -> np.ndarray:
    """Checked float array; None/NaN/inf/out-of-domain raise (nothing is silently dropped)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise ConfigError(f"metric {metric!r}: {where} must be a list of per-run values, got {values!r}")
    out = []
    for i, v in enumerate(values):
        if v is None or isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise ConfigError(f"metric {metric!r}: {where}[{i}] is {v!r}, not a number; "
                              "drop failed runs before comparing, never pass None")
        fv = float(v)
        if not math.isfinite(fv):
            raise ConfigError(f"metric {metric!r}: {where}[{i}] is {fv}; NaN/inf values are rejected")
        if kind in LOG_KINDS and fv <= 0:
            raise ConfigError(f"metric {metric!r}: {where}[{i}] is {fv}; a {kind} must be > 0")
        if kind == "acceptance" and not 0.0 <= fv <= 1.0:
            raise ConfigError(f"metric {metric!r}: {where}[{i}] is {fv}; acceptance must lie in [0, 1]")
        out.append(fv)
    return np.asarray(out, dtype=float)


def checked_sessions(metric: str, baseline: Sequence[Sequence[Any]], kind: Kind) -> list[np.ndarray]:
    """The baseline's non-empty sessions; a flat list of numbers is refused (it hides the unit)."""
    if isinstance(baseline, (str, bytes)) or not isinstance(baseline, Iterable):
        raise ConfigError(f"metric {metric!r}: baseline must be a list of sessions, got {baseline!r}")
    out = []
    for j, s in enumerate(baseline):
        if s is None or isinstance(s, (int, float, np.number)):
            raise ConfigError(f"metric {metric!r}: baseline must be a list of sessions (lists of run "
                              f"values); baseline[{j}] is {s!r}")
        arr = checked_values(metric, s, kind, f"baseline[{j}]")
        if arr.size:
            out.append(arr)
    return out


# ---- the comparison scale -------------------------------------------------------------------------


def on_scale(kind: Kind, x: np.ndarray) -> np.ndarray:
    return np.log(x) if kind in LOG_KINDS else np.asarray(x, dtype=float)


def to_natural(kind: Kind, d: Any) -> Any:
    """A difference on the comparison scale → % relative change (log kinds) or points."""
    return 100.0 * np.expm1(d) if kind in LOG_KINDS else 100.0 * np.asarray(d)


def center(kind: Kind, m: float) -> float:
    return float(np.exp(m)) if kind in LOG_KINDS else float(m)


def to_scale(kind: Kind, natural: float) -> float:
    """A signed change in natural units (% or points) → the comparison scale (log ratio or fraction)."""
    return math.log1p(natural / 100.0) if kind in LOG_KINDS else natural / 100.0
