"""No server outlives the session that started it: the owner tag each server carries, the per-user
registry of live servers, the sweep for the strays of a session that is gone, and the shield that lets a
shutdown finish under Ctrl-C. Standard library only, never pytest."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from pytest_specdec import redact

#: Environment variable that marks a server this plugin started: "<owner pid>:<owner start ticks>", so
#: a later session can tell its own strays (owner gone) from servers a live session still uses.
OWNER_ENV = "PYTEST_SPECDEC_OWNER"
#: The log directory of the session that started a server (servers started before the registry existed
#: are swept by it).
LOGS_ENV = "PYTEST_SPECDEC_LOGS"
#: Overrides where the registry of live servers is kept (tests keep theirs apart from real sessions').
REGISTRY_ENV = "PYTEST_SPECDEC_REGISTRY"


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


def owner_alive(tag: str, proc: str = "/proc") -> bool:
    """Whether the process an owner tag names still runs: same pid, same start time (a reused pid is
    another process), and not a zombie (a SIGKILLed pytest whose parent has not reaped it yet is gone)."""
    pid = int(tag.split(":", 1)[0])
    fields = _stat(pid, proc)
    return fields is not None and fields[0] not in (b"Z", b"X") and f"{pid}:{int(fields[19])}" == tag


def registry_dir() -> Path:
    """Where every session of this user lists its live servers, whatever its reports directory: a
    fixed per-user place, so the next session finds a SIGKILLed one's servers wherever it wrote logs."""
    if os.environ.get(REGISTRY_ENV):
        return Path(os.environ[REGISTRY_ENV])
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return Path(runtime) / "pytest-specdec"
    return Path(tempfile.gettempdir()) / f"pytest-specdec-{os.getuid()}"


def _own_registry() -> Path:
    """The registry directory, created private; one another user made (in a shared /tmp) is refused."""
    root = registry_dir()
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(root)
    if st.st_uid != os.getuid() or not os.path.isdir(root) or os.path.islink(root):
        raise PermissionError(f"not a directory of this user (set {REGISTRY_ENV} to another place)")
    return root


def register(owner: str, pgid: int, log: Path, command: str) -> Path:
    """List a server just spawned (written whole or not at all); returns its entry, to remove at stop."""
    root = _own_registry()
    entry = root / f"{owner.replace(':', '-')}-{pgid}.json"
    text = json.dumps({"owner": owner, "pgid": pgid, "log": str(log), "command": command})
    fd, tmp = tempfile.mkstemp(dir=root, prefix=".tmp-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, entry)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return entry


def _registered() -> dict[tuple[str, int], str]:
    """(owner tag, process group) -> entry path, for every server the registry lists."""
    found: dict[tuple[str, int], str] = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir(registry_dir()):
            if not entry.name.endswith(".json") or entry.name.startswith("."):
                continue
            try:
                with open(entry.path) as f:
                    data = json.load(f)
                found[(str(data["owner"]), int(data["pgid"]))] = entry.path
            except (OSError, ValueError, KeyError, TypeError):
                continue  # being written, or not ours to read: it is not trusted
    return found


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
    #: Its entry in the registry of live servers, removed once it is stopped ("" when it has none).
    entry: str = ""

    def line(self) -> str:
        left = "" if self.group == self.pid else f", left by server pid {self.group} that exited"
        return f"pid {self.pid} (started by pytest pid {self.owner.split(':')[0]}, now gone{left}): {self.command}"


def find_strays(logs: str, proc: str = "/proc") -> list[Stray]:
    """One per process group of this plugin's servers whose owner process is gone: listed in the registry
    (any session of this user, whatever its reports directory) or started by a session whose server logs
    went under `logs`. Its leader, or when the leader already exited, the first process left in the group
    (they carry the owner tag they inherited). A server whose owner runs is never one. Only processes of
    this user can be read, so only ours are ever found; registry entries of groups that are gone are
    removed."""
    root = os.path.realpath(logs)
    registered = _registered()
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
        if tag is None:
            continue
        listed = registered.get((tag, pgid), "")
        if not listed and os.path.commonpath([root, os.path.realpath(where or "/")]) != root:
            continue
        if owner_alive(tag, proc):  # the owner still runs (and its pid names the same process)
            continue
        if pgid != pid and (pgid in groups or _running(pgid, proc)):
            continue  # a server's child: its leader is (or will be) the stray, and takes it along
        groups[pgid] = Stray(pid, tag, " ".join(redact.args(argv)), pgid, listed)  # printed: no secrets
    for (_tag, pgid), path in registered.items():
        if pgid not in groups and not group_alive(pgid):  # stopped without removing its entry
            with contextlib.suppress(OSError):
                os.unlink(path)
    return list(groups.values())


def _running(pid: int, proc: str) -> bool:
    """Whether process `pid` exists and has not exited (a zombie has: only its group id lives on)."""
    fields = _stat(pid, proc)
    return fields is not None and fields[0] not in (b"Z", b"X")


def remove_strays(strays: list[Stray], grace_s: float = 10.0) -> None:
    """SIGTERM each stray's process group, then SIGKILL what is left; their registry entries go too."""
    stop_groups([stray.group for stray in strays], grace_s)
    for stray in strays:
        if stray.entry:
            with contextlib.suppress(OSError):
                os.unlink(stray.entry)


def stop_groups(groups: list[int], grace_s: float) -> None:
    """SIGTERM the process groups, wait up to `grace_s` for them to go, then SIGKILL what is left (vLLM
    ignores SIGTERM while it starts)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for group in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, sig)
        deadline = time.monotonic() + grace_s
        while sig == signal.SIGTERM and time.monotonic() < deadline and any(group_alive(g) for g in groups):
            time.sleep(0.2)


def group_alive(pgid: int) -> bool:
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


#: The termination signals `interrupt_on_termination` turned into a KeyboardInterrupt and no one has seen end the
#: session yet: one raised inside a library's callback can be swallowed there (aiohttp turns it into a failed
#: request), so the load raises it again once its event loop is done (`raise_if_terminated`).
_terminated: list[int] = []


def raise_if_terminated() -> None:
    """Raise the KeyboardInterrupt of a SIGTERM or SIGHUP that came in, if code between swallowed it."""
    if _terminated:
        raise KeyboardInterrupt(f"{signal.Signals(_terminated.pop()).name} received")


def interrupt_on_termination() -> Callable[[], None]:
    """SIGTERM and SIGHUP (what CI runners send on cancel, what a closed terminal sends) raise
    KeyboardInterrupt in the main thread as Ctrl-C does, so the session unwinds and stops its servers
    instead of dying with them running. A handler someone else set stays. Returns the undo."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def interrupt(signum: int, _frame: object) -> None:
        _terminated[:] = [signum]
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
        _terminated.clear()
        for sig, handler in old.items():
            if signal.getsignal(sig) is interrupt:
                signal.signal(sig, handler)

    return undo
