"""Hardware profiles: which target, which draft or head per method, server arguments, matrix.

A profile is a small TOML file shipped in this package (`cpu.toml`, `h100.toml`, `h200.toml`,
`a100.toml`, `l40s.toml`) or a user's own file.  Model names `zoo:NAME` resolve to the packaged CPU
zoo.  Every key is checked against `SCHEMA` when the file is read: a misspelt key would otherwise be
ignored and the session would measure something other than what the file says.
"""

from __future__ import annotations

import copy
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_specdec.errors import ConfigError
from pytest_specdec.redact import flag_name

if TYPE_CHECKING:
    from pytest_specdec.measure.runner import ValidityRules
    from pytest_specdec.vllm.command import ServerSpec

PROFILE_DIR = Path(__file__).parent
#: Speculation methods vLLM knows (vllm/config/speculative.py), plus `none` for the reference.
VLLM_METHODS = (
    "ngram", "suffix", "draft_model", "eagle", "eagle3", "mtp", "medusa", "mlp_speculator",
)


#: `vllm serve` flags the plugin sets itself: a profile's own would win (argparse keeps the last), so its
#: servers would listen where the plugin does not look, and dev mode would follow the wrong address.
PLUGIN_FLAGS = frozenset({"--host", "--port"})


#: The keys a profile may have, per table. `methods.NAME` tables take `speculative_config` only.
#: Add a key here (and read it somewhere) when the plugin starts to use it.
SCHEMA: dict[str, frozenset[str]] = {
    "": frozenset({
        "name", "description", "device", "hardware", "gpus", "nvidia_smi_names", "price_per_hour_usd",
        "target", "server", "methods", "matrix", "validity", "verdicts", "timings", "placement",
    }),
    "target": frozenset({"model", "tensor_parallel_size", "revision"}),
    "server": frozenset({"args", "env"}),
    "methods.*": frozenset({"speculative_config"}),
    # num_prompts / max_tokens: the workload size of tests whose marker does not set them
    "matrix": frozenset({"k", "temperature", "concurrency", "runs", "num_prompts", "max_tokens"}),
    "verdicts": frozenset({"max_runs", "thresholds", "min_night_sd"}),
    "timings": frozenset({"server_start_s", "stream_tok_s", "max_tok_s", "run_overhead_s"}),
    # co_resident = false: the reference and spec servers cannot be alive at once (arms alternate in blocks)
    # client_cpus = N (cpu profiles): the first N CPUs are left to the client, the servers start on the rest
    # server_nice = N (0-19): the servers' scheduling priority is lowered by N, so the client reads on time
    "placement": frozenset({"co_resident", "client_cpus", "server_nice"}),
}


def builtin_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))


def _check_keys(raw: dict[str, Any], path: Path) -> None:
    """Unknown keys are an error naming the key, its table, the file and what is allowed."""

    def check(table: dict[str, Any], allowed: frozenset[str], where: str) -> None:
        for key in table:
            if key not in allowed:
                raise ConfigError(
                    f"profile {path}: unknown key {key!r} in {where}; allowed: {', '.join(sorted(allowed))}"
                )

    check(raw, SCHEMA[""], "the top level")
    for section in ("target", "server", "matrix", "verdicts", "timings", "methods", "validity", "placement"):
        if section in raw and not isinstance(raw[section], dict):
            raise ConfigError(f"profile {path}: {section} must be a table ([{section}]), got {raw[section]!r}")
    for section in ("target", "server", "matrix", "verdicts", "timings", "placement"):
        check(raw.get(section, {}), SCHEMA[section], f"[{section}]")
    if not isinstance(raw.get("placement", {}).get("co_resident", True), bool):
        raise ConfigError(f"profile {path}: [placement] co_resident must be true or false")
    if "validity" in raw:
        import dataclasses

        from pytest_specdec.measure.runner import ValidityRules

        check(raw["validity"], frozenset(f.name for f in dataclasses.fields(ValidityRules)), "[validity]")
    for name, entry in raw.get("methods", {}).items():
        if not isinstance(entry, dict):
            raise ConfigError(f"profile {path}: methods.{name} must be a table, got {entry!r}")
        check(entry, SCHEMA["methods.*"], f"[methods.{name}]")


