"""Servers across several GPUs on a simulated 8-GPU host: a fake nvidia-smi lists 8 GPUs whose PCI devices sit on
two NUMA nodes (a fake sysfs, `SPECDEC_PCI_DEVICES`), numbered across the sockets as some boards do (even ids on
node 0, odd on node 1). The h100x8-70b profile's dry run leases its two TP-4 servers on disjoint GPUs, each on
one node; a host too small for it is said before any server starts. Nothing runs on a GPU."""

from __future__ import annotations

import re
import shlex
import stat
from pathlib import Path
from typing import Any

import pytest

from pytest_specdec.errors import ConfigError
from pytest_specdec.profiles import load_profile
from pytest_specdec.profiles.placement import Placement
from pytest_specdec.profiles.pool import server_pool
from pytest_specdec.servers.hardware import SMI_ENV
from pytest_specdec.servers.pool import ServerPool

SUITES = Path(__file__).resolve().parents[2] / "suites"
PROFILES = Path(__file__).resolve().parents[2] / "pytest_specdec" / "profiles"
TEST = ('import pytest\n\n\n@pytest.mark.specdec(method="eagle3", k=3, temperature=0.0, concurrency=1, '
        'num_prompts=4, max_tokens=16)\ndef test_eagle3(specdec):\n    pass\n')


@pytest.fixture
def eight_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """nvidia-smi listing 8 H100s (indices, names, bus ids) and a sysfs giving each bus its NUMA node."""
    rows = [(i, f"GPU-{i:08x}", f"00000000:{0x18 + 0x10 * i:02X}:00.0") for i in range(8)]
    answers = {
        "--query-gpu=index": "".join(f"{i}\n" for i, _, _ in rows),
        "--query-gpu=name": "NVIDIA H100 80GB HBM3\n" * 8,
        "--query-gpu=index,uuid,pci.bus_id": "".join(f"{i}, {u}, {b}\n" for i, u, b in rows),
    }
    script = tmp_path / "nvidia-smi"
    script.write_text("#!/bin/sh\n[ \"$2\" = --format=csv,noheader ] || exit 9\ncase \"$1\" in\n"
                      + "".join(f"  {query}) printf '%s' '{out}' ;;\n" for query, out in answers.items())
                      + "  *) exit 9 ;;\nesac\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    sysfs = tmp_path / "pci"
    for i, _, bus in rows:
        device = sysfs / f"{bus[4:].lower()}"
        device.mkdir(parents=True)
        (device / "numa_node").write_text(f"{i % 2}\n")
    monkeypatch.setenv(SMI_ENV, str(script))
    monkeypatch.setenv("SPECDEC_PCI_DEVICES", str(sysfs))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_the_70b_dry_run_leases_two_tp4_servers_on_disjoint_numa_local_gpus(
        pytester: pytest.Pytester, eight_gpus: None) -> None:
    pytester.makepyfile(test_70b=TEST)
    result = pytester.runpytest("--gpu=h100x8-70b", "--specdec-dry-run", "-p", "no:cacheprovider")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines([
        "    reference *: * serve meta-llama/Llama-3.3-70B-Instruct * --tensor-parallel-size 4",
        "    spec *: * serve meta-llama/Llama-3.3-70B-Instruct *EAGLE3-LLaMA3.3-Instruct-70B* --tensor-parallel-size 4",
        "specdec dry run: GPU leases on this host's 8 GPU(s) (0,1,2,3,4,5,6,7; NUMA node(s) 0, 1), a test's servers "
        "at once:",
        "  reference: CUDA_VISIBLE_DEVICES=0,2,4,6, NUMA node 0",
        "  spec: CUDA_VISIBLE_DEVICES=1,3,5,7, NUMA node 1",
    ])
    # the session's cost counts the 8 GPUs a test holds (two TP-4 servers), at the profile's price per GPU-hour
    per_gpu = float(re.search(r"price_per_hour_usd = ([\d.]+)", (PROFILES / "h100x8-70b.toml").read_text())[1])
    result.stdout.fnmatch_lines([f"  total: ~* at ${per_gpu * 8:g}/h"])


def test_a_session_on_too_few_gpus_stops_at_collection_with_one_usage_error(pytester: pytest.Pytester,
                                                                           eight_gpus: None) -> None:
    """Not a dry run: the host's 8 H100s pass the class check, but --specdec-gpus leaves 6, too few for the two
    TP-4 arms at once; the session stops before any server starts (none could: `vllm serve` is never run)."""
    pytester.makepyfile(test_70b=TEST)
    result = pytester.runpytest("--gpu=h100x8-70b", "--specdec-gpus=0,1,2,3,4,5", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*specdec: profile 'h100x8-70b' serves meta-llama/Llama-3.3-70B-Instruct on 4 GPU(s) "
                                 "per server*, and a test's 2 servers are alive at once*pass --specdec-max-servers 1*"])


