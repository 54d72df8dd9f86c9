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
"""

from __future__ import annotations

import math
import random
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal

if TYPE_CHECKING:
    from pytest_specdec.measure.types import LoadResult, Prompt, Sampling
    from pytest_specdec.measure.metrics import Chunking, RunMetrics
    from pytest_specdec.servers.pool import Endpoint
    from pytest_specdec.servers.quiet import Quiet

Arm = Literal["reference", "spec"]


def schedule(start: int, runs: int, block: int | None, block_index: int = 0) -> list[tuple[int, Arm]]:
    """The order of (pair index, arm) for pairs `start`..`runs`-1.

    ``block=None`` interleaves per pair: (i, reference), (i, spec).  ``block=b`` runs b pairs' worth of
    one arm, then of the other, and swaps which arm goes first every block (ABBA), so the server that
    is up at the end of a block serves the start of the next; ``block_index`` continues that parity
    when sequential looks extend a case.
    """
    out: list[tuple[int, Arm]] = []
    if block is None:
        for i in range(start, runs):
            out += [(i, "reference"), (i, "spec")]
        return out
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    for n, first in enumerate(range(start, runs, block), start=block_index):
        idx = range(first, min(first + block, runs))
        arms: tuple[Arm, Arm] = ("reference", "spec") if n % 2 == 0 else ("spec", "reference")
        for arm in arms:
            out += [(i, arm) for i in idx]
    return out


@dataclass(frozen=True)
class ValidityRules:
    """When a run is not to be trusted."""

    max_failed_share: float = 0.0
    # Mean lateness of the client's 10 ms event-loop ticker. A single long stall (the OS
    # descheduling the client once on a small machine) only shows in the max, which is reported.
    max_loop_lag_mean_ms: float = 20.0
    max_token_mismatch_share: float = 0.0
    # Share of a run's tokens that may arrive more per chunk than one engine step makes (1, or k + 1)
    # before the run's latency figures are untrusted (metrics.Chunking; docs/measurement.md).
    max_coalesced_share: float = 0.05
    # A server that sends nothing on a request for this long is hung: the request fails (not after the
    # total timeout), its run is invalid, and a server the plugin owns is restarted once.
    idle_timeout_s: float = 60.0


#: How a client-bound run's invalid reason starts: the lag invalidates the run's timing, not its counters
#: or texts, so callers that only need those (the zoo's acceptance checks) look for this prefix.
CLIENT_LAG = "client event loop lagged"
#: How a run whose server stopped sending is marked invalid (`RunRecord.hung` looks for it).
HUNG = "server hung"


class FixedPrompts:
    """The same prompts for every run (what every method but a learning drafter gets)."""

    fresh = False

    def __init__(self, prompts: list[Prompt]) -> None:
        self.prompts = prompts

    def run(self, index: int) -> list[Prompt]:
        return self.prompts

    def warmup(self, n: int) -> list[Prompt]:
        return [self.prompts[i % len(self.prompts)] for i in range(n)] if n else []


class FreshPrompts:
    """Prompts a learning drafter has never been sent.

    vLLM's suffix decoding keeps the responses it served in a global tree (up to
    `suffix_decoding_max_cached_requests`), so a prompt sent twice to one server is drafted from its own
    earlier answer and acceptance soars.  Each pair index gets its own seeded sample of `size` prompts,
    shared by the two arms (pairs stay comparable), drawn without replacement from the prompts `seen`
    (shared by every test on that server) does not hold; warm-ups draw too.  When too few are left,
    `exhausted()` is called (the session restarts the server: a fresh tree) and the draw starts over.
    """

    fresh = True

    def __init__(self, pool: list[Prompt], size: int, seen: set[str], exhausted: Callable[[], None],
                 seed: int = 0) -> None:
        if size > len(pool):
            raise ValueError(f"{size} prompts per run but the dataset has {len(pool)}")
        self.pool, self.size, self.seen, self.exhausted = pool, size, seen, exhausted
        self.rng = random.Random(seed)
        self.by_run: dict[int, list[Prompt]] = {}

    def _draw(self, n: int) -> list[Prompt]:
        unseen = [p for p in self.pool if p.id not in self.seen]
        if len(unseen) < n:
            self.exhausted()
            self.seen.clear()
            unseen = list(self.pool)
        drawn = self.rng.sample(unseen, min(n, len(unseen)))
        self.seen.update(p.id for p in drawn)
        return drawn

    def run(self, index: int) -> list[Prompt]:
        if index not in self.by_run:
            self.by_run[index] = self._draw(self.size)
        return self.by_run[index]

    def warmup(self, n: int) -> list[Prompt]:
        # Never more than a run's worth, so a warm-up alone cannot use up a small dataset.
        return self._draw(min(n, self.size)) if n else []


PromptSource = FixedPrompts | FreshPrompts


def invalid_reasons(m: RunMetrics, n_prompts: int, rules: ValidityRules) -> list[str]:
    """Why a run cannot be trusted (empty when it can)."""
    reasons: list[str] = []
    if m.n_requests and m.n_failed / m.n_requests > rules.max_failed_share:
        top = ", ".join(f"{k} x{v}" for k, v in sorted(m.errors.items(), key=lambda kv: -kv[1])[:2])
        reasons.append(f"{m.n_failed}/{m.n_requests} requests failed ({top})")
    engine = m.engine
    if engine and engine.preemptions:
        reasons.append(f"{engine.preemptions} preemption(s) during the run (KV cache too small for the load)")
    wanted = min(m.concurrency or 1, n_prompts)
    # In an open loop the concurrency is a cap, not a target: the arrival rate sets what is in flight.
    if m.request_rate is None and m.max_in_flight is not None and m.max_in_flight < wanted:
        reasons.append(f"concurrency not reached: at most {m.max_in_flight} in flight, wanted {wanted}")
    if engine and engine.token_counter_mismatch:
        share = abs(engine.token_counter_mismatch) / max(1, m.total_output_tokens)
        if share > rules.max_token_mismatch_share:
            reasons.append(
                f"server generated {engine.generation_tokens} tokens but responses carried {m.total_output_tokens} "
                "(another client, or replicas behind the endpoint): acceptance is untrusted"
            )
    if m.loop_lag_mean_ms is not None and m.loop_lag_mean_ms > rules.max_loop_lag_mean_ms:
        reasons.append(
            f"{CLIENT_LAG} {m.loop_lag_mean_ms:.0f} ms on average (max {m.loop_lag_max_ms:.0f} ms): "
            "client-bound"
        )
    return reasons


def latency_untrusted(chunks: Chunking, rules: ValidityRules) -> list[str]:
    """Why a run's latency figures (TTFT, TPOT, ITL, E2E) cannot be trusted: its stream was coalesced.

    The run stays valid (its tokens, counters and throughput are right); only its latencies leave the
    verdicts and the summary."""
    if chunks.over_limit_share <= rules.max_coalesced_share:
        return []
    return [f"coalesced stream: {chunks.over_limit_share:.0%} of tokens arrived more than {chunks.step_limit} per "
            f"chunk (limit {rules.max_coalesced_share:.0%}); {chunks.cause()}"]


@dataclass
class RunRecord:
    """One run of one arm, with its validity, and whether its latency figures can be trusted."""

    arm: Arm
    index: int
    metrics: RunMetrics
    cache_salt: str
    invalid: list[str] = field(default_factory=list)
    texts: dict[str, str] = field(default_factory=dict, repr=False)
    #: Each successful request's output tokens as the server counted them (usage), by prompt id.
    output_tokens: dict[str, int] = field(default_factory=dict, repr=False)
    # Per-run P95 by Harrell-Davis (ms) of tpot/ttft/e2e: steadier than the interpolated sample P95 for
    # the few dozen requests of a run; these are what the P95 verdicts compare.
    hd_p95_ms: dict[str, float | None] = field(default_factory=dict)
    #: The wait for the servers to go idle before the run: waited_s, quiet, cores (None: not waited).
    settle: dict[str, Any] | None = None
    #: The prompt ids of the run when they differ from run to run (FreshPrompts), else None.
    prompt_ids: list[str] | None = None
    #: How the run's tokens arrived per chunk (None: not recorded, e.g. a run built by hand).
    chunking: Chunking | None = None
    #: Why the run's latency figures are left out of verdicts and summary (empty: they are trusted).
    untrusted: list[str] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return not self.invalid

    @property
    def latency_trusted(self) -> bool:
        """Valid, and its stream arrived as the engine made it."""
        return self.valid and not self.untrusted

    @property
    def hung(self) -> bool:
        return any(r.startswith(HUNG) for r in self.invalid)

    def to_dict(self) -> dict[str, Any]:
        """The run in the results file: every field of the run a baseline stores (`gate.nights.ArmRun`, which
        reads this), with the same names and values, and what only the results keep beside them."""
        spec = self.metrics.spec
        per_pos = spec.per_position_acceptance if spec is not None else None
        return {
            "arm": self.arm, "index": self.index, "valid": self.valid, "invalid_reasons": self.invalid,
            "cache_salt": self.cache_salt, **self.metrics.to_dict(), "hd_p95_ms": self.hd_p95_ms,
            # accepted tokens per draft position as counts, as the counters gave them (the rates times drafts)
            "accepted_per_pos": None if spec is None or per_pos is None else [round(a * spec.drafts) for a in per_pos],
            "settle": self.settle, **({"prompt_ids": self.prompt_ids} if self.prompt_ids is not None else {}),
            "latency_untrusted": self.untrusted,
            "chunking": None if self.chunking is None else self.chunking.to_dict(),
        }


def hd_p95s(load: LoadResult) -> dict[str, float | None]:
    """Harrell-Davis P95 in ms of the successful requests' TPOT, TTFT and E2E of one run."""
    from pytest_specdec.measure.metrics import harrell_davis_p95

    ok = [s for s in load.samples if s.error is None]
    out: dict[str, float | None] = {}
    for name, attr in (("tpot", "tpot_s"), ("ttft", "ttft_s"), ("e2e", "e2e_s")):
        vals = [v for v in (getattr(s, attr) for s in ok) if v is not None]
        p95 = harrell_davis_p95(vals)
        out[name] = None if p95 is None else p95 * 1000.0
    return out