def _positive_list(raw: Any, what: str, path: Path, *, kind: type, low: float, high: float | None = None,
                   above: bool = False, lists: bool = True) -> None:
    """Each value (one, or a list when ``lists``) is a number of ``kind`` from ``low`` (excluded when
    ``above``) to ``high``."""
    values = raw if isinstance(raw, list) else [raw]
    for v in values:
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and (kind is float or isinstance(v, int))
        if not ok or not math.isfinite(v) or v < low or (above and v == low) or (high is not None and v > high):
            bound = f"{'>' if above else '>='} {low}" + (f" and <= {high}" if high is not None else "")
            raise ConfigError(f"profile {path}: {what} must be {'a whole number' if kind is int else 'a number'} "
                              f"{bound}{' (or a list of them)' if lists else ''}, got {v!r}")


def _one_number(value: Any, what: str, path: Path, *, kind: type, low: float, high: float | None = None,
                above: bool = False) -> None:
    """As `_positive_list`, for a key that takes one value, never a list."""
    if isinstance(value, list):
        raise ConfigError(f"profile {path}: {what} must be one {'whole number' if kind is int else 'number'}, "
                          f"got {value!r}")
    _positive_list(value, what, path, kind=kind, low=low, high=high, above=above, lists=False)


#: The bounds of each `[validity]` limit (low, high, low excluded), a number >= 0 for any other: shares
#: are fractions of a run, the loop lag is in ms, and an idle timeout of 0 would call every server hung.
_VALIDITY_BOUNDS: dict[str, tuple[float, float | None, bool]] = {
    "max_failed_share": (0, 1, False), "max_token_mismatch_share": (0, 1, False),
    "max_coalesced_share": (0, 1, False), "max_loop_lag_mean_ms": (0, None, False), "idle_timeout_s": (0, None, True),
}


