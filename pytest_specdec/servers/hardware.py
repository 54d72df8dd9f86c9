"""Which GPUs this machine has, and whether a profile's figures hold for them.

A GPU profile's baselines, thresholds and timings belong to one GPU class: an H100 PCIe compared with
H100 SXM baselines would "regress" by its lower memory bandwidth alone.  So `--gpu=h100` stops unless
every GPU nvidia-smi lists is one the profile names, and `--gpu=auto` picks the profile whose names
cover them.  No pytest import; nvidia-smi is reached through `list_gpus`, which tests replace with a
fake executable (`SPECDEC_NVIDIA_SMI`) or call the pure functions with a list.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pytest_specdec.errors import ConfigError

#: Path of the nvidia-smi to run instead of the one on PATH (tests point it at a fake script).
SMI_ENV = "SPECDEC_NVIDIA_SMI"
QUERY = ["--query-gpu=name", "--format=csv,noheader"]


@dataclass(frozen=True)
class GpuList:
    """What nvidia-smi said: the GPU names in its order, or why there are none."""

    names: tuple[str, ...]
    problem: str | None = None  # no nvidia-smi, or it failed: the reason, for the stop message

    def describe(self) -> str:
        if not self.names:
            return self.problem or "nvidia-smi lists no GPU"
        counts = Counter(self.names)
        return ", ".join(f"{n} x{c}" if c > 1 else n for n, c in counts.items())


def nvidia_smi(which: Callable[[str], str | None] = shutil.which) -> str | None:
    """The nvidia-smi to run: `SPECDEC_NVIDIA_SMI` when set (tests), else the one on PATH, else None.

    One lookup for every caller (the GPU class check, the lease pool, CPU pinning), so a replaced
    nvidia-smi is replaced everywhere."""
    smi = os.environ.get(SMI_ENV)
    if smi:
        if not (os.path.isfile(smi) and os.access(smi, os.X_OK)):
            raise ConfigError(f"{SMI_ENV}={smi!r} is not an executable file; unset it to use nvidia-smi from PATH")
        return smi
    return which("nvidia-smi")


def list_gpus(run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run) -> GpuList:
    """`nvidia-smi --query-gpu=name --format=csv,noheader`, one name per GPU (every GPU of the machine,
    whatever CUDA_VISIBLE_DEVICES says)."""
    smi = nvidia_smi()
    if smi is None:
        return GpuList((), "no nvidia-smi on PATH (no NVIDIA driver on this machine)")
    try:
        done = run([smi, *QUERY], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return GpuList((), f"{smi} {' '.join(QUERY)} could not run: {exc}")
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        return GpuList((), f"{smi} {' '.join(QUERY)} exited with {done.returncode}"
                           + (f": {said[0]}" if said else ""))
    return GpuList(tuple(line.strip() for line in done.stdout.splitlines() if line.strip()))


def pick_profile(gpus: GpuList, candidates: dict[str, tuple[str, ...]]) -> str:
    """`--gpu=auto`: `cpu` without GPUs, else the one built-in profile naming every GPU listed.

    `candidates` maps profile name -> the nvidia-smi names it is for.  Unknown or mixed GPUs stop:
    guessing a class would compare with baselines measured on different hardware.
    """
    if not gpus.names:
        return "cpu"
    found = set(gpus.names)
    matching = sorted(name for name, names in candidates.items() if names and found <= set(names))
    if len(matching) == 1:
        return matching[0]
    known = "; ".join(f"{name}: {', '.join(names)}" for name, names in sorted(candidates.items()) if names)
    if len(found) > 1:
        why = "GPUs of different classes (a server could land on either, and no profile's figures hold for both)"
    elif matching:
        why = f"GPUs that several profiles claim ({', '.join(matching)})"
    else:
        why = "GPUs no built-in profile is for"
    raise ConfigError(
        f"--gpu=auto: this machine has {why}: {gpus.describe()}. Built-in GPU profiles and the nvidia-smi "
        f"names they are for: {known}. Pass --gpu=cpu, or --specdec-profile PATH with a profile for these GPUs"
    )


def check_profile(profile_name: str, names: tuple[str, ...], gpus: GpuList) -> None:
    """Stop unless every GPU nvidia-smi lists is one of `names` (the profile's class)."""
    if not names:
        return
    if not gpus.names:
        raise ConfigError(
            f"--gpu={profile_name}: the {profile_name} profile is for {' / '.join(names)}, but this machine has "
            f"none: {gpus.describe()}. Its baselines and thresholds would mean nothing here. Use --gpu=auto "
            "(cpu without GPUs), or --specdec-dry-run to see the commands without running them"
        )
    foreign = [n for n in dict.fromkeys(gpus.names) if n not in names]
    if foreign:
        mixed = " (mixed GPUs: every GPU must be of the profile's class)" if len(foreign) < len(set(gpus.names)) else ""
        raise ConfigError(
            f"--gpu={profile_name}: the {profile_name} profile is for {' / '.join(names)} only, but nvidia-smi "
            f"lists {gpus.describe()}{mixed}. Comparing with {profile_name} baselines would measure the hardware "
            f"difference, not speculative decoding. Use --gpu=auto, or --specdec-profile PATH with a profile "
            f"whose nvidia_smi_names list {', '.join(foreign)}"
        )


def one_gpu_class(profile_name: str, gpus: GpuList) -> str:
    """The one GPU class nvidia-smi lists, for a profile of any NVIDIA GPU (`nvidia_smi_names = "any"`): its
    baselines are keyed by that name. No GPU, or GPUs of different classes, stop: a server could land on either,
    and no stored figure holds for both."""
    if not gpus.names:
        raise ConfigError(
            f"--gpu={profile_name}: the {profile_name} profile runs on an NVIDIA GPU, but this machine has none: "
            f"{gpus.describe()}. Use --gpu=cpu, or --specdec-dry-run to see the commands without running them"
        )
    classes = list(dict.fromkeys(gpus.names))
    if len(classes) > 1:
        raise ConfigError(
            f"--gpu={profile_name}: the {profile_name} profile keys its baselines by the one GPU class nvidia-smi "
            f"lists, but it lists {gpus.describe()} (mixed GPUs: a server could land on either). Make one class "
            "visible to nvidia-smi's host, or use --specdec-profile PATH with a profile for these GPUs"
        )
    return classes[0]


def cpu_model() -> str:
    """The CPU's model name (what a CPU profile's baselines are comparable across)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def driver_version() -> str | None:
    """The NVIDIA driver's version, recorded under test (None without nvidia-smi)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return out[0] if out else None


#: The ISA flags vLLM's CPU kernels choose between (oneDNN/IPEX paths for AVX-512, its BF16 and VNNI forms,
#: AMX tiles), as /proc/cpuinfo spells them: two hosts that differ in one of them run different kernels.
ISA_FLAGS: tuple[str, ...] = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "avx_vnni", "amx_bf16",
                              "amx_fp16", "amx_int8", "amx_tile")