def geomean(values: list[float]) -> float | None:
    vals = [v for v in values if v is not None and v > 0]
    return math.exp(sum(map(math.log, vals)) / len(vals)) if vals else None


def _median(values: list[float]) -> float | None:
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return None
    mid = len(vals) // 2
    return vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2


def speedups(reference: list[RunRecord], spec: list[RunRecord]) -> list[float | None]:
    """Per pair i: spec tok/s / reference tok/s, None when either run of the pair is invalid."""
    out: list[float | None] = []
    for ref, sp in zip(reference, spec):
        r, s = ref.metrics.output_tok_s, sp.metrics.output_tok_s
        out.append(s / r if ref.valid and sp.valid and r and s else None)
    return out


def summarize(reference: list[RunRecord], spec: list[RunRecord]) -> dict[str, Any]:
    """The test's summary over valid runs: geometric means for rates, pooled counters for acceptance,
    medians of per-run percentiles for latencies (of the spec arm; the reference's when no spec arm)."""
    ref_ok = [r for r in reference if r.valid]
    arm = [r for r in spec if r.valid] if spec else ref_ok
    timed = [r for r in arm if r.latency_trusted]  # a coalesced stream's latencies are left out
    pair = [s for s in speedups(reference, spec) if s is not None]
    figures = [r.metrics.spec for r in arm if r.metrics.spec is not None]
    drafts = sum(f.drafts for f in figures)
    draft_tokens = sum(f.draft_tokens for f in figures)
    accepted = sum(f.accepted_tokens for f in figures)
    per_pos: list[float] | None = None
    if drafts:
        width = max(len(f.per_position_acceptance or []) for f in figures)
        per_pos = [
            sum((f.per_position_acceptance or [0] * width)[i] * f.drafts for f in figures) / drafts
            for i in range(width)
        ]
    steps = sum(f.decode_steps or 0 for f in figures)

    def latency(name: str) -> dict[str, float | None]:
        return {
            p: _median([(getattr(r.metrics, name) or {}).get(p) for r in timed])  # type: ignore[misc]
            for p in ("p50", "p95", "p99")
        }

    return {
        "valid_runs": len(arm),
        "latency_runs": len(timed),
        "valid_reference_runs": len(ref_ok),
        "output_tok_s": geomean([r.metrics.output_tok_s for r in arm]),  # type: ignore[misc]
        "reference_tok_s": geomean([r.metrics.output_tok_s for r in ref_ok]),  # type: ignore[misc]
        "speedup": geomean(pair) if spec else None,
        "acceptance_rate": accepted / draft_tokens if draft_tokens else None,
        "acceptance_length": 1 + accepted / drafts if drafts else None,
        "per_position_acceptance": per_pos,
        "draft_coverage": min(1.0, drafts / steps) if steps and spec else None,
        "ttft_ms": latency("ttft_ms"),
        "tpot_ms": latency("tpot_ms"),
        "itl_token_ms": latency("itl_token_ms"),
        "itl_chunk_ms": latency("itl_chunk_ms"),
        "e2e_ms": latency("e2e_ms"),
    }


