"""Which servers start together: on a GPU start-up dominates (a minute or more per server while the GPU sits
idle), and servers that co-reside anyway can start at once. Pure: the session asks before each test, the
dry run's estimate asks the same questions of the same function, the pool starts what it is told.

A plan starts the test's own missing servers plus the next tests' servers (in run order) that fit beside
them: at most the pool's cap alive at once, and room for all of them on the GPUs. Where the GPUs this process may
lease are known (`lease_fit`), room is what the leases would find: a GPU's servers' `--gpu-memory-utilization`
fractions summing to at most 1, so two TP-4 servers at 0.9 on an 8-GPU host start together on disjoint GPUs.
Where they are not, every server counts as sharing one set of GPUs (`fraction_fit`): fractions summing to at most
1. A server without the flag counts at vLLM's default, 0.9.

Servers that start together never share a GPU (`lease_apart`): vLLM sizes its KV cache as its requested share
less the memory its profiling run saw go (vllm/v1/worker/gpu_worker.py, "we assume that the other processes using
the same GPU did not change their memory usage during the profiling"), so a neighbour allocating its KV cache
meanwhile counts against it and leaves it none. On an H200 with CUDA vLLM 0.26.0,
the zoo's reference and draft_model servers started at once on one GPU at 0.2 each: the second failed with
"No available memory for the cache blocks" (docs/versions.md). Servers sharing a GPU start one after another.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

# The memory fraction is read where the leases read it too (one process's servers share GPUs by it).

__all__ = ["Fit", "StartPlan", "fraction_fit", "lease_apart", "lease_fit", "one_set_apart", "plan_start"]

#: Slack for fractions like 0.2 x 5 that add up to a hair above 1.0 in binary.
_EPS = 1e-9


@dataclass(frozen=True)
class StartPlan:
    """Servers (by spec key) to start at once, and the live ones to stop first to make room."""

    start: tuple[str, ...]  # two or more, in first-use order
    stop: tuple[str, ...] = ()  # least recently used first


#: Whether servers (by spec key) have room to be alive at once.
Fit = Callable[[Sequence[str]], bool]


def fraction_fit(fraction: Mapping[str, float]) -> Fit:
    """Room where every server shares one set of GPUs: their memory fractions sum to at most 1."""
    return lambda keys: sum(fraction[key] for key in keys) <= 1 + _EPS


def lease_fit(need: Mapping[str, tuple[int, float]], gpus: Sequence[str]) -> Fit:
    """Room on ``gpus`` (the GPUs this process may lease) as the leases would find it: each server's GPUs (TP x PP x
    DP) and memory fraction, ``need[key]``, placed in order on an idle host (`servers.gpus.plan_leases`)."""
    from pytest_specdec.servers.gpus import GpuLeaseError, plan_leases

    def fit(keys: Sequence[str]) -> bool:
        try:
            plan_leases([(key, *need[key]) for key in keys], gpus, {})
        except GpuLeaseError:
            return False
        return True

    return fit


def lease_apart(need: Mapping[str, tuple[int, float]], gpus: Sequence[str]) -> Fit:
    """Whether servers (by key) started at once would each land on GPUs of their own, as the leases on ``gpus``
    place them (`servers.gpus.plan_leases`: a process's servers share a GPU where their fractions fit)."""
    from pytest_specdec.servers.gpus import GpuLeaseError, plan_leases

    def apart(keys: Sequence[str]) -> bool:
        try:
            placed = plan_leases([(key, *need[key]) for key in keys], gpus, {})
        except GpuLeaseError:
            return False
        held = [g for pick in placed.values() for g in pick]
        return len(held) == len(set(held))

    return apart


def one_set_apart(keys: Sequence[str]) -> bool:
    """Where the GPUs are not known every server shares one set of them: no two start at once."""
    return len(keys) < 2


def plan_start(now: Sequence[str], upcoming: Sequence[str], alive: Sequence[str], fits: Fit | Mapping[str, float],
               max_alive: int, apart: Fit = one_set_apart) -> StartPlan | None:
    """What to start together before a test that needs ``now`` (its servers), given the servers the next tests
    need in run order (``upcoming``) and those ``alive`` (least recently used first); ``fits`` says whether servers
    have room together (a mapping of memory fractions: `fraction_fit`'s), ``apart`` whether the ones started at
    once share no GPU (`lease_apart`). None: start as before, one at a time (nothing of ``now`` is missing, fewer
    than two would start, or ``now`` itself does not fit or shares a GPU)."""
    fit = fraction_fit(fits) if isinstance(fits, Mapping) else fits
    if all(key in alive for key in now):
        return None
    wanted: list[str] = []
    for key in dict.fromkeys([*now, *upcoming]):
        new = [k for k in wanted if k not in alive]
        if len(wanted) < max_alive and fit([*wanted, key]) and (key in alive or apart([*new, key])):
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
    while others and (len(wanted) + len(others) > max_alive or not fit([*wanted, *others])):
        stop.append(others.pop(0))
    return StartPlan(start, tuple(stop))
