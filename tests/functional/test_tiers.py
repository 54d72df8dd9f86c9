"""The unit tier's guard (tests/purity.py) fails a test that starts a subprocess, opens or serves a socket, or
sleeps, and leaves a pure one alone: run on planted tests in a pytester project whose conftest applies it as
tests/conftest.py does to tests/unit (where tests/unit/test_purity.py shows it applied). And pytester's in-process
runs keep the installed modules, which torch's kind cannot import twice (tests/conftest.py)."""

from __future__ import annotations

import sys

import pytest


def test_the_unit_guard_fails_impure_tests_and_names_what_they_did(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("""
        import pytest
        from purity import refuse_impure

        @pytest.fixture(autouse=True)
        def _pure(monkeypatch):
            refuse_impure(monkeypatch)
    """)
    pytester.makepyfile(test_planted="""
        import http.server, socket, subprocess, time

        def test_sleeps():
            time.sleep(0.01)

        def test_connects():
            with socket.socket() as s:
                s.connect(("127.0.0.1", 9))

        def test_serves():
            http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)

        def test_runs_a_process():
            subprocess.run(["true"])

        def test_pure():
            assert sorted([2, 1]) == [1, 2]
    """)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=4)
    for what in ("slept", "opened a connection", "bound a socket", "started a subprocess"):
        result.stdout.fnmatch_lines([f"*AssertionError: a unit test {what}: move it to tests/functional*"])


def test_in_process_runs_keep_installed_modules_and_drop_the_projects(pytester: pytest.Pytester) -> None:
    """A module installed in the environment (torch's kind, which cannot be imported twice) first imported in a run
    stays after it; the project's own modules are dropped, and a run's ``sys.modules["vllm"] = None`` is undone."""
    pytester.makepyfile(test_imports=f"""
        import sys, types

        def test_imports():
            for name, path in (("kept_probe", {sys.prefix!r} + "/lib/site-packages/kept_probe.py"),
                               ("dropped_probe", __file__)):
                sys.modules[name] = types.ModuleType(name)
                sys.modules[name].__file__ = path
            sys.modules["vllm"] = None
    """)
    vllm_before = sys.modules.get("vllm", "absent")
    try:
        pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
        assert "kept_probe" in sys.modules and "dropped_probe" not in sys.modules and "test_imports" not in sys.modules
        assert sys.modules.get("vllm", "absent") is vllm_before
    finally:
        sys.modules.pop("kept_probe", None)
