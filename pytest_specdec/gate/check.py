"""One test's comparison with its stored baseline, and what it decides at the test's end.

The session (pytest wiring) decides when to compare; this module holds the record of a comparison, its
outcome at the test's end (`TestEnd`: typed, worded by `output/wording.py`) and the family-wide p-value
adjustment over every test's verdicts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pytest_specdec.gate.kinds import GATED, INCONCLUSIVE, NOT_COMPARABLE, REGRESSED, SHOWN, Outcome, Status

if TYPE_CHECKING:
    from pytest_specdec.gate.drift import Drift
    from pytest_specdec.gate.nights import Night
    from pytest_specdec.gate.stats import Thresholds, Verdict
    from pytest_specdec.measure.explain import Split

# `kinds.Status`: how a test met its stored baseline (compared with it, none stored, stored but measured under
# other conditions, or unreadable); `kinds.Outcome`: what a test's end decides (nothing to say, or why it fails).



@dataclass(frozen=True)
class Look:
    """One look a gate took at a test: the runs per arm (pairs, in an A/B) it judged, their verdicts before the
    family's adjustment, and what it decided: the runs per arm of the next look (None: this look was its last),
    the runs planned but not spent and why (a look that stopped before the planned runs), and a line for the
    terminal (why it looks again, or why it stops early; "" for none)."""

    runs: int
    raw: tuple[Verdict, ...] = ()
    next_runs: int | None = None
    unspent: int = 0
    stop_reason: str = ""
    line: str = ""


@dataclass(frozen=True)
class Plan:
    """A test's comparison with its stored baseline as fixed at its start: the file, how tonight met it, what
    its verdicts use (level, gated family, thresholds, the looks planned)."""

    path: Path
    status: Status
    checked: bool  # specdec_verdicts(check=False): judged and shown, never failed
    comparability: Mapping[str, Any]
    under_test: Mapping[str, Any]
    baseline: Mapping[str, Any] | None = None  # the stored baseline file's data (None: none stored, or unreadable)
    differs: Mapping[str, tuple[Any, Any]] = field(default_factory=dict)  # not-comparable: what differs
    error: str | None = None  # why the baseline file could not be read
    alpha: float = 0.05  # one-sided, split over the looks: the CIs of Δ are two-sided 1 - 2·alpha/max_looks
    gate: tuple[str, ...] = ()  # the gated family's metrics for this test
    thresholds: Thresholds | None = None
    max_looks: int = 1  # the looks planned: each at alpha / max_looks
    #: Other machines whose stored nights stand in for this machine's missing baseline (their folder names): only
    #: the portable metrics are judged against them (`verdicts.evaluate`). Empty: the baseline is this machine's.
    machines: tuple[str, ...] = ()


class Looked:
    """What a judgement reads of the looks it took and its verdicts, the nightly's (`Judgement`) and the A/B's
    (`ab_session.ABJudgement`) alike."""

    looks_taken: tuple[Look, ...]
    verdicts: tuple[Verdict, ...]
    final: tuple[Verdict, ...] | None
    drift: Drift | None

    @property
    def raw(self) -> tuple[Verdict, ...]:
        """The last look's verdicts, before the family's adjustment."""
        return self.looks_taken[-1].raw if self.looks_taken else ()

    @property
    def looks(self) -> list[int]:
        """Runs (pairs) per arm at each look taken."""
        return [look.runs for look in self.looks_taken]

    @property
    def unspent(self) -> int:
        """Runs (pairs) per arm planned but not spent: the stop rule saw no use in them."""
        return self.looks_taken[-1].unspent if self.looks_taken else 0

    @property
    def stop_reason(self) -> str:
        return self.looks_taken[-1].stop_reason if self.looks_taken else ""

    def shown(self) -> list[Verdict]:
        """The verdicts as they stand: adjusted over the session's family, else at the test's end, else raw."""
        return list(self.final if self.final is not None else (self.verdicts or self.raw))


@dataclass(frozen=True)
class Judgement(Looked):
    """One test's judgement against its stored baseline: its plan, tonight's runs, each look taken, its verdicts
    at its end and after the session's family adjustment. Frozen: each step of the gate makes a new one."""

    plan: Plan
    night: Night | None = None  # tonight's runs, typed: what the verdicts judge
    looks_taken: tuple[Look, ...] = ()
    deviation: float | None = None  # log(tonight's reference speed ÷ the baseline's): one term of the machine factor
    #: the raw verdicts judged again at the session's end with its machine factor (None: not judged again)
    rejudged: tuple[Verdict, ...] | None = None
    verdicts: tuple[Verdict, ...] = ()  # adjusted at the test's end (p-values unseen = 1)
    final: tuple[Verdict, ...] | None = None  # adjusted over the whole session's family
    end: TestEnd | None = None  # what the test's end decided
    #: its drift within the session (`gate.drift`): its gated verdicts are members of the gated family
    drift: Drift | None = None

    @property
    def raw(self) -> tuple[Verdict, ...]:
        """The verdicts before the family's adjustment: the last look's, or judged again at the session's end."""
        return self.rejudged if self.rejudged is not None else super().raw

    @property
    def max_looks(self) -> int:
        return self.plan.max_looks

    @property
    def failed(self) -> bool:
        """Whether the test's end failed it on its verdicts (a regression, or inconclusive under
        --specdec-fail-inconclusive): a regression found only at the session's end is then not news."""
        return self.end is not None and self.end.fails and self.end.outcome in (REGRESSED, INCONCLUSIVE)

    def split(self) -> Split | None:
        """The speedup's change since the baseline split into acceptance and step time (`verdicts.baseline_split`);
        None where the baseline is other machines' nights: their speedup says nothing about this machine's."""
        from pytest_specdec.gate.verdicts import baseline_split

        return None if self.plan.machines else baseline_split(self.plan.baseline, self.night)

    def under_test_diff(self) -> dict[str, list[Any]]:
        """What changed under test since the baseline's last session (the report shows it per test)."""
        if not self.plan.baseline:
            return {}
        from pytest_specdec.gate.baselines import diff

        return {k: [a, b] for k, (a, b) in diff(self.plan.baseline.get("under_test", {}),
                                                dict(self.plan.under_test)).items()}


