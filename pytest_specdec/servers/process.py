"""One vLLM server process: port, readiness, log, priority, idle wait, tree kill (its command is
`vllm.command`).

Never imports pytest (like pytest-xprocess's `xprocess.py`): the pytest glue lives elsewhere, and
this module is also used by the zoo's measurement command.  Only the standard library is
imported at module level so `pytest --help` stays fast.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Iterator
from typing import Any, Callable

from pytest_specdec import redact
from pytest_specdec.errors import ServerStartError
from pytest_specdec.vllm.command import ServerSpec, build_command
from pytest_specdec.vllm.cpu_fix import FIX_NAME, OPT_IN_ENV, RECORD_ENV
from pytest_specdec.vllm.engine_config import (
    DEV_MODE_ENV,
    engine_config_from_server_info,
    fetch_server_info,
    parse_engine_config,
)

#: Lines of the server log attached to a failure.
LOG_TAIL_LINES = 60
#: Starts tried when the port `free_port` chose was taken before vLLM bound it.
PORT_ATTEMPTS = 3


def free_port(host: str = "127.0.0.1") -> int:
    """Ask the OS for a free port (bind port 0), as pytest-xprocess's tests do."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - loopback URL we built
            return 200 <= resp.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def is_loopback(host: str) -> bool:
    """Whether `host` is a loopback address (127.0.0.0/8, ::1, optionally in brackets) or exactly
    `localhost`: parsed, never a prefix test, since `::100` or `localhost-gpu01` are other machines'
    names and dev mode opens unauthenticated routes."""
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


#: Environment variable that marks a server this plugin started: "<owner pid>:<owner start ticks>", so
#: a later session can tell its own strays (owner gone) from servers a live session still uses.
OWNER_ENV = "PYTEST_SPECDEC_OWNER"


