"""Per-request samples and a /metrics counter delta → the figures of one run.

Latency figures follow ``vllm bench serve`` exactly (``vllm/benchmarks/serve.py: calculate_metrics``):
only successful requests count; TPOT only for requests with more than one output token; ITL is the flat
list of every successful request's chunk gaps; percentiles are ``np.percentile`` (linear interpolation),
means ``np.mean``, both on seconds and then multiplied by 1000. Speculative-decoding figures follow the
same file's counter deltas and ``vllm/v1/spec_decode/metrics.py`` (acceptance length counts the bonus
token). Where a figure is undefined this module gives None, where vLLM's bench gives 0 or NaN.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pytest_specdec.errors import ConfigError, SpecDecError
from pytest_specdec.measure.figures import tau
from pytest_specdec.measure.types import GOODPUT_SLOS, LoadResult, RequestSample, Sampling
from pytest_specdec.vllm.counters import Counters, delta, parse_counters

PERCENTILES: tuple[int, ...] = (50, 95, 99)


def counters_delta(load: LoadResult) -> Counters | None:
    """The counter delta over a ``run_load`` that collected /metrics before and after; None otherwise."""
    if load.metrics_before is None or load.metrics_after is None:
        return None
    return delta(parse_counters(load.metrics_before), parse_counters(load.metrics_after))


def summarize(values_s: Iterable[float]) -> dict[str, float] | None:
    """``{p50, p95, p99, mean}`` in ms, computed as ``vllm bench serve`` does; None for no values."""
    arr = np.asarray(list(values_s), dtype=float)
    if arr.size == 0:
        return None
    out = {f"p{p}": float(np.percentile(arr, p) * 1000) for p in PERCENTILES}
    out["mean"] = float(np.mean(arr) * 1000)
    return out


@dataclass
class SpecFigures:
    """What the spec-decode counters say of one run, in vLLM's definitions.

    Its own type because a run without speculation has none of these, where a run with it has all the
    counts (the ratios stay None when their denominator is 0)."""

    drafts: int
    draft_tokens: int
    accepted_tokens: int
    acceptance_rate: float | None = None
    acceptance_length: float | None = None
    per_position_acceptance: list[float] | None = None
    decode_steps: float | None = None
    draft_coverage: float | None = None

    @classmethod
    def from_delta(cls, d: Counters, n_started: int) -> SpecFigures:
        """Decode steps and draft coverage: every request's first token comes from its prefill step, which
        carries no draft; each later (decode) step yields one token plus the draft tokens it accepted. So
        over the run ``generation_tokens = N + S + accepted``, hence ``S = generation_tokens - N - accepted``
        (N = requests that produced a token) and ``draft_coverage = drafts / S``. Tokens accepted in a
        request's last step but cut by max_tokens/EOS/stop make S low by at most k per request, so the
        ratio is clamped to 1; requests of other clients of the same server pollute the delta.
        """
        out = cls(drafts=int(d.drafts), draft_tokens=int(d.draft_tokens), accepted_tokens=int(d.accepted_tokens))
        if d.draft_tokens > 0:
            out.acceptance_rate = d.accepted_tokens / d.draft_tokens
        if d.drafts > 0:
            out.acceptance_length = tau(d.drafts, d.accepted_tokens)
            out.per_position_acceptance = [a / d.drafts for a in d.accepted_per_pos]
        steps = d.generation_tokens - n_started - d.accepted_tokens
        if steps > 0:
            out.decode_steps = float(steps)
            out.draft_coverage = min(1.0, d.drafts / steps)
        return out


@dataclass
class EngineFigures:
    """What every engine's counters say of one run: tokens, preemptions, prefix cache.

    ``prefix_cache_*`` are the raw deltas behind the hit rate: with a fresh cache_salt per run, hits are
    only the run's own shared prefixes (e.g. the system prompt), never an earlier run's."""

    generation_tokens: int
    token_counter_mismatch: int  # generation_tokens minus the tokens the responses carried
    preemptions: int
    prefix_cache_hit_rate: float | None
    prefix_cache_queries: int
    prefix_cache_hits: int

    @classmethod
    def from_delta(cls, d: Counters, usage_tokens: int) -> EngineFigures:
        return cls(generation_tokens=int(d.generation_tokens),
                   token_counter_mismatch=int(d.generation_tokens) - usage_tokens,
                   preemptions=int(d.preemptions),
                   prefix_cache_hit_rate=(d.prefix_cache_hits / d.prefix_cache_queries
                                          if d.prefix_cache_queries > 0 else None),
                   prefix_cache_queries=int(d.prefix_cache_queries),
                   prefix_cache_hits=int(d.prefix_cache_hits))


@dataclass(frozen=True)
class RunMetrics:
    """The figures of one run; every value is plain (JSON-able) and None where undefined.

    ``spec`` and ``engine`` are None where no counter delta was taken (``engine``) or the run had no
    speculation (``spec``); a run's entry (`output.schema.run_metrics_entry`) flattens them, with None for each of
    their fields."""

    n_requests: int
    n_failed: int
    duration_s: float
    output_tok_s: float | None
    request_s: float | None
    total_output_tokens: int
    ttft_ms: dict[str, float] | None
    tpot_ms: dict[str, float] | None
    e2e_ms: dict[str, float] | None
    itl_chunk_ms: dict[str, float] | None
    itl_token_ms: dict[str, float] | None
    max_in_flight: int | None = None
    concurrency: int | None = None
    request_rate: float | None = None  # open loop (requests/s); None = closed loop
    loop_lag_max_ms: float | None = None
    loop_lag_mean_ms: float | None = None
    #: goodput (`goodput`): requests that met every SLO per second of the run; None when the test set no SLOs
    goodput_req_s: float | None = None
    good_requests: int | None = None
    goodput_slos_ms: dict[str, float] | None = None  # the SLOs it was counted against, as the marker gave them
    spec: SpecFigures | None = None
    engine: EngineFigures | None = None
    errors: dict[str, int] = field(default_factory=dict)
    finish_reasons: dict[str, int] = field(default_factory=dict)  # "stop" (EOS) vs "length" (max_tokens)


def good_requests(samples: Iterable[RequestSample], slos_ms: Mapping[str, float]) -> int:
    """How many requests met every SLO, as ``vllm bench serve --goodput`` counts them (``calculate_metrics``):
    successful requests only; an SLO ``s`` (ms, turned into seconds as bench does) holds for a value ``r`` when
    ``s >= r``; TPOT is ``(e2e - ttft) / (output tokens - 1)`` and counts as 0 for a request with one output token
    or none (bench's "if output_len <= 1, we regard tpot as 0 for goodput"). A successful request that streamed
    no token has bench's TTFT and latency of 0 (its defaults), so it is timed the same way here."""
    unknown = sorted(set(slos_ms) - set(GOODPUT_SLOS))
    if unknown:
        raise ConfigError(f"goodput SLO(s) {', '.join(unknown)} unknown: the SLOs are {', '.join(GOODPUT_SLOS)} (ms)")
    good = 0
    for s in samples:
        if s.error is not None:
            continue
        ttft, e2e = s.ttft_s or 0.0, s.e2e_s or 0.0
        tpot = (e2e - ttft) / (s.output_tokens - 1) if s.output_tokens > 1 else 0.0
        values = {"ttft": ttft, "tpot": tpot, "e2el": e2e}
        good += all(ms / 1000 >= values[name] for name, ms in slos_ms.items())
    return good


def compute_run_metrics(load: LoadResult, delta: Counters | None,
                        goodput_slos_ms: Mapping[str, float] | None = None) -> RunMetrics:
    """One run's figures from its samples and (optionally) the /metrics counter delta over it; with
    ``goodput_slos_ms`` (``{"ttft"|"tpot"|"e2el": ms}``) its goodput too: the requests that met every SLO
    (`good_requests`) per second of the same duration the request throughput divides by, as bench does."""
    ok = [s for s in load.samples if s.error is None]
    dur = load.duration_s
    total_out = sum(s.output_tokens for s in ok)
    ttfts = [s.ttft_s for s in ok if s.ttft_s is not None]
    e2es = [s.e2e_s for s in ok if s.e2e_s is not None]
    tpots = [t for t in (s.tpot_s for s in ok) if t is not None]
    itl_chunk = [x for s in ok for x in s.itls_chunk_s]
    itl_token = [x for s in ok for x in s.itls_token_s]
    good = good_requests(ok, goodput_slos_ms) if goodput_slos_ms else None
    engine = spec = None
    if delta is not None:
        # Counters see every token generated in the window, including those of requests that failed late.
        usage_tokens = sum(s.output_tokens for s in load.samples)
        n_started = sum(1 for s in load.samples if s.output_tokens > 0)
        engine = EngineFigures.from_delta(delta, usage_tokens)
        if delta.spec_decode:
            spec = SpecFigures.from_delta(delta, n_started)
    return RunMetrics(
        n_requests=len(load.samples), n_failed=len(load.samples) - len(ok), duration_s=dur,
        output_tok_s=total_out / dur if dur > 0 else None,
        request_s=len(ok) / dur if dur > 0 else None,
        total_output_tokens=total_out,
        ttft_ms=summarize(ttfts), tpot_ms=summarize(tpots), e2e_ms=summarize(e2es),
        itl_chunk_ms=summarize(itl_chunk), itl_token_ms=summarize(itl_token),
        max_in_flight=load.max_in_flight, concurrency=load.concurrency, request_rate=load.rate,
        loop_lag_max_ms=load.loop_lag_max_s * 1000, loop_lag_mean_ms=load.loop_lag_mean_s * 1000,
        errors=load.error_counts(),
        finish_reasons=dict(Counter(str(s.finish_reason) for s in ok)),
        good_requests=good, goodput_req_s=None if good is None or dur <= 0 else good / dur,
        goodput_slos_ms=dict(goodput_slos_ms) if goodput_slos_ms else None,
        engine=engine, spec=spec,
    )


# --- coalesced streams ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Chunking:
    """How one run's tokens reached the client: per SSE event and per read of the client.

    One engine step makes at most ``step_limit`` tokens per request (1 without speculation, k + 1 with
    it), and vLLM streams each step as it ends. More tokens at one moment mean the stream was held
    back and released at once, so its timestamps are not the engine's:

    * an **event** carrying more: vLLM's API server merged several steps' deltas because it fell behind
      the engine (``RequestOutputCollector`` merges when the producer gets ahead);
    * a **read** carrying more, from events of at most ``step_limit`` each: the events waited in the
      socket because the client was late to read them (descheduled, or busy).

    ``over_limit_share`` is the share of the run's tokens that arrived in reads carrying more than
    ``step_limit`` tokens (a merged event is also such a read).
    """

    step_limit: int
    events: dict[int, int]  # tokens per SSE event -> how many events
    reads: dict[int, int]  # tokens per client read (events that arrived together) -> how many reads
    tokens: int
    over_limit_tokens: int
    merged_events: int  # events carrying more than step_limit tokens
    max_event_tokens: int
    max_read_events: int  # most events in one read

    @property
    def over_limit_share(self) -> float:
        return self.over_limit_tokens / self.tokens if self.tokens else 0.0

    def cause(self) -> str:
        """Who held the stream back, in words a GPU user recognises."""
        if self.merged_events:
            return (f"vLLM's API server merged up to {self.max_event_tokens} tokens into one event, more than one "
                    f"engine step makes ({self.step_limit}): the API server was the bottleneck")
        return (f"the client read up to {self.max_read_events} events at once: it was late to read "
                "(descheduled or busy), not the server")



def chunking(samples: Iterable[RequestSample], step_limit: int) -> Chunking:
    """The tokens-per-chunk distribution of a run's successful requests (see `Chunking`).

    The client timestamps each read, so events with the same arrival time in one request came in one
    read."""
    if step_limit < 1:
        raise ValueError(f"step_limit must be >= 1 (tokens one engine step makes), got {step_limit}")
    events: Counter[int] = Counter()
    reads: Counter[int] = Counter()
    tokens = over = merged = max_read_events = 0
    for s in samples:
        if s.error is not None:
            continue
        t_prev, read_tokens, read_events = None, 0, 0
        for t, n in [*s.chunks, (None, 0)]:  # a sentinel closes the last read
            if t != t_prev and read_events:
                reads[read_tokens] += 1
                max_read_events = max(max_read_events, read_events)
                if read_tokens > step_limit:
                    over += read_tokens
                read_tokens = read_events = 0
            if t is None:
                break
            t_prev = t
            events[n] += 1
            tokens += n
            merged += n > step_limit
            read_tokens += n
            read_events += 1
    return Chunking(step_limit=step_limit, events=dict(events), reads=dict(reads), tokens=tokens,
                    over_limit_tokens=over, merged_events=merged, max_event_tokens=max(events, default=0),
                    max_read_events=max_read_events)


# --- `vllm bench serve --save-result --save-detailed` files -------------------------------------------


def load_bench_result(result: dict[str, Any] | str | os.PathLike[str]) -> LoadResult:
    """Turn a ``vllm bench serve --save-result --save-detailed`` JSON into a LoadResult.

    Field names are those of ``vllm/benchmarks/serve.py: benchmark`` (``ttfts``, ``itls``,
    ``latencies``, ``output_lens``, ``input_lens``, ``start_times``, ``errors``, ``duration``). A request
    succeeded when its ``errors`` entry is empty. The bench does not save tokens per chunk, so each
    chunk is given one token: per-token ITL then equals per-chunk ITL for such a file.
    """
    if not isinstance(result, dict):
        with open(result, encoding="utf-8") as f:
            result = json.load(f)
    assert isinstance(result, dict)
    missing = [k for k in ("ttfts", "itls", "latencies", "output_lens", "duration") if k not in result]
    if missing:
        raise SpecDecError(f"bench result lacks {missing}: was it saved with --save-result --save-detailed?")
    n = len(result["ttfts"])
    errors = result.get("errors") or [""] * n
    starts = result.get("start_times") or [0.0] * n
    inputs = result.get("input_lens") or [None] * n
    samples: list[RequestSample] = []
    for i in range(n):
        ttft, itl = float(result["ttfts"][i]), [float(x) for x in result["itls"][i]]
        s = RequestSample(prompt_id=str(i), start=float(starts[i]), prompt_tokens=inputs[i],
                          output_tokens=int(result["output_lens"][i]), error=errors[i] or None)
        if s.error is None:
            t, chunks = ttft, [(ttft, 1)]
            for g in itl:
                t += g
                chunks.append((t, 1))
            s.chunks, s.ttft_s, s.e2e_s = chunks, ttft, float(result["latencies"][i])
        samples.append(s)
    temp = result.get("temperature")
    return LoadResult(samples=samples, t_start=0.0, t_end=float(result["duration"]), max_in_flight=0,
                      loop_lag_max_s=0.0, loop_lag_mean_s=0.0,
                      sampling=Sampling(temperature=float(temp) if temp is not None else float("nan")),
                      base_url=str(result.get("base_url", "")), model=str(result.get("model_id", "")),
                      api="chat" if result.get("backend") == "openai-chat" else "completions",
                      concurrency=int(result.get("max_concurrency") or 0),
                      rate=None, seed=int(result.get("seed") or 0), cache_salt=None, warmup=0,
                      timeout_s=0.0)


def bench_run_metrics(result: dict[str, Any] | str | os.PathLike[str],
                      goodput_slos_ms: Mapping[str, float] | None = None) -> RunMetrics:
    """RunMetrics of a ``vllm bench serve`` detailed result, through the same code as our own runs (with
    ``goodput_slos_ms``, its goodput as the bench's ``--goodput`` with those SLOs counts it).

    Speculative-decoding figures are copied from the file's ``spec_decode_*`` fields (its acceptance
    rate is a percentage there and a fraction here).
    """
    if not isinstance(result, dict):
        with open(result, encoding="utf-8") as f:
            result = json.load(f)
    assert isinstance(result, dict)
    rm = compute_run_metrics(load_bench_result(result), None, goodput_slos_ms)
    spec = None
    if "spec_decode_num_drafts" in result:
        drafts = int(result["spec_decode_num_drafts"])
        spec = SpecFigures(
            drafts=drafts, draft_tokens=int(result["spec_decode_draft_tokens"]),
            accepted_tokens=int(result["spec_decode_accepted_tokens"]),
            acceptance_rate=result["spec_decode_acceptance_rate"] / 100,
            acceptance_length=result["spec_decode_acceptance_length"] if drafts else None,
            per_position_acceptance=list(result.get("spec_decode_per_position_acceptance_rates") or []) or None)
    return dataclasses.replace(rm, max_in_flight=None, loop_lag_max_ms=None, loop_lag_mean_ms=None, spec=spec)


#: ``vllm bench serve`` summary field -> (RunMetrics field, statistic or "" for a plain value).
BENCH_FIELDS: dict[str, tuple[str, str]] = {
    "output_throughput": ("output_tok_s", ""),
    "request_throughput": ("request_s", ""),
    **{f"{stat_name}_{bench}_ms": (ours, stat)
       for bench, ours in (("ttft", "ttft_ms"), ("tpot", "tpot_ms"), ("itl", "itl_chunk_ms"), ("e2el", "e2e_ms"))
       for stat_name, stat in (("mean", "mean"), ("median", "p50"), ("p50", "p50"), ("p95", "p95"), ("p99", "p99"))},
}


def bench_parity(result: dict[str, Any]) -> dict[str, dict[str, float]]:
    """bench serve's own summary figures next to the plugin's, recomputed from its per-request records.

    Why: the plugin claims ``vllm bench serve``'s definitions; this is the check (relative difference
    per figure), run on real files by ``python -m scripts.vs_bench_serve ab`` and in tests/functional/test_metrics.py.
    """
    ours = bench_run_metrics(result)
    out: dict[str, dict[str, float]] = {}
    for name, (attr, stat) in BENCH_FIELDS.items():
        figure = getattr(ours, attr)
        if name not in result or figure is None:
            continue
        value = float(figure[stat] if stat else figure)
        theirs = float(result[name])
        rel = abs(value - theirs) / abs(theirs) if theirs else abs(value)
        out[name] = {"bench": theirs, "plugin": value, "rel_diff": rel}
    return out


def harrell_davis_p95(samples: Sequence[float]) -> float | None:
    """One run's P95 from its per-request values by the Harrell–Davis estimator (a weighted mean of all
    order statistics: steadier than the interpolated sample P95 for the few hundred requests of a run).
    None for no samples; a single sample is its own estimate."""
    if any(s is None for s in samples):
        raise ConfigError("harrell_davis_p95: samples contain None")
    arr = np.asarray(samples, dtype=float)
    if arr.ndim != 1 or not np.all(np.isfinite(arr)):
        raise ConfigError("harrell_davis_p95: samples must be a flat list of finite numbers")
    if arr.size == 0:
        return None
    if arr.size == 1:
        return float(arr[0])
    from scipy.stats import mstats

    return float(mstats.hdquantiles(arr, prob=[0.95])[0])
