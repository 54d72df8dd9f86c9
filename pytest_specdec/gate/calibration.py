"""A host's calibration: the noise this machine and profile show, measured over several sessions (pure functions,
and the record's one file format).

A first stored night cannot say how far a night moves, and a profile's night prior is a guess made on other hosts.
A calibration measures it on this host: each of several sessions of the same tests stands in for a night; per
metric, the run-to-run sd (pooled within sessions) and the night-to-night sd beyond it (pooled over the tests,
`variance.estimate_night_variance`, absolute figures with each session's machine factor divided out, as the gate
judges them); the machine probe's own repeatability; and how vLLM's reference speed follows the probe. The record
lives beside the machine's baselines (``<profile>/<hardware>/host.calibration``, committed like them); the gate then
blends its night sds into the profile's night prior (`prior_of`: each metric by its df) and says so.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_specdec.errors import SpecDecError
from pytest_specdec.formats import CALIBRATION_SCHEMA, FileFormat

if TYPE_CHECKING:
    from pytest_specdec.gate.machine import StateTolerance
    from pytest_specdec.gate.nights import Night
    from pytest_specdec.gate.stats import Thresholds
    from pytest_specdec.gate.variance import NightPrior

#: The record's name inside a machine's baselines folder (not ``*.json``: the baselines' reader lists those).
CALIBRATION_NAME = "host.calibration"
#: The record's `schema` names its format: ``"<tag>/<version>"``.
CALIBRATION_TAG = "pytest-specdec/calibration"
#: What a record that cannot be read asks for.
REMAKE = "make it again with `pytest-specdec calibrate RESULTS.json ... --write`, or remove it"
#: Runs per arm a lone test is assumed to have at one look, for what the host can catch (the cpu profile's).
CATCH_RUNS = 4


class CalibrationError(SpecDecError):
    """A calibration that cannot be made or read; the message names the file or input to fix."""


def calibration_path(root: Path, profile: str, hardware: str) -> Path:
    from pytest_specdec.gate.baselines import safe_part

    return root / safe_part(profile) / safe_part(hardware) / CALIBRATION_NAME


def _sd_pct(var: float, log: bool) -> float:
    from pytest_specdec.gate.variance import var_as_sd

    return var_as_sd(var, log)


def _var(sd_pct: float, log: bool) -> float:
    from pytest_specdec.gate.variance import sd_as_var

    return sd_as_var(sd_pct, log)


def _reach(name: str, night_var: float, df_night: float, run_var: float, df_run: float, *, log: bool,
           min_night_sd: float, alpha: float, runs: int) -> dict[str, float]:
    """What a lone test resolves (and, for a gated metric, catches) at this noise, the night variance no lower
    than the profile's floor on a log-scale metric: the one figuring of both, for the record and as judged."""
    from pytest_specdec.gate.registry import GATED as GATED_METRICS

    noise = (max(night_var, _var(min_night_sd, True) if log else 0.0), df_night, run_var, df_run)
    out = {"resolves": as_change(name, resolves(*noise, alpha=alpha, runs=runs))}
    if name in GATED_METRICS:  # as a drop (or a rise, for a latency ratio) in the metric's own unit
        out["catches"] = as_change(name, catches(*noise, alpha=alpha, runs=runs))
    return out


def _one_night(night_var: float, df_night: float, run_var: float, df_run: float, runs: int) -> tuple[float, float]:
    """(se, Satterthwaite df) of a lone test of ``runs`` runs against one stored night of as many runs: tonight's
    night and the stored night each move by the night variance (`stats._nights_core` with J = 1)."""
    b, w = 2.0 * night_var, 2.0 * run_var / runs
    var = b + w
    den = (b * b / df_night if df_night > 0 and b > 0 else 0.0) + (w * w / df_run if df_run > 0 and w > 0 else 0.0)
    return math.sqrt(var), (var * var / den if den > 0 else 1e9)


