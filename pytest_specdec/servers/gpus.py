"""GPU leases across processes: disjoint GPU sets for the vLLM servers of parallel pytest workers.

Why: under pytest-xdist several workers start vLLM servers on one host; two servers of different
workers on one GPU would measure each other.  A lease pool (a lock file + a JSON state file in a
shared directory) hands each server a set of GPU ids, which it gets as `CUDA_VISIBLE_DEVICES`.

Rules:
- Leases of different processes never share a GPU.  The servers of one process (a worker's
  reference and spec servers) share the GPUs that process already holds while their
  `--gpu-memory-utilization` fractions sum to at most 1: the 1-GPU profiles split the memory so those
  two co-reside, exactly as in a sequential session, so the placement does not depend on how many GPUs
  the host has or on `-n`.  Servers too large to share (a 70B target at TP 4 takes 0.9 of each GPU)
  get GPUs of their own.
- A server's GPUs are on one NUMA node where one node has enough free GPUs (`choose_gpus`): a TP
  group across sockets pays for every all-reduce over the inter-socket link.
- A process that cannot get enough GPUs polls until a deadline; the timeout names the holders
  (pid, owner — worker, test id, server — and since when).
- A lease whose holder process and server process are both gone (crash, SIGKILL) is stale and
  reclaimed by the next acquirer.  The vLLM server's pid is recorded too: a worker killed while its
  server lives on must not free a GPU that is still busy.

Never imports pytest; only the standard library and filelock.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from pytest_specdec.errors import SpecDecError
from pytest_specdec.formats import LEASE_SCHEMA

#: vLLM's flags whose product is the GPUs one server uses (short forms as vLLM's parser accepts).
_PARALLEL_FLAGS = {
    "tensor": ("--tensor-parallel-size", "-tp"),
    "pipeline": ("--pipeline-parallel-size", "-pp"),
    "data": ("--data-parallel-size", "-dp"),
}


#: vLLM's default --gpu-memory-utilization (EngineArgs.gpu_memory_utilization).
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
#: Slack for fractions like 0.2 x 5 that add up to a hair above 1.0 in binary.
_EPS = 1e-9
#: Where the kernel lists PCI devices (a GPU's `numa_node` and `local_cpulist`).
PCI_DEVICES = Path("/sys/bus/pci/devices")


class GpuLeaseError(SpecDecError):
    """No GPUs could be leased (none found, too few, or held by others past the deadline)."""


def memory_fraction(args: Sequence[str]) -> float:
    """The share of its GPUs' memory a server takes: its --gpu-memory-utilization, else vLLM's default.
    Why here: the leases decide from it whether a process's servers may share GPUs, and the start plan
    (profiles/starts.py) whether they may start together; one reading for both."""
    from pytest_specdec.errors import ConfigError
    from pytest_specdec.vllm.command import arg_value

    value = arg_value(args, "--gpu-memory-utilization")
    if value is None:
        return DEFAULT_GPU_MEMORY_UTILIZATION
    try:
        fraction = float(value)
    except ValueError:
        fraction = -1.0
    if not 0 < fraction <= 1:
        raise ConfigError(f"server argument --gpu-memory-utilization {value}: expected a fraction in (0, 1]")
    return fraction


# --- which GPUs there are ------------------------------------------------------------------------
def parse_gpu_list(text: str, source: str) -> tuple[str, ...]:
    """`0,1,2` (indices, or GPU-/MIG- UUIDs as CUDA_VISIBLE_DEVICES accepts) -> ids; `source` names the input."""
    ids = tuple(part.strip() for part in text.split(","))
    if not text.strip() or any(not i for i in ids):
        raise GpuLeaseError(f"{source}: expected comma-separated GPU ids like 0,1,2,3, got {text!r}")
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise GpuLeaseError(f"{source}: GPU id(s) {', '.join(dupes)} given twice in {text!r}")
    return ids


def discover_gpus(
    environ: Mapping[str, str] | None = None,
    run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
    which: Callable[[str], str | None] = shutil.which,
) -> tuple[str, ...]:
    """The GPUs this process may lease: CUDA_VISIBLE_DEVICES when set, else every GPU nvidia-smi lists."""
    env = os.environ if environ is None else environ
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        if visible.strip() in ("", "-1"):
            raise GpuLeaseError(f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU: unset it, or pass "
                                "--specdec-gpus 0,1,... to say which GPUs the servers may use")
        return parse_gpu_list(visible, "CUDA_VISIBLE_DEVICES")
    from pytest_specdec.servers.hardware import nvidia_smi

    smi = nvidia_smi(which)
    if smi is None:
        raise GpuLeaseError("no GPUs to lease: nvidia-smi is not on PATH and CUDA_VISIBLE_DEVICES is unset; "
                            "pass --specdec-gpus 0,1,... or use the cpu profile")
    try:
        proc = run([smi, "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise GpuLeaseError(f"nvidia-smi --query-gpu=index failed: {exc}; pass --specdec-gpus 0,1,...") from exc
    ids = tuple(line.strip() for line in proc.stdout.splitlines() if line.strip())
    if proc.returncode != 0 or not ids or not all(i.isdigit() for i in ids):
        raise GpuLeaseError(f"nvidia-smi --query-gpu=index listed no GPUs (exit {proc.returncode}: "
                            f"{(proc.stdout + proc.stderr).strip()[:300]!r}); pass --specdec-gpus 0,1,...")
    return ids


def gpus_needed(args: Sequence[str], speculative_config: Mapping[str, Any] | None) -> int:
    """GPUs one vLLM server uses: TP x PP x DP from its args, TP raised to the draft's TP if that is larger."""
    from pytest_specdec.vllm.command import arg_value

    sizes: dict[str, int] = {}
    for kind, flags in _PARALLEL_FLAGS.items():
        value = arg_value(args, *flags)
        if value is not None and (not value.isdigit() or int(value) < 1):
            raise GpuLeaseError(f"server argument {flags[0]} {value}: expected a whole number >= 1")
        sizes[kind] = 1 if value is None else int(value)
    draft_tp = (speculative_config or {}).get("draft_tensor_parallel_size")
    draft_tp = 1 if draft_tp is None else draft_tp
    if isinstance(draft_tp, bool) or not isinstance(draft_tp, int) or draft_tp < 1:
        raise GpuLeaseError(f"speculative_config draft_tensor_parallel_size must be a whole number >= 1, "
                            f"got {draft_tp!r}")
    return max(sizes["tensor"], draft_tp) * sizes["pipeline"] * sizes["data"]


