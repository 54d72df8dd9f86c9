"""Process hygiene: no server outlives the session that started it, whatever way that session ends."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pytest_specdec.servers.hygiene import LOGS_ENV, OWNER_ENV, find_strays, owner_tag, remove_strays, shielded
from pytest_specdec.servers.process import is_loopback, terminate_group


def _gone(pid: int, within_s: float = 10.0) -> bool:
    """Whether `pid` has exited (a zombie waiting for its reaper counts as gone)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


def test_loopback_is_parsed_not_prefix_matched() -> None:
    for host in ("127.0.0.1", "127.8.9.10", "::1", "[::1]", "localhost", "LOCALHOST", "localhost."):
        assert is_loopback(host), host
    for host in ("::1:2", "::100", "localhost.example.com", "localhost-gpu01", "127.example.com", "0.0.0.0",
                 "10.0.0.1", "::", ""):
        assert not is_loopback(host), host


def test_a_dead_leaders_children_are_killed_with_its_group(tmp_path: Path) -> None:
    """The leader exits and is reaped; its child in the same group must still be killed."""
    pidfile = tmp_path / "child"
    proc = subprocess.Popen(["sh", "-c", f"sleep 300 & echo $! > {pidfile}; exit 3"], start_new_session=True)
    assert proc.wait(timeout=10) == 3  # reaped: os.getpgid(proc.pid) now fails
    child = int(pidfile.read_text())
    assert not _gone(child, 0.2)
    terminate_group(proc, grace_s=5)
    assert _gone(child)


def test_a_server_dies_with_a_sigkilled_parent(tmp_path: Path) -> None:
    """The parent-death signal: SIGKILL the process that started a server and the server gets SIGTERM."""
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent("""
        import subprocess, sys, time
        from pytest_specdec.servers.process import _preexec
        p = subprocess.Popen(["sleep", "300"], preexec_fn=_preexec(None, 0), start_new_session=True)
        print(p.pid, flush=True)
        time.sleep(300)
    """))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert not _gone(child, 0.2)
    parent.kill()
    parent.wait(timeout=10)
    parent.stdout.close()
    assert _gone(child)


def test_strays_of_a_gone_session_are_found_and_removed_but_not_a_live_ones(tmp_path: Path) -> None:
    logs = tmp_path / "reports" / "logs"

    def server(tag: str, where: Path = logs / "gw0", *args: str) -> subprocess.Popen[bytes]:
        command = [sys.executable, "-c", "import time; time.sleep(300)", *args] if args else ["sleep", "300"]
        return subprocess.Popen(command, env={**os.environ, OWNER_ENV: tag, LOGS_ENV: str(where)},
                                start_new_session=True)

    dead_owner = subprocess.Popen(["true"])
    dead_owner.wait()
    # The owner's pid with a start time no live process has; a secret in its command line.
    stray = server(f"{dead_owner.pid}:1", logs / "gw0", "--hf_token", "s3cret")
    ours = server(owner_tag(os.getpid()))
    elsewhere = server(f"{dead_owner.pid}:1", tmp_path / "other-project" / "logs")  # another project's
    try:
        time.sleep(0.2)
        found = {s.pid: s for s in find_strays(str(logs))}
        assert stray.pid in found and ours.pid not in found and elsewhere.pid not in found
        elsewhere.kill()
        assert found[stray.pid].line().startswith(f"pid {stray.pid} (started by pytest pid {dead_owner.pid}, now gone)")
        assert found[stray.pid].line().endswith("time.sleep(300) --hf_token <redacted>")  # the line is printed
        remove_strays([found[stray.pid]], grace_s=1)  # a zombie (our child, not yet reaped) still counts
        assert stray.wait(timeout=10) == -signal.SIGTERM
        assert ours.poll() is None
    finally:
        for p in (stray, ours, elsewhere):
            p.kill()
            p.wait()


def test_what_a_stray_server_left_behind_when_it_exited_is_found_and_removed(tmp_path: Path) -> None:
    """vLLM's engine core outlives a server that crashed: it is no group leader, but it carries the owner
    tag it inherited. Found once per group, by the same owner rules: a live session's is left alone."""
    logs = tmp_path / "reports" / "logs"

    def leftover(tag: str, name: str) -> tuple[int, int]:
        """(the exited server's pid, its child's) for a server that started a child and exited."""
        pidfile = tmp_path / name
        leader = subprocess.Popen(["sh", "-c", f"sleep 300 & sleep 301 & echo $! > {pidfile}; exit 0"],
                                  env={**os.environ, OWNER_ENV: tag, LOGS_ENV: str(logs)}, start_new_session=True)
        assert leader.wait(timeout=10) == 0  # and reaped: only its children are left in its group
        return leader.pid, int(pidfile.read_text())

    dead_owner = subprocess.Popen(["true"])
    dead_owner.wait()
    gone_group, child = leftover(f"{dead_owner.pid}:1", "gone")
    live_group, live_child = leftover(owner_tag(os.getpid()), "live")
    try:
        found = [s for s in find_strays(str(logs)) if s.group in (gone_group, live_group)]
        assert [s.group for s in found] == [gone_group]  # one line for the group's two children
        assert found[0].line().startswith(f"pid {found[0].pid} (started by pytest pid {dead_owner.pid}, now gone, "
                                          f"left by server pid {gone_group} that exited): sleep 30")
        remove_strays(found, grace_s=1)
        assert _gone(child) and not _gone(live_child, 0.2)
    finally:
        for group in (gone_group, live_group):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)


