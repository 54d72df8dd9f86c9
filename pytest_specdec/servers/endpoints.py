"""Endpoint mode: what an externally run vLLM server serves, and whether a test's server spec is it.

Why: with `--specdec-endpoint` the suites run unchanged against servers someone else started (under
Kubernetes, say), which serve one speculative config.  A test asking for another one (eagle3 at k=5
against an ngram k=3 server) would measure the endpoint and label it with the test's parameters.
Such tests are skipped with the reason.

What can be read, from vLLM 0.32's own endpoints:
- `/metrics`: whether the server speculates at all (vLLM registers the `vllm:spec_decode_*` counters
  only with a speculative config) and k (it creates one `..._per_pos` child per draft position up front).
- `/server_info?config_format=json`: the whole speculative config (method, draft model, ...), but only
  when the server runs with `VLLM_SERVER_DEV_MODE=1` (a development endpoint; vLLM warns against it in
  production).
- `/v1/models`: the served model ids; vLLM exposes no speculation there.
- `/version`: `{"version": "..."}`, vLLM's own version, served without dev mode; read when `/server_info`
  (whose `system_env` carries the version too) is not served, so an upgrade of the endpoint's vLLM
  shows as a change under test either way.
So without `/server_info` the method and draft cannot be told apart: an ngram k=3 server and an eagle3
k=3 server look the same from outside.  Then a session whose tests ask for several spec configs at the
endpoint's k cannot know which one the endpoint is, and all of them are skipped with that reason; a
session asking for exactly one is measured, and the result records that the method was not verified.
No pytest import.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_specdec.errors import ConfigError

if TYPE_CHECKING:
    from pytest_specdec.servers.quiet import Quiet

Fetch = Callable[[str, "str | None"], "str | None"]


def fetch_text(url: str, api_key: str | None, timeout_s: float = 30.0) -> str | None:
    """GET `url`; None on 404 (an endpoint this server does not have). Other failures raise ConfigError."""
    from pytest_specdec.servers.http import get

    answer = get(url, api_key, timeout_s)
    if answer.ok:
        return answer.text
    if answer.status == 404:
        return None
    raise ConfigError(f"endpoint {url}: {answer.error}")


@dataclass(frozen=True)
class EndpointFacts:
    """What one endpoint serves, as far as it can be read from outside."""

    url: str
    models: tuple[str, ...]
    speculating: bool
    k: int | None  # from /metrics: the per-position counters' children
    speculative_config: dict[str, Any] | None = None  # from /server_info (VLLM_SERVER_DEV_MODE=1)
    server_info: bool = False  # whether /server_info answered
    #: the resolved engine config from /server_info, flattened as for owned servers; None without it
    engine_config: dict[str, Any] | None = None
    #: the endpoint's own vLLM version and where it was read ("/server_info" or "/version"); None: neither told it
    vllm_version: str | None = None
    version_source: str | None = None
    #: the endpoint's torch, from /server_info's system_env (/version does not tell it); None: not told
    torch_version: str | None = None
    #: the endpoint's CUDA runtime and NVIDIA driver, from the same system_env; None: not told
    cuda_version: str | None = None
    driver_version: str | None = None

    def describe(self) -> str:
        if not self.speculating:
            return "no vllm:spec_decode_* counters on /metrics"
        if self.speculative_config is not None:
            return f"speculative config {json.dumps(self.speculative_config, sort_keys=True)} (/server_info)"
        return f"speculation with k={self.k} (/metrics); method and draft unknown (no /server_info)"

    def versions(self) -> dict[str, str | None]:
        """What the endpoint told of its own software: the versions under test in endpoint mode."""
        return {"vllm": self.vllm_version, "torch": self.torch_version, "cuda": self.cuda_version,
                "driver": self.driver_version}


#: The keys of vLLM's speculative config that say *what* is served (others tune how).
_IDENTITY = ("method", "model", "num_speculative_tokens")


def read_facts(url: str, api_key: str | None, fetch: Fetch = fetch_text) -> EndpointFacts:
    """Ask the endpoint's /v1/models, /metrics and (if it has it) /server_info."""
    from pytest_specdec.vllm.counters import parse_counters

    models_text = fetch(f"{url}/v1/models", api_key)
    if models_text is None:
        raise ConfigError(f"endpoint {url}: no /v1/models (is it an OpenAI-compatible vLLM server?)")
    try:
        models = tuple(str(m["id"]) for m in json.loads(models_text)["data"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"endpoint {url}/v1/models: not an OpenAI model list ({exc})") from None
    metrics_text = fetch(f"{url}/metrics", api_key)
    if metrics_text is None:
        raise ConfigError(f"endpoint {url}: no /metrics; the plugin reads vLLM's spec-decode counters there")
    counters = parse_counters(metrics_text)
    k = len(counters.accepted_per_pos) or None
    from pytest_specdec.servers.http import server_info
    from pytest_specdec.vllm.engine_config import engine_config_from_server_info

    info = server_info(url, api_key)
    config = engine = torch = None
    system: Any = None
    if info is not None:
        vllm_config = info.get("vllm_config")
        engine = engine_config_from_server_info(info) or None
        system = info.get("system_env")
        torch = system.get("torch_version") if isinstance(system, dict) else None
        if isinstance(vllm_config, dict) and isinstance(vllm_config.get("speculative_config"), dict):
            config = {key: vllm_config["speculative_config"][key] for key in _IDENTITY
                      if vllm_config["speculative_config"].get(key) is not None}
            config.update({key: value for key, value in vllm_config["speculative_config"].items()
                           if key.startswith("prompt_lookup_") and value is not None})
    version, source = (engine or {}).get("vllm_version"), "/server_info"
    if not version:
        version, source = read_version(url, api_key, fetch), "/version"
    system = system if isinstance(system, dict) else {}
    return EndpointFacts(url, models, counters.spec_decode, k if counters.spec_decode else None, config,
                         info is not None, engine, str(version) if version else None,
                         source if version else None, str(torch) if torch else None,
                         _told(system.get("cuda_runtime_version")), _told(system.get("nvidia_driver_version")))


#: What vLLM's collect_env writes where it found nothing: not a version.
_NOT_FOUND = ("", "N/A", "None", "Could not collect")


def _told(value: Any) -> str | None:
    """A version as collect_env reported it, or None where it reported none."""
    text = str(value).strip() if value is not None else ""
    return None if text in _NOT_FOUND else text


def read_version(url: str, api_key: str | None, fetch: Fetch = fetch_text) -> str | None:
    """The endpoint's vLLM version from its `/version` (`{"version": "0.32.0"}`); None when it is not served
    or says something else (a proxy's page, an error): the version is then recorded as unknown, and the
    session goes on, since measuring does not need it."""
    try:
        text = fetch(f"{url}/version", api_key)
    except ConfigError:
        return None
    try:
        version = json.loads(text).get("version") if text is not None else None
    except (ValueError, AttributeError):
        return None
    return version if isinstance(version, str) and version.strip() else None


def _same_model(want: str, served: str) -> bool:
    """A hub id and a local copy of it (`/models/yuhuili/EAGLE3-...`) count as the same draft."""
    want, served = want.rstrip("/"), served.rstrip("/")
    return (want == served or served.endswith("/" + want.lstrip("/"))
            or want.endswith("/" + served.lstrip("/")))


def unserved_reason(want: dict[str, Any], facts: EndpointFacts, rivals: int = 1) -> str | None:
    """Why the spec endpoint cannot stand for a server with speculative config `want` (None: it can).

    `rivals` is how many distinct spec configs of the session ask for the endpoint's k: with more than
    one and no /server_info, which of them the endpoint serves cannot be told.
    """
    wanted = json.dumps(want, sort_keys=True)
    if not facts.speculating:
        return f"the spec endpoint {facts.url} does not speculate ({facts.describe()}); this test needs {wanted}"
    k = want.get("num_speculative_tokens")
    if facts.k is not None and k is not None and k != facts.k:
        return (f"this test needs k={k} ({wanted}); the spec endpoint {facts.url} speculates with k={facts.k} "
                f"(from its /metrics per-position counters)")
    served = facts.speculative_config
    if served is not None:
        for key, value in want.items():
            if key not in served:
                continue
            same = _same_model(str(value), str(served[key])) if key == "model" else value == served[key]
            if not same:
                return (f"this test needs {key}={value!r}; the spec endpoint {facts.url} serves {key}="
                        f"{served[key]!r} ({facts.describe()})")
        return None
    if rivals > 1:
        return (f"the spec endpoint {facts.url} speculates with k={facts.k}, but which method and draft it runs "
                f"cannot be read (no /server_info: start vLLM with VLLM_SERVER_DEV_MODE=1 to expose it), and this "
                f"session asks for {rivals} different spec configs at that k; measuring it as {wanted} could be wrong")
    return None


def reference_problem(facts: EndpointFacts) -> str | None:
    """The reference endpoint must not speculate: the speedup is against the no-speculation server."""
    if facts.speculating:
        return (f"--specdec-reference-endpoint {facts.url} speculates ({facts.describe()}); the reference must be "
                "a server started without --speculative-config")
    return None


def host_port(url: str) -> tuple[str, int | None]:
    """An endpoint URL's host and port (None when it names none and its scheme implies one)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return parts.hostname or "", parts.port


def settle(urls: list[str], timeout_s: float, api_key: str | None = None
           ) -> Callable[[str | None, float | None], Quiet]:
    """Before each run in endpoint mode: wait for the processes listening on loopback endpoints' ports to go
    idle and their /metrics to show no request held, like the servers a session starts itself; an endpoint
    whose processes cannot be found (another host, another user) gets a fixed delay instead, counted from the
    previous run's end. The wait takes the next run's instance and the previous run's end (`ServerPool.wait_quiet`);
    the instance is unused here: an endpoint's process group cannot be told from its instance id.

    The groups found behind a port are kept while every one of them lives, and looked for again once one is gone
    (a server restarted by hand): the look reads every TCP socket of the host (`listening_pgids`), which took
    20 ms a run on a host holding 6000 closed connections."""
    from pytest_specdec.servers.hygiene import group_alive
    from pytest_specdec.servers.process import is_loopback
    from pytest_specdec.servers.quiet import idle_delay, listening_pgids, requests_held, wait_idle

    known: dict[str, set[int]] = {}

    def groups(endpoint: str) -> set[int]:
        if (kept := known.get(endpoint)) and all(group_alive(g) for g in kept):
            return kept
        host, port = host_port(endpoint)
        known[endpoint] = found = listening_pgids(port) if is_loopback(host) and port else set()
        return found

    def wait(own: str | None, ended: float | None) -> Quiet:
        pgids: set[int] = set()
        for url in urls:
            found = groups(url)
            if not found:
                return idle_delay(ended=ended)
            pgids |= found
        # A server in our own process group (a simulated one in tests) cannot be told from the client.
        pgids.discard(os.getpgid(0))
        return wait_idle(pgids, timeout_s=timeout_s, ended=ended,
                         requests=lambda: requests_held([(u, api_key) for u in urls]))

    return wait


def skip_reason(reference: EndpointFacts, facts: EndpointFacts, want: dict[str, Any] | None,
                rivals: list[dict[str, Any]], progress: Callable[[str], None]) -> str | None:
    """Endpoint mode: why the endpoints cannot stand for a test's servers (None: they can). ``want`` is the
    test's speculative config (None for a no-speculation test), ``rivals`` every spec config the session
    collected. A speculating reference endpoint is a configuration error, not a skip: no test could be
    measured."""
    problem = reference_problem(reference)
    if problem:
        raise ConfigError(problem)
    if want is None:
        return None
    configs = {json.dumps(c, sort_keys=True) for c in rivals
               if facts.k is None or c.get("num_speculative_tokens") == facts.k}
    reason = unserved_reason(want, facts, rivals=len(configs))
    if reason is None and facts.speculative_config is None:
        progress(f"specdec: {facts.url} speculates with k={facts.k}; its method and draft cannot be read (no "
                 f"/server_info), so it is measured as {json.dumps(want, sort_keys=True)} unverified")
    return reason
