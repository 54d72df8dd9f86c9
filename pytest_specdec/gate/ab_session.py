"""An A/B session's gate (`--specdec-base-draft`, `--specdec-base-python`; a `protocol.Gate`): each test's
candidate judged against the base measured beside it.

The nightly gate asks whether tonight is worse than the stored nights, and the night-to-night movement caps its
power on a shared CPU. Two arms measured interleaved in one session share the night, so their comparison has no
night term: each test's candidate spec config is judged against the base's, pair by pair (`ab.paired`), on
spec tok/s, the acceptance rate and the P95 E2E (and what `gate=`/`specdec_gate` add), at sequential looks as the
nightly takes them, then BH/Holm over the session's A/B verdicts as the nightly adjusts its family. With the base
on another install (`--specdec-base-python`) each install has its own reference arm, and two shown verdicts say
where a change sits: the references' tok/s (the non-speculative path) and the speedups (speculation itself).
Stored baselines take no part. The session (wiring) drives it; `output/ab_wording.py` words what it decided.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pytest_specdec.gate.check import Looked
from pytest_specdec.gate.crossover import NAME as CROSSOVER
from pytest_specdec.gate.drift import gated_drift
from pytest_specdec.gate.kinds import GATED, REGRESSED, SHOWN, UNCHANGED, Stop
from pytest_specdec.gate.registry import GOODPUT
from pytest_specdec.profiles.engines import DEFAULT_ENGINE, EngineMode

if TYPE_CHECKING:
    from pytest_specdec.gate.check import FailRule, Look, TestEnd
    from pytest_specdec.gate.drift import Drift
    from pytest_specdec.gate.protocol import (
        Finished,
        GateOptions,
        Planned,
        SessionEnd,
        StopRule,
        TestOptions,
        TestStart,
    )
    from pytest_specdec.gate.stats import Thresholds, Verdict
    from pytest_specdec.measure.explain import Split
    from pytest_specdec.measure.record import ArmRun
    from pytest_specdec.measure.runner import CaseResult
    from pytest_specdec.profiles import Profile
    from pytest_specdec.profiles.placement import Placement
    from pytest_specdec.vllm.command import ServerSpec
    from pytest_specdec.vllm.install import Install

#: What an A/B session judges, in this order: the candidate's spec tok/s, acceptance rate and P95 E2E (ms, from
#: each run's Harrell-Davis P95) against the base's of the same pair.
AB_METRICS: tuple[str, ...] = ("output_tok_s", "acceptance_rate", "e2e_p95_ms")

#: What `gate=[...]` and the ini `specdec_gate` may add to an A/B test's gated family: the metrics each arm's run
#: has a figure of (`nights.ArmRun.figure`), judged pair by pair as the three are. The nightly's ratios to the
#: reference (speedup, e2e_p95_ratio) are not among them: the base and the candidate share each pair's reference,
#: so their ratio of speedups is the ratio of their tok/s, gated already. The goodput is (a test with SLOs): each
#: arm's goodput ratio to its reference, judged pair by pair (`pair_verdicts`), as no other figure says it.
#: The crossover (`CROSSOVER`) is a sweep's, not a pair's: judged at the session's end, the candidate's sweep against
#: the base's (`crossover_gate.against_base`).
AB_GATEABLE: tuple[str, ...] = (*AB_METRICS, "tpot_p95_ms", "ttft_p95_ms", "draft_coverage", "acceptance_length",
                                 GOODPUT, CROSSOVER)

#: What an upgrade A/B (the base on another install) shows beside them, never failing a test: the two references'
#: tok/s (the non-speculative path) and the two installs' speedups (each spec run over its install's reference).
AB_SHOWN: tuple[str, ...] = ("reference_tok_s", "speedup")

#: The A/B thresholds before the profile's [verdicts] ab_thresholds and the ini's, the command line's and the
#: marker's: tok/s 5 % (at the CPU's noise 21 pairs then catch a -10 % change with power 0.92,
#: docs/validation.md), P95 E2E 10 %; the acceptance rate keeps the default acceptance threshold (2 points).
AB_DEFAULTS: Mapping[str, float] = {"output_tok_s": 5.0, "e2e_p95_ms": 10.0}

#: What a regressed candidate points at: fewer drafted tokens accepted, a slower step, both alike
#: (`measure.explain.Split.cause`), or on another install the path without speculation.
Cause = Literal["acceptance", "step time", "acceptance and step time", "non-speculative path"]


def ab_thresholds(profile_layer: Mapping[str, Any], ini: Sequence[str], cli: Sequence[str], where: str,
                  marker: Mapping[str, float] | None = None) -> Thresholds:
    """Defaults < the profile's [verdicts] ab_thresholds (``where`` names it) < ini specdec_thresholds <
    --specdec-threshold < the marker's ``thresholds=``, each checked where it was given."""
    from pytest_specdec.gate.thresholds import build_thresholds, layers

    return build_thresholds(AB_DEFAULTS, *layers(profile_layer, where, ini, cli), dict(marker or {}))


