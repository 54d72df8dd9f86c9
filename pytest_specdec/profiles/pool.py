"""The session's server pool as the placement says: how many servers stay alive, on which CPUs and at
which priority, and on a GPU profile the GPUs it leases (--specdec-gpus, else every GPU nvidia-smi lists).

Before the pool exists (so before any server starts) the host's GPUs are checked against what a test's
servers need at once (`lease_plan`): a 70B target at TP 4 on a host with fewer than 4 GPUs, or two such
arms on 4 GPUs, is a clear error now, not a lease that waits an hour.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_specdec.errors import ConfigError

if TYPE_CHECKING:
    from pytest_specdec.profiles.placement import Placement
    from pytest_specdec.servers.pool import ServerPool


def lease_plan(placement: Placement, gpus: Sequence[str], numa: Mapping[str, int], workers: int = 1
               ) -> dict[str, tuple[str, ...]]:
    """The GPUs each of one test's servers (its arms, alive at once where they co-reside) gets on an idle host of
    ``gpus``, as the leases hand them out; ``workers`` xdist workers each lease their own. Raises `ConfigError`
    naming the profile, the GPUs one server spans and what to change when they cannot be had."""
    from pytest_specdec.profiles import server_spec
    from pytest_specdec.servers.gpus import GpuLeaseError, gpus_needed, memory_fraction, plan_leases

    profile = placement.profile
    reference = server_spec(profile, "none", None)
    n = max([gpus_needed(reference.args, None),
             *(gpus_needed(reference.args, config) for config in profile.methods.values())])
    fraction = memory_fraction(reference.args)
    spans = (f"profile {profile.name!r} serves {profile.target} on {n} GPU(s) per server ([target] "
             f"tensor_parallel_size {profile.tensor_parallel_size} x pipeline_parallel_size "
             f"{profile.pipeline_parallel_size})")
    if n > len(gpus):
        raise ConfigError(f"specdec: {spans}, but this host has {len(gpus)} GPU(s) to lease ({','.join(gpus)}); "
                          "run it on a host with more GPUs, or pass --specdec-gpus with enough")
    names = {2: ("reference", "spec"), 3: ("reference", "base", "candidate")}  # an A/B session's three arms
    arms = (names.get(placement.arms, tuple(f"server {i + 1}" for i in range(placement.arms)))
            if placement.co_resident() else ("server",))
    try:
        plan = plan_leases([(arm, n, fraction) for arm in arms], gpus, numa)
    except GpuLeaseError as exc:
        raise ConfigError(f"specdec: {spans}, and a test's {len(arms)} servers are alive at once, each taking "
                          f"--gpu-memory-utilization {fraction:g}: {exc}; pass --specdec-max-servers 1 (the arms "
                          "alternate in blocks, one server at a time) or use a host with more GPUs") from None
    per_worker = len({g for pick in plan.values() for g in pick})
    if len(plan) > 1 and per_worker > n and workers * per_worker > len(gpus):
        # a worker holding one arm's GPUs while it waits for the other's could wait on another worker doing the same
        raise ConfigError(f"specdec: {spans}; each xdist worker needs {per_worker} GPUs at once (its servers do not "
                          f"share GPUs), so this host's {len(gpus)} GPU(s) hold {len(gpus) // per_worker} worker(s), "
                          f"not {workers}; run with -n {max(len(gpus) // per_worker, 1)} or fewer")
    return plan


def gpus_held(placement: Placement) -> int:
    """GPUs one test holds at once, as `lease_plan` would hand them on a host with room for every arm: each arm's
    own where their memory fractions do not fit together, one server's where they share; the CPU's one. What the
    dry run prices a session at."""
    if placement.profile.device == "cpu" or placement.endpoint:
        return 1
    plan = lease_plan(placement, tuple(str(i) for i in range(64)), {})
    return len({g for pick in plan.values() for g in pick})


def planned_gpus(placement: Placement, gpus: str | None, workers: int = 1) -> tuple[str, ...]:
    """The GPUs a dry run plans this process's starts on: its share of the host's (--specdec-gpus,
    CUDA_VISIBLE_DEVICES or nvidia-smi's), else of the host the profile is for (its top-level ``gpus``); none on
    the CPU, in endpoint mode or where neither says."""
    from pytest_specdec.servers.gpus import GpuLeaseError, worker_share

    if placement.profile.device == "cpu" or placement.endpoint:
        return ()
    try:
        ids = host_gpus(gpus)
    except GpuLeaseError:
        n = placement.profile.raw.get("gpus")
        ids = tuple(str(i) for i in range(n)) if isinstance(n, int) and not isinstance(n, bool) else ()
    return worker_share(ids, workers)


def host_gpus(gpus: str | None) -> tuple[str, ...]:
    """The GPUs the session may lease: --specdec-gpus, else CUDA_VISIBLE_DEVICES, else nvidia-smi's."""
    from pytest_specdec.servers.gpus import discover_gpus, parse_gpu_list

    return parse_gpu_list(gpus, "--specdec-gpus") if gpus else discover_gpus()


def lease_plan_lines(placement: Placement, gpus: str | None, workers: int = 1) -> list[str]:
    """The dry run's account of the leases: which GPUs each of a test's servers would get on this host (its GPUs as
    --specdec-gpus or nvidia-smi list them, NUMA nodes from sysfs), or why it cannot say; nothing on the CPU."""
    from pytest_specdec.servers.gpus import GpuLeaseError, gpu_numa_nodes

    if placement.profile.device == "cpu" or placement.endpoint:
        return []
    try:
        ids = host_gpus(gpus)
    except GpuLeaseError as exc:
        return [f"specdec dry run: GPU leases not planned: {exc}"]
    numa = gpu_numa_nodes()
    try:
        plan = lease_plan(placement, ids, numa, workers)
    except ConfigError as exc:
        return [f"specdec dry run: GPU leases: {str(exc).removeprefix('specdec: ')}"]
    nodes = sorted({numa[g] for g in ids if g in numa})
    where = (f"NUMA node(s) {', '.join(map(str, nodes))}" if nodes else "NUMA nodes unknown")
    lines = [f"specdec dry run: GPU leases on this host's {len(ids)} GPU(s) ({','.join(ids)}; {where}), "
             "a test's servers at once:"]
    for arm, pick in plan.items():
        node = {numa.get(g) for g in pick}
        on = f", NUMA node {node.pop()}" if len(node) == 1 and None not in node else ""
        lines.append(f"  {arm}: CUDA_VISIBLE_DEVICES={','.join(pick)}{on}")
    return lines


def server_pool(placement: Placement, log_dir: Path, *, gpus: str | None, lease_dir: Path, startup_timeout_s: float,
                gpu_wait_s: float, pin_cpus: bool, worker: str | None, progress: Callable[[str], None],
                workers: int = 1) -> ServerPool:
    from pytest_specdec.servers.pool import ServerPool

    leases = None
    if placement.profile.device != "cpu":  # the cpu profile leases nothing
        from pytest_specdec.servers.gpus import GpuPool, gpu_numa_nodes

        ids = host_gpus(gpus)
        numa = gpu_numa_nodes()
        if not placement.endpoint:
            lease_plan(placement, ids, numa, workers)  # too few GPUs: said before anything starts
        leases = GpuPool(lease_dir, ids, numa=numa)
    return ServerPool(log_dir, placement.max_alive(), startup_timeout_s, progress=progress, gpus=leases,
                      gpu_wait_s=gpu_wait_s, pin_cpus=pin_cpus, worker=worker, server_cpus=placement.server_cpus(),
                      server_nice=placement.server_nice())
