"""Hardware profiles: which target, which draft or head per method, server arguments, matrix.

A profile is a small TOML file shipped in this package (`cpu.toml`, `gpu-zoo.toml`, `h100.toml`, `h200.toml`,
`a100.toml`, `l40s.toml`, `h100x8-70b.toml`) or a user's own file.  Model names `zoo:NAME` resolve to the packaged CPU
zoo.  Every key is checked once, when the file is read (`schema.py`), and what the plugin reads of it
is a typed attribute of `Profile`.
"""

from __future__ import annotations

import copy
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_specdec.errors import ConfigError
from pytest_specdec.measure.validity import ValidityRules
from pytest_specdec.profiles.engines import EngineMode, profile_engines
from pytest_specdec.profiles.schema import (
    ANY_GPU,
    DEFAULT_AB_FIRST_LOOK,
    DEFAULT_AB_LOOK_STEP,
    DEFAULT_AB_RUNS,
    DEFAULT_NIGHT_PRIOR,
    DEFAULT_RUNS,
    DEFAULT_STATE_TOLERANCE,
    PLUGIN_FLAGS,
    PROFILE_KEYS,
    VLLM_METHODS,
    check_keys,
    check_values,
    night_prior_table,
    renamed_keys,
    validity_rules,
)

if TYPE_CHECKING:
    from pytest_specdec.vllm.command import ServerSpec

__all__ = ["ANY_GPU", "DEFAULT_RUNS", "PLUGIN_FLAGS", "PROFILE_DIR", "PROFILE_KEYS", "VLLM_METHODS", "Profile",
           "builtin_profiles", "load_profile", "server_env", "server_spec"]

PROFILE_DIR = Path(__file__).parent


