"""Every key of a profile file, checked once, when the file is read.

A misspelt key would otherwise be ignored and the session would measure something other than what the
file says; a wrongly typed value would fail much later, deep in a run or as an INTERNALERROR. Each error
is one line naming the file, the table and the key, and what the key takes.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from pathlib import Path
from typing import Any

from pytest_specdec.errors import ConfigError, SpecDecDeprecationWarning
from pytest_specdec.measure.validity import ValidityRules
from pytest_specdec.redact import flag_name

#: Speculation methods vLLM knows (vllm/config/speculative.py), plus `none` for the reference.
VLLM_METHODS = (
    "ngram", "suffix", "draft_model", "eagle", "eagle3", "mtp", "medusa", "mlp_speculator", "dflash", "dspark",
    "ngram_gpu",
)

#: `vllm serve` flags the plugin sets itself: a profile's own would win (argparse keeps the last), so its
#: servers would listen where the plugin does not look, and dev mode would follow the wrong address.
PLUGIN_FLAGS = frozenset({"--host", "--port"})
#: The target's revision flag: set from [target] revision, so that the pinned revision keys the baselines.
REVISION_FLAGS = frozenset({"--revision"})
#: `vllm serve`'s parallelism flags (with the short forms its parser takes) -> the [target] key that sets them:
#: said once, in [target], so both arms get the same and the leases, the price and the baselines read one number.
PARALLEL_FLAGS = {"--tensor-parallel-size": "tensor_parallel_size", "-tp": "tensor_parallel_size",
                  "--pipeline-parallel-size": "pipeline_parallel_size", "-pp": "pipeline_parallel_size"}

#: `nvidia_smi_names = "any"`: a profile for one NVIDIA GPU of any class (the zoo's, which needs no download); the
#: class nvidia-smi lists at run time keys its baselines, in place of a `hardware` the file would name.
ANY_GPU = "any"

#: Runs per test when neither the profile's [matrix] runs nor --specdec-runs says.
DEFAULT_RUNS = 3
#: `[verdicts] machine_state_tolerance` of a profile that does not set it, in ±% (measured on the CPU default:
#: docs/validation.md, "Machine state").
DEFAULT_STATE_TOLERANCE = 15.0
#: `[verdicts] night_prior` where a profile names none: what a test's night mean is assumed to move from night
#: to night before its stored nights can say (`gate.variance.NightPrior`), sd in % (ratios, absolute figures) or
#: points (acceptance) and its weight in pseudo-nights. Wide on purpose: no host measured it; a calibration
#: record narrows it, the profile's own replaces it (docs/gate.md, "Nights the gate has not seen").
DEFAULT_NIGHT_PRIOR: dict[str, float] = {"ratio": 10.0, "absolute": 30.0, "acceptance": 0.0, "df": 4.0}
NIGHT_PRIOR_KEYS = ("ratio", "absolute", "acceptance", "df")

#: An A/B session's looks when the profile's [matrix] does not say: the first at 8 pairs, then 8 more at a time
#: up to ab_runs = 16. At a GPU's noise (3 % CV a run) a lone -10 % tok/s change is caught with power 0.999 and
#: an A/A test stops after 10.3 pairs on average (docs/validation.md, scripts/ab_simulation.py).
DEFAULT_AB_RUNS = 16
DEFAULT_AB_FIRST_LOOK = 8
DEFAULT_AB_LOOK_STEP = 8

#: Former spellings of a key, still read for one release with a `SpecDecDeprecationWarning`: (table, old) -> new.
RENAMED_KEYS = {("validity", "idle_timeout_s"): "hung_timeout_s"}

#: The keys a profile may have, per table. `methods.NAME` tables take `speculative_config` only.
#: Add a key here (and check and read it somewhere) when the plugin starts to use it.
PROFILE_KEYS: dict[str, frozenset[str]] = {
    "": frozenset({
        "name", "description", "device", "hardware", "gpus", "nvidia_smi_names", "price_per_hour_usd",
        "target", "server", "methods", "matrix", "validity", "verdicts", "timings", "placement", "engines",
    }),
    # tensor_parallel_size x pipeline_parallel_size: the GPUs each server (both arms) spans; the one place to say
    # it (the flags are refused in [server] args and engine modes), at most the top level's `gpus`
    "target": frozenset({"model", "tensor_parallel_size", "pipeline_parallel_size", "revision"}),
    # env_if_missing: { MODULE = { VAR = "value" } }, environment the servers get when the Python module MODULE
    # cannot be found (e.g. vLLM's FlashInfer sampler switched off where FlashInfer is not installed)
    "server": frozenset({"args", "env", "env_if_missing"}),
    # target: a preset whose draft lives in its own target's checkpoint (mtp) or was trained for another target
    # serves that target in both arms of its tests: { model = "ORG/NAME", revision = "<commit>" }
    "methods.*": frozenset({"speculative_config", "target"}),
    "methods.*.target": frozenset({"model", "revision"}),
    # engines.NAME: an engine mode, { args = [...], env = { VAR = "v" } } added to both arms' servers of the tests
    # that name it (`specdec(engine=...)`; profiles/engines.py checks its tables)
    # num_prompts / max_tokens: the workload size of tests whose marker does not set them
    # ab_runs: the most pairs per test in an A/B session (--specdec-base-draft); ab_first_look: pairs at its
    # first look; ab_look_step: pairs added at each look after it
    "matrix": frozenset({"k", "temperature", "concurrency", "runs", "ab_runs", "ab_first_look", "ab_look_step",
                         "num_prompts", "max_tokens"}),
    "validity": frozenset(f.name for f in dataclasses.fields(ValidityRules)),
    # thresholds, ab_thresholds (an A/B session's): checked here by the gate's threshold parser
    "verdicts": frozenset({"max_runs", "thresholds", "ab_thresholds", "min_night_sd", "machine_state_tolerance",
                           "night_prior"}),
    "timings": frozenset({"server_start_s", "stream_tok_s", "max_tok_s", "run_overhead_s"}),
    # co_resident = false: the reference and spec servers cannot be alive at once (arms alternate in blocks)
    # client_cpus = N (cpu profiles): the first N CPUs are left to the client, the servers start on the rest
    # server_nice = N (0-19): the servers' scheduling priority is lowered by N, so the client reads on time
    # start_together = false (GPU profiles): servers that fit beside each other still start one at a time
    "placement": frozenset({"co_resident", "client_cpus", "server_nice", "start_together"}),
}
_TABLES = ("target", "server", "matrix", "verdicts", "timings", "methods", "validity", "placement")
#: [timings] keys the dry run's estimate cannot do without (run_overhead_s has a default).
_TIMINGS_NEEDED = ("server_start_s", "stream_tok_s", "max_tok_s")

#: The bounds of each `[validity]` limit (low, high, low excluded): shares are fractions of a run, the loop
#: lag is in ms, and an idle timeout of 0 would call every server hung.
_VALIDITY_BOUNDS: dict[str, tuple[float, float | None, bool]] = {
    "max_failed_share": (0, 1, False), "max_token_mismatch_share": (0, 1, False),
    "max_coalesced_share": (0, 1, False), "max_loop_lag_mean_ms": (0, None, False), "hung_timeout_s": (0, None, True),
    "max_run_slowdown": (0, 1, False), "max_neighbour_cores": (0, None, False),
}


def _is_number(value: Any, kind: type) -> bool:
    """A TOML number of ``kind`` (a bool is not one; an int is a float)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and (kind is float or isinstance(value, int)))