def run_value(metric: str, run: ArmRun) -> float | None:
    """One run's figure for an A/B metric (`ArmRun.figure`, as the nightly reads it); None for an invalid run
    (and for the P95 of a run whose stream was coalesced), so its pair leaves that verdict."""
    return run.figure(metric) if run.valid else None


def pair_verdicts(base: Sequence[ArmRun], candidate: Sequence[ArmRun], thresholds: Thresholds, alpha: float, *,
                  metrics: Sequence[str] = AB_METRICS,
                  references: tuple[Sequence[ArmRun], Sequence[ArmRun]] | None = None,
                  look: int = 1, max_looks: int = 1, reference: Sequence[ArmRun] = ()) -> list[Verdict]:
    """The candidate's runs against the base's, pair i being the two arms' runs of run index i
    (`measure.record.pairs`, the one pairing rule: a run invalid on one arm leaves its pair out): one gated verdict
    per metric of ``metrics``, and with the two installs' ``references`` (base's, candidate's) the shown ones, raw
    (before the session's adjustment) at look ``look`` of ``max_looks``. The goodput of a test with SLOs is each
    arm's ratio to its reference (``references``, else the one ``reference`` both share; a pair without one leaves
    it), as the nightly's: where the arms share the reference it cancels, so this compares the two arms' goodputs.
    Shown for a test with SLOs, gated when asked. Read by the session and by `compare`."""
    from pytest_specdec.gate.ab import paired
    from pytest_specdec.measure.record import goodput_ratio, pairs, speedup

    refs_of = references or (reference, reference)
    goodputs = [{p.index: goodput_ratio(p) for p in pairs(refs, arm)}
                for refs, arm in zip(refs_of, (base, candidate), strict=True)]

    def value(metric: str, run: ArmRun | None, arm: int) -> float | None:
        if run is None:
            return None
        return goodputs[arm].get(run.index) if metric == GOODPUT else run_value(metric, run)

    ab = pairs(base, candidate)
    # a test with goodput SLOs shows its goodput where it does not gate it; one without has none to judge (the ini's
    # specdec_gate may name goodput for the session's tests that set SLOs)
    slos = any(r.goodput_req_s is not None for r in (*base, *candidate))
    shown_goodput = (GOODPUT,) if slos and GOODPUT not in metrics else ()
    metrics = [m for m in metrics if (m != GOODPUT or slos) and m != CROSSOVER]  # a sweep's: judged at the end
    # where the arms ran in blocks, each pair's block (the same in every arm of a run index): the verdicts' unit
    block = {r.index: r.block for r in (*base, *candidate)}
    blocks = [block.get(p.index) for p in ab]
    out = [dataclasses.replace(paired(m, [value(m, p.first, 0) for p in ab], [value(m, p.second, 1) for p in ab],
                                      thresholds=thresholds, alpha=alpha, look=look, max_looks=max_looks,
                                      blocks=blocks),
                               family=SHOWN if m in shown_goodput else GATED) for m in (*metrics, *shown_goodput)]
    if references is None:
        return out
    base_refs, cand_refs = references
    refs = pairs(base_refs, cand_refs)
    ref_tok_s = {"base": [value("output_tok_s", p.first, 0) for p in refs],
                 "candidate": [value("output_tok_s", p.second, 1) for p in refs]}
    # each install's speedup per run index (its spec run over its reference's), the two of one index paired
    speedups = {"base": {p.index: speedup(p) for p in pairs(base_refs, base)},
                "candidate": {p.index: speedup(p) for p in pairs(cand_refs, candidate)}}
    indices = sorted(speedups["base"].keys() | speedups["candidate"].keys())
    shown = {"reference_tok_s": ref_tok_s,
             "speedup": {arm: [speedups[arm].get(i) for i in indices] for arm in speedups}}
    shown_blocks = {"reference_tok_s": [block.get(p.index) for p in refs], "speedup": [block.get(i) for i in indices]}
    return out + [dataclasses.replace(paired(m, shown[m]["base"], shown[m]["candidate"], thresholds=thresholds,
                                             alpha=alpha, look=look, max_looks=max_looks, blocks=shown_blocks[m]),
                                      family=SHOWN)
                  for m in AB_SHOWN]