# --- which GPUs a server gets ------------------------------------------------------------------
def choose_gpus(n: int, fraction: float, gpus: Sequence[str], used: Mapping[str, float], others: Iterable[str],
                numa: Mapping[str, int]) -> tuple[str, ...] | None:
    """The `n` GPUs (of `gpus`, in their order) a server taking `fraction` of each gets, or None while too few are
    free. Pure, so the lease arithmetic is tested without a lock file.

    ``used``: the memory fractions this process's servers already take per GPU; such a GPU is joined while the
    sum stays at most 1 (co-residence), and joined before free ones, so a worker's arms share where they fit.
    ``others``: GPUs other processes hold. ``numa``: each GPU's NUMA node (absent: unknown, one node). The GPUs
    come from one node where one has enough: the one holding most of this process's GPUs with room, then the
    one with the fewest fitting GPUs (a TP-1 server leaves whole nodes to a TP-4 one); else across nodes."""
    taken = set(others)
    fits = [g for g in gpus if g not in taken and used.get(g, 0.0) + fraction <= 1 + _EPS]
    if len(fits) < n:
        return None
    ordered = [g for g in fits if g in used] + [g for g in fits if g not in used]  # co-residence first
    nodes: dict[int | None, list[str]] = {}
    for g in ordered:
        nodes.setdefault(numa.get(g), []).append(g)
    enough = [(node, members) for node, members in nodes.items() if len(members) >= n]
    if not enough:
        return tuple(ordered[:n])
    _, best = min(enough, key=lambda item: (-sum(g in used for g in item[1][:n]), len(item[1]),
                                            gpus.index(item[1][0])))
    return tuple(best[:n])


