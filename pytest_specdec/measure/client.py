"""The async streaming client: drives load against an OpenAI-compatible vLLM server.

It times requests the way ``vllm bench serve`` does (``vllm/benchmarks/lib/endpoint_request_func.py``:
``async_request_openai_chat_completions``): TTFT is the arrival of the first chunk, E2E the arrival of
the last token-carrying chunk, both from a ``perf_counter`` taken just before the POST. Unlike the bench
client it counts tokens per chunk from vLLM's continuous usage stats, because with speculative decoding
one chunk carries 1 + accepted tokens, so chunk counts undercount output and overstate ITL.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import time
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import aiohttp

from pytest_specdec.errors import ConfigError, SpecDecError
from pytest_specdec.measure.arrivals import Flight, arrival_times, closed_loop, open_loop, ticker
from pytest_specdec.measure.types import (
    NOT_SENT,
    Api,
    LoadResult,
    Prompt,
    RequestSample,
    Sampling,
)
from pytest_specdec.servers.http import headers as http_headers
from pytest_specdec.servers.http import metrics_text
from pytest_specdec.servers.hygiene import raise_if_terminated
from pytest_specdec.vllm.request_metrics import WHERE, read_request_spec_decode

_PATHS: dict[str, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
# json.loads(bytes) spends half its time sniffing the encoding and wrapping; SSE is UTF-8 by definition,
# so the stream loop decodes and calls the C scanner through raw_decode (2.7 -> 1.5 µs per chunk).
_raw_decode = json.JSONDecoder().raw_decode
_T = TypeVar("_T")


def _body(p: Prompt, model: str, sampling: Sampling, api: Api, cache_salt: str | None) -> dict[str, Any]:
    """The JSON body for one request; no per-request ``seed`` (vLLM's seeded sampling path is slower)."""
    body: dict[str, Any] = {"model": model, "stream": True,
                            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    if api == "chat":
        if p.messages is None:
            raise ConfigError(f"prompt {p.id!r} has no `messages` but the chat API was asked for")
        body["messages"] = p.messages
        body["max_completion_tokens"] = p.max_tokens
    else:
        if p.prompt is None:
            raise ConfigError(f"prompt {p.id!r} has no `prompt` but the completions API was asked for")
        body["prompt"] = p.prompt
        body["max_tokens"] = p.max_tokens
        if p.add_special_tokens is not None:
            body["add_special_tokens"] = p.add_special_tokens
    body.update(sampling.to_request())
    if cache_salt is not None:
        body["cache_salt"] = cache_salt
    return body


class _Halt:
    """Stops a run at the first request the server leaves silent for the idle timeout: the requests in
    flight are cancelled and the rest are not sent. A hung server then costs one idle timeout per run,
    not one per request, and the run is still judged hung by that first request."""

    __slots__ = ("reason", "inflight", "cancelled")

    def __init__(self) -> None:
        self.reason: str | None = None
        self.inflight: set[asyncio.Task[Any]] = set()
        self.cancelled: set[asyncio.Task[Any]] = set()

    def stop(self, reason: str) -> None:
        """Cancel every other request in flight (once: later silent requests add nothing)."""
        if self.reason is not None:
            return
        self.reason = reason
        me = asyncio.current_task()
        for task in self.inflight - {me}:
            self.cancelled.add(task)
            task.cancel()

    def stopped(self, task: asyncio.Task[Any] | None) -> bool:
        """Whether ``task``'s cancellation is this halt's, not the caller's (an interrupt, say)."""
        if task not in self.cancelled:
            return False
        self.cancelled.discard(task)
        uncancel = getattr(task, "uncancel", None)  # 3.11+: a caught cancellation is handed back
        if uncancel is not None:
            uncancel()
        return True

    def wait(self, idle_timeout_s: float | None, usual_s: float = 30.0) -> float:
        """How long to wait for /metrics after these requests: a server that just went silent gets no
        longer than the idle timeout to answer it either."""
        return idle_timeout_s if self.reason is not None and idle_timeout_s else usual_s

    def unsent(self, prompt: Prompt) -> RequestSample:
        """The sample of a request not sent because the run stopped."""
        return RequestSample(prompt_id=prompt.id, start=time.perf_counter(), category=prompt.category,
                             error=f"{NOT_SENT}: {self.reason}")


async def _one_request(session: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str],
                       prompt: Prompt, api: Api, timeout: aiohttp.ClientTimeout, flight: Flight,
                       queued_at: float | None = None, halt: _Halt | None = None) -> RequestSample:
    """Send one streaming request and record it; every failure ends up in ``sample.error``. With ``halt``,
    an idle timeout stops the whole run: a request that run stops keeps what it received so far, and one
    due after it is not sent."""
    if halt is not None and halt.reason is not None:
        return halt.unsent(prompt)
    perf = time.perf_counter
    decode = _raw_decode
    chat = api == "chat"
    st = perf()
    sample = RequestSample(prompt_id=prompt.id, start=st, category=prompt.category,
                           queue_s=0.0 if queued_at is None else st - queued_at)
    chunks = sample.chunks
    pieces: list[str] = []
    seen = 0  # completion_tokens reported so far
    done = False
    task = asyncio.current_task()
    if halt is not None and task is not None:
        halt.inflight.add(task)
    flight.enter()
    try:
        async with session.post(url, json=body, headers=headers, timeout=timeout) as resp:
            if resp.status != 200:
                detail = (await resp.text())[:300]
                sample.error = f"HTTP {resp.status}: {detail}"
                return sample
            buf = b""
            async for data in resp.content.iter_any():
                t = perf() - st
                buf += data
                if b"\n" not in data:
                    continue
                lines = buf.split(b"\n")
                buf = lines.pop()
                for line in lines:
                    if not line.startswith(b"data:"):
                        continue  # blank separators, SSE comments (pings), event: lines
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        done = True
                        break
                    text = payload.decode()
                    obj, end = decode(text)
                    if end != len(text):
                        raise ValueError(f"extra data after the JSON object at {end}: {text[end:end + 40]!r}")
                    if "error" in obj and not obj.get("choices"):
                        err = obj["error"]
                        msg = err.get("message", err) if isinstance(err, dict) else err
                        sample.error = f"server error in stream: {msg}"
                        return sample
                    usage = obj.get("usage")
                    choices = obj.get("choices")
                    if "metrics" in obj:  # the final usage chunk, from a server with per-request metrics
                        _read_metrics(obj["metrics"], sample)
                    if usage is None:
                        sample.error = ("a chunk carried no usage: the server ignored "
                                        "stream_options.continuous_usage_stats, so tokens cannot be counted")
                        return sample
                    ct = usage["completion_tokens"]
                    n = ct - seen
                    if n < 0:
                        sample.error = f"usage.completion_tokens went backwards ({seen} -> {ct})"
                        return sample
                    if n:
                        seen = ct
                        chunks.append((t, n))
                    if sample.prompt_tokens is None:
                        sample.prompt_tokens = usage.get("prompt_tokens")
                    if choices:
                        c0 = choices[0]
                        piece = (c0.get("delta") or {}).get("content") if chat else c0.get("text")
                        if piece:
                            pieces.append(piece)
                        if c0.get("finish_reason") is not None:
                            sample.finish_reason = c0["finish_reason"]
                if done:
                    break
    except TimeoutError:  # an alias of TimeoutError since 3.11; distinct (and raised by aiohttp) on 3.10
        idle = timeout.sock_read is not None and (perf() - st) < (timeout.total or float("inf")) - 0.5
        sample.error = (f"{IDLE_TIMEOUT_REASON}: nothing received for {timeout.sock_read:g} s" if idle
                        else f"timeout after {timeout.total} s")
        if idle and halt is not None:
            halt.stop(f"another request of the run got nothing for {timeout.sock_read:g} s")
    except aiohttp.ClientError as e:
        sample.error = f"{type(e).__name__}: {e}"
    except (ValueError, KeyError, TypeError) as e:  # malformed JSON or usage: the server broke the protocol
        sample.error = f"bad stream data: {type(e).__name__}: {e}"
    except asyncio.CancelledError:
        if halt is None or not halt.stopped(task):
            raise
        sample.error = f"{CANCELLED}: {halt.reason}"
    finally:
        if halt is not None:
            halt.inflight.discard(task)
        flight.leave()
        sample.output_tokens = seen
        sample.text = "".join(pieces)
        if chunks:
            sample.ttft_s = chunks[0][0]
            sample.e2e_s = chunks[-1][0]
    if sample.error is None:
        if not done:
            sample.error = "stream ended before data: [DONE]"
        elif not chunks:
            sample.error = "no token received"
    return sample


def _read_metrics(metrics: Any, sample: RequestSample) -> None:
    """A chunk's `metrics` (vLLM's `PerRequestMetrics`): its `speculative_decoding` into the sample. Anything
    malformed, or a second one in the same stream, is a ValueError naming it: the request fails with it."""
    if metrics is None:
        return
    if not isinstance(metrics, dict):
        raise ValueError(f"a chunk's `metrics` is {metrics!r}, not an object")
    payload = metrics.get("speculative_decoding")
    if payload is None:
        return
    if sample.spec_decode is not None:
        raise ValueError(f"{WHERE} came twice in one stream")
    sample.spec_decode = read_request_spec_decode(payload)


#: How a request that the server stopped answering is named in its error (the runner looks for it).
IDLE_TIMEOUT_REASON = "idle stream"
#: How the requests of a run that stopped at an idle timeout are named: in flight, and not yet sent.
CANCELLED = "cancelled"


async def run_load(base_url: str, model: str, prompts: list[Prompt], sampling: Sampling, *, concurrency: int,
                   api: Api = "chat", rate: float | None = None, seed: int = 0, cache_salt: str | None = None,
                   api_key: str | None = None, timeout_s: float = 600, idle_timeout_s: float | None = None,
                   warmup: int = 0,
                   collect_metrics: bool = True, warmup_prompts: list[Prompt] | None = None,
                   burstiness: float = 1.0) -> LoadResult:
    """Send every prompt once (after ``warmup`` discarded requests) and record each request.

    The warm-up cycles through ``prompts``, or sends ``warmup_prompts`` (all of them) when given: a
    drafter that learns from what it served (suffix decoding) must not see the measured prompts first.

    Closed loop when ``rate`` is None (``concurrency`` requests always in flight), else open loop with
    seeded gamma arrivals of shape ``burstiness`` (1: Poisson), as ``vllm bench serve`` schedules them
    (`arrival_times`), still capped at ``concurrency`` in flight. Request errors are recorded per sample, never raised.
    With
    ``collect_metrics`` the server's /metrics is read right after warm-up and right after the run, so the
    counter delta covers exactly the measured requests.

    ``idle_timeout_s`` bounds the wait for each next piece of a response (its first byte included): a
    server that is alive but sends nothing fails the request in that time instead of ``timeout_s``. The
    first such request stops the run (and the warm-up on its own): the others in flight are cancelled and
    the rest are not sent, each recorded with why, so a hung server costs one idle timeout, not one per
    request; the /metrics read after it waits no longer than that either.
    """
    if concurrency < 1:
        raise ConfigError(f"concurrency must be >= 1, got {concurrency}")
    if rate is not None and rate <= 0:
        raise ConfigError(f"rate must be > 0 requests/s or None (closed loop), got {rate}")
    if api not in _PATHS:
        raise ConfigError(f"api must be 'chat' or 'completions', got {api!r}")
    if not prompts:
        raise ConfigError("run_load needs at least one prompt")
    if not burstiness > 0:
        raise ConfigError(f"burstiness must be > 0 (the gamma shape of the arrivals), got {burstiness}")
    arrivals = None if rate is None else arrival_times(len(prompts), rate, burstiness, seed)
    base = base_url.rstrip("/")
    url = base + _PATHS[api]
    headers = http_headers(api_key)
    if idle_timeout_s is not None and idle_timeout_s <= 0:
        raise ConfigError(f"idle_timeout_s must be > 0 seconds or None, got {idle_timeout_s}")
    timeout = aiohttp.ClientTimeout(total=timeout_s, sock_read=idle_timeout_s)
    # Bodies are built up front so a bad prompt fails before any load, and so building is not timed.
    jobs = [(p, _body(p, model, sampling, api, cache_salt)) for p in prompts]
    # Warm-up gets its own salt so it cannot fill the prefix cache for the measured requests.
    wsalt = None if cache_salt is None else f"{cache_salt}:warmup"
    if warmup_prompts is None:
        warmup_prompts = [prompts[i % len(prompts)] for i in range(warmup)]
    warmup = len(warmup_prompts)
    wjobs = [(p, _body(p, model, sampling, api, wsalt)) for p in warmup_prompts]
    flight = Flight()
    connector = aiohttp.TCPConnector(limit=concurrency + 2, limit_per_host=0, ttl_dns_cache=None)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        wflight, whalt, halt = Flight(), _Halt(), _Halt()

        async def wrun(p: Prompt, body: dict[str, Any], queued_at: float | None) -> RequestSample:
            return await _one_request(session, url, body, headers, p, api, timeout, wflight, queued_at, whalt)

        async def run(p: Prompt, body: dict[str, Any], queued_at: float | None) -> RequestSample:
            return await _one_request(session, url, body, headers, p, api, timeout, flight, queued_at, halt)

        warmup_failed = 0
        if wjobs:
            wsamples = await closed_loop(wrun, wjobs, concurrency)
            warmup_failed = sum(1 for s in wsamples if s.error is not None)

        metrics_before = metrics_after = metrics_error = None
        if collect_metrics:
            try:
                metrics_before = await metrics_text(base, api_key, timeout_s=whalt.wait(idle_timeout_s))
            except SpecDecError as e:
                metrics_error = str(e)

        stop = asyncio.Event()
        lags: list[float] = []
        ticking = asyncio.create_task(ticker(stop, lags))
        with gc_held_off():
            t_start = time.perf_counter()
            if rate is None:
                samples = await closed_loop(run, jobs, concurrency)
            else:
                assert arrivals is not None
                samples = await open_loop(run, jobs, concurrency, arrivals, lambda: halt.reason is not None)
            t_end = time.perf_counter()
        stop.set()
        await ticking

        if collect_metrics and metrics_error is None:
            try:
                metrics_after = await metrics_text(base, api_key, timeout_s=halt.wait(idle_timeout_s))
            except SpecDecError as e:
                metrics_error = str(e)

    return LoadResult(samples=samples, t_start=t_start, t_end=t_end, max_in_flight=flight.peak,
                      loop_lag_max_s=max(lags, default=0.0),
                      loop_lag_mean_s=sum(lags) / len(lags) if lags else 0.0,
                      sampling=sampling, base_url=base, model=model, api=api, concurrency=concurrency,
                      rate=rate, seed=seed, cache_salt=cache_salt, warmup=warmup, timeout_s=timeout_s,
                      warmup_failed=warmup_failed, metrics_before=metrics_before, metrics_after=metrics_after,
                      metrics_error=metrics_error, burstiness=burstiness, arrivals_s=arrivals)


@contextlib.contextmanager
def gc_held_off() -> Iterator[None]:
    """Python's cyclic garbage collector off while a run is timed, as ``timeit`` does, and back on after it.

    Why: a full collection in a pytest process that holds a session's objects pauses every thread for ~100 ms
    (measured in tests/functional/test_speed_gate.py's process), which a short run reads as the server's
    slowness: one such pause made a 0.38 s run take 0.50 s. Reference counting still frees what a run
    drops; what only the collector can free waits until the run ends.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def event_loop_name() -> str:
    """The event loop ``run_coroutine`` uses, with its version: recorded with the results."""
    try:
        import uvloop
    except ImportError:
        return "asyncio"
    return f"uvloop {getattr(uvloop, '__version__', 'unknown version')}"


def run_coroutine(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run ``coro`` on a new event loop: uvloop's when it is installed (vLLM depends on it), else asyncio's.

    Why: the client's CPU per streamed token is what caps the concurrency one process can drive without
    becoming the bottleneck; with uvloop it is below ``vllm bench serve``'s (docs/validation.md, measured
    by ``python -m scripts.vs_bench_serve overhead-inproc``).
    """
    try:
        import uvloop
    except ImportError:
        result = asyncio.run(coro)
    else:
        result = uvloop.run(coro)
    raise_if_terminated()  # a SIGTERM that a callback of the load swallowed still ends the session
    return result


def run_load_sync(base_url: str, model: str, prompts: list[Prompt], sampling: Sampling, *, concurrency: int,
                  api: Api = "chat", rate: float | None = None, seed: int = 0, cache_salt: str | None = None,
                  api_key: str | None = None, timeout_s: float = 600, idle_timeout_s: float | None = None,
                  warmup: int = 0,
                  collect_metrics: bool = True, warmup_prompts: list[Prompt] | None = None,
                  burstiness: float = 1.0) -> LoadResult:
    """``run_load`` for synchronous callers (a pytest test body): runs its own event loop."""
    return run_coroutine(run_load(base_url, model, prompts, sampling, concurrency=concurrency, api=api, rate=rate,
                                seed=seed, cache_salt=cache_salt, api_key=api_key, timeout_s=timeout_s,
                                idle_timeout_s=idle_timeout_s,
                                warmup=warmup, collect_metrics=collect_metrics, warmup_prompts=warmup_prompts,
                                burstiness=burstiness))
