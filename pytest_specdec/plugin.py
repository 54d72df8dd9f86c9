"""pytest entry point (`pytest11`): wires hooks only; the implementation lives in the other modules.

State lives in one `SpecDecSession` kept in `config.stash`; heavy modules are imported inside
the hooks so `pytest --help` stays fast.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator
from typing import TYPE_CHECKING, Any, Callable

import pytest

if TYPE_CHECKING:
    from .fixture import SpecDec
    from .markers import Case
    from .session import SpecDecSession

session_key = pytest.StashKey["SpecDecSession"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    from .options import addoption

    addoption(parser)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]) -> None:
    # `--update-baselines` takes an optional value; spelled bare before a path, argparse would take the
    # path as the value. Make the bare flag explicit so `pytest --update-baselines suites/` works.
    args[:] = ["--update-baselines=all" if a == "--update-baselines" else a for a in args]


def _progress(config: pytest.Config) -> Callable[[str], None]:
    """Progress lines that reach the terminal even while output is captured."""

    def write(line: str) -> None:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        capman = config.pluginmanager.get_plugin("capturemanager")
        if reporter is None:
            return
        with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
            reporter.ensure_newline()
            reporter.write_line(line)

    return write


def pytest_configure(config: pytest.Config) -> None:
    from .markers import MARKER_SIGNATURE, VERDICTS_MARKER_SIGNATURE
    from .options import Settings
    from .session import SpecDecSession

    config.addinivalue_line("markers", MARKER_SIGNATURE)
    config.addinivalue_line("markers", VERDICTS_MARKER_SIGNATURE)
    settings = Settings.from_config(config)
    if settings.update_baselines and getattr(config.option, "numprocesses", None):
        raise pytest.UsageError("--update-baselines with pytest-xdist (-n) is not supported yet: the workers' "
                                "measurements do not reach the controller that writes; run without -n")
    config.stash[session_key] = SpecDecSession(settings, config.rootpath, _progress(config))


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(session_key, None)
    if session is not None:
        session.close()  # every server we started, also after a failure or Ctrl-C
        del config.stash[session_key]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker("specdec")
    if marker is None:
        return
    from .markers import PARAM, expand, varying_fields

    if PARAM not in metafunc.fixturenames:
        raise pytest.UsageError(
            f"{metafunc.definition.nodeid} has the specdec marker but does not use the `specdec` "
            "fixture: add `specdec` to its arguments"
        )
    cases = expand(dict(marker.kwargs), metafunc.config.stash[session_key].profile, marker.args)
    varying = varying_fields(cases)
    metafunc.parametrize(PARAM, cases, ids=[c.id(varying) for c in cases], indirect=True)


def _case(item: pytest.Item) -> Case | None:
    from .markers import PARAM

    callspec = getattr(item, "callspec", None)
    return callspec.params.get(PARAM) if callspec is not None else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Tests sharing a server run together: reorder the specdec tests among their own slots.
    slots = [i for i, item in enumerate(items) if _case(item) is not None]
    ordered = sorted((items[i] for i in slots), key=lambda it: _case(it).server_key())  # type: ignore[union-attr]
    for i, item in zip(slots, ordered):
        items[i] = item
    session = config.stash[session_key]
    from .verdicts import metrics_per_test

    session.family_size = sum(metrics_per_test(c.method, c.k) for c in (_case(items[i]) for i in slots) if c)
    if session.settings.dry_run and slots:
        for line in session.dry_run_lines([(items[i].nodeid, _case(items[i])) for i in slots]):  # type: ignore[misc]
            session.progress(line)


@pytest.fixture
def _specdec_case(request: pytest.FixtureRequest) -> Case:
    """The matrix point of this test (parametrized from the specdec marker)."""
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def specdec(request: pytest.FixtureRequest, _specdec_case: Case) -> SpecDec:
    """This test's measurement: interleaved reference and spec runs on the active profile."""
    from .fixture import SpecDec

    session = request.config.stash[session_key]
    if session.settings.dry_run:
        pytest.skip("specdec dry run: nothing started")
    from .markers import verdict_options

    options = verdict_options(request.node.get_closest_marker("specdec_verdicts"))
    handle = SpecDec(session, request.node.nodeid, _specdec_case, options)
    handle.result  # measure now, so failures to start show as setup errors with the log tail
    return handle


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    # After the test body passed: compare with the baseline (a regression fails this test).
    yield
    session = item.config.stash.get(session_key, None)
    if session is None or _case(item) is None or session.settings.dry_run:
        return
    message = session.check(item.nodeid)
    if message:
        pytest.fail(message, pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    session = item.config.stash.get(session_key, None)
    if session is None or _case(item) is None:
        return report
    record = session.records.get(item.nodeid)
    if record is not None and (report.when == "call" or report.failed or report.skipped):
        if record.outcome in ("pending", "passed"):
            record.outcome = report.outcome if report.when == "call" else f"{report.outcome} ({report.when})"
    if report.failed:
        from .errors import SpecDecError

        exc = call.excinfo.value if call.excinfo is not None else None
        # A server that did not start or a regression: the message says it all; else pytest's traceback.
        text = str(exc) if isinstance(exc, (SpecDecError, pytest.fail.Exception)) else report.longreprtext
        for title, tail in session.record_failure(item.nodeid, text):
            report.sections.append((title, tail))
    return report


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    specdec = session.config.stash.get(session_key, None)
    if specdec is None or not specdec.records or hasattr(session.config, "workerinput"):
        return  # baselines are written by the controller only
    specdec.summary_lines = specdec.finalize()
    if specdec.late_regressions and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> Generator[None, None, None]:
    # Outermost wrapper: after pytest's own summary (failures, short summary), so the report line ends it.
    yield
    session = config.stash.get(session_key, None)
    if session is None or not session.records or hasattr(config, "workerinput"):
        return  # the JSON and HTML are written by the controller only
    for line in session.summary_lines:
        terminalreporter.write_line(line)
    paths = session.write_results()
    if session._pool is not None:
        starts = session._pool.starts
        terminalreporter.write_sep("-", f"specdec: {len(starts)} vLLM server start(s), "
                                        f"{len(session._pool.servers)} distinct server spec(s)")
        for start in starts:
            terminalreporter.write_line(f"  {start.method:16s} {start.spec_key}  ready in {start.startup_s:.0f} s")
    for path in paths:
        terminalreporter.write_line(f"specdec results: {path}")
    for path in session.report_paths[-1:]:  # last line of the summary, also when the session failed
        terminalreporter.write_sep("-", f"specdec report: {path.resolve().as_uri()}")