@dataclass(frozen=True)
class TestEnd:
    """What a test's end decides from its verdicts so far; `output.wording.test_end_message` words it."""

    __test__ = False  # not a pytest test class

    outcome: Outcome
    fails: bool  # the outcome fails the test (else a warning, or nothing for "pass"); a failing drift aside
    where: str = ""  # the baseline file, as the checkout names it
    command: str = ""  # the command that creates (missing) or accepts (regressed) the baseline
    open: tuple[Verdict, ...] = ()  # the gated verdicts still inconclusive
    #: the gated drift verdicts that fail the test (`gate.drift`, judged within tonight): each regressed one, and each
    #: inconclusive one under --specdec-fail-inconclusive, whatever the outcome against the baseline says
    drifted: tuple[Verdict, ...] = ()
    #: the gated drift verdicts still inconclusive that pass the test (no --specdec-fail-inconclusive): a warning
    drift_open: tuple[Verdict, ...] = ()

    @property
    def fails_test(self) -> bool:
        """Whether the test fails: on its outcome, or on a gated drift (`drifted`)."""
        return self.fails or bool(self.drifted)


PASSED = TestEnd("pass", False)


@dataclass(frozen=True)
class FailRule:
    """The one rule for "does this test fail?": what a test's verdicts and how it met its baseline decide under the
    session's options. The nightly and the A/B test ends, their late regressions at the session's end, `compare`
    and the A/B's `compare` all ask it, so a file judged again fails exactly the tests the session failed.

    A test that opted out (``check=False``) never fails on its verdicts; a shown metric never fails a test. A gated
    drift (``drift``: judged within tonight, no baseline needed) that regressed, or that is still inconclusive under
    ``fail_inconclusive`` (as every other gated metric), fails it whatever its baseline and its ``check`` say: the
    end's outcome (and ``fails``) stays the baseline's, the drift in ``drifted`` (`TestEnd.fails_test`: either fails
    the test)."""

    strict: bool = False  # --specdec-strict: a test not comparable with its baseline fails
    fail_inconclusive: bool = False  # --specdec-fail-inconclusive: a gated verdict still inconclusive fails
    replacing: bool = False  # --update-baselines=all: every baseline is replaced, so nothing is judged
    #: a missing baseline fails (not while baselines are recorded, nor on a machine with none of its own unless
    #: strict: the judge sets it; a file judged again has no missing baselines to fail)
    missing_fails: bool = False

    def decide(self, *, checked: bool, status: Status, verdicts: Sequence[Verdict], dead: bool = False,
               portable_only: bool = False, drift: Sequence[Verdict] = ()) -> TestEnd:
        """The test's end: its outcome, whether it fails, and its gated verdicts still open. ``dead``: an arm
        without a valid run, which fails whatever the rest says. ``portable_only``: the baseline is other
        machines' nights, so only acceptance was judged: a regression there fails, and then the test's own
        baseline is missing as for a test without one. ``drift``: its drift verdicts (`drift.Drift.gated`)."""
        end = self._against_baseline(checked=checked, status=status, verdicts=verdicts, dead=dead,
                                     portable_only=portable_only)
        failing = (REGRESSED, INCONCLUSIVE) if self.fail_inconclusive else (REGRESSED,)
        drifted = tuple(v for v in drift if v.family == GATED and v.verdict in failing)
        open_ = () if self.fail_inconclusive else tuple(v for v in drift
                                                         if v.family == GATED and v.verdict == INCONCLUSIVE)
        return dataclasses.replace(end, drifted=drifted, drift_open=open_) if drifted or open_ else end

    def _against_baseline(self, *, checked: bool, status: Status, verdicts: Sequence[Verdict], dead: bool,
                          portable_only: bool) -> TestEnd:
        if dead:
            return TestEnd("error", True)
        if not checked:
            return PASSED
        if status == "error":  # --update-baselines replaces an unreadable file (the summary says so)
            return PASSED if self.replacing else TestEnd("error", True)
        if status == "missing":
            return TestEnd("missing", True) if self.missing_fails else PASSED
        if self.replacing:
            return PASSED
        if status == NOT_COMPARABLE:
            return TestEnd(NOT_COMPARABLE, self.strict)
        gated = [v for v in verdicts if v.family == GATED]
        if any(v.verdict == REGRESSED for v in gated):
            return TestEnd(REGRESSED, True)
        if portable_only:
            return TestEnd("missing", True) if self.missing_fails else PASSED
        open_ = tuple(v for v in gated if v.verdict == INCONCLUSIVE)
        if open_:
            return TestEnd(INCONCLUSIVE, self.fail_inconclusive, open=open_)
        return PASSED


