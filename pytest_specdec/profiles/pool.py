"""The session's server pool as the placement says: how many servers stay alive, on which CPUs and at
which priority, and on a GPU profile the GPUs it leases (--specdec-gpus, else every GPU nvidia-smi lists)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytest_specdec.profiles.placement import Placement
    from pytest_specdec.servers.pool import ServerPool


def server_pool(placement: Placement, log_dir: Path, *, gpus: str | None, lease_dir: Path, startup_timeout_s: float,
                gpu_wait_s: float, pin_cpus: bool, worker: str | None, progress: Callable[[str], None]) -> ServerPool:
    from pytest_specdec.servers.pool import ServerPool

    leases = None
    if placement.profile.device != "cpu":  # the cpu profile leases nothing
        from pytest_specdec.servers.gpus import GpuPool, discover_gpus, parse_gpu_list

        leases = GpuPool(lease_dir, parse_gpu_list(gpus, "--specdec-gpus") if gpus else discover_gpus())
    return ServerPool(log_dir, placement.max_alive(), startup_timeout_s, progress=progress, gpus=leases,
                      gpu_wait_s=gpu_wait_s, pin_cpus=pin_cpus, worker=worker, server_cpus=placement.server_cpus(),
                      server_nice=placement.server_nice())
