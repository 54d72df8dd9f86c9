"""pytest entry point (`pytest11`): wires hooks only; the implementation lives in the other modules.

State lives in one `SpecDecSession` kept in `config.stash`; heavy modules are imported inside
the hooks so `pytest --help` stays fast.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pytest_specdec.fixture import SpecDec
    from pytest_specdec.markers import Case
    from pytest_specdec.session import SpecDecSession

session_key = pytest.StashKey["SpecDecSession"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    from pytest_specdec.options import addoption

    addoption(parser)


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
    from pytest_specdec.markers import MARKER_SIGNATURE, VERDICTS_MARKER_SIGNATURE
    from pytest_specdec.options import Settings
    from pytest_specdec.session import SpecDecSession

    # `pytest --update-baselines suites/`: argparse gave the path to the flag's optional value; give it back
    # (in place of the default, testpaths or the current directory, when it was the only path).
    paths = getattr(config.option, "specdec_update_paths", [])
    if paths and config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args[:] = paths
        config.args_source = pytest.Config.ArgsSource.ARGS
    elif paths:
        config.args.extend(paths)
    config.addinivalue_line("markers", MARKER_SIGNATURE)
    config.addinivalue_line("markers", VERDICTS_MARKER_SIGNATURE)
    settings = Settings.from_config(config)
    if not hasattr(config, "workerinput"):  # an xdist worker parses the same command line: one warning each
        _warn_renamed(config)
    from pytest_specdec import redact

    redact.extend(settings.redact)
    if getattr(config.option, "dist", "no") != "no" and not hasattr(config, "workerinput"):  # the xdist controller
        from pytest_specdec.parallel import check_xdist

        check_xdist(config.option.dist, settings)
    workerinput = getattr(config, "workerinput", None)
    worker = workerinput["workerid"] if workerinput else None
    progress = (_worker_progress(settings.reports_dir / "logs" / worker / "progress.log") if worker
                else _progress(config))
    session = SpecDecSession(settings, config.rootpath, progress)
    session.worker = worker
    session.workers = workerinput["workercount"] if workerinput else 1
    config.stash[session_key] = session
    session.check_configure()
    # Nothing else here: no signal handler, file or /proc scan until a specdec test is collected (`_start_using`).


def _warn_renamed(config: pytest.Config) -> None:
    """One deprecation warning per former spelling of an option given (`Option.old`)."""
    from pytest_specdec.errors import SpecDecDeprecationWarning
    from pytest_specdec.option_values import RENAMED_DEST

    for old, new in dict.fromkeys(getattr(config.option, RENAMED_DEST, None) or []):
        config.issue_config_time_warning(SpecDecDeprecationWarning(
            f"{old} is deprecated and goes in the next release: use {new}"), stacklevel=2)


def pytest_sessionstart(session: pytest.Session) -> None:
    specdec = session.config.stash.get(session_key, None)
    if specdec is not None and not specdec.worker and specdec.runs_note:  # the xdist controller speaks
        specdec.progress(specdec.runs_note)


def _used(item: pytest.Item) -> bool:
    """A specdec test: the marker, or the `specdec` fixture (which fails at its setup without the marker)."""
    return item.get_closest_marker("specdec") is not None or "specdec" in getattr(item, "fixturenames", ())


def _start_using(specdec: SpecDecSession) -> str | None:
    """A session that will run specdec tests, before any server starts: the server logs' directory checked
    (a full or read-only one is one line now; returned), SIGTERM/SIGHUP made to unwind like Ctrl-C so servers
    stop, and servers an earlier session left running stopped (on xdist by the first worker, once). A session
    without specdec tests never gets here: the plugin is quiet until used, as pytest-xdist is."""
    from pytest_specdec.servers.hygiene import find_strays, interrupt_on_termination, remove_strays
    from pytest_specdec.servers.spawn import log_dir_problem

    logs = specdec.settings.reports_dir / "logs"
    problem = log_dir_problem(logs)
    if problem:
        return f"specdec: {problem}"
    specdec.undo_signals = interrupt_on_termination()
    if specdec.worker in (None, "gw0"):
        strays = find_strays(str(logs))
        for stray in strays:
            line = f"specdec: stopping a vLLM server an earlier session left running: {stray.line()}"
            specdec.progress(line)
            if specdec.worker:  # its progress goes to a file: the controller's summary shows it too
                specdec.worker_lines.append(line)
        remove_strays(strays)
    return None


def _worker_progress(path: Path) -> Callable[[str], None]:
    """xdist workers have no terminal: their progress lines (server starts, GPU waits) go to a file."""

    def write(line: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(f"{time.strftime('%H:%M:%S')} {line}\n")

    return write


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(session_key, None)
    if session is not None:
        session.close()  # every server we started, also after a failure or Ctrl-C
        session.undo_signals()
        del config.stash[session_key]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker("specdec")
    if marker is None:
        return
    from pytest_specdec.markers import PARAM, varying_fields

    if PARAM not in metafunc.fixturenames:
        raise pytest.UsageError(
            f"{metafunc.definition.nodeid} has the specdec marker but does not use the `specdec` "
            "fixture: add `specdec` to its arguments"
        )
    from pytest_specdec.errors import ConfigError

    try:
        cases = metafunc.config.stash[session_key].expand(dict(marker.kwargs), marker.args)
    except ConfigError as exc:  # bad input: the message says what to fix; a traceback would bury it
        raise pytest.Collector.CollectError(f"{metafunc.definition.nodeid}: {exc}") from None
    varying = varying_fields(cases)
    metafunc.parametrize(PARAM, cases, ids=[c.id(varying) for c in cases], indirect=True)


def _case(item: pytest.Item) -> Case | None:
    from pytest_specdec.markers import PARAM

    callspec = getattr(item, "callspec", None)
    return callspec.params.get(PARAM) if callspec is not None else None


def _options(item: pytest.Item) -> Any:
    """The test's `specdec_verdicts` options; a bad marker is reported by the fixture, so none here."""
    from pytest_specdec.errors import ConfigError
    from pytest_specdec.markers import verdict_options

    try:
        return verdict_options(item.get_closest_marker("specdec_verdicts"))
    except ConfigError:
        return None


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    # Tests sharing a server run together: reorder the specdec tests among their own slots.
    cased = {i: case for i, item in enumerate(items) if (case := _case(item)) is not None}
    slots = list(cased)
    pairs = [(items[i], cased[i]) for i in sorted(slots, key=lambda i: cased[i].server_key())]
    for i, (item, _) in zip(slots, pairs, strict=True):
        items[i] = item
    specdec = config.stash[session_key]
    cases = [c for _, c in pairs]
    st = specdec.settings
    runs = not (config.option.collectonly or st.dry_run)
    problem = None
    if cases and runs and not st.endpoint:  # servers would start
        from pytest_specdec.vllm.installed import missing_vllm

        problem = missing_vllm(specdec.profile.device) or specdec.gpu_problem()
    if not problem and runs and any(_used(item) for item in items):
        problem = _start_using(specdec)
    if problem and specdec.worker:  # an xdist worker cannot raise one: it stops, and the controller says it
        session.shouldstop = problem
        items[:] = []
        return
    if problem:  # one usage error now, not one error per test at its server start
        raise pytest.UsageError(problem)
    if cases:
        specdec.check_thresholds()  # before anything runs: a bad threshold is a usage error naming where it is
    # The test-end padding counts what a marker's gate=[...] adds, or a test-end `regressed` could fall
    # back to `inconclusive` once the session's gated family is known.
    specdec.plan([(item.nodeid, c, _options(item)) for item, c in pairs])
    if slots and specdec.worker == "gw0":  # one worker says it, not each
        from pytest_specdec.parallel import parallel_warning

        warning = parallel_warning(specdec, getattr(config, "workerinput", {}).get("workercount", 0))
        if warning is not None:
            import warnings

            warnings.warn(warning, stacklevel=1)
    if specdec.settings.dry_run and slots:
        for line in specdec.dry_run_lines([(item.nodeid, c) for item, c in pairs]):
            specdec.progress(line)


