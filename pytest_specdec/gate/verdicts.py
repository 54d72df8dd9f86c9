"""From a stored baseline and tonight's runs to one test's verdicts, and what the stored files teach the gate
(priors, pooled night variances with the profile's floor).

Pure functions over the baseline file format (:mod:`.baselines`), typed nights (:mod:`.nights`) and
:class:`stats.Verdict`; `gate/pipeline.py` strings them together, once, for every caller. Heavy modules
(numpy, scipy) are imported inside functions.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pytest_specdec.errors import ConfigError
from pytest_specdec.gate.kinds import ANOTHER_MACHINE, NOT_COMPARABLE, SHOWN, Decision, Family
from pytest_specdec.gate.kinds import GATED as GATED_FAMILY
from pytest_specdec.gate.registry import ABSOLUTE, GATED, PORTABLE
from pytest_specdec.gate.registry import VERDICT_METRICS as METRICS

if TYPE_CHECKING:
    from pytest_specdec.gate.machine import StateCondition, StateTolerance
    from pytest_specdec.gate.nights import Night
    from pytest_specdec.gate.stats import Thresholds, Verdict
    from pytest_specdec.gate.variance import NightPrior, NightVariance, Prior
    from pytest_specdec.measure.explain import Explained, Split

# The gated family (speedup, acceptance, P95 E2E ratio per test) fails a test and alone shares its
# multiplicity correction; every other metric is judged and shown in its own family; the `specdec_verdicts`
# marker's ``gate=[...]`` or the ini `specdec_gate` moves one in (gate/registry.py defines each metric).


def metric_order(name: str) -> tuple[int, int]:
    base, _, rest = name.partition("[")
    return (METRICS.index(base) if base in METRICS else len(METRICS), int(rest.rstrip("]") or 0) if rest else -1)


def metrics_per_test(method: str, k: int | None, goodput: bool = False) -> int:
    """How many metric tests one specdec test can add to the session's family (an upper bound); ``goodput``: it
    has goodput SLOs, so its goodput ratio is one more."""
    return 4 if method == "none" else 10 + (k or 0) + goodput


def drift_per_test(method: str) -> int:
    """How many drift verdicts one specdec test can add to the session's families, gated and shown (`gate.drift`:
    a spec arm's acceptance and step time; a reference-only test has none)."""
    from pytest_specdec.gate.drift import DRIFT_METRICS

    return len(DRIFT_METRICS) if method != "none" else 0


def gated_per_test(method: str, gate: Iterable[str] = GATED) -> int:
    """How many gated metric tests one specdec test can add (an upper bound for the family's padding)."""
    return len(list(gate)) if method != "none" else sum(1 for m in gate if m in ABSOLUTE)


# ---- evaluation ---------------------------------------------------------------------------------


def priors_from(baselines: Iterable[dict[str, Any]]) -> dict[tuple[str, str], Prior]:
    """Empirical-Bayes priors per (unit, metric) from stored baselines (their runs only, never tonight's)."""
    from pytest_specdec.gate.baselines import metric_values
    from pytest_specdec.gate.variance import estimate_prior, variance_sources

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


def _sessions_of(baseline: dict[str, Any], factors: Mapping[str, float]) -> dict[str, list[list[float]]]:
    """metric → per-night values of a stored file, absolute figures with each night's machine factor
    divided out."""
    from pytest_specdec.gate.baselines import metric_values
    from pytest_specdec.gate.machine import absolute_scale

    out: dict[str, list[list[float]]] = {}
    for entry in baseline["sessions"]:
        f = factors.get(entry.get("started", ""), 0.0)
        for name, vals in metric_values(entry).items():
            if name in ABSOLUTE and f:
                vals = [v * absolute_scale(name, f) for v in vals]
            out.setdefault(name, []).append(vals)
    return out


def night_variances(files: Iterable[dict[str, Any]], factors: Mapping[str, float],
                    prior: NightPrior | None = None) -> dict[str, NightVariance]:
    """Per metric, the night-to-night and run-to-run variance pooled over every stored file of the profile,
    with ``prior`` blended in (`variance.blend_prior`): then every metric the files hold has one, so a
    metric whose files hold one night each is judged night against night with the prior's uncertainty,
    never run against run as if nights did not move."""
    from pytest_specdec.gate.variance import blend_prior, estimate_night_variance

    per_metric: dict[str, list[list[list[float]]]] = {}
    for data in files:
        for name, sessions in _sessions_of(data, factors).items():
            per_metric.setdefault(name, []).append(sessions)
    out: dict[str, NightVariance] = {}
    for name, tables in per_metric.items():
        try:
            nv = estimate_night_variance(name, tables)
        except ConfigError:
            continue  # a bad value is reported by the verdict of that file's own test
        if prior is not None:
            nv = blend_prior(name, nv, prior, name.split("[", 1)[0] in ABSOLUTE)
        if nv is not None:
            out[name] = nv
    return out


