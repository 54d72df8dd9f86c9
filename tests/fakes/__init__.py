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
    "LAUNCHER", "VLLM_VERSION", "FakeConfig", "FakeServer", "FakeServerProcess", "FakeVllm", "build_app",
    "resolve_speculative_config", "toy_lm", "vllm_server_info",
]
