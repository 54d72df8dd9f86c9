"""The package's layers, enforced with import-linter (contracts in pyproject.toml): wiring -> app -> output ->
gate -> profiles -> measure -> servers -> vllm, no import cycles between siblings, and no pytest in the
process, measurement and statistics code. Each contract is also shown to fail on a planted violation."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# import-linter over the whole package, once per planted violation.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def lint(root: Path) -> subprocess.CompletedProcess[str]:
    """import-linter on the package under `root`, with that checkout's pyproject.toml."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
                           "sys.exit(lint_imports_command())", "--config", str(root / "pyproject.toml"),
                           "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_the_contracts_hold() -> None:
    r = lint(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "3 kept, 0 broken" in r.stdout, r.stdout


@pytest.mark.parametrize(("module", "line", "contract"), [
    ("vllm/command.py", "import pytest_specdec.session  # noqa: F401", "wiring -> app -> output -> gate"),
    ("servers/pool.py", "from pytest_specdec.gate import stats  # noqa: F401", "wiring -> app -> output -> gate"),
    ("output/compare.py", "from pytest_specdec.app import compare  # noqa: F401", "wiring -> app -> output -> gate"),
    ("app/history.py", "import pytest_specdec.cli  # noqa: F401", "wiring -> app -> output -> gate"),
    ("gate/stats.py", "import pytest  # noqa: F401", "never imports pytest"),
    ("vllm/counters.py", "from pytest_specdec.vllm import cli  # noqa: F401", "no import cycles"),
])
def test_a_planted_violation_breaks_its_contract(tmp_path: Path, module: str, line: str, contract: str) -> None:
    shutil.copytree(ROOT / "pytest_specdec", tmp_path / "pytest_specdec",
                    ignore=shutil.ignore_patterns("models", "__pycache__", "*.jsonl"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    if module == "vllm/counters.py":  # a cycle needs both directions: cli -> counters as well
        cli = tmp_path / "pytest_specdec" / "vllm" / "cli.py"
        cli.write_text(cli.read_text() + "\nfrom pytest_specdec.vllm import counters  # noqa: E402,F401\n")
    target = tmp_path / "pytest_specdec" / module
    target.write_text(target.read_text() + f"\n{line}\n")
    r = lint(tmp_path)
    assert r.returncode != 0, r.stdout
    broken = [ln for ln in r.stdout.splitlines() if " BROKEN" in ln]  # "BROKEN (1 ignored import)" too
    # An upward import also closes a cycle (the upper layer imports the lower one), so both may break.
    assert any(contract in ln for ln in broken), r.stdout