def catches(night_var: float, df_night: float, run_var: float, df_run: float, *, alpha: float, runs: int,
            power: float = 0.9) -> float:
    """The smallest change (on the comparison scale) such a lone test catches with ``power``."""
    from scipy import stats as sps

    se, df = _one_night(night_var, df_night, run_var, df_run, runs)
    return float((sps.t.ppf(1 - alpha, df) + sps.t.ppf(power, df)) * se)


def resolves(night_var: float, df_night: float, run_var: float, df_run: float, *, alpha: float, runs: int) -> float:
    """The smallest change (on the comparison scale) such a lone test can tell from none at all (one-sided
    ``alpha``): a threshold below it can never be crossed with significance, nor its CI fit inside it."""
    from scipy import stats as sps

    se, df = _one_night(night_var, df_night, run_var, df_run, runs)
    return float(sps.t.ppf(1 - alpha, df) * se)


def as_change(name: str, x: float) -> float:
    """A change on the comparison scale as a threshold's magnitude: % of a drop (rates), % of a rise (latencies),
    points (acceptance)."""
    from pytest_specdec.gate.registry import metric as registry_metric
    from pytest_specdec.gate.scale import kind_of

    if kind_of(name) == "acceptance":
        return 100.0 * x
    spec = registry_metric(name)
    if spec is None:
        raise ValueError(f"{name!r} is not a metric of the registry (gate/registry.py)")
    return 100.0 * (1 - math.exp(-x)) if spec.higher_is_better else 100.0 * math.expm1(x)


