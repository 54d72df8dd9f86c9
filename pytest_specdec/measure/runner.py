"""Interleaved runs of the reference (method `none`) and a spec config on the same workload.

Reference and spec runs alternate (reference, spec, reference, spec, ...) so machine drift hits
both arms alike, and speedup is computed per pair.  Where the two servers cannot be alive at once
(`--specdec-max-servers 1`, or a profile whose servers need the whole GPU), the arms alternate in
blocks instead, in ABBA order so a block switch restarts one server, not two; the result records
which alternation was used.  Every run gets a fresh `cache_salt` so prefix caching cannot leak
between runs.  Suffix decoding also learns the responses it served (a global tree per server), so its
runs take prompts their server has never been sent (`FreshPrompts`), and the server is restarted when
the dataset runs out of such prompts.  A run that breaks a validity rule is kept and shown with its
reasons, never averaged into the summary.

This module is the run loop and what it records; the order of the runs (`schedule.py`), the validity
rules (`validity.py`), the prompt sources (`prompts.py`) and the summary statistics (`summary.py`) are
their own modules, imported from there. A run is recorded as a frozen value (`RunRecord`): what the loop learns
after it, and a later look's disturbed-run rule, put a new record in its place.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

from pytest_specdec.measure.acceptance import COUNTERS, PER_REQUEST, RunAcceptance, Source, run_acceptance
from pytest_specdec.measure.prompts import FixedPrompts, FreshPrompts, PromptSource
from pytest_specdec.measure.record import ArmRun, dropped, pairs, speedup_per_pair
from pytest_specdec.measure.schedule import Arm, schedule, schedule_ab, warmup_requests
from pytest_specdec.measure.summary import Summary, hd_p95s, summarize
from pytest_specdec.measure.validity import (
    DEFAULT_RULES,
    DISTURBED,
    HUNG,
    NEIGHBOUR,
    STEP_RATE,
    ValidityRules,
    disturbed,
    invalid_reasons,
    latency_untrusted,
    step_rate,
)

if TYPE_CHECKING:
    from pytest_specdec.measure.metrics import Chunking, RunMetrics
    from pytest_specdec.measure.probe import MachineState
    from pytest_specdec.measure.types import Api, LoadResult, Prompt, Sampling
    from pytest_specdec.servers.pool import Endpoint
    from pytest_specdec.servers.quiet import Quiet

__all__ = ["CaseResult", "RunRecord", "extend_case", "mark_disturbed", "measure_case", "neighbour_reasons", "one_run"]


@dataclass(frozen=True)
class RunRecord:
    """One run of one arm, with its validity, and whether its latency figures can be trusted. A value: what the
    loop learns after the run (its neighbours, its server, its block) and a later look's disturbed-run rule give a
    new record in its place (`dataclasses.replace`), so a record handed on never changes under its reader."""

    arm: Arm
    index: int
    metrics: RunMetrics
    cache_salt: str
    invalid: tuple[str, ...] = ()
    texts: Mapping[str, str] = field(default_factory=dict, repr=False)
    #: Each successful request's output tokens as the server counted them (usage), by prompt id.
    output_tokens: Mapping[str, int] = field(default_factory=dict, repr=False)
    # Per-run P95 by Harrell-Davis (ms) of tpot/ttft/e2e: steadier than the interpolated sample P95 for
    # the few dozen requests of a run; these are what the P95 verdicts compare.
    hd_p95_ms: Mapping[str, float | None] = field(default_factory=dict)
    #: The wait for the servers to go idle before the run (None: not waited).
    settle: Quiet | None = None
    #: The prompt ids of the run when they differ from run to run (FreshPrompts), else None.
    prompt_ids: tuple[str, ...] | None = None
    #: How the run's tokens arrived per chunk (None: not recorded, e.g. a run built by hand).
    chunking: Chunking | None = None
    #: Why the run's latency figures are left out of verdicts and summary (empty: they are trusted).
    untrusted: tuple[str, ...] = ()
    #: The cores each other server of the session used during the run's window (None: not watched).
    neighbours: Mapping[str, float] | None = None
    #: Open loop: each request's scheduled arrival and when it was sent (`LoadResult.arrivals`); None: closed.
    arrivals: Mapping[str, list[float | None]] | None = None
    #: Acceptance from each request's own figures (`measure.acceptance`), checked against the counters; None: the
    #: requests carried none, and the counters serve alone.
    acceptance: RunAcceptance | None = None
    #: Which start of its server the run used (`Endpoint.instance`: the pid of a server the pool started; empty for
    #: an endpoint someone else runs, whose restarts cannot be seen): a restart mid-test begins a new segment for
    #: the drift check (`gate.drift`).
    instance: str = ""
    #: The ABBA block of its pair where the arms alternate in blocks (one server at a time); None: interleaved.
    block: int | None = None

    @cached_property
    def record(self) -> ArmRun:
        """The run as the one run record (`measure.record.ArmRun`) that the summary, the gate and the baselines
        read, built once per record (a changed validity is a new record)."""
        return ArmRun.measured(self.index, self.metrics, self.hd_p95_ms, self.invalid, self.untrusted, self.block)

    @property
    def valid(self) -> bool:
        return not self.invalid

    @property
    def acceptance_source(self) -> Source:
        """Where the run's acceptance comes from: its requests' own figures, or the counters alone."""
        return COUNTERS if self.acceptance is None else PER_REQUEST

    @property
    def latency_trusted(self) -> bool:
        """Valid, and its stream arrived as the engine made it."""
        return self.valid and not self.untrusted

    @property
    def hung(self) -> bool:
        return any(r.startswith(HUNG) for r in self.invalid)


@dataclass
class CaseResult:
    """What a specdec test measured."""

    reference_runs: list[RunRecord]
    runs: list[RunRecord]
    summary: Summary | None  # None: no look has measured yet
    speedup_per_pair: list[float | None]
    #: "interleaved" (pairs alternate), or blocks of N runs per arm when the servers cannot co-reside
    alternation: str = "interleaved"
    blocks: int = 0  # blocks done so far (block alternation), so later looks continue the ABBA order
    #: Per arm, the server instance its last run used: a run on another instance (first run, a block
    #: switch's restart, a fresh suffix server) is warmed up first.
    instances: dict[str, str] = field(default_factory=dict, repr=False)
    #: An A/B session's base runs, interleaved with the reference's and the candidate's (``runs``); the summary
    #: and speedups stay the candidate's, the A/B verdicts pair these with ``runs``.
    base_runs: list[RunRecord] = field(default_factory=list)
    #: The base install's reference runs when the base is another install (`--specdec-base-python`).
    base_reference_runs: list[RunRecord] = field(default_factory=list)
    #: The machine probe's readings (`probe.py`), before the first and before the last run of every look, the
    #: servers quiet; empty where the servers are not on this machine (external endpoints).
    machine_states: list[MachineState] = field(default_factory=list)
    #: When the test's last run ended (`time.monotonic`), for the next run's wait (None: no run yet).
    ended: float | None = field(default=None, repr=False)

    @property
    def machine_state(self) -> MachineState | None:
        """The machine's state while this test ran: the geometric mean of its probes (None: not probed)."""
        from pytest_specdec.measure.probe import mean_state

        return mean_state(self.machine_states)

    def arm_runs(self, arm: str) -> list[RunRecord]:
        """One arm's runs by its name (`schedule.Arm`)."""
        return {"reference": self.reference_runs, "spec": self.runs, "base": self.base_runs,
                "base_reference": self.base_reference_runs}[arm]

    @property
    def all_runs(self) -> list[RunRecord]:
        return [*self.reference_runs, *self.runs, *self.base_runs, *self.base_reference_runs]

    @property
    def invalid_runs(self) -> list[RunRecord]:
        return [r for r in self.all_runs if not r.valid]

    @property
    def untrusted_runs(self) -> list[RunRecord]:
        """Valid runs whose latency figures are left out (coalesced streams)."""
        return [r for r in self.all_runs if r.valid and r.untrusted]