def ab_verdicts(result: CaseResult, thresholds: Thresholds, alpha: float, *, metrics: Sequence[str] = AB_METRICS,
                look: int = 1, max_looks: int = 1) -> list[Verdict]:
    """A test's runs so far (`pair_verdicts`): the candidate (``result.runs``) against the base
    (``result.base_runs``); on another install the shown verdicts from both references too."""
    def arm(runs: Sequence[Any]) -> list[ArmRun]:
        return [r.record for r in runs]

    refs = ((arm(result.base_reference_runs), arm(result.reference_runs)) if result.base_reference_runs else None)
    return pair_verdicts(arm(result.base_runs), arm(result.runs), thresholds, alpha, metrics=metrics,
                         references=refs, look=look, max_looks=max_looks, reference=arm(result.reference_runs))


@dataclass(frozen=True)
class ABPlan:
    """A test's A/B comparison as fixed at its start: what is compared (both drafts, their servers, what differs
    between the two sides) and how (thresholds, gated metrics, the looks planned, the level)."""

    method: str
    base_draft: str  # the base's draft/head model
    candidate_draft: str  # the candidate's
    servers: Mapping[str, str]  # arm -> server spec key (reference, spec, base, base_reference)
    thresholds: Thresholds
    #: An upgrade A/B's installs: "base" and "candidate" -> their vLLM, torch and interpreter (None: one install).
    installs: Mapping[str, Install] | None = None
    #: What differs between the base's side and the candidate's: versions and the spec and reference arms'
    #: engine configs, ``dotted key: (base, candidate)`` (`baselines.diff`).
    changed: Mapping[str, tuple[Any, Any]] = field(default_factory=dict)
    #: An engine-mode A/B's modes, (base, candidate) (`--specdec-base-engine`); None: both sides in the test's mode.
    engines: tuple[str, str] | None = None
    metrics: tuple[str, ...] = AB_METRICS  # the gated ones: AB_METRICS and what gate=/specdec_gate add
    looks: tuple[int, ...] = ()  # pairs at each planned look
    max_looks: int = 1  # the planned looks: each at alpha / max_looks (`adjusted_all` reads this)
    checked: bool = True  # specdec_verdicts(check=False): judged and shown, never failed
    alpha: float = 0.05


@dataclass(frozen=True)
class ABJudgement(Looked):
    """One test's A/B judgement: its plan, each look taken, its verdicts at its end and after the session's
    family adjustment, why it stopped adding pairs, and the split of its speedup. Frozen: each step makes a new
    one."""

    plan: ABPlan
    looks_taken: tuple[Look, ...] = ()
    verdicts: tuple[Verdict, ...] = ()  # adjusted at the test's end (unseen p-values = 1)
    final: tuple[Verdict, ...] | None = None  # adjusted over the session's whole A/B family
    stop: Stop | None = None  # why it stopped adding pairs (`ab.Stop`); None: not judged yet
    split: Split | None = None  # the candidate's speedup against the base's, split into acceptance and step time
    end: TestEnd | None = None  # what the test's end decided
    #: its drift within the session (`gate.drift`, the candidate's runs): its gated verdicts are members of the family
    drift: Drift | None = None

    @property
    def max_looks(self) -> int:
        return self.plan.max_looks

    @property
    def checked(self) -> bool:
        return self.plan.checked

    @property
    def alpha(self) -> float:
        return self.plan.alpha

    @property
    def failed(self) -> bool:
        """Whether the test's end failed it: a regression found only at the session's end is then not news."""
        return self.end is not None and self.end.fails

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


