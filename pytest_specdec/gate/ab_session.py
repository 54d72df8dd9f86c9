"""An A/B session's gate (`--specdec-base-draft`, `--specdec-base-python`): each test's candidate judged against
the base measured beside it.

The nightly gate asks whether tonight is worse than the stored nights, and the night-to-night movement caps its
power on a shared CPU. Two arms measured interleaved in one session share the night, so their comparison has no
night term: each test's candidate spec config is judged against the base's, pair by pair (`ab.paired`), on
spec tok/s, the acceptance rate and the P95 E2E, then BH/Holm over the session's A/B verdicts as the nightly
adjusts its family. With the base on another install (`--specdec-base-python`) each install has its own reference
arm, and two shown verdicts say where a change sits: the references' tok/s (the non-speculative path) and the
speedups (speculation itself). Stored baselines take no part. The session (wiring) decides when;
`output/wording.py` words it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pytest_specdec.gate.kinds import GATED, REGRESSED, SHOWN, UNCHANGED


if TYPE_CHECKING:
    from pytest_specdec.gate.stats import Thresholds, Verdict
    from pytest_specdec.measure.record import ArmRun
    from pytest_specdec.measure.runner import CaseResult
    from pytest_specdec.gate.judge import SessionEnd
    from pytest_specdec.profiles import Profile
    from pytest_specdec.profiles.placement import Placement
    from pytest_specdec.vllm.command import ServerSpec
    from pytest_specdec.measure.explain import Split

#: What an A/B session judges, in this order: the candidate's spec tok/s, acceptance rate and P95 E2E (ms, from
#: each run's Harrell-Davis P95) against the base's of the same pair.
AB_METRICS: tuple[str, ...] = ("output_tok_s", "acceptance_rate", "e2e_p95_ms")

#: What an upgrade A/B (the base on another install) shows beside them, never failing a test: the two references'
#: tok/s (the non-speculative path) and the two installs' speedups (each spec run over its install's reference).
AB_SHOWN: tuple[str, ...] = ("reference_tok_s", "speedup")

#: The A/B thresholds before the profile's [verdicts] ab_thresholds and --specdec-threshold: tok/s 5 % (at the
#: CPU's noise 21 pairs then catch a -10 % change with power 0.92, docs/validation.md), P95 E2E 10 %; the
#: acceptance rate keeps the default acceptance threshold (2 points).
AB_DEFAULTS: Mapping[str, float] = {"output_tok_s": 5.0, "e2e_p95_ms": 10.0}

#: What a regressed candidate points at: fewer drafted tokens accepted, a slower step, both alike
#: (`measure.explain.Split.cause`), or on another install the path without speculation.
Cause = Literal["acceptance", "step time", "acceptance and step time", "non-speculative path"]


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
    """The candidate (``result.runs``) against the base (``result.base_runs``), pair i being the two arms' runs
    of run index i (`measure.record.pairs`, the one pairing rule: a run invalid on one arm leaves its pair out):
    one gated verdict per A/B metric, before the session's adjustment."""
    from pytest_specdec.gate.ab import paired
    from pytest_specdec.measure.record import pairs, speedup

    def value(metric: str, run: ArmRun | None) -> float | None:
        return None if run is None else run_value(metric, run)

    records = {arm: [r.record for r in result.arm_runs(arm)]
               for arm in ("reference", "spec", "base", "base_reference")}
    ab = pairs(records["base"], records["spec"])
    out = [dataclasses.replace(paired(m, [value(m, p.first) for p in ab], [value(m, p.second) for p in ab],
                                      thresholds=thresholds, alpha=alpha), family=GATED)
           for m in AB_METRICS]
    if not result.base_reference_runs:
        return out
    refs = pairs(records["base_reference"], records["reference"])
    ref_tok_s = {"base": [value("output_tok_s", p.first) for p in refs],
                 "candidate": [value("output_tok_s", p.second) for p in refs]}
    # each install's speedup per run index (its spec run over its reference's), the two of one index paired
    speedups = {"base": {p.index: speedup(p) for p in pairs(records["base_reference"], records["base"])},
                "candidate": {p.index: speedup(p) for p in pairs(records["reference"], records["spec"])}}
    indices = sorted(speedups["base"].keys() | speedups["candidate"].keys())
    shown = {"reference_tok_s": ref_tok_s,
             "speedup": {arm: [speedups[arm].get(i) for i in indices] for arm in speedups}}
    return out + [dataclasses.replace(paired(m, shown[m]["base"], shown[m]["candidate"], thresholds=thresholds,
                                             alpha=alpha), family=SHOWN) for m in AB_SHOWN]


