"""How a server process is spawned and stopped, below `VllmServer`: the parent-death signal, CPU
affinity and niceness set before exec, the autogroup priority, the process-group kill, and the check that
server logs can be written at all. Standard library only, never pytest."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: How `log_dir_problem`'s line begins: xdist's controller recognises a worker's stop by it.
CANNOT_WRITE_LOGS = "cannot write server logs under "


def log_dir_problem(log_dir: Path) -> str | None:
    """Why server logs cannot be written under `log_dir` (a read-only or full file system, a file in
    the way), as one line naming the path; None when they can. A probe file is written, synced and
    removed, so a full disk shows here rather than as a server start that fails. The probe goes into
    the deepest directory that exists: a session that starts no server creates no directory."""
    where = log_dir
    while not where.exists() and where.parent != where:
        where = where.parent
    if not where.is_dir():
        return f"{CANNOT_WRITE_LOGS}{log_dir}: {where} is not a directory"
    probe: str | None = None
    try:
        fd, probe = tempfile.mkstemp(dir=where, prefix=".specdec-probe-")
        with os.fdopen(fd, "wb") as f:
            f.write(b"\0" * 4096)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        return f"{CANNOT_WRITE_LOGS}{log_dir}: {exc.filename or where}: {exc.strerror or exc}"
    finally:
        if probe is not None:
            with contextlib.suppress(OSError):
                os.unlink(probe)
    return None


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
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


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
