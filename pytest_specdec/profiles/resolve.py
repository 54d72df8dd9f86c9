"""Which profile a session runs: the one named by --gpu/--specdec-profile, or for `--gpu=auto` the built-in
profile whose GPU names cover what nvidia-smi lists; a GPU profile is checked against the GPUs, except
where it cannot be (a dry run, endpoint mode), and the results say which. A profile of any NVIDIA GPU
(`nvidia_smi_names = "any"`, never picked by `auto`) takes the class nvidia-smi lists as its hardware. A profile
whose servers span several GPUs (a 70B target at TP 4) is never picked by `auto` either: the GPU class does not
say which target a user means to serve, so such a profile is chosen by name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_specdec.errors import ConfigError

if TYPE_CHECKING:
    from pytest_specdec.profiles import Profile
    from pytest_specdec.servers.hardware import GpuList


@dataclass(frozen=True)
class Resolved:
    profile: Profile
    gpu_names: str | None  # nvidia-smi's GPUs ("NVIDIA H100 80GB HBM3 x8"), when they were listed
    note: str  # how the profile was (or was not) checked against this machine's GPUs


def auto_candidates() -> dict[str, tuple[str, ...]]:
    """Each built-in profile's GPU names as `--gpu auto` matches them: none for a profile whose servers span
    several GPUs (chosen by name only), so an H100 host still picks `h100`, not the 70B profile beside it."""
    from pytest_specdec.profiles import builtin_profiles, load_profile

    profiles = {name: load_profile(name) for name in builtin_profiles()}
    return {name: p.nvidia_smi_names if p.server_gpus == 1 else () for name, p in profiles.items()}


def detect_profile_name(gpus: GpuList | None = None) -> str:
    """`--gpu auto`: cpu without NVIDIA GPUs, else the built-in profile for the GPUs nvidia-smi lists."""
    from pytest_specdec.servers.hardware import list_gpus, pick_profile

    return pick_profile(list_gpus() if gpus is None else gpus, auto_candidates())


def resolve(name: str, *, endpoint: bool, dry_run: bool, drafts: dict[str, str]) -> Resolved:
    """The active profile (with --specdec-draft overrides), checked against nvidia-smi where it can be."""
    from pytest_specdec.profiles import load_profile
    from pytest_specdec.servers.hardware import check_profile, list_gpus

    gpus = None
    gpu_names: str | None = None
    note = ""
    if name == "auto":
        gpus = list_gpus()
        name = detect_profile_name(gpus)
    profile = load_profile(name)
    names = " / ".join(profile.nvidia_smi_names)
    if profile.any_gpu:
        return _any_gpu(profile, endpoint=endpoint, dry_run=dry_run, drafts=drafts)
    if gpus is not None and gpus.names:  # --gpu=auto chose it from these GPUs
        gpu_names = gpus.describe()
        note = f"--gpu=auto picked profile {profile.name} for {gpu_names}"
    elif profile.nvidia_smi_names and endpoint:
        note = (f"profile {profile.name} was NOT checked against GPUs: in endpoint mode the servers run "
                f"elsewhere; make sure they run on {names}")
    elif profile.nvidia_smi_names and dry_run:
        note = f"profile {profile.name} was NOT checked against this machine's GPUs (dry run); it is for {names}"
    elif profile.nvidia_smi_names:
        gpus = gpus or list_gpus()
        check_profile(profile.name, profile.nvidia_smi_names, gpus)
        gpu_names = gpus.describe()
        note = f"GPUs checked: {gpu_names}"
    elif profile.device == "cuda":
        note = f"profile {profile.name} names no nvidia_smi_names: the GPUs it runs on are not checked"
    return Resolved(profile.with_drafts(drafts), gpu_names, note)


def _any_gpu(profile: Profile, *, endpoint: bool, dry_run: bool, drafts: dict[str, str]) -> Resolved:
    """A profile of any NVIDIA GPU: its hardware is the one GPU class nvidia-smi lists (a dry run does not look;
    endpoint mode cannot: the servers' GPUs are not this machine's)."""
    import dataclasses

    from pytest_specdec.servers.hardware import list_gpus, one_gpu_class

    if dry_run:
        note = (f"profile {profile.name} was NOT checked against this machine's GPUs (dry run); it runs on any one "
                "class of NVIDIA GPU, and its baselines are keyed by the class nvidia-smi lists")
        return Resolved(profile.with_drafts(drafts), None, note)
    if endpoint:
        raise ConfigError(f"profile {profile.name} keys its baselines by the GPU nvidia-smi lists on this machine, "
                          "but in endpoint mode the servers run elsewhere: use --specdec-profile PATH with a profile "
                          "whose `hardware` names their GPU")
    gpus = list_gpus()
    found = dataclasses.replace(profile, detected_hardware=one_gpu_class(profile.name, gpus))
    note = f"GPUs checked: {gpus.describe()} (profile {profile.name} runs on any NVIDIA GPU; keyed by this class)"
    return Resolved(found.with_drafts(drafts), gpus.describe(), note)


def max_model_len(profile: Profile) -> int | None:
    """The profile's `--max-model-len` (None when its server args leave it to the model)."""
    from pytest_specdec.vllm.command import arg_value

    value = arg_value(profile.server_args, "--max-model-len")
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"profile {profile.name!r}: --max-model-len {value!r} is not a whole number") from None


def run_limits(profile: Profile, runs: int | None, max_runs: int | None, *, ab: bool = False
               ) -> tuple[tuple[int, int], str | None]:
    """(runs, max_runs) per test and a note for the terminal: the command line's explicit values (``runs``,
    ``max_runs``; None: not given) win over the profile's defaults. An explicit --specdec-runs above the profile's
    [verdicts] max_runs raises it (the note says so); an explicit --specdec-max-runs below the runs is an error.
    An A/B session (``ab``) counts pairs: its first look is --specdec-runs, else [matrix] ab_first_look, and it
    adds pairs (ab_look_step at a time) up to --specdec-max-runs, else ab_runs (raised to an explicit runs) while
    the stop rule sees use in them (docs/gate.md). The profile's own values are checked when it is read."""
    n = runs or (profile.ab_first_look if ab else profile.runs)
    if ab and max_runs is None:
        return (n, max(n, profile.ab_runs)), None
    if max_runs is not None:
        if max_runs < n:
            source = ("--specdec-runs" if runs else f"[matrix] {'ab_first_look' if ab else 'runs'} of profile "
                      f"{profile.path}")
            raise ConfigError(f"--specdec-max-runs {max_runs} is below the runs per test ({n}, {source}); raise "
                              "--specdec-max-runs or lower --specdec-runs")
        return (n, max_runs), None
    if profile.max_runs is not None and profile.max_runs < n:  # only an explicit runs gets here
        return (n, n), (f"specdec: --specdec-runs {n} raises the profile's [verdicts] max_runs from "
                        f"{profile.max_runs} to {n} ({profile.path})")
    return (n, profile.max_runs or n), None
