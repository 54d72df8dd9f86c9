"""Test modules have names unique across tests/ and suites/: pytest imports them by basename (no ``__init__.py``,
``prepend`` mode), and the dry-run tests collect copies of suites/ in the same process as the plugin's own tests, so
two modules of one name fail collection with "import file mismatch" depending on how xdist split the tests."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_no_two_test_modules_share_a_name() -> None:
    modules = [*ROOT.glob("tests/**/test_*.py"), *ROOT.glob("suites/test_*.py")]
    names = Counter(p.name for p in modules)
    assert len(modules) > 100
    assert [n for n, count in names.items() if count > 1] == []
