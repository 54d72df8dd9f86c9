"""The simulated vLLM for the plugin's tests (no GPU, no model, no vLLM).

* ``server``: the OpenAI-compatible server with vLLM's streaming format and Prometheus counters, configured by
  ``FakeConfig``; ``FakeServer`` runs it in a thread of this process, ``FakeServerProcess`` in a child process.
* ``serve``: the one ``vllm serve`` stand-in, that server behind vLLM's command line (``LAUNCHER`` runs it:
  ``python tests/fakes serve MODEL ...``), configured by flags and environment variables (see its docstring).

Tests import it as ``fakes`` (tests/ is on sys.path: pytest puts it there for tests/conftest.py);
tests/conftest.py wraps it in fixtures.
"""

from .serve import FakeVllm
from .server import (
    LAUNCHER,
    VLLM_VERSION,
    FakeConfig,
    FakeServer,
    FakeServerProcess,
    build_app,
    resolve_speculative_config,
    toy_lm,
    vllm_server_info,
)

__all__ = [
    "DISTURBED_RULE_ON", "IN_PROCESS_VALIDITY", "LAUNCHER", "STAND_IN_VALIDITY", "VLLM_VERSION", "FakeConfig",
    "FakeServer", "FakeServerProcess", "FakeVllm", "build_app", "resolve_speculative_config", "toy_lm",
    "vllm_server_info",
]

#: The validity limits of a profile measured against in-process servers (``FakeServer``).
#: Those servers answer from a thread of the test's own process, so the client's event loop shares the GIL with
#: them and with pytester's in-process sessions: a lag that marks a real run client-bound is ordinary here, and
#: an invalid run made these tests flaky. For the same reason the client often reads two of their 1-2 ms steps
#: at once (a coalesced stream); tests/functional/test_coalescing_session.py checks the coalescing detector
#: without that allowance and with slower steps. Their runs last milliseconds, so their tok/s is HTTP overhead and
#: the disturbed-run rule is off; the tests of the rule (tests/functional/test_speed_gate.py, test_cli.py and
#: test_ab_session.py) turn it on with steps long enough to measure (DISTURBED_RULE_ON).
IN_PROCESS_VALIDITY: dict[str, float] = {"max_loop_lag_mean_ms": 250, "max_coalesced_share": 0.5,
                                         "max_run_slowdown": 0}
DISTURBED_RULE_ON: dict[str, float] = {**IN_PROCESS_VALIDITY, "max_run_slowdown": 0.3}

#: The validity limits of a profile served by the ``vllm serve`` stand-in (a child process): the plugin's defaults, but
#: the disturbed-run rule off, since its steps of a millisecond or two make runs whose tok/s is HTTP overhead.
STAND_IN_VALIDITY: dict[str, float] = {"max_run_slowdown": 0}
