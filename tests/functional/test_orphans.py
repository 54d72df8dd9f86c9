"""No server outlives its session, whatever ends it, and no session stops another live session's servers.

The server here is a stand-in for vLLM while it starts: it ignores SIGTERM (as vLLM does until it is up),
starts a child that ignores it too (the engine core), and never listens. Each test keeps its own registry
of live servers (PYTEST_SPECDEC_REGISTRY), apart from any real session's on this machine.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import COLLECTED_ONLY, assert_swept

from fakes import STAND_IN_VALIDITY
from pytest_specdec.errors import ServerStartError
from pytest_specdec.servers.hygiene import LOGS_ENV, OWNER_ENV, REGISTRY_ENV, _running, owner_tag, register
from pytest_specdec.servers.process import VllmServer
from pytest_specdec.vllm.command import ServerSpec

#: `vllm serve` in start-up: SIGTERM ignored, an engine-core child, never ready; writes "PID CHILD_PID".
STARTING = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
with open(os.environ["STARTING_PIDS"], "a") as f:
    f.write(f"{os.getpid()} {child.pid}\\n")
time.sleep(300)
"""


def _gone(pid: int, within_s: float) -> bool:
    """Whether `pid` has exited within `within_s` (a zombie counts as gone)."""
    deadline = time.monotonic() + within_s
    while _running(pid, "/proc") and time.monotonic() <= deadline:
        time.sleep(0.1)
    return not _running(pid, "/proc")


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "registry"
    monkeypatch.setenv(REGISTRY_ENV, str(path))
    return path


