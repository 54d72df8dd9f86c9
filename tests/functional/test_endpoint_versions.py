"""Endpoint mode records the endpoints' own vLLM as under test, never this client's: from `/server_info`
where served (tests/functional/test_faults.py), else from `/version` (`{"version": ...}`, which vLLM serves
without dev mode), else "unknown". So a remote vLLM upgrade shows in the baseline diff. The results'
environment says the same, with the client's own vLLM beside it as `client_vllm_version`. On a GPU profile
the CUDA runtime and NVIDIA driver are the endpoints' too, from `/server_info`'s system_env.

The stand-in serves no `/version`, and a `/server_info` as vLLM on a CPU only; these tests add the routes
they need to its app before it starts, served from dicts a test can change between sessions.
"""

from __future__ import annotations

import importlib.metadata as md
import json
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from session import specdec_session

from fakes import FakeConfig, FakeServer, vllm_server_info
from fakes.server import CUDA_RUNTIME_VERSION, NVIDIA_DRIVER_VERSION
from pytest_specdec.gate.conditions import UNKNOWN
from pytest_specdec.vllm.cli import vllm_distribution

Start = Callable[..., FakeServer]


@pytest.fixture
def stand_in() -> Iterator[Callable[..., FakeServer]]:
    """Start a stand-in that also serves ``routes`` (path -> a dict the test can change between sessions;
    `{}`: 404, as a server without the route)."""
    started: list[FakeServer] = []

    def start(routes: dict[str, dict[str, object]], **fields: Any) -> FakeServer:
        server = FakeServer(FakeConfig(**fields))
        for path, told in routes.items():
            server.app.router.add_get(path, answer(told))
        server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def answer(told: dict[str, object]) -> Callable[[web.Request], Awaitable[web.Response]]:
    """A route's handler: ``told`` as JSON as it is at the request, 404 while it is empty."""
    async def get(request: web.Request) -> web.Response:
        if not told:
            raise web.HTTPNotFound()
        return web.json_response(told)
    return get


@pytest.fixture
def server_with_version(stand_in: Callable[..., FakeServer]) -> Callable[..., tuple[FakeServer, dict[str, str]]]:
    """A stand-in that also serves `/version`, from the dict returned beside it."""
    def start(**fields: object) -> tuple[FakeServer, dict[str, str]]:
        told: dict[str, str] = {}
        return stand_in({"/version": told}, **fields), told
    return start


def session(pytester: pytest.Pytester, profile: Path, spec: FakeServer, ref: FakeServer, *extra: str) -> dict:
    session = specdec_session(pytester, profile, (spec, ref), *extra, runs=2)
    session.result.assert_outcomes(passed=1)
    return session.results


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
    assert "provenance" not in env and env["client_provenance"]["packages"] > 0  # this client's packages, not theirs
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


def test_a_gpu_profiles_cuda_and_driver_are_the_endpoints(
        pytester: pytest.Pytester, make_profile: Callable[..., Path], make_suite: Callable[..., str],
        stand_in: Callable[..., FakeServer]) -> None:
    """The CUDA runtime and NVIDIA driver under test are what the endpoints' /server_info names (the
    stand-in's, which no client has); unknown where it names none (vLLM on a CPU finds no driver) or is not
    served; never this client's."""
    profile = make_profile("fakegpu", device="cuda", methods=("ngram",), runs=2)
    pytester.makepyfile(test_suite=make_suite(num_prompts=4, max_tokens=8, verdicts="check=False"))
    ngram, model = {"method": "ngram", "num_speculative_tokens": 3}, FakeConfig().model
    # /server_info as vLLM 0.32 answers it on a GPU machine (the stand-in's own serves the CPU's)
    spec_info, ref_info = vllm_server_info(model, ngram, device="cuda"), vllm_server_info(model, None, device="cuda")
    spec = stand_in({"/server_info": spec_info}, k=3, acceptance=(0.8, 0.6, 0.4), step_s=0.001, output_tokens=8)
    ref = stand_in({"/server_info": ref_info}, k=0, step_s=0.002, output_tokens=8)
    under_test = session(pytester, profile, spec, ref)["tests"][0]["baseline"]["under_test"]
    assert (under_test["cuda"], under_test["driver"]) == (CUDA_RUNTIME_VERSION, NVIDIA_DRIVER_VERSION)

    # The spec endpoint as vLLM on a CPU answers (a CUDA runtime found, no driver), the reference without
    # /server_info: the CUDA runtime one endpoint named; the driver none did.
    spec_info.update(vllm_server_info(model, ngram))
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
