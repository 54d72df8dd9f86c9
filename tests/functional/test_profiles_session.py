"""Profiles through pytester: dry-run commands and estimates, the GPU class check stopping a session, endpoint
mode against simulated servers (the profiles themselves: tests/unit/test_profiles.py).

The GPU dry runs check every command against `vllm serve`'s parser from the installed vLLM without starting a
server: they are NOT run on a GPU here, and the hub repositories they name are not fetched."""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from session import latest, specdec_session

from fakes import FakeConfig, FakeServer, FakeVllm
from pytest_specdec.profiles import PROFILE_DIR, load_profile
from pytest_specdec.servers.hardware import SMI_ENV

GPU_PROFILES = ["a100", "h100", "h200", "l40s"]
MINI = {"name": "test_m", "concurrency": 1, "num_prompts": 4, "max_tokens": 16,
        "body": 'assert specdec.summary["acceptance_rate"] is not None'}
SUITES = Path(__file__).resolve().parents[2] / "suites"
EndpointRun = Callable[..., pytest.RunResult]
SXM = "NVIDIA H100 80GB HBM3"
PCIE = "NVIDIA H100 PCIe"


@pytest.mark.slow  # vLLM's own argument parser: importing vLLM imports torch
@pytest.mark.parametrize("gpu", GPU_PROFILES)
def test_dry_run_of_the_suites_prints_every_tests_vllm_serve_command_not_run_on_a_gpu_here(
    pytester: pytest.Pytester, vllm_serve_parser: Any, gpu: str, monkeypatch: pytest.MonkeyPatch
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
        ns_ref = check_command(vllm_serve_parser, _serve_argv(shlex.split(ref.replace("$PORT", "8000"))))
        ns_spec = check_command(vllm_serve_parser, _serve_argv(shlex.split(spec.replace("$PORT", "8000"))))
        assert ns_ref.speculative_config is None
        method, k = nodeid.split("[", 1)[1].split("-")[:2]
        assert ns_spec.speculative_config == {**load_profile(gpu).methods[method], "num_speculative_tokens": int(k[1:])}
        # both arms serve the preset's target: MiMo-7B-RL for mtp (its MTP layer is in the checkpoint), else Llama's
        target = "XiaomiMiMo/MiMo-7B-RL" if method == "mtp" else "meta-llama/Llama-3.1-8B-Instruct"
        assert ns_ref.model_tag == ns_spec.model_tag == load_profile(gpu).target_of(method)[0] == target
    # every GPU preset is measured by the suites, and listed (mlp_speculator has no room on the L40S)
    listed = {nodeid.split("[", 1)[1].split("-")[0] for nodeid in commands}
    assert listed == set(load_profile(gpu).methods) - {"eagle3-degraded"}
    assert {"suffix", "eagle", "mtp", "medusa"} | ({"mlp_speculator"} if gpu != "l40s" else set()) <= listed
    assert {"dflash", "pard", "eagle3_dynamic"} <= listed  # suites/test_recent_methods.py


def test_the_gpu_zoo_dry_run_lists_its_servers_anywhere_and_a_run_needs_one_gpu_class(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, fake_vllm: FakeVllm,
        fake_nvidia_smi: Callable[..., Path]) -> None:
    """`pytest suites/test_methods.py --gpu=gpu-zoo --specdec-dry-run` on a machine without a GPU: the zoo's servers
    (no download), eager, FlashInfer's sampler off where FlashInfer is missing. A run (the stand-in as `vllm serve`,
    should one start) stops at collection without a GPU or on GPUs of two classes. vLLM's parser checks these
    commands in tests/unit/test_profiles.py (slow: it imports vLLM)."""
    import importlib.util

    from pytest_specdec.zoo import MODELS_DIR

    monkeypatch.setenv("PATH", str(pytester.path / "no-such-dir"))  # no nvidia-smi at all
    monkeypatch.delenv(SMI_ENV, raising=False)
    (pytester.path / "suites").mkdir()
    for name in ("conftest.py", "test_methods.py"):
        (pytester.path / "suites" / name).write_text((SUITES / name).read_text())
    result = pytester.runpytest("suites", "--gpu=gpu-zoo", "--specdec-dry-run", "-p", "no:cacheprovider")
    result.assert_outcomes(skipped=3)
    result.stdout.fnmatch_lines([
        "specdec dry run: profile gpu-zoo (*gpu-zoo.toml), 3 test(s); nothing is started",
        "specdec dry run: profile gpu-zoo was NOT checked against this machine's GPUs (dry run); it runs on any one "
        "class of NVIDIA GPU, and its baselines are keyed by the class nvidia-smi lists",
        "specdec dry run: 4 distinct server(s): * none, * draft_model, * eagle3, * ngram",
        # 0.2 of the GPU each: they co-reside on its one GPU, but start one after another there (the H200 run)
        "  suites/test_methods.py: 3 test(s), 4 server start(s), 24 run(s): ~* run(s) per arm)",
        "  total: ~*",
        "  servers start one after another: no two that a test needs next fit beside each other on GPUs of their "
        "own (two starting at once on one GPU can leave the second no KV cache; *",
    ])
    commands = [line.split("]: ", 1)[1] for line in result.outlines
                if line.startswith(("    reference [", "    spec ["))]
    assert len(commands) == 6
    flashinfer_off = importlib.util.find_spec("flashinfer") is None
    for command in commands:
        argv = shlex.split(command.replace("$PORT", "8000"))
        assert argv[argv.index("serve") + 1] == str(MODELS_DIR / "target") and "--enforce-eager" in argv
        assert ("VLLM_USE_FLASHINFER_SAMPLER=0" in argv[:argv.index("serve")]) == flashinfer_off, command
    assert {json.loads(c.split("--speculative-config ", 1)[1].split("'")[1])["model"]
            for c in commands if "'{\"method\": \"eagle3\"" in c} == {str(MODELS_DIR / "eagle3")}
    # Not a dry run: no GPU stops it, GPUs of two classes too; nothing is started.
    for smi, says in ((None, "*--gpu=gpu-zoo: the gpu-zoo profile runs on an NVIDIA GPU, but this machine has none*"),
                      ("Tesla T4\nNVIDIA H200\n", "*lists Tesla T4, NVIDIA H200 (mixed GPUs*")):
        if smi is not None:
            monkeypatch.setenv(SMI_ENV, str(fake_nvidia_smi(smi)))
        run = pytester.runpytest("suites", "--gpu=gpu-zoo", "-p", "no:cacheprovider")
        run.assert_outcomes(errors=1)
        run.stdout.fnmatch_lines([says])
        assert "starting vLLM" not in run.stdout.str()
    assert fake_vllm.records() == []


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


def test_the_gpu_only_suite_modules_are_not_collected_on_the_cpu_profile(pytester: pytest.Pytester) -> None:
    """suites/conftest.py's PRESETS: the cpu profile's suites are the six modules without GPU presets; a profile
    with a module's presets (here the cpu profile plus an mlp_speculator preset on a zoo model) collects it."""
    (pytester.path / "suites").mkdir()
    for f in SUITES.glob("*.py"):
        (pytester.path / "suites" / f.name).write_text(f.read_text())
    result = pytester.runpytest("suites", "--gpu=cpu", "--specdec-dry-run", "-p", "no:cacheprovider")
    modules = {line.split("::")[0].strip() for line in result.outlines if line.startswith("  suites/") and "::" in line}
    assert modules == {f"suites/test_{m}.py" for m in ("methods", "k_sweep", "temperature", "concurrency", "workloads",
                                                                    "load")}
    result.assert_outcomes(skipped=22)
    mine = pytester.path / "cpu-plus.toml"
    mine.write_text((PROFILE_DIR / "cpu.toml").read_text().replace(
        "[methods.ngram]", '[methods.mlp_speculator]\nspeculative_config = { method = "mlp_speculator", model = '
        '"zoo:draft" }\n\n[methods.ngram]'))
    result = pytester.runpytest("suites", f"--specdec-profile={mine}", "--specdec-dry-run", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["  suites/test_mlp_speculator.py::test_mlp_speculator[[]mlp_speculator-k3-t0.0-c1[]]"])
    assert not [line for line in result.outlines if "test_gpu_methods.py::" in line]  # no suffix/eagle/mtp/medusa


def test_the_soak_suite_is_collected_only_when_asked_for(pytester: pytest.Pytester) -> None:
    """suites/conftest.py's OPT_IN: `pytest suites/` leaves test_soak.py out (the quickstart does not grow); `-m soak`
    or naming the module collects it."""
    (pytester.path / "suites").mkdir()
    for f in SUITES.glob("*.py"):
        (pytester.path / "suites" / f.name).write_text(f.read_text())
    dry = ("--gpu=cpu", "--specdec-dry-run", "-p", "no:cacheprovider")
    result = pytester.runpytest("suites", *dry)
    assert not [line for line in result.outlines if "test_soak.py" in line]
    for args in (("suites", "-m", "soak"), ("suites/test_soak.py",)):
        result = pytester.runpytest(*args, *dry)
        result.stdout.fnmatch_lines(["  suites/test_soak.py::test_soak[[]ngram-k3-t0.0-c1[]]"])
        result.assert_outcomes(skipped=1)


def test_gpu_profile_on_the_wrong_gpus_stops_the_session(pytester: pytest.Pytester, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          make_suite: Callable[..., str],
                                                          fake_nvidia_smi: Callable[..., Path]) -> None:
    pytester.makepyfile(test_suite=make_suite(method=["ngram", "eagle3"], **MINI))
    monkeypatch.setenv(SMI_ENV, str(fake_nvidia_smi(f"{PCIE}\n")))
    result = pytester.runpytest("--gpu=h100", "-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*--gpu=h100: the h100 profile is for NVIDIA H100 80GB HBM3 only, but nvidia-smi "
                                 "lists NVIDIA H100 PCIe*"])
    # The dry run works anywhere and says the profile was not checked.
    dry = pytester.runpytest("--gpu=h100", "--specdec-dry-run", "-p", "no:cacheprovider")
    dry.assert_outcomes(skipped=2)
    dry.stdout.fnmatch_lines(["*profile h100 was NOT checked against this machine's GPUs (dry run)*"])
    # auto on SXM cards picks h100 (shown in the dry run; a real run would then start vLLM).
    monkeypatch.setenv(SMI_ENV, str(fake_nvidia_smi(f"{SXM}\n{SXM}\n")))
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


