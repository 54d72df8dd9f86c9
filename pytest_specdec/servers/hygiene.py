"""No server outlives the session that started it: the owner tag each server carries, the sweep for
the strays of a session that is gone, and the shield that lets a shutdown finish under Ctrl-C.
Standard library only, never pytest."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from typing import Callable
from dataclasses import dataclass

from pytest_specdec import redact

#: Environment variable that marks a server this plugin started: "<owner pid>:<owner start ticks>", so
#: a later session can tell its own strays (owner gone) from servers a live session still uses.
OWNER_ENV = "PYTEST_SPECDEC_OWNER"
#: The log directory of the session that started a server: a session sweeps only its own project's strays.
LOGS_ENV = "PYTEST_SPECDEC_LOGS"


def _stat(pid: int, proc: str = "/proc") -> list[bytes] | None:
    """/proc/PID/stat's fields from the third (the state) on, after the command name, which may hold
    spaces; None when there is no such process."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rindex(b")") + 2:].split()


def _start_ticks(pid: int) -> int | None:
    """A process's start time (clock ticks since boot, /proc/PID/stat field 22): with the pid it names
    one process, even after the pid is reused."""
    fields = _stat(pid)
    return None if fields is None else int(fields[19])


def owner_tag(pid: int) -> str:
    return f"{pid}:{_start_ticks(pid)}"


@dataclass(frozen=True)
class Stray:
    """A server an earlier session started and left running (its owner is gone), or what is left of one
    whose leader already exited (vLLM's engine core, say): stopped by its process group either way."""

    pid: int
    owner: str
    command: str
    #: The process group the server was started in: `pid` for a server, the exited server's pid for
    #: what it left.
    group: int

    def line(self) -> str:
        left = "" if self.group == self.pid else f", left by server pid {self.group} that exited"
        return f"pid {self.pid} (started by pytest pid {self.owner.split(':')[0]}, now gone{left}): {self.command}"


def find_strays(logs: str, proc: str = "/proc") -> list[Stray]:
    """One per process group of this plugin's servers whose owner process is gone, started by a session
    whose server logs went under `logs` (this project's): its leader, or when the leader already exited,
    the first process left in the group (they carry the owner tag they inherited). Only processes of
    this user can be read, so only ours are ever found."""
    root = os.path.realpath(logs)
    groups: dict[int, Stray] = {}
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            with open(f"{proc}/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"{proc}/{pid}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").rstrip("\0").split("\0")
            pgid = os.getpgid(pid)
        except OSError:  # gone, or not ours
            continue
        values = dict(v.decode(errors="replace").split("=", 1) for v in env if b"=" in v)
        tag, where = values.get(OWNER_ENV), values.get(LOGS_ENV, "")
        if tag is None or os.path.commonpath([root, os.path.realpath(where or "/")]) != root:
            continue
        owner = int(tag.split(":", 1)[0])
        if owner_tag(owner) == tag:  # the owner still runs (and its pid names the same process)
            continue
        if pgid != pid and (pgid in groups or _running(pgid, proc)):
            continue  # a server's child: its leader is (or will be) the stray, and takes it along
        groups[pgid] = Stray(pid, tag, " ".join(redact.args(argv)), pgid)  # the line is printed: no secrets
    return list(groups.values())


def _running(pid: int, proc: str) -> bool:
    """Whether process `pid` exists and has not exited (a zombie has: only its group id lives on)."""
    fields = _stat(pid, proc)
    return fields is not None and fields[0] not in (b"Z", b"X")


def remove_strays(strays: list[Stray], grace_s: float = 10.0) -> None:
    """SIGTERM each stray's process group, then SIGKILL what is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for stray in strays:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(stray.group, sig)
        deadline = time.monotonic() + grace_s
        while sig == signal.SIGTERM and time.monotonic() < deadline and any(_group_alive(x.group) for x in strays):
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


def interrupt_on_termination() -> Callable[[], None]:
    """SIGTERM and SIGHUP (what CI runners send on cancel, what a closed terminal sends) raise
    KeyboardInterrupt in the main thread as Ctrl-C does, so the session unwinds and stops its servers
    instead of dying with them running. A handler someone else set stays. Returns the undo."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def interrupt(signum: int, _frame: object) -> None:
        # Through SIGINT's own handler where there is one: an event loop running the load (asyncio's Runner)
        # turns SIGINT into a clean cancel-and-raise, where an exception raised here could be swallowed.
        if signal.getsignal(signal.SIGINT) not in (signal.SIG_IGN, signal.SIG_DFL, None):
            signal.raise_signal(signal.SIGINT)
        else:
            raise KeyboardInterrupt(f"{signal.Signals(signum).name} received")

    old = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP)}
    for sig, handler in old.items():
        if handler is signal.SIG_DFL:
            signal.signal(sig, interrupt)

    def undo() -> None:
        for sig, handler in old.items():
            if signal.getsignal(sig) is interrupt:
                signal.signal(sig, handler)

    return undo
