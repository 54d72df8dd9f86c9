"""From a stored baseline and tonight's runs to verdicts, and from verdicts to messages a person can act on.

Pure functions over plain dicts (the baseline file format of :mod:`.baselines`) and :class:`stats.Verdict`;
the session decides when to call them. Heavy modules (numpy, scipy) are imported inside functions
so that ``pytest --help`` stays fast (options import :func:`parse_threshold_items`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .errors import ConfigError

if TYPE_CHECKING:
    from .stats import Prior, Thresholds, Verdict

#: Verdict metrics in table order. Per-position acceptance is `per_position_acceptance[i]`.
METRICS = (
    "speedup", "output_tok_s", "reference_tok_s", "acceptance_rate", "per_position_acceptance",
    "draft_coverage", "tpot_p95_ms", "ttft_p95_ms", "e2e_p95_ms",
)
KINDS = ("rate", "acceptance", "latency")
_KIND_FIELD = {"rate": "rate_pct", "acceptance": "acceptance_points", "latency": "latency_pct"}
LABELS = {
    "speedup": "speedup", "output_tok_s": "spec tok/s", "reference_tok_s": "reference tok/s",
    "acceptance_rate": "acceptance", "draft_coverage": "draft coverage", "tpot_p95_ms": "P95 TPOT",
    "ttft_p95_ms": "P95 TTFT", "e2e_p95_ms": "P95 E2E",
}


def metric_order(name: str) -> tuple[int, int]:
    base, _, rest = name.partition("[")
    return (METRICS.index(base) if base in METRICS else len(METRICS), int(rest.rstrip("]") or 0) if rest else -1)


def metrics_per_test(method: str, k: int | None) -> int:
    """How many metric tests one specdec test can add to the session's family (an upper bound)."""
    return 4 if method == "none" else 8 + (k or 0)


def _check_name(name: str, where: str) -> str:
    base = name.split("[", 1)[0]
    if name in KINDS or base in METRICS:
        if "[" in name and not (base == "per_position_acceptance" and name[len(base) + 1:-1].isdigit()
                                and name.endswith("]")):
            raise ConfigError(f"{where}: {name!r} is not a metric; per-position thresholds are "
                              "per_position_acceptance (all positions) or per_position_acceptance[i]")
        return name
    raise ConfigError(f"{where}: unknown metric {name!r}; allowed: {', '.join(KINDS + METRICS)}")