def calibrate(sessions: Sequence[Mapping[str, Night]], *, alpha: float = 0.05, runs: int = CATCH_RUNS,
              min_night_sd: float = 0.0, state_tolerance: float | None = None) -> dict[str, Any]:
    """The calibration of several sessions (each ``{nodeid: Night}``, the same tests, each a night) as the record
    stores it, less where and how it was made. Needs 2 sessions that share a test with 2+ valid runs an arm.

    What a lone test catches and resolves is figured as the gate will judge: a log-scale metric's night sd no
    lower than the profile's floor ``min_night_sd`` (%), which sessions minutes apart can understate.

    With ``state_tolerance`` (the profile's, %), a state-bound metric's night sd is measured between sessions of
    one test in a comparable machine state only, as the gate judges it (`state_groups`): sessions in other states
    measure how it follows the state (`follows_state`), not how far its nights move."""
    import numpy as np

    from pytest_specdec.gate.baselines import night_entry
    from pytest_specdec.gate.machine import night_factors, ref_log
    from pytest_specdec.gate.registry import ABSOLUTE
    from pytest_specdec.gate.scale import kind_of
    from pytest_specdec.gate.verdicts import metric_order, night_variances

    if len(sessions) < 2:
        raise CalibrationError(f"a calibration needs 2 or more sessions of the same tests, got {len(sessions)}")
    starts = [next((n.started for n in s.values() if n.started), "") for s in sessions]
    if len(set(starts)) < len(starts):
        raise CalibrationError("two sessions share a start stamp: the same results file given twice?")
    # each test's nights, in session order: a test in 2 or more sessions counts (a suite's session beside one of
    # its files' sessions adds that file's tests)
    per = {i: [s[i] for s in sessions if i in s] for i in sorted(set().union(*sessions))}
    per = {i: nights for i, nights in per.items() if len(nights) >= 2}
    ids = sorted(per)
    if not ids:
        raise CalibrationError("no test ran in 2 or more of the sessions: calibrate with sessions of the same tests")
    files = [{"sessions": [night_entry(n) for n in per[i]]} for i in ids]
    factors = night_factors(files)
    nights = night_variances(files, factors)
    grouped = {}
    if state_tolerance is not None:
        from pytest_specdec.gate.machine import STATE_BOUND

        groups = {i: state_groups(per[i], state_tolerance) for i in ids}
        same_state = [{"sessions": [night_entry(per[i][j]) for j in g]} for i in ids for g in groups[i] if len(g) >= 2]
        grouped = {name: nv for name, nv in night_variances(same_state, factors).items()
                   if name.split("[", 1)[0] in STATE_BOUND}
        nights = {**nights, **grouped}
    if not nights:
        raise CalibrationError(f"no metric has 2 sessions with 2+ valid runs in any of the {len(ids)} tests that ran "
                               "in 2 or more sessions")
    metrics: dict[str, Any] = {}
    for name in sorted(nights, key=metric_order):
        nv = nights[name]
        log = kind_of(name) != "acceptance"
        entry = {"run_sd": _sd_pct(nv.within, log), "df_run": nv.df_within, "night_sd": _sd_pct(nv.between, log),
                 "df_night": nv.df_between, "tests": nv.n_sources, "unit": "%" if log else "points",
                 "absolute": name.split("[", 1)[0] in ABSOLUTE, **({"same_state": True} if name in grouped else {})}
        # a metric that repeats exactly run to run and night to night is judged by the exact rule: no floor
        exact = nv.within == 0 and nv.between == 0
        entry.update(_reach(name, nv.between, nv.df_between, nv.within, nv.df_within, log=log,
                            min_night_sd=0.0 if exact else min_night_sd, alpha=alpha, runs=runs))
        metrics[name] = entry

    # The probe: its repeatability (within a session over tests, and of session means), and how the reference's
    # speed follows it (slope of log reference tok/s on log hash throughput, each centred per test).
    hashes = [[float(n.machine_state["hash"]) for n in s.values() if n.machine_state] for s in sessions]
    probe: dict[str, Any] = {"sessions_probed": sum(1 for h in hashes if h)}
    logs = [np.log(h) for h in hashes if len(h) >= 2]
    if logs:
        dfw = sum(len(x) - 1 for x in logs)
        probe["hash_sd_within_session"] = 100.0 * math.sqrt(sum(float(((x - x.mean()) ** 2).sum()) for x in logs) / dfw)
        if len(logs) >= 2:
            probe["hash_sd_between_sessions"] = 100.0 * float(np.std([x.mean() for x in logs], ddof=1))
    xs, ys = [], []
    for i in ids:
        pts = [(math.log(float(n.machine_state["hash"])), r) for n in per[i]
               if n.machine_state and (r := ref_log(n)) is not None]
        if len(pts) >= 2:
            mx, my = sum(p[0] for p in pts) / len(pts), sum(p[1] for p in pts) / len(pts)
            xs += [p[0] - mx for p in pts]
            ys += [p[1] - my for p in pts]
    if len(xs) >= 3 and float(np.var(xs)) > 0:
        x, y = np.array(xs), np.array(ys)
        probe["reference_follows_hash"] = {"slope": float((x * y).sum() / (x * x).sum()),
                                           "r": float(np.corrcoef(x, y)[0, 1]) if float(np.var(y)) > 0 else 0.0,
                                           "points": len(xs)}
    spread = state_spread(per)
    if spread is not None:
        probe["state_range_pct"] = 100.0 * math.expm1(spread)
    repeat = state_repeat(sessions)
    if repeat is not None:
        probe["state_repeat_pct"] = 100.0 * math.expm1(repeat)
    for name, follow in follows_state(per, factors).items():
        if name in metrics:
            metrics[name]["follows_state"] = follow
    return {"schema": CALIBRATION_FILE.schema_of(CALIBRATION_SCHEMA), "sessions": starts, "tests": ids,
            "alpha": alpha, "catch_runs": runs,
            "min_night_sd": min_night_sd, "metrics": metrics, "probe": probe}


def _capacity(state: Mapping[str, float] | None) -> float | None:
    """log(cores × hash): the share of the machine a run gets times its per-core speed, the one figure each
    state-bound metric is regressed on (a busier machine lowers the first, a slower host the second)."""
    if not state or not state.get("cores") or not state.get("hash"):
        return None
    return math.log(float(state["cores"])) + math.log(float(state["hash"]))


