"""One test's comparison with its stored baseline, and what it decides at the test's end.

The session (pytest wiring) decides when to compare; this module holds the record of a comparison, its
outcome at the test's end (`TestEnd`: typed, worded by `output/wording.py`) and the family-wide p-value
adjustment over every test's verdicts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pytest_specdec.gate.kinds import GATED, INCONCLUSIVE, NOT_COMPARABLE, REGRESSED, SHOWN, Outcome, Status

if TYPE_CHECKING:
    from pytest_specdec.gate.nights import Night
    from pytest_specdec.gate.stats import Thresholds, Verdict

# `kinds.Status`: how a test met its stored baseline (compared with it, none stored, stored but measured under
# other conditions, or unreadable); `kinds.Outcome`: what a test's end decides (nothing to say, or why it fails).



@dataclass
class BaselineCheck:
    """One test's comparison with its stored baseline."""

    path: Path
    status: Status
    check: bool
    comparability: dict[str, Any]
    under_test: dict[str, Any]
    night: Night | None = None  # tonight's runs, typed: what the verdicts judge
    baseline: dict[str, Any] | None = None
    fields: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # not-comparable: what differs
    raw: list[Verdict] = field(default_factory=list)  # before the session's multiplicity adjustment
    verdicts: list[Verdict] = field(default_factory=list)  # adjusted at the test's end (p-values unseen = 1)
    final: list[Verdict] | None = None  # adjusted over the whole session's family
    looks: list[int] = field(default_factory=list)  # runs per arm at each look taken
    max_looks: int = 1
    failed: bool = False
    error: str | None = None
    alpha: float = 0.05  # one-sided, split over the looks: the CIs of Δ are two-sided 1 - 2·alpha/max_looks
    gate: tuple[str, ...] = ()  # the gated family's metrics for this test
    unspent: int = 0  # runs per arm planned but not spent: no further look could change a gated verdict
    stop_reason: str = ""
    deviation: float | None = None  # log(tonight's reference speed ÷ the baseline's): one term of the machine factor
    thresholds: Thresholds | None = None  # what its verdicts used (again when the machine factor is final)

    def shown(self) -> list[Verdict]:
        return self.final if self.final is not None else (self.verdicts or self.raw)

    def under_test_diff(self) -> dict[str, list[Any]]:
        """What changed under test since the baseline's last session (the report shows it per test)."""
        if not self.baseline:
            return {}
        from pytest_specdec.gate.baselines import diff

        return {k: [a, b] for k, (a, b) in diff(self.baseline.get("under_test", {}), self.under_test).items()}

    def to_dict(self) -> dict[str, Any]:
        from pytest_specdec.gate.thresholds import to_dict as thresholds_dict
        from pytest_specdec.gate.verdicts import gated_with

        shown = self.shown()
        path = str(self.path)
        sessions = len(self.baseline["sessions"]) if self.baseline else 0
        return {
            "path": path, "status": self.status, "checked": self.check, "sessions": sessions,
            "not_comparable_fields": {k: [a, b] for k, (a, b) in self.fields.items()},
            "looks": self.looks, "max_looks": self.max_looks, "unspent_runs": self.unspent,
            "stop_reason": self.stop_reason, "gate": list(self.gate),
            "inconclusive_gated": [v.metric for v in gated_with(shown, INCONCLUSIVE)],
            "machine_deviation": self.deviation,
            "alpha": self.alpha, "ci_level": 1 - 2 * self.alpha / max(1, self.max_looks),
            "adjusted": "session" if self.final is not None else "test-end",
            "under_test": self.under_test,
            "under_test_diff": self.under_test_diff(),
            "comparability": self.comparability,
            "thresholds": None if self.thresholds is None else thresholds_dict(self.thresholds),
            **({"error": self.error} if self.error else {}),
        }


@dataclass(frozen=True)
class TestEnd:
    """What a test's end decides from its verdicts so far; `output.wording.test_end_message` words it."""

    __test__ = False  # not a pytest test class

    outcome: Outcome
    fails: bool  # the test fails (else a warning, or nothing for "pass")
    where: str = ""  # the baseline file, as the checkout names it
    command: str = ""  # the command that creates (missing) or accepts (regressed) the baseline
    open: tuple[Verdict, ...] = ()  # the gated verdicts still inconclusive


