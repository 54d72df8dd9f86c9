"""Which vLLM servers are alive: one per distinct spec, reused by every test that needs it.

No pytest import: the session object drives it.  A cap on servers alive at once stops the least
recently used server first; needing it again later restarts it, and every start is recorded.
With a `GpuPool` (GPU profiles) each server leases its GPUs before it starts and gives them back
when it stops, dies or fails to start (see gpus.py). Servers the placement found to fit beside each other
start together (`start_together`, servers/together.py): a GPU start is minutes of idle GPU.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_specdec import redact
from pytest_specdec.errors import ServerStartError
from pytest_specdec.servers.process import VllmServer, exit_description
from pytest_specdec.servers.quiet import Quiet, requests_held, wait_idle
from pytest_specdec.vllm.command import ServerSpec

if TYPE_CHECKING:
    from pytest_specdec.servers.gpus import GpuPool, Lease


@dataclass(frozen=True)
class Endpoint:
    """A server to send load to: one we started, or one someone else runs (endpoint mode)."""

    base_url: str
    model: str
    owned: bool
    #: Which start of the server this is (its pid for servers we own): a new one needs a warm-up.
    instance: str = ""
    #: The key its /v1 routes require: the one the session gave its own server, or --specdec-api-key.
    api_key: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class StartRecord:
    spec_key: str
    method: str
    startup_s: float
    command: tuple[str, ...]
    gpus: str | None = None  # the CUDA_VISIBLE_DEVICES it got, when GPUs are leased
    #: Started together with other servers (`ServerPool.start_together`): the group's id, unique in the session
    #: (xdist workers' included), and the wall time from the group's first launch to its last server ready.
    group: str | None = None
    group_wall_s: float | None = None


@dataclass(frozen=True)
class Death:
    """A server that exited while the session still used it: what its log said last."""

    spec_key: str
    method: str
    returncode: int | None
    log_path: Path
    tail: str
    cause: str = ""  # the first exception its engine core or a worker raised (`VllmServer.cause`), "" if none

    def line(self) -> str:
        return f"vLLM ({self.method}, {self.spec_key}) {exit_description(self.returncode)} (log: {self.log_path})"


def split_cpus(client_cpus: int, available: Iterable[int] | None = None) -> frozenset[int] | None:
    """The CPUs servers start on when the first `client_cpus` of `available` (default: this process's
    affinity) are left to the client; None when that leaves the servers nothing or nothing is reserved.

    Why: on the 2-core cpu profile vLLM's busy-waiting engine core floated onto its worker's core and
    halved runs; with the server on core 1 and the client on core 0, `python -m
    scripts.vs_bench_serve ab --server-cpus 1` measured no half-speed run (docs/bench-parity.md)."""
    import os

    cpus = sorted(os.sched_getaffinity(0) if available is None else available)
    if client_cpus <= 0 or len(cpus) <= client_cpus:
        return None
    return frozenset(cpus[client_cpus:])


def format_cpus(cpus: Iterable[int]) -> str:
    """CPU numbers as taskset writes them: 1 / 1,3 / 2-5."""
    out: list[str] = []
    for c in sorted(cpus):
        if out and out[-1].split("-")[-1] == str(c - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{c}"
        else:
            out.append(str(c))
    return ",".join(out)


class ServerPool:
    """Starts servers on demand, keeps at most `max_alive`, stops them all at the end."""

    def __init__(
        self,
        log_dir: Path,
        max_alive: int,
        startup_timeout_s: float,
        progress: Callable[[str], None] = lambda line: None,
        launcher: list[str] | None = None,
        gpus: GpuPool | None = None,
        gpu_wait_s: float = 3600.0,
        pin_cpus: bool = False,
        worker: str | None = None,
        server_cpus: frozenset[int] | None = None,
        server_nice: int = 0,
    ) -> None:
        self.log_dir = log_dir
        self.max_alive = max_alive
        self.startup_timeout_s = startup_timeout_s
        self.progress = progress
        self.launcher = launcher  # None: vLLM itself; tests pass a stand-in
        # Keyed by ServerSpec.key(): specs hold dicts (the speculative config), so are not hashable.
        self._alive: OrderedDict[str, VllmServer] = OrderedDict()
        self.starts: list[StartRecord] = []
        self.deaths: list[Death] = []  # servers that exited while in use, in order
        self.failed: dict[str, str] = {}  # spec key -> why its start failed (not retried in this session)
        self.servers: dict[str, VllmServer] = {}  # every server ever started, for reports
        self.gpus = gpus  # None: no leasing (the cpu profile)
        self.gpu_wait_s = gpu_wait_s
        self.pin_cpus = pin_cpus
        self.server_cpus = server_cpus  # no GPUs: every server starts on these CPUs (None = not pinned)
        self.server_nice = server_nice  # every server's priority is lowered by this much (0-19)
        self.worker = worker  # the xdist worker id, named in lease owners
        self._leases: dict[str, Lease] = {}
        self._local_cpus: dict[str, set[int]] | None = None
        self._groups = 0  # groups started together so far
        #: a server of a group that failed to start: its own error, raised to the first test that asks for it
        self._group_errors: dict[str, ServerStartError] = {}

    def _release(self, key: str) -> None:
        lease = self._leases.pop(key, None)
        if lease is not None and self.gpus is not None:
            self.gpus.release(lease)

    def _stop(self, key: str, server: VllmServer) -> None:
        # Interrupted mid-stop, the lease stays: it goes stale (and is reclaimed) once the server is gone.
        server.stop()
        self._release(key)

    def _remove(self, key: str) -> None:
        """Take `key`'s server out of the pool and stop it. A Ctrl-C or SIGTERM meanwhile waits until it is
        stopped: once out of the pool, `stop_all` would never find it again."""
        from pytest_specdec.servers.hygiene import shielded

        with shielded():
            server = self._alive.pop(key, None)
            if server is not None:
                self._stop(key, server)

    def _placement(self, spec: ServerSpec, owner: str) -> tuple[Lease | None, dict[str, str], frozenset[int] | None]:
        """Lease GPUs for `spec` (waiting for other workers if needed): its lease, env and CPU pinning."""
        if self.gpus is None:
            return None, {}, self.server_cpus
        import os

        from pytest_specdec.servers.gpus import cpus_for, gpu_local_cpus, gpus_needed, memory_fraction

        n = gpus_needed(spec.args, spec.speculative_config)
        lease = self.gpus.acquire(n, owner, self.gpu_wait_s, progress=self.progress,
                                  fraction=memory_fraction(spec.args))
        # nvidia-smi numbers GPUs in PCI bus order, CUDA (by default) fastest first: make them agree.
        env = {"CUDA_VISIBLE_DEVICES": lease.cuda_visible_devices, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
        cpus = None
        try:
            if self.pin_cpus:
                if self._local_cpus is None:
                    self._local_cpus = gpu_local_cpus()
                cpus = cpus_for(lease.gpus, self._local_cpus, os.sched_getaffinity(0))
        except BaseException:
            self.gpus.release(lease)
            raise
        return lease, env, cpus

    def _prepare(self, spec: ServerSpec, test: str | None) -> tuple[VllmServer, str]:
        """A server for `spec`, not yet started, on its leased GPUs (or the server CPUs): it and where it runs."""
        key = spec.key()
        owner = " ".join(x for x in (self.worker, test, f"server {key} ({spec.method})") if x)
        lease, env, cpus = self._placement(spec, owner)
        server = VllmServer(spec, log_dir=self.log_dir, startup_timeout_s=self.startup_timeout_s,
                            launcher=self.launcher, placement_env=env, cpus=cpus, nice=self.server_nice,
                            api_key=secrets.token_urlsafe(24))  # a new key per start, sent only by this session
        if lease is not None:
            self._leases[key] = lease
            gpus = self.gpus
            assert gpus is not None

            def attach(pid: int) -> None:
                self._leases[key] = gpus.attach(self._leases[key], pid)

            server.on_spawn = attach
        self.servers[key] = server
        where = (f" on GPU {lease.cuda_visible_devices}" if lease
                 else f" on CPU {format_cpus(cpus)}" if cpus else "")
        return server, where

    def _started(self, spec: ServerSpec, server: VllmServer, group: str | None = None,
                 wall_s: float | None = None) -> None:
        """Record a server that is ready."""
        key = spec.key()
        self._alive[key] = server
        assert server.startup_s is not None
        lease = self._leases.get(key)
        self.starts.append(StartRecord(key, spec.method, server.startup_s, tuple(redact.args(server.command)),
                                       lease.cuda_visible_devices if lease else None, group, wall_s))

    def get(self, spec: ServerSpec, test: str | None = None) -> VllmServer:
        """The running server for `spec`, starting it (and stopping the LRU one) if needed.

        `test` (the node id that needs it) is only named in the GPU lease, for the people waiting."""
        key = spec.key()
        server = self._alive.get(key)
        if server is not None and server.alive():
            self._alive.move_to_end(key)
            return server
        if key in self._group_errors:  # it failed starting with others: its own error, to the test that needs it
            raise self._group_errors.pop(key)
        if key in self.failed:  # the same start failed earlier in this session: it would again
            raise ServerStartError(f"not starting it again: it failed earlier in this session.\n{self.failed[key]}")
        if server is not None:  # died since last use: record why, drop it and start afresh
            self.reap(spec)
            death = self.deaths[-1]
            self.progress(f"specdec: {death.line()}; starting it again"
                          + "".join(f"\n  {line}" for line in death.cause.splitlines()))
        while len(self._alive) >= self.max_alive:
            old_key, old = next(iter(self._alive.items()))
            self.progress(f"specdec: stopping vLLM ({old.spec.method}, {old_key}) to stay within "
                          f"--specdec-max-servers={self.max_alive}")
            self._remove(old_key)
        server, where = self._prepare(spec, test)
        self.progress(f"specdec: starting vLLM ({spec.method}, {spec.key()}){where} ...")
        t0 = time.monotonic()
        try:
            server.start()  # stops the server itself when it fails
        except BaseException as exc:
            if not server.alive():
                self._release(key)
            if isinstance(exc, ServerStartError):
                self.failed[key] = str(exc)
            raise
        self._started(spec, server)
        self.progress(
            f"specdec: vLLM ({spec.method}, {spec.key()}) ready in {time.monotonic() - t0:.0f} s "
            f"at {server.base_url}{where}"
        )
        return server

    def alive_specs(self) -> list[ServerSpec]:
        """The live servers' specs, least recently used first (what a start plan may stop)."""
        return [server.spec for server in self._alive.values() if server.alive()]

    def gpu_share(self, workers: int) -> tuple[str, ...]:
        """The GPUs this process may count on leasing for servers alive at once: its even share of the host's when
        ``workers`` xdist workers lease from it (`profiles.pool.lease_plan` checked that the share holds a test's
        servers); none without leasing (the cpu profile)."""
        from pytest_specdec.servers.gpus import worker_share

        return () if self.gpus is None else worker_share(self.gpus.gpus, workers)

    def start_together(self, specs: list[ServerSpec], stop: list[str], test: str | None = None) -> None:
        """Start `specs` at once (`servers.together`) after stopping the live servers keyed in `stop`: the
        placement found they fit beside each other (`profiles/starts.py`). A server that fails is not retried in
        this session; its error (cause, command, log) goes to the first test that asks for it, and the others
        still start. Ctrl-C stops every one not yet ready and gives back their GPUs."""
        from pytest_specdec.servers.together import start_together

        for key in stop:
            if key in self._alive:
                old = self._alive[key]
                self.progress(f"specdec: stopping vLLM ({old.spec.method}, {key}) to make room for the servers "
                              "that start together")
                self._remove(key)
        specs = [s for s in specs if s.key() not in self._alive and s.key() not in self.failed]
        if len(specs) < 2:  # nothing to overlap: `get` starts it
            return
        self._groups += 1
        group = f"{self.worker or 'main'}#{self._groups}"
        prepared: list[tuple[ServerSpec, VllmServer]] = []
        wheres: list[str] = []
        try:
            for spec in specs:
                server, where = self._prepare(spec, test)
                prepared.append((spec, server))
                wheres.append(where)
            prepared, wheres = self._apart(prepared, wheres)
            if len(prepared) < 2:
                for spec, _ in prepared:
                    self._unprepare(spec.key())
                return
            for (spec, _), where in zip(prepared, wheres, strict=True):
                self.progress(f"specdec: starting vLLM ({spec.method}, {spec.key()}){where} together with "
                              f"{len(prepared) - 1} other(s) ...")
            t0 = time.monotonic()
            errors = start_together([server for _, server in prepared])
        except BaseException:
            for spec, server in prepared:
                if not server.alive():
                    self._release(spec.key())
            raise
        wall = time.monotonic() - t0
        for (spec, server), error in zip(prepared, errors, strict=True):
            key = spec.key()
            if error is not None:
                self._release(key)
                self.failed[key] = str(error)
                self._group_errors[key] = error
                self.progress(f"specdec: vLLM ({spec.method}, {key}) failed to start: {str(error).splitlines()[0]} "
                              f"(log: {server.log_path})")
                continue
            self._started(spec, server, group, wall)
            self.progress(f"specdec: vLLM ({spec.method}, {key}) ready in {server.startup_s:.0f} s at "
                          f"{server.base_url}")
        self.progress(f"specdec: {len(prepared)} vLLM servers started together in {wall:.0f} s")

    def _apart(self, prepared: list[tuple[ServerSpec, VllmServer]], wheres: list[str]
               ) -> tuple[list[tuple[ServerSpec, VllmServer]], list[str]]:
        """The prepared servers whose leases share no GPU (first come first kept): vLLM sizes its KV cache from the
        memory free while it profiles, so two starting at once on one GPU can leave the second none
        (`profiles/starts.py`). The plan asks for such groups only; this holds where the leases placed otherwise.
        The rest give their leases back and start one at a time when a test asks for them."""
        kept: list[tuple[ServerSpec, VllmServer]] = []
        kept_where: list[str] = []
        held: set[str] = set()
        for (spec, server), where in zip(prepared, wheres, strict=True):
            lease = self._leases.get(spec.key())
            gpus = set(lease.gpus) if lease is not None else set()
            if gpus & held:
                self._unprepare(spec.key())
                continue
            held |= gpus
            kept.append((spec, server))
            kept_where.append(where)
        return kept, kept_where

    def _unprepare(self, key: str) -> None:
        """Undo `_prepare` for a server that will not start now: its lease back, out of the started ones."""
        self._release(key)
        self.servers.pop(key, None)

    def reap(self, spec: ServerSpec) -> None:
        """If `spec`'s server has exited, record why (its exit code, the exception its engine raised and this
        start's log tail) and drop it."""
        key = spec.key()
        server = self._alive.get(key)
        if server is None or server.alive():
            return
        assert server.proc is not None
        self.deaths.append(Death(key, spec.method, server.proc.poll(), server.log_path, server.log_tail(),
                                 server.cause()))
        self._remove(key)  # its group may linger; its GPUs go back

    def retire(self, spec: ServerSpec, why: str) -> None:
        """Stop `spec`'s server if it runs, so the next `get` starts a fresh one (e.g. a suffix decoder
        that has seen every prompt the dataset has)."""
        key = spec.key()
        if key in self._alive:
            self.progress(f"specdec: stopping vLLM ({spec.method}, {key}): {why}")
            self._remove(key)

    def wait_quiet(self, timeout_s: float, own: str | None = None, ended: float | None = None) -> Quiet:
        """Wait for the live servers of this pool to go idle (`quiet.wait_idle`): every server's /metrics
        showing no request running or waiting, and the CPU of every server but `own` (the instance the next
        run is sent to) at rest. `ended`: when the previous run ended.

        Why `own` may still spin: its busy-wait is its engine waiting for work, and the next run's first
        requests are that work; it takes no core the run could use, where another server's spin does. With
        one server at a time (blocks, --specdec-max-servers 1) the next run's server is the previous run's,
        and the run starts without waiting out its spin."""
        alive = [s for s in self._alive.values() if s.proc is not None and s.alive()]
        pgids = {s.proc.pid for s in alive if s.proc is not None and str(s.proc.pid) != own}
        servers = [(s.base_url, s.api_key) for s in alive]
        return wait_idle(pgids, timeout_s=timeout_s, requests=lambda: requests_held(servers), ended=ended)

    def cpu_ticks(self) -> dict[str, tuple[str, int]]:
        """Per live server (its instance id, the pid that leads its process group): its label (method and spec
        key) and the CPU ticks its processes used so far, so a run can tell which other server ran beside it."""
        from pytest_specdec.servers.quiet import cpu_ticks_by_group

        alive = {s.proc.pid: (key, s) for key, s in self._alive.items() if s.proc is not None and s.alive()}
        ticks = cpu_ticks_by_group(set(alive))
        return {str(pid): (f"{s.spec.method} {key}", ticks[pid]) for pid, (key, s) in alive.items()}

    def stop_all(self) -> None:
        """Stop every server we started and give back their GPUs (also on failure and Ctrl-C); a second
        Ctrl-C or a SIGTERM meanwhile waits until they are stopped."""
        from pytest_specdec.servers.hygiene import shielded

        with shielded():
            while self._alive:
                key, server = self._alive.popitem()
                self._stop(key, server)
