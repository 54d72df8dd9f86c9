"""Each file format reads back and writes again byte for byte: every committed baseline file, crossover record and
calibration record, and a recorded results file. A reader or writer that drops, renames, reorders or rounds a field
differently fails here, on the files users keep."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_specdec.errors import SpecDecError
from pytest_specdec.formats import FileFormat
from pytest_specdec.gate.baselines import BASELINE_FILE, CROSSOVER_FILE, load, load_sweep
from pytest_specdec.gate.calibration import CALIBRATION_FILE, load_calibration
from pytest_specdec.output.schema import RESULTS_FILE

ROOT = Path(__file__).resolve().parents[2]
BASELINES = ROOT / "baselines"


def committed(pattern: str) -> list[Path]:
    found = sorted(BASELINES.rglob(pattern))
    assert found, f"no committed {pattern} under {BASELINES}"
    return found


@pytest.mark.parametrize("path", committed("*.json"), ids=lambda p: str(p.relative_to(BASELINES)))
def test_a_committed_baseline_reads_and_writes_back_byte_for_byte(path: Path) -> None:
    data = load(path, "pytest --update-baselines")
    assert data is not None and BASELINE_FILE.render(data) == path.read_text(encoding="utf-8")


@pytest.mark.parametrize("path", committed("*.crossover"), ids=lambda p: str(p.relative_to(BASELINES)))
def test_a_committed_crossover_record_reads_and_writes_back_byte_for_byte(path: Path) -> None:
    data = load_sweep(path)
    assert data is not None and CROSSOVER_FILE.render(data) == path.read_text(encoding="utf-8")


@pytest.mark.parametrize("path", committed("*.calibration"), ids=lambda p: str(p.relative_to(BASELINES)))
def test_a_committed_calibration_record_reads_and_writes_back_byte_for_byte(path: Path) -> None:
    data = load_calibration(path)
    assert data is not None and CALIBRATION_FILE.render(data) == path.read_text(encoding="utf-8")


def test_a_recorded_results_file_reads_and_writes_back_byte_for_byte() -> None:
    """`tests/data/report_results.json`, a session's file (`tests/data/record_report_results.py`): the typed reader
    takes it whole, and the writer's text of its data is the file."""
    path = ROOT / "tests" / "data" / "report_results.json"
    text = path.read_text(encoding="utf-8")
    data = json.loads(text)
    results = RESULTS_FILE.read(data, str(path))
    assert len(results.tests) == len(data["tests"]) and RESULTS_FILE.render(data) == text


@pytest.mark.parametrize("fmt", [BASELINE_FILE, CROSSOVER_FILE, RESULTS_FILE, CALIBRATION_FILE], ids=lambda f: f.kind)
def test_each_format_has_a_step_from_every_older_version(fmt: FileFormat) -> None:
    """A version bumped without the step from the one before is refused where the format is declared; a format
    with steps reaches the current version through them, one at a time."""
    assert all(fmt.older(v) for v in range(1, fmt.version)) and not fmt.older(fmt.version)
    with pytest.raises(ValueError, match=f"no step from version\\(s\\) \\[{fmt.version}\\]"):
        FileFormat(kind=fmt.kind, version=fmt.version + 1, detect=fmt.detect, render=fmt.render, read=fmt.read,
                   counts=fmt.counts, steps=fmt.steps)


def test_a_migration_runs_every_step_in_order_and_leaves_the_input_alone() -> None:
    seen: list[int] = []

    def step(v: int):  # noqa: ANN202
        def run(data: dict) -> dict:
            seen.append(data["schema"])
            return {**data, f"from_{v}": True}
        return run

    fmt = FileFormat(kind="toy", version=4, detect=lambda d: True, render=str, read=lambda d, n: d,
                     counts=lambda d: (0, 0), steps={v: step(v) for v in (1, 2, 3)})
    old = {"schema": 2}
    assert fmt.migrate(old) == {"schema": 4, "from_2": True, "from_3": True} and seen == [2, 3]
    assert old == {"schema": 2}
    with pytest.raises(ValueError, match="toy schema 4 is not one this plugin converts"):
        fmt.migrate({"schema": 4})


@pytest.mark.parametrize("fmt", [BASELINE_FILE, CROSSOVER_FILE, RESULTS_FILE, CALIBRATION_FILE], ids=lambda f: f.kind)
def test_each_reader_refuses_another_version_in_the_formats_one_wording(fmt: FileFormat) -> None:
    """A newer (or unversioned) file is refused by every reader with `FileFormat.version_problem`'s words, and an
    older one with the command that converts it: the wording is the format's, written once."""
    olds = [fmt.schema_of(v) for v in range(1, fmt.version)]
    for schema in (fmt.schema_of(fmt.version + 1), "3", None, 1 if fmt.tag else "1", *olds):
        said, older = fmt.version_problem({"schema": schema}, "f.json") or ("", False)
        assert said.startswith("f.json: ") and older == (schema in olds), schema
        assert (f"convert it, keeping its {' and '.join(fmt.counted.split(', '))}, with `pytest-specdec "
                f"convert-schema f.json`" in said) is older
        with pytest.raises(SpecDecError) as raised:
            fmt.read({"schema": schema}, "f.json")
        assert said in str(raised.value), (schema, str(raised.value))
    assert fmt.version_problem({"schema": fmt.schema_of(fmt.version)}, "f.json") is None
