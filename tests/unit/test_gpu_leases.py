"""The lease arithmetic of servers/gpus.py without a lock file: which GPUs a server of TP x PP GPUs gets
(`choose_gpus`), where one test's servers land on an idle host (`plan_leases`), and each GPU's NUMA node read
from a fake nvidia-smi listing and a fake sysfs (`gpu_numa_nodes`)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from pytest_specdec.servers.gpus import GpuLeaseError, choose_gpus, gpu_numa_nodes, plan_leases

EIGHT = tuple(str(i) for i in range(8))
#: Two sockets, four GPUs each, numbered across them as some boards do: a TP-4 group must not follow the ids.
INTERLEAVED = {"0": 0, "1": 1, "2": 0, "3": 1, "4": 0, "5": 1, "6": 0, "7": 1}
TWO_NODES = {str(i): i // 4 for i in range(8)}


def test_a_tp4_server_gets_four_gpus_of_one_numa_node() -> None:
    assert choose_gpus(4, 0.9, EIGHT, {}, (), INTERLEAVED) == ("0", "2", "4", "6")
    assert choose_gpus(4, 0.9, EIGHT, {}, {"0"}, INTERLEAVED) == ("1", "3", "5", "7")  # node 0 has 3 free
    assert choose_gpus(4, 0.9, EIGHT, {}, (), {}) == ("0", "1", "2", "3")  # topology unknown: in order


def test_a_server_spans_nodes_only_when_no_node_has_enough() -> None:
    assert choose_gpus(8, 0.9, EIGHT, {}, (), TWO_NODES) == EIGHT  # TP 8: both sockets, nothing else will do
    assert choose_gpus(4, 0.9, EIGHT, {}, {"0", "4"}, TWO_NODES) == ("1", "2", "3", "5")
    assert choose_gpus(4, 0.9, EIGHT, {}, {"0", "1", "4", "5", "6"}, TWO_NODES) is None  # 3 free: wait


def test_a_small_server_keeps_whole_nodes_free_for_wide_ones() -> None:
    """Best fit: a TP-1 server goes to the node with the fewest free GPUs, so a TP-4 one still finds a node."""
    busy = {"4"}  # another process holds GPU 4: node 0 has 4 free, node 1 has 3
    assert choose_gpus(1, 0.9, EIGHT, {}, busy, TWO_NODES) == ("5",)
    assert choose_gpus(4, 0.9, EIGHT, {}, {*busy, "5"}, TWO_NODES) == ("0", "1", "2", "3")


def test_one_process_servers_share_gpus_only_while_their_memory_fractions_fit() -> None:
    assert choose_gpus(1, 0.45, EIGHT, {"3": 0.45}, (), TWO_NODES) == ("3",)  # the 1-GPU profiles' split
    assert choose_gpus(4, 0.9, EIGHT, dict.fromkeys("0123", 0.9), (), TWO_NODES) == ("4", "5", "6", "7")
    assert choose_gpus(4, 0.9, EIGHT[:4], dict.fromkeys("0123", 0.9), (), {}) is None
    assert choose_gpus(2, 0.3, EIGHT, {"5": 0.5, "6": 0.5}, (), TWO_NODES) == ("5", "6")  # its own node first


def test_the_plan_puts_a_70b_pair_on_disjoint_nodes_and_says_when_the_host_is_too_small() -> None:
    pair = [("reference", 4, 0.9), ("spec", 4, 0.9)]
    assert plan_leases(pair, EIGHT, TWO_NODES) == {"reference": ("0", "1", "2", "3"), "spec": ("4", "5", "6", "7")}
    assert plan_leases(pair, EIGHT, INTERLEAVED) == {"reference": ("0", "2", "4", "6"),
                                                    "spec": ("1", "3", "5", "7")}
    assert plan_leases([("reference", 1, 0.45), ("spec", 1, 0.45)], EIGHT, TWO_NODES) == {
        "reference": ("0",), "spec": ("0",)}  # the 8B profiles: one GPU for both, as before
    with pytest.raises(GpuLeaseError, match=r"spec needs 4 GPU\(s\) with 0.9 of their memory free, but the host's 4 "
                                            r"GPU\(s\) \(0,1,2,3\) cannot hold it beside reference on GPU 0,1,2,3"):
        plan_leases(pair, EIGHT[:4], {})


# --- the topology ---------------------------------------------------------------------------------
SMI = ("0, GPU-aaaa, 00000000:18:00.0\n1, GPU-bbbb, 00000000:2A:00.0\n"
       "2, GPU-cccc, 00000000:9B:00.0\n3, GPU-dddd, 00000000:AB:00.0\n")


def _sysfs(tmp_path: Path, nodes: dict[str, str]) -> Path:
    for bus, node in nodes.items():
        (tmp_path / bus).mkdir(parents=True)
        (tmp_path / bus / "numa_node").write_text(node + "\n")
    return tmp_path


def _smi(out: str, code: int = 0) -> Any:
    def run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        assert argv[1:] == ["--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader"]
        return subprocess.CompletedProcess(argv, code, out, "")
    return run


def test_numa_nodes_come_from_each_gpus_pci_device(tmp_path: Path) -> None:
    sysfs = _sysfs(tmp_path, {"0000:18:00.0": "0", "0000:2a:00.0": "0", "0000:9b:00.0": "1", "0000:ab:00.0": "1"})
    nodes = gpu_numa_nodes(_smi(SMI), sysfs, which=lambda name: "/usr/bin/nvidia-smi")
    assert nodes == {"0": 0, "GPU-aaaa": 0, "1": 0, "GPU-bbbb": 0, "2": 1, "GPU-cccc": 1, "3": 1, "GPU-dddd": 1}


def test_an_unknown_topology_is_one_node_not_an_error(tmp_path: Path) -> None:
    """-1 (a one-socket kernel), a missing file, a failing or absent nvidia-smi: left out, the leases go on."""
    sysfs = _sysfs(tmp_path, {"0000:18:00.0": "-1", "0000:2a:00.0": "0"})
    which = lambda name: "/usr/bin/nvidia-smi"  # noqa: E731
    assert gpu_numa_nodes(_smi(SMI), sysfs, which=which) == {"1": 0, "GPU-bbbb": 0}
    assert gpu_numa_nodes(_smi(SMI, code=9), sysfs, which=which) == {}
    assert gpu_numa_nodes(_smi(SMI), sysfs, which=lambda name: None) == {}

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise OSError("no such file")
    assert gpu_numa_nodes(broken, sysfs, which=which) == {}
