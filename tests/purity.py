"""What keeps the unit tier pure: while a test of tests/unit runs (tests/conftest.py applies this), starting a
subprocess, opening or serving a socket, or sleeping fails, naming what it did. Such a test belongs in
tests/functional, where the clock and other processes are allowed; keeping them out is what lets the unit tier
run in seconds."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable
from typing import NoReturn

import pytest


def _refuse(what: str) -> Callable[..., NoReturn]:
    def call(*args: object, **kwargs: object) -> NoReturn:
        raise AssertionError(f"a unit test {what}: move it to tests/functional (tests/unit is pure)")

    return call


def refuse_impure(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make subprocesses, connecting, binding and sleeping fail until ``monkeypatch`` undoes it."""
    monkeypatch.setattr(subprocess.Popen, "__init__", _refuse("started a subprocess"))
    monkeypatch.setattr(socket.socket, "connect", _refuse("opened a connection"))
    monkeypatch.setattr(socket.socket, "connect_ex", _refuse("opened a connection"))
    monkeypatch.setattr(socket.socket, "bind", _refuse("bound a socket"))
    monkeypatch.setattr(time, "sleep", _refuse("slept"))
