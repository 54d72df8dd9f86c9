"""The one object a pytest session keeps in `config.stash`: it decides when each stage runs (servers,
runs, verdicts, files) and holds what the stages share; the stages themselves live in their subpackages
(docs/architecture.md). `plugin.py` only forwards hooks here; nothing here starts work at import time. The
session's end, a step at a time, is `session_end.py`'s.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_specdec.markers import Case, VerdictOptions
from pytest_specdec.measure.saturation import Saturations
from pytest_specdec.measure.serving import Serving
from pytest_specdec.measure.workload import Workload
from pytest_specdec.options import Settings
from pytest_specdec.output.results import TestRecord
from pytest_specdec.output.schema import summary_entry
from pytest_specdec.output.wording import coalesced_lines, test_end_message

if TYPE_CHECKING:
    from pytest_specdec.gate.ab_session import ABGate
    from pytest_specdec.gate.crossover_gate import CrossoverEnd
    from pytest_specdec.gate.drift import Drift
    from pytest_specdec.gate.judge import Judge
    from pytest_specdec.gate.protocol import Gate, GateOptions, Planned, SessionEnd
    from pytest_specdec.measure.datasets import Dataset
    from pytest_specdec.measure.lossless import Collected
    from pytest_specdec.measure.runner import CaseResult
    from pytest_specdec.measure.saturation import RatePoint, Saturation
    from pytest_specdec.measure.serving import CaseRun
    from pytest_specdec.measure.types import Prompt, Sampling
    from pytest_specdec.measure.validity import ValidityRules
    from pytest_specdec.output.timing import SessionTime
    from pytest_specdec.profiles import Profile
    from pytest_specdec.profiles.placement import Placement
    from pytest_specdec.servers.pool import ServerPool, StartRecord
    from pytest_specdec.vllm.command import ServerSpec


class SpecDecWarning(pytest.PytestWarning):
    """A pytest-specdec condition worth seeing that does not fail the test (e.g. a non-comparable baseline)."""


class SpecDecSession:
    """State of the plugin for one pytest session."""

    def __init__(self, settings: Settings, rootpath: Path, progress: Callable[[str], None]) -> None:
        self.settings = settings
        self.rootpath = rootpath
        self.progress = progress
        self.started = time.time()
        self._profile: Profile | None = None
        self._limits: tuple[int, int] | None = None  # (runs, max_runs), see run_limits
        self.runs_note: str | None = None  # an explicit --specdec-runs raised the profile's max_runs
        self._pool: ServerPool | None = None
        self._placement: Placement | None = None
        self.workload = Workload(rootpath, progress)
        self.records: dict[str, TestRecord] = {}
        self._judge: Judge | None = None
        self._gate_options: GateOptions | None = None  # see gate_options
        self.ab: ABGate | None = None  # an A/B session's gate (--specdec-base-draft), built at configure
        self.end: SessionEnd[Any] | None = None  # the gate's last word (machine factor, late regressions, writes)
        self.crossovers: CrossoverEnd | None = None  # each concurrency sweep's crossover, judged at the end
        self.saturations = Saturations()  # each rate sweep's reference saturation, measured at its first test
        #: the collected specdec tests as their gate sees them: what each can add to the family (for BH before
        #: all are known), and what an A/B refuses before anything runs
        self.planned: list[Planned] = []
        #: what failed at the session's end (what, why): each fails the session, the rest is still written
        self.errors: list[tuple[str, str]] = []
        self.summary_lines: list[str] = []
        self.gate_summary: list[str] = []  # the gate's last lines of the terminal summary
        self.hardware_note = ""  # how the profile was (or was not) checked against the GPUs, for the dry run
        self.collected: list[Case] = []  # every collected case (endpoint mode asks which spec configs are wanted)
        self.run_order: list[tuple[str, Case]] = []  # the specdec tests in the order they run (servers start ahead)
        # the pool's servers, or the external endpoints (which must serve the profile's target model)
        self.serving = Serving(lambda: self.pool, settings, lambda: settings.served_model or self.profile.target)
        #: pytest-xdist: this worker's id ("gw0"), None on the controller and without xdist
        self.worker: str | None = None
        self.workers = 1  # xdist workers of the session (each leases GPUs of its own)
        #: on the controller: what each finished worker sent besides its records (servers, starts)
        self.remote: list[dict[str, Any]] = []
        self.measured_by: dict[str, str] = {}  # nodeid -> worker, to catch a test measured twice
        self.xdist_lines: list[str] = []  # controller: what went wrong collecting workers' results
        self.worker_lines: list[str] = []  # a worker: lines for the controller's summary (the strays it stopped)
        self.report_paths: list[Path] = []
        self.result_paths: list[Path] = []  # the JSON files written at session end
        self.time: SessionTime | None = None  # where the wall time went, made with the results at the end
        self.gpu_names: str | None = None  # nvidia-smi's GPUs ("NVIDIA H100 80GB HBM3 x8"), once listed
        self._distributions: dict[tuple[str, int], Collected] = {}  # (nodeid, samples per prompt) -> scored samples
        #: gives SIGTERM/SIGHUP back at unconfigure; set once a specdec test is collected (plugin._start_using)
        self.undo_signals: Callable[[], None] = lambda: None

    # --- configuration -------------------------------------------------------------------------
    @property
    def profile(self) -> Profile:
        """The active profile; a GPU profile is checked against nvidia-smi, except in a dry run."""
        if self._profile is None:
            from pytest_specdec.profiles.resolve import resolve

            st = self.settings
            r = resolve(st.profile_path or st.gpu, endpoint=bool(st.endpoint), dry_run=st.dry_run,
                        drafts=dict(st.drafts))
            self._profile, self.gpu_names, self.hardware_note = r.profile, r.gpu_names, r.note
        return self._profile

    @property
    def pool(self) -> ServerPool:
        if self._pool is None:
            from pytest_specdec.profiles.pool import server_pool

            st, logs = self.settings, self.settings.reports_dir / "logs"
            self._pool = server_pool(
                self.placement, logs / self.worker if self.worker else logs,  # workers may run the same spec at once
                gpus=st.gpus, lease_dir=st.lease_dir, startup_timeout_s=st.startup_timeout_s, gpu_wait_s=st.gpu_wait_s,
                pin_cpus=st.pin_cpus, worker=self.worker, progress=self.progress, workers=self.workers)
        return self._pool

    def gpu_problem(self) -> str | None:
        """Why this host's GPUs cannot hold a test's servers (too few for one, for the arms at once, or for the
        xdist workers' shares: `profiles.pool.lease_plan`), found by making the pool at collection, so it is one
        usage error before any server starts, not one error per test; None on the CPU and when they fit."""
        from pytest_specdec.errors import SpecDecError

        if self.profile.device == "cpu" or self.settings.endpoint:
            return None
        try:
            self.pool  # noqa: B018 -- made now: it checks the host's GPUs
        except SpecDecError as exc:
            return str(exc)
        return None

    def runs(self) -> int:
        """Run pairs per test at the first look: --specdec-runs, else the profile's."""
        return self.run_limits()[0]

    def max_runs(self) -> int:
        """Run pairs per test up to which inconclusive verdicts add runs (never below `runs()`)."""
        return self.run_limits()[1]

    def run_limits(self) -> tuple[int, int]:
        """(runs, max_runs) as `profiles.resolve.run_limits` resolves them from the options and the profile;
        `runs_note` says when an explicit --specdec-runs raised the profile's max_runs."""
        if self._limits is None:
            from pytest_specdec.profiles.resolve import run_limits

            st = self.settings
            (runs, max_runs), self.runs_note = run_limits(self.profile, st.runs, st.max_runs, ab=bool(st.ab_flag))
            self._limits = (runs, max_runs)
        return self._limits

    def check_configure(self) -> None:
        """At configure: explicit --specdec-runs / --specdec-max-runs resolved against the profile, and an A/B
        session's gate built (`ABGate`) from every option that shapes a verdict, so a conflict stops the session
        before anything is collected or started. What an A/B cannot apply is refused by name."""
        st = self.settings
        if st.runs is None and st.max_runs is None and not st.ab_flag:
            return
        from pytest_specdec.errors import ConfigError
        from pytest_specdec.gate.ab_session import ABGate, refuse_stored_night_options

        try:  # a profile that could not be read: the message names the file and key
            self.run_limits()
            if st.ab_flag:
                refuse_stored_night_options(st.ab_flag, strict=st.strict, fail_machine=st.fail_machine)
                self.ab = ABGate(self.profile, dict(st.base_drafts), self.gate_options, base_python=st.base_python,
                                 base_engine=st.base_engine)
        except ConfigError as exc:
            raise pytest.UsageError(str(exc)) from None

    def plan(self, tests: list[tuple[str, Case, VerdictOptions | None]]) -> None:
        """At collection: the collected specdec tests (nodeid, case, their `specdec_verdicts` options) as their gate
        sees them; a marker field an A/B session cannot apply is a usage error naming the test."""
        from pytest_specdec.errors import ConfigError
        from pytest_specdec.gate.protocol import Planned
        from pytest_specdec.gate.registry import GOODPUT

        self.collected = [case for _, case, _ in tests]
        self.run_order = [(nodeid, case) for nodeid, case, _ in tests]
        self.planned = [Planned(nodeid, case.method, case.k, case.speculative_config,
                                (options or VerdictOptions()).for_gate(), bool(case.goodput), case.engine,
                                drift=self.drift_gate(options))
                        for nodeid, case, options in tests]
        for p in self.planned:  # a goodput gated without SLOs would never be judged
            if GOODPUT in p.options.gate and not p.goodput:
                raise pytest.UsageError(f"{p.nodeid}: specdec_verdicts(gate=[..., 'goodput']) but its specdec marker "
                                        "sets no goodput SLOs: add goodput={'ttft': ms, 'tpot': ms, 'e2el': ms} "
                                        "(any of them) or drop 'goodput' from gate")
        if self.ab is not None:
            try:
                self.ab.refuse(self.planned)
            except ConfigError as exc:
                raise pytest.UsageError(str(exc)) from None
        self._check_engine_modes()

    def _check_engine_modes(self) -> None:
        """The collected tests' engine modes (and an engine-mode A/B's base) through vLLM's own `serve` parser, once a
        session, before any server starts: a flag vLLM does not know is a usage error naming the mode. Endpoint
        mode refuses them: the endpoints' servers are started by someone else, in their own mode."""
        from pytest_specdec.errors import ConfigError
        from pytest_specdec.profiles.engines import check_with_vllm

        modes = {c.engine: c.engine_mode for c in self.collected if c.engine_json is not None}
        base = self.ab.base_engine if self.ab is not None else None
        if base is not None and not base.is_default:
            modes[base.name] = base
        if not modes:
            return
        if self.settings.endpoint:
            raise pytest.UsageError(f"specdec engine mode(s) {', '.join(sorted(modes))} with --specdec-endpoint: "
                                    "an engine mode sets the args and env of servers the plugin starts, and the "
                                    "endpoints' servers run in whatever mode they were started in; drop engine= or "
                                    "the endpoints")
        try:
            check_with_vllm(modes, self.profile.target, self.profile.server_args)
        except ConfigError as exc:
            raise pytest.UsageError(str(exc)) from None

    def validity(self) -> ValidityRules:
        """The profile's validity rules; --specdec-hung-timeout wins over its hung_timeout_s."""
        rules, hung = self.profile.validity, self.settings.hung_timeout_s
        return rules if hung is None else dataclasses.replace(rules, hung_timeout_s=hung)

    def expand(self, kwargs: dict[str, Any], args: tuple[Any, ...] = ()) -> list[Case]:
        """A marker's (or `specdec.measure()`'s) fields as cases of the active profile; the command line's
        --specdec-api / --specdec-request-rate / --specdec-dataset apply where the fields do not say."""
        from pytest_specdec.markers import expand

        defaults = {"api": self.settings.api, "request_rate": self.settings.request_rate,
                    "dataset": self.settings.dataset}
        cases = expand(kwargs, self.profile, args, defaults)
        for case in cases:
            self._check_possible(case)
        return cases

    @property
    def placement(self) -> Placement:
        if self._placement is None:
            from pytest_specdec.profiles.placement import Placement

            st = self.settings
            self._placement = Placement(self.profile, st.endpoint is not None, st.max_servers, st.block_runs,
                                        self.runs(), st.host, st.ab_servers)
        return self._placement

    def _check_possible(self, case: Case, sent: list[Prompt] | None = None) -> None:
        """What only the profile and the dataset can tell is impossible: an error at collection, not later; with
        the ``sent`` prompts (their input tokens counted) again when the test sends them."""
        lengths = case.synthetic_lengths
        if lengths is not None:  # the lengths and counts alone: the prompts (and the tokenizer) wait for the test's
            # run, so a collection or dry run needs no tokenizer on a GPU box before a server has downloaded the target
            from pytest_specdec.measure.datasets.synthetic import BENCH_NUM_PROMPTS

            self.placement.check_possible(case.dataset, 1, None, None, lengths=lengths)
            size = case.num_prompts or BENCH_NUM_PROMPTS
            self.placement.check_possible(case.dataset, size, case.num_prompts, None, (), case.concurrency)
            return
        records = self.dataset(case).prompts  # all: suffix decoding draws beyond the sample
        checked = sent if sent is not None else records if case.max_tokens is None else ()
        self.placement.check_possible(case.dataset, len(records), case.num_prompts, case.max_tokens, checked,
                                      case.concurrency)

    def _target(self, case: Case) -> str:
        """The model the case's prompts are counted and rendered for: a preset with its own target, that one."""
        return self.server_spec(case, reference=True).model

    def dataset(self, case: Case) -> Dataset:
        """The case's dataset: its file's, or synthetic prompts made with its target's tokenizer (`Workload`)."""
        lengths = case.synthetic_lengths
        if lengths is None:
            return self.workload.dataset(case.dataset, self._target(case))
        from pytest_specdec.gate.baselines import portable

        model = self._target(case)
        return self.workload.synthetic(model, case.num_prompts, *lengths, tokenizer_name=portable(model))

    def prompts(self, case: Case) -> list[Prompt]:
        """The workload: the dataset's prompts (a seeded sample of num_prompts), max_tokens applied, their input
        tokens counted and checked against the served length."""
        self._check_possible(case)
        if case.synthetic:  # as made: each its own max_tokens, in bench serve's order
            made = list(self.dataset(case).prompts)
            self.placement.check_possible(case.dataset, len(made), case.num_prompts, None, made, case.concurrency)
            return made
        sent = self.workload.prompts(case.dataset, case.num_prompts, case.max_tokens, case.api, self._target(case))
        self._check_possible(case, sent)
        return sent

    def server_spec(self, case: Case, reference: bool) -> ServerSpec:
        """An arm's server: the profile's for the case, in the case's engine mode (both arms: `profiles.engines`)."""
        return case.engine_mode.apply(self.placement.server_spec(case.method, case.k, case.speculative_config,
                                                                 reference))

    # --- measuring -----------------------------------------------------------------------------
    def arms(self, case: Case) -> list[tuple[str, ServerSpec]]:
        """(arm, server spec), the reference first; no spec arm for method "none"; A/B: `ABGate.base_arms` too."""
        ref = self.server_spec(case, reference=True)
        if case.method == "none":
            return [("reference", ref)]
        spec = self.server_spec(case, reference=False)
        base = ({} if self.ab is None else
                self.ab.base_arms(case.method, case.k, case.speculative_config, ref, self.placement, case.engine))
        return [("reference", ref), ("spec", spec), *base.items()]

    def measure(self, nodeid: str, case: Case, verdicts: VerdictOptions | None = None,
                callspec: dict[str, Any] | None = None) -> CaseResult:
        """The case's interleaved reference/spec runs, recorded for the JSON; with ``verdicts`` judged by the session's
        gate (the stored nights, or the base in an A/B session), more pairs added two at a time while a verdict is
        inconclusive (alpha split over the looks)."""
        from pytest_specdec.errors import SpecDecError
        from pytest_specdec.measure.record import dead_arms
        from pytest_specdec.measure.serving import CaseRun, dead_arm
        from pytest_specdec.output.progress import measured, planned

        if self.settings.endpoint:  # can the endpoints stand for this test's servers?
            reason = self.serving.skip_reason(
                None if case.method == "none" else self.server_spec(case, reference=False),
                [self.server_spec(o, reference=False) for o in [*self.collected, case] if o.method != "none"],
                self.progress)
            if reason:
                pytest.skip(f"specdec endpoint mode: {reason}")
        ab = self.ab if verdicts is not None else None
        skip = ab.skip_reason(case.method, case.speculative_config, case.engine) if ab is not None else None
        if skip:
            pytest.skip(f"specdec A/B session: {skip}")
        record = self.records.setdefault(nodeid, TestRecord(nodeid, case.params(), callspec=dict(callspec or {})))
        prompts = self.prompts(case)
        arms = {arm: s for arm, s in self.arms(case) if not arm.startswith("base") or ab is not None}
        ref_spec, spec_spec = arms["reference"], arms.get("spec")
        record.servers = {arm: s.key() for arm, s in arms.items()}
        block = self.placement.block_runs() if spec_spec is not None else None
        if not self.settings.endpoint:
            self._start_together(nodeid, list(arms.values()))
        run = CaseRun(self.serving, nodeid, ref_spec, spec_spec, block, self.workload, case.dataset, prompts,
                      lambda: self.prompts(dataclasses.replace(case, num_prompts=None)), arms.get("base"),
                      arms.get("base_reference"))
        died = {arm: len(self.serving.deaths(s)) for arm, s in arms.items()}  # before this test
        self.progress(planned(nodeid, len(prompts), self.runs(), block, run.source.fresh))
        sampling = case.sampling()
        record.sampling = sampling.to_request()
        rate = case.request_rate
        if case.rate_fraction is not None:  # a rate sweep's point: a fraction of the reference's saturation
            point = self._rate_point(nodeid, case, callspec, run, prompts, sampling)
            record.rate_sweep, rate = point, point.request_rate
        result = record.result = run.first(
            sampling, self.runs(), concurrency=case.concurrency, api_key=self.settings.api_key,
            rules=self.validity(), progress=self.progress, api=case.api,
            rate=rate, burstiness=case.burstiness, goodput=dict(case.goodput) or None)
        if verdicts is not None:  # the session's gate, through its protocol: start, then its looks
            from pytest_specdec.gate.protocol import TestStart, drive

            gate = self.verdict_gate
            started = gate.start(TestStart(
                nodeid, case.method, arms, self.serving.engine_configs(arms), verdicts.for_gate(), case.workload(),
                self.dataset(case).identity(), sampling, endpoint=bool(self.settings.endpoint),
                endpoint_versions=self.serving.endpoint_versions(arms), engine=case.engine_mode))
            judged = drive(gate, nodeid, started, result, run.extend, self.progress)
            record.drift = self._drift(result, verdicts)
            judged = dataclasses.replace(judged, drift=record.drift)  # its gated drift: members of the family
            if ab is not None:
                record.ab = judged
            else:
                record.baseline = judged
        else:
            record.drift = self._drift(result, verdicts)
        self.progress(measured(nodeid, summary_entry(result.summary)))
        for line in coalesced_lines(nodeid, result):
            self.progress(line)
        dead = dead_arms(result.reference_runs, result.runs if "spec" in arms else None,
                         result.base_runs if ab is not None else None,
                         result.base_reference_runs if "base_reference" in arms else None)
        if dead:  # a dead arm: never judged on the other one
            arm = dead[0]
            runs = result.arm_runs(arm)
            raise SpecDecError(dead_arm(nodeid, arm, runs, self.serving.deaths(arms[arm])[died[arm]:]))
        return result

    def _drift(self, result: CaseResult, verdicts: VerdictOptions | None) -> Drift | None:
        """The test's drift within the session (`gate.drift`): its drift metrics gated where its marker's or the
        ini's `gate` names them. check=False opts out of the baseline assertion only: drift needs no baseline, and
        a soak test gates its drift without one."""
        from pytest_specdec.gate.drift import drift

        return drift([r.record for r in result.reference_runs], [r.record for r in result.runs],
                     [r.instance for r in result.reference_runs], [r.instance for r in result.runs],
                     alpha=self.settings.alpha, gate=self.drift_gate(verdicts))

    def drift_gate(self, verdicts: VerdictOptions | None) -> tuple[str, ...]:
        """The drift metrics a test gates: those its marker's or the ini's `gate` names (`gate.drift`)."""
        from pytest_specdec.gate.drift import DRIFT_METRICS

        named = {*self.settings.gate, *(verdicts.gate if verdicts is not None else ())}
        return tuple(m for m in DRIFT_METRICS if m in named)

    def _rate_point(self, nodeid: str, case: Case, callspec: dict[str, Any] | None, run: CaseRun,
                    prompts: list[Prompt], sampling: Sampling) -> RatePoint:
        """The test's rate sweep point (`measure.saturation`): the saturation measured on the warm reference at the
        sweep's first test (the sweep: the function, the case but its fraction, the other parameters)."""
        from pytest_specdec.measure.saturation import measure_saturation

        def measure() -> Saturation:
            ref = run.reference() if callable(run.reference) else run.reference
            sat = measure_saturation(ref, prompts, sampling, concurrency=case.concurrency, api=case.api,
                                     api_key=self.settings.api_key, rules=self.validity(), measured_by=nodeid,
                                     settle=self.serving.settle())
            self.progress(f"specdec: {nodeid}: rate sweep saturation {sat.req_s:.3g} req/s (the reference with every "
                          f"prompt let in at once up to concurrency {case.concurrency})")
            return sat

        others = repr(sorted((callspec or {}).items()))
        sweep = (nodeid.partition("[")[0], dataclasses.replace(case, rate_fraction=None), others)
        assert case.rate_sweep is not None and case.rate_fraction is not None
        return self.saturations.point(sweep, case.rate_fraction, case.rate_sweep, measure)

    def _start_together(self, nodeid: str, specs: list[ServerSpec]) -> None:
        """Start the test's missing servers and the next tests' (in run order) at once where the placement lets
        them co-reside (`Placement.start_plan`); else each starts when asked for, as before. Under xdist only the
        test's own: which tests come next on this worker is not known."""
        if not self.placement.start_together():
            return
        order = [n for n, _ in self.run_order]
        later = self.run_order[order.index(nodeid) + 1:] if nodeid in order and not self.worker else []
        upcoming: list[ServerSpec] = []
        for _, case in later:  # no further than the pool could hold at once
            if len({s.key() for s in [*specs, *upcoming]}) > self.placement.max_alive():
                break
            upcoming += [s for _, s in self.arms(case)]
        plan = self.placement.start_plan(specs, upcoming, self.pool.alive_specs(), self.pool.gpu_share(self.workers))
        if plan is not None:
            wanted = {s.key(): s for s in [*specs, *upcoming]}
            self.pool.start_together([wanted[key] for key in plan.start], list(plan.stop), nodeid)

    def distribution_check(self, nodeid: str, case: Case, samples_per_prompt: int, alpha: float,
                           tolerance_nats: float) -> dict[str, Any]:
        """Temperature > 0: the spec server's samples vs the reference's, scored by the reference server
        (`measure/lossless.py`); sampled once per test and samples-per-prompt, recorded for the JSON."""
        from pytest_specdec.output.progress import distribution_measured, distribution_planned

        key = (nodeid, samples_per_prompt)
        if key not in self._distributions:
            arms = dict(self.arms(case))
            prompts = self.prompts(case)
            self.progress(distribution_planned(nodeid, len(prompts), samples_per_prompt))
            self._distributions[key] = self.serving.sample_distribution(
                arms["reference"], arms["spec"], nodeid, prompts, case.sampling(), samples_per_prompt,
                case.api, self.progress)
        out = self._distributions[key].summary(alpha, tolerance_nats)
        self.records.setdefault(nodeid, TestRecord(nodeid, case.params())).distribution = out
        self.progress(distribution_measured(nodeid, out))
        return out

    # --- baselines and verdicts ------------------------------------------------------------------
    @property
    def judge(self) -> Judge:
        if self._judge is None:
            from pytest_specdec.gate.judge import GateConfig, Judge

            st = self.settings
            self._judge = Judge(GateConfig(self.profile, st.baselines_dir, self.rootpath, st.update_baselines,
                                           st.keep_sessions, self.gate_options, started=self.started))
        return self._judge

    @property
    def gate_options(self) -> GateOptions:
        """What the options say about judging (`gate.protocol.GateOptions`), built once: both gates take it."""
        if self._gate_options is None:
            from pytest_specdec.gate.drift import DRIFT_METRICS
            from pytest_specdec.gate.protocol import GateOptions

            st = self.settings
            runs, max_runs = self.run_limits()
            self._gate_options = GateOptions(
                runs, max_runs, alpha=st.alpha, multiplicity=st.multiplicity,
                gate=tuple(m for m in st.gate if m not in DRIFT_METRICS),  # judged within tonight (`gate.drift`)
                ini_thresholds=tuple(st.ini_thresholds), cli_thresholds=tuple(st.cli_thresholds), strict=st.strict,
                fail_inconclusive=st.fail_inconclusive, fail_machine=st.fail_machine, calibrate=st.calibrate)
        return self._gate_options

    @property
    def verdict_gate(self) -> Gate[Any]:
        """The gate this session judges by (`gate.protocol.Gate`): the A/B's, else the stored nights'."""
        return self.ab if self.ab is not None else self.judge

    def check_thresholds(self) -> None:
        """The profile's, the ini's and the command line's thresholds, each checked where it was given: a bad
        one stops the session before anything runs, naming the file or option."""
        from pytest_specdec.errors import ConfigError

        try:
            self.judge.thresholds()
        except ConfigError as exc:
            raise pytest.UsageError(str(exc)) from None

    def check(self, nodeid: str) -> str | None:
        """At the end of a specdec test: its gate decides (`Gate.test_end`) over the family so far, the output
        layer words it; the failure message, or None when it passes (warnings are shown)."""
        from pytest_specdec.output.drift import drift_failure, drift_warning

        record = self.records.get(nodeid)
        if record is None:
            return None
        if (record.ab or record.baseline) is None:  # measured without a gate: its drift alone, by the same rule
            if record.drift is None:
                return None
            from pytest_specdec.gate.check import FailRule

            alone = FailRule(fail_inconclusive=self.settings.fail_inconclusive).decide(
                checked=False, status="missing", verdicts=(), drift=record.drift.gated)
            if (open_warning := drift_warning(nodeid, record.drift, alone.drift_open)) is not None:
                warnings.warn(SpecDecWarning(open_warning), stacklevel=1)
            return drift_failure(nodeid, record.drift, alone.drifted)
        family = [(n, c) for n, r in self.records.items() if (c := r.ab or r.baseline) is not None]
        judged, end = self.verdict_gate.test_end(nodeid, family, self.planned)
        record.drift = judged.drift  # its gated drift adjusted over the family so far
        drifted = drift_failure(nodeid, judged.drift, end.drifted) if judged.drift is not None else None
        open_warning = drift_warning(nodeid, judged.drift, end.drift_open) if judged.drift is not None else None
        st = self.settings
        if record.ab is not None:
            from pytest_specdec.output.ab_wording import ab_test_end_message

            record.ab = judged
            lines, failure, warning = ab_test_end_message(nodeid, judged, end, multiplicity=st.multiplicity)
            for line in lines:
                self.progress(line)
        else:
            record.baseline = judged
            failure, warning = test_end_message(nodeid, judged, end, alpha=st.alpha, multiplicity=st.multiplicity)
        for said in (warning, open_warning):
            if said:
                warnings.warn(SpecDecWarning(said), stacklevel=1)
        return "\n".join(m for m in (failure, drifted) if m) or None

    def say_drift(self, nodeid: str) -> None:
        """The test's drift in the terminal, once its verdicts stand: after its end adjusted them over the family so
        far (`check`), or as measured where that end never came (no gate, a failed body or setup) and the session's
        end adjusts them. Said earlier, a drift the family's adjustment leaves inconclusive read `improved` in the
        terminal while the results and the report said `inconclusive`."""
        from pytest_specdec.output.drift import drift_lines

        record = self.records.get(nodeid)
        if record is not None and record.drift is not None:
            for line in drift_lines(nodeid, record.drift):
                self.progress(line)

    def record_failure(self, nodeid: str, message: str) -> list[tuple[str, str]]:
        """A failed test: keep its failure text and its servers' log tails in the results (the HTML
        report shows them); returns the (title, tail) sections for the terminal report."""
        record = self.records.get(nodeid)
        return record.failed(message, self._pool.servers if self._pool else {}) if record is not None else []

    # --- output --------------------------------------------------------------------------------
    def dry_run_lines(self, cases: list[tuple[str, Case]]) -> list[str]:
        """Every test's exact server commands and each suite's estimated run time, without starting anything."""
        from pytest_specdec.measure.saturation import fractions
        from pytest_specdec.output.dry_run import dry_run_lines, dry_run_test
        from pytest_specdec.output.results import price

        profile, s = self.profile, self.settings
        # An A/B session skips the tests it has no base for (`measure`): they are named, not estimated.
        why = {nodeid: r for nodeid, case in cases
               if self.ab is not None and (r := self.ab.skip_reason(case.method, case.speculative_config, case.engine))}
        # a rate sweep's lowest point measures its saturation (its first test in the run order)
        tests = [dry_run_test(nodeid, self.arms(case), case.concurrency, partial(self.prompts, case),
                              case.rate_fraction, case.rate_sweep is not None and bool(case.rate_sweep)
                              and case.rate_fraction == fractions(case.rate_sweep)[0])
                 for nodeid, case in cases if nodeid not in why]
        from pytest_specdec.profiles.pool import gpus_held, lease_plan_lines, planned_gpus

        planned = planned_gpus(self.placement, s.gpus, self.workers)
        return [*dry_run_lines(profile, tests, skipped=why, hardware_note=self.hardware_note,
                               endpoints=(s.endpoint, str(s.reference_endpoint)) if s.endpoint else None,
                               server_cpus=None if s.endpoint else self.placement.server_cpus(), runs=self.runs(),
                               max_runs=self.max_runs(), max_servers=self.placement.max_alive(),
                               price=price(profile, s.gpu_hourly_usd, gpus_held(self.placement)),
                               fit_of=(partial(self.placement.fit, gpus=planned)
                                       if self.placement.start_together() else None),
                               apart_of=(partial(self.placement.apart, gpus=planned)
                                         if self.placement.start_together() else None)),
                *lease_plan_lines(self.placement, s.gpus)]

    def server_starts(self) -> list[StartRecord]:
        """Every vLLM start of the session: this process's, and on the xdist controller every worker's."""
        return [*(self._pool.starts if self._pool else []), *(x for r in self.remote for x in r["starts"])]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.stop_all()


