"""A pytest session's end: the gates' last word (the session's `Gate`, the stored nights' or the A/B's, then the
crossover's), the results JSON and the report, in that order. Each step runs on its own (`step`): one that raises is an
error naming what it
judged (`SpecDecSession.errors`), shown in the terminal, the JSON and the report, and it fails the session; the
steps after it still run, so no fault in judging one thing loses the session's other results.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_specdec.session import SpecDecWarning

if TYPE_CHECKING:
    from pytest_specdec.gate.ab_session import ABJudgement
    from pytest_specdec.gate.drift import Drift
    from pytest_specdec.gate.protocol import SessionEnd
    from pytest_specdec.session import SpecDecSession


def step(session: SpecDecSession, what: str, run: Callable[[], Any], default: Any,
         passing: tuple[type[Exception], ...] = ()) -> Any:
    """One step of the session's end: its value, or ``default`` and an error naming ``what`` when it raises;
    ``passing`` are raised as they are (the caller has its own word for them)."""
    try:
        return run()
    except passing:
        raise
    except Exception as exc:  # noqa: BLE001 - any fault of one step is that step's error; the rest is written
        session.errors.append((what, f"{type(exc).__name__}: {exc}"))
        return default


def error_lines(session: SpecDecSession) -> list[str]:
    """The session-end errors, as the terminal words them."""
    from pytest_specdec.output.wording import session_error_line

    return [session_error_line(what, why) for what, why in session.errors]


def session_fails(session: SpecDecSession, *, results_written: bool) -> bool:
    """Whether the session's end fails the session, over every test's own outcome: the results could not be
    written (what CI keeps), the gate's end fails it (`SessionEnd.fails`), a sweep's gated regression or error, or
    a step of the session's end that raised."""
    end = session.end
    return (not results_written or (end is not None and end.fails)
            or bool(session.crossovers and session.crossovers.failed) or bool(session.errors))


def finalize(session: SpecDecSession) -> list[str]:
    """The gates' last word and its lines, one path whichever gate the session runs: the session's gate
    (`Gate.finish`: the whole family, each test's final judgement, the late regressions; for the stored nights the
    machine factor and the baseline writes), then the sweeps' (`judge_sweeps`); the machine factor's warning is
    given as pytest's. Each test's record keeps its final judgement."""
    from pytest_specdec.gate.protocol import Finished, SessionEnd

    records, ab = session.records, session.ab is not None
    gate = session.verdict_gate
    started = [(n, r) for n, r in records.items() if (r.ab if ab else r.baseline) is not None]
    what = ("the A/B gate's session end" if ab else
            "the gate's session end (machine factor, BH/Holm over the family, late regressions, baseline writes)")
    end = session.end = step(session, what, lambda: gate.finish(
        [Finished(n, r.ab if ab else r.baseline, r.result, r.outcome) for n, r in started]), SessionEnd(None))
    said = {n: records[n].drift for n, _ in end.judged}  # as the terminal said it at the test's end
    for n, judged in end.judged:
        if ab:
            records[n].ab = judged
        else:
            records[n].baseline = judged
        records[n].drift = judged.drift  # its gated drift adjusted over the whole family
    session.errors += end.errors  # a test whose final verdicts raised: named, the others judged
    if end.machine_warns and end.machine is not None:
        from pytest_specdec.output.wording import machine_sentence

        warnings.warn(SpecDecWarning(machine_sentence(end.machine)), stacklevel=1)
    sweeps = step(session, "the crossovers", lambda: judge_sweeps(session), [])
    session.gate_summary = step(session, "the gate's summary", lambda: end_summary(session, end), [])
    lines = step(session, "the gate's session-end lines", lambda: end_lines(session, end), [])
    drift = step(session, "the drift's final words", lambda: drift_changes(end, said), [])
    return [*lines, *drift, *sweeps, *error_lines(session)]


def drift_changes(end: SessionEnd[Any], said: Mapping[str, Drift | None]) -> list[str]:
    """Each test's drift verdicts that the session's final adjustment changed from what the terminal said at the
    test's end (`output.drift.final_drift_lines`), but those a late failure already names."""
    from pytest_specdec.output.drift import final_drift_lines

    failing = {n: {v.metric for v in late.drifted} for n, late in end.late_regressions}
    return [line for n, judged in end.judged
            for line in final_drift_lines(n, said.get(n), judged.drift, failing.get(n, set()))]


def end_summary(session: SpecDecSession, end: SessionEnd[Any]) -> list[str]:
    """The gate's summary, the terminal's last lines, as the output layer words what the session's gate decided:
    an A/B's closing line; the stored nights' verdicts per test and what each can catch."""
    st = session.settings
    if session.ab is not None:
        from pytest_specdec.output.ab_wording import ab_session_lines

        return ab_session_lines(ab_judged(session), end, multiplicity=st.multiplicity)[0]
    from pytest_specdec.output.schema import calibration_used_entry
    from pytest_specdec.output.wording import gate_lines

    judge = session.judge
    return gate_lines([(n, r.baseline, r.result) for n, r in session.records.items() if r.baseline is not None],
                      end.machine, multiplicity=st.multiplicity, alpha=st.alpha, fail_inconclusive=st.fail_inconclusive,
                      nights=judge.pooled_variances,
                      calibration=None if (used := judge.calibration_used) is None else calibration_used_entry(used))