def _numbers(raw: Any, what: str, path: Path, *, kind: type, low: float, high: float | None = None,
             above: bool = False, lists: bool = True) -> None:
    """Each value (one, or a list when ``lists``) is a number of ``kind`` from ``low`` (excluded when
    ``above``) to ``high``; one value only when not ``lists``."""
    if isinstance(raw, list) and not lists:
        raise ConfigError(f"profile {path}: {what} must be one {'whole number' if kind is int else 'number'}, "
                          f"got {raw!r}")
    for v in raw if isinstance(raw, list) else [raw]:
        if not _is_number(v, kind) or not math.isfinite(v) or v < low or (above and v == low) or (
                high is not None and v > high):
            bound = f"{'>' if above else '>='} {low}" + (f" and <= {high}" if high is not None else "")
            raise ConfigError(f"profile {path}: {what} must be {'a whole number' if kind is int else 'a number'} "
                              f"{bound}{' (or a list of them)' if lists else ''}, got {v!r}")


def _text(value: Any, what: str, path: Path, hint: str = "") -> None:
    """A non-empty string."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"profile {path}: {what} must be a non-empty string{hint}, got {value!r}")


def renamed_keys(raw: dict[str, Any], path: Path) -> None:
    """Each former spelling of a key (`RENAMED_KEYS`) read as its new name, with a deprecation warning naming
    the file; both spellings in one table is an error (which one was meant?)."""
    for (table, old), new in RENAMED_KEYS.items():
        section = raw.get(table)
        if not isinstance(section, dict) or old not in section:
            continue
        if new in section:
            raise ConfigError(f"profile {path}: [{table}] sets both {old} and {new}, its new name: keep {new}")
        warnings.warn(SpecDecDeprecationWarning(f"profile {path}: [{table}] {old} is deprecated and goes in the "
                                                f"next release: rename it {new}"), stacklevel=3)
        section[new] = section.pop(old)


def check_keys(raw: dict[str, Any], path: Path) -> None:
    """Unknown keys, and tables that are not tables, are an error naming the key, its table, the file and
    what is allowed."""

    def check(table: dict[str, Any], allowed: frozenset[str], where: str) -> None:
        for key in table:
            if key not in allowed:
                raise ConfigError(
                    f"profile {path}: unknown key {key!r} in {where}; allowed: {', '.join(sorted(allowed))}"
                )

    check(raw, PROFILE_KEYS[""], "the top level")
    for section in _TABLES:
        if section in raw and not isinstance(raw[section], dict):
            raise ConfigError(f"profile {path}: {section} must be a table ([{section}]), got {raw[section]!r}")
    for section in _TABLES:
        if section != "methods":
            check(raw.get(section, {}), PROFILE_KEYS[section], f"[{section}]")
    for name, entry in raw.get("methods", {}).items():
        if not isinstance(entry, dict):
            raise ConfigError(f"profile {path}: methods.{name} must be a table, got {entry!r}")
        check(entry, PROFILE_KEYS["methods.*"], f"[methods.{name}]")
        if "target" in entry:
            if not isinstance(entry["target"], dict):
                raise ConfigError(f"profile {path}: methods.{name}.target must be a table like "
                                  f"{{ model = \"ORG/NAME\" }}, got {entry['target']!r}")
            check(entry["target"], PROFILE_KEYS["methods.*.target"], f"[methods.{name}] target")
    for key, where in (("name", "the top level"), ("target", "the top level")):
        if key not in raw:
            raise ConfigError(f"profile {path}: missing key {key!r} in {where}")
    if "model" not in raw["target"]:
        raise ConfigError(f"profile {path}: missing key 'model' in [target]")


def _check_top(raw: dict[str, Any], path: Path) -> None:
    """The top level's own keys."""
    _text(raw["name"], "name", path)
    for key in ("description", "hardware"):
        if key in raw:
            _text(raw[key], key, path)
    if raw.get("device", "cuda") not in ("cpu", "cuda"):
        raise ConfigError(f"profile {path}: device must be 'cpu' or 'cuda', got {raw.get('device')!r}")
    if "gpus" in raw:
        _numbers(raw["gpus"], "gpus", path, kind=int, low=1, lists=False)
    price = raw.get("price_per_hour_usd")
    if price is not None and (not _is_number(price, float) or not math.isfinite(price) or price <= 0):
        raise ConfigError(f"profile {path}: price_per_hour_usd must be a number > 0 (USD per GPU hour), got {price!r}")
    names = raw.get("nvidia_smi_names")
    if names == ANY_GPU:
        if raw.get("device", "cuda") != "cuda" or "hardware" in raw:
            raise ConfigError(f"profile {path}: nvidia_smi_names = {ANY_GPU!r} is for a cuda profile without "
                              "`hardware`: the GPU class nvidia-smi lists at run time is what its baselines are keyed "
                              "by; remove `hardware` (or list the GPU names instead of 'any')")
    elif names is not None and (not isinstance(names, list) or not names
                                or not all(isinstance(n, str) and n.strip() for n in names)):
        raise ConfigError(f"profile {path}: nvidia_smi_names must be a non-empty list of GPU names as "
                          f"`nvidia-smi --query-gpu=name --format=csv,noheader` prints them, or {ANY_GPU!r} for any "
                          f"one class of NVIDIA GPU, got {names!r}")