def test_a_second_interrupt_while_stopping_waits_until_the_servers_are_stopped() -> None:
    stopped = []
    with pytest.raises(KeyboardInterrupt, match="SIGINT while stopping"):
        with shielded():
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            stopped.append(True)  # reached: neither signal broke off the stopping
    assert stopped == [True]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL or callable(signal.getsignal(signal.SIGTERM))


def test_a_sigterm_that_the_load_swallowed_still_ends_the_session(monkeypatch: pytest.MonkeyPatch) -> None:
    """With SIGINT ignored (inherited by a job started in the background, or by an xdist worker's child) asyncio's
    runner does not take the signal, so the handler raises in whatever code runs: aiohttp once turned that into a
    failed request and the session measured on. The load raises it again once its event loop is done."""
    import asyncio

    from pytest_specdec.measure.client import run_coroutine
    from pytest_specdec.servers.hygiene import interrupt_on_termination

    monkeypatch.setattr(signal, "getsignal", lambda sig, real=signal.getsignal: (
        signal.SIG_IGN if sig == signal.SIGINT else real(sig)))
    undo = interrupt_on_termination()
    swallowed: list[str] = []

    async def load() -> str:
        try:  # what aiohttp's protocol callback does with an exception raised in it
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.sleep(0.05)
        except BaseException as exc:  # noqa: BLE001
            swallowed.append(repr(exc))
        return "run measured"

    try:
        with pytest.raises(KeyboardInterrupt, match="SIGTERM received"):
            run_coroutine(load())
    finally:
        undo()
    assert swallowed == ["KeyboardInterrupt('SIGTERM received')"]
    assert run_coroutine(asyncio.sleep(0, "the next session")) == "the next session"  # undo forgot it


class _Interrupted:
    """A server stand-in whose stop is interrupted by Ctrl-C: the user presses it again while it stops."""

    def __init__(self, name: str, stopped: list[str]) -> None:
        self.name, self.stopped = name, stopped

    def stop(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        self.stopped.append(self.name)


def test_a_ctrl_c_while_the_pool_stops_servers_stops_them_all(tmp_path: Path) -> None:
    """A second Ctrl-C during shutdown must not break off `stop_all` with servers left running."""
    from pytest_specdec.servers.pool import ServerPool

    stopped: list[str] = []
    pool = ServerPool(tmp_path, 2, 10.0)
    a, b = _Interrupted("a", stopped), _Interrupted("b", stopped)
    pool._alive.update(a=a, b=b)  # type: ignore[dict-item]  # stand-in servers, not VllmServers
    with pytest.raises(KeyboardInterrupt):
        pool.stop_all()
    assert sorted(stopped) == ["a", "b"] and not pool._alive


def test_a_ctrl_c_while_the_pool_retires_a_server_still_stops_it(tmp_path: Path) -> None:
    """A server taken out of the pool mid-session (retired, evicted, reaped) is stopped even when a Ctrl-C
    or SIGTERM comes in meanwhile: out of the pool, `stop_all` would never find it again."""
    from types import SimpleNamespace

    from pytest_specdec.servers.pool import ServerPool

    stopped: list[str] = []
    pool = ServerPool(tmp_path, 2, 10.0, progress=lambda line: None)
    pool._alive["k"] = _Interrupted("k", stopped)  # type: ignore[assignment]  # a stand-in, not a VllmServer
    with pytest.raises(KeyboardInterrupt):
        pool.retire(SimpleNamespace(key=lambda: "k", method="suffix"),  # type: ignore[arg-type]  # stand-in ServerSpec
                    "every prompt sent")
    assert stopped == ["k"] and not pool._alive


@pytest.mark.parametrize(("code", "says"), [
    (70, "exited with code 70"),
    (-9, "was killed by signal 9 (SIGKILL)"),  # Popen's convention; an OOM kill reads the same
    (-99, "was killed by signal 99 (unknown signal)"),
])
def test_a_dead_server_names_its_exit_code_or_the_signal_that_killed_it(code: int, says: str) -> None:
    """A failing test's message says how its server ended: "code -9" leaves the reader to know Popen."""
    from pytest_specdec.servers.pool import Death

    death = Death("abc", "ngram", code, Path("vllm-ngram-abc-1.log"), "")
    assert death.line() == f"vLLM (ngram, abc) {says} (log: vllm-ngram-abc-1.log)"