def _check_values(raw: dict[str, Any], path: Path) -> None:
    """Values the plugin reads later, checked now so a bad file fails before any server starts."""
    matrix = raw.get("matrix", {})
    for key, kind, low, high in (("k", int, 1, None), ("temperature", float, 0, 2), ("concurrency", int, 1, None)):
        if key in matrix:
            _positive_list(matrix[key], f"[matrix] {key}", path, kind=kind, low=low, high=high)
    for key in ("runs", "num_prompts", "max_tokens"):
        if key in matrix:
            _one_number(matrix[key], f"[matrix] {key}", path, kind=int, low=1)
    timings = raw.get("timings", {})
    for key, value in timings.items():
        _one_number(value, f"[timings] {key}", path, kind=float, low=0, above=key != "run_overhead_s")
    for key, value in raw.get("validity", {}).items():
        low, high, above = _VALIDITY_BOUNDS.get(key, (0, None, False))
        _one_number(value, f"[validity] {key}", path, kind=float, low=low, high=high, above=above)
    price = raw.get("price_per_hour_usd")
    if price is not None and (isinstance(price, bool) or not isinstance(price, (int, float)) or price <= 0):
        raise ConfigError(f"profile {path}: price_per_hour_usd must be a number > 0 (USD per GPU hour), got {price!r}")
    names = raw.get("nvidia_smi_names")
    if names is not None and (not isinstance(names, list) or not names
                              or not all(isinstance(n, str) and n.strip() for n in names)):
        raise ConfigError(f"profile {path}: nvidia_smi_names must be a non-empty list of GPU names as "
                          f"`nvidia-smi --query-gpu=name --format=csv,noheader` prints them, got {names!r}")
    client_cpus = raw.get("placement", {}).get("client_cpus")
    if client_cpus is not None:
        if isinstance(client_cpus, bool) or not isinstance(client_cpus, int) or client_cpus < 0:
            raise ConfigError(f"profile {path}: [placement] client_cpus must be a whole number >= 0 (CPUs left to "
                              f"the client; 0 = servers not pinned), got {client_cpus!r}")
        if raw.get("device", "cuda") != "cpu":
            raise ConfigError(f"profile {path}: [placement] client_cpus is for device = 'cpu' profiles; on GPUs "
                              "use --specdec-pin-cpus (CPUs local to the leased GPUs)")
    nice = raw.get("placement", {}).get("server_nice")
    if nice is not None and (isinstance(nice, bool) or not isinstance(nice, int) or not 0 <= nice <= 19):
        raise ConfigError(f"profile {path}: [placement] server_nice must be a whole number from 0 (the client's "
                          f"priority) to 19 (the lowest), got {nice!r}")
    args = raw.get("server", {}).get("args", [])
    if not isinstance(args, list):
        raise ConfigError(f"profile {path}: [server] args must be a list of `vllm serve` arguments, got {args!r}")
    for arg in map(str, args):
        flag = arg.partition("=")[0]
        if flag_name(flag) in PLUGIN_FLAGS:
            raise ConfigError(f"profile {path}: [server] args sets {flag}, but the plugin chooses each server's "
                              "host (--specdec-host) and port (a free one per start) and reads the server there; "
                              f"remove {flag} from [server] args")
    if raw.get("device", "cuda") not in ("cpu", "cuda"):
        raise ConfigError(f"profile {path}: device must be 'cpu' or 'cuda', got {raw.get('device')!r}")


@dataclass(frozen=True)
class Profile:
    """A parsed profile; `speculative_config()` gives the vLLM JSON for one method and k."""

    name: str
    path: Path
    device: str
    target: str
    tensor_parallel_size: int
    server_args: tuple[str, ...]
    server_env: tuple[tuple[str, str], ...]
    methods: dict[str, dict[str, Any]]
    matrix: dict[str, Any] = field(default_factory=dict)
    validity: dict[str, float] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    #: GPU names (`nvidia-smi --query-gpu=name`) this profile's figures hold for; empty = not checked.
    nvidia_smi_names: tuple[str, ...] = ()
    builtin: bool = False

    def validity_rules(self, idle_timeout_s: float | None = None) -> ValidityRules:
        """The profile's run-validity limits (`[validity]`), defaults for the rest; ``idle_timeout_s``
        (--specdec-idle-timeout) wins over the profile's."""
        import dataclasses

        from pytest_specdec.measure.runner import ValidityRules

        known = {f.name for f in dataclasses.fields(ValidityRules)}
        unknown = sorted(set(self.validity) - known)
        if unknown:
            raise ConfigError(f"profile {self.path}: unknown [validity] key(s) {unknown}; allowed: {sorted(known)}")
        rules = ValidityRules(**{k: float(v) for k, v in self.validity.items()})
        return rules if idle_timeout_s is None else dataclasses.replace(rules, idle_timeout_s=idle_timeout_s)

    def method_names(self) -> list[str]:
        return ["none", *self.methods]

    def with_drafts(self, overrides: dict[str, str]) -> Profile:
        """This profile with the draft/head `model` of some methods replaced (`--specdec-draft`).

        Why: the nightly after a draft-head upgrade measures the new head under the *same* test ids,
        so its verdicts compare with the old head's baselines (the head's hash is an under-test field).
        """
        if not overrides:
            return self
        import dataclasses

        methods = copy.deepcopy(self.methods)
        for method, model in overrides.items():
            if method not in methods:
                raise ConfigError(
                    f"--specdec-draft {method}=...: method {method!r} is not in profile {self.name!r}; "
                    f"allowed: {', '.join(methods)}"
                )
            if "model" not in methods[method]:
                raise ConfigError(
                    f"--specdec-draft {method}=...: method {method!r} of profile {self.name!r} has no draft "
                    f"model to replace (its speculative_config is {methods[method]})"
                )
            methods[method]["model"] = _resolve(model)
        return dataclasses.replace(self, methods=methods)

    def speculative_config(self, method: str, k: int | None) -> dict[str, Any] | None:
        """vLLM's --speculative-config for `method` (a preset of this profile) with k tokens."""
        if method == "none":
            return None
        if method not in self.methods:
            raise ConfigError(
                f"method {method!r} is not in profile {self.name!r} ({self.path}); "
                f"allowed: {', '.join(self.method_names())}"
            )
        config = copy.deepcopy(self.methods[method])
        if k is not None:
            config["num_speculative_tokens"] = k
        if "num_speculative_tokens" not in config:
            raise ConfigError(f"method {method!r} needs k (num_speculative_tokens)")
        return config