#: What nvidia-smi is asked of each GPU for its identity.
GPU_IDENTITY = ("name", "memory.total", "power.limit", "clocks.max.sm", "clocks.max.memory")


def _first_cpu(text: str) -> dict[str, str]:
    """The fields of /proc/cpuinfo's first processor block."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if out:
                break
            continue
        key, _, value = line.partition(":")
        out.setdefault(key.strip(), value.strip())
    return out


def _caches(root: Path) -> dict[str, str]:
    """CPU 0's caches as sysfs gives them (``{"l1d": "48K", "l1i": "32K", "l2": "1024K", "l3": "32768K"}``)."""
    out: dict[str, str] = {}
    for index in sorted(root.glob("index*")):
        try:
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        suffix = {"Data": "d", "Instruction": "i"}.get(kind, "")
        out[f"l{level}{suffix}"] = size
    return out


def cpu_identity(cpuinfo: Path = Path("/proc/cpuinfo"),
                 caches: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> dict[str, object]:
    """What tells one CPU host from another beyond its marketing name: vendor, family/model/stepping, microcode,
    the cache sizes, the ISA flags vLLM's kernels choose between, and how many CPUs this process may use. Two VMs
    named "AMD EPYC, 2 CPUs" on different host generations differ here, and their speedups differ too."""
    try:
        first = _first_cpu(cpuinfo.read_text())
    except OSError:
        first = {}
    flags = set(first.get("flags", "").split())
    return {"vendor": first.get("vendor_id"), "family": first.get("cpu family"), "model": first.get("model"),
            "stepping": first.get("stepping"), "microcode": first.get("microcode"), "caches": _caches(caches),
            "isa": [f for f in ISA_FLAGS if f in flags], "cpus": len(os.sched_getaffinity(0))}


def gpu_identity(run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run) -> dict[str, object]:
    """Each GPU's name, memory, power limit and clock limits (nvidia-smi), beside the host's CPU identity: the
    host-bound part of a spec step (scheduling, sampling, the draft's small kernels) runs there. A GPU whose
    power limit was lowered is another machine for the speedup. ``gpus`` is the reason when nvidia-smi cannot
    say."""
    smi = nvidia_smi()
    gpus: object
    if smi is None:
        gpus = "no nvidia-smi on PATH"
    else:
        query = [smi, f"--query-gpu={','.join(GPU_IDENTITY)}", "--format=csv,noheader"]
        try:
            done = run(query, capture_output=True, text=True, timeout=60)
            rows = [[c.strip() for c in line.split(",")] for line in done.stdout.splitlines() if line.strip()]
            odd = next((r for r in rows if len(r) != len(GPU_IDENTITY)), None)
            gpus = (f"{' '.join(query[1:])} exited with {done.returncode}" if done.returncode != 0 or not rows
                    else f"{' '.join(query[1:])} printed a row of {len(odd)} fields, not {len(GPU_IDENTITY)}: "
                         f"{', '.join(odd)}" if odd is not None
                    else [dict(zip(GPU_IDENTITY, r, strict=True)) for r in rows])
        except (OSError, subprocess.SubprocessError) as exc:
            gpus = f"{' '.join(query[1:])} could not run: {exc}"
    return {"gpus": gpus, "host": cpu_identity()}
