"""An A/B session's gate (`--specdec-base-draft`): each test's candidate judged against the base measured beside it.

The nightly gate asks whether tonight is worse than the stored nights, and the night-to-night movement caps its
power on a shared CPU. Two arms measured interleaved in one session share the night, so their comparison has no
night term: each test's candidate spec config is judged against the base's, pair by pair (`ab.paired`), on
spec tok/s, the acceptance rate and the P95 E2E, then BH/Holm over the session's A/B verdicts as the nightly
adjusts its family. Stored baselines take no part. The session (wiring) decides when; `output/wording.py` words it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pytest_specdec.errors import ConfigError

if TYPE_CHECKING:
    from pytest_specdec.gate.nights import ArmRun
    from pytest_specdec.gate.stats import Thresholds, Verdict
    from pytest_specdec.measure.runner import CaseResult
    from pytest_specdec.gate.judge import SessionEnd
    from pytest_specdec.profiles import Profile
    from pytest_specdec.profiles.placement import Placement
    from pytest_specdec.measure.explain import Split

#: What an A/B session judges, in this order: the candidate's spec tok/s, acceptance rate and P95 E2E (ms, from
#: each run's Harrell-Davis P95) against the base's of the same pair.
AB_METRICS: tuple[str, ...] = ("output_tok_s", "acceptance_rate", "e2e_p95_ms")

#: The A/B thresholds before the profile's [verdicts] ab_thresholds and --specdec-threshold: tok/s 5 % (at the
#: CPU's noise 21 pairs then catch a -10 % change with power 0.92, docs/validation.md), P95 E2E 10 %; the
#: acceptance rate keeps the default acceptance threshold (2 points).
AB_DEFAULTS: Mapping[str, float] = {"output_tok_s": 5.0, "e2e_p95_ms": 10.0}

#: What a regressed candidate points at: fewer drafted tokens accepted, a slower step, or both alike
#: (`measure.explain.Split.cause`).
Cause = Literal["acceptance", "step time", "acceptance and step time"]


def ab_thresholds(profile_layer: Mapping[str, Any], cli: Sequence[str], where: str) -> Thresholds:
    """Defaults < the profile's [verdicts] ab_thresholds (``where`` names it) < --specdec-threshold."""
    from pytest_specdec.gate.thresholds import build_thresholds, check_mapping, parse_threshold_items

    return build_thresholds(AB_DEFAULTS, check_mapping(profile_layer, where),
                            parse_threshold_items(cli, "--specdec-threshold"))


def run_value(metric: str, run: ArmRun) -> float | None:
    """One run's figure for an A/B metric (`ArmRun.figure`, as the nightly reads it); None for an invalid run
    (and for the P95 of a run whose stream was coalesced), so its pair leaves that verdict."""
    return run.figure(metric) if run.valid else None


def ab_verdicts(result: CaseResult, thresholds: Thresholds, alpha: float) -> list[Verdict]:
    """The candidate (``result.runs``) against the base (``result.base_runs``), pair i being the two arms' i-th
    runs: one gated verdict per A/B metric, before the session's adjustment."""
    from pytest_specdec.gate.ab import paired
    from pytest_specdec.gate.nights import ArmRun

    base = [ArmRun.from_record(r) for r in result.base_runs]
    cand = [ArmRun.from_record(r) for r in result.runs]
    n = min(len(base), len(cand))
    return [dataclasses.replace(paired(m, [run_value(m, r) for r in base[:n]], [run_value(m, r) for r in cand[:n]],
                                       thresholds=thresholds, alpha=alpha), family="gated")
            for m in AB_METRICS]


@dataclass
class ABCheck:
    """One test's A/B comparison: what was compared and its verdicts, raw and adjusted over the session."""

    method: str
    base_draft: str  # the base's draft/head model
    candidate_draft: str  # the candidate's
    servers: dict[str, str]  # arm -> server spec key (reference, base, candidate)
    thresholds: Thresholds
    raw: list[Verdict] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)  # adjusted at the test's end (unseen p-values = 1)
    final: list[Verdict] | None = None  # adjusted over the session's whole A/B family
    max_looks: int = 1  # one look: the pairs are sized up front (`adjusted_all` reads this)
    check: bool = True  # specdec_verdicts(check=False): judged and shown, never failed
    failed: bool = False
    split: Split | None = None  # the candidate's speedup against the base's, split into acceptance and step time

    def shown(self) -> list[Verdict]:
        return self.final if self.final is not None else (self.verdicts or self.raw)

    def regressed(self) -> list[Verdict]:
        return [v for v in self.shown() if v.verdict == "regressed"]

    def cause(self) -> Cause | None:
        """tok/s regressed: what the split of the speedup change measures (τ against the step time; without a
        split, acceptance when its verdict regressed, step time when it held). Acceptance regressed alone: the
        candidate's drafts are accepted less. Else nothing to point at."""
        by = {v.metric: v.verdict for v in self.shown()}
        if by.get("output_tok_s") == "regressed":
            if self.split is not None:
                return self.split.cause() or "acceptance and step time"
            if by.get("acceptance_rate") == "unchanged":
                return "step time"
        if by.get("acceptance_rate") == "regressed":
            return "acceptance"
        return None