def _check_target_and_server(raw: dict[str, Any], path: Path) -> None:
    """[target], [server] and the methods' speculative configs."""
    target = raw["target"]
    _text(target["model"], "[target] model", path, " (a hub id, a path or zoo:NAME)")
    if "revision" in target:
        _text(target["revision"], "[target] revision", path, " (a hub branch, tag or commit)")
    _check_parallel(raw, path)
    check_server_args(raw.get("server", {}).get("args", []), f"profile {path}: [server] args")
    env = raw.get("server", {}).get("env", {})
    if not isinstance(env, dict):
        raise ConfigError(f"profile {path}: [server] env must be a table of environment variables ([server.env]), "
                          f"got {env!r}")
    for name, value in env.items():
        if not isinstance(value, str) and not _is_number(value, float):
            raise ConfigError(f"profile {path}: [server.env] {name} must be a string or a number, got {value!r}")
    missing = raw.get("server", {}).get("env_if_missing", {})
    if not isinstance(missing, dict):
        raise ConfigError(f"profile {path}: [server] env_if_missing must be a table of Python module names, each a "
                          f"table of environment variables ({{ flashinfer = {{ VAR = \"0\" }} }}), got {missing!r}")
    for module, variables in missing.items():
        if not module.isidentifier():
            raise ConfigError(f"profile {path}: [server.env_if_missing] {module!r} must be the name of a top-level "
                              "Python module (as `import NAME` takes it)")
        if not isinstance(variables, dict) or not all(
                isinstance(v, str) or _is_number(v, float) for v in variables.values()):
            raise ConfigError(f"profile {path}: [server.env_if_missing] {module} must be a table of environment "
                              f"variables whose values are strings or numbers, got {variables!r}")
    for name, entry in raw.get("methods", {}).items():
        config = entry.get("speculative_config")
        if not isinstance(config, dict):
            raise ConfigError(f"profile {path}: [methods.{name}] needs speculative_config, a table such as "
                              f"{{ method = \"ngram\" }}, got {config!r}")
        if config.get("method") not in VLLM_METHODS:
            raise ConfigError(
                f"profile {path}: methods.{name}.speculative_config.method must be one of "
                f"{', '.join(VLLM_METHODS)}, got {config.get('method')!r}"
            )
        for key in ("revision", "code_revision"):
            if key in config:
                _text(config[key], f"methods.{name}.speculative_config.{key}", path, " (a hub branch, tag or commit)")
        own = entry.get("target")
        if own is not None:
            if "model" not in own:
                raise ConfigError(f"profile {path}: missing key 'model' in [methods.{name}] target")
            _text(own["model"], f"methods.{name}.target.model", path, " (a hub id or a path)")
            if "revision" in own:
                _text(own["revision"], f"methods.{name}.target.revision", path, " (a hub branch, tag or commit)")


