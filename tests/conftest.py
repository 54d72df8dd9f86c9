"""Shared fixtures of the plugin's tests: simulated vLLM servers, and the profiles and suites of pytester projects.

Layout, in tiers (docs/ci.md gives each tier's command and time):

* ``unit/``: the plugin's modules called directly: pure, with no subprocess, no sleep and no network (purity.py);
* ``functional/``: whole pytest sessions of the plugin through pytester, and the modules against the simulated
  vLLM, subprocesses and the clock;
* ``real_vllm/``: against the installed vLLM; the tests that start real servers are marked ``vllm``;
* the ``slow`` marker, in any tier: what needs a browser, a linter, torch (importing vLLM included) or runs a Monte
  Carlo calibration; the fast tier is ``pytest tests/unit tests/functional -m "not slow"``;
* ``fakes/``: the simulated vLLM (``fakes.FakeServer`` in-process, ``fakes.LAUNCHER`` the ``vllm serve`` stand-in);
* ``factories.py``: the gate's values built with defaults (a verdict, a stored run and night, an A/B judgement);
* ``session.py``: one plugin session of a pytester project (``specdec_session``) and its results file read back;
* ``sims/``: the simulations' models, which the tests check and scripts/ prints full-size figures from;
* ``data/``: recorded inputs (tests/data/record_report_results.py writes report_results.json).

pytest imports this file in its default ``prepend`` import mode, which puts tests/ on sys.path: that is how the test
modules import ``fakes``, ``factories``, ``session``, ``command``, ``sims`` and ``purity``. The test modules have unique
names across the directories (none has an ``__init__.py``).
"""

from __future__ import annotations

import json
import shlex
import stat
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# pytester's in-process runs drop the modules first imported inside them, and numpy warns (an error here) or
# breaks (`_CopyMode.IF_NEEDED is neither True nor False`, when vLLM's import pulls in scipy.stats) when it is
# imported a second time in one process: what the plugin's sessions import is imported here, before any such run.
import _pytest.pytester
import filelock  # noqa: F401
import jinja2  # noqa: F401
import numpy  # noqa: F401
import pytest
import pytest_benchmark.stats  # noqa: F401
import scipy.ndimage  # noqa: F401
import scipy.special  # noqa: F401
import scipy.stats  # noqa: F401
from purity import refuse_impure

import pytest_specdec.gate.baselines  # noqa: F401
import pytest_specdec.gate.judge  # noqa: F401
import pytest_specdec.gate.sequential  # noqa: F401
import pytest_specdec.gate.slo  # noqa: F401
import pytest_specdec.gate.stats  # noqa: F401
import pytest_specdec.gate.verdicts  # noqa: F401
import pytest_specdec.measure.client  # noqa: F401
import pytest_specdec.measure.lossless  # noqa: F401
import pytest_specdec.measure.metrics  # noqa: F401
import pytest_specdec.measure.runner  # noqa: F401
import pytest_specdec.output.report  # noqa: F401  # kept: it compiles the report's template once a process
import pytest_specdec.servers.gpus  # noqa: F401
from fakes import IN_PROCESS_VALIDITY, LAUNCHER, FakeConfig, FakeServer, FakeServerProcess, FakeVllm

#: Where installed modules live: the environment's site-packages and Python's own library.
INSTALLED = tuple(dict.fromkeys((sys.prefix, sys.base_prefix)))


class _SnapshotKeepingInstalled(_pytest.pytester.SysModulesSnapshot):
    """pytester's sys.modules snapshot that also keeps every installed module imported since it was taken.

    Why: torch's modules (and vLLM's and triton's) register operators in torch's process-wide dispatcher, which
    outlives the modules, so importing them a second time fails ("Only a single TORCH_LIBRARY can be used to register
    the namespace c10d_functional"; a second `import torch`: `bad call flags`), and keeping torch alone is not enough:
    a re-imported sympy is another sympy to the torch that was kept ("Could not compare -oo <= oo"). A plugin session
    run in-process imports them when it loads a tokenizer; pytester then dropped them, and the next test to import
    them failed by xdist's split (the dry run of test_profiles_session.py, then test_zoo_draft_slow.py: 9 errors).
    What pytester must undo is the project's own modules (its tests and conftest, under its temporary directory):
    those it still drops, and a session's ``sys.modules[name] = None`` is still undone (not a module)."""

    def __init__(self, preserve: Callable[[str], bool] | None = None) -> None:
        def keep(name: str) -> bool:
            module = sys.modules.get(name)
            path = getattr(module, "__file__", None) if isinstance(module, types.ModuleType) else None
            return (isinstance(path, str) and path.startswith(INSTALLED)) or (preserve is not None and preserve(name))

        super().__init__(preserve=keep)


