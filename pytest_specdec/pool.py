"""Which vLLM servers are alive: one per distinct spec, reused by every test that needs it.

No pytest import: the session object drives it.  A cap on servers alive at once stops the least
recently used server first; needing it again later restarts it, and every start is recorded.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .server import ServerSpec, VllmServer


@dataclass(frozen=True)
class Endpoint:
    """A server to send load to: one we started, or one someone else runs (endpoint mode)."""

    base_url: str
    model: str
    owned: bool


@dataclass(frozen=True)
class StartRecord:
    spec_key: str
    method: str
    startup_s: float
    command: tuple[str, ...]


class ServerPool:
    """Starts servers on demand, keeps at most `max_alive`, stops them all at the end."""

    def __init__(
        self,
        log_dir: Path,
        max_alive: int,
        startup_timeout_s: float,
        progress: Callable[[str], None] = lambda line: None,
        launcher: list[str] | None = None,
    ) -> None:
        self.log_dir = log_dir
        self.max_alive = max_alive
        self.startup_timeout_s = startup_timeout_s
        self.progress = progress
        self.launcher = launcher  # None: vLLM itself; tests pass a stand-in
        # Keyed by ServerSpec.key(): specs hold dicts (the speculative config), so are not hashable.
        self._alive: OrderedDict[str, VllmServer] = OrderedDict()
        self.starts: list[StartRecord] = []
        self.servers: dict[str, VllmServer] = {}  # every server ever started, for reports

    def get(self, spec: ServerSpec) -> VllmServer:
        """The running server for `spec`, starting it (and stopping the LRU one) if needed."""
        key = spec.key()
        server = self._alive.get(key)
        if server is not None and server.alive():
            self._alive.move_to_end(key)
            return server
        if server is not None:  # died since last use: drop it and start afresh
            self._alive.pop(key)
        while len(self._alive) >= self.max_alive:
            old_key, old = self._alive.popitem(last=False)
            self.progress(f"specdec: stopping vLLM ({old.spec.method}, {old_key}) to stay within "
                          f"--specdec-max-servers={self.max_alive}")
            old.stop()
        server = VllmServer(spec, log_dir=self.log_dir, startup_timeout_s=self.startup_timeout_s,
                            launcher=self.launcher)
        self.servers[key] = server
        self.progress(f"specdec: starting vLLM ({spec.method}, {spec.key()}) ...")
        t0 = time.monotonic()
        server.start()
        self._alive[key] = server
        assert server.startup_s is not None
        self.starts.append(StartRecord(spec.key(), spec.method, server.startup_s, tuple(server.command)))
        self.progress(
            f"specdec: vLLM ({spec.method}, {spec.key()}) ready in {time.monotonic() - t0:.0f} s "
            f"at {server.base_url}"
        )
        return server

    def stop_all(self) -> None:
        """Stop every server we started (also on failure and Ctrl-C)."""
        while self._alive:
            _, server = self._alive.popitem()
            server.stop()