def _check_parallel(raw: dict[str, Any], path: Path) -> None:
    """[target] tensor_parallel_size and pipeline_parallel_size: whole numbers >= 1 whose product (the GPUs of one
    server) the profile's host (`gpus`) has; a method's draft_tensor_parallel_size: 1 or the target's TP, the
    only values vLLM's SpeculativeConfig takes (`_verify_and_get_draft_tp`)."""
    target = raw["target"]
    for key in ("tensor_parallel_size", "pipeline_parallel_size"):
        if key in target:
            _numbers(target[key], f"[target] {key}", path, kind=int, low=1, lists=False)
    tp, pp = target.get("tensor_parallel_size", 1), target.get("pipeline_parallel_size", 1)
    gpus = raw.get("gpus")
    if gpus is not None and tp * pp > gpus:
        raise ConfigError(f"profile {path}: [target] tensor_parallel_size ({tp}) x pipeline_parallel_size ({pp}) = "
                          f"{tp * pp} GPUs per server, but the profile's host has gpus = {gpus}; lower them or raise "
                          "gpus")
    for name, entry in raw.get("methods", {}).items():
        config = entry.get("speculative_config")
        if not isinstance(config, dict) or "draft_tensor_parallel_size" not in config:
            continue
        what = f"methods.{name}.speculative_config.draft_tensor_parallel_size"
        _numbers(config["draft_tensor_parallel_size"], what, path, kind=int, low=1, lists=False)
        if config["draft_tensor_parallel_size"] not in (1, tp):
            raise ConfigError(f"profile {path}: {what} must be 1 or the target's tensor_parallel_size ({tp}), as "
                              f"vLLM requires, got {config['draft_tensor_parallel_size']!r}")