def state_groups(nights: Sequence[Night], tolerance_pct: float) -> list[list[int]]:
    """One test's sessions (their indexes) in groups of a comparable machine state: each joins the first group whose
    first session it is comparable with (`machine.state_comparable`), in the order given."""
    from pytest_specdec.gate.machine import state_comparable

    groups: list[list[int]] = []
    for j, n in enumerate(nights):
        home = next((g for g in groups if state_comparable(n.machine_state, nights[g[0]].machine_state,
                                                           tolerance_pct)), None)
        if home is None:
            groups.append([j])
        else:
            home.append(j)
    return groups


def state_repeat(sessions: Sequence[Mapping[str, Night]]) -> float | None:
    """How far apart two probe readings of one state fall (log, 95 % of pairs): 1.96·√2 times the probe's sd
    between the tests of one session, pooled over the sessions, on its noisiest figure. A session's tests are
    probed minutes apart in one nominal state, so this is the probe's repeatability with the drift a session has;
    None with fewer than 2 probed tests in any session."""
    from pytest_specdec.measure.probe import COMPONENTS

    worst = None
    for k in COMPONENTS:
        ss, df = 0.0, 0
        for s in sessions:
            logs = [math.log(float(n.machine_state[k])) for n in s.values()
                    if n.machine_state and n.machine_state.get(k)]
            if len(logs) >= 2:
                m = sum(logs) / len(logs)
                ss += sum((x - m) ** 2 for x in logs)
                df += len(logs) - 1
        if df:
            sd = math.sqrt(ss / df)
            worst = sd if worst is None else max(worst, sd)
    return None if worst is None else 1.96 * math.sqrt(2.0) * worst


def state_spread(per: Mapping[str, Sequence[Night]]) -> float | None:
    """The widest machine-state distance (`machine.state_distance`, log) between two sessions of one test: how far
    apart the states were that the calibration saw; None when no test was probed in 2 sessions."""
    from pytest_specdec.gate.machine import state_distance

    out = None
    for nights in per.values():
        states = [n.machine_state for n in nights if n.machine_state]
        for a in range(len(states)):
            for b in range(a + 1, len(states)):
                d = state_distance(states[a], states[b])
                out = d if out is None else max(out, d)
    return out


def follows_state(per: Mapping[str, Sequence[Night]], factors: Mapping[str, float]) -> dict[str, dict[str, float]]:
    """How each state-bound metric (`machine.STATE_BOUND`) follows the machine's state: the slope of its night
    mean (log; absolute figures with each session's machine factor divided out, as the gate judges them) on
    `_capacity`, both centred per test, with its se and df (points − tests − 1). Needs 3 points beyond the tests'
    centring and a state that moved."""
    import numpy as np

    from pytest_specdec.gate.machine import STATE_BOUND, absolute_scale
    from pytest_specdec.gate.registry import ABSOLUTE

    pts: dict[str, list[tuple[float, float, str]]] = {}
    for i, nights in per.items():
        for night in nights:
            x = _capacity(night.machine_state)
            if x is None:
                continue
            f = factors.get(night.started or "", 0.0)
            for name, vals in night.metric_values().items():
                if name.split("[", 1)[0] not in STATE_BOUND:
                    continue
                logs = [math.log(v * (absolute_scale(name, f) if name in ABSOLUTE and f else 1.0))
                        for v in vals if v and v > 0]
                if logs:
                    pts.setdefault(name, []).append((x, sum(logs) / len(logs), i))
    out = {}
    for name, p in pts.items():
        xs, ys, tests = [], [], 0
        for i in sorted({t for _, _, t in p}):
            mine = [(x, y) for x, y, t in p if t == i]
            if len(mine) >= 2:
                mx, my = sum(x for x, _ in mine) / len(mine), sum(y for _, y in mine) / len(mine)
                xs += [x - mx for x, _ in mine]
                ys += [y - my for _, y in mine]
                tests += 1
        df = len(xs) - tests - 1
        cx, cy = np.array(xs), np.array(ys)
        sxx = float((cx * cx).sum())
        if df < 1 or sxx <= 0:
            continue
        slope = float((cx * cy).sum()) / sxx
        resid = float(((cy - slope * cx) ** 2).sum()) / df
        out[name] = {"slope": slope, "se": math.sqrt(resid / sxx), "df": float(df), "points": float(len(xs))}
    return out