@dataclass
class CaseResult:
    """What a specdec test measured."""

    reference_runs: list[RunRecord]
    runs: list[RunRecord]
    summary: dict[str, Any]
    speedup_per_pair: list[float | None]
    #: "interleaved" (pairs alternate), or blocks of N runs per arm when the servers cannot co-reside
    alternation: str = "interleaved"
    blocks: int = 0  # blocks done so far (block alternation), so later looks continue the ABBA order
    #: Per arm, the server instance its last run used: a run on another instance (first run, a block
    #: switch's restart, a fresh suffix server) is warmed up first.
    instances: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def invalid_runs(self) -> list[RunRecord]:
        return [r for r in [*self.reference_runs, *self.runs] if not r.valid]

    @property
    def untrusted_runs(self) -> list[RunRecord]:
        """Valid runs whose latency figures are left out (coalesced streams)."""
        return [r for r in [*self.reference_runs, *self.runs] if r.valid and r.untrusted]

    def to_dict(self) -> dict[str, Any]:
        return {
            "runs": [r.to_dict() for r in self.runs],
            "reference_runs": [r.to_dict() for r in self.reference_runs],
            "speedup_per_pair": self.speedup_per_pair,
            "alternation": self.alternation,
            "summary": self.summary,
            "validity": {
                "valid": not self.invalid_runs,
                "invalid_runs": [
                    {"arm": r.arm, "index": r.index, "reasons": r.invalid} for r in self.invalid_runs
                ],
                "latency_untrusted_runs": [
                    {"arm": r.arm, "index": r.index, "reasons": r.untrusted} for r in self.untrusted_runs
                ],
            },
        }


