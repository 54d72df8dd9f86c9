"""Servers started at once: every process launched, then their readiness polled together, so their start-ups
overlap (on a GPU start-up dominates, loading weights while the GPU sits idle). Which servers may start together
is the placement's question (`profiles/starts.py`); the pool asks this module to do it. No pytest import."""

from __future__ import annotations

import time

from pytest_specdec.errors import ServerStartError
from pytest_specdec.servers.process import PORT_ATTEMPTS, VllmServer


def start_together(servers: list[VllmServer], poll_s: float = 0.5) -> list[ServerStartError | None]:
    """Start ``servers`` at once: every process launched, then their readiness polled in turn, so their start-ups
    overlap (each one's `startup_s` is its own). One that fails is stopped and its error (cause, command, log)
    returned in its place; the others go on. A port taken before vLLM bound it is retried as in `start`. On any
    other exception (Ctrl-C, SIGTERM) every server not yet ready is stopped before it propagates."""
    errors: list[ServerStartError | None] = [None] * len(servers)
    tries = [0] * len(servers)
    pending: list[int] = []

    def launch(i: int) -> None:
        tries[i] += 1
        try:
            servers[i].spawn()
            pending.append(i)
        except ServerStartError as exc:
            errors[i] = exc

    try:
        for i in range(len(servers)):
            launch(i)
        while pending:
            for i in list(pending):
                try:
                    ready = servers[i].poll_ready()
                except ServerStartError as exc:
                    pending.remove(i)
                    if tries[i] < PORT_ATTEMPTS and servers[i].port_taken():
                        launch(i)
                    else:
                        errors[i] = exc
                    continue
                if ready:
                    pending.remove(i)
            if pending:
                time.sleep(poll_s)
    except BaseException:
        for i in pending:
            servers[i].abort()
        raise
    return errors