def worker_share(gpus: Sequence[str], workers: int) -> tuple[str, ...]:
    """The GPUs one of ``workers`` xdist workers may count on for servers alive at once: an even share of the host's
    (`profiles.pool.lease_plan` checks that a share holds a test's servers). What a start plan reasons about."""
    return tuple(gpus[:max(1, len(gpus) // max(1, workers))]) if gpus else ()


def plan_leases(servers: Sequence[tuple[str, int, float]], gpus: Sequence[str], numa: Mapping[str, int]
                ) -> dict[str, tuple[str, ...]]:
    """Where one process's servers, alive at once, would land on an idle host: (name, GPUs, memory fraction) each,
    leased in order as `GpuPool.acquire` leases them. Why: the dry run shows it, and a session finds out before
    anything starts that the host is too small for them. A server that does not fit raises `GpuLeaseError`."""
    used: dict[str, float] = {}
    plan: dict[str, tuple[str, ...]] = {}
    for name, n, fraction in servers:
        pick = choose_gpus(n, fraction, gpus, used, (), numa)
        if pick is None:
            held = "; ".join(f"{k} on GPU {','.join(v)}" for k, v in plan.items())
            raise GpuLeaseError(
                f"{name} needs {n} GPU(s) with {fraction:g} of their memory free, but the host's {len(gpus)} GPU(s) "
                f"({','.join(gpus)}) cannot hold it" + (f" beside {held}" if held else "")
            )
        for g in pick:
            used[g] = used.get(g, 0.0) + fraction
        plan[name] = pick
    return plan


def gpu_numa_nodes(
    run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
    sysfs: Path | None = None,
    which: Callable[[str], str | None] = shutil.which,
) -> dict[str, int]:
    """Each GPU's NUMA node, keyed by index and UUID: `nvidia-smi --query-gpu=index,uuid,pci.bus_id`, then the PCI
    device's `numa_node` in sysfs (`SPECDEC_PCI_DEVICES` stands in for /sys/bus/pci/devices in tests).

    Where nvidia-smi or sysfs cannot say (no nvidia-smi, a failing one, a container without /sys, a one-socket host
    whose kernel writes -1) the GPU is left out and counts as one node with the others, the placement as before;
    only a `SPECDEC_NVIDIA_SMI` that is not an executable file is an error, as for every nvidia-smi call."""
    from pytest_specdec.servers.hardware import nvidia_smi

    root = sysfs or Path(os.environ.get("SPECDEC_PCI_DEVICES", str(PCI_DEVICES)))
    smi = nvidia_smi(which)
    if smi is None:
        return {}
    try:
        proc = run([smi, "--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader"], capture_output=True,
                   text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return {}
    out: dict[str, int] = {}
    for line in proc.stdout.splitlines() if proc.returncode == 0 else []:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3:
            continue
        index, gpu_uuid, bus = parts
        domain, _, rest = bus.partition(":")  # nvidia-smi: 00000000:18:00.0, sysfs: 0000:18:00.0
        try:
            node = int((root / f"{domain[-4:]}:{rest}".lower() / "numa_node").read_text().strip())
        except (OSError, ValueError):
            continue
        if node >= 0:
            out[index] = out[gpu_uuid] = node
    return out


# --- processes -----------------------------------------------------------------------------------
def process_start(pid: int) -> str | None:
    """The kernel's start time of `pid` (/proc/PID/stat field 22), so a reused pid is not mistaken
    for the lease's holder; None where /proc is not available."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # the command name may hold spaces and parentheses
    return fields[19] if len(fields) > 19 else None


def process_alive(pid: int, start: str | None) -> bool:
    """Whether `pid` runs and is the process that took the lease (same start time when recorded)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    if state in ("Z", "X"):  # exited, not yet reaped
        return False
    return start is None or process_start(pid) in (None, start)


# --- leases --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Lease:
    """GPUs held by one server of one process."""

    id: str
    gpus: tuple[str, ...]
    pid: int
    pid_start: str | None
    host: str
    owner: str  # who, for people: "gw1 suites/test_k.py::test_k[eagle3-k3-t0.0-c1] server ab12cd34ef56"
    since: float  # wall time (time.time())
    server_pid: int | None = None
    server_pid_start: str | None = None
    #: the server's --gpu-memory-utilization: another server of the same process may join these GPUs while the
    #: fractions sum to at most 1 (a file of an older version has none: the whole GPU)
    memory_fraction: float = 1.0

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(self.gpus)

    def stale(self) -> bool:
        """Holder and server (if it ever started) both gone."""
        if process_alive(self.pid, self.pid_start):
            return False
        return self.server_pid is None or not process_alive(self.server_pid, self.server_pid_start)

    def describe(self, now: float | None = None) -> str:
        now = time.time() if now is None else now
        since = dt.datetime.fromtimestamp(self.since, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        server = f", vLLM pid {self.server_pid}" if self.server_pid is not None else ""
        return (f"GPU {self.cuda_visible_devices}: pid {self.pid} on {self.host}{server}, {self.owner}, "
                f"since {since} ({now - self.since:.0f} s)")

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "gpus": list(self.gpus)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Lease:
        return cls(**{**data, "gpus": tuple(str(g) for g in data["gpus"])})


class GpuPool:
    """Leases GPU ids to this process's servers; the state is shared through `lease_dir`.

    The state file is per host (GPU 0 of one machine is not GPU 0 of another), so `lease_dir` may
    sit on a shared file system.  `gpus` is what this process may use (tests pass fake lists).
    """

    def __init__(
        self,
        lease_dir: Path,
        gpus: Sequence[str],
        *,
        poll_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        now: Callable[[], float] = time.time,
        host: str | None = None,
        numa: Mapping[str, int] | None = None,
    ) -> None:
        if not gpus:
            raise GpuLeaseError("no GPUs to lease: the GPU list is empty")
        self.lease_dir = lease_dir
        self.gpus = tuple(gpus)
        self.numa = dict(numa or {})  # GPU id -> NUMA node (`gpu_numa_nodes`); empty: one node
        self.poll_s = poll_s
        self.clock, self.sleep, self.now = clock, sleep, now
        self.host = host or socket.gethostname()
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.host)
        self.state_path = lease_dir / f"gpu-leases-{safe}.json"
        self.lock_path = lease_dir / f"gpu-leases-{safe}.lock"
        self.pid = os.getpid()
        self._pid_start = process_start(self.pid)

    # state file, always under the lock
    def _lock(self) -> Any:
        from filelock import FileLock

        self.lease_dir.mkdir(parents=True, exist_ok=True)
        return FileLock(str(self.lock_path), timeout=120)

    def _read(self) -> list[Lease]:
        try:
            text = self.state_path.read_text()
        except FileNotFoundError:
            return []
        try:
            data = json.loads(text)
            if data.get("schema") != LEASE_SCHEMA:
                raise ValueError(f"schema {data.get('schema')!r}, expected {LEASE_SCHEMA}")
            return [Lease.from_json(x) for x in data["leases"]]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise GpuLeaseError(f"GPU lease file {self.state_path} is unreadable ({exc}); delete it when no "
                                "pytest-specdec session runs on this host") from exc

    def _write(self, leases: Iterable[Lease]) -> None:
        data = {"schema": LEASE_SCHEMA, "host": self.host, "leases": [x.to_json() for x in leases]}
        tmp = self.state_path.with_name(f".{self.state_path.name}.{self.pid}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, self.state_path)

    def _live(self) -> tuple[list[Lease], list[Lease]]:
        """(live, stale) leases; the caller holds the lock."""
        leases = self._read()
        stale = [x for x in leases if not self._mine(x) and x.stale()]
        return [x for x in leases if x not in stale], stale

    def _mine(self, lease: Lease) -> bool:
        return lease.pid == self.pid and lease.pid_start == self._pid_start

    def _used(self, live: list[Lease]) -> dict[str, float]:
        """The memory fractions this process's own servers take on each GPU they hold."""
        used: dict[str, float] = {}
        for x in live:
            if self._mine(x):
                for g in x.gpus:
                    used[g] = used.get(g, 0.0) + x.memory_fraction
        return used

    # public API
    def holders(self) -> list[Lease]:
        """Every live lease on this host (stale ones are left for the next acquire to reclaim)."""
        with self._lock():
            return self._live()[0]

    def acquire(self, n: int, owner: str, timeout_s: float,
                progress: Callable[[str], None] = lambda line: None, fraction: float = 1.0) -> Lease:
        """Lease `n` GPUs for a server taking `fraction` of each one's memory, waiting up to `timeout_s` for
        other processes to release theirs."""
        if n > len(self.gpus):
            raise GpuLeaseError(f"{owner} needs {n} GPU(s) but only {len(self.gpus)} may be leased "
                                f"({','.join(self.gpus)}); lower the tensor parallel size or pass --specdec-gpus")
        deadline = self.clock() + timeout_s
        told = False
        while True:
            with self._lock():
                live, stale = self._live()
                for x in stale:
                    progress(f"specdec: reclaimed a stale GPU lease ({x.describe(self.now())}): its processes are gone")
                used = self._used(live)
                others = {g for x in live if not self._mine(x) for g in x.gpus}
                pick = choose_gpus(n, fraction, self.gpus, used, others, self.numa)
                if pick is None and choose_gpus(n, fraction, self.gpus, used, (), self.numa) is None:
                    if stale:
                        self._write(live)
                    mine = "; ".join(x.describe(self.now()) for x in live if self._mine(x))
                    raise GpuLeaseError(
                        f"{owner} needs {n} GPU(s) with {fraction:g} of their memory free, which this process's own "
                        f"servers leave nowhere on {','.join(self.gpus)} ({mine}); waiting would not help: lower "
                        "--specdec-max-servers (1: one server at a time) or the servers' --gpu-memory-utilization")
                if pick is not None:
                    lease = Lease(id=uuid.uuid4().hex, gpus=pick, pid=self.pid, pid_start=self._pid_start,
                                  host=self.host, owner=owner, since=self.now(), memory_fraction=fraction)
                    self._write([*live, lease])
                    return lease
                if stale:
                    self._write(live)
                blocking = [x for x in live if not self._mine(x) and set(x.gpus) & set(self.gpus)]
            held = "\n".join(f"  {x.describe(self.now())}" for x in blocking)
            if self.clock() >= deadline:
                raise GpuLeaseError(
                    f"{owner}: no {n} free GPU(s) of {','.join(self.gpus)} after {timeout_s:.0f} s; held by:\n{held}\n"
                    f"(lease file {self.state_path}; run fewer xdist workers (-n) than GPU sets, or raise "
                    "--specdec-gpu-wait)"
                )
            if not told:
                progress(f"specdec: {owner} waits for {n} GPU(s); held by:\n{held}")
                told = True
            self.sleep(min(self.poll_s, max(0.0, deadline - self.clock())))

    def attach(self, lease: Lease, server_pid: int) -> Lease:
        """Record the server process on the lease, so the GPUs stay leased while it lives."""
        updated = replace(lease, server_pid=server_pid, server_pid_start=process_start(server_pid))
        with self._lock():
            leases = self._read()
            if not any(x.id == lease.id for x in leases):
                raise GpuLeaseError(f"GPU lease {lease.describe(self.now())} vanished from {self.state_path} "
                                    "while held (was the file deleted?)")
            self._write([updated if x.id == lease.id else x for x in leases])
        return updated

    def release(self, lease: Lease) -> bool:
        """Give the GPUs back; False when the lease was no longer in the state file."""
        with self._lock():
            leases = self._read()
            kept = [x for x in leases if x.id != lease.id]
            if len(kept) != len(leases):
                self._write(kept)
                return True
            return False


# --- optional CPU pinning ------------------------------------------------------------------------
def parse_cpulist(text: str) -> set[int]:
    """Linux cpulist (`0-3,8,10-11`) -> CPU numbers."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"expected a cpulist like 0-3,8, got {text!r}")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def gpu_local_cpus(
    run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
    sysfs: Path = Path("/sys/bus/pci/devices"),
) -> dict[str, set[int]]:
    """CPUs local to each GPU (its NUMA node), keyed by index and UUID: the `CPU Affinity` column of
    `nvidia-smi topo -m`, read from the PCI device's `local_cpulist`."""
    from pytest_specdec.servers.hardware import nvidia_smi

    smi = nvidia_smi() or "nvidia-smi"
    try:
        proc = run([smi, "--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader"], capture_output=True,
                   text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise GpuLeaseError(f"--specdec-pin-cpus: nvidia-smi failed ({exc})") from exc
    out: dict[str, set[int]] = {}
    for line in proc.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3:
            continue
        index, gpu_uuid, bus = parts
        domain, _, rest = bus.partition(":")
        path = sysfs / f"{domain[-4:]}:{rest}".lower() / "local_cpulist"
        try:
            cpus = parse_cpulist(path.read_text())
        except (OSError, ValueError) as exc:
            raise GpuLeaseError(f"--specdec-pin-cpus: cannot read GPU {index}'s local CPUs from {path}: {exc}") from exc
        out[index] = out[gpu_uuid] = cpus
    if not out:
        raise GpuLeaseError(f"--specdec-pin-cpus: nvidia-smi listed no GPUs ({proc.stdout.strip()[:200]!r})")
    return out


def cpus_for(gpus: Sequence[str], local: Mapping[str, set[int]], allowed: set[int]) -> frozenset[int]:
    """The CPUs to pin a server on `gpus` to: its GPUs' local CPUs that this process may use."""
    missing = [g for g in gpus if g not in local]
    if missing:
        raise GpuLeaseError(f"--specdec-pin-cpus: no CPU affinity known for GPU(s) {', '.join(missing)} "
                            f"(known: {', '.join(sorted(local))})")
    cpus = set().union(*(local[g] for g in gpus)) & allowed
    if not cpus:
        raise GpuLeaseError(f"--specdec-pin-cpus: GPU(s) {','.join(gpus)} are local to CPUs this process may not "
                            f"use (allowed: {sorted(allowed)}); drop --specdec-pin-cpus or widen the CPU affinity")
    return frozenset(cpus)