def _resolve(value: Any) -> Any:
    """Replace `zoo:NAME` strings with the packaged model paths (checked against the manifest)."""
    if isinstance(value, str) and value.startswith("zoo:"):
        from pytest_specdec.zoo import zoo_path

        return str(zoo_path(value[4:]))
    if isinstance(value, dict):
        return {k: _resolve(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v) for v in value]
    return value


def load_profile(name_or_path: str) -> Profile:
    """Load a built-in profile by name, or a user's TOML file by path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PROFILE_DIR / f"{name_or_path}.toml"
    if not path.is_file():
        raise ConfigError(
            f"profile {name_or_path!r} not found; built-in profiles: {', '.join(builtin_profiles())}, "
            "or give the path of a .toml file"
        )
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"profile {path}: {exc}") from exc
    _check_keys(raw, path)
    _check_values(raw, path)
    try:
        methods: dict[str, dict[str, Any]] = {}
        for name, entry in raw.get("methods", {}).items():
            config = _resolve(dict(entry["speculative_config"]))
            if config.get("method") not in VLLM_METHODS:
                raise ConfigError(
                    f"profile {path}: methods.{name}.speculative_config.method must be one of "
                    f"{', '.join(VLLM_METHODS)}, got {config.get('method')!r}"
                )
            methods[name] = config
        server = raw.get("server", {})
        return Profile(
            name=raw["name"],
            path=path,
            device=raw.get("device", "cuda"),
            target=_resolve(raw["target"]["model"]),
            tensor_parallel_size=int(raw["target"].get("tensor_parallel_size", 1)),
            server_args=tuple(str(a) for a in server.get("args", [])),
            server_env=tuple(sorted((str(k), str(v)) for k, v in server.get("env", {}).items())),
            methods=methods,
            matrix=dict(raw.get("matrix", {})),
            validity=dict(raw.get("validity", {})),
            raw=raw,
            nvidia_smi_names=tuple(n.strip() for n in raw.get("nvidia_smi_names", [])),
            builtin=path.resolve().parent == PROFILE_DIR.resolve(),
        )
    except KeyError as exc:
        raise ConfigError(f"profile {path}: missing key {exc.args[0]!r}") from exc


def server_spec(profile: Profile, method: str, k: int | None, extra_env: dict[str, str] | None = None) -> ServerSpec:
    """The server for `method` at k on `profile` (reference when method is `none`)."""
    from pytest_specdec.vllm.command import ServerSpec

    args = list(profile.server_args)
    if profile.tensor_parallel_size > 1:
        args += ["--tensor-parallel-size", str(profile.tensor_parallel_size)]
    env = dict(profile.server_env)
    env.update(extra_env or {})
    return ServerSpec(
        model=profile.target,
        speculative_config=profile.speculative_config(method, k),
        args=tuple(args),
        env=tuple(sorted(env.items())),
    )