def one_run(
    endpoint: Endpoint, arm: Arm, index: int, prompts: list[Prompt], sampling: Sampling, *,
    concurrency: int, api_key: str | None, rules: ValidityRules, warmup: int = 0, timeout_s: float = 600.0,
    api: str = "chat", rate: float | None = None, warmup_prompts: list[Prompt] | None = None,
    step_limit: int | None = 1,
) -> RunRecord:
    """One pass of the prompts; the /metrics delta covers exactly the measured requests.  The warm-up
    sends `warmup_prompts` when given, else `warmup` requests cycling through `prompts`.  `step_limit` is
    the most tokens one engine step makes per request (1, or k + 1 with speculation); None: unknown, so
    the stream's chunking is not judged."""
    from pytest_specdec.measure.client import IDLE_TIMEOUT_REASON, run_load_sync
    from pytest_specdec.measure.metrics import chunking, compute_run_metrics, counters_delta

    salt = uuid.uuid4().hex
    load: LoadResult = run_load_sync(
        endpoint.base_url, endpoint.model, prompts, sampling, concurrency=concurrency,
        cache_salt=salt, api_key=endpoint.api_key or api_key, warmup=warmup, timeout_s=timeout_s,
        api=api,  # type: ignore[arg-type]
        rate=rate, warmup_prompts=warmup_prompts, idle_timeout_s=rules.idle_timeout_s,
    )
    metrics = compute_run_metrics(load, counters_delta(load))
    record = RunRecord(arm=arm, index=index, metrics=metrics, cache_salt=salt,
                       texts={s.prompt_id: s.text for s in load.samples if s.error is None},
                       output_tokens={s.prompt_id: s.output_tokens for s in load.samples if s.error is None})
    record.invalid = invalid_reasons(metrics, len(prompts), rules)
    silent = sum(1 for x in load.samples if x.error is not None and x.error.startswith(IDLE_TIMEOUT_REASON))
    if silent:
        record.invalid.insert(0, f"{HUNG}: sent nothing for {rules.idle_timeout_s:g} s on {silent} request(s)")
    record.hd_p95_ms = hd_p95s(load)
    if step_limit is not None:
        record.chunking = chunking(load.samples, step_limit)
        record.untrusted = latency_untrusted(record.chunking, rules)
    if load.metrics_error:
        record.invalid.append(f"could not read /metrics: {load.metrics_error}")
    return record


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
    result = CaseResult(reference_runs=[], runs=[], summary={}, speedup_per_pair=[],
                        alternation="interleaved" if block is None or spec is None else f"blocks of {block}")
    return extend_case(result, reference, spec, prompts, sampling, runs=runs, block=block, **options)