def builtin_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))


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
    #: `[validity]`: when a run is not to be trusted (the defaults for what the file leaves out).
    validity: ValidityRules = field(default_factory=ValidityRules)
    #: `[verdicts] max_runs`: runs per arm up to which inconclusive verdicts add runs; None when absent.
    max_runs: int | None = None
    #: `[verdicts] min_night_sd`: the floor, in %, on the night-to-night sd of log-scale metrics (0: none).
    min_night_sd: float = 0.0
    #: `[verdicts] machine_state_tolerance`: ±% within which a stored night's machine state (the probe's
    #: figures, `measure/probe.py`) counts as tonight's for the ratio metrics (docs/gate.md, "Machine state").
    machine_state_tolerance: float = DEFAULT_STATE_TOLERANCE
    #: `[verdicts] night_prior` over `schema.DEFAULT_NIGHT_PRIOR`: the night-to-night sd assumed per class
    #: (ratio, absolute %, acceptance points) and its df, before stored nights or a calibration say more.
    night_prior: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_NIGHT_PRIOR))
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    #: GPU names (`nvidia-smi --query-gpu=name`) this profile's figures hold for; empty = not checked.
    nvidia_smi_names: tuple[str, ...] = ()
    builtin: bool = False
    #: `[target] revision`: the hub revision the target is pinned to (vLLM's --revision); None: unpinned.
    target_revision: str | None = None
    #: `[methods.NAME] target`: (model, revision) of a preset that serves its own target in both arms.
    method_targets: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    #: `nvidia_smi_names = "any"`: for one NVIDIA GPU of any class, keyed by the class nvidia-smi lists.
    any_gpu: bool = False
    #: The GPU class nvidia-smi listed for an `any_gpu` profile, once the session checked the GPUs.
    detected_hardware: str | None = None
    #: `[engines.NAME]`: the engine modes a test may name (`specdec(engine=...)`, profiles/engines.py).
    engines: dict[str, EngineMode] = field(default_factory=dict)
    #: `[target] pipeline_parallel_size`: with tensor_parallel_size, the GPUs each server spans (both arms').
    pipeline_parallel_size: int = 1

    @property
    def server_gpus(self) -> int:
        """GPUs one server of this profile spans: TP x PP x DP of the reference's command ([target]'s sizes, and a
        --data-parallel-size in [server] args), read as the GPU leases read it (`servers.gpus.gpus_needed`), so the
        price and the leases count one number; both arms alike but for a draft with a wider TP of its own."""
        from pytest_specdec.servers.gpus import gpus_needed

        return gpus_needed(server_spec(self, "none", None).args, None)

    @property
    def night_prior_source(self) -> str:
        """Where `night_prior` comes from, as a verdict's note names it."""
        if "night_prior" in self.raw.get("verdicts", {}):
            return f"profile {self.name}'s night_prior"
        return "the default night prior (assumed, measured on no host)"

    @property
    def hardware(self) -> str:
        """What this profile's baselines are keyed by (the comparability's `hardware`): the file's `hardware` (its
        name when it has none), or for an `any_gpu` profile the GPU class nvidia-smi listed at run time."""
        if self.detected_hardware:
            return self.detected_hardware
        if self.any_gpu:
            return "any NVIDIA GPU"
        return str(self.raw.get("hardware", self.name))

    def target_of(self, method: str) -> tuple[str, str | None]:
        """(model, revision) the servers of `method`'s tests serve: the preset's own target, else the profile's."""
        return self.method_targets.get(method, (self.target, self.target_revision))

    @property
    def runs(self) -> int:
        """`[matrix] runs`: run pairs per test at the first look."""
        return int(self.matrix.get("runs", DEFAULT_RUNS))

    @property
    def ab_runs(self) -> int:
        """`[matrix] ab_runs`: the most pairs per test in an A/B session unless --specdec-max-runs says otherwise."""
        return int(self.matrix.get("ab_runs", DEFAULT_AB_RUNS))

    @property
    def ab_first_look(self) -> int:
        """`[matrix] ab_first_look`: an A/B test's pairs at its first look unless --specdec-runs says otherwise."""
        return int(self.matrix.get("ab_first_look", DEFAULT_AB_FIRST_LOOK))

    @property
    def ab_look_step(self) -> int:
        """`[matrix] ab_look_step`: the pairs an A/B test adds at each look after its first (scripts/ab_simulation.py
        chose each built-in profile's)."""
        return int(self.matrix.get("ab_look_step", DEFAULT_AB_LOOK_STEP))

    def method_names(self) -> list[str]:
        return ["none", *self.methods]

    def with_drafts(self, overrides: dict[str, str], option: str = "--specdec-draft") -> Profile:
        """This profile with the draft/head `model` of some methods replaced (`--specdec-draft`; an A/B session's
        base, `--specdec-base-draft`, goes the same way: ``option`` names the flag in errors).

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
                    f"{option} {method}=...: method {method!r} is not in profile {self.name!r}; "
                    f"allowed: {', '.join(methods)}"
                )
            if "model" not in methods[method]:
                raise ConfigError(
                    f"{option} {method}=...: method {method!r} of profile {self.name!r} has no draft "
                    f"model to replace (its speculative_config is {methods[method]})"
                )
            methods[method]["model"] = _resolve(model)
            for key in ("revision", "code_revision"):  # pinned for the replaced draft, not for this one
                methods[method].pop(key, None)
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
    renamed_keys(raw, path)
    check_keys(raw, path)
    check_values(raw, path)
    server, verdicts = raw.get("server", {}), raw.get("verdicts", {})
    any_gpu = raw.get("nvidia_smi_names") == ANY_GPU
    return Profile(
        name=raw["name"],
        path=path,
        device=raw.get("device", "cuda"),
        target=_resolve(raw["target"]["model"]),
        tensor_parallel_size=raw["target"].get("tensor_parallel_size", 1),
        server_args=tuple(str(a) for a in server.get("args", [])),
        server_env=tuple(sorted((str(k), str(v)) for k, v in server_env(server).items())),
        methods={name: _resolve(dict(entry["speculative_config"])) for name, entry in raw.get("methods", {}).items()},
        matrix=dict(raw.get("matrix", {})),
        validity=validity_rules(raw),
        max_runs=verdicts.get("max_runs"),
        min_night_sd=float(verdicts.get("min_night_sd", 0.0)),
        machine_state_tolerance=float(verdicts.get("machine_state_tolerance", DEFAULT_STATE_TOLERANCE)),
        night_prior=night_prior_table(raw),
        raw=raw,
        nvidia_smi_names=() if any_gpu else tuple(n.strip() for n in raw.get("nvidia_smi_names", [])),
        any_gpu=any_gpu,
        builtin=path.resolve().parent == PROFILE_DIR.resolve(),
        target_revision=raw["target"].get("revision"),
        method_targets={name: (_resolve(entry["target"]["model"]), entry["target"].get("revision"))
                        for name, entry in raw.get("methods", {}).items() if "target" in entry},
        engines=profile_engines(raw, path),
        pipeline_parallel_size=raw["target"].get("pipeline_parallel_size", 1),
    )


def server_env(server: dict[str, Any]) -> dict[str, Any]:
    """A profile's `[server]` environment: `env`, plus each `env_if_missing` table whose Python module this
    interpreter (the one `vllm serve` runs in) cannot find. Why: vLLM turns some kernels on by default and fails at
    start where their package is not installed (FlashInfer's sampler on a machine without FlashInfer); a profile
    for many machines switches them off only where they are missing, and `env` wins over it."""
    import importlib.util

    env: dict[str, Any] = {}
    for module, variables in server.get("env_if_missing", {}).items():
        if importlib.util.find_spec(module) is None:
            env.update(variables)
    env.update(server.get("env", {}))
    return env


def server_spec(profile: Profile, method: str, k: int | None, extra_env: dict[str, str] | None = None,
                target_of: str | None = None) -> ServerSpec:
    """The server for `method` at k on `profile` (reference when method is `none`), serving the target of
    ``target_of`` (a reference for that preset's tests; default: `method`'s)."""
    from pytest_specdec.vllm.command import ServerSpec

    args = list(profile.server_args)
    if profile.tensor_parallel_size > 1:  # the reference too: both arms span the same GPUs
        args += ["--tensor-parallel-size", str(profile.tensor_parallel_size)]
    if profile.pipeline_parallel_size > 1:
        args += ["--pipeline-parallel-size", str(profile.pipeline_parallel_size)]
    env = dict(profile.server_env)
    env.update(extra_env or {})
    model, revision = profile.target_of(target_of or method)
    return ServerSpec(
        model=model,
        revision=revision,
        speculative_config=profile.speculative_config(method, k),
        args=tuple(args),
        env=tuple(sorted(env.items())),
    )
