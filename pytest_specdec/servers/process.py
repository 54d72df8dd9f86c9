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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from pytest_specdec import redact
from pytest_specdec.errors import ServerStartError
from pytest_specdec.servers.cause import engine_exception
from pytest_specdec.servers.http import get, server_info
from pytest_specdec.servers.hygiene import LOGS_ENV, OWNER_ENV, owner_tag, register
from pytest_specdec.servers.spawn import _preexec, lower_priority, terminate_group
from pytest_specdec.vllm.command import ServerSpec, arg_value, build_command
from pytest_specdec.vllm.cpu_fix import FIX_NAME, OPT_IN_ENV, RECORD_ENV
from pytest_specdec.vllm.engine_config import (
    DEV_MODE_ENV,
    engine_config_from_server_info,
    parse_engine_config,
)

#: vLLM's environment variable for the key its /v1 routes require (the --api-key flag would show in `ps`).
API_KEY_ENV = "VLLM_API_KEY"
#: Lines of the server log attached to a failure.
LOG_TAIL_LINES = 60
#: Starts tried when the port `free_port` chose was taken before vLLM bound it.
PORT_ATTEMPTS = 3
#: Grace of a server whose start is broken off (failed, timed out, SIGTERM or Ctrl-C) before SIGKILL:
#: vLLM ignores SIGTERM while it starts, and a half-started server has nothing to shut down cleanly.
ABORT_GRACE_S = 2.0


