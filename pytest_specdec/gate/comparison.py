"""A comparison of two sessions' results, judged: per test its row (its verdicts, or why it has none) and which
tests and sweeps fail it, by the session's one failure rule (`check.FailRule`); the A/B's rows the same way.

`pytest-specdec compare` builds them (`app/compare.py`, `app/ab_compare.py`); `output/compare.py` and
`output/ab_results.py` word them. Typed outcomes only: nothing here reads a file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_specdec.gate.check import FailRule
from pytest_specdec.gate.drift import gated_drift
from pytest_specdec.gate.kinds import GATED, INCONCLUSIVE, NOT_COMPARABLE, REGRESSED, Status

if TYPE_CHECKING:
    from pytest_specdec.gate.ab_session import ABJudgement
    from pytest_specdec.gate.check import TestEnd
    from pytest_specdec.gate.crossover_gate import SweepOutcome
    from pytest_specdec.gate.drift import Drift
    from pytest_specdec.gate.machine import MachineFactor
    from pytest_specdec.gate.stats import Verdict
    from pytest_specdec.measure.explain import Split

#: The failure rule without options: a session run without --specdec-fail-inconclusive, judged without --strict.
PLAIN = FailRule()


@dataclass(frozen=True)
class Row:
    """One test of the comparison: its verdicts (gated and shown), or why it has none. Built once its test is
    judged (`app.compare`), and only read after."""

    nodeid: str
    status: str  # compared | not-comparable | only in OLD | only in NEW | no runs | not judged
    verdicts: tuple[Verdict, ...] = ()
    fields: Mapping[str, tuple[Any, Any]] = field(default_factory=dict)  # not-comparable: what differs
    reason: str = ""
    checked: bool = True  # False: NEW's test opted out (check=False): its verdicts are shown, never failed
    dead: bool = False  # NEW has an arm without a valid run: the plugin fails the test for it
    split: Split | None = None  # the speedup's change OLD → NEW in acceptance and step time (`measure.explain`)
    #: NEW's drift within its session (`gate.drift`), its gated verdicts adjusted with the comparison's gated family
    drift: Drift | None = None

    def end(self, rule: FailRule = PLAIN) -> TestEnd:
        """The session's rule (`gate.check.FailRule`: the comparison's, `Comparison.rule`) over NEW's verdicts and
        gated drift; a test with no baseline to compare with (only in NEW, no runs) is judged as missing, which
        fails it only for a dead arm or its drift."""
        status: Status = ("compared" if self.status == "compared" else NOT_COMPARABLE
                          if self.status == NOT_COMPARABLE else "missing")
        return rule.decide(checked=self.checked, status=status, verdicts=self.verdicts, dead=self.dead,
                           drift=gated_drift(self.drift))

    def failed(self, rule: FailRule = PLAIN) -> bool:
        """Whether this test fails the comparison, as `end` decides."""
        return self.end(rule).fails_test

    @property
    def gated(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.family == GATED]

    def drifted(self, rule: FailRule = PLAIN) -> bool:
        """Whether a gated drift of NEW fails the test by the same rule (`TestEnd.drifted`: the session failed the
        test for it, whatever its check)."""
        return bool(self.end(rule).drifted)

    @property
    def regressed(self) -> bool:
        return any(v.verdict == REGRESSED for v in self.gated)


@dataclass
class Comparison:
    """Every test of both files, in NEW's order then OLD's leftovers, and the session-level figures."""

    rows: list[Row]
    machine: MachineFactor | None
    alpha: float
    multiplicity: str
    #: NEW's concurrency sweeps, judged as the session judges them: a gated regression or an error fails
    crossovers: list[SweepOutcome] = field(default_factory=list)
    #: against stored baselines: the machines' folders NEW's tests were judged against (their path, their name)
    machines: tuple[tuple[str, str], ...] = ()
    #: the failure rule the tests are judged by: NEW's session's --specdec-fail-inconclusive (or compare's), and
    #: compare's --strict
    rule: FailRule = PLAIN

    @property
    def regressed(self) -> list[Row]:
        """Every test with a regressed gated metric, those that opted out included."""
        return [r for r in self.rows if r.regressed]

    def failed(self) -> list[Row]:
        """The tests that make the comparison fail (exit 1), as `Row.failed` says under the comparison's rule."""
        return [r for r in self.rows if r.failed(self.rule)]

    @property
    def drifted(self) -> list[str]:
        """The tests whose gated drift fails them, as `Row.drifted` says (the session failed them for it)."""
        return [r.nodeid for r in self.rows if r.drifted(self.rule)]

    @property
    def still_open(self) -> list[str]:
        """The tests a gated verdict still inconclusive fails (the rule's --specdec-fail-inconclusive)."""
        return [r.nodeid for r in self.rows if _fails_open(r.end(self.rule))]

    @property
    def failed_sweeps(self) -> list[SweepOutcome]:
        """The sweeps that make the comparison fail (exit 1) as they fail the session: a gated regression, an error."""
        return [x for x in self.crossovers if x.failed]


@dataclass(frozen=True)
class ABRow:
    """One A/B test of the comparison: NEW's candidate-vs-base verdicts judged again, OLD's beside them."""

    nodeid: str
    check: ABJudgement | None  # NEW's, judged again (None: the test is in OLD only)
    old: ABJudgement | None = None  # OLD's, judged again (None: OLD has no A/B comparison of the test)
    status: str = "judged"  # judged | only in OLD | only in NEW | not an A/B test
    reason: str = ""

    def end(self, rule: FailRule = PLAIN) -> TestEnd | None:
        """As the plugin decides it (`gate.check.FailRule`: the comparison's), None for a test in OLD only."""
        return None if self.check is None else rule.decide(
            checked=self.check.checked, status="compared", verdicts=self.check.shown(),
            drift=gated_drift(self.check.drift))

    def failed(self, rule: FailRule = PLAIN) -> bool:
        """As the plugin fails it: a gated regression of a test that did not opt out, or its gated drift (and under
        --specdec-fail-inconclusive a gated verdict still inconclusive)."""
        end = self.end(rule)
        return end is not None and end.fails_test

    def drifted(self, rule: FailRule = PLAIN) -> bool:
        """Whether NEW's gated drift fails the test by the same rule (`TestEnd.drifted`)."""
        end = self.end(rule)
        return end is not None and bool(end.drifted)


@dataclass
class ABComparison:
    """Every A/B test of NEW (and OLD's leftovers), judged again as the session judged them."""

    rows: list[ABRow]
    alpha: float
    multiplicity: str
    notes: list[str] = field(default_factory=list)
    #: the failure rule: NEW's session's --specdec-fail-inconclusive, or compare's
    rule: FailRule = PLAIN

    def failed(self) -> list[ABRow]:
        return [r for r in self.rows if r.failed(self.rule)]

    @property
    def drifted(self) -> list[str]:
        """The tests whose gated drift fails them (as it stands after the comparison's adjustment), by the failure
        rule (`ABRow.drifted`)."""
        return [r.nodeid for r in self.rows if r.drifted(self.rule)]

    @property
    def still_open(self) -> list[str]:
        """The tests a gated verdict still inconclusive fails (the rule's --specdec-fail-inconclusive)."""
        return [r.nodeid for r in self.rows if _fails_open(r.end(self.rule))]


def _fails_open(end: TestEnd | None) -> bool:
    """Whether a test ends failed on a gated verdict still inconclusive (`TestEnd`: its outcome, under
    --specdec-fail-inconclusive), not on a regression or a drift."""
    return end is not None and end.outcome == INCONCLUSIVE and end.fails
