"""The stored-nights gate of one session (a `protocol.Gate`): which baselines it reads, how each test is
compared and when it stops adding runs, the machine factor at the end, and which baselines it writes.

The pytest session drives it through the protocol (start, look, test end, finish) and turns the outcomes into
failures and warnings; this object holds what the steps share (the profile's stored baselines, read once; the
thresholds) and does the steps' work through the gate's one chain (`pipeline.Pipeline`).
"""

from __future__ import annotations

import datetime as dt
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_specdec.gate.check import Judgement, Plan
from pytest_specdec.gate.drift import gated_drift
from pytest_specdec.gate.kinds import GATED as GATED_FAMILY
from pytest_specdec.gate.kinds import MOVED, NOT_COMPARABLE, REGRESSED
from pytest_specdec.gate.protocol import SessionEnd
from pytest_specdec.gate.store import BaselineWrites

if TYPE_CHECKING:
    from pytest_specdec.gate.check import FailRule, Look, TestEnd
    from pytest_specdec.gate.machine import StateTolerance
    from pytest_specdec.gate.pipeline import Pipeline
    from pytest_specdec.gate.protocol import Finished, GateOptions, Planned, StopRule, TestStart
    from pytest_specdec.gate.stats import Thresholds
    from pytest_specdec.gate.store import BaselineStore, Hardware
    from pytest_specdec.gate.variance import NightPrior, NightVariance
    from pytest_specdec.measure.runner import CaseResult
    from pytest_specdec.profiles import Profile


@dataclass(frozen=True)
class CalibrationUsed:
    """The calibration the verdicts were judged with (`Judge.calibration_used`): where its record is, its sessions,
    what a lone test catches, the thresholds it raised (metric: (before, after)), and the state tolerance it
    measured where it saw the machine's state move (None: the profile's). The results keep it in
    `gate.settings.calibration` (`output.schema.calibration_used_entry`)."""

    path: str
    sessions: int
    catches: str
    raised_thresholds: dict[str, tuple[float, float]]
    state_tolerance: StateTolerance | None


@dataclass(frozen=True)
class GateConfig:
    """Where the stored nights' gate reads and writes, and how it judges (the session's `GateOptions`)."""

    profile: Profile
    baselines_dir: Path
    rootpath: Path
    update: str | None  # --update-baselines: None, "all" or "missing"
    keep_sessions: int
    options: GateOptions
    started: float = 0.0  # the session's start (epoch s): the stamp of tonight's night in a baseline file