@dataclass
class ABCheck:
    """One test's A/B comparison: what was compared and its verdicts, raw and adjusted over the session."""

    method: str
    base_draft: str  # the base's draft/head model
    candidate_draft: str  # the candidate's
    servers: dict[str, str]  # arm -> server spec key (reference, spec, base, base_reference)
    thresholds: Thresholds
    #: An upgrade A/B's installs: "base" and "candidate" -> their vLLM, torch and interpreter (None: one install).
    installs: dict[str, dict[str, str | None]] | None = None
    #: What differs between the base's side and the candidate's: versions and the spec and reference arms'
    #: engine configs, ``dotted key: (base, candidate)`` (`baselines.diff`).
    changed: dict[str, tuple[Any, Any]] = field(default_factory=dict)
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
        """The gated verdicts that regressed (an upgrade A/B's shown ones explain, never fail)."""
        return [v for v in self.shown() if v.verdict == REGRESSED and v.family == GATED]

    def cause(self) -> Cause | None:
        """tok/s regressed: on another install whose reference slowed too while the speedup did not regress, the
        non-speculative path; else what the split of the speedup change measures (τ against the step time;
        without a split, step time when acceptance held). Acceptance regressed alone: the candidate's drafts are
        accepted less. Else nothing to point at."""
        by = {v.metric: v.verdict for v in self.shown()}
        if by.get("output_tok_s") == REGRESSED:
            if by.get("reference_tok_s") == REGRESSED and by.get("speedup") != REGRESSED:
                return "non-speculative path"
            if self.split is not None:
                return self.split.cause() or "acceptance and step time"
            if by.get("acceptance_rate") == UNCHANGED:
                return "step time"
        if by.get("acceptance_rate") == REGRESSED:
            return "acceptance"
        return None


def adjust(checks: Sequence[tuple[str, ABCheck]], *, final: bool, fdr: str, alpha: float, tests: int) -> None:
    """BH/Holm over every A/B verdict so far, each family on its own (padded with p=1 to what ``tests`` judged
    tests reach, unless ``final``), into each check's ``verdicts`` (or ``final``), as the nightly adjusts."""
    from pytest_specdec.gate.check import adjusted_all

    shown = len(AB_SHOWN) if any(c.installs for _, c in checks) else 0
    out = adjusted_all(checks, final=final, fdr=fdr, alpha=alpha, gated_size=len(AB_METRICS) * tests,
                       family_size=(len(AB_METRICS) + shown) * tests)
    for nodeid, c in checks:
        if final:
            c.final = out.get(nodeid, c.raw)
        else:
            c.verdicts = out.get(nodeid, c.raw)