def _check_runs(raw: dict[str, Any], path: Path) -> None:
    """[matrix] and [verdicts]: the workload's values, and runs against max_runs."""
    matrix = raw.get("matrix", {})
    for key, kind, low, high in (("k", int, 1, None), ("temperature", float, 0, 2), ("concurrency", int, 1, None)):
        if key in matrix:
            _numbers(matrix[key], f"[matrix] {key}", path, kind=kind, low=low, high=high)
    for key in ("runs", "ab_runs", "ab_first_look", "ab_look_step", "num_prompts", "max_tokens"):
        if key in matrix:
            _numbers(matrix[key], f"[matrix] {key}", path, kind=int, low=1, lists=False)
    first, most = matrix.get("ab_first_look", DEFAULT_AB_FIRST_LOOK), matrix.get("ab_runs", DEFAULT_AB_RUNS)
    if first > most:
        raise ConfigError(f"profile {path}: [matrix] ab_first_look ({first}) is above ab_runs ({most}), the most pairs "
                          "an A/B test takes; lower ab_first_look or raise ab_runs")
    verdicts = raw.get("verdicts", {})
    if "max_runs" in verdicts:
        _numbers(verdicts["max_runs"], "[verdicts] max_runs", path, kind=int, low=1, lists=False)
        runs = matrix.get("runs", DEFAULT_RUNS)
        if verdicts["max_runs"] < runs:
            raise ConfigError(f"profile {path}: [verdicts] max_runs ({verdicts['max_runs']}) is below the runs per "
                              f"test ([matrix] runs: {runs}); raise max_runs or lower runs")
    if "ab_thresholds" in verdicts:
        _check_ab_thresholds(verdicts["ab_thresholds"], path)
    if "min_night_sd" in verdicts:
        sd = verdicts["min_night_sd"]
        if not _is_number(sd, float) or not 0 <= sd < 100:
            raise ConfigError(f"profile {path}: [verdicts] min_night_sd must be a number of % in [0, 100), "
                              f"got {sd!r}")
    if "night_prior" in verdicts:
        _check_night_prior(verdicts["night_prior"], path)
    if "machine_state_tolerance" in verdicts:
        tol = verdicts["machine_state_tolerance"]
        if not _is_number(tol, float) or not 0 < tol < 100:
            raise ConfigError(f"profile {path}: [verdicts] machine_state_tolerance must be a number of % in (0, 100), "
                              f"got {tol!r}")


