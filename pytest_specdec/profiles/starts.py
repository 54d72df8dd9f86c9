"""Which servers start together: on a GPU start-up dominates (a minute or more per server while the GPU sits
idle), and servers that co-reside anyway can start at once. Pure: the session asks before each test, the
dry run's estimate asks the same questions of the same function, the pool starts what it is told.

A plan starts the test's own missing servers plus the next tests' servers (in run order) that fit beside
them: at most the pool's cap alive at once, and their `--gpu-memory-utilization` fractions summing to at
most 1 (one process's servers share its GPUs, servers/gpus.py). A server without the flag counts at vLLM's
default, 0.9, so two of those never start together.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# The memory fraction is read where the leases read it too (one process's servers share GPUs by it).
from pytest_specdec.servers.gpus import DEFAULT_GPU_MEMORY_UTILIZATION, memory_fraction

__all__ = ["DEFAULT_GPU_MEMORY_UTILIZATION", "StartPlan", "memory_fraction", "plan_start"]

#: Slack for fractions like 0.2 x 5 that add up to a hair above 1.0 in binary.
_EPS = 1e-9


@dataclass(frozen=True)
class StartPlan:
    """Servers (by spec key) to start at once, and the live ones to stop first to make room."""

    start: tuple[str, ...]  # two or more, in first-use order
    stop: tuple[str, ...] = ()  # least recently used first


def plan_start(now: Sequence[str], upcoming: Sequence[str], alive: Sequence[str], fraction: Mapping[str, float],
               max_alive: int) -> StartPlan | None:
    """What to start together before a test that needs ``now`` (its servers), given the servers the next tests
    need in run order (``upcoming``) and those ``alive`` (least recently used first). None: start as before,
    one at a time (nothing of ``now`` is missing, fewer than two would start, or ``now`` itself does not fit)."""
    if all(key in alive for key in now):
        return None
    wanted: list[str] = []
    for key in dict.fromkeys([*now, *upcoming]):
        if len(wanted) < max_alive and _share(wanted, fraction) + fraction[key] <= 1 + _EPS:
            wanted.append(key)
        elif key in now:
            return None
        else:
            break  # first-use order: never skip ahead to a server needed later
    start = tuple(key for key in wanted if key not in alive)
    if len(start) < 2:
        return None
    others = [key for key in alive if key not in wanted]
    stop: list[str] = []
    while others and (len(wanted) + len(others) > max_alive or _share([*wanted, *others], fraction) > 1 + _EPS):
        stop.append(others.pop(0))
    return StartPlan(start, tuple(stop))


def _share(keys: Sequence[str], fraction: Mapping[str, float]) -> float:
    return sum(fraction[key] for key in keys)
