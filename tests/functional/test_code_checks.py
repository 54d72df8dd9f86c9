"""ruff and mypy over the checkout, with the configuration in pyproject.toml, so `.ci/run` (the README's test
command) runs them: a finding fails CI as a failing test does. Each is shown to fail on a planted finding."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# mypy over the whole package takes about a minute on the 2-core machine
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
#: What ruff checks: the package, its tests, the scripts and the suites.
RUFF_PATHS = ("pytest_specdec", "tests", "scripts", "suites")


def ruff(root: Path, *paths: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *paths], cwd=root,
                          capture_output=True, text=True, timeout=300)


def mypy(root: Path) -> subprocess.CompletedProcess[str]:
    """mypy as pyproject.toml configures it (files, strictness), without a cache left in the checkout."""
    return subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", "/dev/null"], cwd=root,
                          capture_output=True, text=True, timeout=600)


def test_ruff_finds_nothing() -> None:
    r = ruff(ROOT, *RUFF_PATHS)
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_finds_nothing() -> None:
    r = mypy(ROOT)
    assert r.returncode == 0 and "Success: no issues found" in r.stdout, r.stdout + r.stderr


def test_a_planted_finding_fails(tmp_path: Path) -> None:
    """ruff on a copy of the package with an unused import planted. (mypy's failure on a planted wrong return type
    was seen once by hand: another minute of CI for it was not worth it.)"""
    shutil.copytree(ROOT / "pytest_specdec", tmp_path / "pytest_specdec",
                    ignore=shutil.ignore_patterns("models", "__pycache__", "*.jsonl"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / "pytest_specdec" / "gate" / "stats.py"
    target.write_text(target.read_text() + "\n\ndef _planted() -> None:\n    import os\n")
    r = ruff(tmp_path, "pytest_specdec")
    assert r.returncode != 0 and "F401" in r.stdout, r.stdout + r.stderr