def test_an_ab_dry_run_names_the_tests_it_skips_and_leaves_them_out_of_the_estimate(pytester: pytest.Pytester) -> None:
    """An A/B session skips the tests of methods it has no base for; its dry run's estimate counted their runs."""
    (pytester.path / "suites").mkdir()
    for name in ("conftest.py", "test_methods.py"):
        (pytester.path / "suites" / name).write_text((SUITES / name).read_text())
    result = pytester.runpytest("suites", "--gpu=cpu", "--specdec-base-draft=draft_model=zoo:draft",
                                "--specdec-dry-run", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines([
        "specdec dry run: profile cpu *, 1 test(s) and 2 skipped; nothing is started",
        "  suites/test_methods.py::test_methods[[]eagle3-*]: skipped, not estimated (specdec A/B session: method "
        "'eagle3' has no base *",
        "  suites/test_methods.py: 1 test(s), 3 server start(s), * run(s): *",
    ])


def test_dry_run_estimates_each_suite_from_the_profile_timings(pytester: pytest.Pytester, fake_profile: Path,
                                                               make_suite: Callable[..., str]) -> None:
    fake_profile.write_text(fake_profile.read_text() + "\n[timings]\nserver_start_s = 30\nstream_tok_s = 16\n"
                            "max_tok_s = 32\nrun_overhead_s = 0\n")
    fake_profile.write_text(fake_profile.read_text().replace('name = "fake"',
                                                             'name = "fake"\nprice_per_hour_usd = 3.6'))
    pytester.makepyfile(test_a=make_suite(method=["ngram", "eagle3"], **MINI),
                        test_b=make_suite(method="ngram", **MINI))
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


@pytest.fixture
def endpoint_run(pytester: pytest.Pytester, fake_profile: Path,
                 make_suite: Callable[..., str]) -> EndpointRun:
    """A session of one test of `methods` at `k` in endpoint mode, against a spec server of `spec_cfg` and a
    reference server of `ref_cfg` (a plain k=0 one by default)."""

    def run(spec_cfg: FakeConfig, methods: list[str], k: object = 3, ref_cfg: FakeConfig | None = None
            ) -> pytest.RunResult:
        pytester.makepyfile(test_suite=make_suite(name="test_e", method=methods, k=k, **{
            key: value for key, value in MINI.items() if key != "name"}))
        ref_cfg = ref_cfg or FakeConfig(k=0, step_s=0.001, output_tokens=16)
        with FakeServer(spec_cfg) as spec_url, FakeServer(ref_cfg) as ref_url:
            return specdec_session(pytester, fake_profile, (spec_url, ref_url), "-rs",
                                   "--update-baselines=missing").result

    return run


def _spec(k: int = 3, server_info: dict | None = None) -> FakeConfig:
    acceptance = tuple(0.8 - 0.1 * i for i in range(k))
    return FakeConfig(k=k, acceptance=acceptance, step_s=0.001, output_tokens=16,
                      server_info=json.dumps(server_info) if server_info else "")


def test_endpoint_with_another_k_skips_with_the_reason(pytester: pytest.Pytester,
                                                        endpoint_run: EndpointRun) -> None:
    result = endpoint_run(_spec(k=3), ["ngram"], k=[3, 5])
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED*specdec endpoint mode: this test needs k=5 (*); the spec endpoint "
                                 "http://127.0.0.1:* speculates with k=3 (from its /metrics per-position counters)"])
    data = latest(pytester)
    spec_facts = [f for f in data["endpoints"].values() if f["speculating"]]
    assert spec_facts[0]["k"] == 3 and spec_facts[0]["server_info"] is False


