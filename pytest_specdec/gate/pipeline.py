"""The gate's one chain from stored nights and tonight's runs to verdicts; every caller judges through it.

stored files → each stored night's machine factor → priors and pooled night variances (with the profile's
floor) → per test: tonight's machine deviation and raw verdicts → the session's machine factor → the raw
verdicts again with it → Benjamini-Hochberg/Holm over the family. The plugin's `Judge` walks it a test at
a time (its looks add runs in between, `look_step`), `pytest-specdec compare` and the validation scripts all at
once (`judge_all`); the last two steps are one function (`Pipeline.finish`) for all of them, so the CLI and
the plugin cannot disagree on the same data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

from pytest_specdec.gate.check import Look
from pytest_specdec.gate.kinds import NOT_COMPARABLE

if TYPE_CHECKING:
    from pytest_specdec.gate.check import Adjusted, Judgement
    from pytest_specdec.gate.machine import MachineFactor, StateTolerance
    from pytest_specdec.gate.nights import Night
    from pytest_specdec.gate.protocol import StopRule
    from pytest_specdec.gate.stats import Thresholds, Verdict
    from pytest_specdec.gate.variance import NightPrior, NightVariance, Prior


@dataclass(frozen=True)
class Stored:
    """Every stored baseline file of a profile (never tonight's runs): what the gate learns before tonight.

    Each figure is computed once, on first use: a session with no compared test never pays for them."""

    files: tuple[dict[str, Any], ...]
    min_night_sd: float = 0.0  # the profile's floor on the night-to-night sd of log-scale metrics, %
    #: What nights are assumed to spread before the files can say (`variance.NightPrior`); None: no prior.
    night_prior: NightPrior | None = None

    @cached_property
    def factors(self) -> dict[str, float]:
        """Each stored night's machine factor (log), by its session's ``started``."""
        from pytest_specdec.gate.machine import night_factors

        return night_factors(self.files)

    @cached_property
    def priors(self) -> dict[tuple[str, str], Prior]:
        """Empirical-Bayes variance priors per (unit, metric)."""
        from pytest_specdec.gate.verdicts import priors_from

        return priors_from(self.files)

    @cached_property
    def variances(self) -> dict[str, NightVariance]:
        """Per metric, the night-to-night and run-to-run variance pooled over the files, floor applied."""
        from pytest_specdec.gate.verdicts import night_variances, with_floor

        return with_floor(night_variances(self.files, self.factors, self.night_prior), self.min_night_sd)


@dataclass(frozen=True)
class Pipeline:
    """The chain's steps over one set of stored nights, at one level and multiplicity rule."""

    stored: Stored
    alpha: float
    multiplicity: str  # "bh" | "holm"
    #: ±% within which a stored night's machine state is tonight's, per kind (the profile's [verdicts]
    #: machine_state_tolerance, or this machine's calibration's): the state-bound metrics are judged against those
    #: nights only. None: not conditioned.
    state_tolerance: StateTolerance | None = None

    def deviation(self, baseline: dict[str, Any], night: Night) -> float | None:
        """log(tonight's reference speed ÷ the baseline's machine-neutral level): one test's term of the
        session's machine factor."""
        from pytest_specdec.gate.machine import tonight_deviation

        return tonight_deviation(baseline, night, self.stored.factors)

    def raw(self, c: Judgement, *, look: int, tonight_log: float | None) -> tuple[Verdict, ...]:
        """One test's verdicts before the family's adjustment: against its baseline when compared, every
        metric `not-comparable` when the baseline was measured under other conditions, none otherwise."""
        from pytest_specdec.gate.verdicts import evaluate, not_comparable_verdicts

        plan = c.plan
        if c.night is None:
            return ()
        if plan.status == "compared" and plan.baseline is not None:
            assert plan.thresholds is not None
            s = self.stored
            return tuple(evaluate(dict(plan.baseline), c.night, thresholds=plan.thresholds, alpha=self.alpha,
                                  look=look, max_looks=plan.max_looks, priors=s.priors, nights=s.variances,
                                  factors=s.factors, tonight_log=tonight_log, gate=plan.gate,
                                  state_tolerance=self.state_tolerance, machines=plan.machines))
        if plan.status == NOT_COMPARABLE:
            return tuple(not_comparable_verdicts(c.night, dict(plan.differs), plan.gate))
        return ()

    def look(self, c: Judgement, night: Night, *, look: int, tonight_log: Callable[[float | None], float | None]
             ) -> tuple[Judgement, tuple[Verdict, ...]]:
        """Tonight's runs so far (``night``) judged at ``look``: the judgement with them and its deviation, and the
        raw verdicts. Its machine deviation joins the factor first: ``tonight_log(deviation)`` is the factor of
        every test compared so far with this one's deviation counted."""
        plan = c.plan
        deviation = c.deviation
        if plan.status == "compared" and plan.baseline is not None and not plan.machines:  # never another machine's
            deviation = self.deviation(dict(plan.baseline), night)
        c = replace(c, night=night, deviation=deviation)
        return c, self.raw(c, look=look, tonight_log=tonight_log(deviation))

    def test_end(self, family: Sequence[tuple[str, Judgement]], nodeid: str, *, gated_size: int,
                 family_size: int) -> Adjusted:
        """A test's verdicts and gated drift verdicts at its end: adjusted over the family so far, padded with p = 1
        to the sizes the collected tests can reach (the later tests' p-values are not known yet)."""
        from pytest_specdec.gate.check import adjusted

        return adjusted(family, nodeid, final=False, multiplicity=self.multiplicity, alpha=self.alpha,
                        gated_size=gated_size, family_size=family_size)

    def machine(self, checks: Iterable[Judgement], thresholds: Thresholds) -> MachineFactor | None:
        """The session's machine factor from every compared test's deviation (None without one); it warns
        beyond the session's reference threshold."""
        from pytest_specdec.gate.machine import machine_factor, warn_threshold

        return machine_factor([c.deviation for c in checks if c.plan.status == "compared" and c.raw
                               and c.deviation is not None], warn_threshold(thresholds), self.alpha)

    def rejudge(self, c: Judgement, machine: MachineFactor) -> Judgement:
        """A compared test's raw verdicts again, with the session's machine factor divided out of the absolute
        figures (at its last look)."""
        return replace(c, rejudged=self.raw(c, look=len(c.looks_taken) or 1, tonight_log=machine.log))

    def finish(self, family: Sequence[tuple[str, Judgement]], thresholds: Thresholds,
               errors: list[tuple[str, str]] | None = None
               ) -> tuple[MachineFactor | None, list[tuple[str, Judgement]]]:
        """Session end: the machine factor over every compared test, each compared test's raw verdicts again
        with it (`rejudge`), then every test's final verdicts, BH/Holm over the whole family (``final``): the factor
        and every test's final judgement. ``thresholds``: the session's (not a marker's). With ``errors``, a test
        whose verdicts raise is left without verdicts and its (nodeid, why) goes there: one test's fault never
        loses the others' verdicts."""
        from pytest_specdec.gate.check import Adjusted, adjusted_all

        machine = self.machine([c for _, c in family], thresholds)
        judged = list(family)
        if machine is not None:
            for i, (nodeid, c) in enumerate(judged):
                if c.plan.status == "compared" and c.raw:
                    try:
                        judged[i] = (nodeid, self.rejudge(c, machine))
                    except Exception as exc:  # noqa: BLE001 - this test's verdicts are lost, not the family's
                        if errors is None:
                            raise
                        judged[i] = (nodeid, replace(c, rejudged=()))
                        errors.append((nodeid, f"its final verdicts could not be computed ({type(exc).__name__}: "
                                               f"{exc})"))
        final = adjusted_all(judged, final=True, multiplicity=self.multiplicity, alpha=self.alpha, gated_size=0,
                             family_size=0)
        out = []
        for n, c in judged:
            a = final.get(n, Adjusted())
            out.append((n, replace(c, final=a.verdicts if c.raw else (), drift=a.drift_of(c))))
        return machine, out


def judge_all(pipeline: Pipeline, family: Sequence[tuple[str, Judgement]], thresholds: Thresholds
              ) -> tuple[MachineFactor | None, list[tuple[str, Judgement]]]:
    """Every test of a finished night at once, as the plugin judges them by the session's end: each test at
    its last look (the looks it took, ``looks_taken``; one look when none) against its baseline, then
    `Pipeline.finish`. The judgements must hold tonight's night and their plan; the judged ones are returned."""
    judged = []
    for nodeid, c in family:
        if (night := c.night) is not None:
            c, raw = pipeline.look(c, night, look=len(c.looks_taken) or 1, tonight_log=lambda _: None)
            last = c.looks_taken[-1] if c.looks_taken else Look(len(night.reference))
            c = replace(c, looks_taken=(*c.looks_taken[:-1], replace(last, raw=raw)))
        judged.append((nodeid, c))
    return pipeline.finish(judged, thresholds)


def look_step(pipeline: Pipeline, c: Judgement, looks: Sequence[int], look: int, night: Night, *,
              tonight_log: Callable[[float | None], float | None], stop: StopRule | None = None
              ) -> tuple[Judgement, Look]:
    """Look ``look`` (1-based) of the planned ``looks``: tonight's runs so far (``night``) judged; the judgement
    with the look added, and the look: the runs per arm of the next (None when this one is the last: all planned
    runs taken, or ``stop``, a `protocol.StopRule`, by default `sequential.until_settled`, says why not: the runs
    not spent and why)."""
    from pytest_specdec.gate.sequential import next_look, until_settled

    n_now = len(night.reference)
    c, raw = pipeline.look(c, night, look=look, tonight_log=tonight_log)
    nxt, why = next_look(looks, look, n_now, list(raw), pipeline.alpha, stop or until_settled)
    step = Look(n_now, raw, nxt, unspent=looks[-1] - n_now if why else 0, stop_reason=why or "")
    return replace(c, looks_taken=(*c.looks_taken, step)), step


def sequential(pipeline: Pipeline, c: Judgement, looks: Sequence[int], night_at: Callable[[int], Night], *,
               tonight_log: Callable[[float | None], float | None], stop: StopRule | None = None) -> Judgement:
    """A test's looks at once (the simulations): judge its first runs; while ``stop`` lets it (`look_step`),
    take the runs of the next look (``night_at(n)``: tonight with n runs per arm) and judge again, alpha split
    over the planned looks. The judgement with the looks taken and, when it stops early, the runs not spent
    and why."""
    from pytest_specdec.gate.protocol import look_loop

    runs = [looks[0]]  # tonight's runs per arm at each look taken

    def judge(j: Judgement, look: int) -> tuple[Judgement, Look]:
        return look_step(pipeline, j, looks, look, night_at(runs[-1]), tonight_log=tonight_log, stop=stop)

    return look_loop(c, judge, runs.append)
