"""Where a session's arms are served: the servers its pool starts, or with --specdec-endpoint two servers
someone else runs. One object answers for both modes, so the runs, the distribution check and the
fixture's clients never ask which mode the session is in. No pytest import (a skip is the wiring's).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, Union

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pytest_specdec.measure.lossless import Collected
    from pytest_specdec.measure.probe import MachineState
    from pytest_specdec.measure.prompts import PromptSource
    from pytest_specdec.measure.runner import CaseResult, RunRecord
    from pytest_specdec.measure.types import Api, Prompt, Sampling
    from pytest_specdec.measure.workload import Workload
    from pytest_specdec.servers.endpoints import EndpointFacts
    from pytest_specdec.servers.pool import Death, Endpoint, ServerPool
    from pytest_specdec.servers.quiet import Quiet
    from pytest_specdec.vllm.command import ServerSpec

#: What the runner is handed per arm: an endpoint, or a call that asks for it again before each run.
ArmEndpoint = Union["Endpoint", Callable[[], "Endpoint"]]


class ServingOptions(Protocol):
    """The options this needs (the session's Settings); read on use, as the API key must be."""

    @property
    def endpoint(self) -> str | None: ...
    @property
    def reference_endpoint(self) -> str | None: ...
    @property
    def api_key(self) -> str | None: ...
    @property
    def settle_timeout_s(self) -> float: ...


class Serving:
    """A session's servers: the pool (built on first use, by the session), or the two external endpoints."""

    def __init__(self, pool: Callable[[], ServerPool], options: ServingOptions,
                 model: Callable[[], str] = lambda: "") -> None:
        self._pool = pool
        self.options = options
        self.model = model  # the model an external endpoint must serve (the profile's target, or as told)
        self.facts: dict[str, EndpointFacts] = {}  # url -> what an external endpoint serves, read once

    def read_facts(self, url: str) -> EndpointFacts:
        if url not in self.facts:
            from pytest_specdec.servers.endpoints import read_facts

            self.facts[url] = read_facts(url, self.options.api_key)
        return self.facts[url]

    def skip_reason(self, want: ServerSpec | None, rivals: list[ServerSpec], progress: Callable[[str], None]
                    ) -> str | None:
        """Endpoint mode: why the endpoints cannot stand for a test's servers (None: they can); ``want`` is its
        spec server (None without one), ``rivals`` every spec server the session collected."""
        from pytest_specdec.servers.endpoints import skip_reason

        o = self.options
        assert o.endpoint and o.reference_endpoint
        configs = [c for c in (r.speculative_config for r in rivals) if c is not None]
        return skip_reason(self.read_facts(o.reference_endpoint), self.read_facts(o.endpoint),
                           want.speculative_config if want is not None else None, configs, progress)

    def endpoint(self, spec: ServerSpec, reference: bool, test: str | None = None) -> Endpoint:
        """The arm's server, started by the pool if need be; in endpoint mode the external one."""
        from pytest_specdec.servers.http import served_model
        from pytest_specdec.servers.pool import Endpoint

        if self.options.endpoint:
            url = self.options.reference_endpoint if reference else self.options.endpoint
            assert url is not None
            served, want = served_model(url, self.options.api_key), self.model()
            if want and served != want:
                from pytest_specdec.errors import ConfigError

                raise ConfigError(
                    f"specdec: endpoint {url} serves {served!r}, but the profile's target is {want!r}: its figures "
                    "would be recorded as the target's. Point the endpoint at a server of the target, or name the "
                    "model it serves under another name with --specdec-served-model NAME")
            return Endpoint(url, served, owned=False, api_key=self.options.api_key)
        server = self._pool().get(spec, test)
        assert server.proc is not None
        return Endpoint(server.base_url, served_model(server.base_url, server.api_key), owned=True,
                        instance=str(server.proc.pid), api_key=server.api_key)

    def deaths(self, spec: ServerSpec) -> list[Death]:
        """The spec's servers that exited while in use this session (none in endpoint mode: not ours)."""
        if self.options.endpoint:
            return []
        pool = self._pool()
        pool.reap(spec)
        return [d for d in pool.deaths if d.spec_key == spec.key()]

    def engine_configs(self, arms: dict[str, ServerSpec]) -> dict[str, dict[str, Any]]:
        """Each arm's resolved engine config, as under test: from the server the pool started, or in endpoint
        mode from the endpoint's own /server_info (an arm without one is left out)."""
        if self.options.endpoint:
            found = {arm: facts.engine_config for arm, facts in self.endpoint_facts(arms).items()}
            return {arm: config for arm, config in found.items() if config}
        servers = self._pool().servers
        return {arm: servers[s.key()].engine_config() for arm, s in arms.items() if s.key() in servers}

    def endpoint_versions(self, arms: dict[str, ServerSpec]) -> dict[str, dict[str, str | None]] | None:
        """Endpoint mode: each arm's versions as its endpoint told them (vLLM from /server_info, else /version;
        torch, the CUDA runtime and the NVIDIA driver from /server_info's system_env; None: not told). None
        outside endpoint mode, where the servers are this machine's own vLLM."""
        if not self.options.endpoint:
            return None
        return {arm: facts.versions() for arm, facts in self.endpoint_facts(arms).items()}

    def endpoint_facts(self, arms: dict[str, ServerSpec]) -> dict[str, EndpointFacts]:
        """Endpoint mode: what each arm's endpoint serves (read once per endpoint, `read_facts`)."""
        o = self.options
        urls = {"reference": o.reference_endpoint, "spec": o.endpoint}
        return {arm: self.read_facts(url) for arm in arms if (url := urls[arm])}

    def retire(self, spec: ServerSpec, why: str) -> None:
        """Stop the spec's server, so its next run gets a fresh one (a learning drafter out of new prompts)."""
        self._pool().retire(spec, why)

    def asked_each_run(self, spec: ServerSpec, reference: bool, test: str) -> Callable[[], Endpoint]:
        """The arm's endpoint asked for before each run: the pool may have restarted its server since."""
        return lambda: self.endpoint(spec, reference, test)

    def arms(self, reference: ServerSpec, spec: ServerSpec | None, test: str, block: int | None
             ) -> tuple[ArmEndpoint, ArmEndpoint | None]:
        """A test's two arms for the runner: both servers started now, or with one server at a time
        (``block``) asked for at each run, so the pool restarts the other arm's server."""
        if block is None:
            return self.endpoint(reference, True, test), self.endpoint(spec, False, test) if spec else None
        return (self.asked_each_run(reference, True, test),
                self.asked_each_run(spec, False, test) if spec else None)

    def sample_distribution(self, reference: ServerSpec, spec: ServerSpec, test: str, prompts: list[Prompt],
                            sampling: Sampling, samples_per_prompt: int, api: Api,
                            progress: Callable[[str], None]) -> Collected:
        """The distribution check's samples (`measure/lossless.py`): the spec server's, then the reference's."""
        from pytest_specdec.measure.lossless import collect

        return collect(self.asked_each_run(spec, False, test), self.asked_each_run(reference, True, test), prompts,
                       sampling, samples_per_prompt, api=api, api_key=self.options.api_key, progress=progress)

    def neighbours(self) -> Callable[[], dict[str, tuple[str, int]]] | None:
        """The pool's CPU ticks per server instance, read around each run (None in endpoint mode: the
        endpoints' processes are not ours to account)."""
        if self.options.endpoint:
            return None
        return lambda: self._pool().cpu_ticks()

    def probe(self) -> Callable[[], MachineState] | None:
        """The machine's state around each test's runs (`probe.py`); None for endpoints not on loopback: their
        servers run elsewhere, and this machine's state says nothing of theirs."""
        from pytest_specdec.measure.probe import probe
        from pytest_specdec.servers.endpoints import host_port
        from pytest_specdec.servers.process import is_loopback

        o = self.options
        if o.endpoint and not all(is_loopback(host_port(u)[0]) for u in (o.endpoint, o.reference_endpoint) if u):
            return None

        return probe

    def settle(self) -> Callable[[str | None, float | None], Quiet] | None:
        """Before each run, wait for the servers to go idle: those the pool started, or in endpoint mode the
        processes listening on loopback endpoints' ports; endpoints whose processes cannot be found
        (another host, another user) get a fixed delay instead. It is handed the next run's server instance
        and when the previous run ended (`ServerPool.wait_quiet`)."""
        o = self.options
        timeout = o.settle_timeout_s
        if timeout <= 0:
            return None
        if not o.endpoint:
            return lambda own, ended: self._pool().wait_quiet(timeout, own, ended)
        from pytest_specdec.servers.endpoints import settle

        return settle([u for u in (o.endpoint, o.reference_endpoint) if u], timeout, o.api_key)


class CaseRun:
    """One test's interleaved runs: its arms as the runner is handed them, the prompts each run sends, and
    the runner's options, kept so the gate's later looks add runs the same way."""

    def __init__(self, serving: Serving, test: str, reference: ServerSpec, spec: ServerSpec | None, block: int | None,
                 workload: Workload, dataset: str, prompts: list[Prompt], whole_dataset: Callable[[], list[Prompt]],
                 base: ServerSpec | None = None, base_reference: ServerSpec | None = None) -> None:
        self.serving, self.spec_spec, self.block, self.test = serving, spec, block, test
        self.specs = {"reference": reference, "spec": spec, "base": base, "base_reference": base_reference}
        self.restarted: set[str] = set()  # arms whose hung server was restarted (once per test)
        self.reference, self.spec = serving.arms(reference, spec, test, block)
        # An A/B session's base: a third server beside the two, and on another install its own reference (a
        # fourth); with one server at a time (``block``) each is asked for at each run, as the two arms are.
        def arm(spec: ServerSpec | None, reference: bool) -> ArmEndpoint | None:
            if spec is None:
                return None
            return serving.endpoint(spec, reference, test) if block is None else serving.asked_each_run(
                spec, reference, test)
        self.base, self.base_reference = arm(base, False), arm(base_reference, True)

        def exhausted() -> None:
            assert spec is not None
            serving.retire(spec, f"every prompt of {dataset!r} left has been sent to it and suffix decoding learns "
                                 f"responses; a fresh server for the next {len(prompts)}")
        self.source: PromptSource = workload.source(prompts, spec.speculative_config if spec is not None else None,
                                                    spec.key() if spec else "", whole_dataset, exhausted)
        if self.source.fresh and block is None and spec is not None:  # the spec server may be restarted
            self.spec = serving.asked_each_run(spec, False, test)
        self.sampling: Sampling | None = None
        self.options: dict[str, Any] = {}
        self.result: CaseResult | None = None

    def first(self, sampling: Sampling, runs: int, **options: Any) -> CaseResult:
        """The first look's ``runs`` per arm; ``options`` are `extend_case`'s, kept for the later looks."""
        from pytest_specdec.measure.runner import measure_case

        self.sampling = sampling
        self.options = {**options, "block": self.block, "settle": self.serving.settle(),
                        "spec_tokens": spec_tokens(self.spec_spec), "restart": self.restart, "base": self.base,
                        "base_reference": self.base_reference, "neighbours": self.serving.neighbours(),
                        "probe": self.serving.probe()}
        self.result = measure_case(self.reference, self.spec, self.source, sampling, runs=runs, **self.options)
        return self.result

    def restart(self, arm: str) -> Callable[[], Endpoint] | None:
        """A hung server the session owns is restarted once per test: its later runs get a fresh one. An
        external endpoint cannot be restarted, nor is a server that hung again (its runs stay invalid)."""
        spec = self.specs[arm]
        if spec is None or arm in self.restarted or self.serving.options.endpoint:
            return None
        self.restarted.add(arm)
        self.serving.retire(spec, "it hung (sent nothing within the idle timeout); a fresh one for the next runs")
        fresh = self.serving.asked_each_run(spec, arm.endswith("reference"), self.test)
        if arm == "reference":  # the later looks ask for the fresh one too
            self.reference = fresh
        elif arm in ("base", "base_reference"):
            setattr(self, arm, fresh)
            self.options[arm] = fresh
        else:
            self.spec = fresh
        return fresh

    def extend(self, runs: int) -> None:
        """Runs per arm up to ``runs`` in all: the gate's next look."""
        from pytest_specdec.measure.runner import extend_case

        assert self.result is not None and self.sampling is not None
        extend_case(self.result, self.reference, self.spec, self.source, self.sampling, runs=runs, **self.options)


def spec_tokens(spec: ServerSpec | None) -> int | None:
    """The spec server's k: with it one engine step makes at most k + 1 tokens per request."""
    k = (spec.speculative_config or {}).get("num_speculative_tokens") if spec is not None else None
    return int(k) if isinstance(k, int) and not isinstance(k, bool) else None


def dead_arm(test: str, arm: str, runs: Sequence[RunRecord], deaths: list[Death], tail_lines: int = 30) -> str:
    """Why a test has no valid run on one arm, as its failure says it: each run's reasons, and each time that
    arm's server exited during the test, the exit code, the exception its engine raised (above the tail: vLLM's
    API server prints its own traceback last) and that start's log tail (a restart has a log of its own)."""
    other = "reference" if arm == "spec" else "spec"
    lines = [f"specdec: {test}: no valid run on the {arm} arm ({len(runs)} run(s)); the {arm} arm is never "
             f"judged on the {other} arm's figures"]
    lines += [f"  {arm} run {r.index + 1}: {'; '.join(r.invalid)}" for r in runs]
    for death in deaths:
        tail = "\n".join(death.tail.splitlines()[-tail_lines:])
        lines += [f"  {death.line()}", *(f"  {line}" for line in death.cause.splitlines()),
                  f"--- last {tail_lines} lines of that log ---", tail]
    if not deaths:
        lines.append(f"  the {arm} server did not exit: its runs were invalid for the reasons above (the log tail "
                     "follows)")
    return "\n".join(lines)
