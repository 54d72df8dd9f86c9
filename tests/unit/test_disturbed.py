"""The disturbed-run rule (`validity.disturbed`, applied per arm by `runner.mark_disturbed`): one run that
something else on the machine slowed leaves the verdicts with its reason; a slow session, a slow arm, or a run
already invalid is not called disturbed."""

from __future__ import annotations

from typing import Any

import pytest
from factories import measured_run, run_metrics, spec_figures

from pytest_specdec.measure.record import speedup_per_pair
from pytest_specdec.measure.runner import RunRecord, mark_disturbed
from pytest_specdec.measure.validity import DISTURBED, ValidityRules, disturbed


def test_one_slow_run_among_its_arm_is_disturbed() -> None:
    # A fresh-clone quickstart's reference runs: the 111 came while the machine was busy with other work.
    found = disturbed([278.0, 308.0, 111.0, 310.0], 0.3)
    assert list(found) == [2]
    assert found[2].startswith(f"{DISTURBED}: 111.0 tok/s, 64% below the median of the arm's other runs (308.0")


@pytest.mark.parametrize("tok_s", [
    [100.0, 98.0, 75.0, 101.0],  # 24 % below: within the limit
    [50.0, 49.0, 51.0, 50.5],  # a slow session: every run alike
    [100.0, 40.0],  # two runs cannot say which one is off
    [100.0, 100.0, 50.0, 50.0, 100.0, 50.0],  # half the runs slow: the arm is slow, not disturbed
])
def test_what_is_not_a_disturbance(tok_s: list[float]) -> None:
    assert disturbed(tok_s, 0.3) == {}


def test_only_slower_runs_and_not_when_turned_off() -> None:
    assert disturbed([100.0, 100.0, 300.0], 0.3) == {}  # a faster run is not a disturbance
    assert disturbed([278.0, 308.0, 111.0, 310.0], 0.0) == {}  # max_run_slowdown = 0: the rule is off


def test_invalid_runs_neither_count_nor_are_judged() -> None:
    assert disturbed([100.0, None, 20.0], 0.3) == {}  # two valid runs left
    assert list(disturbed([100.0, None, 20.0, 101.0], 0.3)) == [2]


def _record(arm: Any, index: int, tok_s: float, invalid: list[str] | None = None,
            acceptance_length: float | None = None) -> RunRecord:
    spec = None if acceptance_length is None else spec_figures((acceptance_length - 1) / 3)
    return measured_run(arm, index, tok_s, metrics=run_metrics(tok_s, spec=spec), invalid=tuple(invalid or ()))


def test_the_rule_is_applied_anew_after_every_look_and_drops_the_pair() -> None:
    rules = ValidityRules()
    runs = [_record("reference", i, x) for i, x in enumerate([300.0, 305.0, 150.0])]
    assert [r.index for r in mark_disturbed(runs, rules)] == [2]
    assert not runs[2].valid and runs[2].invalid[0].startswith(DISTURBED)
    assert mark_disturbed(runs, rules) == [] and not runs[2].valid  # marked once, kept
    spec = [_record("spec", i, 600.0) for i in range(3)]
    assert speedup_per_pair([r.record for r in runs], [r.record for r in spec])[2] is None  # its pair leaves
    # Later runs at the same speed as the third: the arm is slow, not one run disturbed.
    runs += [_record("reference", i, 150.0) for i in (3, 4, 5)]
    assert mark_disturbed(runs, rules) == [] and all(r.valid for r in runs)
    # A run invalid for another reason keeps that reason, and is not judged.
    hung = [_record("spec", 0, 10.0, ["server hung"]), *(_record("spec", i, 600.0) for i in (1, 2, 3))]
    assert mark_disturbed(hung, rules) == [] and hung[0].invalid == ("server hung",)


def test_a_spec_run_that_accepted_less_is_slower_not_disturbed() -> None:
    """A spec run's tokens per step follow its acceptance: the rule compares the steps' rate (tok/s per
    acceptance length), which a lower acceptance leaves alone and a disturbance lowers."""
    rules = ValidityRules()
    # 1769 tok/s at acceptance length 2.0 against ~2820 at 3.2: the same steps, fewer tokens each.
    runs = [_record("spec", 0, 1769.0, acceptance_length=2.0), _record("spec", 1, 2802.0, acceptance_length=3.1),
            _record("spec", 2, 2835.0, acceptance_length=3.2)]
    assert mark_disturbed(runs, rules) == [] and all(r.valid for r in runs)
    # The same acceptance, a third of the speed: disturbed, and said in the steps' rate.
    runs[0] = _record("spec", 0, 945.0, acceptance_length=3.1)
    assert [r.index for r in mark_disturbed(runs, rules)] == [0]
    assert "tok/s per acceptance length" in runs[0].invalid[0]