def state_tolerance_of(record: Mapping[str, Any], prior: NightPrior, base: StateTolerance, source: str
                       ) -> StateTolerance:
    """The machine-state tolerance per kind from what the record measured. A metric whose night mean moves by
    ``b`` per unit of log capacity moves by at most ``2·b·δ`` between two states within ``δ`` of each other on
    both probe figures; the tolerance is the ``δ`` at which that reaches the night sd of the profile's ``prior``
    (not the record's: sessions in several states measure the state's moves into their night sd), ``b`` taken at
    its upper 95 % bound, never beyond the widest state distance the calibration saw, and never below what two
    readings of one state differ by (``state_repeat_pct``, `state_repeat`: a tolerance below the probe's own
    repeatability would set aside nights of tonight's very state). A kind keeps ``base``'s (the profile's) where the
    calibration's states moved less than that tolerance, or none of its metrics has a slope: a quiet calibration
    cannot say how the state matters."""
    import dataclasses

    from scipy import stats as sps

    spread = (record.get("probe") or {}).get("state_range_pct")
    if not isinstance(spread, (int, float)) or spread <= 0:
        return base
    seen = math.log1p(spread / 100.0)
    repeat = (record.get("probe") or {}).get("state_repeat_pct")
    floor = math.log1p(repeat / 100.0) if isinstance(repeat, (int, float)) and repeat > 0 else 0.0
    kinds: dict[str, list[float]] = {}
    for name, m in record["metrics"].items():
        f = m.get("follows_state")
        if not isinstance(f, Mapping):
            continue
        absolute = bool(m.get("absolute"))
        bound = abs(float(f["slope"])) + float(sps.t.ppf(0.95, max(float(f["df"]), 1.0))) * float(f["se"])
        sd = math.sqrt(prior.var_of(name, absolute))
        delta = seen if bound <= 0 else min(seen, max(floor, sd / (2.0 * bound)))
        kinds.setdefault("absolute" if absolute else "ratio", []).append(100.0 * math.expm1(delta))
    got = {}
    for kind in ("ratio", "absolute"):
        now = getattr(base, kind)
        got[kind] = now if spread < now or kind not in kinds else round(min(kinds[kind]), 1)
    if got["ratio"] == base.ratio and got["absolute"] == base.absolute:
        return base
    return dataclasses.replace(base, ratio=got["ratio"], absolute=got["absolute"],
                               source=f"{source} (its states {spread:.3g} % apart)")