def end_lines(session: SpecDecSession, end: SessionEnd[Any]) -> list[str]:
    """The gate's lines at the session's end: an A/B's late regressions and the coalesced runs; the stored nights'
    machine without baselines, machine factor, late regressions, coalesced runs and baseline writes."""
    from pytest_specdec.output.wording import coalesced_summary, session_end_lines

    records, st = session.records, session.settings
    results = [(n, r.result) for n, r in records.items()]
    if session.ab is not None:
        from pytest_specdec.output.ab_wording import ab_session_lines

        late = ab_session_lines(ab_judged(session), end, multiplicity=st.multiplicity)[1]
        return [*late, *coalesced_summary(results)]
    return session_end_lines(end, {n: r.baseline for n, r in records.items() if r.baseline is not None}, results,
                             alpha=st.alpha, multiplicity=st.multiplicity, strict=st.strict)


def ab_judged(session: SpecDecSession) -> list[tuple[str, ABJudgement]]:
    """The A/B session's tests with a comparison, each with its judgement."""
    return [(n, r.ab) for n, r in session.records.items() if r.ab is not None]


def judge_sweeps(session: SpecDecSession) -> list[str]:
    """The session's sweeps, a session-level family of its gate: in an A/B session each candidate sweep against its
    base arm's (`judge_ab_crossovers`), else each against its stored record (`judge_crossovers`)."""
    return judge_ab_crossovers(session) if session.ab is not None else judge_crossovers(session)


def judge_crossovers(session: SpecDecSession) -> list[str]:
    """The crossover gate (`gate.crossover_gate`): every measured test's point, every sweep judged, the record
    writes made; its lines. A sweep that cannot be judged is that sweep's error, never the others'."""
    from pytest_specdec.gate.baselines import sweep_path
    from pytest_specdec.gate.crossover_gate import CrossoverGate, SweepPoint
    from pytest_specdec.gate.nights import Night
    from pytest_specdec.output.sweeps import crossover_lines

    judge, st, profile = session.judge, session.settings, session.profile
    gate = CrossoverGate(
        alpha=st.alpha, tolerance=judge.state_tolerance.ratio, started=session.started, profile=profile.name,
        record_path=lambda sweep: sweep_path(st.baselines_dir, profile.name, judge.store.hardware, sweep),
        rel=judge.rel, gate=judge.gate(), update=st.update_baselines)
    points = []
    for nodeid, r in session.records.items():
        if r.result is not None:
            c = r.baseline
            points.append(SweepPoint.of(nodeid, r.params, r.callspec, Night.from_result(r.result),
                                        status=c.plan.status if c else None, checked=c.plan.checked if c else True,
                                        gate=c.plan.gate if c else (), passed=r.outcome == "passed",
                                        saturation_req_s=None if r.rate_sweep is None
                                        else r.rate_sweep.saturation.req_s))
    session.crossovers = gate.finish(points)
    return crossover_lines(session.crossovers, gate.write(session.crossovers, st.baselines_dir, st.keep_sessions))


def judge_ab_crossovers(session: SpecDecSession) -> list[str]:
    """An A/B session's sweeps (`crossover_gate.against_base`): each candidate sweep's crossover against its base
    arm's, from the same interleaved pairs; its lines. A sweep that cannot be judged is that sweep's error."""
    from pytest_specdec.gate.crossover_gate import SweepPoint, against_base
    from pytest_specdec.gate.nights import Night
    from pytest_specdec.output.sweeps import crossover_lines

    assert session.ab is not None
    points, bases = [], {}
    for nodeid, r in session.records.items():
        if r.result is None or r.ab is None:  # a test with no A/B comparison (no base for it) is no point
            continue
        kw: dict[str, Any] = {"status": "compared", "checked": r.ab.checked, "gate": r.ab.plan.metrics,
                              "passed": r.outcome == "passed",
                              "saturation_req_s": None if r.rate_sweep is None else r.rate_sweep.saturation.req_s}
        points.append(SweepPoint.of(nodeid, r.params, r.callspec, Night.from_result(r.result), **kw))
        bases[nodeid] = SweepPoint.of(nodeid, r.params, r.callspec, Night.base_from_result(r.result), **kw)
    session.crossovers = against_base(points, bases, alpha=session.settings.alpha, gate=session.ab.options.gate)
    return crossover_lines(session.crossovers, [])