def free_port(host: str = "127.0.0.1") -> int:
    """Ask the OS for a free port (bind port 0), as pytest-xprocess's tests do."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def exit_description(code: int | None) -> str:
    """How a server process ended. A negative return code is the signal that killed it (Popen's
    convention): an OOM kill or a SIGKILL says so, instead of a bare "code -9"."""
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown signal"
        return f"was killed by signal {-code} ({name})"
    return f"exited with code {code}"


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
    #: The key its /v1 routes require (vLLM's VLLM_API_KEY), so no other local user drives load into it and
    #: skews its counters; a key the profile gives with --api-key wins. None: no key.
    api_key: str | None = field(default=None, repr=False)
    _engine_config: dict[str, Any] | None = field(default=None, repr=False)
    _log_path: Path | None = field(default=None, repr=False)
    #: The watchdog that stops the server if this process dies without stopping it (servers/watchdog.py).
    _watchdog: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    #: The server's entry in the per-user registry of live servers (what the next session's sweep reads).
    _entry: Path | None = field(default=None, repr=False)
    #: When this start's process was launched (`clock`), what its start-up time and deadline count from.
    _t0: float = field(default=0.0, repr=False)

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
                if attempt == PORT_ATTEMPTS or not self.port_taken():
                    raise

    def port_taken(self) -> bool:
        """Whether this start failed on a port another process took first (worth a retry on a new port)."""
        return "address already in use" in self.log_tail().lower()

    def _start_once(self) -> None:
        self.spawn()
        try:
            while not self.poll_ready():
                time.sleep(0.5)
        except BaseException:
            self.abort()  # stopping twice is harmless; a Ctrl-C in the sleep must stop it too
            raise

    def spawn(self) -> None:
        """Launch the process (its log, registry entry, watchdog and priority); readiness is `poll_ready`'s."""
        self.port = free_port(self.spec.host)
        self.command = build_command(self.spec, self.port, self.launcher)
        owner = owner_tag(os.getpid())
        env = {**os.environ, **dict(self.spec.env), **self.placement_env, OWNER_ENV: owner,
               LOGS_ENV: str(self.log_dir.resolve())}
        if self.dev_mode:
            env[DEV_MODE_ENV] = "1"
        given = arg_value(self.spec.args, "--api-key")  # vLLM lets the flag win over the variable
        if given is not None:
            self.api_key = given
        elif self.api_key:
            env[API_KEY_ENV] = self.api_key
        self._engine_config, self.server_info_s = None, None
        log = self._open_log(env)
        self._t0 = self.clock()
        with log:
            self.proc = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # own process group, whose id is the pid: we kill the whole tree
                preexec_fn=_preexec(self.cpus, self.nice),
            )
        try:
            self._tie_to_session(owner)
            self.priority = lower_priority(self.proc.pid, self.nice) if self.nice else None
            if self.on_spawn is not None:
                self.on_spawn(self.proc.pid)
        except BaseException:
            self.abort()
            raise

    def poll_ready(self) -> bool:
        """One look at a spawned server: True once /health and /v1/models answer (its start-up time and engine
        config then read); a server that exited or passed its deadline is stopped and raises."""
        assert self.proc is not None
        try:
            code = self.proc.poll()
            if code is not None:
                raise self._start_error(f"{exit_description(code)} while starting")
            if not all(get(f"{self.base_url}{path}", self.api_key, 2.0).ok for path in ("/health", "/v1/models")):
                if self.clock() > self._t0 + self.startup_timeout_s:
                    raise self._start_error(f"not ready after {self.startup_timeout_s:.0f} s")
                return False
            self.startup_s = self.clock() - self._t0
            self._engine_config = self._read_engine_config()
            return True
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Stop a start broken off (failed, timed out, interrupted) after a short grace: vLLM ignores SIGTERM
        while it starts."""
        from pytest_specdec.servers.hygiene import shielded

        with shielded():  # a second Ctrl-C must not leave the half-started server running
            self.stop(ABORT_GRACE_S)

    def _open_log(self, env: dict[str, str]) -> BinaryIO:
        """This start's log, its first line the command; what else the start writes is cleared. A log
        directory that cannot be written is a one-line error naming the path, and leaves no empty log."""
        self._log_path = None
        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            self._log_path = self._next_log_path()
            self.config_path.unlink(missing_ok=True)
            if env.get(OPT_IN_ENV) == "1":
                shutil.rmtree(self.record_dir, ignore_errors=True)
                self.record_dir.mkdir(parents=True)
                env[RECORD_ENV] = str(self.record_dir)
            log = open(self._log_path, "wb")
        except OSError as exc:
            raise ServerStartError(f"vLLM server ({self.spec.method}) not started: cannot write "
                                   f"{exc.filename or self.log_dir}: {exc.strerror or exc}") from None
        try:
            log.write(f"$ {shlex.join(redact.args(self.command))}\n".encode())
            log.flush()
        except OSError as exc:
            log.close()
            self._log_path.unlink(missing_ok=True)
            raise ServerStartError(f"vLLM server ({self.spec.method}) not started: cannot write "
                                   f"{self._log_path}: {exc.strerror or exc}") from None
        return log

    def _tie_to_session(self, owner: str) -> None:
        """List the server in the per-user registry and start its watchdog, so it is stopped even when
        this process is SIGKILLed (a start-up ignores the parent-death SIGTERM; the registry lets the
        next session find it whatever reports directory it uses). An unwritable registry stops the start
        with a line naming it: a server nothing would stop is never left running."""
        from pytest_specdec.servers.hygiene import registry_dir
        from pytest_specdec.servers.watchdog import start_watchdog

        assert self.proc is not None
        try:
            self._entry = register(owner, self.proc.pid, self.log_path, " ".join(redact.args(self.command)))
        except OSError as exc:
            raise ServerStartError(f"vLLM server ({self.spec.method}) not started: cannot write its entry in "
                                   f"{registry_dir()}: {exc.strerror or exc}") from None
        self._watchdog = start_watchdog(owner, self.proc.pid, self._entry)

    def _read_engine_config(self) -> dict[str, Any]:
        """Once per start, after readiness: /server_info when served, else the start-up log line."""
        if self.dev_mode:
            t0 = time.monotonic()
            info = server_info(self.base_url, self.api_key)
            self.server_info_s = time.monotonic() - t0
            config = engine_config_from_server_info(info)
            if config:
                if not config.get("vllm_version"):
                    config["vllm_version"] = self._log_engine_config().get("vllm_version")
                assert info is not None
                try:
                    text = json.dumps(info["vllm_config"], indent=1, sort_keys=True) + "\n"  # may hold hf_token
                    self.config_path.write_text(redact.text(text, self._secrets()))
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
        cause = self.cause()
        return ServerStartError(
            f"vLLM server ({self.spec.method}) {what}\n" + (f"{cause}\n" if cause else "")
            + f"command: {shlex.join(redact.args(self.command))}\nport: {self.port}\nlog: {self.log_path}\n"
            f"--- last {LOG_TAIL_LINES} log lines ---\n{self.log_tail()}"
        )

    def cause(self) -> str:
        """The first exception this start's engine core or a worker raised, quoted for a failure message
        (`servers.cause`), secrets masked; "" when its log holds none. The log tail rarely shows it: vLLM's
        API server ends with its own traceback, "See root cause above"."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        found = engine_exception(text)
        return redact.text(found.quote(), self._secrets()) if found is not None else ""

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The end of the server log, for a failing test's report (secrets the server printed masked)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return redact.text("\n".join(text.splitlines()[-lines:]), self._secrets())

    def _secrets(self) -> set[str]:
        return redact.secret_values(self.command, {**dict(self.spec.env), **self.placement_env})

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
        """SIGTERM the process group, then SIGKILL whatever is left after `grace_s`; then its watchdog and
        registry entry go."""
        if self.proc is None:
            return
        terminate_group(self.proc, grace_s)
        if self._watchdog is not None:
            with contextlib.suppress(ProcessLookupError):
                self._watchdog.kill()
            self._watchdog.wait()
            self._watchdog = None
        if self._entry is not None:
            with contextlib.suppress(OSError):
                self._entry.unlink(missing_ok=True)
            self._entry = None
        self._scrub_log()

    def _scrub_log(self) -> None:
        """Mask the secrets vLLM printed itself (its non-default args name --hf-token's value), so the log
        CI keeps as an artifact holds none."""
        secrets = self._secrets()
        try:
            if secrets and any(x in (text := self.log_path.read_text(errors="replace")) for x in secrets):
                self.log_path.write_text(redact.text(text, secrets))
        except OSError:
            pass

    def __enter__(self) -> VllmServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