def adjust(checks: Sequence[tuple[str, ABJudgement]], *, final: bool, multiplicity: str, alpha: float,
           gated_size: int = 0,
           family_size: int = 0) -> list[tuple[str, ABJudgement]]:
    """BH/Holm over every A/B verdict so far, each family on its own (padded with p=1 to the sizes the collected
    tests reach, unless ``final``): each judgement with its ``verdicts`` (or ``final``), as the nightly adjusts."""
    from pytest_specdec.gate.check import Adjusted, adjusted_all

    out = adjusted_all(checks, final=final, multiplicity=multiplicity, alpha=alpha, gated_size=gated_size,
                       family_size=family_size)
    adjusted = [(nodeid, c, out.get(nodeid, Adjusted(tuple(c.raw)))) for nodeid, c in checks]
    if final:
        return [(nodeid, dataclasses.replace(c, final=a.verdicts, drift=a.drift_of(c))) for nodeid, c, a in adjusted]
    return [(nodeid, dataclasses.replace(c, verdicts=a.verdicts, drift=a.drift_of(c))) for nodeid, c, a in adjusted]


def refuse_stored_night_options(ab_flag: str, *, strict: bool, fail_machine: bool) -> None:
    """The options an A/B session cannot apply, refused by name (ConfigError): both act on stored nights, which
    an A/B session reads none of. ``ab_flag`` names the flags that made it one."""
    from pytest_specdec.errors import ConfigError

    for flag, on, why in (("--specdec-strict", strict, "a stored baseline measured under other conditions"),
                          ("--specdec-fail-machine (ini specdec_fail_machine)", fail_machine,
                           "the machine factor of tonight against the stored nights")):
        if on:
            raise ConfigError(f"{flag} with {ab_flag}: it fails a session on {why}, and an A/B session reads no "
                              f"stored night; drop {flag.split(' ')[0]} for the A/B session")


def refusal(planned: Planned, judged: Sequence[str]) -> str | None:
    """Why a test's marker asks what an A/B session cannot do (None: nothing): a ``gate=`` metric without a
    figure per arm run (`AB_GATEABLE`), or a ``thresholds=`` metric the A/B does not judge in it (``judged``;
    a kind, e.g. ``latency``, always applies)."""
    from pytest_specdec.gate.registry import KINDS

    where = f"{planned.nodeid}: specdec_verdicts"
    bad = [m for m in planned.options.gate if m not in AB_GATEABLE]
    if bad:
        return (f"{where}(gate={list(planned.options.gate)}): an A/B session judges the candidate against the base "
                f"pair by pair and cannot gate {', '.join(bad)}; it may gate {', '.join(AB_GATEABLE)}")
    unjudged = [m for m in planned.options.thresholds if m not in KINDS and m not in judged]
    if unjudged:
        return (f"{where}(thresholds=...): an A/B session does not judge {', '.join(unjudged)} (it judges "
                f"{', '.join(judged)}); name one of those, or a kind (rate, acceptance, latency)")
    return None


def base_engine_mode(profile: Profile, name: str, base_drafts: bool, base_python: str | None) -> EngineMode:
    """``--specdec-base-engine NAME``: the profile's mode of that name (or ``default``), alone: an engine-mode A/B
    compares one install and one draft in two modes, so it cannot be combined with another base."""
    from pytest_specdec.errors import ConfigError
    from pytest_specdec.profiles.engines import resolve_engine

    other = [flag for flag, on in (("--specdec-base-draft", base_drafts), ("--specdec-base-python", base_python))
             if on]
    if other:
        raise ConfigError(f"--specdec-base-engine {name} with {' and '.join(other)}: an engine-mode A/B compares one "
                          "install and one draft in two modes; run one kind of A/B per session")
    return resolve_engine(name, profile.engines, f"--specdec-base-engine (profile {profile.path})")