@pytest.fixture
def _specdec_case(request: pytest.FixtureRequest) -> Case:
    """The matrix point of this test (parametrized from the specdec marker)."""
    return request.param


@pytest.fixture
def specdec(request: pytest.FixtureRequest, _specdec_case: Case) -> SpecDec:
    """This test's measurement: interleaved reference and spec runs on the active profile."""
    from pytest_specdec.fixture import SpecDec

    session = request.config.stash[session_key]
    if session.settings.dry_run:
        pytest.skip("specdec dry run: nothing started")
    from pytest_specdec.markers import verdict_options

    options = verdict_options(request.node.get_closest_marker("specdec_verdicts"))
    from pytest_specdec.gate.crossover_gate import recorded
    from pytest_specdec.markers import PARAM

    callspec = getattr(request.node, "callspec", None)
    others = {k: recorded(v) for k, v in (callspec.params if callspec else {}).items() if k != PARAM}
    handle = SpecDec(session, request.node.nodeid, _specdec_case, options, others)
    _ = handle.result  # measure now, so failures to start show as setup errors with the log tail
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
    if report.when == "call" or (report.when == "setup" and report.failed):  # once: its measurement's last phase
        session.say_drift(item.nodeid)
    if record is not None and (report.when == "call" or report.failed or report.skipped):
        if record.outcome in ("pending", "passed"):
            record.outcome, record.when = report.outcome, report.when
        if report.when != "teardown":  # --junitxml takes the properties from the teardown report
            from pytest_specdec.output.junit import test_properties

            item.user_properties[:] = [p for p in item.user_properties if not str(p[0]).startswith("specdec_")]
            item.user_properties.extend(test_properties(record))
    if report.failed:
        from pytest_specdec.errors import SpecDecError

        exc = call.excinfo.value if call.excinfo is not None else None
        # A server that did not start or a regression: the message says it all; else pytest's traceback.
        text = str(exc) if isinstance(exc, (SpecDecError, pytest.fail.Exception)) else report.longreprtext
        for title, tail in session.record_failure(item.nodeid, text):
            report.sections.append((title, tail))
    return report


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object | None) -> None:
    # xdist controller: a worker finished; its records join the session's before sessionfinish.
    specdec = node.config.stash.get(session_key, None)
    if specdec is None:
        return
    blob = getattr(node, "workeroutput", {}).get("specdec")
    if blob is not None:
        from pytest_specdec.parallel import merge_worker

        specdec.xdist_lines += merge_worker(specdec, blob)
    elif error is not None:
        specdec.xdist_lines.append(
            f"specdec: xdist worker {node.gateway.id} went down ({error}) before sending its measurements: "
            "its specdec tests are missing from the results and wrote no baselines")


