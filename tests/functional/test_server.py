"""Server lifecycle against a fake `vllm serve`: readiness, crash, deadline, group kill, config."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fakes import LAUNCHER, FakeConfig, FakeServer, resolve_speculative_config
from pytest_specdec.errors import ServerStartError
from pytest_specdec.output.schema import quiet_entry
from pytest_specdec.servers.process import VllmServer
from pytest_specdec.vllm.command import ServerSpec, build_command
from pytest_specdec.vllm.engine_config import (
    engine_config_from_server_info,
    parse_config_line,
    parse_engine_config,
)

DATA = Path(__file__).resolve().parents[1] / "data"
ZOO = "/work/main/pytest_specdec/zoo/models"  # where the fixtures below were captured


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
    """A server whose `vllm serve` is the stand-in in lifecycle mode `mode`, as a vLLM without /server_info."""
    monkeypatch.setenv("FAKE_VLLM_MODE", mode)
    monkeypatch.setenv("FAKE_VLLM_LEGACY", "1")
    monkeypatch.setenv("FAKE_VLLM_CHILD_PID_FILE", str(tmp_path / "child.pid"))
    spec = ServerSpec(model="m", speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    return VllmServer(spec, log_dir=tmp_path, launcher=LAUNCHER, startup_timeout_s=timeout)


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
        # A legacy stand-in has no /server_info (404, as vLLM without VLLM_SERVER_DEV_MODE): the log line's config.
        assert server.server_info_s is not None and not server.config_path.exists()
        assert config["config_source"] == "log" and config["vllm_version"] == "0.0.0-fake"
        assert config["model"] == "m"  # not the `model=` inside SpeculativeConfig(...)
        assert config["enable_prefix_caching"] is True and config["max_model_len"] == 1024
        assert config["compilation_level"] == 3
        assert config["speculative_config"] == {"method": "ngram", "model": None, "num_speculative_tokens": 3}
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


def test_a_server_killed_while_starting_is_named_by_the_signal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An OOM kill during start-up reads as the signal, as a dead server's line does, not as "code -9"."""
    import signal

    server = _server(tmp_path, "hang", monkeypatch)
    server.on_spawn = lambda pid: os.kill(pid, signal.SIGKILL)
    with pytest.raises(ServerStartError, match=r"was killed by signal 9 \(SIGKILL\) while starting"):
        server.start()