def with_floor(nights: Mapping[str, NightVariance], min_sd_pct: float) -> dict[str, NightVariance]:
    """Night variances of log-scale metrics raised to at least ``min_sd_pct`` % sd. Stored nights recorded
    close together in time spread less than real nights do (docs/validation.md), and an underestimated
    night variance turns a quiet night into false `regressed` verdicts; the profile's floor says how far
    its nights are known to move."""
    from pytest_specdec.gate.scale import kind_of
    from pytest_specdec.gate.variance import sd_as_var

    floor = sd_as_var(min_sd_pct, True)
    return {name: (dataclasses.replace(nv, between=floor, floor=True)
                   if floor > nv.between and kind_of(name) != "acceptance" else nv)
            for name, nv in nights.items()}


def evaluate(baseline: dict[str, Any], now: Night, *, thresholds: Thresholds, alpha: float,
             look: int = 1, max_looks: int = 1, priors: Mapping[tuple[str, str], Prior] | None = None,
             nights: Mapping[str, NightVariance] | None = None, factors: Mapping[str, float] | None = None,
             tonight_log: float | None = None, gate: Iterable[str] = GATED,
             state_tolerance: StateTolerance | float | None = None, machines: Sequence[str] = ()) -> list[Verdict]:
    """One verdict per metric present tonight, and per gated metric the baseline has that tonight lacks for
    want of a valid run or pair (`inconclusive`: a gated figure that goes missing is never a silent pass; one
    left out for coalesced streams is reported as not judged); raw, before the session's multiplicity
    adjustment.

    A metric with a pooled night variance (``nights``) is compared night mean against night means; one without
    (the profile's stored files hold a single night, or a results file is the baseline in `compare`) run by
    run, or session means against tonight's, with the ``priors``. Absolute figures first have the machine
    factor divided out: each stored night's (``factors``) and tonight's (``tonight_log``, the session's).
    With ``state_tolerance`` (`machine.StateTolerance`, or one % for every kind) the state-bound metrics
    (`machine.STATE_BOUND`) are judged against the nights of a comparable machine state only, each kind with its
    own tolerance, and are `not-comparable` (method "machine state") when there is none. ``machines``: the baseline
    is other machines' nights (this one has none of its own), named so: only the portable metrics
    (`registry.PORTABLE`) are judged, every other `not-comparable` (method "another machine")."""
    from pytest_specdec.gate.machine import STATE_BOUND, StateTolerance, absolute_scale, state_condition
    from pytest_specdec.gate.stats import compare

    factors = factors or {}
    gate = set(gate)
    now_vals = now.metric_values()
    base_sessions = _sessions_of(baseline, factors)
    if isinstance(state_tolerance, (int, float)):
        state_tolerance = StateTolerance(float(state_tolerance), float(state_tolerance), "")
    conds: dict[float, tuple[StateCondition, dict[str, list[list[float]]]]] = {}

    def condition(name: str) -> tuple[StateCondition, dict[str, list[list[float]]]]:
        """The nights comparable at this metric's tolerance, and their values (one reading per tolerance)."""
        assert state_tolerance is not None
        tol = state_tolerance.of(name)
        if tol not in conds:
            cond = state_condition(baseline["sessions"], now.machine_state, tol)
            every = len(cond.kept) == len(baseline["sessions"])
            conds[tol] = cond, (base_sessions if every else _sessions_of(
                {"sessions": [baseline["sessions"][i] for i in cond.kept]}, factors))
        return conds[tol]

    out = []
    valid = now.metric_values(untimed_too=True)  # one left out only for coalesced streams stays out ("not judged")
    missing = {name for name, sessions in base_sessions.items()
               if name not in valid and any(sessions) and family_of(name, gate) == GATED_FAMILY}
    for name in sorted([*now_vals, *missing], key=metric_order):
        sessions = base_sessions.get(name, [])
        values = now_vals.get(name, [])
        note = ""
        if machines:
            if name.split("[", 1)[0] not in PORTABLE:
                out.append(state_not_comparable(name, sessions, values, another_machine(machines),
                                                family_of(name, gate), ANOTHER_MACHINE))
                continue
            note = f"; against the nights of {', '.join(machines)} (this machine has none of its own)"
        elif state_tolerance is not None and name in STATE_BOUND:
            cond, kept = condition(name)
            if not cond.kept:
                out.append(state_not_comparable(name, sessions, values, cond.reason, family_of(name, gate)))
                continue
            if len(cond.kept) < len(baseline["sessions"]):
                note = (f"; against the {len(cond.kept)} of {len(baseline['sessions'])} stored nights of a comparable "
                        "machine state")
            sessions = kept.get(name, [])
        if name in ABSOLUTE and tonight_log is not None:
            values = [v * absolute_scale(name, tonight_log) for v in values]
            note += f"; machine factor {math.exp(tonight_log):.3f} divided out"
        nv = (nights or {}).get(name)
        # Only the run unit is moderated: run-to-run noise is independent between tests, while the
        # night-to-night shift is shared by every test of the machine.
        prior = (priors or {}).get(("run", name)) if len(sessions) <= 1 and nv is None else None
        v = compare(name, sessions or [[]], values, thresholds=thresholds, alpha=alpha,
                    look=look, max_looks=max_looks, prior=prior, nights=nv)
        out.append(dataclasses.replace(v, family=family_of(name, gate), note=v.note + note))
    return out


