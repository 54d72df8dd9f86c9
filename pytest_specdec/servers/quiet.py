"""Waiting for vLLM servers to go idle before a run: their CPU use, or a fixed delay where their
processes cannot be seen (`wait_quiet`, `listening_pgids`, `idle_delay`). Standard library only."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable


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

    def to_dict(self) -> dict[str, Any]:
        return {"waited_s": round(self.waited_s, 3), "quiet": self.quiet, "cores": round(self.cores, 3),
                "how": self.how}


#: A fixed wait before each run against servers whose processes cannot be watched: vLLM's busy-wait
#: after the last step (``busy_loop_s = 1``) plus a margin.
IDLE_DELAY_S = 1.2


def idle_delay(delay_s: float = IDLE_DELAY_S, sleep: Callable[[float], None] = time.sleep) -> Quiet:
    """Wait out the servers' busy-wait when their CPU use cannot be read (endpoints not on this host)."""
    sleep(delay_s)
    return Quiet(delay_s, True, 0.0, how="delay")


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


def wait_quiet(pgids: set[int], *, timeout_s: float = 3.0, window_s: float = 0.2, max_cores: float = 0.1,
               ticks: Callable[[set[int]], int] = group_cpu_ticks, sleep: Callable[[float], None] = time.sleep,
               clock: Callable[[], float] = time.monotonic) -> Quiet:
    """Wait until the vLLM process groups `pgids` use at most `max_cores` over a `window_s` window.

    Why: vLLM's engine and worker processes busy-wait (``sched_yield``) on their shared-memory queues for
    1 s after their last message (``shm_broadcast.SpinCondition``, ``busy_loop_s = 1``).  A run that starts
    right after another server's run shares the cores with that server's spinning processes: on the 2-core
    CPU profile the worker of an idle server spinning on the same core cut the next run's tok/s by up to 4x.
    """
    if not pgids or timeout_s <= 0:
        return Quiet(0.0, True, 0.0)
    hz = os.sysconf("SC_CLK_TCK")
    t0 = clock()
    before = ticks(pgids)
    while True:
        sleep(window_s)
        now = ticks(pgids)
        cores = (now - before) / hz / window_s
        waited = clock() - t0
        if cores <= max_cores:
            return Quiet(waited, True, cores)
        if waited >= timeout_s:
            return Quiet(waited, False, cores)
        before = now
