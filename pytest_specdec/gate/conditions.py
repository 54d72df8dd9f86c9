"""What a baseline records besides its runs: the conditions that must match for tonight to be compared
(comparability), and what the gate judges when they do (under test).

Why two records: a different GPU, dataset or sampling makes a comparison meaningless (not-comparable),
while a new vLLM, draft head or engine config is exactly the change the gate exists to judge.
"""

from __future__ import annotations

import importlib.metadata as md
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pytest_specdec import __version__, redact

if TYPE_CHECKING:
    from pytest_specdec.measure.types import Sampling
    from pytest_specdec.profiles import Profile
    from pytest_specdec.profiles.engines import EngineMode
    from pytest_specdec.vllm.command import ServerSpec


def machine(profile: Profile) -> dict[str, Any]:
    """The machine's part of the comparability record (its fingerprint): the CPU model and CPU count of a
    CPU profile, the profile's GPU class (for a profile of any GPU, the class nvidia-smi listed) and count of a GPU
    profile, and the identity that tells two hosts of
    one name apart (`servers/hardware.py`: CPU family, caches, ISA flags; each GPU's memory, power and clock
    limits). Its `gate.baselines.hardware_key` names the folder of this machine's baselines."""
    from pytest_specdec.servers.hardware import gpu_identity

    if profile.device == "cpu":
        return cpu_machine()
    return {"hardware": profile.hardware, "device": profile.device,
            "device_count": int(profile.raw.get("gpus", profile.tensor_parallel_size)), "identity": gpu_identity()}


def cpu_machine() -> dict[str, Any]:
    """This machine's fingerprint under a CPU profile: its CPU model, how many CPUs it has, and its identity."""
    from pytest_specdec.servers.hardware import cpu_identity, cpu_model

    return {"hardware": cpu_model(), "device": "cpu", "device_count": os.cpu_count(), "identity": cpu_identity()}


def comparability(profile: Profile, fingerprint: Mapping[str, Any], method: str, workload: dict[str, Any],
                  dataset: dict[str, Any], ref_spec: ServerSpec, spec_spec: ServerSpec | None, sampling: Sampling,
                  engine: EngineMode | None = None) -> dict[str, Any]:
    """What must be equal for tonight to be compared with the baseline; ``fingerprint`` is the machine's part
    (`machine`), read once a session: its identity reads sysfs, and on a GPU host runs nvidia-smi. A test in an
    engine mode other than the default records the mode (its name, args and env): its args are in ``server_args``
    already, its env is not, and a night of the default mode (which records none) stays comparable as before."""
    from pytest_specdec.gate.baselines import model_identity

    args = list(ref_spec.args)
    dp = args[args.index("--data-parallel-size") + 1] if "--data-parallel-size" in args[:-1] else "1"
    speculation = None
    if spec_spec is not None and spec_spec.speculative_config is not None:
        speculation = {k: v for k, v in spec_spec.speculative_config.items() if k != "model"}
    return {
        **fingerprint,
        "tensor_parallel_size": profile.tensor_parallel_size,
        "data_parallel_size": int(dp),
        "target": model_identity(ref_spec.model, ref_spec.revision),  # its pinned revision too: other weights
        "dataset": dataset,
        "workload": workload,
        "sampling": sampling.to_request(),
        "server_args": redact.args(args),  # a committed file: a token given as an arg never lands there
        "method": method,
        "speculation": speculation,
        **({"engine": {"name": engine.name, **engine.definition()}}
           if engine is not None and not engine.is_default else {}),
    }


def _version(dist: str | None) -> str | None:
    try:
        return md.version(dist) if dist else None
    except md.PackageNotFoundError:
        return None


def under_test(profile: Profile, engines: dict[str, dict[str, Any]], spec_spec: ServerSpec | None, *,
               endpoint: bool, endpoint_versions: Mapping[str, Mapping[str, str | None]] | None = None
               ) -> dict[str, Any]:
    """What the gate judges: versions, the draft/head identity, the plugin, each arm's resolved engine
    config (``engines``: arm -> the config its server reported). For external endpoints the versions are
    the endpoint's own, never this client's: ``endpoint_versions`` (arm -> {"vllm", "torch", "cuda",
    "driver"} as its /server_info or /version told them, None: not told), else what their engine configs
    say, else marked unknown. A CPU profile records no CUDA or driver, as for its own servers."""
    from pytest_specdec.gate.baselines import model_identity, portable
    from pytest_specdec.servers.hardware import driver_version
    from pytest_specdec.vllm.cli import vllm_distribution
    from pytest_specdec.vllm.install import cuda_of, this_install

    draft = None
    if spec_spec is not None and spec_spec.speculative_config and spec_spec.speculative_config.get("model"):
        cfg = spec_spec.speculative_config
        draft = model_identity(str(cfg["model"]), cfg.get("revision"))
    engine_config = {arm: portable(e) for arm, e in engines.items()}
    if endpoint:  # someone else's server: its own versions, never this client's
        told = list(endpoint_versions.values()) if endpoint_versions is not None else [
            {"vllm": e.get("vllm_version")} for e in engines.values()]

        def served(name: str) -> str:
            return ", ".join(sorted({str(v[name]) for v in told if v.get(name)})) or UNKNOWN

        return {"vllm": served("vllm"), "vllm_distribution": UNKNOWN, "torch": served("torch"),
                "cuda": None if profile.device == "cpu" else served("cuda"),
                "driver": None if profile.device == "cpu" else served("driver"),
                "plugin": __version__, "draft": draft, "engine_config": engine_config, "endpoint": "external"}
    dist = vllm_distribution()
    return {
        "vllm": _version(dist), "vllm_distribution": dist, "torch": _version("torch"),
        "cuda": None if profile.device == "cpu" else cuda_of(this_install()),
        "driver": None if profile.device == "cpu" else driver_version(),
        "plugin": __version__, "draft": draft, "engine_config": engine_config, "endpoint": "owned",
        **loaded_revisions(profile, spec_spec),
    }


def loaded_revisions(profile: Profile, spec_spec: ServerSpec | None) -> dict[str, Any]:
    """``{"loaded_revisions": {"target": commit, "draft": commit}}``: the hub commits this machine's servers
    loaded (their cache's), pinned or not, so a draft head or target changed upstream shows as an under-test
    diff; pinned revisions differing between nights are a comparability difference instead (the speculation's
    ``revision`` and the target's). Empty when no hub model is in the cache (the zoo: local directories, hashed)."""
    from pytest_specdec.vllm.revision import is_hub_id, loaded_revision

    target, revision = (spec_spec.model, spec_spec.revision) if spec_spec is not None else profile.target_of("none")
    env = dict(spec_spec.env) if spec_spec is not None else dict(profile.server_env)
    models = {"target": (target, revision)}
    config = spec_spec.speculative_config if spec_spec is not None else None
    if config and isinstance(config.get("model"), str):
        models["draft"] = (config["model"], config.get("revision"))
    loaded = {role: loaded_revision(model, rev, env) for role, (model, rev) in models.items() if is_hub_id(model)}
    found = {role: commit for role, commit in loaded.items() if commit is not None}
    return {"loaded_revisions": found} if found else {}


#: What an external endpoint's versions are recorded as when it does not tell them (no /server_info).
UNKNOWN = "unknown (external endpoint)"
