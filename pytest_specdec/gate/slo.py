"""Tonight's runs against an absolute bound (e.g. speedup >= 1.5, P95 TPOT <= 20 ms); no baseline involved."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from pytest_specdec.errors import ConfigError
from pytest_specdec.gate.registry import Kind
from pytest_specdec.gate.scale import check_kind, checked_values
from pytest_specdec.measure.figures import mean_log

_OPS: dict[str, Callable[[float, float], bool]] = {">=": operator.ge, "<=": operator.le,
                                                   ">": operator.gt, "<": operator.lt}


@dataclass(frozen=True)
class SloResult:
    """An absolute check of one metric: the statistic used, its value and the message to show."""

    metric: str
    passed: bool
    statistic: str
    value: float | None
    op: str
    bound: float
    n: int
    message: str


def check_slo(metric: str, values: Sequence[float], op: str, bound: float, *, kind: Kind | None = None) -> SloResult:
    """Check tonight's runs against an absolute bound (e.g. speedup >= 1.5, P95 TPOT <= 20 ms).

    The statistic follows the kind: geometric mean for rates (ratios average multiplicatively), mean for
    acceptance, median for latencies (robust to one bad run). No values is a failure, not an error.
    """
    kind = check_kind(metric, kind)
    if op not in _OPS:
        raise ConfigError(f"metric {metric!r}: SLO operator must be one of {sorted(_OPS)}, got {op!r}")
    if not (isinstance(bound, (int, float)) and math.isfinite(bound)):
        raise ConfigError(f"metric {metric!r}: SLO bound must be a finite number, got {bound!r}")
    x = checked_values(metric, values, kind, "values")
    stat = {"rate": "geometric mean", "acceptance": "mean", "latency": "median"}[kind]
    if x.size == 0:
        return SloResult(metric, False, stat, None, op, float(bound), 0,
                         f"{metric}: no values to check against {op} {bound:g}: FAIL")
    val = {"rate": lambda: math.exp(mean_log(x.tolist())), "acceptance": lambda: float(x.mean()),
           "latency": lambda: float(np.median(x))}[kind]()
    ok = _OPS[op](val, bound)
    msg = f"{metric}: {stat} {val:.4g} over {x.size} runs {op} {bound:g}: {'pass' if ok else 'FAIL'}"
    return SloResult(metric, ok, stat, val, op, float(bound), int(x.size), msg)
