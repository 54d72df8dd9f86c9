"""The A/B compare use case: an A/B session's results read back, each A/B test judged again, candidate against base
pair by pair, through the A/B gate's own functions (`gate.ab_session.pair_verdicts`, its BH/Holm `adjust`, its
test-end rule), and two A/B sessions set side by side (`compare_ab`); and the base's night of an A/B test
(`base_night`), which the history follows beside the candidate night by night. `output/ab_results.py` renders the
`gate.comparison.ABComparison` it returns.

A results test's `ab` section (`output.results.ab_entry`) holds every run of its three or four arms with its arm's
name, its thresholds, gated metrics and looks: all a second judgement needs. Nothing here re-implements a statistic.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from pytest_specdec.gate.comparison import ABComparison, ABRow
from pytest_specdec.output.schema import Results, ResultsError, TestEntry

if TYPE_CHECKING:
    from pytest_specdec.gate.ab_session import ABJudgement
    from pytest_specdec.gate.check import FailRule
    from pytest_specdec.gate.nights import Night
    from pytest_specdec.measure.record import ArmRun

#: The arms of an A/B test's runs, as the results name them (the candidate's spec runs are `candidate`).
AB_ARMS = ("reference", "base_reference", "base", "candidate")


def is_ab(results: Results) -> bool:
    """Whether the file is an A/B session's: some test has an `ab` section."""
    return any(t.ab is not None for t in results.tests)


def ab_runs(test: TestEntry, where: str) -> dict[str, list[ArmRun]]:
    """An A/B test's runs by arm (`AB_ARMS`), each checked as a stored run is (`record.run_problem`); a run that
    cannot be read is a ResultsError naming where it is."""
    from pytest_specdec.measure.record import ArmRun, run_problem

    out: dict[str, list[ArmRun]] = {arm: [] for arm in AB_ARMS}
    for i, run in enumerate(test.ab.runs if test.ab is not None else ()):
        arm = run.get("arm") if isinstance(run, Mapping) else None
        if arm not in out:
            raise ResultsError(f"{where}.ab.runs[{i}].arm is {arm!r}, not one of {', '.join(AB_ARMS)}")
        problem = run_problem(run)
        if problem:
            raise ResultsError(f"{where}.ab.runs[{i}]{problem}")
        out[arm].append(ArmRun.from_entry(run))
    for arm_runs in out.values():
        arm_runs.sort(key=lambda r: r.index)
    return out


def base_night(test: TestEntry, where: str) -> Night | None:
    """The base's night of an A/B test: its spec runs against its own reference (the base install's, or the shared
    one), each pair's speedup by the one pairing rule (`measure.record.speedup_per_pair`), as the candidate's
    `TestEntry.night` holds its own; None outside A/B."""
    from pytest_specdec.gate.nights import Night
    from pytest_specdec.measure.record import speedup_per_pair

    if test.ab is None:
        return None
    runs = ab_runs(test, where)
    refs = runs["base_reference"] or runs["reference"]
    return Night(tuple(refs), tuple(runs["base"]), tuple(speedup_per_pair(refs, runs["base"])), test.night.started)


def judge_again(results: Results, where: str, *, override: Mapping[str, float], alpha: float, multiplicity: str
                ) -> dict[str, ABJudgement]:
    """Each A/B test of a file judged again from its runs: at the look it ended on, with the thresholds it recorded
    (``override``, the command line's, on top) and its gated metrics, then BH/Holm over the file's whole A/B family
    as the session's end adjusts it (`gate.ab_session.adjust`), each test's gated drift (`gate.drift`) in it as it was
    in the session's."""
    from pytest_specdec.errors import ConfigError
    from pytest_specdec.gate.ab_session import AB_METRICS, ABJudgement, ABPlan, adjust, pair_verdicts
    from pytest_specdec.gate.check import Look
    from pytest_specdec.gate.thresholds import from_dict, on_top

    checks: list[tuple[str, ABJudgement]] = []
    for i, t in enumerate(results.tests):
        if t.ab is None:
            continue
        at = f"{where}: tests[{i}]"
        ab = t.ab
        try:
            thresholds = on_top(from_dict(ab.thresholds, f"{at}.ab.thresholds"), override)
        except ConfigError as exc:
            raise ResultsError(str(exc)) from None
        runs = ab_runs(t, at)
        metrics = ab.gate or AB_METRICS
        looks, max_looks = list(ab.looks), ab.max_looks
        refs = (runs["base_reference"], runs["reference"]) if runs["base_reference"] else None
        plan = ABPlan(ab.method, str(ab.base.get("draft")), str(ab.candidate.get("draft")), {}, thresholds,
                      metrics=metrics, max_looks=max_looks, checked=ab.checked, alpha=alpha)
        raw = tuple(pair_verdicts(runs["base"], runs["candidate"], thresholds, alpha, metrics=metrics,
                                  references=refs, look=max(1, min(len(looks), max_looks)), max_looks=max_looks,
                                  reference=runs["reference"]))
        # each look the pairs it recorded, the last judged again (a file without looks: the pairs its verdicts saw)
        last = looks[-1] if looks else max((v.n_now or 0 for v in raw), default=0)
        taken = (*(Look(n) for n in looks[:-1]), Look(last, raw))
        # its drift within the session as judged (the candidate's runs): its gated verdicts join the family again
        drift = t.drift_judged(at)
        checks.append((t.nodeid, ABJudgement(plan, taken,
                                             drift=None if drift is None else replace(drift, adjusted=None))))
    return dict(adjust(checks, final=True, multiplicity=multiplicity, alpha=alpha))


def compare_ab(old: Results | None, new: Results, *, override: Mapping[str, float], alpha: float, multiplicity: str,
               old_name: str = "OLD", new_name: str = "NEW", rule: FailRule | None = None) -> ABComparison:
    """NEW's A/B tests judged again (`judge_again`), each beside OLD's same test when OLD is an A/B session's
    results too (None: NEW alone, its verdicts shown again); failed by ``rule`` (default: NEW's session's)."""
    now = judge_again(new, new_name, override=override, alpha=alpha, multiplicity=multiplicity)
    then = {} if old is None else judge_again(old, old_name, override=override, alpha=alpha, multiplicity=multiplicity)
    rows = []
    for t in new.tests:
        if t.nodeid in now:
            rows.append(ABRow(t.nodeid, now[t.nodeid], then.get(t.nodeid),
                              "judged" if old is None or t.nodeid in then else f"only in {new_name}"))
        else:
            rows.append(ABRow(t.nodeid, None, status="not an A/B test",
                              reason=f"{new_name} ran it without a base (its method has none, or it ran the "
                                     "reference alone)"))
    rows += [ABRow(n, None, c, f"only in {old_name}") for n, c in then.items() if n not in now]
    from pytest_specdec.app.compare import session_rule

    return ABComparison(rows, alpha, multiplicity, rule=rule or session_rule(new))