#: What an A/B session judges (gate/ab_session.py) and the kinds a threshold may name instead; the upper bounds
#: keep a drop of 100 % (or 100 points) out, which would leave nothing to measure.
AB_THRESHOLD_NAMES: dict[str, float | None] = {"output_tok_s": 100, "acceptance_rate": 100, "e2e_p95_ms": None,
                                                "rate": 100, "acceptance": 100, "latency": None}


def _check_night_prior(table: Any, path: Path) -> None:
    """[verdicts] night_prior: sds (% for ratio and absolute, points for acceptance) and df, each a number."""
    what = "[verdicts] night_prior"
    if not isinstance(table, dict):
        raise ConfigError(f"profile {path}: {what} must be a table like {{ ratio = 10.0, absolute = 30.0, df = 2 }}, "
                          f"got {table!r}")
    for key, value in table.items():
        if key not in NIGHT_PRIOR_KEYS:
            raise ConfigError(f"profile {path}: unknown key {key!r} in {what}; allowed: {', '.join(NIGHT_PRIOR_KEYS)}")
        ok = _is_number(value, float) and math.isfinite(value) and (value > 0 if key == "df" else 0 <= value < 100)
        if not ok:
            bound = "> 0" if key == "df" else "in [0, 100)"
            raise ConfigError(f"profile {path}: {what} {key} must be a number {bound}, got {value!r}")


def night_prior_table(raw: dict[str, Any]) -> dict[str, float]:
    """A checked profile's night prior: its `[verdicts] night_prior` over `DEFAULT_NIGHT_PRIOR`."""
    return {**DEFAULT_NIGHT_PRIOR, **{k: float(v) for k, v in raw.get("verdicts", {}).get("night_prior", {}).items()}}


def _check_ab_thresholds(table: Any, path: Path) -> None:
    """[verdicts] ab_thresholds: an inline table of the A/B metrics' (or their kinds') thresholds, % or points."""
    what = "[verdicts] ab_thresholds"
    if not isinstance(table, dict):
        raise ConfigError(f"profile {path}: {what} must be a table like {{ output_tok_s = 5.0 }}, got {table!r}")
    for key, value in table.items():
        if key not in AB_THRESHOLD_NAMES:
            raise ConfigError(f"profile {path}: unknown key {key!r} in {what}; allowed: "
                              f"{', '.join(AB_THRESHOLD_NAMES)}")
        high = AB_THRESHOLD_NAMES[key]
        if not _is_number(value, float) or not math.isfinite(value) or value <= 0 or (high and value >= high):
            bound = f"> 0 and < {high:g}" if high else "> 0"
            raise ConfigError(f"profile {path}: {what} {key} must be a number {bound} (% for rates and latencies, "
                              f"points for acceptance), got {value!r}")


