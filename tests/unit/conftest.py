"""The unit tier stays pure: a test here that starts a subprocess, opens or serves a socket, or sleeps fails,
naming what it did. Such a test belongs in tests/functional, where the clock and other processes are allowed;
keeping them out is what lets this tier run in seconds."""

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


@pytest.fixture(autouse=True)
def _pure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subprocess.Popen, "__init__", _refuse("started a subprocess"))
    monkeypatch.setattr(socket.socket, "connect", _refuse("opened a connection"))
    monkeypatch.setattr(socket.socket, "connect_ex", _refuse("opened a connection"))
    monkeypatch.setattr(socket.socket, "bind", _refuse("bound a socket"))
    monkeypatch.setattr(time, "sleep", _refuse("slept"))