def load_calibration(path: Path) -> dict[str, Any] | None:
    """The record at ``path``, checked; None when there is none. A broken one is a CalibrationError naming the
    file and the command that makes it again (never silently replaced by the profile's guess)."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CalibrationError(f"calibration record {path} cannot be read ({exc}); {REMAKE}") from None
    return read_record(data, str(path))


def read_record(data: Any, name: str) -> dict[str, Any]:
    """A parsed record checked (``name``, its path, is what an error says): the format's version, and each metric's
    noise figures numbers >= 0."""
    if not isinstance(data, dict):
        raise CalibrationError(f"calibration record {name} is not a JSON object; {REMAKE}")
    if wrong := CALIBRATION_FILE.version_problem(data, name):
        raise CalibrationError(f"{wrong[0]}; {REMAKE}")
    metrics = data.get("metrics")
    if not isinstance(metrics, dict) or not metrics:
        raise CalibrationError(f"calibration record {name}: 'metrics' is missing or empty; {REMAKE}")
    for metric, m in metrics.items():
        for key in ("night_sd", "df_night", "run_sd", "df_run"):
            v = m.get(key) if isinstance(m, dict) else None
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                raise CalibrationError(f"calibration record {name}: metrics.{metric}.{key} is {v!r}, not a number "
                                       f">= 0; {REMAKE}")
    return data


def prior_of(record: Mapping[str, Any], source: str, base: NightPrior) -> NightPrior:
    """The record's night sds blended with ``base`` (the profile's night prior) as the gate's night prior: per
    metric ``(d_c s_c² + d_p s_p²) / (d_c + d_p)`` with ``d_c + d_p`` df, as stored nights blend with a prior. A
    calibration of a few sessions an hour apart sees less than nights do (a quiet hour hides the machine states a
    week brings), so it narrows the profile's guess by its df and never replaces it outright; a metric it did not
    measure keeps ``base``'s figure."""
    from pytest_specdec.gate.variance import NightPrior

    sd, dfs = dict(base.sd), dict(base.dfs)
    for name, m in record["metrics"].items():
        if m["df_night"] < 1:
            continue
        log = m["unit"] == "%"
        absolute = bool(m.get("absolute"))
        v_c = _var(m["night_sd"], log)
        v_p, d_p = base.var_of(name, absolute), base.df_of(name)
        d_c = float(m["df_night"])
        if v_p <= 0:  # the profile assumes no night effect for this class (acceptance): the measurement alone
            v, d = v_c, d_c
        else:
            v, d = (d_c * v_c + d_p * v_p) / (d_c + d_p), d_c + d_p
        sd[name] = _sd_pct(v, log)
        dfs[name] = d
    return NightPrior(sd, base.df, f"{source} blended with {base.source}", dfs=dfs)


def as_judged(record: Mapping[str, Any], prior: NightPrior, *, min_night_sd: float, alpha: float) -> dict[str, Any]:
    """The record with each metric's ``catches`` and ``resolves`` figured as the gate judges with it: the night
    variance of ``prior`` (the record blended with the profile's, `prior_of`), no lower than the floor, and the
    record's run noise. What the session says it catches is then what its verdicts can catch."""
    runs = int(record.get("catch_runs", CATCH_RUNS))
    metrics = {}
    for name, m in record["metrics"].items():
        m = dict(m)
        log = m["unit"] == "%"
        if m["run_sd"] or m["night_sd"]:  # an exact metric resolves any change, as the exact rule judges it
            m.update(_reach(name, prior.var_of(name, bool(m.get("absolute"))), prior.df_of(name),
                            _var(m["run_sd"], log), float(m["df_run"]), log=log, min_night_sd=min_night_sd,
                            alpha=alpha, runs=runs))
        metrics[name] = m
    return {**record, "metrics": metrics}


def raised_thresholds(record: Mapping[str, Any], thresholds: Thresholds) -> dict[str, tuple[float, float]]:
    """metric -> (threshold, what this host resolves) where the threshold is below what the calibration says
    a lone test against one night can tell from no change (by more than 1 %): such a threshold can only ever give
    `inconclusive`."""
    from pytest_specdec.gate.scale import kind_of

    out = {}
    for name, m in record["metrics"].items():
        r = m.get("resolves")
        if isinstance(r, (int, float)) and r > 0:
            now = abs(thresholds.bad_side(name, kind_of(name)))
            if r > 1.01 * now and (kind_of(name) == "latency" or r < 100):  # not for a rounding's worth
                out[name] = (now, float(r))
    return out


def _render(record: Mapping[str, Any]) -> str:
    """The record's one text form: the baselines' (sorted keys, rounded floats)."""
    from pytest_specdec.gate.baselines import render

    return render(dict(record))


