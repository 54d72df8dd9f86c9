"""`--update-baselines` in every spelling: bare before or after the test paths, `=missing`, `missing`
after a space, and a typo named as one (the optional value must not swallow a test path)."""

from __future__ import annotations

import pytest

CONFTEST = """
def pytest_collection_finish(session):
    print("MODE", session.config.option.update_baselines,
          "ITEMS", ",".join(sorted(i.name for i in session.items)))
"""


@pytest.fixture
def two_files(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_a="def test_a():\n    pass\n", test_b="def test_b():\n    pass\n")
    return pytester


@pytest.mark.parametrize(("args", "mode", "items"), [
    ((), "None", "test_a,test_b"),
    (("--update-baselines", "test_a.py"), "all", "test_a"),
    (("test_a.py", "--update-baselines"), "all", "test_a"),
    (("--update-baselines", "test_a.py", "test_b.py"), "all", "test_a,test_b"),
    (("--update-baselines", "test_a.py::test_a"), "all", "test_a"),
    (("--update-baselines=missing", "test_a.py"), "missing", "test_a"),
    (("--update-baselines", "missing", "test_b.py"), "missing", "test_b"),
    (("test_b.py", "--update-baselines", "missing"), "missing", "test_b"),
    (("--update-baselines=all", "test_b.py"), "all", "test_b"),
])
def test_every_spelling(two_files: pytest.Pytester, args: tuple[str, ...], mode: str, items: str) -> None:
    r = two_files.runpytest("--co", "-q", "-s", "-p", "no:cacheprovider", *args)
    r.stdout.fnmatch_lines([f"MODE {mode} ITEMS {items}"])
    assert r.ret == 0


def test_a_mistyped_mode_is_an_error_naming_the_modes(two_files: pytest.Pytester) -> None:
    r = two_files.runpytest("--co", "-q", "--update-baselines=mising")
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    r.stderr.fnmatch_lines(["*expected --update-baselines (all) or --update-baselines=missing, got 'mising'*"])