PASSED = TestEnd("pass", False)


@dataclass(frozen=True)
class FailRule:
    """The one rule for "does this test fail?": what a test's verdicts and how it met its baseline decide under the
    session's options. The nightly and the A/B test ends, their late regressions at the session's end, `compare`
    and the A/B's `compare` all ask it, so a file judged again fails exactly the tests the session failed.

    A test that opted out (``check=False``) never fails on its verdicts; a shown metric never fails a test."""

    strict: bool = False  # --specdec-strict: a test not comparable with its baseline fails
    fail_inconclusive: bool = False  # --specdec-fail-inconclusive: a gated verdict still inconclusive fails
    replacing: bool = False  # --update-baselines=all: every baseline is replaced, so nothing is judged
    #: a missing baseline fails (not while baselines are recorded, nor on a machine with none of its own unless
    #: strict: the judge sets it; a file judged again has no missing baselines to fail)
    missing_fails: bool = False

    def decide(self, *, checked: bool, status: Status, verdicts: Sequence[Verdict], dead: bool = False) -> TestEnd:
        """The test's end: its outcome, whether it fails, and its gated verdicts still open. ``dead``: an arm
        without a valid run, which fails whatever the rest says."""
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
        open_ = tuple(v for v in gated if v.verdict == INCONCLUSIVE)
        if open_:
            return TestEnd(INCONCLUSIVE, self.fail_inconclusive, open=open_)
        return PASSED


def adjusted(checks: Sequence[tuple[str, BaselineCheck]], nodeid: str, *, final: bool, fdr: str, alpha: float,
             gated_size: int, family_size: int) -> list[Verdict]:
    """This test's verdicts after BH/Holm over every raw verdict so far (`adjusted_all`)."""
    return adjusted_all(checks, final=final, fdr=fdr, alpha=alpha, gated_size=gated_size,
                        family_size=family_size).get(nodeid, [])


class Judged(Protocol):
    """What the family adjustment reads of a test's comparison: a nightly `BaselineCheck`, or an A/B session's."""

    raw: list[Verdict]
    max_looks: int


def adjusted_all(checks: Sequence[tuple[str, Judged]], *, final: bool, fdr: str, alpha: float,
                 gated_size: int, family_size: int) -> dict[str, list[Verdict]]:
    """Every test's verdicts after BH/Holm over every raw verdict so far, each family (gated, shown) on its
    own; padded with p=1 to the family size collected, unless ``final``."""
    from pytest_specdec.gate.scale import kind_of
    from pytest_specdec.gate.sequential import adjust, detectable

    order = [(n, c) for n, c in checks if c.raw]
    flat = [v for _, c in order for v in c.raw]
    looks_of = [c.max_looks for _, c in order for _ in c.raw]
    out = list(flat)
    sizes = {GATED: gated_size, SHOWN: family_size - gated_size}
    for family in (GATED, SHOWN):
        idx = [i for i, v in enumerate(flat) if v.family == family]
        part = [flat[i] for i in idx]
        with_p = sum(1 for v in part if v.p is not None and v.verdict != NOT_COMPARABLE)
        size = None if final else max(sizes[family], with_p)
        for i, v in zip(idx, adjust(part, fdr, alpha, family_size=size)):
            out[i] = v
        # What a lone regression must clear: BH/Holm over m tests is alpha/m for the smallest p.
        m = max(1, size or with_p)
        for i in idx:
            v, c_looks = out[i], looks_of[i]
            if v.var_fixed is not None and v.var_run is not None and v.threshold is not None and v.n_now:
                mde = detectable(kind_of(v.metric), v.threshold, v.var_fixed + v.var_run / v.n_now,
                                 v.df or 1.0, alpha / (c_looks * m))
                out[i] = dataclasses.replace(v, mde=mde)
    by_test: dict[str, list[Verdict]] = {}
    start = 0
    for n, c in order:
        by_test.setdefault(n, out[start:start + len(c.raw)])
        start += len(c.raw)
    return by_test


def machine_log(checks: Iterable[BaselineCheck | None]) -> float | None:
    """The machine factor (log) from every test compared so far (the session's, once all are in)."""
    devs = [c.deviation for c in checks if c is not None and c.deviation is not None]
    return sum(devs) / len(devs) if devs else None
