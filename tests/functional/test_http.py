"""The one HTTP GET helper (servers/http.py): every read of a server goes through it, with the API key."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pytest_specdec.errors import ConfigError, SpecDecError
from pytest_specdec.servers.endpoints import read_facts
from pytest_specdec.servers.http import get, metrics_text, served_model, server_info

PACKAGE = Path(__file__).resolve().parents[2] / "pytest_specdec"
KEY = "sk-test"
INFO = {"vllm_config": {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3}},
        "system_env": {"vllm_version": "0.32.0", "torch_version": "2.9"}}
ROUTES = {"/v1/models": json.dumps({"data": [{"id": "m"}]}), "/metrics": "vllm:num_requests_running 0\n",
          "/server_info": json.dumps(INFO), "/version": json.dumps({"version": "0.32.0"}), "/health": ""}


class Recorder(ThreadingHTTPServer):
    seen: list[tuple[str, str | None]]


class Handler(BaseHTTPRequestHandler):
    """Answers ROUTES only with the bearer key, as a server that guards every route; records each GET."""

    server: Recorder

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        path = self.path.partition("?")[0]
        auth = self.headers.get("Authorization")
        self.server.seen.append((path, auth))
        status = 404 if path not in ROUTES else 401 if auth != f"Bearer {KEY}" else 200
        body = ROUTES.get(path, "").encode() if status == 200 else b""
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def guarded() -> Iterator[Recorder]:
    server = Recorder(("127.0.0.1", 0), Handler)
    server.seen = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _url(server: Recorder) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def test_every_read_of_a_server_sends_the_api_key(guarded: Recorder) -> None:
    url = _url(guarded)
    facts = read_facts(url, KEY)
    assert facts.models == ("m",) and facts.server_info and facts.vllm_version == "0.32.0"
    assert facts.speculative_config == {"method": "ngram", "num_speculative_tokens": 3}
    assert served_model(url, KEY) == "m"
    assert asyncio.run(metrics_text(url, KEY)).startswith("vllm:num_requests_running")
    assert server_info(url, KEY) == INFO
    assert get(f"{url}/health", KEY).ok
    paths = {path for path, _ in guarded.seen}
    assert paths == {"/v1/models", "/metrics", "/server_info", "/health"}  # /version: /server_info told it
    assert all(auth == f"Bearer {KEY}" for _, auth in guarded.seen), guarded.seen


def test_without_the_key_each_reader_says_what_failed(guarded: Recorder) -> None:
    url = _url(guarded)
    assert get(f"{url}/metrics").status == 401 and get(f"{url}/metrics").error == "HTTP 401 Unauthorized"
    assert server_info(url, None) is None
    with pytest.raises(ConfigError, match=rf"endpoint {url}/v1/models: HTTP 401 Unauthorized"):
        read_facts(url, None)
    with pytest.raises(SpecDecError, match=rf"GET {url}/v1/models failed: HTTP 401"):
        served_model(url, None)
    with pytest.raises(SpecDecError, match=rf"GET {url}/metrics answered HTTP 401"):
        asyncio.run(metrics_text(url, None))
    guarded.shutdown()
    guarded.server_close()
    gone = get(f"{url}/health", KEY, timeout_s=2)
    assert gone.status is None and not gone.ok and gone.error is not None and gone.error.startswith("cannot connect")


def test_no_module_but_the_helper_sends_a_get() -> None:
    """urllib's requests and aiohttp's GETs appear in servers/http.py only (the client's POSTs stay aiohttp)."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        rel = path.relative_to(PACKAGE).as_posix()
        if rel != "servers/http.py" and re.search(r"urllib\.request|urlopen\(|\.get\(\s*url\b|session\.get\(", text):
            offenders.append(rel)
    assert offenders == []
