"""Drift within a session (`gate.drift`): early half against late half of one server's runs, restarts and invalid
runs left out and said so, and the drift metrics accepted by `gate=[...]` but kept out of the baseline gate."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import pytest
from factories import arm_run

from pytest_specdec.errors import ConfigError
from pytest_specdec.gate.check import FailRule, Judgement, Look, Plan, adjusted_all
from pytest_specdec.gate.drift import ACCEPTANCE_DRIFT, STEP_TIME_DRIFT, Drift, DriftVerdict, drift
from pytest_specdec.gate.kinds import Family
from pytest_specdec.gate.stats import Verdict
from pytest_specdec.gate.thresholds import check_gate
from pytest_specdec.markers import VerdictOptions
from pytest_specdec.measure.record import ArmRun
from pytest_specdec.output.drift import drift_failure
from pytest_specdec.output.schema import drift_entry

JITTER = (1.0, 1.03, 0.98, 1.02, 0.99, 1.01, 0.97, 1.02, 1.0, 0.98)


def runs(tpots: Sequence[float], *, spec: bool, per_pos: Sequence[Sequence[float]] | None = None,
         invalid: dict[int, str] | None = None) -> list[ArmRun]:
    """Runs with these median TPOTs (ms); spec runs accept ``per_pos`` (each run's, default 60 of 100 per
    position, k=3)."""
    out = []
    for i, t in enumerate(tpots):
        pos = None if not spec else (per_pos[i] if per_pos is not None else (60, 60, 60))
        out.append(arm_run(i, 100.0, per_pos=pos, invalid=(invalid or {}).get(i),
                           tpot_ms={"p50": t, "p95": t, "p99": t}))
    return out


def judged(spec: list[ArmRun], ref: list[ArmRun], servers: Sequence[str] | None = None, gate: Sequence[str] = ()
           ) -> Drift:
    s = list(servers) if servers is not None else ["1"] * len(spec)
    d = drift(ref, spec, ["9"] * len(ref), s, alpha=0.05, gate=gate)
    assert d is not None
    return d


def drifted(d: Drift) -> tuple[Verdict, ...]:
    """What the one failure rule says of the drift alone (no baseline, opted out of it): its regressed gated ones."""
    return FailRule().decide(checked=False, status="missing", verdicts=(), drift=d.gated).drifted


def by_metric(d: Drift) -> dict[str, str]:
    return {v.metric: v.verdict for v in d.verdicts}


def test_a_spec_server_slower_late_is_regressed_and_fails_where_gated() -> None:
    ref = runs([10.0 * j for j in JITTER], spec=False)
    spec = runs([5.0 * j * (1.5 if i >= 5 else 1.0) for i, j in enumerate(reversed(JITTER))], spec=True)
    d = judged(spec, ref, gate=[STEP_TIME_DRIFT])
    step = next(v for v in d.verdicts if v.metric == STEP_TIME_DRIFT)
    assert step.verdict == "regressed" and step.family == "gated", step
    assert step.delta is not None and 40 < step.delta < 60, step
    assert step.early_runs == (0, 1, 2, 3, 4) and step.late_runs == (5, 6, 7, 8, 9)
    message = drift_failure("t::x", d, drifted(d))
    assert message is not None and "step_time_drift" in message and "early" in message and "CI" in message
    # shown where not gated: the same verdict, no failure
    assert not drifted(judged(spec, ref))


def test_nothing_changes_is_never_regressed() -> None:
    ref = runs([10.0 * j for j in JITTER], spec=False)
    spec = runs([5.0 * j for j in reversed(JITTER)], spec=True)
    d = judged(spec, ref, gate=[ACCEPTANCE_DRIFT, STEP_TIME_DRIFT])
    words = by_metric(d)
    assert words[ACCEPTANCE_DRIFT] == "unchanged"  # the same counters every run: exact, no t
    assert words[STEP_TIME_DRIFT] in ("unchanged", "inconclusive"), d
    assert not drifted(d) and drift_failure("t::x", d, drifted(d)) is None


def test_acceptance_falling_late_is_regressed() -> None:
    early, late = [(60, 61, 59)] * 3 + [(62, 60, 60)] * 2, [(40, 41, 39)] * 3 + [(42, 40, 38)] * 2
    spec = runs([5.0] * 10, spec=True, per_pos=[*early, *late])
    v = next(v for v in judged(spec, runs([10.0] * 10, spec=False)).verdicts if v.metric == ACCEPTANCE_DRIFT)
    assert v.verdict == "regressed" and v.delta is not None and v.delta < -5, v


def test_a_restart_starts_a_new_segment_and_invalid_runs_are_said() -> None:
    ref = runs([10.0] * 8, spec=False)
    spec = runs([5.0 * j for j in JITTER[:8]], spec=True, invalid={6: "disturbed: slow"})
    d = judged(spec, ref, servers=["1", "1", "2", "2", "2", "2", "2", "2"])
    for v in d.verdicts:
        assert v.early_runs + v.late_runs == (2, 3, 4, 5, 7), v
        assert "run 1: another server start (a restart begins a new segment)" in v.left_out, v.left_out
        assert any(x.startswith("run 7: spec run invalid (disturbed: slow)") for x in v.left_out), v.left_out


def test_too_few_runs_are_inconclusive() -> None:
    d = judged(runs([5.0] * 3, spec=True), runs([10.0] * 3, spec=False))
    assert set(by_metric(d).values()) == {"inconclusive"}
    assert all("fewer than 4" in v.note for v in d.verdicts)


def test_no_spec_arm_has_no_drift() -> None:
    assert drift(runs([10.0] * 4, spec=False), [], ["9"] * 4, [], alpha=0.05) is None


def test_gate_takes_drift_names_but_the_baseline_gate_does_not_see_them() -> None:
    assert check_gate(["acceptance_drift", "step_time_drift", "output_tok_s"], "m") == [
        "acceptance_drift", "step_time_drift", "output_tok_s"]
    with pytest.raises(ConfigError, match="unknown metric 'step_drift' in gate; allowed: .*step_time_drift"):
        check_gate(["step_drift"], "m")
    options = VerdictOptions(gate=("step_time_drift", "output_tok_s")).for_gate()
    assert options.gate == ("output_tok_s",)


def _step(verdict: str, p: float, family: Family = "gated") -> DriftVerdict:
    return DriftVerdict(STEP_TIME_DRIFT, verdict, family, "%", 10.0, 1.0, 1.6, 60.0, (40.0, 80.0), p,
                        (0, 1, 2, 3), (4, 5, 6, 7), ())


def _judged(raw: Sequence[Verdict], drift: Drift | None) -> Judgement:
    plan = Plan(Path("b.json"), "compared" if raw else "missing", True, {}, {})
    return Judgement(plan, looks_taken=(Look(4, tuple(raw)),), drift=drift)


def test_a_drift_is_adjusted_with_the_sessions_family_of_its_kind() -> None:
    """A gated drift's p joins BH with the gated verdicts of every test (a test without a baseline too), a shown
    drift's with the shown verdicts: p 0.01 regressed alone is inconclusive among ten p-values of its family; the
    results keep the raw. (Shown drift judged at the raw α read `regressed` or `improved` in 2 of 22 step-time
    drifts of a quiet README session.)"""
    gated = [Verdict("speedup", "unchanged", 1.0, 1.0, 0.0, -1.0, 1.0, 0.5, 4, 4, "%", "welch", -5.0, "")] * 9
    shown_others = [dataclasses.replace(v, metric="output_tok_s", family="shown") for v in gated]
    drift = Drift((_step("regressed", 0.01), dataclasses.replace(_step("regressed", 0.01, "shown"),
                                                                 metric=ACCEPTANCE_DRIFT, unit="points")), 0.05)
    assert FailRule().decide(checked=True, status="missing", verdicts=(), drift=drift.gated).fails_test  # raw α
    family = [("t::a", _judged([*gated, *shown_others], None)), ("t::b", _judged((), drift))]
    for final, size in ((True, 0), (False, 10)):
        out = adjusted_all(family, final=final, multiplicity="bh", alpha=0.05, gated_size=size, family_size=2 * size)
        adjusted = out["t::b"].drift_of(family[1][1])
        assert adjusted is not None
        step, shown = adjusted.shown
        for v in (step, shown):
            assert (v.verdict, v.p) == ("inconclusive", pytest.approx(0.1)), v
            assert "Benjamini-Hochberg over 10 tests: p 0.01 -> 0.1, regressed -> inconclusive" in v.note, v.note
        assert not FailRule().decide(checked=True, status="missing", verdicts=(), drift=adjusted.gated).fails_test
        entry = drift_entry(adjusted)["verdicts"]
        for metric in (STEP_TIME_DRIFT, ACCEPTANCE_DRIFT):
            assert entry[metric]["unadjusted"] == {"verdict": "regressed", "p": 0.01, "note": ""}
            assert entry[metric]["p"] == pytest.approx(0.1)
    # at a test's end the family is padded to what the collected tests can add: 20 gated p-values, p 0.01 -> 0.2
    padded = adjusted_all(family, final=False, multiplicity="bh", alpha=0.05, gated_size=20, family_size=40)
    assert padded["t::b"].drift[0].p == pytest.approx(0.2) and padded["t::b"].drift[1].p == pytest.approx(0.2)
    assert len(padded["t::a"].verdicts) == 18 and padded["t::a"].drift == ()


def test_a_drift_that_regresses_only_once_the_family_is_known_is_a_late_regression() -> None:
    """At its test's end the family is padded with p = 1 for the tests still to come (one of them skipped, say), so
    p 0.01 among 10 is inconclusive; at the session's end the family is the members measured: regressed, news the
    session's end must fail on (`late_drift`), never twice for a test that failed at its end already."""
    from pytest_specdec.gate.check import late_drift
    from pytest_specdec.gate.pipeline import Pipeline, Stored
    from pytest_specdec.gate.stats import Thresholds

    c = _judged((), Drift((_step("regressed", 0.01),), 0.05))
    rule = FailRule()
    at_end = adjusted_all([("t::b", c)], final=False, multiplicity="bh", alpha=0.05, gated_size=10, family_size=10)
    drift = at_end["t::b"].drift_of(c)
    assert drift is not None
    end = rule.decide(checked=True, status="missing", verdicts=(), drift=drift.gated)
    assert not end.fails_test
    _, [(_, final)] = Pipeline(Stored(()), 0.05, "bh").finish([("t::b", dataclasses.replace(c, end=end))],
                                                              Thresholds())
    assert final.drift is not None and final.drift.adjusted is not None
    (step,) = final.drift.shown
    assert step.verdict == "regressed" and "Benjamini-Hochberg over 1 tests: p 0.01 -> 0.01" in step.note, step
    now = rule.decide(checked=True, status="missing", verdicts=(), drift=final.drift.gated)
    assert now.drifted and late_drift(end, now)
    assert not late_drift(now, now)  # failed at its end already: not news