def test_a_second_ctrl_c_while_a_failed_start_cleans_up_still_stops_the_server(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C during start-up, then again while the half-started server is stopped: it is stopped all the
    same, and the interrupt comes after."""
    import signal

    server = _server(tmp_path, "hang", monkeypatch)
    pids: list[int] = []

    def first_ctrl_c(pid: int) -> None:
        pids.append(pid)
        raise KeyboardInterrupt

    stop = server.stop

    def stop_with_a_second_ctrl_c(grace_s: float = 20.0) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        stop(grace_s)

    server.on_spawn = first_ctrl_c
    server.stop = stop_with_a_second_ctrl_c  # type: ignore[method-assign]  # patching for the test
    with pytest.raises(KeyboardInterrupt):
        server.start()
    assert pids and not _alive(pids[0]), "the half-started server survived the second Ctrl-C"


def test_a_ctrl_c_while_servers_start_together_stops_every_one_of_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """servers/together.py: Ctrl-C after the first of two servers was launched stops that one too (it was never
    ready, so no pool knows it), and the interrupt comes after."""
    from pytest_specdec.servers.together import start_together

    first, second = _server(tmp_path / "a", "hang", monkeypatch), _server(tmp_path / "b", "hang", monkeypatch)
    pids: list[int] = []

    def ctrl_c(pid: int) -> None:
        pids.append(pid)
        raise KeyboardInterrupt

    first.on_spawn, second.on_spawn = pids.append, ctrl_c
    with pytest.raises(KeyboardInterrupt):
        start_together([first, second])
    assert len(pids) == 2 and not any(_alive(pid) for pid in pids), "a server launched together survived Ctrl-C"


def test_a_port_taken_before_vllm_binds_it_is_retried_and_each_start_keeps_its_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process binds the chosen port first: the start is retried on a new port, and the failed
    start's log (which says why) is kept beside the new one."""
    import socket

    from pytest_specdec.servers import process

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    ports = iter([taken.getsockname()[1]])
    real = process.free_port
    monkeypatch.setattr(process, "free_port", lambda host="127.0.0.1": next(ports, None) or real(host))
    server = _server(tmp_path, "ok", monkeypatch)
    try:
        with server:
            assert server.alive() and server.port != taken.getsockname()[1]
            logs = sorted(tmp_path.glob("vllm-ngram-*.log"))
            assert [p.name.rsplit("-", 1)[1] for p in logs] == ["1.log", "2.log"]
            assert "address already in use" in logs[0].read_text().lower()
            assert server.log_path == logs[1]
    finally:
        taken.close()


def test_an_owned_server_answers_only_the_key_it_was_started_with(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The pool gives each start a new key (vLLM's VLLM_API_KEY, not a flag `ps` would show): another
    local user cannot drive load into the server and skew its counters."""
    import urllib.error
    import urllib.request

    from pytest_specdec.servers.pool import ServerPool

    monkeypatch.setenv("FAKE_VLLM_MODE", "ok")
    pool = ServerPool(tmp_path, 1, 30.0, launcher=LAUNCHER)
    spec = ServerSpec(model="m")
    try:
        first = pool.get(spec)
        key = first.api_key
        assert key and len(key) >= 24 and key not in " ".join(first.command)
        url = f"{first.base_url}/v1/models"
        with pytest.raises(urllib.error.HTTPError) as denied:
            urllib.request.urlopen(url, timeout=10)
        assert denied.value.code == 401
        denied.value.close()
        with urllib.request.urlopen(urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"}),
                                    timeout=10) as ok:
            assert ok.status == 200
        pool.retire(spec, "a new start")
        assert pool.get(spec).api_key not in (None, key)
    finally:
        pool.stop_all()


def test_deadline_stops_the_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = _server(tmp_path, "hang", monkeypatch, timeout=2)
    with pytest.raises(ServerStartError, match="not ready after 2 s"):
        server.start()
    assert not server.alive()


def test_parse_engine_config_ignores_other_lines() -> None:
    assert parse_engine_config("nothing here\n") == {}


# --- engine config: /server_info and the log line ------------------------------------------------------
#: The flat engine config of the eagle3 zoo server (cpu profile) as vLLM 0.32's /server_info gave it;
#: tests/data/vllm_0.32_server_info_eagle3.json is that answer (env values and host details trimmed).
EAGLE3_SERVER_INFO = {
    "config_source": "server_info", "vllm_version": "0.32.0",
    "model": f"{ZOO}/target", "served_model_name": f"{ZOO}/target", "tokenizer": f"{ZOO}/target",
    "revision": None, "dtype": "float32", "max_model_len": 1024, "seed": 0, "quantization": None,
    "enforce_eager": True, "trust_remote_code": False, "generation_config": "vllm",
    "kv_cache_dtype": "auto", "block_size": 128, "enable_prefix_caching": True, "gpu_memory_utilization": 0.92,
    "max_num_batched_tokens": 2048, "max_num_seqs": 16, "enable_chunked_prefill": True, "async_scheduling": False,
    "tensor_parallel_size": 1, "pipeline_parallel_size": 1, "data_parallel_size": 1, "device": "cpu",
    "load_format": "auto", "attention_backend": None,
    "compilation_mode": "NONE", "cudagraph_mode": "NONE", "cudagraph_capture_sizes": [],
    "max_cudagraph_capture_size": None,
    "speculative_config": {
        "method": "eagle3", "model": f"{ZOO}/eagle3", "num_speculative_tokens": 3, "draft_tensor_parallel_size": 1,
        "revision": None, "quantization": None, "max_model_len": None, "prompt_lookup_min": 0,
        "prompt_lookup_max": 0, "parallel_drafting": False, "disable_padded_drafter_batch": False,
        "rejection_sample_method": "standard", "draft_sample_method": "greedy",
    },
}


def _real_lines() -> list[str]:
    """vLLM 0.32's config lines of the zoo servers (cpu profile): none, ngram, draft_model, eagle3."""
    return (DATA / "vllm_0.32_config_lines.log").read_text().splitlines()


def test_server_info_of_real_vllm_is_flattened() -> None:
    info = json.loads((DATA / "vllm_0.32_server_info_eagle3.json").read_text())
    assert engine_config_from_server_info(info) == EAGLE3_SERVER_INFO
    assert engine_config_from_server_info({"vllm_config": "model=..."}) == {}  # config_format=text
    assert engine_config_from_server_info(None) == {}


def test_log_lines_of_real_vllm_keep_nested_values_whole() -> None:
    none, ngram, draft, eagle3 = (parse_engine_config(line) for line in _real_lines())
    for config in (none, ngram, draft, eagle3):
        assert config["model"] == f"{ZOO}/target"  # the target, never the draft's path
        assert config["config_source"] == "log" and config["vllm_version"] == "0.32.0"
        assert config["max_model_len"] == 1024 and config["dtype"] == "float32" and config["enforce_eager"] is True
        assert (config["cudagraph_mode"], config["cudagraph_capture_sizes"]) == ("NONE", [])
        # The line has no scheduler limits: absent, not guessed.
        assert "max_num_batched_tokens" not in config and "max_num_seqs" not in config
    assert none["speculative_config"] is None
    assert ngram["speculative_config"] == {"method": "ngram", "model": None, "num_speculative_tokens": 3}
    assert draft["speculative_config"] == {"method": "draft_model", "model": f"{ZOO}/draft",
                                           "num_speculative_tokens": 3}
    assert eagle3["speculative_config"] == {"method": "eagle3", "model": f"{ZOO}/eagle3", "num_speculative_tokens": 3}


def test_log_line_and_server_info_agree_on_what_both_show() -> None:
    # The eagle3 line and the /server_info answer come from the same server start.
    from_log = parse_engine_config(_real_lines()[3])
    for key, value in from_log.items():
        if key == "speculative_config":
            assert value.items() <= EAGLE3_SERVER_INFO[key].items()
        elif key != "config_source":
            assert EAGLE3_SERVER_INFO[key] == value, key


def test_config_line_values_nested_to_any_depth() -> None:
    raw = _real_lines()[3].split(" with config: ", 1)[1]
    parsed = parse_config_line(raw)
    assert parsed["speculative_config"] == {"method": "eagle3", "model": f"{ZOO}/eagle3", "num_spec_tokens": 3}
    assert parsed["kernel_config"]["ir_op_priority"] == {"rms_norm": ["native"], "fused_add_rms_norm": ["native"],
                                                          "gelu_and_mul_sparse": ["native"]}
    assert parsed["kernel_config"]["linear_backend_per_quant"] is None
    assert parsed["aux_output_config"] == {"enable_return_routed_experts": False, "max_bytes": None}
    # <DynamicShapesType.BACKED: 'backed'> → its name
    assert parsed["compilation_config"]["dynamic_shapes_config"]["type"] == "BACKED"
    assert parsed["served_model_name"] == f"{ZOO}/target"  # unquoted in the line
    assert parsed["device_config"] == "cpu" and parsed["tokenizer_mode"] == "auto"
    # Quotes, brackets and commas inside values; a quote inside an unquoted path opens no string.
    odd = parse_config_line("a='x, (y]', b=Foo(c=[1, (2, 3)], d={'e': 'f)'}), g=/m/it's, h=None, i=P('/x')")
    assert odd == {"a": "x, (y]", "b": {"c": [1, (2, 3)], "d": {"e": "f)"}}, "g": "/m/it's", "h": None,
                   "i": "P('/x')"}


def test_compilation_config_that_is_no_literal_is_read_by_pattern() -> None:
    # Shaped like a CUDA build's line (constructed): graphs captured, and a value literal_eval cannot read.
    line = ("INFO Initializing a V1 LLM engine (v0.32.0) with config: model='/m', speculative_config=None, "
            "compilation_config={'mode': <CompilationMode.VLLM_COMPILE: 3>, 'cache_dir': PosixPath('/c'), "
            "'cudagraph_mode': <CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>, 'cudagraph_capture_sizes': [1, 2, 4, 512], "
            "'max_cudagraph_capture_size': 512}, seed=0")
    config = parse_engine_config(line)
    assert (config["compilation_mode"], config["cudagraph_mode"]) == ("VLLM_COMPILE", "FULL_AND_PIECEWISE")
    assert config["cudagraph_capture_sizes"] == [1, 2, 4, 512] and config["max_cudagraph_capture_size"] == 512
    assert config["model"] == "/m" and config["seed"] == 0


def test_owned_server_config_comes_from_server_info(tmp_path: Path) -> None:
    spec = ServerSpec(model="fake-model", speculative_config={"method": "draft_model", "model": "/fake/draft",
                                                              "num_speculative_tokens": 3},
                      args=("--max-num-batched-tokens", "256", "--max-num-seqs", "16", "--seed", "0"))
    with VllmServer(spec, log_dir=tmp_path, launcher=LAUNCHER, startup_timeout_s=30) as server:
        assert server.dev_mode and server.server_info_s is not None
        config = server.engine_config()
        assert config["config_source"] == "server_info"
        assert (config["max_num_batched_tokens"], config["max_num_seqs"], config["model"]) == (256, 16, "fake-model")
        assert config["cudagraph_capture_sizes"] == [1, 2, 4, 8, 16]
        assert config["cudagraph_mode"] == "FULL_AND_PIECEWISE"
        assert config["speculative_config"]["model"] == "/fake/draft"
        assert config["speculative_config"]["num_speculative_tokens"] == 3
        assert json.loads(server.config_path.read_text())["scheduler_config"]["max_num_batched_tokens"] == 256
        config["model"] = "edited"
        assert server.engine_config()["model"] == "fake-model"  # callers get copies
    assert server.engine_config()["config_source"] == "server_info"  # still known after the stop
    # The report's regime lines read the flat keys (capture size from the graphs, then the token budget).
    from pytest_specdec.output.sweeps import regime_limits

    assert regime_limits({"engine_config": config, "command": []}) == [
        (16, "CUDA-graph capture size"), (256, "max_num_batched_tokens")]


def test_dev_mode_only_on_loopback_and_unless_the_spec_says_otherwise(tmp_path: Path) -> None:
    off = ServerSpec(model="fake-model", env=(("VLLM_SERVER_DEV_MODE", "0"),))
    with VllmServer(off, log_dir=tmp_path, launcher=LAUNCHER, startup_timeout_s=30) as server:
        assert not server.dev_mode and server.server_info_s is None
        config = server.engine_config()
        assert config["config_source"] == "log" and config["model"] == "fake-model"
        assert config["speculative_config"] is None and config["max_cudagraph_capture_size"] == 16
    assert not VllmServer(ServerSpec(model="m", host="0.0.0.0"), log_dir=tmp_path).dev_mode
    assert VllmServer(ServerSpec(model="m", host="localhost"), log_dir=tmp_path).dev_mode


def test_fake_server_info_has_vllm_shape() -> None:
    served = {"method": "eagle3", "model": "/h", "num_speculative_tokens": 3}
    with FakeServer(FakeConfig(model="t", k=3, acceptance=(0.5, 0.4, 0.3), server_info=json.dumps(served))) as url:
        from pytest_specdec.servers.http import server_info

        info = server_info(url, None)
    real = json.loads((DATA / "vllm_0.32_server_info_eagle3.json").read_text())
    assert info is not None and set(info) == set(real)
    assert set(info["vllm_config"]) <= set(real["vllm_config"])
    for section, fields in info["vllm_config"].items():
        if isinstance(fields, dict) and section != "speculative_config":
            assert set(fields) <= set(real["vllm_config"][section]), section
    config = engine_config_from_server_info(info)
    assert config["model"] == "t" and config["speculative_config"] == served
    # The stand-in's resolved speculative config: vLLM's fields, nested configs included.
    resolved = resolve_speculative_config({"method": "draft_model", "model": "/d", "num_speculative_tokens": 2}, "t")
    real_sc = real["vllm_config"]["speculative_config"]
    assert resolved is not None and set(resolved) <= set(real_sc)
    assert set(resolved["target_model_config"]) <= set(real_sc["target_model_config"])
    assert set(resolved["draft_model_config"]) <= set(real_sc["draft_model_config"])


def test_pool_reuses_per_spec_and_respects_the_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_specdec.servers.pool import ServerPool

    monkeypatch.setenv("FAKE_VLLM_MODE", "ok")
    monkeypatch.setenv("FAKE_VLLM_CHILD_PID_FILE", str(tmp_path / "child.pid"))
    lines: list[str] = []
    pool = ServerPool(tmp_path, max_alive=1, startup_timeout_s=30, progress=lines.append, launcher=LAUNCHER)
    ngram = ServerSpec(model="m", speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    reference = ServerSpec(model="m")
    try:
        first = pool.get(ngram)
        same = ServerSpec(model="m", speculative_config={"method": "ngram", "num_speculative_tokens": 3})
        assert pool.get(same) is first
        pool.get(reference)  # the cap of 1 stops the ngram server first
        assert not first.alive()
        assert any("to stay within --specdec-max-servers=1" in line for line in lines)
        assert [s.method for s in pool.starts] == ["ngram", "none"]
    finally:
        pool.stop_all()
    assert not any(server.alive() for server in pool.servers.values())


def test_group_cpu_ticks_sees_a_spinning_child() -> None:
    from pytest_specdec.servers.quiet import group_cpu_ticks, wait_idle

    child = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
    try:
        time.sleep(0.3)
        a = group_cpu_ticks({child.pid})
        time.sleep(0.3)
        assert group_cpu_ticks({child.pid}) > a
        q = wait_idle({child.pid}, timeout_s=0.4)
        assert not q.quiet and q.cores > 0.3
    finally:
        child.kill()
        child.wait()
    assert wait_idle({child.pid}, timeout_s=1.0).quiet  # gone: nothing left to wait for


# --- cpu profiles: servers on their own CPUs -------------------------------------------------------------
def test_split_cpus_leaves_the_first_to_the_client() -> None:
    from pytest_specdec.servers.pool import format_cpus, split_cpus

    assert split_cpus(1, [0, 1]) == frozenset({1})
    assert split_cpus(2, [4, 0, 7, 5]) == frozenset({5, 7})  # in CPU order, whatever the affinity's order
    assert split_cpus(1, [3]) is None  # nothing would be left for the servers: not pinned
    assert split_cpus(0, [0, 1]) is None
    assert [format_cpus(c) for c in ({1}, {1, 3}, {2, 3, 4, 5}, {0, 2, 3, 7})] == ["1", "1,3", "2-5", "0,2-3,7"]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to split")
def test_pool_starts_cpu_servers_on_the_server_cpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_VLLM_CHILD_PID_FILE", str(tmp_path / "child.pid"))
    from pytest_specdec.servers.pool import ServerPool, split_cpus

    cpus = split_cpus(1)
    assert cpus is not None
    lines: list[str] = []
    pool = ServerPool(tmp_path / "logs", max_alive=2, startup_timeout_s=30, launcher=LAUNCHER,
                      progress=lines.append, server_cpus=cpus)
    try:
        server = pool.get(ServerSpec(model="m"))
        assert server.proc is not None and os.sched_getaffinity(server.proc.pid) == set(cpus)
    finally:
        pool.stop_all()
    from pytest_specdec.servers.pool import format_cpus

    assert any(line.endswith(f"on CPU {format_cpus(cpus)} ...") for line in lines), lines


def _nice(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[16])  # field 19 of proc(5): nice


def test_pool_lowers_the_servers_priority_and_their_sessions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """[placement] server_nice: the server, its children and (under autogroups) its session get the nice
    value, so the client is scheduled first; the client's own priority is untouched."""
    monkeypatch.setenv("FAKE_VLLM_MODE", "ok")
    monkeypatch.setenv("FAKE_VLLM_CHILD_PID_FILE", str(tmp_path / "child.pid"))
    from pytest_specdec.servers.pool import ServerPool

    pool = ServerPool(tmp_path / "logs", max_alive=1, startup_timeout_s=30, launcher=LAUNCHER, server_nice=7)
    try:
        server = pool.get(ServerSpec(model="m"))
        assert server.proc is not None
        child = int((tmp_path / "child.pid").read_text())
        assert _nice(server.proc.pid) == 7 and _nice(child) == 7 and _nice(os.getpid()) == os.nice(0)
        group = Path(f"/proc/{server.proc.pid}/autogroup")
        if group.exists():
            assert server.priority == {"nice": 7, "autogroup": True}
            assert group.read_text().split()[-1] == "7"  # "/autogroup-N nice 7"
        else:
            assert server.priority == {"nice": 7, "autogroup": None}
    finally:
        pool.stop_all()
    plain = ServerPool(tmp_path / "logs2", max_alive=1, startup_timeout_s=30, launcher=LAUNCHER)
    try:
        server = plain.get(ServerSpec(model="m"))
        assert server.proc is not None and _nice(server.proc.pid) == os.nice(0) and server.priority is None
    finally:
        plain.stop_all()


def test_listening_pgids_finds_the_group_of_a_loopback_server() -> None:
    """Endpoint mode's settle step: the hand-started server behind a loopback port, found by its socket."""
    import socket
    import subprocess
    import sys

    from pytest_specdec.servers.process import free_port
    from pytest_specdec.servers.quiet import listening_pgids

    port = free_port()
    code = (f"import socket, time; s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen(); "
            "print('up', flush=True); time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == b"up"
        assert listening_pgids(port) == {p.pid}
    finally:
        p.kill()
        p.wait()
        assert p.stdout is not None
        p.stdout.close()
    assert listening_pgids(port) == set()
    with socket.socket() as s:  # connected, not listening: not a server
        s.bind(("127.0.0.1", 0))
        assert listening_pgids(s.getsockname()[1]) == set()


def test_settle_looks_for_an_endpoints_processes_again_only_once_they_are_gone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Endpoint mode's settle step keeps the groups found behind a loopback port while they live (the look reads
    every TCP socket of the host, each run) and looks again once the server behind it was restarted."""
    import subprocess
    import sys

    from pytest_specdec.servers import quiet
    from pytest_specdec.servers.endpoints import settle
    from pytest_specdec.servers.process import free_port

    port = free_port()
    looks: list[set[int]] = []

    def counted(at: int) -> set[int]:
        looks.append(found := listening(at))
        return found

    listening = quiet.listening_pgids
    monkeypatch.setattr(quiet, "listening_pgids", counted)

    def server() -> subprocess.Popen[bytes]:
        code = (f"import http.server as h; s = h.HTTPServer(('127.0.0.1', {port}), h.BaseHTTPRequestHandler); "
                "print('up', flush=True); s.serve_forever()")
        p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             start_new_session=True)
        assert p.stdout is not None and p.stdout.readline().strip() == b"up"
        return p

    def stop(p: subprocess.Popen[bytes]) -> None:
        p.kill()
        p.wait()
        assert p.stdout is not None
        p.stdout.close()

    wait = settle([f"http://127.0.0.1:{port}/v1"], timeout_s=3.0)
    first = server()
    try:
        assert [wait(None, None).how for _ in range(3)] == ["cpu"] * 3
        assert looks == [{first.pid}]
    finally:
        stop(first)
    second = server()
    try:
        assert wait(None, None).how == "cpu"
        assert looks == [{first.pid}, {second.pid}]
    finally:
        stop(second)


def test_idle_delay_is_recorded_as_a_delay() -> None:
    from pytest_specdec.servers.quiet import idle_delay

    waited: list[float] = []
    q = idle_delay(0.5, sleep=waited.append)
    assert waited == [0.5] and quiet_entry(q) == {"waited_s": 0.5, "quiet": True, "cores": 0.0, "how": "delay",
                                               "requests": None, "after_run_s": None}


def test_pool_never_starts_two_servers_at_once_on_one_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan asks only for groups whose leases share no GPU (tests/unit/test_start_plan.py); where the leases
    place two on one GPU anyway (0.2 each, co-residence first), the pool starts neither at once: vLLM sizes its KV
    cache from the memory free while it profiles, and on an H200 the second of two such starts found none. Both
    leases go back, nothing is recorded as started, and each starts alone when a test asks for it."""
    monkeypatch.setenv("FAKE_VLLM_MODE", "ok")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    from pytest_specdec.servers.gpus import GpuPool
    from pytest_specdec.servers.pool import ServerPool

    lines: list[str] = []
    gpus = GpuPool(tmp_path / "leases", ("0", "1"))
    pool = ServerPool(tmp_path / "logs", max_alive=2, startup_timeout_s=30, launcher=LAUNCHER, progress=lines.append,
                      gpus=gpus)
    a = ServerSpec(model="m", args=("--gpu-memory-utilization", "0.2"))
    b = ServerSpec(model="m", args=("--gpu-memory-utilization", "0.2", "--seed", "1"))
    try:
        pool.start_together([a, b], [])
        assert not [line for line in lines if "together" in line], lines
        assert pool.servers == {} and pool.starts == []
        probe = gpus.acquire(1, "probe", 0, fraction=1.0)
        assert probe.gpus == ("0",)  # both leases were given back
        gpus.release(probe)
        pool.get(a)
        pool.get(b)
        assert [s.gpus for s in pool.starts] == ["0", "0"] and [s.group for s in pool.starts] == [None, None]
    finally:
        pool.stop_all()
