"""How a run's requests are issued: a closed loop (a fixed number in flight) or an open loop (seeded Poisson
arrivals, capped at the concurrency), the count of requests in flight, and the ticker that measures how
late the client's event loop is (a late loop means a client-bound run, not a slow server)."""

from __future__ import annotations

import asyncio
import random
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


async def open_loop(run: RunFn, jobs: list[Job], concurrency: int, rate: float, seed: int,
                     stopped: Callable[[], bool] = lambda: False) -> list[RequestSample]:
    """Poisson arrivals at ``rate``/s (seeded), still capped at ``concurrency`` in flight; once ``stopped()``
    the remaining arrivals are not waited for."""
    rng = random.Random(seed)
    sem = asyncio.Semaphore(concurrency)
    t0 = time.perf_counter()
    arrival = 0.0
    tasks: list[asyncio.Task[RequestSample]] = []

    async def gated(p: Prompt, body: dict[str, Any], at: float) -> RequestSample:
        async with sem:
            return await run(p, body, at)

    for p, body in jobs:
        delay = t0 + arrival - time.perf_counter()
        if delay > 0 and not stopped():
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(gated(p, body, time.perf_counter())))
        arrival += rng.expovariate(rate)
    return list(await asyncio.gather(*tasks))