def test_the_terminal_ends_with_each_drift_word_the_sessions_family_changed() -> None:
    """At the test's end its drift is adjusted over the family so far, padded with the tests still to come (p = 1
    each); at the session's end over the family as it is: a word that changed is said again, as it stands, unless a
    late failure already names it."""
    from types import SimpleNamespace

    from pytest_specdec.output.drift import final_drift_lines
    from pytest_specdec.session_end import drift_changes

    raw = (_step("regressed", 0.001, "shown"),)
    said = Drift(raw, 0.05, adjusted=(_step("inconclusive", 0.26, "shown"),))
    final = Drift(raw, 0.05, adjusted=(_step("regressed", 0.026, "shown"),))
    lines = final_drift_lines("t", said, final)
    assert lines[0] == ("specdec: drift t, after the whole session's family was known (step_time_drift: inconclusive "
                        "at the test's end):"), lines
    assert lines[1].startswith("  step time regressed: early 1.000 ref steps → late 1.600 ref steps"), lines
    assert final_drift_lines("t", final, final) == []  # nothing changed: nothing said again
    assert final_drift_lines("t", said, final, {STEP_TIME_DRIFT}) == []  # its late failure says it
    end = SimpleNamespace(judged=[("t", SimpleNamespace(drift=final)), ("u", SimpleNamespace(drift=final))],
                          late_regressions=[("u", SimpleNamespace(drifted=(final.shown[0].as_verdict(),)))])
    assert drift_changes(end, {"t": said, "u": said}) == lines  # type: ignore[arg-type]  # a session end's fields