class ABGate:
    """An A/B session's gate: the base's profile, the thresholds and gated metrics, each test's looks, its end and
    the session's (`protocol.Gate`)."""

    def __init__(self, profile: Profile, base_drafts: Mapping[str, str], options: GateOptions, *,
                 base_python: str | None = None, base_engine: str | None = None, stop: StopRule | None = None
                 ) -> None:
        """Raises ConfigError naming the flag, file or key to fix: a method the profile lacks or without a draft
        (`Profile.with_drafts`, the one path `--specdec-draft` takes too), a base interpreter without vLLM or
        without this project (`vllm.install.probe`), a bad A/B threshold, an ini `specdec_gate` metric an A/B
        cannot gate. Servers that cannot be alive at once (a GPU profile's 8B target three or four times) take
        the ABBA blocks of `schedule.schedule_ab`. ``runs``/``max_runs``: pairs at the first look and at most
        (`profiles.resolve.run_limits`), a look every [matrix] ab_look_step pairs between; ``stop``: when a test
        stops adding pairs before its last planned look
        (None: `ab.until_pairs_settle`). ``base_engine``: the engine mode the base runs in on this install
        (`--specdec-base-engine`, a name of the profile's `[engines]` or ``default``): every test whose own mode is
        another is judged against its method in the base mode."""
        from pytest_specdec.errors import ConfigError
        from pytest_specdec.gate.sequential import planned_looks
        from pytest_specdec.vllm.install import probe, this_install

        self.profile, self.options = profile, options
        self.base = profile.with_drafts(dict(base_drafts), "--specdec-base-draft")
        #: The methods with a base: those --specdec-base-draft names; on another install every method has one.
        self.methods: tuple[str, ...] | None = tuple(base_drafts) if base_drafts else None
        self.base_engine = None if base_engine is None else base_engine_mode(profile, base_engine, bool(base_drafts),
                                                                             base_python)
        self.installs = None if base_python is None else {"base": probe(base_python), "candidate": this_install()}
        self._layers = (profile.raw.get("verdicts", {}).get("ab_thresholds", {}), options.ini_thresholds,
                        options.cli_thresholds, f"profile {profile.path} [verdicts] ab_thresholds")
        self.thresholds = self.test_thresholds()
        bad = [m for m in options.gate if m not in AB_GATEABLE]
        if bad:
            raise ConfigError(f"ini specdec_gate names {', '.join(bad)}, which an A/B session cannot gate (it judges "
                              f"the candidate against the base pair by pair); it may gate {', '.join(AB_GATEABLE)}")
        #: pairs at each planned look: the first runs, then a look every [matrix] ab_look_step pairs to max_runs
        self.planned_looks = tuple(planned_looks(options.runs, profile.ab_look_step, options.max_runs))
        self.stop = stop
        #: The session's planned gated family (`refuse` counts it at collection): a look's stop reads its verdicts
        #: at that size (`ab.at_family_level`); None before collection, when no look stops on a moved verdict.
        self.family_size: int | None = None

    def gated_size(self, planned: Sequence[Planned]) -> int:
        """The gated verdicts the ``planned`` tests add to the session's A/B family (those with a comparison), their
        gated drift verdicts included."""
        return sum(len([m for m in self.metrics(p.options) if m != CROSSOVER]) + len(p.drift) for p in planned
                   if self.skip_reason(p.method, p.speculative_config, p.engine) is None)

    def test_thresholds(self, marker: Mapping[str, float] | None = None) -> Thresholds:
        """The session's A/B thresholds (`ab_thresholds`), with a test's marker on top."""
        return ab_thresholds(*self._layers, marker)

    def metrics(self, options: TestOptions) -> tuple[str, ...]:
        """A test's gated metrics: the A/B's three, then the ini's and its marker's additions."""
        return tuple(dict.fromkeys((*AB_METRICS, *self.options.gate, *options.gate)))

    def judged(self, options: TestOptions) -> tuple[str, ...]:
        """Every metric a test's A/B judges: its gated ones, and on another install the shown ones."""
        return (*self.metrics(options), *(AB_SHOWN if self.installs else ()))

    def skip_reason(self, method: str, raw_config: Mapping[str, Any] | None, engine: str = DEFAULT_ENGINE
                    ) -> str | None:
        """Why a test has no A/B comparison in this session (None: it has one)."""
        if method == "none":
            return "it runs the reference alone, with no spec arm to compare"
        if self.base_engine is not None:  # one install, one config: the engine modes differ
            if engine == self.base_engine.name:
                return (f"it runs in engine mode {engine!r}, the base's (--specdec-base-engine): a candidate in "
                        "another mode is judged against it")
            return None
        if self.methods is None:  # another install: the same config on both
            return None
        if raw_config is not None:
            return "its marker gives its own speculative_config, so --specdec-base-draft names no base for it"
        if method not in self.methods:
            return (f"method {method!r} has no base (--specdec-base-draft names {', '.join(self.methods)}); "
                    "an A/B session judges only candidate vs base")
        return None

    def refuse(self, planned: Sequence[Planned]) -> None:
        """Before anything runs: a collected test whose marker asks what an A/B cannot do raises ConfigError
        naming the test and the field (`refusal`). Counts the session's gated family for the looks' stop rule."""
        from pytest_specdec.errors import ConfigError

        self.family_size = self.gated_size(planned)
        for p in planned:
            # a test with goodput SLOs has its goodput judged (shown, or gated), so a threshold may name it
            judged = (*self.judged(p.options), *((GOODPUT,) if p.goodput else ()))
            why = None if self.skip_reason(p.method, p.speculative_config, p.engine) else refusal(p, judged)
            if why:
                raise ConfigError(why)

    def base_arms(self, method: str, k: int | None, raw: dict[str, Any] | None, reference: ServerSpec,
                  placement: Placement, engine: str = DEFAULT_ENGINE) -> dict[str, ServerSpec]:
        """A test's base arms (none when it has no A/B comparison, `skip_reason`): the same method and k with the
        base's draft (a marker's own config ``raw``, on another install, as it is). On another install the candidate's
        reference moves to its interpreter too (the base's own reference arm); in an engine-mode A/B the base and its
        own reference run in the base's mode (the speedup is always spec ÷ reference within one mode). The base spec
        is tagged with its role, so it never shares the candidate's server."""
        if self.skip_reason(method, raw, engine) is not None:
            return {}
        config = raw if self.methods is None else None
        base = dataclasses.replace(placement.server_spec(method, k, config, False, self.base), role="base")
        if self.base_engine is not None:
            ref = placement.server_spec(method, None, raw, True)
            return {"base": self.base_engine.apply(base), "base_reference": self.base_engine.apply(ref)}
        if self.installs is None:
            return {"base": base}
        python = self.installs["base"].python
        return {"base": dataclasses.replace(base, python=python),
                "base_reference": dataclasses.replace(reference, python=python)}

    def start(self, test: TestStart) -> ABJudgement:
        """A test's comparison after its first pairs: both drafts, what differs between the two sides (versions,
        engine configs), its thresholds and gated metrics with its marker's on top, its planned looks."""
        from pytest_specdec.gate.baselines import diff

        specs = test.arms

        def draft(arm: str) -> str:
            return str((specs[arm].speculative_config or {}).get("model", "(no draft model)"))

        installs = self.installs

        def side(spec_arm: str, ref_arm: str, install: str) -> dict[str, Any]:
            versions = {} if installs is None else installs[install].versions()
            # each package of the install by name, so `changed` names every one whose version differs
            packages = {} if installs is None else {"packages": installs[install].package_versions()}
            return {**versions, **packages, "engine": dict(test.engines.get(spec_arm, {})),
                    "reference_engine": dict(test.engines.get(ref_arm, {}))}

        base_ref = "base_reference" if "base_reference" in specs else "reference"
        return ABJudgement(ABPlan(
            test.method, draft("base"), draft("spec"), {arm: s.key() for arm, s in specs.items()},
            self.test_thresholds(test.options.thresholds), installs,
            diff(side("base", base_ref, "base"), side("spec", "reference", "candidate")),
            engines=None if self.base_engine is None else (self.base_engine.name, test.engine.name),
            metrics=self.metrics(test.options), looks=self.planned_looks, max_looks=len(self.planned_looks),
            checked=test.options.check, alpha=self.options.alpha))

    def look(self, nodeid: str, c: ABJudgement, result: CaseResult, look: int) -> tuple[ABJudgement, Look]:
        """The pairs so far judged at look ``look``, alpha split over the planned looks; another look while the
        stop rule sees use in it, reading the verdicts at the session's family level (`ab.at_family_level`: a
        regressed or improved verdict stops a test only where the end's BH/Holm cannot take it back). At the last,
        the split of the candidate's speedup against the base's, and why it stopped (`ab.Stop`)."""
        from pytest_specdec.gate.ab import at_family_level, stop_kind, until_pairs_settle
        from pytest_specdec.gate.check import Look
        from pytest_specdec.gate.kinds import MAX_REACHED
        from pytest_specdec.gate.sequential import next_look
        from pytest_specdec.measure.explain import explain, split

        plan = c.plan
        n_now = min(len(result.runs), len(result.base_runs))
        raw = tuple(ab_verdicts(result, plan.thresholds, self.options.alpha, metrics=plan.metrics, look=look,
                                max_looks=plan.max_looks))
        # before collection counted the family (never in a session), a moved verdict cannot stop a test
        seen = at_family_level(list(raw), self.family_size or 10**9, self.options.alpha)
        nxt, why = next_look(plan.looks, look, n_now, seen, self.options.alpha, self.stop or until_pairs_settle)
        if nxt is not None:
            step = Look(n_now, raw, nxt, line=f"specdec A/B: {nodeid}: inconclusive at look {look} of "
                                              f"{len(plan.looks)}: {nxt} pairs")
            return dataclasses.replace(c, looks_taken=(*c.looks_taken, step)), step
        parts = split(explain([r.record for r in result.base_reference_runs or result.reference_runs],
                              [r.record for r in result.base_runs]),
                      explain([r.record for r in result.reference_runs], [r.record for r in result.runs]))
        if why:
            stop = stop_kind(seen)
            step = Look(n_now, raw, None, unspent=plan.looks[-1] - n_now, stop_reason=why,
                        line=f"specdec A/B: {nodeid}: stopped at {n_now} of {plan.looks[-1]} pairs ({stop}): {why}")
        else:
            stop, step = MAX_REACHED, Look(n_now, raw, None, stop_reason=f"all {n_now} planned pairs measured")
        return dataclasses.replace(c, looks_taken=(*c.looks_taken, step), stop=stop, split=parts), step

    def test_end(self, nodeid: str, family: Sequence[tuple[str, ABJudgement]], planned: Sequence[Planned]
                 ) -> tuple[ABJudgement, TestEnd]:
        """At a test's end: every A/B verdict so far adjusted, padded with p=1 to what the ``planned`` tests can
        add; a gated regression fails the test, a gated verdict still inconclusive warns (fails under
        --specdec-fail-inconclusive), unless its marker says check=False."""
        from pytest_specdec.gate.verdicts import drift_per_test

        judged = [p for p in planned if self.skip_reason(p.method, p.speculative_config, p.engine) is None]
        gated = self.gated_size(planned)
        shown = (len(AB_SHOWN) * len(judged) if self.installs else 0) + sum(  # the candidate's shown drift too
            drift_per_test(p.method) - len(p.drift) for p in judged)
        c = dict(adjust(family, final=False, multiplicity=self.options.multiplicity, alpha=self.options.alpha,
                        gated_size=gated, family_size=gated + shown))[nodeid]
        end = self.fail_rule.decide(checked=c.checked, status="compared", verdicts=c.shown(),
                                    drift=gated_drift(c.drift))
        return dataclasses.replace(c, end=end), end

    @property
    def fail_rule(self) -> FailRule:
        """The session's failure rule (`check.FailRule`): an A/B test always has its base to compare with."""
        from pytest_specdec.gate.check import FailRule

        return FailRule(fail_inconclusive=self.options.fail_inconclusive)

    def finish(self, tests: Sequence[Finished[ABJudgement]]) -> SessionEnd[ABJudgement]:
        """At the session's end: the whole family adjusted; the tests that regress only now (BH needs every p)
        are its late regressions, which fail the session."""
        from pytest_specdec.gate.protocol import SessionEnd

        family = adjust([(t.nodeid, t.check) for t in tests], final=True, multiplicity=self.options.multiplicity,
                        alpha=self.options.alpha)
        rule = self.fail_rule
        from pytest_specdec.gate.check import late_drift

        ends = [(n, c, rule.decide(checked=c.checked, status="compared", verdicts=c.shown(),
                                   drift=gated_drift(c.drift))) for n, c in family]
        return SessionEnd(None, tuple(family), late_regressions=tuple(
            (n, end) for n, c, end in ends if (end.outcome == REGRESSED and not c.failed) or late_drift(c.end, end)))