def test_too_few_gpus_for_the_70b_servers_is_said_before_any_server_starts(tmp_path: Path, eight_gpus: None) -> None:
    placement = Placement(load_profile("h100x8-70b"), False, 2, None, 5, "127.0.0.1")

    def pool(placement: Placement, gpus: str | None, workers: int = 1) -> ServerPool:
        return server_pool(placement, tmp_path, gpus=gpus, lease_dir=tmp_path / "leases", startup_timeout_s=1.0,
                           gpu_wait_s=1.0, pin_cpus=False, worker=None, progress=print, workers=workers)

    with pytest.raises(ConfigError, match=r"serves meta-llama/Llama-3.3-70B-Instruct on 4 GPU\(s\) per server "
                                          r"\(\[target\] tensor_parallel_size 4 x pipeline_parallel_size 1\), but "
                                          r"this host has 3 GPU\(s\) to lease \(0,1,2\)"):
        pool(placement, "0,1,2")
    with pytest.raises(ConfigError, match=r"a test's 2 servers are alive at once.*spec needs 4 GPU\(s\).*"
                                          r"pass --specdec-max-servers 1"):
        pool(placement, "0,1,2,3,4,5")
    with pytest.raises(ConfigError, match=r"each xdist worker needs 8 GPUs at once .* hold 1 worker\(s\), not 2; "
                                          r"run with -n 1 or fewer"):
        pool(placement, None, workers=2)
    leases = pool(placement, None).gpus
    assert leases is not None and leases.gpus == tuple("01234567")
    assert leases.numa == {**{str(i): i % 2 for i in range(8)}, **{f"GPU-{i:08x}": i % 2 for i in range(8)}}
    one = Placement(load_profile("h100x8-70b"), False, 1, None, 5, "127.0.0.1")  # arms alternate: 4 GPUs will do
    assert pool(one, "0,1,2,3").gpus is not None


@pytest.mark.slow  # vLLM's own argument parser: importing vLLM imports torch
def test_the_70b_suites_dry_run_on_eight_gpus_parses_with_vllms_own_parser_not_run_on_a_gpu_here(
        pytester: pytest.Pytester, eight_gpus: None, vllm_serve_parser: Any) -> None:
    """`pytest suites/ --gpu=h100x8-70b --specdec-dry-run` on the simulated host: every test's two commands as vLLM
    parses them, TP 4 in both arms, and the two servers' leases on disjoint GPUs."""
    from pytest_specdec.vllm.check import check_command

    (pytester.path / "suites").mkdir()
    for f in SUITES.glob("*.py"):
        (pytester.path / "suites" / f.name).write_text(f.read_text())
    result = pytester.runpytest("suites", "--gpu=h100x8-70b", "--specdec-dry-run", "-p", "no:cacheprovider")
    arms = ("    reference [", "    spec [")
    commands = [line.split("]: ", 1)[1] for line in result.outlines if line.startswith(arms)]
    assert len(commands) >= 2 * 20, result.outlines  # test_methods, k sweep, temperatures, concurrency, engines...
    methods = set()
    for command in commands:
        argv = shlex.split(command.replace("$PORT", "8000"))
        ns = check_command(vllm_serve_parser, argv[argv.index("serve"):])
        assert (ns.model_tag, ns.tensor_parallel_size, ns.pipeline_parallel_size) == (
            "meta-llama/Llama-3.3-70B-Instruct", 4, 1)
        methods.add((ns.speculative_config or {}).get("method", "none"))
    assert methods == {"none", "ngram", "draft_model", "eagle3"}
    result.stdout.fnmatch_lines(["  reference: CUDA_VISIBLE_DEVICES=0,2,4,6, NUMA node 0",
                                 "  spec: CUDA_VISIBLE_DEVICES=1,3,5,7, NUMA node 1"])
    # on disjoint GPUs the two arms start at once, though 0.9 + 0.9 of the memory could never share GPUs
    result.stdout.fnmatch_lines(["  servers that co-reside start together: ~* min of starts saved*"])
