"""The plugin's one HTTP GET: every read of a server (readiness, /v1/models, /metrics, /server_info,
/version) goes through `get`, with the API key whenever there is one.

Why one: each reader had its own urllib call, and one of them read /server_info without the key, so a
server that guards it looked as if it did not serve it. The answer is a value, never an exception: a
readiness poll wants a bool, an endpoint read wants an error naming the URL, and each caller decides.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from pytest_specdec.errors import SpecDecError
from pytest_specdec.vllm.engine_config import SERVER_INFO_TIMEOUT_S

#: vLLM's resolved config as JSON (served with VLLM_SERVER_DEV_MODE=1 only).
SERVER_INFO_PATH = "/server_info?config_format=json"


@dataclass(frozen=True)
class Answer:
    """What one GET got: the status and body, or why there was no answer."""

    url: str
    status: int | None  # None: no HTTP answer at all (refused, timed out, reset)
    text: str = ""
    error: str | None = None  # "HTTP 503 Service Unavailable" or "cannot connect (...)"; None when answered 2xx

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


def headers(api_key: str | None) -> dict[str, str]:
    """The request headers that carry the API key (none without one)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def get(url: str, api_key: str | None = None, timeout_s: float = 30.0) -> Answer:
    """GET ``url`` (with the API key as a bearer token when given)."""
    request = urllib.request.Request(url, headers=headers(api_key))
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:  # noqa: S310 - a server under test
            status = int(resp.status)
            text = resp.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as exc:
        return Answer(url, exc.code, error=f"HTTP {exc.code} {exc.reason}")
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        return Answer(url, None, error=f"cannot connect ({exc})")
    return Answer(url, status, text, None if 200 <= status < 300 else f"HTTP {status}")


def server_info(base_url: str, api_key: str | None, timeout_s: float = SERVER_INFO_TIMEOUT_S) -> dict[str, Any] | None:
    """vLLM's `/server_info?config_format=json` answer; None when the server does not serve it (no dev mode),
    fails, or answers something that is not a JSON object. Read once per server: the owned server's start
    and the endpoint's facts each keep what they read."""
    answer = get(base_url.rstrip("/") + SERVER_INFO_PATH, api_key, timeout_s)
    if not answer.ok:
        return None
    try:
        info = json.loads(answer.text)
    except ValueError:
        return None
    return info if isinstance(info, dict) else None


def served_model(base_url: str, api_key: str | None = None, timeout_s: float = 30.0) -> str:
    """The first model id the server lists (GET /v1/models): what requests must name."""
    answer = get(f"{base_url.rstrip('/')}/v1/models", api_key, timeout_s)
    if not answer.ok:
        raise SpecDecError(f"GET {answer.url} failed: {answer.error}")
    try:
        return str(json.loads(answer.text)["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise SpecDecError(f"GET {answer.url}: not an OpenAI model list ({type(exc).__name__}: {exc})") from None


async def metrics_text(base_url: str, api_key: str | None = None, timeout_s: float = 30) -> str:
    """GET ``/metrics`` as text from a running event loop (in a thread, so the loop stays free); raises
    SpecDecError naming the URL when the server does not answer."""
    url = base_url.rstrip("/") + "/metrics"
    answer = await asyncio.to_thread(get, url, api_key, timeout_s)
    if answer.status is None:
        raise SpecDecError(f"GET {url} failed: {answer.error}")
    if answer.status != 200:
        raise SpecDecError(f"GET {url} answered HTTP {answer.status}; is the server a vLLM server?")
    return answer.text