class ABGate:
    """An A/B session's gate: the base's profile, the thresholds, each test's check, its end and the session's."""

    def __init__(self, profile: Profile, base_drafts: Mapping[str, str],
                 cli_thresholds: Sequence[str], *, alpha: float, fdr: str, base_python: str | None = None) -> None:
        """Raises ConfigError naming the flag, file or key to fix: a method the profile lacks or without a draft
        (`Profile.with_drafts`, the one path `--specdec-draft` takes too), a base interpreter without vLLM or
        without this project (`vllm.install.probe`), a bad A/B threshold. Servers that cannot be alive at once
        (a GPU profile's 8B target three or four times) take the ABBA blocks of `schedule.schedule_ab`."""
        from pytest_specdec.vllm.install import probe, this_install

        self.profile, self.alpha, self.fdr = profile, alpha, fdr
        self.base = profile.with_drafts(dict(base_drafts), "--specdec-base-draft")
        #: The methods with a base: those --specdec-base-draft names; on another install every method has one.
        self.methods: tuple[str, ...] | None = tuple(base_drafts) if base_drafts else None
        self.installs = None if base_python is None else {"base": probe(base_python), "candidate": this_install()}
        raw = profile.raw.get("verdicts", {}).get("ab_thresholds", {})
        self.thresholds = ab_thresholds(raw, cli_thresholds, f"profile {profile.path} [verdicts] ab_thresholds")

    def skip_reason(self, method: str, raw_config: dict[str, Any] | None) -> str | None:
        """Why a test has no A/B comparison in this session (None: it has one)."""
        if method == "none":
            return "it runs the reference alone, with no spec arm to compare"
        if self.methods is None:  # another install: the same config on both
            return None
        if raw_config is not None:
            return "its marker gives its own speculative_config, so --specdec-base-draft names no base for it"
        if method not in self.methods:
            return (f"method {method!r} has no base (--specdec-base-draft names {', '.join(self.methods)}); "
                    "an A/B session judges only candidate vs base")
        return None

    def base_arms(self, method: str, k: int | None, raw: dict[str, Any] | None, reference: ServerSpec,
                  placement: Placement) -> dict[str, ServerSpec]:
        """A test's base arms (none when it has no A/B comparison, `skip_reason`): the same method and k with the
        base's draft (a marker's own config ``raw``, on another install, as it is). On another install the candidate's
        reference moves to its interpreter too (the base's own reference arm). The base spec is tagged with its
        role, so it never shares the candidate's server."""
        if self.skip_reason(method, raw) is not None:
            return {}
        config = raw if self.methods is None else None
        base = dataclasses.replace(placement.server_spec(method, k, config, False, self.base), role="base")
        if self.installs is None:
            return {"base": base}
        python = self.installs["base"].python
        return {"base": dataclasses.replace(base, python=python),
                "base_reference": dataclasses.replace(reference, python=python)}

    def check(self, method: str, specs: Mapping[str, ServerSpec], result: CaseResult,
              engine: Mapping[str, Mapping[str, Any]], check: bool = True) -> ABCheck:
        """A test's raw A/B verdicts from its interleaved runs (``specs``: arm -> server spec; ``engine``: arm ->
        its server's resolved engine config; ``check`` False: the test's specdec_verdicts marker says it never
        fails on them)."""
        from pytest_specdec.gate.baselines import diff
        from pytest_specdec.measure.explain import explain, split

        def draft(arm: str) -> str:
            return str((specs[arm].speculative_config or {}).get("model", "(no draft model)"))

        installs = None if self.installs is None else {k: v.to_dict() for k, v in self.installs.items()}

        def side(spec_arm: str, ref_arm: str, install: str) -> dict[str, Any]:
            versions = {k: v for k, v in (installs or {}).get(install, {}).items() if k != "python"}
            return {**versions, "engine": engine.get(spec_arm, {}), "reference_engine": engine.get(ref_arm, {})}

        base_ref = "base_reference" if "base_reference" in specs else "reference"
        return ABCheck(method, draft("base"), draft("spec"), {arm: s.key() for arm, s in specs.items()},
                       self.thresholds, installs, diff(side("base", base_ref, "base"),
                                                       side("spec", "reference", "candidate")),
                       raw=ab_verdicts(result, self.thresholds, self.alpha), check=check,
                       split=split(explain([r.record for r in result.base_reference_runs or result.reference_runs],
                                           [r.record for r in result.base_runs]),
                                   explain([r.record for r in result.reference_runs],
                                           [r.record for r in result.runs])))

    def test_end(self, checks: Sequence[tuple[str, ABCheck]], nodeid: str,
                 collected: Sequence[tuple[str, dict[str, Any] | None]]) -> ABCheck:
        """At a test's end: every A/B verdict so far adjusted, padded with p=1 to what the ``collected`` tests'
        (method, raw speculative config) can add; the test's check, decided."""
        judged = sum(1 for method, raw in collected if self.skip_reason(method, raw) is None)
        adjust(checks, final=False, fdr=self.fdr, alpha=self.alpha, tests=max(judged, len(checks)))
        c = dict(checks)[nodeid]
        c.failed = c.check and bool(c.regressed())
        return c

    def finish(self, checks: Sequence[tuple[str, ABCheck]]) -> SessionEnd:
        """At the session's end: the whole family adjusted; the tests that regress only now (BH needs every p)
        are its late regressions, which fail the session."""
        from pytest_specdec.gate.check import TestEnd
        from pytest_specdec.gate.judge import SessionEnd

        adjust(checks, final=True, fdr=self.fdr, alpha=self.alpha, tests=len(checks))
        return SessionEnd(None, late_regressions=[(n, TestEnd(REGRESSED, True)) for n, c in checks
                                                  if c.check and c.regressed() and not c.failed])
