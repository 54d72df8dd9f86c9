"""The watchdog that ties a server to its session from the moment it is spawned.

    python -m pytest_specdec.servers.watchdog OWNER_TAG PGID [REGISTRY_ENTRY]

Why a process of its own: a SIGKILLed pytest runs no cleanup, and the parent-death signal reaches only
the server's first process, as a SIGTERM, which vLLM ignores while it starts (its engine core and
workers get none). The watchdog runs in its own session, so a kill of pytest's process group does not
take it. It polls the owner (pid and start time, as the owner tag names it); once the owner is gone it
SIGTERMs the server's process group, SIGKILLs what is left after a short grace, removes the server's
registry entry and exits. It also exits, removing the entry, once the group is gone. Standard library
only, never pytest: it starts in a fraction of a second.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from pytest_specdec.servers.hygiene import OWNER_ENV, group_alive, owner_alive, stop_groups

#: How often the watchdog looks at the owner and the group.
POLL_S = 0.25
#: How long a server whose owner is gone gets to stop on SIGTERM before SIGKILL.
GRACE_S = 5.0


def start_watchdog(owner: str, pgid: int, entry: Path | None) -> subprocess.Popen[bytes]:
    """Start the watchdog of the server whose process group is `pgid`, owned by the process `owner` names."""
    package_root = str(Path(__file__).resolve().parents[2])  # this pytest_specdec, whatever sys.path says
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([package_root, path] if path else [package_root])}
    env.pop(OWNER_ENV, None)  # not a server: the sweep never takes it for one
    return subprocess.Popen(
        [sys.executable, "-m", "pytest_specdec.servers.watchdog", owner, str(pgid), *([str(entry)] if entry else [])],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
        start_new_session=True,  # outlives a kill of pytest's process group, and gets no terminal Ctrl-C
    )


def watch(owner: str, pgid: int, entry: str | None, poll_s: float = POLL_S, grace_s: float = GRACE_S) -> bool:
    """Wait until the group is gone (False) or the owner is (True: the group is then stopped)."""
    try:
        while group_alive(pgid):
            if not owner_alive(owner):
                stop_groups([pgid], grace_s)
                return True
            time.sleep(poll_s)
        return False
    finally:
        if entry:
            Path(entry).unlink(missing_ok=True)


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3) or not argv[1].isdigit() or ":" not in argv[0]:
        print("usage: python -m pytest_specdec.servers.watchdog OWNER_PID:START PGID [ENTRY]", file=sys.stderr)
        return 2
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a closed terminal must not end the watch
    watch(argv[0], int(argv[1]), argv[2] if len(argv) == 3 else None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