def warmup_requests(n_prompts: int, concurrency: int) -> int:
    """Requests sent (and discarded) before a server's first measured run: enough to fill every slot
    twice, never more than the workload (the dry-run estimate counts them too)."""
    return min(n_prompts, 2 * concurrency)


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
    rules: ValidityRules = ValidityRules(),
    progress: Callable[[str], None] = lambda line: None,
    block: int | None = None,
    api: str = "chat",
    rate: float | None = None,
    settle: Callable[[], Quiet] | None = None,
    spec_tokens: int | None = None,
    restart: Callable[[Arm], Endpoint | Callable[[], Endpoint] | None] | None = None,
) -> CaseResult:
    """Continue the alternation of `result` up to `runs` pairs (sequential looks add runs this way).

    A run is warmed up when its arm's server instance is not the one the arm's previous run used: the
    first run of each arm, and after a restart (a block switch with one server at a time, a fresh
    suffix server).  A run's prompts are drawn before its server is asked for, so a draw that needs a
    fresh server gets one.  Summary and speedups are recomputed.  `settle` (e.g. the pool's wait for idle servers) is called right before
    every measured run, after its endpoint is ready and its warm-up is not yet sent; what it returns
    is kept with the run. After a run whose server hung, `restart(arm)` may hand a fresh server for the
    arm's later runs (None: keep the arm as it is).
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
        order = schedule(start, runs, block, result.blocks)
        if block is not None:
            result.blocks += len(range(start, runs, block))
    sources = {"reference": reference, "spec": spec}
    buckets = {"reference": ref_runs, "spec": spec_runs}
    for i, arm in order:
        run_prompts = source.run(i)
        server = sources[arm]
        assert server is not None
        endpoint = server() if callable(server) else server
        warm = result.instances.get(arm) != endpoint.instance
        n_warm = warmup_requests(len(run_prompts), concurrency) if warm else 0
        # Only the spec arm can learn from what it served; the reference warms up on the run's prompts.
        warmup = source.warmup(n_warm) if arm == "spec" else FixedPrompts(run_prompts).warmup(n_warm)
        quiet = settle() if settle is not None else None
        limit = 1 if arm == "reference" else None if spec_tokens is None else 1 + spec_tokens
        rec = one_run(endpoint, arm, i, run_prompts, sampling, concurrency=concurrency, api_key=api_key,
                      rules=rules, api=api, rate=rate, warmup_prompts=warmup, step_limit=limit)
        if quiet is not None:
            rec.settle = quiet.to_dict()
        if source.fresh:
            rec.prompt_ids = [p.id for p in run_prompts]
        result.instances[arm] = endpoint.instance
        buckets[arm].append(rec)
        m = rec.metrics
        rate_ = m.spec.acceptance_rate if m.spec else None
        acc = "" if rate_ is None else f", acceptance {rate_:.3f}"
        bad = (f"  INVALID: {'; '.join(rec.invalid)}" if not rec.valid
               else f"  LATENCY UNTRUSTED: {'; '.join(rec.untrusted)}" if rec.untrusted else "")
        noisy = "" if quiet is None or quiet.quiet else (f"  (servers still busy after {quiet.waited_s:.1f} s: "
                                                         f"{quiet.cores:.2f} cores)")
        progress(f"specdec:   run {i + 1}/{runs} {arm:9s} {m.output_tok_s or 0:8.1f} tok/s{acc}{bad}{noisy}")
        if rec.hung and restart is not None:
            fresh = restart(arm)
            if fresh is not None:
                sources[arm] = fresh
    result.summary = summarize(ref_runs, spec_runs)
    result.speedup_per_pair = speedups(ref_runs, spec_runs) if spec_runs else []
    return result
