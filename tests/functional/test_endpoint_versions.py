"""Endpoint mode records the endpoints' own vLLM as under test, never this client's: from `/server_info`
where served (tests/functional/test_faults.py), else from `/version` (`{"version": ...}`, which vLLM serves
without dev mode), else "unknown". So a remote vLLM upgrade shows in the baseline diff. The results'
environment says the same, with the client's own vLLM beside it as `client_vllm_version`. On a GPU profile
the CUDA runtime and NVIDIA driver are the endpoints' too, from `/server_info`'s system_env.

The stand-in serves no `/version`; these tests add one to its app before it starts, and a `/server_info`
that a test can take away between sessions.
"""

from __future__ import annotations

import importlib.metadata as md
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from aiohttp import web
from fakes import FakeConfig, FakeServer, vllm_server_info
from fakes.server import CUDA_RUNTIME_VERSION, NVIDIA_DRIVER_VERSION

from pytest_specdec.gate.conditions import UNKNOWN
from pytest_specdec.vllm.cli import vllm_distribution

Start = Callable[..., FakeServer]


@pytest.fixture
def server_with_version() -> Iterator[Callable[..., tuple[FakeServer, dict[str, str]]]]:
    """Start a stand-in that also serves `/version` from a dict the test can change between sessions
    (`{}`: 404, as a server without the route)."""
    started: list[FakeServer] = []

    def start(**fields: object) -> tuple[FakeServer, dict[str, str]]:
        told: dict[str, str] = {}
        server = FakeServer(FakeConfig(**fields))  # type: ignore[arg-type]

        async def version(request: web.Request) -> web.Response:
            if not told:
                raise web.HTTPNotFound()
            return web.json_response(told)

        server.app.router.add_get("/version", version)
        server.start()
        started.append(server)
        return server, told

    yield start
    for server in started:
        server.stop()


def session(pytester: pytest.Pytester, profile: Path, spec: FakeServer, ref: FakeServer, *extra: str) -> dict:
    r = pytester.runpytest(f"--specdec-profile={profile}", f"--specdec-endpoint={spec.base_url}",
                           f"--specdec-reference-endpoint={ref.base_url}", "--specdec-runs=2",
                           f"--specdec-reports={pytester.path / 'reports'}", "-p", "no:cacheprovider", *extra)
    r.assert_outcomes(passed=1)
    return json.loads((pytester.path / "reports" / "latest.json").read_text())


def test_the_endpoints_version_is_under_test_and_an_upgrade_shows(
        pytester: pytest.Pytester, make_profile: Callable[..., Path], make_suite: Callable[..., str],
        server_with_version: Callable[..., tuple[FakeServer, dict[str, str]]]) -> None:
    profile = make_profile("fake", methods=("ngram",), runs=2)
    # check=False: the verdicts are recorded but never fail the test, whose runs here are too few to be steady
    pytester.makepyfile(test_suite=make_suite(num_prompts=4, max_tokens=8, verdicts="check=False"))
    spec, spec_version = server_with_version(k=3, acceptance=(0.8, 0.6, 0.4), step_s=0.001, output_tokens=8)
    ref, ref_version = server_with_version(k=0, step_s=0.002, output_tokens=8)
    spec_version["version"] = ref_version["version"] = "0.99.1"

    data = session(pytester, profile, spec, ref, "--update-baselines")
    baseline = json.loads(next((pytester.path / "baselines").rglob("*.json")).read_text())
    under_test = baseline["under_test"]
    assert under_test["vllm"] == "0.99.1" and under_test["endpoint"] == "external"
    assert under_test["torch"] == under_test["vllm_distribution"] == UNKNOWN
    for url in (spec.base_url, ref.base_url):
        facts = data["endpoints"][url]
        assert (facts["vllm_version"], facts["version_source"], facts["server_info"]) == ("0.99.1", "/version", False)
        assert facts["torch_version"] is None  # /version tells vLLM's version only
    client = md.version(vllm_distribution() or "vllm")
    env = data["environment"]
    assert (env["vllm_version"], env["vllm_distribution"]) == ("0.99.1", None)
    assert env["client_vllm_version"] == client != "0.99.1"
    html = (pytester.path / "reports" / "latest.html").read_text()
    assert "<b>vLLM</b> 0.99.1</span>" in html and f"<b>client's vLLM</b> {client} (not under test)" in html

    # The endpoint's vLLM is upgraded: the results' under-test diff says so (the baseline stays as it was).
    spec_version["version"] = ref_version["version"] = "0.99.2"
    data = session(pytester, profile, spec, ref)
    assert data["tests"][0]["baseline"]["under_test_diff"]["vllm"] == ["0.99.1", "0.99.2"]
    assert data["tests"][0]["baseline"]["under_test"]["vllm"] == "0.99.2"
    assert "0.99.1" in (pytester.path / "reports" / "latest.html").read_text()

    # Neither /server_info nor /version: unknown, still not the client's.
    spec_version.clear()
    ref_version.clear()
    data = session(pytester, profile, spec, ref)
    assert data["tests"][0]["baseline"]["under_test"]["vllm"] == UNKNOWN
    assert data["environment"]["vllm_version"] == UNKNOWN
    assert data["endpoints"][spec.base_url]["version_source"] is None