@pytest.fixture
def starting(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, make_profile: Callable[..., Path],
             make_suite: Callable[..., str], registry: Path
             ) -> Iterator[Callable[[], tuple[subprocess.Popen[bytes], list[int]]]]:
    """Start a session whose first server never gets past start-up; returns it and the pids of that
    server and its child once both run."""
    pids = pytester.path / "starting-pids"
    monkeypatch.setenv("STARTING_PIDS", str(pids))
    pytester.makeconftest(f"import sys\nimport pytest_specdec.vllm.command\n\n"
                          f"pytest_specdec.vllm.command.vllm_launcher = lambda: [sys.executable, '-c', {STARTING!r}]\n")
    pytester.makepyfile(test_suite=make_suite(num_prompts=8, max_tokens=24))
    profile = make_profile("fakecpu", methods=("ngram",), runs=3, validity=STAND_IN_VALIDITY)
    started: list[subprocess.Popen[bytes]] = []

    def start() -> tuple[subprocess.Popen[bytes], list[int]]:
        proc = subprocess.Popen([sys.executable, "-m", "pytest", f"--specdec-profile={profile}",
                                 "-p", "no:cacheprovider", f"--specdec-reports-dir={pytester.path / 'reports-a'}"],
                                cwd=pytester.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        started.append(proc)
        deadline = time.monotonic() + 60
        while not (pids.exists() and pids.read_text().endswith("\n")) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[0].decode()[-3000:]
            time.sleep(0.1)
        return proc, [int(x) for x in pids.read_text().split()]

    yield start
    for proc in started:
        if proc.returncode is None:
            proc.kill()
            proc.communicate()
    for pid in [int(x) for x in pids.read_text().split()] if pids.exists() else []:
        if not _gone(pid, 0):
            os.kill(pid, signal.SIGKILL)


def test_a_server_in_start_up_dies_with_a_sigkilled_session_and_a_live_sessions_servers_are_left_alone(
        pytester: pytest.Pytester, starting: Callable[[], tuple[subprocess.Popen[bytes], list[int]]],
        registry: Path) -> None:
    """SIGKILL, which nothing can handle, while a server starts (it ignores the parent-death SIGTERM):
    the watchdog stops it and its child. Before that, a second session with another reports directory
    runs its sweep and leaves the first session's servers alone: their owner lives."""
    session, pids = starting()
    assert len(list(registry.glob("*.json"))) == 1
    other = pytester.runpytest_subprocess("-p", "no:cacheprovider",
                                          f"--specdec-reports-dir={pytester.path / 'reports-b'}",
                                          "-k", "no_such_test")
    assert "stopping a vLLM server" not in other.stdout.str()
    assert not any(_gone(pid, 0) for pid in pids), "a live session's server was stopped"
    session.send_signal(signal.SIGKILL)
    session.communicate()
    assert all(_gone(pid, 15) for pid in pids), "a server in start-up outlived its SIGKILLed session"
    deadline = time.monotonic() + 5
    while list(registry.glob("*.json")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not list(registry.glob("*.json")), "the watchdog left the server's registry entry"


def test_sigterm_during_a_start_stops_it_at_once(
        starting: Callable[[], tuple[subprocess.Popen[bytes], list[int]]]) -> None:
    """What a CI runner sends on cancel, while a server starts: it is SIGKILLed after a short grace, not
    the 20 s a running server gets, and pytest exits within 5 s."""
    session, pids = starting()
    t0 = time.monotonic()
    session.send_signal(signal.SIGTERM)
    out, _ = session.communicate(timeout=30)
    took = time.monotonic() - t0
    assert took < 5, f"pytest took {took:.1f} s to exit on SIGTERM during a start\n{out.decode()[-2000:]}"
    assert all(_gone(pid, 1) for pid in pids)


@pytest.fixture
def registered(tmp_path: Path, registry: Path) -> Iterator[Callable[[str], subprocess.Popen[bytes]]]:
    """Start a stand-in server owned by the process a tag names, logging under `A/logs`, listed in the
    registry as a session with `--specdec-reports-dir A` lists its servers; all killed at teardown."""
    logs = tmp_path / "A" / "logs"
    procs: list[subprocess.Popen[bytes]] = []

    def start(tag: str) -> subprocess.Popen[bytes]:
        procs.append(subprocess.Popen(["sleep", "300"], env={**os.environ, OWNER_ENV: tag, LOGS_ENV: str(logs)},
                                      start_new_session=True))
        register(tag, procs[-1].pid, logs / "vllm.log", "sleep 300")
        return procs[-1]

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def test_a_stray_of_a_session_with_another_reports_directory_is_stopped(
        pytester: pytest.Pytester, tmp_path: Path, registry: Path,
        registered: Callable[[str], subprocess.Popen[bytes]]) -> None:
    """A server a gone session started with `--specdec-reports-dir A` (its watchdog killed too) is found through
    the registry by the next session with `--specdec-reports-dir B`; a live session's server is left alone."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    stray, live = registered(f"{gone.pid}:1"), registered(owner_tag(os.getpid()))
    assert_swept(pytester, tmp_path / "B", stray, live, gone.pid)
    assert [p.name for p in registry.glob("*.json")] == [f"{owner_tag(os.getpid()).replace(':', '-')}-{live.pid}.json"]


def test_a_full_reports_directory_is_one_line_at_start_and_leaves_nothing(pytester: pytest.Pytester) -> None:
    """A disk that is full: the session stops before any server starts, with one line naming the path."""
    pytester.makeconftest("import errno, os\n\n"
                          "def full(fd):\n    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))\n\n"
                          "os.fsync = full\n")
    pytester.makepyfile(COLLECTED_ONLY)
    reports = pytester.path / "reports"
    r = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--specdec-reports-dir={reports}")
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    r.stderr.fnmatch_lines([f"*specdec: cannot write server logs under {reports / 'logs'}: *No space left on device*"])
    assert "Traceback" not in r.stdout.str() + r.stderr.str()
    assert not list(pytester.path.rglob(".specdec-probe-*")) and not reports.exists()


def test_a_log_directory_in_the_way_is_one_line_at_start(pytester: pytest.Pytester) -> None:
    reports = pytester.path / "reports"
    reports.mkdir()
    (reports / "logs").write_text("a file, not a directory")
    pytester.makepyfile(COLLECTED_ONLY)
    r = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--specdec-reports-dir={reports}")
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    r.stderr.fnmatch_lines([f"*specdec: cannot write server logs under {reports / 'logs'}: *"])
    assert "Traceback" not in r.stdout.str() + r.stderr.str()


def test_a_server_log_that_cannot_be_written_is_one_line_and_leaves_no_empty_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, registry: Path) -> None:
    """The disk fills during the session: the next start is a one-line error naming the log, nothing is
    spawned, and the 0-byte log it opened is removed."""
    import pytest_specdec.servers.process as process

    class Full:
        def __init__(self, path: Path, mode: str) -> None:
            self.f = open(path, mode)  # noqa: SIM115 - closed in close()

        def write(self, data: bytes) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def close(self) -> None:
            self.f.close()

    monkeypatch.setattr(process, "open", Full, raising=False)
    server = VllmServer(ServerSpec(model="m"), log_dir=tmp_path / "logs", launcher=["false"])
    with pytest.raises(ServerStartError) as err:
        server.start()
    message = str(err.value)
    assert "\n" not in message and "No space left on device" in message and str(tmp_path / "logs") in message
    assert server.proc is None and list((tmp_path / "logs").iterdir()) == []


def test_the_watchdog_stops_a_group_that_ignores_sigterm_once_its_owner_is_gone(tmp_path: Path) -> None:
    """The owner is gone: SIGTERM, then SIGKILL after the grace; the registry entry goes. A group that is
    gone on its own ends the watch with nothing killed."""
    from pytest_specdec.servers.watchdog import watch

    gone = subprocess.Popen(["true"])
    gone.wait()
    server = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                               "signal.SIG_IGN); print(1, flush=True); time.sleep(300)"],
                              stdout=subprocess.PIPE, start_new_session=True)
    assert server.stdout is not None and server.stdout.readline()  # SIGTERM is ignored from here on
    entry = tmp_path / "entry.json"
    entry.write_text("{}")
    try:
        t0 = time.monotonic()
        assert watch(f"{gone.pid}:1", server.pid, str(entry), poll_s=0.05, grace_s=0.5)
        assert server.wait(timeout=5) == -signal.SIGKILL and time.monotonic() - t0 < 3 and not entry.exists()
    finally:
        server.kill()
        server.wait()
        server.stdout.close()
    done = subprocess.Popen(["true"], start_new_session=True)
    done.wait()
    entry.write_text("{}")
    assert not watch(owner_tag(os.getpid()), done.pid, str(entry), poll_s=0.05) and not entry.exists()


def test_a_sigkilled_owner_not_yet_reaped_is_gone() -> None:
    """A SIGKILLed pytest whose parent has not reaped it is a zombie: its servers are strays all the same."""
    from pytest_specdec.servers.hygiene import owner_alive

    owner = subprocess.Popen(["sleep", "300"])
    tag = owner_tag(owner.pid)
    assert owner_alive(tag) and not owner_alive(f"{owner.pid}:1")  # a reused pid is another process
    owner.kill()
    while not _gone(owner.pid, 5):
        pass
    assert not owner_alive(tag)
    owner.wait()