def summary_lines(record: Mapping[str, Any], where: str) -> list[str]:
    """The record in words: per metric this host's noise and, for a gated one, what a lone test catches."""
    from pytest_specdec.gate.registry import label

    out = [f"specdec calibration ({where}): {len(record['sessions'])} sessions of {len(record['tests'])} tests"]
    for name, m in _in_order(record):
        catch = f"; a lone test catches {_catch(name, m)}" if "catches" in m else ""
        f = m.get("follows_state")
        state = (f"; follows the machine's capacity with slope {f['slope']:.2f} (se {f['se']:.2f}, {f['df']:.0f} df)"
                 if f else "")
        out.append(f"  {label(name)}: run sd {m['run_sd']:.3g} {m['unit']} ({m['df_run']:.0f} df), night sd "
                   f"{m['night_sd']:.3g} {m['unit']} ({m['df_night']:.0f} df"
                   f"{', sessions of one machine state' if m.get('same_state') else ''}){catch}{state}")
    p = record.get("probe") or {}
    if "hash_sd_within_session" in p:
        follow = p.get("reference_follows_hash")
        out.append(f"  probe: hash sd {p['hash_sd_within_session']:.3g} % within a session"
                   + (f", {p['hash_sd_between_sessions']:.3g} % between sessions" if "hash_sd_between_sessions" in p
                      else "")
                   + (f"; reference tok/s follows it with slope {follow['slope']:.2f} (r {follow['r']:.2f}, "
                      f"{follow['points']} points)" if follow else ""))
    if "state_range_pct" in p:
        out.append(f"  machine state: the sessions' states of one test were up to {p['state_range_pct']:.3g} % apart"
                   + (f"; two readings of one state differ by up to {p['state_repeat_pct']:.3g} % (95 %)"
                      if "state_repeat_pct" in p else ""))
    return out


def _in_order(record: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """The record's metrics in the gate's table order (the file keeps them sorted by name)."""
    from pytest_specdec.gate.verdicts import metric_order

    return sorted(record["metrics"].items(), key=lambda item: metric_order(item[0]))


def _catch(name: str, m: Mapping[str, Any]) -> str:
    """One metric's smallest caught change, signed on its bad side ("-12.5 %", "+40 %", "-2 pt"), or "exact" where
    its values repeat run to run and night to night (the gate's exact rule judges it)."""
    from pytest_specdec.gate.registry import metric as registry_metric

    if not m["run_sd"] and not m["night_sd"]:
        return "exact"
    spec = registry_metric(name)
    if spec is None:
        raise ValueError(f"{name!r} is not a metric of the registry (gate/registry.py)")
    sign = "-" if spec.higher_is_better else "+"
    return f"{sign}{m['catches']:.3g} {'%' if m['unit'] == '%' else 'pt'}"


def catch_phrase(record: Mapping[str, Any]) -> str:
    """What this machine can catch, in one phrase: "speedup -12 %, acceptance -2 pt, ... at power 0.9"."""
    from pytest_specdec.gate.registry import label

    parts = [f"{label(name)} {_catch(name, m)}" for name, m in _in_order(record) if "catches" in m]
    return ", ".join(parts) + " at power 0.9" if parts else "nothing measured"


#: The record's format: its `schema` is named, ``"pytest-specdec/calibration/<version>"`` (one version so far, so
#: `convert-schema` finds a record current and nothing converts).
CALIBRATION_FILE = FileFormat(
    kind="calibration record", version=CALIBRATION_SCHEMA, tag=CALIBRATION_TAG,
    detect=lambda d: str(d.get("schema", "")).startswith(f"{CALIBRATION_TAG}/"), render=_render,
    read=read_record, counts=lambda d: (len(d["sessions"]), len(d["tests"])), counted="sessions, tests",
    suffix=Path(CALIBRATION_NAME).suffix)
