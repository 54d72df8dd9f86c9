"""One vLLM server process: command, port, readiness, log, tree kill.

Never imports pytest (like pytest-xprocess's `xprocess.py`): the pytest glue lives elsewhere, and
this module is also used by the zoo's measurement command.  Only the standard library is
imported at module level so `pytest --help` stays fast.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .errors import ServerStartError
from .vllm_cpu_fix import FIX_NAME, OPT_IN_ENV, RECORD_ENV

#: Lines of the server log attached to a failure.
LOG_TAIL_LINES = 60


@dataclass(frozen=True)
class ServerSpec:
    """Everything that makes two vLLM servers interchangeable; equal specs share one server."""

    model: str
    speculative_config: dict[str, Any] | None = None
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    host: str = "127.0.0.1"
    served_model_name: str | None = None

    def key(self) -> str:
        """A short stable id, so logs and results can name the server."""
        blob = json.dumps(
            [self.model, self.speculative_config, list(self.args), list(self.env), self.host],
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    @property
    def method(self) -> str:
        return "none" if not self.speculative_config else str(self.speculative_config.get("method"))


def vllm_launcher() -> list[str]:
    """argv prefix that runs `vllm` with the installed distribution.

    A regular `vllm` install has the `vllm` script beside this interpreter; vllm-cpu's script is
    broken (it asks for a distribution named `vllm`), so we go through our small shim.
    """
    from .vllm_cli import vllm_distribution

    script = Path(sys.executable).with_name("vllm")
    if vllm_distribution() == "vllm" and script.exists():
        return [str(script)]
    return [sys.executable, "-m", "pytest_specdec.vllm_cli"]


def build_command(spec: ServerSpec, port: int | str, launcher: list[str] | None = None) -> list[str]:
    """The exact `vllm serve` argv for `spec` on `port` (a placeholder string in dry runs)."""
    cmd = [*(launcher or vllm_launcher()), "serve", spec.model, "--host", spec.host, "--port", str(port)]
    # A model's generation_config.json would silently change sampling defaults between arms.
    if "--generation-config" not in spec.args:
        cmd += ["--generation-config", "vllm"]
    if spec.served_model_name:
        cmd += ["--served-model-name", spec.served_model_name]
    if spec.speculative_config:
        cmd += ["--speculative-config", json.dumps(spec.speculative_config, sort_keys=True)]
    cmd += list(spec.args)
    return cmd


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


_CONFIG_LINE = re.compile(r"Initializing a V1 LLM engine \(v(?P<version>[^)]*)\) with config: (?P<config>.*)$")
_KV = re.compile(r"(\w+)=((?:\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\})|(?:\[[^\]]*\])|(?:'[^']*')|(?:[^,]*))")


def parse_engine_config(log_text: str) -> dict[str, Any]:
    """The resolved engine config vLLM prints at start (`... with config: k=v, ...`), as strings."""
    for line in log_text.splitlines():
        match = _CONFIG_LINE.search(line)
        if match:
            found: dict[str, Any] = {"vllm_version": match["version"]}
            for key, value in _KV.findall(match["config"]):
                found[key] = value.strip()
            return found
    return {}


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
    #: Called with the server's pid right after it is spawned (the GPU lease records it).
    on_spawn: Callable[[int], None] | None = field(default=None, repr=False)

    @property
    def base_url(self) -> str:
        return f"http://{self.spec.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"vllm-{self.spec.method}-{self.spec.key()}.log"

    @property
    def record_dir(self) -> Path:
        return self.log_dir / f"vllm-{self.spec.key()}-records"

    def start(self) -> None:
        """Start and wait for /health and /v1/models; on any failure stop and raise with the log tail."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port(self.spec.host)
        self.command = build_command(self.spec, self.port, self.launcher)
        env = {**os.environ, **dict(self.spec.env), **self.placement_env}
        if env.get(OPT_IN_ENV) == "1":
            shutil.rmtree(self.record_dir, ignore_errors=True)
            self.record_dir.mkdir(parents=True)
            env[RECORD_ENV] = str(self.record_dir)
        t0 = self.clock()
        with open(self.log_path, "wb") as log:
            log.write(f"$ {shlex.join(self.command)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # own process group: we kill the whole tree
                preexec_fn=_pin(self.cpus) if self.cpus else None,
            )
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
        except BaseException:
            self.stop()
            raise
        self.startup_s = self.clock() - t0

    def _start_error(self, what: str) -> ServerStartError:
        return ServerStartError(
            f"vLLM server ({self.spec.method}) {what}\n"
            f"command: {shlex.join(self.command)}\nport: {self.port}\nlog: {self.log_path}\n"
            f"--- last {LOG_TAIL_LINES} log lines ---\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The end of the server log, for a failing test's report."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def engine_config(self) -> dict[str, Any]:
        """The resolved engine config the server printed at start."""
        try:
            return parse_engine_config(self.log_path.read_text(errors="replace"))
        except OSError:
            return {}

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


def _pin(cpus: frozenset[int]) -> Callable[[], None]:
    """preexec_fn: set the child's CPU affinity before exec (its threads and children inherit it)."""

    def pin() -> None:
        os.sched_setaffinity(0, cpus)

    return pin


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

    def to_dict(self) -> dict[str, Any]:
        return {"waited_s": round(self.waited_s, 3), "quiet": self.quiet, "cores": round(self.cores, 3)}


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
    """Stop `proc` and every process in its group: SIGTERM, wait, then SIGKILL."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        pgid = None
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        if pgid is not None:
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
        elif proc.poll() is None:
            proc.send_signal(sig)
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        # The leader is gone; children in the group may linger: kill them too.
        if pgid is not None:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        break