def _check_limits(raw: dict[str, Any], path: Path) -> None:
    """[timings], [validity] and [placement]."""
    timings = raw.get("timings", {})
    for key, value in timings.items():
        _numbers(value, f"[timings] {key}", path, kind=float, low=0, above=key != "run_overhead_s", lists=False)
    missing = [key for key in _TIMINGS_NEEDED if key not in timings]
    if timings and missing:
        raise ConfigError(f"profile {path}: [timings] needs {', '.join(missing)} (see cpu.toml for their meaning)")
    for key, value in raw.get("validity", {}).items():
        low, high, above = _VALIDITY_BOUNDS.get(key, (0, None, False))
        _numbers(value, f"[validity] {key}", path, kind=float, low=low, high=high, above=above, lists=False)
    placement = raw.get("placement", {})
    if not isinstance(placement.get("co_resident", True), bool):
        raise ConfigError(f"profile {path}: [placement] co_resident must be true or false, "
                          f"got {placement['co_resident']!r}")
    together = placement.get("start_together")
    if together is not None and not isinstance(together, bool):
        raise ConfigError(f"profile {path}: [placement] start_together must be true or false, got {together!r}")
    if together and raw.get("device", "cuda") == "cpu":
        raise ConfigError(f"profile {path}: [placement] start_together = true is for GPU profiles: on device = 'cpu' "
                          "the starts would share the cores the servers run on; leave it out")
    client_cpus = placement.get("client_cpus")
    if client_cpus is not None:
        if not _is_number(client_cpus, int) or client_cpus < 0:
            raise ConfigError(f"profile {path}: [placement] client_cpus must be a whole number >= 0 (CPUs left to "
                              f"the client; 0 = servers not pinned), got {client_cpus!r}")
        if raw.get("device", "cuda") != "cpu":
            raise ConfigError(f"profile {path}: [placement] client_cpus is for device = 'cpu' profiles; on GPUs "
                              "use --specdec-pin-cpus (CPUs local to the leased GPUs)")
    nice = placement.get("server_nice")
    if nice is not None and (not _is_number(nice, int) or not 0 <= nice <= 19):
        raise ConfigError(f"profile {path}: [placement] server_nice must be a whole number from 0 (the client's "
                          f"priority) to 19 (the lowest), got {nice!r}")



def check_server_args(args: Any, where: str) -> None:
    """`vllm serve` arguments a profile's [server] or an engine mode adds: a list of strings or numbers, none that
    pins a revision or sets what the plugin chooses (host, port), and a memory fraction the placement can read.
    ``where`` names them in errors (``profile P: [server] args``)."""
    if not isinstance(args, list):
        raise ConfigError(f"{where} must be a list of `vllm serve` arguments, got {args!r}")
    for arg in args:
        if not isinstance(arg, str) and not _is_number(arg, float):
            raise ConfigError(f"{where} must be a list of `vllm serve` arguments (strings or numbers), got {arg!r}")
        flag = str(arg).partition("=")[0]
        if flag_name(flag) in REVISION_FLAGS:
            raise ConfigError(f"{where} sets {flag}; pin the target's revision with [target] revision (a method's "
                              "own target: its target's revision), which baselines are keyed by")
        if flag_name(flag) in PARALLEL_FLAGS:
            raise ConfigError(f"{where} sets {flag}; say it with [target] {PARALLEL_FLAGS[flag_name(flag)]} (one "
                              "place, so both arms and the GPU leases get the same), and remove it here")
        if flag_name(flag) in PLUGIN_FLAGS:
            raise ConfigError(f"{where} sets {flag}, but the plugin chooses each server's host (--specdec-host) and "
                              f"port (a free one per start) and reads the server there; remove {flag}")
    try:  # which servers fit beside each other reads it (profiles/starts.py)
        from pytest_specdec.servers.gpus import memory_fraction

        memory_fraction([str(arg) for arg in args])
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None

def check_values(raw: dict[str, Any], path: Path) -> None:
    """Every value the plugin reads later, checked now, so a bad file fails before any server starts."""
    _check_top(raw, path)
    _check_target_and_server(raw, path)
    _check_runs(raw, path)
    _check_limits(raw, path)


def validity_rules(raw: dict[str, Any]) -> ValidityRules:
    """The file's `[validity]` limits (checked by `check_values`), the defaults for the rest."""
    return ValidityRules(**{key: float(value) for key, value in raw.get("validity", {}).items()})