def _magnitude(name: str, value: Any, where: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if isinstance(value, bool) or not (math.isfinite(number) and number > 0):
        raise ConfigError(f"{where}: threshold of {name} must be a positive number (% for rates and "
                          f"latencies, points for acceptance), got {value!r}")
    return number


def parse_threshold_items(items: Iterable[str], where: str) -> dict[str, float]:
    """``["speedup=8", "latency=20"]`` → ``{"speedup": 8.0, "latency": 20.0}``, with errors that name the fix."""
    out: dict[str, float] = {}
    for item in items:
        name, sep, value = str(item).partition("=")
        name = name.strip()
        if not sep or not name:
            raise ConfigError(f"{where}: expected METRIC=VALUE like speedup=8 or latency=20, got {item!r}")
        out[_check_name(name, where)] = _magnitude(name, value.strip(), where)
    return out


def check_mapping(mapping: Any, where: str) -> dict[str, float]:
    """A marker's or profile's ``{metric or kind: magnitude}`` table, validated."""
    if not isinstance(mapping, Mapping):
        raise ConfigError(f"{where}: thresholds must be a mapping like {{'speedup': 8}}, got {mapping!r}")
    return {_check_name(str(k), where): _magnitude(str(k), v, where) for k, v in mapping.items()}


def build_thresholds(*layers: Mapping[str, float]) -> Thresholds:
    """Defaults overridden layer by layer (profile, ini, CLI, marker: later wins)."""
    from .stats import Thresholds

    kinds: dict[str, float] = {}
    per_metric: dict[str, float] = {}
    for layer in layers:
        for name, value in layer.items():
            if name in KINDS:
                kinds[_KIND_FIELD[name]] = value
                # a kind set by a later layer beats an earlier per-metric value of that kind
                from .stats import kind_of

                for m in [m for m in per_metric if kind_of(m) == name]:
                    del per_metric[m]
            else:
                per_metric[name] = value
    return Thresholds(per_metric=per_metric, **kinds)


# ---- evaluation ---------------------------------------------------------------------------------


def priors_from(baselines: Iterable[dict[str, Any]]) -> dict[tuple[str, str], Prior]:
    """Empirical-Bayes priors per (unit, metric) from stored baselines (their runs only, never tonight's)."""
    from .baselines import metric_values
    from .stats import estimate_prior, variance_sources

    sources: dict[tuple[str, str], list[tuple[float, int]]] = {}
    for data in baselines:
        per_metric: dict[str, list[list[float]]] = {}
        for entry in data["sessions"]:
            for name, vals in metric_values(entry).items():
                per_metric.setdefault(name, []).append(vals)
        for name, sessions in per_metric.items():
            try:
                got = variance_sources(name, sessions)
            except ConfigError:
                continue  # a bad value is reported by the verdict of that file's own test
            for unit, vd in got.items():
                sources.setdefault((unit, name), []).append(vd)
    out: dict[tuple[str, str], Prior] = {}
    for key, vds in sources.items():
        prior = estimate_prior([v for v, _ in vds], [d for _, d in vds])
        if prior is not None:
            out[key] = prior
    return out


def evaluate(baseline: dict[str, Any], now: dict[str, Any], *, thresholds: Thresholds, alpha: float,
             look: int = 1, max_looks: int = 1, priors: Mapping[tuple[str, str], Prior] | None = None
             ) -> list[Verdict]:
    """One verdict per metric present tonight (raw, before the session's multiplicity adjustment)."""
    from .baselines import metric_values
    from .stats import compare

    now_vals = metric_values(now)
    base_sessions: dict[str, list[list[float]]] = {}
    for entry in baseline["sessions"]:
        for name, vals in metric_values(entry).items():
            base_sessions.setdefault(name, []).append(vals)
    out = []
    for name in sorted(now_vals, key=metric_order):
        sessions = base_sessions.get(name, [])
        # Only the run unit is moderated: run-to-run noise is independent between tests, while the
        # night-to-night shift is shared by every test of the machine, so the spread of other tests'
        # session means is no independent evidence (moderating it false-alarms: stats_simulation.py).
        prior = (priors or {}).get(("run", name)) if len(sessions) <= 1 else None
        out.append(compare(name, sessions or [[]], now_vals[name], thresholds=thresholds, alpha=alpha,
                           look=look, max_looks=max_looks, prior=prior))
    return out


def not_comparable_verdicts(now: dict[str, Any], fields: Mapping[str, tuple[Any, Any]]) -> list[Verdict]:
    from .baselines import metric_values
    from .stats import not_comparable

    return [not_comparable(name, fields) for name in sorted(metric_values(now), key=metric_order)]


def unit_of(v: Verdict) -> str:
    """The unit of comparison: ``run`` or ``session``."""
    return v.method.rsplit("/", 1)[-1] if "/" in v.method else "run"


def to_json(v: Verdict) -> dict[str, Any]:
    """The JSON results' entry of one verdict (issue 4's fields plus how it was decided)."""
    return {
        "verdict": v.verdict, "baseline": v.baseline, "now": v.now, "delta": v.delta,
        "ci": None if v.ci_low is None else [v.ci_low, v.ci_high], "p": v.p,
        "n_baseline": v.n_baseline, "n_now": v.n_now, "unit": unit_of(v), "delta_unit": v.unit,
        "threshold": v.threshold, "method": v.method, "note": v.note,
    }


# ---- messages -----------------------------------------------------------------------------------


def format_value(name: str, x: float | None, times: str = "x") -> str:
    """A metric's value as the failure table and the HTML report show it."""
    if x is None:
        return "—"
    if name.startswith(("acceptance", "per_position", "draft_coverage")):
        return f"{x:.3f}"
    if name == "speedup":
        return f"{x:.3f}{times}"
    if name.endswith("_ms"):
        return f"{x:.4g} ms"
    return f"{x:.4g}"


def _delta(x: float | None, unit: str) -> str:
    if x is None:
        return "—"
    return f"{x:+.1f} %" if unit == "%" else f"{x:+.2f} pt"


def table(verdicts: Iterable[Verdict], ci_label: str = "90% CI") -> str:
    """metric | baseline | now | Δ | 90% CI | p | verdict, aligned."""
    rows = [("metric", "baseline", "now", "Δ", ci_label, "p", "verdict")]
    for v in verdicts:
        ci = "—" if v.ci_low is None else f"{_delta(v.ci_low, v.unit)} .. {_delta(v.ci_high, v.unit)}"
        p = "exact" if v.method.startswith("exact") else ("—" if v.p is None else f"{v.p:.2g}")
        rows.append((LABELS.get(v.metric, v.metric), format_value(v.metric, v.baseline),
                     format_value(v.metric, v.now), _delta(v.delta, v.unit), ci, p, v.verdict))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def attribution(verdicts: Iterable[Verdict]) -> str:
    """Which arm moved: the reference decoding, the speedup, the acceptance, and what that points at."""
    by = {v.metric: v for v in verdicts}
    parts = []
    for label, name in (("reference decoding", "reference_tok_s"), ("speedup", "speedup"),
                        ("acceptance", "acceptance_rate"), ("spec tok/s", "output_tok_s")):
        v = by.get(name)
        if v is not None:
            parts.append(f"{label} {v.verdict}" + ("" if v.delta is None else f" {_delta(v.delta, v.unit)}"))

    def bad(name: str) -> bool:
        return name in by and by[name].verdict == "regressed"

    if bad("speedup") and bad("acceptance_rate"):
        reading = "speculation gains less because fewer drafted tokens are accepted: look at the draft/head"
    elif bad("speedup"):
        reading = ("speculation gains less at the same acceptance: drafting or verification got slower "
                   "(draft cost, kernels, scheduling)")
    elif bad("reference_tok_s"):
        reading = ("the no-speculation reference got slower while the speedup held: look at the target, the "
                   "engine or the machine, not at speculation")
    elif bad("acceptance_rate") or any(v.verdict == "regressed" and v.metric.startswith("per_position")
                                       for v in by.values()):
        reading = "acceptance dropped; the speedup has not (yet) moved beyond its threshold"
    elif bad("output_tok_s"):
        reading = "spec throughput dropped with both the reference and the speedup within their thresholds"
    elif any(v.verdict == "regressed" for v in by.values()):
        reading = "latency regressed while the throughput figures held"
    else:
        reading = ""
    return "; ".join(parts) + (f": {reading}" if reading else "")


def under_test_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Lines ``field: old → new`` for what is under test (engine config included); one line when equal."""
    from .baselines import under_test_changes

    changed = under_test_changes(dict(old), dict(new))
    if not changed:
        return ["  (no change in versions, draft/head hash, plugin version or engine config)"]
    return [f"  {k}: {a!r} → {b!r}" for k, (a, b) in changed.items()]
