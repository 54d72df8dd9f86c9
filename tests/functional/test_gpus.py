"""The GPU lease pool (pytest_specdec/servers/gpus.py) with fake GPU lists: disjoint leases under concurrent
worker processes, waiting, the timeout naming the holder, stale-lease reclaim, CPU pinning, and the
server pool starting (fake) vLLM servers on leased GPUs."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pytest_specdec.errors import ServerStartError
from pytest_specdec.servers.gpus import (
    GpuLeaseError,
    GpuPool,
    Lease,
    cpus_for,
    discover_gpus,
    gpu_local_cpus,
    gpus_needed,
    parse_cpulist,
    parse_gpu_list,
)
from pytest_specdec.servers.pool import ServerPool
from pytest_specdec.vllm.command import ServerSpec

GPUS = ("0", "1", "2", "3")
SPAWN = mp.get_context("spawn")  # no fork of a threaded pytest process


# --- helpers run in child processes (module level: spawn imports them) ---------------------------
def _churn(lease_dir: str, worker: int, rounds: int, out: Any) -> None:
    """Lease 1-2 of the fake GPUs at random, hold them a moment, release; report the intervals."""
    rng = random.Random(worker)
    waits: list[str] = []
    pool = GpuPool(Path(lease_dir), GPUS, poll_s=0.005)
    intervals = []
    for i in range(rounds):
        n = rng.choice((1, 2))
        lease = pool.acquire(n, f"worker{worker} round{i}", timeout_s=60, progress=waits.append)
        start = time.monotonic()
        time.sleep(rng.uniform(0.005, 0.03))
        end = time.monotonic()
        intervals.append((os.getpid(), lease.gpus, start, end))
        assert pool.release(lease)
    out.put((intervals, sum("waits for" in w for w in waits)))


def _hold(lease_dir: str, gpus: tuple[str, ...], owner: str, n: int, held: Any, release: Any,
          server_pid: int | None = None, clean: bool = True) -> None:
    """Lease n GPUs, say so, then release when told (or exit without releasing: a crash)."""
    pool = GpuPool(Path(lease_dir), gpus)
    lease = pool.acquire(n, owner, timeout_s=10)
    if server_pid is not None:
        lease = pool.attach(lease, server_pid)
    held.put(lease.gpus)
    if not clean:
        held.close()
        held.join_thread()  # the queue's feeder thread must flush before the hard exit
        os._exit(0)  # no release, like a worker killed by SIGKILL
    release.wait(30)
    pool.release(lease)


def overlaps(intervals: list[tuple[int, tuple[str, ...], float, float]]) -> list[tuple[Any, Any]]:
    """Pairs of leases of different processes that were held at the same time and share a GPU."""
    bad = []
    for i, a in enumerate(intervals):
        for b in intervals[i + 1:]:
            if a[0] != b[0] and a[2] < b[3] and b[2] < a[3] and set(a[1]) & set(b[1]):
                bad.append((a, b))
    return bad


# --- parsing and discovery -----------------------------------------------------------------------
def test_gpu_lists_parse_and_bad_ones_say_what_to_fix() -> None:
    assert parse_gpu_list("0, 1,2", "--specdec-gpus") == ("0", "1", "2")
    assert parse_gpu_list("GPU-8a2f,MIG-1c", "x") == ("GPU-8a2f", "MIG-1c")
    with pytest.raises(GpuLeaseError,
                       match=r"--specdec-gpus: expected comma-separated GPU ids like 0,1,2,3, got '0,,1'"):
        parse_gpu_list("0,,1", "--specdec-gpus")
    with pytest.raises(GpuLeaseError, match=r"GPU id\(s\) 1 given twice"):
        parse_gpu_list("1,0,1", "--specdec-gpus")


def test_discover_uses_cuda_visible_devices_then_nvidia_smi() -> None:
    def never(*a: Any, **k: Any) -> Any:
        raise AssertionError("nvidia-smi must not run when CUDA_VISIBLE_DEVICES is set")

    assert discover_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}, run=never) == ("2", "3")
    with pytest.raises(GpuLeaseError, match="CUDA_VISIBLE_DEVICES='' hides every GPU"):
        discover_gpus({"CUDA_VISIBLE_DEVICES": ""}, run=never)

    def smi(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        assert cmd[1:] == ["--query-gpu=index", "--format=csv,noheader"]
        return subprocess.CompletedProcess(cmd, 0, "0\n1\n2\n3\n4\n5\n6\n7\n", "")

    assert discover_gpus({}, run=smi, which=lambda name: "/usr/bin/nvidia-smi") == tuple(str(i) for i in range(8))
    with pytest.raises(GpuLeaseError,
                       match="nvidia-smi is not on PATH and CUDA_VISIBLE_DEVICES is unset; pass --specdec-gpus"):
        discover_gpus({}, run=smi, which=lambda name: None)

    def broken(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(cmd, 9, "", "NVIDIA-SMI has failed because it couldn't communicate")

    with pytest.raises(GpuLeaseError, match="listed no GPUs .exit 9: .NVIDIA-SMI has failed"):
        discover_gpus({}, run=broken, which=lambda name: "/usr/bin/nvidia-smi")


def test_gpus_needed_is_tp_times_pp_times_dp_with_the_drafts_tp() -> None:
    assert gpus_needed([], None) == 1
    assert gpus_needed(["--dtype", "bfloat16", "--tensor-parallel-size", "2"], None) == 2
    assert gpus_needed(["-tp", "2", "--pipeline-parallel-size=2", "-dp", "2"], None) == 8
    assert gpus_needed([], {"method": "eagle3", "draft_tensor_parallel_size": 2}) == 2
    assert gpus_needed(["-tp", "4"], {"method": "draft_model", "draft_tensor_parallel_size": 1}) == 4
    with pytest.raises(GpuLeaseError, match="--tensor-parallel-size two: expected a whole number >= 1"):
        gpus_needed(["--tensor-parallel-size", "two"], None)
    with pytest.raises(GpuLeaseError, match="draft_tensor_parallel_size must be a whole number >= 1, got 0"):
        gpus_needed([], {"draft_tensor_parallel_size": 0})


# --- leasing -------------------------------------------------------------------------------------
def test_concurrent_worker_processes_never_hold_the_same_gpu(tmp_path: Path) -> None:
    out = SPAWN.Queue()
    procs = [SPAWN.Process(target=_churn, args=(str(tmp_path), w, 12, out)) for w in range(6)]
    for p in procs:
        p.start()
    reports = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    intervals = [iv for ivs, _ in reports for iv in ivs]
    assert len(intervals) == 6 * 12
    assert len({iv[0] for iv in intervals}) == 6
    assert overlaps(intervals) == []
    # The check had something to check: leases of different processes did overlap in time (on other
    # GPUs), and processes had to wait for GPUs held by others.
    concurrent = sum(1 for i, a in enumerate(intervals) for b in intervals[i + 1:]
                     if a[0] != b[0] and a[2] < b[3] and b[2] < a[3])
    assert concurrent > 10, concurrent
    assert sum(w for _, w in reports) > 0
    assert json.loads((tmp_path / f"gpu-leases-{GpuPool(tmp_path, GPUS).host}.json").read_text())["leases"] == []


def test_the_overlap_check_catches_a_shared_gpu() -> None:
    assert overlaps([(1, ("0",), 0.0, 2.0), (2, ("1",), 1.0, 3.0), (3, ("0",), 2.0, 4.0)]) == []
    bad = [(1, ("0", "1"), 0.0, 2.0), (2, ("1", "2"), 1.0, 3.0)]
    assert overlaps(bad) == [(bad[0], bad[1])]


def test_servers_of_one_process_co_reside_and_others_get_other_gpus(tmp_path: Path) -> None:
    pool = GpuPool(tmp_path, GPUS)
    reference = pool.acquire(1, "main reference", timeout_s=1, fraction=0.45)
    spec = pool.acquire(1, "main spec", timeout_s=1, fraction=0.45)
    assert reference.gpus == spec.gpus == ("0",)  # the profile's memory split lets these two share
    wide = pool.acquire(2, "main tp2", timeout_s=1, fraction=0.1)
    assert wide.gpus == ("0", "1")  # GPUs it already holds first
    held, release = SPAWN.Queue(), SPAWN.Event()
    other = SPAWN.Process(target=_hold, args=(str(tmp_path), GPUS, "gw1", 2, held, release))
    other.start()
    try:
        assert held.get(timeout=30) == ("2", "3")
    finally:
        release.set()
        other.join(30)
    for lease in (reference, spec, wide):
        assert pool.release(lease)
    assert not pool.release(wide)  # a second release says so
    assert pool.holders() == []


def test_servers_too_large_to_share_get_gpus_of_their_own_and_never_wait_on_their_own_process(tmp_path: Path) -> None:
    """0.9 of each GPU: a process's second TP-2 server gets the other two GPUs; a third would wait on nothing but
    its own servers, so it fails at once (not after --specdec-gpu-wait), saying what to lower."""
    pool = GpuPool(tmp_path, GPUS, sleep=lambda s: pytest.fail("waited on its own servers"))
    reference = pool.acquire(2, "main reference", timeout_s=3600, fraction=0.9)
    spec = pool.acquire(2, "main spec", timeout_s=3600, fraction=0.9)
    assert (reference.gpus, spec.gpus) == (("0", "1"), ("2", "3"))
    with pytest.raises(GpuLeaseError, match=r"main third needs 2 GPU\(s\) with 0.9 of their memory free, which this "
                                            r"process's own servers leave nowhere on 0,1,2,3 .*waiting would not help: "
                                            r"lower --specdec-max-servers"):
        pool.acquire(2, "main third", timeout_s=3600, fraction=0.9)


def test_a_worker_waits_then_times_out_naming_the_holder(tmp_path: Path) -> None:
    held, release = SPAWN.Queue(), SPAWN.Event()
    owner = "gw1 suites/test_k.py::test_k[eagle3-k3-t0.0-c1] server ab12cd34ef56 (eagle3)"
    holder = SPAWN.Process(target=_hold, args=(str(tmp_path), ("0", "1"), owner, 2, held, release))
    holder.start()
    try:
        assert held.get(timeout=30) == ("0", "1")
        pool = GpuPool(tmp_path, ("0", "1"), poll_s=0.05)
        t0 = time.monotonic()
        with pytest.raises(GpuLeaseError) as exc:
            pool.acquire(1, "gw0 test_x server 0123456789ab (none)", timeout_s=0.5)
        assert 0.5 <= time.monotonic() - t0 < 5
        message = str(exc.value)
        assert message.startswith("gw0 test_x server 0123456789ab (none): no 1 free GPU(s) of 0,1 after 0 s; held by:")
        assert f"GPU 0,1: pid {holder.pid} on {pool.host}, {owner}, since 20" in message
        assert "run fewer xdist workers (-n) than GPU sets, or raise --specdec-gpu-wait" in message

        # Waiting: the holder lets go after a moment and the waiter gets the GPUs.
        said: list[str] = []
        timer = threading.Timer(0.6, release.set)
        timer.start()
        t0 = time.monotonic()
        lease = pool.acquire(2, "gw0 waiter", timeout_s=30, progress=said.append)
        waited = time.monotonic() - t0
        assert lease.gpus == ("0", "1") and 0.4 < waited < 20
        assert said and said[0].startswith("specdec: gw0 waiter waits for 2 GPU(s); held by:")
        assert f"pid {holder.pid}" in said[0] and owner in said[0]
        pool.release(lease)
    finally:
        release.set()
        holder.join(30)


def test_stale_leases_of_dead_processes_are_reclaimed(tmp_path: Path) -> None:
    held, release = SPAWN.Queue(), SPAWN.Event()
    crashed = SPAWN.Process(target=_hold, args=(str(tmp_path), GPUS, "gw3 crashed", 4, held, release, None, False))
    crashed.start()
    assert held.get(timeout=30) == GPUS
    crashed.join(30)
    pool = GpuPool(tmp_path, GPUS, poll_s=0.05)
    assert [x.owner for x in pool.holders()] == []  # holders() lists live leases only
    said: list[str] = []
    lease = pool.acquire(4, "gw0", timeout_s=1, progress=said.append)
    assert lease.gpus == GPUS
    assert any(f"reclaimed a stale GPU lease (GPU 0,1,2,3: pid {crashed.pid}" in s for s in said), said
    pool.release(lease)

    # A reused pid is not the holder: same pid as ours, another start time.
    ghost = Lease(id="ghost", gpus=("0",), pid=os.getpid(), pid_start="1", host=pool.host, owner="old", since=0.0)
    with pool._lock():
        pool._write([ghost])
    assert pool.acquire(4, "gw0", timeout_s=1).gpus == GPUS


def test_a_lease_outlives_its_worker_while_the_vllm_server_lives(tmp_path: Path) -> None:
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        held, release = SPAWN.Queue(), SPAWN.Event()
        worker = SPAWN.Process(target=_hold, args=(str(tmp_path), ("0",), "gw1 killed", 1, held, release,
                                                   server.pid, False))
        worker.start()
        assert held.get(timeout=30) == ("0",)
        worker.join(30)
        pool = GpuPool(tmp_path, ("0",), poll_s=0.05)
        with pytest.raises(GpuLeaseError, match=rf"pid {worker.pid} on .*, vLLM pid {server.pid}, gw1 killed"):
            pool.acquire(1, "gw0", timeout_s=0.2)
    finally:
        server.kill()
        server.wait()
    assert pool.acquire(1, "gw0", timeout_s=1).gpus == ("0",)


def test_bad_requests_and_a_corrupt_state_file_are_clear_errors(tmp_path: Path) -> None:
    pool = GpuPool(tmp_path, ("0", "1"))
    with pytest.raises(GpuLeaseError, match=r"server x needs 4 GPU\(s\) but only 2 may be leased \(0,1\); lower"):
        pool.acquire(4, "server x", timeout_s=1)
    pool.state_path.write_text("{not json")
    with pytest.raises(GpuLeaseError,
                       match="GPU lease file .* is unreadable .*delete it when no pytest-specdec session"):
        pool.acquire(1, "y", timeout_s=1)
    with pytest.raises(GpuLeaseError, match="the GPU list is empty"):
        GpuPool(tmp_path, ())


# --- CPU pinning ---------------------------------------------------------------------------------
def test_local_cpus_come_from_each_gpus_pci_device(tmp_path: Path) -> None:
    assert parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    with pytest.raises(ValueError, match="expected a cpulist"):
        parse_cpulist("0-x")
    for bus, cpus in (("0000:18:00.0", "0-27,56-83"), ("0000:9a:00.0", "28-55,84-111")):
        (tmp_path / bus).mkdir()
        (tmp_path / bus / "local_cpulist").write_text(cpus + "\n")

    def smi(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        assert "--query-gpu=index,uuid,pci.bus_id" in cmd
        return subprocess.CompletedProcess(cmd, 0, "0, GPU-aaa, 00000000:18:00.0\n1, GPU-bbb, 00000000:9A:00.0\n", "")

    local = gpu_local_cpus(run=smi, sysfs=tmp_path)
    assert local["0"] == local["GPU-aaa"] == set(range(28)) | set(range(56, 84))
    assert cpus_for(("1",), local, allowed=set(range(112))) == frozenset(range(28, 56)) | frozenset(range(84, 112))
    assert cpus_for(("0",), local, allowed={0, 1, 30}) == frozenset({0, 1})
    with pytest.raises(GpuLeaseError, match="local to CPUs this process may not use"):
        cpus_for(("1",), local, allowed={0, 1})
    with pytest.raises(GpuLeaseError, match="no CPU affinity known for GPU.s. 7"):
        cpus_for(("7",), local, allowed={0})


# --- the server pool on leased GPUs --------------------------------------------------------------
def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(x.decode().split("=", 1) for x in raw if b"=" in x)


def test_server_pool_starts_servers_on_leased_gpus_and_gives_them_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fakes import LAUNCHER  # here, not at the top: spawned helpers import this module

    monkeypatch.setenv("FAKE_VLLM_CHILD_PID_FILE", str(tmp_path / "child.pid"))
    first = min(os.sched_getaffinity(0))  # GPUs 0 and 1 are "local" to one CPU we may use
    monkeypatch.setattr("pytest_specdec.servers.gpus.gpu_local_cpus",
                        lambda: {"0": {first}, "1": {first}, "2": {first + 1}, "3": {first + 1}})
    gpus = GpuPool(tmp_path / "leases", GPUS)
    pool = ServerPool(tmp_path / "logs", max_alive=2, startup_timeout_s=30, launcher=LAUNCHER, gpus=gpus,
                      pin_cpus=True, worker="gw0")
    reference = ServerSpec(model="m", args=("--tensor-parallel-size", "2", "--gpu-memory-utilization", "0.45"))
    spec = ServerSpec(model="m", args=("--tensor-parallel-size", "2", "--gpu-memory-utilization", "0.45"),
                      speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    try:
        a = pool.get(reference, "t.py::test_a")
        b = pool.get(spec, "t.py::test_a")
        assert a.proc is not None and b.proc is not None
        for server in (a, b):
            env = _environ(server.proc.pid)  # what the vLLM process really got
            assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
            assert os.sched_getaffinity(server.proc.pid) == {first}
        holders = {x.owner: x for x in gpus.holders()}
        assert set(holders) == {f"gw0 t.py::test_a server {reference.key()} (none)",
                                f"gw0 t.py::test_a server {spec.key()} (ngram)"}
        assert {x.server_pid for x in holders.values()} == {a.proc.pid, b.proc.pid}
        assert [s.gpus for s in pool.starts] == ["0,1", "0,1"]
    finally:
        pool.stop_all()
    assert gpus.holders() == []

    # A server that fails to start gives its GPUs back.
    monkeypatch.setenv("FAKE_VLLM_MODE", "crash")
    with pytest.raises(ServerStartError, match="exited with code 3"):
        pool.get(spec, "t.py::test_b")
    assert gpus.holders() == []