_pytest.pytester.SysModulesSnapshot = _SnapshotKeepingInstalled  # type: ignore[misc]  # swapping pytester's class

ROOT = Path(__file__).resolve().parent.parent

UNIT = ROOT / "tests" / "unit"


@pytest.fixture(autouse=True)
def _unit_tier_is_pure(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test of tests/unit may not start a subprocess, open a socket or sleep (purity.py)."""
    if UNIT in request.path.parents:
        refuse_impure(monkeypatch)


#: The simulated machine's state (`measure/probe.py`'s figures) every session of the simulated vLLM reads.
STEADY_STATE = {"cores": 2.0, "hash": 2.0}
REAL_VLLM = ROOT / "tests" / "real_vllm"


def probe_script(path: Path, state: dict[str, float]) -> Path:
    """An executable that prints ``state`` as the machine probe does (SPECDEC_MACHINE_PROBE runs it)."""
    path.write_text(f"#!/bin/sh\necho {shlex.quote(json.dumps(state))}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture(autouse=True)
def _simulated_machine_state(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
                             tmp_path_factory: pytest.TempPathFactory) -> None:
    """Sessions of the simulated vLLM run on a simulated machine, whose state is steady unless a test sets it
    (`machine_state`): under ``-n 2`` the real probe would read the other worker's load, session to session. Real
    vLLM's sessions keep the real probe."""
    if REAL_VLLM in request.path.parents or UNIT in request.path.parents:
        return
    path = tmp_path_factory.getbasetemp() / "steady-probe"
    if not path.exists():
        probe_script(path, STEADY_STATE)
    monkeypatch.setenv("SPECDEC_MACHINE_PROBE", str(path))


@pytest.fixture
def machine_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """``machine_state(cores=..., hash=...)``: the simulated machine's state from now on (figures left out keep
    their steady value)."""

    def set_state(**figures: float) -> None:
        path = probe_script(tmp_path / f"probe-{len(list(tmp_path.glob('probe-*')))}", {**STEADY_STATE, **figures})
        monkeypatch.setenv("SPECDEC_MACHINE_PROBE", str(path))

    return set_state


#: The tests that start real vLLM servers or time the simulated vLLM, in two groups for ``--dist loadgroup`` (the
#: README's command, ``-n 3``): each group runs on one worker, one test after another, beside the other group and the
#: rest. `timed`: the orphan session, the zoo's measurement (its speed checks are timed in interleaved pairs on one
#: server each), then the sessions that time the simulated vLLM, last, by when the other group has finished. `vllm`:
#: the fault session on real servers, which times nothing; so at most two real vLLM sessions run at once. Of
#: test_crossover_session.py only the timed session: the file's other test measures no timing and runs beside the
#: rest. Of tests/real_vllm, the files that start servers: test_vllm_cpu_fix.py's kernel checks start none and time
#: nothing, so any worker takes them.
CROSSOVER_TIMED = "tests/functional/test_crossover_session.py::test_crossover_moves_from_16_to_5_and_regresses"
#: The night-noise session's calibration tells a noisy host from a quiet one by the speedup's night-to-night moves,
#: which a busy neighbour's run-to-run noise can hide (under `-n 3` beside both real-vLLM groups: night sd 0).
NIGHT_NOISE = "tests/functional/test_night_noise_session.py::test_a_night_that_moved_is_no_verdict_and_a_calibration"
#: The TIMED tests that measure speed against the simulated vLLM: last in their group (a busy neighbour moved their
#: A/A verdicts).
QUIET_LAST = ("tests/functional/test_speed_gate.py::", CROSSOVER_TIMED, NIGHT_NOISE)
GROUPS = {
    "timed": ("tests/real_vllm/test_orphans_vllm.py::", "tests/real_vllm/test_zoo_vllm.py::", *QUIET_LAST),
    # ruff and mypy (about a minute of one core) beside the fault session, which ends before the timed group does: a
    # minute less for the workers that share the fast tier
    "vllm": ("tests/functional/test_code_checks.py::", "tests/real_vllm/test_faults_vllm.py::"),
}
TIMED = tuple(prefix for prefixes in GROUPS.values() for prefix in prefixes)
REAL_SERVERS = tuple(prefix for prefix in TIMED if prefix.startswith("tests/real_vllm/"))


def _group(nodeid: str) -> str | None:
    return next((name for name, prefixes in GROUPS.items() if nodeid.startswith(prefixes)), None)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` with the GROUPS. xdist's own ``xdist_group`` marker does not group under this pytest
    (its node id suffix is not applied), so the groups are named here, on the controller."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class Groups(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid) or super()._split_scope(nodeid)

    return Groups(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The GROUPS first, `timed` before `vllm`: they are the longest units of work, so each gets a worker of its own
    from the start and the others take the rest beside them; within `timed`, QUIET_LAST at the end. A test marked
    ``vllm`` (it starts real servers) outside REAL_SERVERS is an error: it would run beside them."""
    stray = [item.nodeid for item in items
             if item.get_closest_marker("vllm") and not item.nodeid.startswith(REAL_SERVERS)]
    if stray:
        raise pytest.UsageError(f"tests marked vllm outside the real-server groups: {stray}; add their file to GROUPS "
                                "in tests/conftest.py")
    order = list(GROUPS)
    items.sort(key=lambda item: (order.index(g) if (g := _group(item.nodeid)) else len(order),
                                 item.nodeid.startswith(QUIET_LAST)))


#: The speculative configs a simulated profile can name.
METHODS = {
    "ngram": '{ method = "ngram", prompt_lookup_max = 4, prompt_lookup_min = 2 }',
    "eagle3": '{ method = "eagle3", model = "/nonexistent/head" }',
    "suffix": '{ method = "suffix" }',
}

def profile_toml(name: str = "fake", *, device: str = "cpu", model: str = "fake-model",
                 tensor_parallel_size: int | None = None, methods: tuple[str, ...] = ("ngram", "eagle3"),
                 k: tuple[int, ...] | None = (3,), runs: int = 2,
                 validity: dict[str, float] | None = IN_PROCESS_VALIDITY) -> str:
    """A profile for simulated servers: `fake-model`, ngram and eagle3 (a head that does not exist), k 3,
    2 runs, and the in-process validity limits, unless told otherwise (``k=None``/``validity=None``: no such
    line/section)."""
    lines = [f'name = "{name}"', f'device = "{device}"', "[target]", f'model = "{model}"']
    if tensor_parallel_size is not None:
        lines.append(f"tensor_parallel_size = {tensor_parallel_size}")
    for method in methods:
        lines += [f"[methods.{method}]", f"speculative_config = {METHODS[method]}"]
    lines.append("[matrix]")
    if k is not None:
        lines.append(f"k = {list(k)}")
    lines.append(f"runs = {runs}")
    if validity:
        lines.append("[validity]")
        lines += [f"{key} = {value}" for key, value in validity.items()]
    return "\n".join(lines) + "\n"


def suite_py(body: str = "pass", *, name: str = "test_ngram", verdicts: str | None = None, **marker: Any) -> str:
    """A test module of one benchmark test: ``@pytest.mark.specdec(**marker)`` (method ngram, k 3 and
    temperature 0.0 unless given; a key given as ``...`` is left out), ``@pytest.mark.specdec_verdicts(<verdicts>)``
    when given, then ``def <name>(specdec): <body>``. Modules concatenate (a second ``import pytest`` is harmless)."""
    params = {key: value for key, value in {"method": "ngram", "k": 3, "temperature": 0.0, **marker}.items()
              if value is not ...}
    lines = ["import pytest", "", ""]
    lines.append(f"@pytest.mark.specdec({', '.join(f'{key}={value!r}' for key, value in params.items())})")
    if verdicts is not None:
        lines.append(f"@pytest.mark.specdec_verdicts({verdicts})")
    lines.append(f"def {name}(specdec):")
    lines += [f"    {line}" for line in body.strip().splitlines()]
    return "\n".join(lines) + "\n\n"


@pytest.fixture
def fake_server() -> Iterator[Callable[..., FakeServer]]:
    """Start simulated servers in this process: ``fake_server(FakeConfig(...))`` or ``fake_server(k=3, ...)``
    (FakeConfig's fields) returns a running ``FakeServer`` (``.base_url``, ``.requests``, ``.reconfigure()``);
    all are stopped at teardown."""
    started: list[FakeServer] = []

    def start(config: FakeConfig | None = None, **fields: Any) -> FakeServer:
        server = FakeServer(config or FakeConfig(**fields))
        server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def fake_server_process() -> Iterator[Callable[..., FakeServerProcess]]:
    """Simulated servers in child processes (``fake_server_process(**FakeConfig fields)``; 5 output tokens unless
    told): at tens of streams the client's own CPU must not be the servers' too. All stopped at teardown."""
    started: list[FakeServerProcess] = []

    def start(**fields: Any) -> FakeServerProcess:
        server = FakeServerProcess(FakeConfig(**{"output_tokens": 5, **fields}))
        started.append(server)
        server.start()
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def fake_endpoints(fake_server: Callable[..., FakeServer]) -> tuple[str, str]:
    """(spec URL, reference URL): a fake spec server (k=3) and a fake no-spec server."""
    spec = fake_server(k=3, acceptance=(0.8, 0.6, 0.4), step_s=0.001, output_tokens=24)
    ref = fake_server(k=0, step_s=0.002, output_tokens=24)
    return spec.base_url, ref.base_url


@pytest.fixture
def make_profile(pytester: pytest.Pytester) -> Callable[..., Path]:
    """Write ``profile_toml(**kw)`` to ``<name>.toml`` in the pytester project; returns its path."""

    def make(name: str = "fake", **kw: Any) -> Path:
        path = pytester.path / f"{name}.toml"
        path.write_text(profile_toml(name, **kw))
        return path

    return make


@pytest.fixture
def fake_profile(make_profile: Callable[..., Path]) -> Path:
    """The pytester project's ``fake.toml``: ``profile_toml()``."""
    return make_profile()


@pytest.fixture
def make_suite() -> Callable[..., str]:
    """``suite_py``: the source of a test module of one benchmark test."""
    return suite_py


@pytest.fixture
def fake_vllm(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> FakeVllm:
    """Make the stand-in the pytester project's ``vllm serve``: ``pytest_specdec.vllm.command.vllm_launcher`` gives
    ``fakes.LAUNCHER``, and every stand-in records itself at exit.

    For a session in this process the test's monkeypatch replaces it (undone at the test's end: a later test's real
    vLLM servers are vLLM's again; the module is imported here, before the session, so pytester keeps it); for one in
    a child process (``subprocess=True``), the project's conftest.py does. In-process sessions spare a child its
    imports (pytest, the plugin, scipy; vLLM's parser where engine modes are checked; transformers for a tokenizer),
    which the worker has already made or keeps for the next."""
    import pytest_specdec.vllm.command

    monkeypatch.setattr(pytest_specdec.vllm.command, "vllm_launcher", lambda: list(LAUNCHER))
    pytester.makeconftest(f"import pytest_specdec.vllm.command\n\n"
                          f"pytest_specdec.vllm.command.vllm_launcher = lambda: {LAUNCHER!r}\n")
    records = pytester.path / "serve-records"
    records.mkdir()
    monkeypatch.setenv("FAKE_VLLM_RECORDS", str(records))
    for name in ("FAKE_VLLM_CONFIG", "FAKE_VLLM_MODE", "FAKE_VLLM_LEGACY", "FAKE_VLLM_CHILD_PID_FILE",
                 "FAKE_VLLM_DIE_AFTER", "FAKE_VLLM_HANG_ONCE", "FAKE_VLLM_FAULT_LOG"):
        monkeypatch.delenv(name, raising=False)
    return FakeVllm(records, monkeypatch)


@pytest.fixture
def fake_nvidia_smi(tmp_path: Path) -> Callable[..., Path]:
    """``fake_nvidia_smi(out, code=0)``: an executable ``nvidia-smi`` in tmp_path that prints ``out`` and exits
    with ``code`` when asked for the GPU names (``--query-gpu=name --format=csv,noheader``), else exits 9."""

    def make(out: str, code: int = 0) -> Path:
        script = tmp_path / "nvidia-smi"
        script.write_text(f"#!/bin/sh\n[ \"$1 $2\" = '--query-gpu=name --format=csv,noheader' ] || exit 9\n"
                          f"printf '%s' {shlex.quote(out)}\nexit {code}\n")
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
        return script

    return make


@pytest.fixture(scope="session")
def vllm_serve_parser() -> Any:
    """`vllm serve`'s argument parser from the installed vLLM; nothing is started."""
    from pytest_specdec.vllm.check import serve_parser

    return serve_parser()


#: A specdec test that is collected (so the plugin starts acting: the log directory's check, the stray sweep, the
#: signal handlers) and skipped before its servers would start.
COLLECTED_ONLY = ('import pytest\n\n\n@pytest.mark.skip(reason="collected only")\n'
                  '@pytest.mark.specdec(method="ngram", k=3, temperature=0.0, concurrency=1, max_tokens=16, '
                  'num_prompts=4)\n'
                  'def test_nothing(specdec):\n    pass\n')


def assert_swept(pytester: pytest.Pytester, reports: Path, stray: Any, live: Any, gone: int) -> None:
    """A session with ``--specdec-reports-dir=reports`` and a specdec test names and stops the ``stray`` server (owner
    ``gone``) once the test is collected, and leaves the ``live`` session's server alone."""
    pytester.makepyfile(COLLECTED_ONLY)
    r = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--specdec-reports-dir={reports}")
    r.assert_outcomes(skipped=1)
    r.stdout.fnmatch_lines([f"specdec: stopping a vLLM server an earlier session left running: pid {stray.pid} "
                            f"(started by pytest pid {gone}, now gone): sleep 300"])
    assert stray.wait(timeout=10) != 0 and live.poll() is None