class Judge:
    """Compares each test with its stored baseline and writes baselines at the session's end."""

    def __init__(self, cfg: GateConfig, stop: StopRule | None = None) -> None:
        """``stop``: when a compared test stops adding runs before its last planned look (None: the default,
        `sequential.until_settled`)."""
        self.cfg, self.stop = cfg, stop
        self.opened = False  # whether a test of this process read its baseline (an xdist worker sends the store)
        #: this process's tests, in order, as last judged: the machine factor so far
        self._started: dict[str, Judgement] = {}

    @cached_property
    def store(self) -> BaselineStore:
        from pytest_specdec.gate.conditions import machine
        from pytest_specdec.gate.store import BaselineStore

        return BaselineStore(self.cfg.baselines_dir, self.cfg.profile.name, machine(self.cfg.profile),
                             mode=self.cfg.update, keep=self.cfg.keep_sessions)

    @cached_property
    def hardware(self) -> Hardware:
        """This machine's baselines folder and the other machines' of the profile (read once, at the first
        test, before any write)."""
        import dataclasses

        return dataclasses.replace(self.store.machines(), root=self.rel(self.store.root))

    @property
    def updating_all(self) -> bool:
        return self.cfg.update == "all"

    @property
    def pooled_variances(self) -> dict[str, NightVariance]:
        """What was pooled (empty when no test was compared), for the results."""
        pipeline = self.__dict__.get("pipeline")
        return pipeline.stored.__dict__.get("variances", {}) if pipeline is not None else {}

    def looks(self) -> list[int]:
        """Runs per arm at each planned look: first the runs, then two more at a time up to max_runs (both
        resolved and checked before the session runs anything)."""
        from pytest_specdec.gate.sequential import planned_looks

        return planned_looks(self.cfg.options.runs, 2, max(self.cfg.options.runs, self.cfg.options.max_runs))

    def gate(self, extra: tuple[str, ...] = ()) -> tuple[str, ...]:
        """The gated family's metrics: speedup, acceptance, P95 E2E ratio, plus ini and marker additions."""
        from pytest_specdec.gate.registry import GATED

        return tuple(dict.fromkeys((*GATED, *self.cfg.options.gate, *extra)))

    @cached_property
    def _base_thresholds(self) -> list[dict[str, float]]:
        """The profile's, the ini's and the command line's threshold layers, each checked where it was given."""
        from pytest_specdec.gate.thresholds import layers

        profile, options = self.cfg.profile, self.cfg.options
        return layers(profile.raw.get("verdicts", {}).get("thresholds", {}),
                      f"profile {profile.path} [verdicts] thresholds", options.ini_thresholds, options.cli_thresholds)

    def thresholds(self, marker: dict[str, float] | None = None) -> Thresholds:
        """Defaults < profile [verdicts.thresholds] < ini specdec_thresholds < --specdec-threshold < marker."""
        from pytest_specdec.gate.thresholds import build_thresholds, on_top

        t = build_thresholds(*self._base_thresholds, *([marker] if marker else []))
        raised = self.raised(t)
        return on_top(t, {name: new for name, (_, new) in raised.items()}) if raised else t

    def raised(self, thresholds: Thresholds) -> dict[str, tuple[float, float]]:
        """The thresholds this machine's calibration raises to what a lone test can resolve (none without one)."""
        from pytest_specdec.gate.calibration import raised_thresholds

        return raised_thresholds(self.judged_calibration, thresholds) if self.judged_calibration is not None else {}

    @cached_property
    def judged_calibration(self) -> dict[str, Any] | None:
        """This machine's calibration with what a lone test catches and resolves figured as the gate judges with
        it (its night prior blended with the profile's, the floor): what the session says, and the thresholds it
        raises (`calibration.as_judged`)."""
        from pytest_specdec.gate.calibration import as_judged

        if self.calibration is None:
            return None
        return as_judged(self.calibration, self.night_prior, min_night_sd=self.cfg.profile.min_night_sd,
                         alpha=self.cfg.options.alpha)

    @cached_property
    def stored(self) -> list[dict[str, Any]]:
        """Every readable stored baseline of this profile (read once, before any verdict)."""
        return self.store.readable()

    @cached_property
    def pipeline(self) -> Pipeline:
        """The gate's chain over this profile's stored nights (gate/pipeline.py)."""
        from pytest_specdec.gate.pipeline import Pipeline, Stored

        profile = self.cfg.profile
        return Pipeline(Stored(tuple(self.stored), profile.min_night_sd, self.night_prior),
                        self.cfg.options.alpha, self.cfg.options.multiplicity, self.state_tolerance)

    @cached_property
    def state_tolerance(self) -> StateTolerance:
        """Within how far a stored night's machine state is tonight's, per kind: measured by this machine's
        calibration where it saw the state move (`calibration.state_tolerance_of`), else the profile's."""
        from pytest_specdec.gate.calibration import CALIBRATION_NAME, state_tolerance_of
        from pytest_specdec.gate.variance import night_prior_from

        if self.calibration is None:
            return self.profile_state_tolerance
        profile = self.cfg.profile
        return state_tolerance_of(self.calibration, night_prior_from(profile.night_prior, profile.night_prior_source),
                                  self.profile_state_tolerance,
                                  f"this machine's calibration {self.rel(self.store.base / CALIBRATION_NAME)}")

    @property
    def profile_state_tolerance(self) -> StateTolerance:
        """The profile's ``[verdicts] machine_state_tolerance``, one for every kind."""
        from pytest_specdec.gate.machine import StateTolerance

        return StateTolerance.of_profile(self.cfg.profile.name, self.cfg.profile.machine_state_tolerance)

    @cached_property
    def calibration(self) -> dict[str, Any] | None:
        """This machine's calibration record (`gate.calibration`), read once; None where it has none."""
        from pytest_specdec.gate.calibration import CALIBRATION_NAME, load_calibration

        return load_calibration(self.store.base / CALIBRATION_NAME)

    @property
    def calibration_used(self) -> CalibrationUsed | None:
        """The calibration the verdicts were judged with (where, its sessions, what a lone test catches); None when
        none was (no compared test, or no record)."""
        from pytest_specdec.gate.calibration import CALIBRATION_NAME, catch_phrase

        if "pipeline" not in self.__dict__ or self.calibration is None:
            return None
        from pytest_specdec.gate.thresholds import build_thresholds

        raised = self.raised(build_thresholds(*self._base_thresholds))
        return CalibrationUsed(self.rel(self.store.base / CALIBRATION_NAME), len(self.calibration["sessions"]),
                               catch_phrase(self.judged_calibration or self.calibration), raised,
                               # where the record saw the state move and measured a tolerance of its own
                               None if self.state_tolerance.profiles else self.state_tolerance)

    @cached_property
    def night_prior(self) -> NightPrior:
        """What nights are assumed to move before the stored nights can say: the profile's `[verdicts]
        night_prior` (or the default's guess), narrowed by this machine's calibration where it has one."""
        from pytest_specdec.gate.calibration import CALIBRATION_NAME, prior_of
        from pytest_specdec.gate.variance import night_prior_from

        profile = self.cfg.profile
        base = night_prior_from(profile.night_prior, profile.night_prior_source)
        if self.calibration is None:
            return base
        return prior_of(self.calibration, f"this machine's calibration {self.rel(self.store.base / CALIBRATION_NAME)}",
                        base)

    def create_command(self, nodeid: str, mode: str) -> str:
        """The command that writes this test's baseline (`mode` "missing" or "all")."""
        flag = "--update-baselines" + ("=missing" if mode == "missing" else "")
        extra = ([f"--specdec-baselines={self.cfg.baselines_dir}"]
                 if self.cfg.baselines_dir != self.cfg.rootpath / "baselines" else [])
        return shlex.join(["pytest", nodeid, flag, *extra])

    def rel(self, path: Path) -> str:
        """A baseline path as the user's checkout names it."""
        from pytest_specdec.gate.baselines import relative

        return relative(path, self.cfg.rootpath)

    def test_end(self, nodeid: str, family: Sequence[tuple[str, Judgement]], planned: Sequence[Planned]
                 ) -> tuple[Judgement, TestEnd]:
        """At the end of a test, its verdicts adjusted over the ``family`` so far (padded to the sizes the
        ``planned`` tests can reach), and what they decide.

        Regressions fail the test; a missing baseline fails with the command that creates it, except on a
        machine with no baselines of its own while another machine has some: the session says that once
        (`SessionEnd.no_own_baselines`) and the test passes (fails under --specdec-strict); a non-comparable
        baseline warns (fails under --specdec-strict); inconclusive gated verdicts warn (fail under
        --specdec-fail-inconclusive).
        """
        from pytest_specdec.gate.verdicts import drift_per_test, gated_per_test, metrics_per_test

        c = dict(family)[nodeid]
        drifts = sum(gated_per_test(p.method, p.drift) for p in planned)  # gated drift metrics: gated members too
        adjusted = self.pipeline.test_end(
            family, nodeid, gated_size=drifts + sum(gated_per_test(p.method, self.gate(p.options.gate))
                                                    for p in planned),
            family_size=sum(metrics_per_test(p.method, p.k, p.goodput) + drift_per_test(p.method) for p in planned))
        drift = adjusted.drift_of(c)
        end = replace(self.fail_rule.decide(checked=c.plan.checked, status=c.plan.status, verdicts=adjusted.verdicts,
                                            portable_only=bool(c.plan.machines),
                                            drift=gated_drift(drift)),
                      where=self.rel(c.plan.path))
        if end.outcome in ("missing", REGRESSED):  # the command that creates or accepts the baseline
            end = replace(end, command=self.create_command(nodeid, "missing" if end.outcome == "missing" else "all"))
        return replace(c, verdicts=adjusted.verdicts, drift=drift, end=end), end

    @property
    def fail_rule(self) -> FailRule:
        """The session's failure rule (`check.FailRule`): a missing baseline fails but while baselines are
        recorded, and on a machine with none of its own (said once for the session) unless --specdec-strict."""
        from pytest_specdec.gate.check import FailRule

        options = self.cfg.options
        return FailRule(strict=options.strict, fail_inconclusive=options.fail_inconclusive, replacing=self.updating_all,
                        missing_fails=not self.cfg.update and (options.strict or not self.hardware.without_own))

    def start(self, test: TestStart) -> Judgement:
        """Read the test's baseline and say whether tonight can be compared with it (`gate/conditions.py`:
        what must be equal, and what is under test; ``test.engines`` are the arms' resolved engine configs,
        ``test.endpoint_versions`` in endpoint mode the versions each arm's endpoint told); its thresholds
        and gated family with its marker's on top."""
        from pytest_specdec.gate.baselines import BaselineError, diff
        from pytest_specdec.gate.conditions import comparability, under_test

        profile, nodeid = self.cfg.profile, test.nodeid
        reference, spec = test.arms["reference"], test.arms.get("spec")
        comp = comparability(profile, self.store.fingerprint, test.method, dict(test.workload), dict(test.dataset),
                             reference, spec, test.sampling, test.engine)
        tested = under_test(profile, {k: dict(v) for k, v in test.engines.items()}, spec, endpoint=test.endpoint,
                            endpoint_versions=None if test.endpoint_versions is None
                            else {k: dict(v) for k, v in test.endpoint_versions.items()})
        self.opened = True
        thresholds = self.thresholds(dict(test.options.thresholds) or None)
        plan = Plan(self.store.path(nodeid), "missing", test.options.check, comp, tested, alpha=self.cfg.options.alpha,
                    gate=self.gate(test.options.gate), thresholds=thresholds)
        try:
            _, data = self.store.read(nodeid, self.create_command(nodeid, "missing"))
        except BaselineError as exc:
            plan = replace(plan, status="error", error=str(exc))
        else:
            if data is not None:
                differs = diff(data["comparability"], comp)
                plan = replace(plan, status=NOT_COMPARABLE if differs else "compared", baseline=data, differs=differs)
            elif self.hardware.others and not self.updating_all:  # acceptance needs no nights of this machine
                found = self.store.portable(nodeid, comp, [m.key for m in self.hardware.others])
                if found is not None:
                    plan = replace(plan, status="compared", baseline=found[0], machines=found[1])
            if plan.checked and plan.status == "compared" and not self.updating_all:
                plan = replace(plan, max_looks=len(self.looks()))
        c = self._started[nodeid] = Judgement(plan)  # its machine deviation joins the factor from its first look
        return c

    def look(self, nodeid: str, c: Judgement, result: CaseResult, look: int) -> tuple[Judgement, Look]:
        """Tonight's runs so far judged at look ``look`` (`pipeline.look_step`): a compared test looks again
        while a gated verdict is inconclusive and another look could settle it (the gate's stop rule), alpha
        split over the planned looks; the machine factor is every test's of this session so far."""
        from pytest_specdec.gate.check import machine_log
        from pytest_specdec.gate.nights import Night
        from pytest_specdec.gate.pipeline import look_step

        looks = self.looks() if c.plan.max_looks > 1 else [self.cfg.options.runs]
        others = [j.deviation for n, j in self._started.items() if n != nodeid]
        c, step = look_step(self.pipeline, c, looks, look, Night.from_result(result),
                            tonight_log=lambda deviation: machine_log([*others, deviation]), stop=self.stop)
        line = ""
        if step.next_runs is not None:
            line = f"specdec: {nodeid}: inconclusive at look {look} of {len(looks)}: {step.next_runs} interleaved runs"
        elif step.unspent:
            line = f"specdec: {nodeid}: {step.unspent} run(s) per arm not spent: {step.stop_reason}"
        step = replace(step, line=line)
        c = self._started[nodeid] = replace(c, looks_taken=(*c.looks_taken[:-1], step))
        return c, step

    def write(self, tests: Sequence[Finished[Judgement]]) -> tuple[list[str], BaselineWrites, bool]:
        """--update-baselines: queue each passed test with valid runs, then
        write them all at once; returns the terminal's lines, the same as data (what was written and what
        was not, and why), and whether a file could not be written (the session then fails)."""
        from pytest_specdec.gate.baselines import night_entry
        from pytest_specdec.gate.nights import Night
        from pytest_specdec.gate.store import Pending

        stamp = dt.datetime.fromtimestamp(self.cfg.started, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        lines: list[str] = []
        not_written: list[tuple[str, str]] = []
        for t in tests:
            nodeid, c = t.nodeid, t.check
            plan = c.plan
            why = f"the test {t.outcome}" if t.outcome != "passed" else unwritable(t.result)
            if why:
                lines.append(f"specdec: not writing {self.rel(plan.path)}: {why}")
                not_written.append((self.rel(plan.path), why))
                continue
            # Only a gated change is a change being accepted (it drops the older nights); a shown-family
            # figure that moved with the machine must not wipe the file's history.
            changed = ", ".join(f"{v.metric} {v.verdict}" for v in c.shown()
                                if v.verdict in MOVED and v.family == GATED_FAMILY)
            assert t.result is not None  # unwritable() names a test that measured nothing
            under = dict(plan.under_test)
            entry = night_entry(Night.from_result(t.result, stamp, under))  # tonight as a baseline stores it
            self.store.queue(Pending(nodeid, plan.path, dict(plan.comparability), under, entry, changed))
        summary = self.store.flush()
        rel = self.rel
        writes = BaselineWrites(
            root=rel(self.store.root), mode=self.cfg.update or "all", created=tuple(map(rel, summary.created)),
            updated=tuple((rel(p), what) for p, what in summary.updated),
            unchanged=tuple((rel(p), why) for p, why in summary.unchanged), unused=tuple(map(rel, summary.unused)),
            not_written=(*not_written, *((rel(p), f"could not write it: {why}") for p, why in summary.failed)))
        return lines + summary.lines(self.store.root), writes, bool(summary.failed)

    def finish(self, tests: Sequence[Finished[Judgement]]) -> SessionEnd[Judgement]:
        """Session end: the machine factor over every compared test and every test's final verdicts
        (`Pipeline.finish`); beyond its threshold the factor fails the session (--specdec-fail-machine), else
        `machine_warns` asks the wiring to warn. Then the tests that regress only once the whole family is
        known, and the queued baseline writes. ``tests``: the session's, in its order."""
        from pytest_specdec.gate.check import late_drift
        from pytest_specdec.gate.machine import state_summary
        from pytest_specdec.gate.protocol import Finished

        errors: list[tuple[str, str]] = []
        machine, family = self.pipeline.finish([(t.nodeid, t.check) for t in tests], self.thresholds(), errors)
        beyond = machine is not None and machine.beyond and not self.updating_all
        rule = self.fail_rule
        late = []
        for nodeid, c in family:
            end = rule.decide(checked=c.plan.checked, status=c.plan.status, verdicts=c.final or [],
                              portable_only=bool(c.plan.machines), drift=gated_drift(c.drift))
            if (end.outcome == REGRESSED and not c.failed) or late_drift(c.end, end):
                late.append((nodeid, replace(end, where=self.rel(c.plan.path),
                                             command=self.create_command(nodeid, "all"))))
        # their speed judged against nothing: no baseline, or other machines' nights (acceptance judged alone)
        unjudged = tuple(n for n, c in family if c.plan.status == "missing" or c.plan.machines)
        own = (self.hardware, unjudged) if unjudged and (
            self.hardware.without_own or (self.cfg.update and not self.hardware.this.files)) else None
        written: tuple[list[str], BaselineWrites | None, bool] = ([], None, False)
        if self.cfg.update and tests:  # a test read its baseline here or, under xdist, on a worker
            final = dict(family)
            written = self.write([Finished(t.nodeid, final[t.nodeid], t.result, t.outcome) for t in tests])
        return SessionEnd(machine, tuple(family), machine_failed=beyond and self.cfg.options.fail_machine,
                          machine_warns=beyond and not self.cfg.options.fail_machine, late_regressions=tuple(late),
                          written=tuple(written[0]), baselines=written[1], baselines_failed=written[2],
                          no_own_baselines=own, state=state_summary(
                              [c.night for _, c in family],
                              [(n, c.plan.baseline, c.final or c.raw) for n, c in family
                               if c.plan.status == "compared" and c.plan.baseline is not None
                               and not c.plan.machines],
                              self.pipeline.state_tolerance),
                          errors=tuple(errors))


def unwritable(result: CaseResult | None) -> str:
    """Why tonight's runs must not become a baseline night ("" when they may): each arm needs a valid run,
    and a test with a spec arm a valid pair, or the file would trade real nights for one that says nothing
    (a dead spec server's night has only the reference's runs)."""
    from pytest_specdec.measure.record import dead_arms

    if result is None:
        return "nothing was measured"
    dead = dead_arms(result.reference_runs, result.runs or None)
    if dead:
        runs = result.reference_runs if dead[0] == "reference" else result.runs
        return f"the {dead[0]} arm has no valid run (of {len(runs)})"
    if result.runs and not any(s is not None for s in result.speedup_per_pair):
        return "no pair of runs is valid on both arms"
    return ""