def write_results(session: SpecDecSession) -> list[Path]:
    """The JSON results, then the HTML report from the same data (its paths are `session.report_paths`). A test
    whose entry cannot be made, a sweep's entry, or a report that cannot be rendered is an error naming it; the
    rest is written. An OSError (a directory that cannot be written) is the caller's."""
    from pytest_specdec.gate.protocol import SessionEnd
    from pytest_specdec.output.results import (
        crossover_entry,
        gate_settings,
        outputs_path,
        session_results,
        write_outputs,
        write_report,
    )
    from pytest_specdec.output.results import write_results as write_json
    from pytest_specdec.output.timing import session_time

    if not session.records:
        return []
    s, judge, end = session.settings, session._judge, session.end or SessionEnd(None)
    outputs = outputs_path(s.reports_dir, session.started) if s.save_outputs else None
    if outputs is not None:
        write_outputs(session.records.values(), outputs)
    crossovers = None
    if session.crossovers is not None:
        crossovers = [e for x in session.crossovers.sweeps
                      if (e := step(session, f"the crossover of {x.sweep} ({x.line})",
                                    partial(crossover_entry, x), None)) is not None]
    pool = session._pool
    session.time = step(session, "the session's time split", lambda: session_time(
        time.time() - session.started, (r.result for r in session.records.values()),
        (x.startup_s for x in session.server_starts())), None)
    results = session_results(
        started=session.started, profile=session.profile, gpu_names=session.gpu_names,
        servers=pool.servers if pool else {}, worker=session.worker, remote=session.remote,
        server_starts=len(session.server_starts()), datasets=session.workload.datasets,
        endpoints=session.serving.facts, gpu_hourly_usd=s.gpu_hourly_usd, machine=end.machine,
        machine_failed=end.machine_failed, fail_inconclusive=s.fail_inconclusive, fail_machine=s.fail_machine,
        night_variances=judge.pooled_variances if judge else {}, records=session.records.values(),
        baseline_writes=end.baselines, outputs_file=outputs.name if outputs else None,
        gate_settings=gate_settings(judge) if judge else None, crossovers=crossovers,
        machine_state=end.state, errors=session.errors, timing=session.time)
    paths, data = write_json(results, s.reports_dir, session.started, s.json_path)
    session.report_paths = step(session, "the HTML report (the results JSON is written)", lambda: write_report(
        data, s.reports_dir, session.started, s.report_path, s.benchmark_json), [], passing=(OSError,))
    return paths


def calibrate_session(session: SpecDecSession) -> list[str]:
    """--specdec-calibrate, after the results are written: this session and every earlier calibration session of
    the same profile and machine in the reports directory (`gate.settings.calibration_session`), each a night,
    calibrated together (`app.calibrate.of_results`, as `pytest-specdec calibrate` does). From the
    second session on the record is written beside the machine's baselines, once, at the end (filelock, atomic
    rename); the lines name the sessions it rests on, and any results file that could not be read."""
    import json

    from filelock import FileLock

    from pytest_specdec.app.calibrate import machine_of, of_results
    from pytest_specdec.files import write_atomic
    from pytest_specdec.gate.calibration import CALIBRATION_FILE, CALIBRATION_NAME, summary_lines
    from pytest_specdec.output.schema import ResultsError, load

    if not session.settings.calibrate or not session.result_paths or session._judge is None:
        return []
    judge, st = session.judge, session.settings
    this = session.result_paths[0]
    named, unread = [], []
    for path in sorted(st.reports_dir.glob("specdec-*.json")):
        if path.name.endswith(".outputs.json"):
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            settings = (data.get("gate") or {}).get("settings", {}) if isinstance(data, dict) else {}
            if not settings.get("calibration_session"):
                continue
            named.append((path, load(data, str(path))))
        except (OSError, ValueError, ResultsError) as exc:
            unread.append(f"{path.name} ({type(exc).__name__})")
    mine = next((r for p, r in named if p == this), None)
    if mine is None:
        return [(f"specdec calibration: this session's results {this} are not a calibration session's; nothing "
                 "calibrated")]
    key = (mine.profile, machine_of(mine))
    pool = [(p, r) for p, r in named if (r.profile, machine_of(r)) == key]
    path = judge.store.base / CALIBRATION_NAME
    out = [f"specdec calibration: results files left out, unreadable: {', '.join(unread)}"] if unread else []
    if len(pool) < 2:
        return [*out, (f"specdec calibration: 1 calibration session of profile {key[0]} on this machine so far (this "
                       f"one, in {judge.rel(st.reports_dir)}); run the same command again, spread over the day and "
                       f"some with the machine busy: from the second session on, the record is written to "
                       f"{judge.rel(path)}")]
    record, profile, hardware = of_results([(p.name, r) for p, r in pool],
                                           session.profile.machine_state_tolerance)
    record = {**record, "profile": profile, "hardware": hardware,
              "command": "pytest --specdec-calibrate: " + " ".join(p.name for p, _ in pool)}
    existed = path.exists()
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(st.baselines_dir / ".specdec-baselines.lock"), timeout=600):
        write_atomic(path, CALIBRATION_FILE.render(record))
    return [*out, *summary_lines(record, judge.rel(path)),
            (f"specdec calibration: {'replaced' if existed else 'wrote'} {judge.rel(path)} from {len(pool)} sessions "
             f"in {judge.rel(st.reports_dir)}; commit it beside the baselines")]