@dataclass(frozen=True)
class Adjusted:
    """A test's members of the session's families after BH/Holm: its verdicts (against its baseline, or the base)
    and its drift verdicts (`drift.Drift.members`)."""

    verdicts: tuple[Verdict, ...] = ()
    drift: tuple[Verdict, ...] = ()

    def drift_of(self, c: Judged) -> Drift | None:
        """The judgement's drift with its members as adjusted here (None: it has none)."""
        return None if c.drift is None else c.drift.with_family(self.drift)


def late_drift(at_end: TestEnd | None, now: TestEnd) -> bool:
    """Whether a gated drift failed the test only once the whole family was known: news at the session's end, which
    fails the session as a late regression does."""
    return bool(now.drifted) and not (at_end is not None and at_end.drifted)


def adjusted(checks: Sequence[tuple[str, Judgement]], nodeid: str, *, final: bool, multiplicity: str, alpha: float,
             gated_size: int, family_size: int) -> Adjusted:
    """This test's verdicts and drift members after BH/Holm over every raw member so far (`adjusted_all`)."""
    return adjusted_all(checks, final=final, multiplicity=multiplicity, alpha=alpha, gated_size=gated_size,
                        family_size=family_size).get(nodeid, Adjusted())


class Judged(Protocol):
    """What the family adjustment reads of a test's judgement: a nightly `Judgement`, or an A/B session's."""

    @property
    def raw(self) -> Sequence[Verdict]: ...

    @property
    def max_looks(self) -> int: ...

    @property
    def drift(self) -> Drift | None: ...


def members(c: Judged) -> tuple[Verdict, ...]:
    """A test's members of the session's families: its raw verdicts, then its drift verdicts as judged."""
    return (*c.raw, *(c.drift.members if c.drift is not None else ()))


def adjusted_all(checks: Sequence[tuple[str, Judged]], *, final: bool, multiplicity: str, alpha: float,
                 gated_size: int, family_size: int) -> dict[str, Adjusted]:
    """Every test's verdicts and gated drift verdicts after BH/Holm over every raw member so far (`members`), each
    family (gated, shown) on its own; padded with p=1 to the family size collected, unless ``final``."""
    from pytest_specdec.gate.scale import kind_of
    from pytest_specdec.gate.sequential import adjust, detectable

    order = [(n, c) for n, c in checks if members(c)]
    flat = [v for _, c in order for v in members(c)]
    looks_of = [c.max_looks for _, c in order for _ in members(c)]
    out = list(flat)
    sizes = {GATED: gated_size, SHOWN: family_size - gated_size}
    for family in (GATED, SHOWN):
        idx = [i for i, v in enumerate(flat) if v.family == family]
        part = [flat[i] for i in idx]
        with_p = sum(1 for v in part if v.p is not None and v.verdict != NOT_COMPARABLE)
        size = None if final else max(sizes[family], with_p)
        for i, v in zip(idx, adjust(part, multiplicity, alpha, family_size=size), strict=True):
            out[i] = v
        # What a lone regression must clear: BH/Holm over m tests is alpha/m for the smallest p.
        m = max(1, size or with_p)
        for i in idx:
            v, c_looks = out[i], looks_of[i]
            if v.var_fixed is not None and v.var_run is not None and v.threshold is not None and v.n_now:
                mde = detectable(kind_of(v.metric), v.threshold, v.var_fixed + v.var_run / v.n_now,
                                 v.df or 1.0, alpha / (c_looks * m))
                out[i] = dataclasses.replace(v, mde=mde)
    by_test: dict[str, Adjusted] = {}
    start = 0
    for n, c in order:
        raw, size = len(c.raw), len(members(c))
        by_test.setdefault(n, Adjusted(tuple(out[start:start + raw]), tuple(out[start + raw:start + size])))
        start += size
    return by_test


def machine_log(deviations: Iterable[float | None]) -> float | None:
    """The machine factor (log) from every test compared so far (the session's, once all are in)."""
    devs = [d for d in deviations if d is not None]
    return sum(devs) / len(devs) if devs else None
