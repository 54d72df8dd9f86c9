"""How a run's requests are issued: a closed loop (a fixed number in flight) or an open loop (seeded gamma
arrivals as ``vllm bench serve`` schedules them, capped at the concurrency), the count of requests in flight,
and the ticker that measures how late the client's event loop is (a late loop means a client-bound run, not
a slow server)."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_specdec.measure.types import Prompt, RequestSample

TICK_S = 0.01  # event-loop lag probe period: fine enough to see a stalled client, cheap enough to ignore


class Flight:
    """Counts requests in flight, remembering the peak."""

    __slots__ = ("now", "peak")

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0

    def enter(self) -> None:
        self.now += 1
        if self.now > self.peak:
            self.peak = self.now

    def leave(self) -> None:
        self.now -= 1


async def ticker(stop: asyncio.Event, lags: list[float]) -> None:
    """Sleep in short periods and record how late each wake-up is: a late loop means a busy client."""
    perf = time.perf_counter
    while not stop.is_set():
        t0 = perf()
        await asyncio.sleep(TICK_S)
        lags.append(max(0.0, perf() - t0 - TICK_S))


Job = tuple["Prompt", dict[str, Any]]
RunFn = Callable[["Prompt", dict[str, Any], "float | None"], Awaitable["RequestSample"]]


async def closed_loop(run: RunFn, jobs: list[Job], concurrency: int) -> list[RequestSample]:
    """At most ``concurrency`` requests in flight; each worker sends its next request when one ends."""
    out: list[RequestSample | None] = [None] * len(jobs)
    it = iter(range(len(jobs)))

    async def worker() -> None:
        for i in it:
            out[i] = await run(jobs[i][0], jobs[i][1], None)

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(jobs)))))
    return [s for s in out if s is not None]


def arrival_times(n: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """When each of ``n`` requests arrives (seconds from the run's start), as ``vllm bench serve``'s
    ``get_request`` schedules a constant ``rate``: gamma(shape=burstiness, scale=1/(rate*burstiness))
    intervals (1: Poisson; inf: constant 1/rate), summed, then rescaled so the last arrival is at n/rate.

    Why this generator: bench seeds the global ``np.random.seed(seed)`` and draws ``np.random.gamma`` once
    per request; the random dataset draws from its own generator, so ``RandomState(seed)`` gives bench's
    exact schedule for the same seed (checked against vLLM's code in tests/functional/test_bench_parity.py).
    """
    if n < 1:
        raise ValueError(f"arrival_times needs n >= 1 requests, got {n}")
    if not rate > 0 or math.isinf(rate):
        raise ValueError(f"arrival_times needs a finite rate > 0 requests/s, got {rate}")
    if not burstiness > 0:
        raise ValueError(f"burstiness must be > 0 (the gamma shape), got {burstiness}")
    if math.isinf(burstiness):
        delays = [1.0 / rate] * n
    else:
        import numpy as np

        gen = np.random.RandomState(seed)
        theta = 1.0 / (rate * burstiness)
        delays = [float(gen.gamma(shape=burstiness, scale=theta)) for _ in range(n)]  # one draw each, as bench
    for i in range(1, n):
        delays[i] += delays[i - 1]
    if delays[-1] != 0:
        factor = (n / rate) / delays[-1]
        delays = [d * factor for d in delays]
    return delays


async def open_loop(run: RunFn, jobs: list[Job], concurrency: int, arrivals: list[float],
                    stopped: Callable[[], bool] = lambda: False) -> list[RequestSample]:
    """Each job sent at its arrival time (seconds from now, `arrival_times`), still capped at ``concurrency``
    in flight; once ``stopped()`` the remaining arrivals are not waited for."""
    if len(arrivals) != len(jobs):
        raise ValueError(f"open_loop: {len(arrivals)} arrival times for {len(jobs)} requests")
    sem = asyncio.Semaphore(concurrency)
    t0 = time.perf_counter()
    tasks: list[asyncio.Task[RequestSample]] = []

    async def gated(p: Prompt, body: dict[str, Any], at: float) -> RequestSample:
        async with sem:
            return await run(p, body, at)

    for (p, body), arrival in zip(jobs, arrivals, strict=True):
        delay = t0 + arrival - time.perf_counter()
        if delay > 0 and not stopped():
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(gated(p, body, time.perf_counter())))
    return list(await asyncio.gather(*tasks))
