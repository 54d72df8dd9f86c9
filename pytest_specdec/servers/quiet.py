"""Waiting for vLLM servers to go idle before a run: their CPU use and the requests their /metrics say they
hold, or a fixed delay where their processes cannot be seen (`wait_idle`, `listening_pgids`, `idle_delay`)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from pytest_specdec.errors import SpecDecError
from pytest_specdec.servers.http import get
from pytest_specdec.vllm.counters import in_flight


def group_cpu_ticks(pgids: set[int]) -> int:
    """CPU time (clock ticks, user + system) used so far by every process in the process groups `pgids`."""
    return sum(cpu_ticks_by_group(pgids).values())


def cpu_ticks_by_group(pgids: set[int]) -> dict[int, int]:
    """CPU time (clock ticks, user + system) used so far by the processes of each process group in `pgids`
    (a group with no process left reads 0)."""
    total = dict.fromkeys(pgids, 0)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # gone, or not ours to read
            continue
        # Fields after the ")" that closes the command name: state ppid pgrp ... utime(14) stime(15).
        rest = stat[stat.rindex(b")") + 2:].split()
        if (group := int(rest[2])) in total:
            total[group] += int(rest[11]) + int(rest[12])
    return total


@dataclass(frozen=True)
class Quiet:
    """How long a run waited for the servers to go quiet, and whether they did before the deadline."""

    waited_s: float
    quiet: bool
    cores: float  # CPU use of the servers in the last window, in cores
    #: "cpu": their CPU use was watched; "delay": their processes could not be found, so a fixed wait
    how: str = "cpu"
    #: Requests running or waiting on the servers at the last look (None: not read, e.g. the CPU was busy)
    requests: int | None = None
    #: Seconds from the end of the previous run to the start of this wait (None: no previous run known)
    after_run_s: float | None = None


#: A fixed wait before each run against servers whose processes cannot be watched: vLLM's busy-wait
#: after the last step (``busy_loop_s = 1``) plus a margin.
IDLE_DELAY_S = 1.2


def idle_delay(delay_s: float = IDLE_DELAY_S, ended: float | None = None, sleep: Callable[[float], None] = time.sleep,
               clock: Callable[[], float] = time.monotonic) -> Quiet:
    """Wait out the servers' busy-wait when their CPU use cannot be read (endpoints not on this host): what is
    left of `delay_s` since the previous run ended at `ended` (`clock`'s time; None: all of it), so the
    bookkeeping done after that run (counters, verdicts) counts towards it instead of being waited again."""
    after = None if ended is None else max(clock() - ended, 0.0)
    left = max(delay_s - (after or 0.0), 0.0)
    if left > 0:
        sleep(left)
    return Quiet(left, True, 0.0, how="delay", after_run_s=after)


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:  # the descriptor closed while we looked
        return ""


def listening_pgids(port: int, proc: str = "/proc") -> set[int]:
    """The process groups of the processes listening on TCP `port` of this host (empty when none of
    them can be seen): the hand-started vLLM server behind a loopback endpoint, with its engine and
    worker processes, which share its group.

    Why: an endpoint on this host busy-waits after each run just like a server we started, and the
    other arm's run would share the cores with it; we can only wait for processes we can find.
    """
    inodes: set[str] = set()
    for table in ("tcp", "tcp6"):
        try:
            with open(f"{proc}/net/{table}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            # local_address is HEX_IP:HEX_PORT; state 0A is LISTEN; column 9 is the socket's inode
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(cols[9])
    if not inodes:
        return set()
    wanted = {f"socket:[{i}]" for i in inodes}
    pgids: set[int] = set()
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        try:
            with os.scandir(f"{proc}/{entry.name}/fd") as fds:
                if any(_readlink(fd.path) in wanted for fd in fds):
                    pgids.add(os.getpgid(int(entry.name)))
        except OSError:  # gone, or not ours to look at
            continue
    return pgids


#: How often the servers' CPU time is read while waiting for them: vLLM spins 1 s after its last step, so a
#: coarse window (0.2 s before) wastes up to a window per run after the spin ends.
SAMPLE_S = 0.05
#: Windows in a row that must be idle: a spinning server that the loaded machine left unscheduled for one
#: window reads 0 cores in it, and is not taken for idle on that alone.
IDLE_WINDOWS = 2


def wait_idle(pgids: set[int], *, timeout_s: float = 3.0, requests: Callable[[], int] | None = None,
              ended: float | None = None, window_s: float = SAMPLE_S, windows: int = IDLE_WINDOWS,
              max_cores: float = 0.1, ticks: Callable[[set[int]], int] = group_cpu_ticks,
              sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> Quiet:
    """Wait until the process groups `pgids` use at most `max_cores` over `windows` windows of `window_s` in a
    row and then `requests` (the servers' running + waiting requests, read once the CPU is quiet: a /metrics
    answer is itself CPU the servers spend, so it is read rarely and out of the windows) is 0; give up
    after `timeout_s` (not quiet). `ended` is when the previous run ended (`clock`'s time), recorded as
    ``after_run_s``: the bookkeeping after a run overlaps the servers' spin, which ends 1 s after their last
    step whatever we did meanwhile, so a wait that measures needs no fixed share of its own.

    Why: vLLM's engine and worker processes busy-wait (``sched_yield``) on their shared-memory queues for
    1 s after their last message (``shm_broadcast.SpinCondition``, ``busy_loop_s = 1``).  A run that starts
    right after another server's run shares the cores with that server's spinning processes: on the 2-core
    CPU profile the worker of an idle server spinning on the same core cut the next run's tok/s by up to 4x.
    A server still holding requests (a run's requests the client gave up on) is busy though its CPU may dip.
    """
    t0 = clock()
    after = None if ended is None else max(t0 - ended, 0.0)
    if (not pgids and requests is None) or timeout_s <= 0:
        return Quiet(0.0, True, 0.0, after_run_s=after)
    hz = os.sysconf("SC_CLK_TCK")
    before = ticks(pgids) if pgids else 0
    idle, held = 0, None
    while True:
        sleep(window_s)
        now = ticks(pgids) if pgids else 0
        cores = (now - before) / hz / window_s
        before = now
        idle = idle + 1 if cores <= max_cores else 0
        waited = clock() - t0
        if idle >= windows:
            held = requests() if requests is not None else None
            if not held:
                return Quiet(waited, True, cores, requests=held, after_run_s=after)
            idle = 0
            # Answering /metrics costs the servers CPU of their own: the next window starts after it.
            before = ticks(pgids) if pgids else 0
        if waited >= timeout_s:
            return Quiet(waited, False, cores, requests=held, after_run_s=after)


def requests_held(servers: list[tuple[str, str | None]], timeout_s: float = 2.0) -> int:
    """The requests running or waiting on `servers` (base URL, API key), summed over their engines
    (`vllm:num_requests_running` + `vllm:num_requests_waiting`). A server whose /metrics does not answer counts
    0: it holds nothing a wait could wait out, and a dead one is the next run's to find and record."""
    total = 0
    for url, key in servers:
        answer = get(url.rstrip("/") + "/metrics", key, timeout_s)
        if answer.ok:
            try:
                total += in_flight(answer.text)
            except SpecDecError as e:
                raise SpecDecError(f"GET {answer.url}: {e}") from None
    return total