def test_endpoint_without_speculation_skips_spec_tests(endpoint_run: EndpointRun) -> None:
    result = endpoint_run(FakeConfig(k=0, output_tokens=16), ["none", "ngram"])
    result.assert_outcomes(passed=0, skipped=1, failed=1)  # `none` runs (and fails: no acceptance, as it should)
    result.stdout.fnmatch_lines(["SKIPPED*the spec endpoint http://127.0.0.1:* does not speculate (no "
                                 "vllm:spec_decode_* counters on /metrics); this test needs*ngram*"])


def test_endpoint_method_is_checked_when_server_info_shows_it(pytester: pytest.Pytester,
                                                               endpoint_run: EndpointRun) -> None:
    served = {"method": "eagle3", "model": "/models/nonexistent/head", "num_speculative_tokens": 3,
              "rejection_sample_method": "standard"}
    result = endpoint_run(_spec(3, served), ["ngram", "eagle3"])
    # eagle3's head "/nonexistent/head" is the served "/models/nonexistent/head" (a local copy of the same id).
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED*this test needs method='ngram'; the spec endpoint * serves "
                                 "method='eagle3' (speculative config*(/server_info))"])
    # The endpoint's resolved engine config is in the results, flattened as for servers the plugin starts;
    # the reference endpoint has no /server_info, so none is claimed for it.
    endpoints = latest(pytester)["endpoints"]
    engines = {facts["speculating"]: facts["engine_config"] for facts in endpoints.values()}
    assert engines[False] is None
    assert engines[True]["config_source"] == "server_info"
    assert engines[True]["speculative_config"]["method"] == "eagle3"