def one_run(
    endpoint: Endpoint, arm: Arm, index: int, prompts: list[Prompt], sampling: Sampling, *,
    concurrency: int, api_key: str | None, rules: ValidityRules, warmup: int = 0, timeout_s: float = 600.0,
    api: Api = "chat", rate: float | None = None, warmup_prompts: list[Prompt] | None = None,
    step_limit: int | None = 1, burstiness: float = 1.0, goodput: Mapping[str, float] | None = None,
) -> RunRecord:
    """One pass of the prompts; the /metrics delta covers exactly the measured requests.  The warm-up
    sends `warmup_prompts` when given, else `warmup` requests cycling through `prompts`.  `step_limit` is
    the most tokens one engine step makes per request (1, or k + 1 with speculation); None: unknown, so
    the stream's chunking is not judged. ``goodput``: the test's SLOs (ms), its goodput counted against them."""
    from pytest_specdec.measure.client import IDLE_TIMEOUT_REASON, run_load_sync
    from pytest_specdec.measure.metrics import chunking, compute_run_metrics, counters_delta

    salt = uuid.uuid4().hex
    load: LoadResult = run_load_sync(
        endpoint.base_url, endpoint.model, prompts, sampling, concurrency=concurrency,
        cache_salt=salt, api_key=endpoint.api_key or api_key, warmup=warmup, timeout_s=timeout_s,
        api=api,
        rate=rate, warmup_prompts=warmup_prompts, idle_timeout_s=rules.hung_timeout_s, burstiness=burstiness,
    )
    delta = counters_delta(load)
    metrics = compute_run_metrics(load, delta, goodput)
    acceptance = run_acceptance(load.samples)
    invalid = invalid_reasons(metrics, len(prompts), rules)
    silent = sum(1 for x in load.samples if x.error is not None and x.error.startswith(IDLE_TIMEOUT_REASON))
    if silent:
        invalid.insert(0, f"{HUNG}: sent nothing for {rules.hung_timeout_s:g} s on {silent} request(s)")
    # The requests' own figures must add up to the counters of the same run; where they do not, something else
    # drove the server (as a token-count mismatch says) or vLLM counted wrong: the run is invalid, both figures named.
    disagreement = acceptance.disagreement(delta) if acceptance is not None else ""
    if disagreement:
        invalid.append(disagreement)
    chunks = chunking(load.samples, step_limit) if step_limit is not None else None
    if load.metrics_error:
        invalid.append(f"could not read /metrics: {load.metrics_error}")
    return RunRecord(arm=arm, index=index, metrics=metrics, cache_salt=salt, invalid=tuple(invalid),
                     texts={s.prompt_id: s.text for s in load.samples if s.error is None},
                     output_tokens={s.prompt_id: s.output_tokens for s in load.samples if s.error is None},
                     hd_p95_ms=hd_p95s(load), chunking=chunks,
                     untrusted=() if chunks is None else tuple(latency_untrusted(chunks, rules)),
                     arrivals=load.arrivals(), acceptance=acceptance)