@pytest.fixture
def server_with_info() -> Iterator[Callable[..., tuple[FakeServer, dict[str, object]]]]:
    """Start a stand-in that serves `/server_info` from a dict the test can empty between sessions (`{}`:
    404, as vLLM without VLLM_SERVER_DEV_MODE); it starts as vLLM 0.32 would answer on ``device``."""
    started: list[FakeServer] = []

    def start(device: str, speculative_config: dict | None, **fields: object) -> tuple[FakeServer, dict[str, object]]:
        server = FakeServer(FakeConfig(**fields))  # type: ignore[arg-type]
        info: dict[str, object] = vllm_server_info(server.config.model, speculative_config, device=device)

        async def show(request: web.Request) -> web.Response:
            if not info:
                raise web.HTTPNotFound()
            return web.json_response(info)

        server.app.router.add_get("/server_info", show)
        server.start()
        started.append(server)
        return server, info

    yield start
    for server in started:
        server.stop()


def test_a_gpu_profiles_cuda_and_driver_are_the_endpoints(
        pytester: pytest.Pytester, make_profile: Callable[..., Path], make_suite: Callable[..., str],
        server_with_info: Callable[..., tuple[FakeServer, dict[str, object]]]) -> None:
    """The CUDA runtime and NVIDIA driver under test are what the endpoints' /server_info names (the
    stand-in's, which no client has); unknown where it names none (vLLM on a CPU finds no driver) or is not
    served; never this client's."""
    profile = make_profile("fakegpu", device="cuda", methods=("ngram",), runs=2)
    pytester.makepyfile(test_suite=make_suite(num_prompts=4, max_tokens=8, verdicts="check=False"))
    spec, spec_info = server_with_info("cuda", {"method": "ngram", "num_speculative_tokens": 3}, k=3,
                                       acceptance=(0.8, 0.6, 0.4), step_s=0.001, output_tokens=8)
    ref, ref_info = server_with_info("cuda", None, k=0, step_s=0.002, output_tokens=8)
    under_test = session(pytester, profile, spec, ref)["tests"][0]["baseline"]["under_test"]
    assert (under_test["cuda"], under_test["driver"]) == (CUDA_RUNTIME_VERSION, NVIDIA_DRIVER_VERSION)

    # The spec endpoint as vLLM on a CPU answers (a CUDA runtime found, no driver), the reference without
    # /server_info: the CUDA runtime one endpoint named; the driver none did.
    spec_info.update(vllm_server_info(spec.config.model, {"method": "ngram", "num_speculative_tokens": 3}))
    ref_info.clear()
    under_test = session(pytester, profile, spec, ref)["tests"][0]["baseline"]["under_test"]
    assert (under_test["cuda"], under_test["driver"]) == (CUDA_RUNTIME_VERSION, UNKNOWN)


def test_a_version_answer_that_is_not_vllms_counts_as_unknown() -> None:
    from pytest_specdec.errors import ConfigError
    from pytest_specdec.servers.endpoints import read_version

    def fetch(answer: str | None | Exception) -> Callable[[str, str | None], str | None]:
        def get(url: str, key: str | None) -> str | None:
            assert url == "http://h:1/version"
            if isinstance(answer, Exception):
                raise answer
            return answer
        return get

    assert read_version("http://h:1", None, fetch('{"version": "0.32.0"}')) == "0.32.0"
    for answer in (None, "<html>proxy</html>", '{"version": 3}', '["0.32.0"]', '{"version": " "}',
                   ConfigError("endpoint http://h:1/version: HTTP 500 Internal Server Error")):
        assert read_version("http://h:1", None, fetch(answer)) is None, answer