@dataclass
class VllmServer:
    """A vLLM server we own: started in its own process group, always stopped as a group."""

    spec: ServerSpec
    log_dir: Path
    startup_timeout_s: float = 900.0
    launcher: list[str] | None = None
    clock: Callable[[], float] = time.monotonic
    port: int | None = None
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    startup_s: float | None = None
    command: list[str] = field(default_factory=list)
    #: Placement, not identity (so not in the spec's key): e.g. the leased CUDA_VISIBLE_DEVICES.
    placement_env: dict[str, str] = field(default_factory=dict)
    #: CPUs the server's process tree is pinned to (opt-in --specdec-pin-cpus); None = not pinned.
    cpus: frozenset[int] | None = None
    #: How much lower than the client's the server's scheduling priority is (0-19; profile [placement]).
    nice: int = 0
    #: What the lowered priority reached: {"nice": N, "autogroup": True/False/None (no autogroups)}.
    priority: dict[str, Any] | None = None
    #: Called with the server's pid right after it is spawned (the GPU lease records it).
    on_spawn: Callable[[int], None] | None = field(default=None, repr=False)
    #: Seconds the /server_info read took after readiness (not in startup_s); None when not asked.
    server_info_s: float | None = None
    _engine_config: dict[str, Any] | None = field(default=None, repr=False)
    _log_path: Path | None = field(default=None, repr=False)

    @property
    def base_url(self) -> str:
        return f"http://{self.spec.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        """This start's log: one file per start, so a restart never overwrites the line that says why
        the server before it died (`-1.log`, `-2.log`, ... in order of starting)."""
        if self._log_path is None:
            self._log_path = self._next_log_path()
        return self._log_path

    def _next_log_path(self) -> Path:
        stem = f"vllm-{self.spec.method}-{self.spec.key()}"
        n = 1
        while (self.log_dir / f"{stem}-{n}.log").exists():
            n += 1
        return self.log_dir / f"{stem}-{n}.log"

    @property
    def config_path(self) -> Path:
        """The resolved VllmConfig as /server_info gave it (for fields the flat engine config leaves out)."""
        return self.log_dir / f"vllm-{self.spec.method}-{self.spec.key()}.config.json"

    @property
    def dev_mode(self) -> bool:
        """Whether the server gets VLLM_SERVER_DEV_MODE=1 (for /server_info): on loopback, unless the spec's
        env says otherwise (dev mode also opens routes like /collective_rpc, never on a public interface)."""
        return is_loopback(self.spec.host) and DEV_MODE_ENV not in dict(self.spec.env)

    @property
    def record_dir(self) -> Path:
        return self.log_dir / f"vllm-{self.spec.key()}-records"

    def start(self) -> None:
        """Start and wait for /health and /v1/models; on any failure stop and raise with the log tail. A
        port another process took between `free_port` and vLLM's bind is retried with a new port."""
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                self._start_once()
                return
            except ServerStartError:
                if attempt == PORT_ATTEMPTS or not self._port_taken():
                    raise

    def _port_taken(self) -> bool:
        return "address already in use" in self.log_tail().lower()

    def _start_once(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._log_path = self._next_log_path()
        self.port = free_port(self.spec.host)
        self.command = build_command(self.spec, self.port, self.launcher)
        env = {**os.environ, **dict(self.spec.env), **self.placement_env, OWNER_ENV: owner_tag(os.getpid())}
        if self.dev_mode:
            env[DEV_MODE_ENV] = "1"
        self._engine_config, self.server_info_s = None, None
        self.config_path.unlink(missing_ok=True)
        if env.get(OPT_IN_ENV) == "1":
            shutil.rmtree(self.record_dir, ignore_errors=True)
            self.record_dir.mkdir(parents=True)
            env[RECORD_ENV] = str(self.record_dir)
        t0 = self.clock()
        with open(self.log_path, "wb") as log:
            log.write(f"$ {shlex.join(redact.args(self.command))}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # own process group, whose id is the pid: we kill the whole tree
                preexec_fn=_preexec(self.cpus, self.nice),
            )
        self.priority = lower_priority(self.proc.pid, self.nice) if self.nice else None
        deadline = t0 + self.startup_timeout_s
        try:
            if self.on_spawn is not None:
                self.on_spawn(self.proc.pid)
            while True:
                code = self.proc.poll()
                if code is not None:
                    raise self._start_error(f"exited with code {code} while starting")
                if _http_ok(f"{self.base_url}/health") and _http_ok(f"{self.base_url}/v1/models"):
                    break
                if self.clock() > deadline:
                    raise self._start_error(f"not ready after {self.startup_timeout_s:.0f} s")
                time.sleep(0.5)
            self.startup_s = self.clock() - t0
            self._engine_config = self._read_engine_config()
        except BaseException:
            self.stop()
            raise

    def _read_engine_config(self) -> dict[str, Any]:
        """Once per start, after readiness: /server_info when served, else the start-up log line."""
        if self.dev_mode:
            t0 = time.monotonic()
            info = fetch_server_info(self.base_url)
            self.server_info_s = time.monotonic() - t0
            config = engine_config_from_server_info(info)
            if config:
                if not config.get("vllm_version"):
                    config["vllm_version"] = self._log_engine_config().get("vllm_version")
                assert info is not None
                try:
                    self.config_path.write_text(json.dumps(info["vllm_config"], indent=1, sort_keys=True) + "\n")
                except OSError:
                    pass
                return config
        return self._log_engine_config()

    def _log_engine_config(self) -> dict[str, Any]:
        try:
            return parse_engine_config(self.log_path.read_text(errors="replace"))
        except OSError:
            return {}

    def _start_error(self, what: str) -> ServerStartError:
        return ServerStartError(
            f"vLLM server ({self.spec.method}) {what}\n"
            f"command: {shlex.join(redact.args(self.command))}\nport: {self.port}\nlog: {self.log_path}\n"
            f"--- last {LOG_TAIL_LINES} log lines ---\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The end of the server log, for a failing test's report (secrets the server printed masked)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        secrets = redact.secret_values(self.command, {**dict(self.spec.env), **self.placement_env})
        return redact.text("\n".join(text.splitlines()[-lines:]), secrets)

    def engine_config(self) -> dict[str, Any]:
        """The server's resolved engine config, flat: from /server_info when it was served at start, else
        from the config line of its log (see `engine_config_from_server_info` / `parse_engine_config`)."""
        if not self._engine_config:  # not started, or no line in the log yet: read it now
            return self._log_engine_config()
        return json.loads(json.dumps(self._engine_config))  # a copy: callers may edit theirs

    def workarounds(self) -> list[dict[str, Any]]:
        """What the opt-in vLLM CPU fix did in each server process (empty when not opted in)."""
        if not self.record_dir.is_dir():
            return []
        return [json.loads(p.read_text()) for p in sorted(self.record_dir.glob(f"{FIX_NAME}-*.json"))]

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM the process group, then SIGKILL whatever is left after `grace_s`."""
        if self.proc is None:
            return
        terminate_group(self.proc, grace_s)

    def __enter__(self) -> VllmServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _preexec(cpus: frozenset[int] | None, nice: int) -> Callable[[], None]:
    """preexec_fn: on Linux a parent-death signal (SIGTERM when the process that started the server dies,
    even by SIGKILL, so vLLM shuts its engine down instead of orphaning it); the child's CPU affinity and
    niceness, set before exec (threads and children inherit them)."""
    prctl = _prctl()
    parent = os.getpid()

    def setup() -> None:
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
            if os.getppid() != parent:  # the parent died before the signal was armed
                os._exit(1)
        if cpus:
            os.sched_setaffinity(0, cpus)
        if nice:
            os.nice(nice)

    return setup


_PR_SET_PDEATHSIG = 1


def _prctl() -> Callable[[int, int], int] | None:
    """libc's prctl, loaded before the fork (nothing may be loaded between fork and exec); None off Linux."""
    if not os.uname().sysname == "Linux":
        return None
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


def _start_ticks(pid: int) -> int | None:
    """A process's start time (clock ticks since boot, /proc/PID/stat field 22): with the pid it names
    one process, even after the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat[stat.rindex(b")") + 2:].split()[19])


def owner_tag(pid: int) -> str:
    return f"{pid}:{_start_ticks(pid)}"


@dataclass(frozen=True)
class Stray:
    """A server an earlier session started and left running (its owner is gone)."""

    pid: int
    owner: str
    command: str

    def line(self) -> str:
        return f"pid {self.pid} (started by pytest pid {self.owner.split(':')[0]}, now gone): {self.command}"


def find_strays(proc: str = "/proc") -> list[Stray]:
    """Group leaders carrying this plugin's owner tag whose owner process is gone. Only processes of this
    user can be read, so only ours are ever found."""
    out = []
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            with open(f"{proc}/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"{proc}/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            leader = os.getpgid(pid) == pid
        except OSError:  # gone, or not ours
            continue
        tag = next((v.split(b"=", 1)[1].decode() for v in env if v.startswith(OWNER_ENV.encode() + b"=")), None)
        if tag is None or not leader:
            continue
        owner = int(tag.split(":", 1)[0])
        if owner_tag(owner) != tag:  # the owner exited (or its pid now names another process)
            out.append(Stray(pid, tag, cmd))
    return out


def remove_strays(strays: list[Stray], grace_s: float = 10.0) -> None:
    """SIGTERM each stray's process group, then SIGKILL what is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for stray in strays:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(stray.pid, sig)
        deadline = time.monotonic() + grace_s
        while sig == signal.SIGTERM and time.monotonic() < deadline and any(_group_alive(x.pid) for x in strays):
            time.sleep(0.2)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """Hold off Ctrl-C, SIGTERM and SIGHUP while servers are being stopped, so a second Ctrl-C during
    shutdown cannot leave a server behind; an interrupt that came in is raised once they are stopped.
    Outside the main thread (where signals cannot be handled) it does nothing."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    old = {sig: signal.signal(sig, lambda n, _f: caught.append(n)) for sig in sigs}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    if caught:
        raise KeyboardInterrupt(f"{signal.Signals(caught[0]).name} while stopping the vLLM servers")


def lower_priority(pid: int, nice: int) -> dict[str, Any]:
    """Lower the scheduling priority of the session `pid` leads (a server started with its own session).

    Why: a process's nice value only weighs against tasks of its own autogroup, and Linux puts every
    session in an autogroup of its own (``sched_autogroup_enabled``), so the server's session gets the
    nice value too, through ``/proc/PID/autogroup``. On 2 cores the busy-waiting server otherwise keeps
    the client from reading for up to ~200 ms, and a whole stream arrives in one read
    (docs/measurement.md). Raising a nice value needs no privilege. Returns what took effect.
    """
    autogroup: bool | None = False
    for _ in range(5):  # unprivileged writes are rate-limited to one per 100 ms, machine-wide (EAGAIN)
        try:
            with open(f"/proc/{pid}/autogroup", "w") as f:
                f.write(str(nice))
            autogroup = True
            break
        except FileNotFoundError:  # a kernel without autogroups: the process nice value is all there is
            autogroup = None
            break
        except BlockingIOError:
            time.sleep(0.11)
        except OSError:
            break
    return {"nice": nice, "autogroup": autogroup}


def group_cpu_ticks(pgids: set[int]) -> int:
    """CPU time (clock ticks, user + system) used so far by every process in the process groups `pgids`."""
    total = 0
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
        if int(rest[2]) in pgids:
            total += int(rest[11]) + int(rest[12])
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


def terminate_group(proc: subprocess.Popen[bytes], grace_s: float = 20.0) -> None:
    """Stop `proc` and every process in its group: SIGTERM, wait, then SIGKILL.

    The group id is the one created at start (`start_new_session`: the leader's pid), never looked up:
    once the leader has exited and been reaped, a lookup fails and its children would survive."""
    pgid = proc.pid
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:  # no process left in the group
            break
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        # The leader is gone; children in the group may linger: kill them too.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        break
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=1.0)  # reap the leader
