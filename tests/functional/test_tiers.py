"""The unit tier's guard (tests/purity.py) fails a test that starts a subprocess, opens or serves a socket, or
sleeps, and leaves a pure one alone: run on planted tests in a pytester project whose conftest applies it as
tests/conftest.py does to tests/unit (where tests/unit/test_purity.py shows it applied). And pytester's in-process
runs keep the modules torch cannot import twice (tests/conftest.py's KEPT_ACROSS_PYTESTER)."""

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


def test_in_process_runs_keep_the_modules_torch_cannot_import_twice(pytester: pytest.Pytester) -> None:
    """A module of torch's kin first imported in a run stays after it (torch's operators outlive a dropped module,
    so its second import fails); any other module is dropped, and a run's ``sys.modules["vllm"] = None`` undone."""
    pytester.makepyfile(test_imports="""
        import sys, types

        def test_imports():
            for name in ("torch.kept_probe", "transformers.kept_probe", "dropped_probe"):
                sys.modules[name] = types.ModuleType(name)
            sys.modules["vllm"] = None
    """)
    vllm_before = sys.modules.get("vllm", "absent")
    try:
        pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
        assert "torch.kept_probe" in sys.modules and "transformers.kept_probe" in sys.modules
        assert "dropped_probe" not in sys.modules
        assert sys.modules.get("vllm", "absent") is vllm_before
    finally:
        for name in ("torch.kept_probe", "transformers.kept_probe"):
            sys.modules.pop(name, None)