def measure_case(
    reference: Endpoint | Callable[[], Endpoint],
    spec: Endpoint | Callable[[], Endpoint] | None,
    prompts: list[Prompt] | PromptSource,
    sampling: Sampling,
    *,
    runs: int,
    block: int | None = None,
    **options: Any,
) -> CaseResult:
    """`runs` pairs (reference, spec), interleaved or in blocks of `block`; the reference alone when
    `spec` is None. ``options`` are :func:`extend_case`'s (concurrency, api_key, rules, ..., spec_tokens)."""
    result = CaseResult(reference_runs=[], runs=[], summary=None, speedup_per_pair=[],
                        alternation="interleaved" if block is None or spec is None else f"blocks of {block}")
    return extend_case(result, reference, spec, prompts, sampling, runs=runs, block=block, **options)


def extend_case(
    result: CaseResult,
    reference: Endpoint | Callable[[], Endpoint],
    spec: Endpoint | Callable[[], Endpoint] | None,
    prompts: list[Prompt] | PromptSource,
    sampling: Sampling,
    *,
    concurrency: int,
    runs: int,
    api_key: str | None = None,
    rules: ValidityRules = DEFAULT_RULES,
    progress: Callable[[str], None] = lambda line: None,
    block: int | None = None,
    api: Api = "chat",
    rate: float | None = None,
    burstiness: float = 1.0,
    settle: Callable[[str | None, float | None], Quiet] | None = None,
    spec_tokens: int | None = None,
    restart: Callable[[Arm], Endpoint | Callable[[], Endpoint] | None] | None = None,
    base: Endpoint | Callable[[], Endpoint] | None = None,
    base_reference: Endpoint | Callable[[], Endpoint] | None = None,
    neighbours: Callable[[], dict[str, tuple[str, int]]] | None = None,
    probe: Callable[[], MachineState] | None = None,
    goodput: Mapping[str, float] | None = None,
) -> CaseResult:
    """Continue the alternation of `result` up to `runs` pairs (sequential looks add runs this way).

    A run is warmed up when its arm's server instance is not the one the arm's previous run used: the
    first run of each arm, and after a restart (a block switch with one server at a time, a fresh
    suffix server).  A run's prompts are drawn before its server is asked for, so a draw that needs a
    fresh server gets one.  Summary and speedups are recomputed.  `settle` (e.g. the pool's wait for idle servers) is
    called right before
    every measured run, after its endpoint is ready and its warm-up is not yet sent, with the run's server
    instance and when the test's previous run ended (``result.ended``); what it returns is kept with the run.
    After a run whose server hung, `restart(arm)` may hand a fresh server for the
    arm's later runs (None: keep the arm as it is). With ``base`` (an A/B session) a
    third arm runs in every pair (`schedule_ab`), its runs in ``result.base_runs``, and with ``base_reference``
    (the base on another install) a fourth. ``neighbours`` (the pool's CPU ticks per server instance) is read
    around every run: the cores each other server used then are kept with the run (`neighbour_reasons`).
    ``probe`` (the machine's state, `probe.py`) is read after the wait for quiet servers before the first and
    the last run of this look, into ``result.machine_states``. ``goodput``: the test's SLOs (ms), every run's
    goodput counted against them.
    """
    source = prompts if isinstance(prompts, (FixedPrompts, FreshPrompts)) else FixedPrompts(prompts)
    ref_runs, spec_runs = result.reference_runs, result.runs
    start = len(ref_runs)
    if spec is None:
        order: list[tuple[int, Arm]] = [(i, "reference") for i in range(start, runs)]
        block = None
    else:
        if len(spec_runs) != start:
            raise ValueError(f"cannot extend: {start} reference runs but {len(spec_runs)} spec runs")
        order = (schedule(start, runs, block, result.blocks) if base is None
                 else schedule_ab(start, runs, base_reference is not None, block, result.blocks))
    first_block = result.blocks  # the block of pair i: first_block + (i - start) // block
    if block is not None:
        result.blocks += len(range(start, runs, block))
    sources = {"reference": reference, "spec": spec, "base": base, "base_reference": base_reference}
    # the progress lines' names of an A/B session's arms
    labels = {"spec": "candidate", "base_reference": "base ref"} if base is not None else {}
    probe_at = {order[0], order[-1]} if order and probe is not None else set()
    for i, arm in order:
        run_prompts = source.run(i)
        server = sources[arm]
        assert server is not None
        endpoint = server() if callable(server) else server
        warm = result.instances.get(arm) != endpoint.instance
        n_warm = warmup_requests(len(run_prompts), concurrency) if warm else 0
        # Only a spec arm can learn from what it served; the reference warms up on the run's prompts.
        warmup = source.warmup(n_warm) if arm != "reference" else FixedPrompts(run_prompts).warmup(n_warm)
        probing = probe is not None and (i, arm) in probe_at
        # The probe reads the whole machine: before it, every server must be idle, the next run's own too
        # (after a run on the same server, its busy loop would take a core from the probe).
        quiet = settle(None if probing else endpoint.instance, result.ended) if settle is not None else None
        if probe is not None and probing:
            result.machine_states.append(probe())
        limit = 1 if arm.endswith("reference") else None if spec_tokens is None else 1 + spec_tokens
        before = (time.monotonic(), neighbours()) if neighbours is not None else None
        rec = one_run(endpoint, arm, i, run_prompts, sampling, concurrency=concurrency, api_key=api_key,
                      rules=rules, api=api, rate=rate, warmup_prompts=warmup, step_limit=limit,
                      burstiness=burstiness, goodput=goodput)
        result.ended = time.monotonic()
        if before is not None and neighbours is not None:
            arm_of = {inst: labels.get(a, a) for a, inst in result.instances.items()}
            cores = neighbour_cores(before, (time.monotonic(), neighbours()), endpoint.instance, arm_of)
            rec = replace(rec, neighbours=cores,
                          invalid=(*rec.invalid, *neighbour_reasons(cores, rules.max_neighbour_cores)))
        rec = replace(rec, settle=quiet, prompt_ids=tuple(p.id for p in run_prompts) if source.fresh else None,
                      instance=endpoint.instance, block=None if block is None else first_block + (i - start) // block)
        result.instances[arm] = endpoint.instance
        result.arm_runs(arm).append(rec)
        m = rec.metrics
        rate_ = m.spec.acceptance_rate if m.spec else None
        acc = "" if rate_ is None else f", acceptance {rate_:.3f}"
        bad = (f"  INVALID: {'; '.join(rec.invalid)}" if not rec.valid
               else f"  LATENCY UNTRUSTED: {'; '.join(rec.untrusted)}" if rec.untrusted else "")
        noisy = "" if quiet is None or quiet.quiet else (
            f"  (servers still busy after {quiet.waited_s:.1f} s: {quiet.cores:.2f} cores"
            + (f", {quiet.requests} request(s) held)" if quiet.requests else ")"))
        progress(f"specdec:   run {i + 1}/{runs} {labels.get(arm, arm):9s} {m.output_tok_s or 0:8.1f} tok/s"
                 f"{acc}{bad}{noisy}")
        if rec.hung and restart is not None:
            fresh = restart(arm)
            if fresh is not None:
                sources[arm] = fresh
    # Runs on prompts that differ from run to run (suffix decoding's fresh prompts, on a server that learns and
    # is restarted when they run out) differ for reasons of their own: the rule compares like with like only.
    for arm_runs in () if source.fresh else (ref_runs, spec_runs, result.base_runs, result.base_reference_runs):
        for rec in mark_disturbed(arm_runs, rules):
            why = rec.invalid[-1].removeprefix(f"{DISTURBED}: ")
            progress(f"specdec:   run {rec.index + 1}/{runs} {labels.get(rec.arm, rec.arm):9s} DISTURBED: {why}; "
                     "it leaves the verdicts with its pair")
    result.summary = summarize(ref_runs, spec_runs)
    refs, specs = [r.record for r in ref_runs], [r.record for r in spec_runs]
    result.speedup_per_pair = speedup_per_pair(refs, specs) if spec_runs else []
    left_out = dropped(pairs(refs, specs)) if spec_runs else []
    if left_out:
        progress(f"specdec:   {len(left_out)} of {len(result.speedup_per_pair)} pair(s) left out of the speedup and "
                 f"the paired verdicts: " + "; ".join(f"run {i + 1}: {why}" for i, why in left_out))
    return result


def neighbour_cores(before: tuple[float, dict[str, tuple[str, int]]], after: tuple[float, dict[str, tuple[str, int]]],
                    measured: str | None, arm_of: dict[str, str]) -> dict[str, float]:
    """The cores each other server used between two readings of the pool's CPU ticks per instance (a server
    gone or started in between is left out), named by its arm in this test where it has one."""
    import os

    seconds = max(after[0] - before[0], 1e-9)
    hz = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for instance, (label, ticks) in after[1].items():
        if instance == measured or instance not in before[1]:
            continue
        name = f"{arm_of[instance]} arm's server ({label})" if instance in arm_of else f"server {label}"
        out[name] = round((ticks - before[1][instance][1]) / hz / seconds, 3)
    return out


def neighbour_reasons(cores: dict[str, float], limit: float) -> list[str]:
    """Why a run is invalid when another server of the session ran beside it: above ``limit`` cores (0: off),
    it took the cores the run was measured on."""
    if limit <= 0:
        return []
    return [f"{NEIGHBOUR}: the {name} used {c:.2f} cores during the run (limit {limit:g}, [validity] "
            "max_neighbour_cores)" for name, c in cores.items() if c > limit]


def mark_disturbed(runs: list[RunRecord], rules: ValidityRules) -> list[RunRecord]:
    """Apply the disturbed-run rule (`validity.disturbed`) anew over one arm's runs, after every look: a run
    becomes invalid with the reason, or stops being so when later runs move the median. A spec arm is compared
    on its step rate (`validity.step_rate`): a run that accepted less is slower, not disturbed. Returns the runs newly
    marked, for the progress lines."""
    before = set()
    for i, rec in enumerate(runs):
        if any(r.startswith(DISTURBED) for r in rec.invalid):
            before.add(i)
            runs[i] = replace(rec, invalid=tuple(r for r in rec.invalid if not r.startswith(DISTURBED)))
    spec = any(r.metrics.spec is not None for r in runs)
    rates = [None if not r.valid else step_rate(r.metrics.output_tok_s,
                                                 r.metrics.spec.acceptance_length if r.metrics.spec else None)
             for r in runs]
    found = disturbed(rates, rules.max_run_slowdown, STEP_RATE if spec else "tok/s")
    for i, reason in found.items():
        runs[i] = replace(runs[i], invalid=(*runs[i].invalid, reason))
    return [runs[i] for i in found if i not in before]