def test_endpoint_method_unknown_with_rival_configs_skips_them_all(endpoint_run: EndpointRun) -> None:
    result = endpoint_run(_spec(3), ["ngram", "eagle3"])
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["SKIPPED*which method and draft it runs cannot be read (no /server_info: start "
                                 "vLLM with VLLM_SERVER_DEV_MODE=1 to expose it), and this session asks for 2 "
                                 "different spec configs at that k*"])


def test_endpoint_single_config_is_measured_but_says_unverified(endpoint_run: EndpointRun) -> None:
    result = endpoint_run(_spec(3), ["ngram"])
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*speculates with k=3; its method and draft cannot be read (no /server_info), so "
                                 "it is measured as *ngram* unverified"])


def test_speculating_reference_endpoint_is_an_error(endpoint_run: EndpointRun) -> None:
    result = endpoint_run(_spec(3), ["ngram"], ref_cfg=_spec(3))
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*--specdec-reference-endpoint http://127.0.0.1:* speculates (*); the reference "
                                 "must be a server started without --speculative-config"])


def _serve_argv(command: list[str]) -> list[str]:
    return command[command.index("serve"):]


# ==== runs and max_runs: the command line against the profile, before anything runs ==========================

def _with_max_runs(profile: Path, max_runs: int) -> Path:
    profile.write_text(profile.read_text() + f"[verdicts]\nmax_runs = {max_runs}\n")
    return profile


