"""Each file format reads back and writes again byte for byte: every committed baseline file, crossover record and
calibration record, and a recorded results file. A reader or writer that drops, renames, reorders or rounds a field
differently fails here, on the files users keep."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_specdec.gate.baselines import load, load_sweep, render
from pytest_specdec.gate.calibration import load_calibration, render_record
from pytest_specdec.output.results import render_results
from pytest_specdec.output.schema import load as load_results

ROOT = Path(__file__).resolve().parents[2]
BASELINES = ROOT / "baselines"


def committed(pattern: str) -> list[Path]:
    found = sorted(BASELINES.rglob(pattern))
    assert found, f"no committed {pattern} under {BASELINES}"
    return found


@pytest.mark.parametrize("path", committed("*.json"), ids=lambda p: str(p.relative_to(BASELINES)))
def test_a_committed_baseline_reads_and_writes_back_byte_for_byte(path: Path) -> None:
    data = load(path, "pytest --update-baselines")
    assert data is not None and render(data) == path.read_text(encoding="utf-8")


@pytest.mark.parametrize("path", committed("*.crossover"), ids=lambda p: str(p.relative_to(BASELINES)))
def test_a_committed_crossover_record_reads_and_writes_back_byte_for_byte(path: Path) -> None:
    data = load_sweep(path)
    assert data is not None and render(data) == path.read_text(encoding="utf-8")


@pytest.mark.parametrize("path", committed("*.calibration"), ids=lambda p: str(p.relative_to(BASELINES)))
def test_a_committed_calibration_record_reads_and_writes_back_byte_for_byte(path: Path) -> None:
    data = load_calibration(path)
    assert data is not None and render_record(data) == path.read_text(encoding="utf-8")


def test_a_recorded_results_file_reads_and_writes_back_byte_for_byte() -> None:
    """`tests/data/report_results.json`, a session's file (`tests/data/record_report_results.py`): the typed reader
    takes it whole, and the writer's text of its data is the file."""
    path = ROOT / "tests" / "data" / "report_results.json"
    text = path.read_text(encoding="utf-8")
    data = json.loads(text)
    results = load_results(data, str(path))
    assert len(results.tests) == len(data["tests"]) and render_results(data) == text