def adjust(checks: Sequence[tuple[str, ABCheck]], *, final: bool, fdr: str, alpha: float, family_size: int) -> None:
    """BH/Holm over every A/B verdict so far (padded with p=1 to the ``family_size`` the collected tests reach,
    unless ``final``), into each check's ``verdicts`` (or ``final``), as the nightly adjusts its gated family."""
    from pytest_specdec.gate.check import adjusted_all

    out = adjusted_all(checks, final=final, fdr=fdr, alpha=alpha, gated_size=family_size, family_size=family_size)
    for nodeid, c in checks:
        if final:
            c.final = out.get(nodeid, c.raw)
        else:
            c.verdicts = out.get(nodeid, c.raw)


class ABGate:
    """An A/B session's gate: the base's profile, the thresholds, each test's check, its end and the session's."""

    def __init__(self, profile: Profile, placement: Placement, base_drafts: Mapping[str, str],
                 cli_thresholds: Sequence[str], *, alpha: float, fdr: str) -> None:
        """Raises ConfigError naming the flag, file or key to fix: a method the profile lacks or without a draft
        (`Profile.with_drafts`, the one path `--specdec-draft` takes too), a bad A/B threshold, servers that
        cannot be alive at once (the ABBA blocks of two arms have no three-arm form yet)."""
        if not placement.co_resident():
            why = ("--specdec-max-servers 1" if placement.max_servers < 2 else
                   f"profile {profile.path} sets [placement] co_resident = false")
            raise ConfigError(f"--specdec-base-draft: an A/B session needs the reference's, the base's and the "
                              f"candidate's servers alive at once for now, and {why}")
        self.profile, self.alpha, self.fdr = profile, alpha, fdr
        self.base = profile.with_drafts(dict(base_drafts), "--specdec-base-draft")
        self.methods = tuple(base_drafts)
        raw = profile.raw.get("verdicts", {}).get("ab_thresholds", {})
        self.thresholds = ab_thresholds(raw, cli_thresholds, f"profile {profile.path} [verdicts] ab_thresholds")

    def skip_reason(self, method: str, raw_config: dict[str, Any] | None) -> str | None:
        """Why a test has no A/B comparison in this session (None: it has one)."""
        if raw_config is not None:
            return "its marker gives its own speculative_config, so --specdec-base-draft names no base for it"
        if method not in self.methods:
            return (f"method {method!r} has no base (--specdec-base-draft names {', '.join(self.methods)}); "
                    "an A/B session judges only candidate vs base")
        return None

    def check(self, method: str, servers: dict[str, str], result: CaseResult, check: bool = True) -> ABCheck:
        """A test's raw A/B verdicts from its interleaved runs (``servers``: arm -> server spec key; ``check``
        False: the test's specdec_verdicts marker says it never fails on them)."""
        from pytest_specdec.measure.explain import explain, split

        ref = [r.to_dict() for r in result.reference_runs]
        return ABCheck(method, str(self.base.methods[method]["model"]), str(self.profile.methods[method]["model"]),
                       servers, self.thresholds, raw=ab_verdicts(result, self.thresholds, self.alpha), check=check,
                       split=split(explain(ref, [r.to_dict() for r in result.base_runs]),
                                   explain(ref, [r.to_dict() for r in result.runs])))

    def test_end(self, checks: Sequence[tuple[str, ABCheck]], nodeid: str,
                 collected: Sequence[tuple[str, dict[str, Any] | None]]) -> ABCheck:
        """At a test's end: every A/B verdict so far adjusted, padded with p=1 to what the ``collected`` tests'
        (method, raw speculative config) can add; the test's check, decided."""
        judged = sum(1 for method, raw in collected if self.skip_reason(method, raw) is None)
        size = len(AB_METRICS) * max(judged, len(checks))
        adjust(checks, final=False, fdr=self.fdr, alpha=self.alpha, family_size=size)
        c = dict(checks)[nodeid]
        c.failed = c.check and bool(c.regressed())
        return c

    def finish(self, checks: Sequence[tuple[str, ABCheck]]) -> SessionEnd:
        """At the session's end: the whole family adjusted; the tests that regress only now (BH needs every p)
        are its late regressions, which fail the session."""
        from pytest_specdec.gate.check import TestEnd
        from pytest_specdec.gate.judge import SessionEnd

        adjust(checks, final=True, fdr=self.fdr, alpha=self.alpha, family_size=len(AB_METRICS) * len(checks))
        return SessionEnd(None, late_regressions=[(n, TestEnd("regressed", True)) for n, c in checks
                                                  if c.check and c.regressed() and not c.failed])