@pytest.mark.parametrize("extra", [("--specdec-dry-run",), ("--update-baselines",)])
def test_explicit_runs_raise_the_profiles_max_runs_and_say_so(pytester: pytest.Pytester, fake_profile: Path,
                                                              make_suite: Callable[..., str],
                                                              extra: tuple[str, ...]) -> None:
    profile = _with_max_runs(fake_profile, 2)  # profile_toml: runs = 2
    pytester.makepyfile(test_suite=make_suite(**MINI))
    ref = FakeConfig(k=0, step_s=0.001, output_tokens=16)
    with FakeServer(_spec()) as spec_url, FakeServer(ref) as ref_url:
        result = specdec_session(pytester, profile, (spec_url, ref_url), *extra, runs=3).result
    result.assert_outcomes(**({"skipped": 1} if "--specdec-dry-run" in extra else {"passed": 1}))
    line = f"specdec: --specdec-runs 3 raises the profile's [[]verdicts] max_runs from 2 to 3 ({profile})"
    result.stdout.fnmatch_lines([line])
    assert sum("raises the profile's" in x for x in result.outlines) == 1
    if "--update-baselines" in extra:
        result.stdout.fnmatch_lines(["*run 3/3 spec*"])


@pytest.mark.parametrize("extra", [(), ("--specdec-dry-run",), ("--update-baselines",)])
def test_explicit_max_runs_below_the_runs_is_a_usage_error(pytester: pytest.Pytester, fake_profile: Path,
                                                           make_suite: Callable[..., str],
                                                           extra: tuple[str, ...]) -> None:
    pytester.makepyfile(test_suite=make_suite(**MINI))
    result = pytester.runpytest(f"--specdec-profile={fake_profile}", "--specdec-max-runs=1", "-p", "no:cacheprovider",
                                *extra)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --specdec-max-runs 1 is below the runs per test (2, [[]matrix] runs of "
                                 f"profile {fake_profile}); raise --specdec-max-runs or lower --specdec-runs"])
    result = pytester.runpytest(f"--specdec-profile={fake_profile}", "--specdec-max-runs=2", "--specdec-runs=3",
                                "-p", "no:cacheprovider", *extra)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --specdec-max-runs 2 is below the runs per test (3, --specdec-runs)*"])


@pytest.mark.parametrize(("old", "new", "message"), [
    ('model = "fake-model"', "model = 42", "[[]target] model must be a non-empty string *, got 42"),
    ("runs = 2", 'runs = 2\n[verdicts]\nmax_runs = "4"', "[[]verdicts] max_runs must be a whole number >= 1, got '4'"),
])
def test_a_wrongly_typed_profile_key_is_one_line_naming_file_and_key(pytester: pytest.Pytester, fake_profile: Path,
                                                                     make_suite: Callable[..., str], old: str,
                                                                     new: str, message: str) -> None:
    fake_profile.write_text(fake_profile.read_text().replace(old, new))
    pytester.makepyfile(test_suite=make_suite(**MINI))
    for extra in ((), ("--specdec-dry-run",), ("--specdec-runs=3",)):
        result = pytester.runpytest(f"--specdec-profile={fake_profile}", "-p", "no:cacheprovider", *extra)
        out = "\n".join(result.outlines + result.errlines)
        assert "INTERNALERROR" not in out and "Traceback" not in out
        assert f"profile {fake_profile}: " in out
        (result.stderr if extra == ("--specdec-runs=3",) else result.stdout).fnmatch_lines([f"*{message}"])
