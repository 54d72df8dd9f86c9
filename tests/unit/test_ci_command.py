"""The README's test command is the one `.ci/run` runs, and it runs every tier: tests/ as a whole, or each folder
of tests/ that holds test modules (a new tier left out of CI would otherwise pass unnoticed)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def readme_command() -> str:
    (line,) = [ln for ln in (ROOT / "README.md").read_text().splitlines()
               if ln.startswith("bash scripts/setup.sh --dev")]
    return line


def test_ci_runs_the_readmes_test_command() -> None:
    lines = [ln for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln and not ln.startswith("#")]
    assert lines[-1] == readme_command()


def test_the_test_command_names_every_tier() -> None:
    named = set(re.findall(r"\btests/(\w*)", readme_command()))
    tiers = {p.parent.name for p in (ROOT / "tests").glob("*/test_*.py")}
    assert tiers == {"unit", "functional", "real_vllm"}
    assert "" in named or tiers <= named, f"the README's test command leaves out tests/{sorted(tiers - named)}"