@pytest.hookimpl(tryfirst=True)  # before --junitxml writes its file, so the session's properties are in it
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    specdec = session.config.stash.get(session_key, None)
    if specdec is None:
        return
    from pytest_specdec.servers.spawn import CANNOT_WRITE_LOGS
    from pytest_specdec.vllm.installed import MISSING_VLLM

    dsession = session.config.pluginmanager.getplugin("dsession")  # xdist's controller
    # a worker's usage error
    if str(getattr(dsession, "shouldstop", "")).startswith((MISSING_VLLM, f"specdec: {CANNOT_WRITE_LOGS}")):
        session.exitstatus = pytest.ExitCode.USAGE_ERROR
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller adjusts and writes
        from pytest_specdec.parallel import worker_output

        workeroutput["specdec"] = worker_output(specdec)
        return
    if not specdec.records:
        specdec.summary_lines = list(specdec.xdist_lines)
        return
    from pytest_specdec.session_end import calibrate_session, error_lines, finalize, session_fails, step, write_results

    specdec.summary_lines = [*specdec.xdist_lines, *finalize(specdec)]
    said = len(specdec.errors)
    try:
        specdec.result_paths = write_results(specdec)
        unwritten = False
    except OSError as exc:  # the results are what CI keeps: a session that could not write them fails
        specdec.summary_lines.append(f"specdec: could not write the results ({exc}); fix the directory or point "
                                     "--specdec-reports-dir (or --specdec-json / --specdec-report-html) elsewhere")
        unwritten = True
    if not unwritten:
        specdec.summary_lines += step(specdec, "the calibration (--specdec-calibrate)",
                                      lambda: calibrate_session(specdec), [])
    specdec.summary_lines += error_lines(specdec)[said:]  # a test's entry or the report that could not be made
    _junit_session_properties(session.config, specdec)
    if session_fails(specdec, results_written=not unwritten) and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _junit_session_properties(config: pytest.Config, specdec: SpecDecSession) -> None:
    """The machine factor and test count as the JUnit file's test-suite properties (with --junitxml)."""
    from _pytest.junitxml import xml_key  # LogXML's stash key: no public handle outside a fixture

    xml = config.stash.get(xml_key, None)
    if xml is not None:
        from pytest_specdec.output.junit import session_properties

        for name, value in session_properties(specdec.end.machine if specdec.end else None, len(specdec.records)):
            xml.add_global_property(name, value)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config
                            ) -> Generator[None, None, None]:
    # Outermost wrapper: after pytest's own summary (failures, short summary), so the report line ends it.
    yield
    session = config.stash.get(session_key, None)
    if session is None or hasattr(config, "workerinput"):
        return
    for line in session.summary_lines:
        terminalreporter.write_line(line)
    if not session.records:
        return
    paths = session.result_paths
    starts = session.server_starts()
    if starts:
        terminalreporter.write_sep("-", f"specdec: {len(starts)} vLLM server start(s), "
                                        f"{len({s.spec_key for s in starts})} distinct server spec(s)")
        from pytest_specdec.output.progress import server_start_lines

        for line in server_start_lines(starts):
            terminalreporter.write_line(line)
    if session.time is not None:
        terminalreporter.write_line(session.time.line())
    for line in session.gate_summary:
        terminalreporter.write_line(line)
    for path in paths:
        terminalreporter.write_line(f"specdec results: {path}")
    for path in session.report_paths[-1:]:  # last line of the summary, also when the session failed
        terminalreporter.write_sep("-", f"specdec report: {path.resolve().as_uri()}")
