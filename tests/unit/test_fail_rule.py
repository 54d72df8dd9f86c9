"""The one failure rule (`gate.check.FailRule`): what the session, `compare` and the A/B's `compare` ask."""

from __future__ import annotations

import pytest

from pytest_specdec.gate.check import FailRule
from pytest_specdec.gate.kinds import Status
from pytest_specdec.gate.stats import Verdict


def _v(verdict: str, family: str = "gated") -> Verdict:
    return Verdict("speedup", verdict, 1.0, 0.9, -10.0, -15.0, -5.0, 0.001, 5, 5, "%", "m", -5.0, "", family=family)


REGRESSED, OPEN, FINE = _v("regressed"), _v("inconclusive"), _v("unchanged")


@pytest.mark.parametrize(("rule", "status", "verdicts", "checked", "dead", "outcome", "fails"), [
    (FailRule(), "compared", [FINE], True, False, "pass", False),
    (FailRule(), "compared", [FINE, _v("regressed", "shown")], True, False, "pass", False),
    (FailRule(), "compared", [REGRESSED], True, False, "regressed", True),
    (FailRule(), "compared", [REGRESSED], False, False, "pass", False),  # check=False: shown, never failed
    (FailRule(), "compared", [OPEN], True, False, "inconclusive", False),
    (FailRule(fail_inconclusive=True), "compared", [OPEN], True, False, "inconclusive", True),
    (FailRule(fail_inconclusive=True), "compared", [OPEN, REGRESSED], True, False, "regressed", True),
    (FailRule(), "not-comparable", [REGRESSED], True, False, "not-comparable", False),
    (FailRule(strict=True), "not-comparable", [], True, False, "not-comparable", True),
    (FailRule(), "missing", [], True, False, "pass", False),
    (FailRule(missing_fails=True), "missing", [], True, False, "missing", True),
    (FailRule(), "error", [], True, False, "error", True),
    (FailRule(replacing=True), "error", [], True, False, "pass", False),
    (FailRule(replacing=True), "compared", [REGRESSED], True, False, "pass", False),
    (FailRule(), "compared", [FINE], False, True, "error", True),  # an arm without a valid run fails anyway
])
def test_one_rule_decides_every_test_end(rule: FailRule, status: Status, verdicts: list[Verdict], checked: bool,
                                         dead: bool, outcome: str, fails: bool) -> None:
    end = rule.decide(checked=checked, status=status, verdicts=verdicts, dead=dead)
    assert (end.outcome, end.fails) == (outcome, fails)
    assert end.open == ((OPEN,) if outcome == "inconclusive" else ())


def _drift(verdict: str, family: str = "gated") -> Verdict:
    return Verdict("step_time_drift", verdict, 1.0, 1.6, 60.0, 40.0, 80.0, 0.001, 4, 4, "%", "welch", 10.0, "",
                   family=family)


@pytest.mark.parametrize(("status", "checked", "verdicts", "outcome", "fails"), [
    ("compared", True, [FINE], "pass", False),
    ("compared", False, [REGRESSED], "pass", False),  # check=False opts out of the baseline only
    ("missing", True, [], "pass", False),  # drift needs no baseline
    ("not-comparable", True, [], "not-comparable", False),
    ("compared", True, [REGRESSED], "regressed", True),
])
def test_a_gated_drift_that_regressed_fails_the_test_whatever_its_baseline_says(
        status: Status, checked: bool, verdicts: list[Verdict], outcome: str, fails: bool) -> None:
    drifted = _drift("regressed")
    end = FailRule().decide(checked=checked, status=status, verdicts=verdicts, drift=[drifted, _drift("unchanged")])
    assert (end.outcome, end.fails) == (outcome, fails)  # the outcome and its words stay the baseline's
    assert end.drifted == (drifted,) and end.fails_test
    shown = FailRule().decide(checked=checked, status=status, verdicts=verdicts, drift=[_drift("regressed", "shown")])
    assert shown.drifted == () and shown.fails_test == fails  # a shown drift never fails a test


@pytest.mark.parametrize(("status", "checked", "verdicts"), [
    ("compared", True, [FINE]),
    ("compared", False, [FINE]),  # check=False opts out of the baseline only
    ("missing", True, []),  # drift needs no baseline
])
def test_a_gated_drift_still_inconclusive_fails_under_fail_inconclusive_as_any_gated_metric(
        status: Status, checked: bool, verdicts: list[Verdict]) -> None:
    open_ = _drift("inconclusive")
    end = FailRule(fail_inconclusive=True).decide(checked=checked, status=status, verdicts=verdicts,
                                                  drift=[open_, _drift("inconclusive", "shown")])
    assert end.outcome == "pass" and end.drifted == (open_,) and end.fails_test  # named as the rule failed it
    assert end.drift_open == ()  # it fails: no warning besides
    passing = FailRule().decide(checked=checked, status=status, verdicts=verdicts,
                                drift=[open_, _drift("inconclusive", "shown")])
    assert not passing.fails_test and passing.drift_open == (open_,)  # passes with a warning naming it


def test_compare_fails_a_test_still_inconclusive_where_its_session_did_or_where_told() -> None:
    """`pytest-specdec compare` judges a file again by the rule its session ran under (its recorded
    `gate.fail_inconclusive`), or by `--fail-inconclusive`: a gated verdict still inconclusive then fails the
    comparison as it failed the session; otherwise it passes, as it passed there."""
    from types import SimpleNamespace
    from typing import Any, cast

    from factories import ab_judgement

    from pytest_specdec.app.compare import session_rule
    from pytest_specdec.gate.comparison import PLAIN, ABComparison, ABRow, Comparison, Row

    def results(fail_inconclusive: bool) -> Any:
        return cast(Any, SimpleNamespace(gate=SimpleNamespace(fail_inconclusive=fail_inconclusive)))

    assert session_rule(results(False)) == PLAIN
    assert session_rule(results(True)) == FailRule(fail_inconclusive=True)
    assert session_rule(results(False), fail_inconclusive=True, strict=True) == FailRule(True, True)

    row = Row("t", "compared", verdicts=[OPEN])
    assert Comparison([row], None, 0.05, "bh").failed() == []
    failing = Comparison([row], None, 0.05, "bh", rule=session_rule(results(True)))
    assert failing.failed() == [row]
    from pytest_specdec.output.compare import summary_lines

    said = "1 test(s) with a gated verdict still inconclusive, failed as --specdec-fail-inconclusive fails them: t"
    assert any(said in line for line in summary_lines(failing, "OLD", "NEW"))
    assert not any("still inconclusive" in line for line in summary_lines(Comparison([row], None, 0.05, "bh"),
                                                                           "OLD", "NEW"))

    ab = ABRow("a", ab_judgement(speedup="inconclusive"))
    assert ABComparison([ab], 0.05, "bh").failed() == []
    assert ABComparison([ab], 0.05, "bh", rule=FailRule(fail_inconclusive=True)).failed() == [ab]
    assert ABComparison([ab], 0.05, "bh", rule=FailRule(fail_inconclusive=True)).still_open == ["a"]
    assert failing.still_open == ["t"] and Comparison([row], None, 0.05, "bh").still_open == []