def family_of(name: str, gate: Iterable[str]) -> Family:
    """Gated when the metric (or, for per_position_acceptance[i], its base name) is in the gate, else shown."""
    gate = set(gate)
    return GATED_FAMILY if name.split("[", 1)[0] in gate or name in gate else SHOWN


def not_comparable_verdicts(now: Night, fields: Mapping[str, tuple[Any, Any]],
                            gate: Iterable[str] = GATED) -> list[Verdict]:
    """Every metric `not-comparable`, each in its own family (a shown metric is never counted as gated)."""
    from pytest_specdec.gate.stats import not_comparable

    return [dataclasses.replace(not_comparable(name, fields), family=family_of(name, gate))
            for name in sorted(now.metric_values(), key=metric_order)]


def another_machine(machines: Sequence[str]) -> str:
    """Why a speed figure is not judged against other machines' nights."""
    return (f"measured against the nights of {', '.join(machines)}, another machine: its speed says nothing about "
            "this one's, so only acceptance is judged until this machine has nights of its own")


def state_not_comparable(name: str, sessions: Sequence[Sequence[float]], values: Sequence[float], reason: str,
                         family: Family, method: str | None = None) -> Verdict:
    """A metric the stored nights cannot judge here: none of a comparable machine state (a ratio metric; method
    "machine state"), or the nights are another machine's (``method`` "another machine"): `not-comparable` with
    the reason, the figures shown (geometric means) and never counted in the family's adjustment."""
    from pytest_specdec.gate.kinds import NIGHT
    from pytest_specdec.gate.machine import MACHINE_STATE
    from pytest_specdec.gate.scale import delta_unit, kind_of
    from pytest_specdec.gate.stats import Verdict
    from pytest_specdec.measure.figures import geomean

    stored = [v for night in sessions for v in night]
    return Verdict(name, NOT_COMPARABLE, geomean(stored), geomean(values), None, None, None, None,
                   len(sessions), len(values), delta_unit(kind_of(name)), method or MACHINE_STATE, None, reason,
                   family=family, per=NIGHT)


def gated_with(verdicts: Iterable[Verdict], verdict: Decision) -> list[Verdict]:
    """The gated verdicts that are ``verdict``: only these fail a test or the session (a shown metric
    that regresses is reported, never a failure)."""
    return [v for v in verdicts if v.family == GATED_FAMILY and v.verdict == verdict]


def explained(nights: Sequence[Night]) -> Explained | None:
    """The speedup explained (`measure.explain`: τ, step times, efficiency) over nights pooled: tonight alone,
    or a stored baseline's sessions, each night's recorded pairs."""
    from pytest_specdec.measure.explain import explain

    return explain([r for n in nights for r in n.reference], [r for n in nights for r in n.spec],
                   [s for n in nights for s in n.speedup_per_pair if s is not None])


def baseline_split(baseline: Mapping[str, Any] | None, now: Night | None) -> Split | None:
    """The speedup's change from a stored baseline (its sessions pooled) to tonight, split into acceptance and
    step time (`measure.explain.split`); None without both, or without a speedup on either side."""
    if not baseline or now is None:
        return None
    from pytest_specdec.gate.baselines import night_of
    from pytest_specdec.measure.explain import split

    return split(explained([night_of(e) for e in baseline.get("sessions") or ()]), explained([now]))
