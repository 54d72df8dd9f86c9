"""docs/results.md (with the verdict and gate fields it leaves to docs/gate.md's "JSON results") names every field
the results reader types: a field the reader gained and the docs lack fails here. The session tests check the other
direction, what a session writes (`tests/session.undocumented`)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from pytest_specdec.output import schema

DOCS = Path(__file__).resolve().parents[2] / "docs"

#: Reader fields whose key in the file is another: the key the docs name.
FILE_KEY = {("VerdictEntry", "unit"): "delta_unit", ("SweepPointEntry", "at"): "concurrency"}
#: Reader fields that are no key of the file, and what they are read from.
DERIVED = {("TestEntry", "night"): "the test's runs, read as the gate reads a night",
           ("RequestAcceptanceEntry", "overall"): "its own figures, `units` to `ci`, beside `by_category`"}

TYPED = (schema.Results, schema.TestEntry, schema.VerdictEntry, schema.BaselineEntry, schema.ABEntry,
         schema.GateEntry, schema.BaselineUpdate, schema.CrossoverEntry, schema.SweepPointEntry,
         schema.MachineStateEntry, schema.RequestAcceptanceEntry, schema.AcceptanceEntry)


def named() -> set[str]:
    """Every identifier the docs put in backticks: results.md whole, gate.md's "JSON results" section."""
    gate = (DOCS / "gate.md").read_text(encoding="utf-8").split("## JSON results", 1)[1].split("\n## ", 1)[0]
    text = (DOCS / "results.md").read_text(encoding="utf-8") + gate
    return {w for quoted in re.findall(r"`([^`]+)`", text) for w in re.findall(r"[A-Za-z_]\w*", quoted)}


@pytest.mark.parametrize("cls", TYPED, ids=lambda c: c.__name__)
def test_every_field_the_reader_types_is_documented(cls: type) -> None:
    words = named()
    fields = [f.name for f in dataclasses.fields(cls) if (cls.__name__, f.name) not in DERIVED]
    missing = [name for name in fields if FILE_KEY.get((cls.__name__, name), name) not in words]
    assert not missing, f"docs/results.md (or gate.md's JSON results) never names {cls.__name__}'s {missing}"
