"""Server lifecycle against a fake `vllm serve`: readiness, crash, deadline, group kill, config."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pytest_specdec.errors import ServerStartError
from pytest_specdec.server import ServerSpec, VllmServer, build_command, parse_engine_config

FAKE = [sys.executable, str(Path(__file__).with_name("fake_vllm.py"))]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); read its state.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _server(tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch, timeout: float = 30) -> VllmServer:
    monkeypatch.setenv("FAKE_VLLM_MODE", mode)
    monkeypatch.setenv("FAKE_VLLM_CHILD_PID_FILE", str(tmp_path / "child.pid"))
    spec = ServerSpec(model="m", speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    return VllmServer(spec, log_dir=tmp_path, launcher=FAKE, startup_timeout_s=timeout)


def test_command_binds_loopback_and_pins_generation_config() -> None:
    spec = ServerSpec(model="/m", speculative_config={"method": "eagle3", "model": "/h", "num_speculative_tokens": 3},
                      args=("--dtype", "float32"))
    cmd = build_command(spec, 1234, launcher=["vllm"])
    assert cmd[:3] == ["vllm", "serve", "/m"]
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--generation-config") + 1] == "vllm"
    assert json.loads(cmd[cmd.index("--speculative-config") + 1])["method"] == "eagle3"
    assert cmd[-2:] == ["--dtype", "float32"]
    reference = build_command(ServerSpec(model="/m"), 1, launcher=["vllm"])
    assert "--speculative-config" not in reference


def test_start_ready_then_stop_kills_the_whole_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = _server(tmp_path, "slow", monkeypatch)
    with server:
        assert server.alive()
        assert server.startup_s is not None and server.startup_s >= 1.0
        child = int((tmp_path / "child.pid").read_text())
        assert _alive(child)
        config = server.engine_config()
        assert config["vllm_version"] == "0.0.0-fake"
        assert config["enable_prefix_caching"] == "True"
        assert config["compilation_config"].startswith("{")
    assert not server.alive()
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child), "a process of the server's group survived stop()"


def test_crash_while_starting_raises_with_log_tail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = _server(tmp_path, "crash", monkeypatch)
    t0 = time.monotonic()
    with pytest.raises(ServerStartError) as info:
        server.start()
    assert time.monotonic() - t0 < 20, "a crash must be noticed before the deadline"
    message = str(info.value)
    assert "exited with code 3" in message
    assert "fake engine failed to start" in message  # the log tail
    assert f"port: {server.port}" in message and "command:" in message


def test_deadline_stops_the_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = _server(tmp_path, "hang", monkeypatch, timeout=2)
    with pytest.raises(ServerStartError, match="not ready after 2 s"):
        server.start()
    assert not server.alive()


def test_parse_engine_config_ignores_other_lines() -> None:
    assert parse_engine_config("nothing here\n") == {}


def test_pool_reuses_per_spec_and_respects_the_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_specdec.pool import ServerPool

    monkeypatch.setenv("FAKE_VLLM_MODE", "ok")
    monkeypatch.setenv("FAKE_VLLM_CHILD_PID_FILE", str(tmp_path / "child.pid"))
    lines: list[str] = []
    pool = ServerPool(tmp_path, max_alive=1, startup_timeout_s=30, progress=lines.append, launcher=FAKE)
    ngram = ServerSpec(model="m", speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    reference = ServerSpec(model="m")
    try:
        first = pool.get(ngram)
        assert pool.get(ServerSpec(model="m", speculative_config={"method": "ngram", "num_speculative_tokens": 3})) is first
        pool.get(reference)  # the cap of 1 stops the ngram server first
        assert not first.alive()
        assert any("to stay within --specdec-max-servers=1" in line for line in lines)
        assert [s.method for s in pool.starts] == ["ngram", "none"]
    finally:
        pool.stop_all()
    assert not any(server.alive() for server in pool.servers.values())


def test_wait_quiet_waits_for_busy_servers_and_gives_up_at_the_deadline() -> None:
    from pytest_specdec.server import wait_quiet

    hz = os.sysconf("SC_CLK_TCK")
    clock = [0.0]

    def sleep(s: float) -> None:
        clock[0] += s

    def busy_then_idle(busy_windows: int) -> Any:
        used = [0]

        def ticks(pgids: set[int]) -> int:
            # A spinning process uses a whole core per window, then nothing once its busy loop ends.
            if clock[0] <= busy_windows * 0.2 + 1e-9:
                used[0] += int(hz * 0.2)
            return used[0]
        return ticks

    q = wait_quiet({123}, ticks=busy_then_idle(5), sleep=sleep, clock=lambda: clock[0])
    assert q.quiet and 1.0 <= q.waited_s <= 1.4 and q.cores == 0.0
    clock[0] = 0.0
    q = wait_quiet({123}, timeout_s=0.5, ticks=busy_then_idle(100), sleep=sleep, clock=lambda: clock[0])
    assert not q.quiet and q.waited_s >= 0.5 and q.cores >= 0.9
    assert wait_quiet(set()).quiet and wait_quiet({1}, timeout_s=0).waited_s == 0.0


def test_group_cpu_ticks_sees_a_spinning_child() -> None:
    from pytest_specdec.server import group_cpu_ticks, wait_quiet

    child = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
    try:
        time.sleep(0.3)
        a = group_cpu_ticks({child.pid})
        time.sleep(0.3)
        assert group_cpu_ticks({child.pid}) > a
        q = wait_quiet({child.pid}, timeout_s=0.4)
        assert not q.quiet and q.cores > 0.3
    finally:
        child.kill()
        child.wait()
    assert wait_quiet({child.pid}, timeout_s=1.0).quiet  # gone: nothing left to wait for


# --- cpu profiles: servers on their own CPUs -------------------------------------------------------------
def test_split_cpus_leaves_the_first_to_the_client() -> None:
    from pytest_specdec.pool import format_cpus, split_cpus

    assert split_cpus(1, [0, 1]) == frozenset({1})
    assert split_cpus(2, [4, 0, 7, 5]) == frozenset({5, 7})  # in CPU order, whatever the affinity's order
    assert split_cpus(1, [3]) is None  # nothing would be left for the servers: not pinned
    assert split_cpus(0, [0, 1]) is None
    assert [format_cpus(c) for c in ({1}, {1, 3}, {2, 3, 4, 5}, {0, 2, 3, 7})] == ["1", "1,3", "2-5", "0,2-3,7"]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to split")
def test_pool_starts_cpu_servers_on_the_server_cpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_VLLM_CHILD_PID_FILE", str(tmp_path / "child.pid"))
    from pytest_specdec.pool import ServerPool, split_cpus

    cpus = split_cpus(1)
    assert cpus is not None
    lines: list[str] = []
    pool = ServerPool(tmp_path / "logs", max_alive=2, startup_timeout_s=30, launcher=FAKE,
                      progress=lines.append, server_cpus=cpus)
    try:
        server = pool.get(ServerSpec(model="m"))
        assert server.proc is not None and os.sched_getaffinity(server.proc.pid) == set(cpus)
    finally:
        pool.stop_all()
    from pytest_specdec.pool import format_cpus

    assert any(line.endswith(f"on CPU {format_cpus(cpus)} ...") for line in lines), lines
