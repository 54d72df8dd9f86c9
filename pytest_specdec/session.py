"""The one object a pytest session keeps in `config.stash`: profile, servers, results.

`plugin.py` only forwards hooks here.  Nothing in this module starts work at import time.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import platform
import random
import shlex
import shutil
import subprocess
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import pytest

from . import __version__
from .errors import ConfigError
from .markers import Case
from .options import Settings

if TYPE_CHECKING:
    from .baselines import BaselineStore
    from .datasets import Dataset
    from .distribution import Collected
    from .endpoints import EndpointFacts
    from .hardware import GpuList
    from .load import Prompt, Sampling
    from .measurement import CaseResult, PromptSource
    from .pool import Endpoint, ServerPool, StartRecord
    from .profiles import Profile
    from .server import Quiet, ServerSpec
    from .stats import NightVariance, Prior, Thresholds, Verdict
    from .verdicts import MachineFactor


class SpecDecWarning(pytest.PytestWarning):
    """A pytest-specdec condition worth seeing that does not fail the test (e.g. a non-comparable baseline)."""


@dataclass
class VerdictOptions:
    """What the `specdec_verdicts` marker says for one test."""

    check: bool = True
    thresholds: dict[str, float] = field(default_factory=dict)
    gate: tuple[str, ...] = ()  # metrics added to the gated family for this test


@dataclass
class BaselineCheck:
    """One test's comparison with its stored baseline."""

    path: Path
    status: str  # compared | missing | not-comparable | error
    check: bool
    comparability: dict[str, Any]
    under_test: dict[str, Any]
    entry: dict[str, Any]
    baseline: dict[str, Any] | None = None
    fields: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # not-comparable: what differs
    raw: list[Verdict] = field(default_factory=list)  # before the session's multiplicity adjustment
    verdicts: list[Verdict] = field(default_factory=list)  # adjusted at the test's end (p-values unseen = 1)
    final: list[Verdict] | None = None  # adjusted over the whole session's family
    looks: list[int] = field(default_factory=list)  # runs per arm at each look taken
    max_looks: int = 1
    failed: bool = False
    error: str | None = None
    alpha: float = 0.05  # one-sided, split over the looks: the CIs of Δ are two-sided 1 - 2·alpha/max_looks
    gate: tuple[str, ...] = ()  # the gated family's metrics for this test
    unspent: int = 0  # runs per arm planned but not spent: no further look could change a gated verdict
    stop_reason: str = ""
    deviation: float | None = None  # log(tonight's reference speed ÷ the baseline's): one term of the machine factor
    thresholds: Any = None  # the Thresholds its verdicts used (re-used when the machine factor is final)

    def shown(self) -> list[Verdict]:
        return self.final if self.final is not None else (self.verdicts or self.raw)

    def under_test_diff(self) -> dict[str, list[Any]]:
        """What changed under test since the baseline's last session (the report shows it per test)."""
        if not self.baseline:
            return {}
        from .baselines import under_test_changes

        return {k: [a, b] for k, (a, b) in
                under_test_changes(self.baseline.get("under_test", {}), self.under_test).items()}

    def to_dict(self) -> dict[str, Any]:
        from .verdicts import attribution, gated_with

        shown = self.shown()
        path = str(self.path)
        sessions = len(self.baseline["sessions"]) if self.baseline else 0
        return {
            "path": path, "status": self.status, "checked": self.check, "sessions": sessions,
            "not_comparable_fields": {k: [a, b] for k, (a, b) in self.fields.items()},
            "looks": self.looks, "max_looks": self.max_looks, "unspent_runs": self.unspent,
            "stop_reason": self.stop_reason, "gate": list(self.gate),
            "inconclusive_gated": [v.metric for v in gated_with(shown, "inconclusive")],
            "machine_deviation": self.deviation,
            "alpha": self.alpha, "ci_level": 1 - 2 * self.alpha / max(1, self.max_looks),
            "adjusted": "session" if self.final is not None else "test-end",
            "attribution": attribution(shown) if shown else None,
            "under_test": self.under_test,
            "under_test_diff": self.under_test_diff(),
            **({"error": self.error} if self.error else {}),
        }


def detect_profile_name(gpus: GpuList | None = None) -> str:
    """`--gpu auto`: cpu without NVIDIA GPUs, else the built-in profile for the GPUs nvidia-smi lists."""
    from .hardware import list_gpus, pick_profile
    from .profiles import builtin_profiles, load_profile

    candidates = {name: load_profile(name).nvidia_smi_names for name in builtin_profiles()}
    return pick_profile(list_gpus() if gpus is None else gpus, candidates)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@dataclass
class TestRecord:
    """One specdec test's entry in the JSON results."""

    nodeid: str
    case: Case
    result: CaseResult | None = None
    outcome: str = "pending"
    servers: dict[str, str] = field(default_factory=dict)  # arm -> server spec key
    error: str | None = None
    baseline: BaselineCheck | None = None
    #: tails of the servers' logs when the test failed, so the HTML report can show them the morning after
    server_logs: list[dict[str, str]] = field(default_factory=list)
    #: the temperature > 0 distribution check (specdec.distribution_check), when the test ran it
    distribution: dict[str, Any] | None = None
    #: every sampling parameter the requests carried (Sampling.to_request)
    sampling: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "nodeid": self.nodeid,
            "params": self.case.params(),
            **({"sampling": self.sampling} if self.sampling is not None else {}),
            "outcome": self.outcome,
            "servers": self.servers,
        }
        if self.result is not None:
            out.update(self.result.to_dict())
        if self.error:
            out["error"] = self.error
        if self.server_logs:
            out["server_logs"] = self.server_logs
        if self.distribution is not None:
            out["distribution"] = self.distribution
        if self.baseline is not None:
            from .verdicts import to_json

            out["verdicts"] = {v.metric: to_json(v) for v in self.baseline.shown()}
            out["baseline"] = self.baseline.to_dict()
        return out


class SpecDecSession:
    """State of the plugin for one pytest session."""

    def __init__(self, settings: Settings, rootpath: Path, progress: Callable[[str], None]) -> None:
        self.settings = settings
        self.rootpath = rootpath
        self.progress = progress
        self.started = time.time()
        self._profile: Profile | None = None
        self._pool: ServerPool | None = None
        self._datasets: dict[str, Dataset] = {}
        self._tokenizer: Any = None  # the target's, for completions prompts rendered from chat
        self.records: dict[str, TestRecord] = {}
        self._store: BaselineStore | None = None
        self._priors: dict[tuple[str, str], Prior] | None = None
        self._stored: list[dict[str, Any]] | None = None
        self._nights: dict[str, NightVariance] | None = None
        self._night_factors: dict[str, float] | None = None
        self.machine: MachineFactor | None = None  # set at session end
        self.machine_failed = False
        self._base_thresholds: list[dict[str, float]] | None = None
        #: metric tests the collected specdec tests can add to the family (for BH before all are known)
        self.family_size = 0
        self.gated_family_size = 0
        self.late_regressions: list[str] = []
        self.summary_lines: list[str] = []
        self.gate_summary: list[str] = []  # the terminal's last lines: per test, the gated verdicts
        #: How the profile was (or was not) checked against this machine's GPUs, for the dry run.
        self.hardware_note = ""
        #: Every collected specdec case (endpoint mode asks which spec configs the session wants).
        self.collected: list[Case] = []
        #: per spec server key, the prompt ids a learning drafter's server was sent (see _prompt_source)
        self._sent: dict[str, set[str]] = {}
        self._endpoint_facts: dict[str, EndpointFacts] = {}
        #: pytest-xdist: this worker's id ("gw0"), None on the controller and without xdist
        self.worker: str | None = None
        #: on the controller: what each finished worker sent besides its records (servers, starts)
        self._remote: list[dict[str, Any]] = []
        self._measured_by: dict[str, str] = {}  # nodeid -> worker, to catch a test measured twice
        self.xdist_lines: list[str] = []  # controller: what went wrong collecting workers' results
        self.report_paths: list[Path] = []
        self.gpu_names: str | None = None  # nvidia-smi's GPUs ("NVIDIA H100 80GB HBM3 x8"), once listed
        self._distributions: dict[tuple[str, int], Collected] = {}  # (nodeid, samples per prompt) -> scored samples

    # --- configuration -------------------------------------------------------------------------
    @property
    def profile(self) -> Profile:
        """The active profile; a GPU profile is checked against nvidia-smi, except in a dry run."""
        if self._profile is None:
            from .hardware import check_profile, list_gpus
            from .profiles import load_profile

            gpus = None
            name = self.settings.profile_path or self.settings.gpu
            if name == "auto":
                gpus = list_gpus()
                name = detect_profile_name(gpus)
            profile = load_profile(name)
            if gpus is not None and gpus.names:  # --gpu=auto chose it from these GPUs
                self.gpu_names = gpus.describe()
                self.hardware_note = f"--gpu=auto picked profile {profile.name} for {gpus.describe()}"
            elif profile.nvidia_smi_names and self.settings.endpoint:
                self.hardware_note = (f"profile {profile.name} was NOT checked against GPUs: in endpoint mode the "
                                      f"servers run elsewhere; make sure they run on {' / '.join(profile.nvidia_smi_names)}")
            elif profile.nvidia_smi_names and self.settings.dry_run:
                self.hardware_note = (f"profile {profile.name} was NOT checked against this machine's GPUs (dry run); "
                                      f"it is for {' / '.join(profile.nvidia_smi_names)}")
            elif profile.nvidia_smi_names:
                gpus = gpus or list_gpus()
                check_profile(profile.name, profile.nvidia_smi_names, gpus)
                self.gpu_names = gpus.describe()
                self.hardware_note = f"GPUs checked: {self.gpu_names}"
            elif profile.device == "cuda":
                self.hardware_note = (f"profile {profile.name} names no nvidia_smi_names: the GPUs it runs on are "
                                      "not checked")
            self._profile = profile.with_drafts(dict(self.settings.drafts))
        return self._profile

    @property
    def pool(self) -> ServerPool:
        if self._pool is None:
            from .pool import ServerPool

            gpus = None
            if self.profile.device != "cpu":  # the cpu profile leases nothing
                from .gpus import GpuPool, discover_gpus, parse_gpu_list

                ids = (parse_gpu_list(self.settings.gpus, "--specdec-gpus") if self.settings.gpus
                       else discover_gpus())
                gpus = GpuPool(self.settings.lease_dir, ids)
            logs = self.settings.reports_dir / "logs"
            self._pool = ServerPool(
                logs / self.worker if self.worker else logs,  # workers may run the same spec at once
                self.max_alive(), self.settings.startup_timeout_s, progress=self.progress,
                gpus=gpus, gpu_wait_s=self.settings.gpu_wait_s, pin_cpus=self.settings.pin_cpus,
                worker=self.worker, server_cpus=self.server_cpus(),
                server_nice=int(self.profile.raw.get("placement", {}).get("server_nice", 0)),
            )
        return self._pool

    def runs(self) -> int:
        return self.settings.runs or int(self.profile.matrix.get("runs", 3))

    def expand(self, kwargs: dict[str, Any], args: tuple[Any, ...] = ()) -> list[Case]:
        """A marker's (or `specdec.measure()`'s) fields as cases of the active profile; the command line's
        --specdec-api / --specdec-request-rate / --specdec-dataset apply where the fields do not say."""
        from .markers import expand

        defaults = {"api": self.settings.api, "request_rate": self.settings.request_rate,
                    "dataset": self.settings.dataset}
        cases = expand(kwargs, self.profile, args, defaults)
        for case in cases:
            self._check_possible(case)
        return cases

    def _check_possible(self, case: Case) -> None:
        """What only the profile and the dataset can tell is impossible: an error at collection, not later.

        Endpoint mode skips the model-length check: someone else's server has its own limit.
        """
        size = len(self.dataset(case.dataset).prompts)
        if case.num_prompts is not None and case.num_prompts > size:
            raise ConfigError(
                f"specdec: num_prompts={case.num_prompts} but dataset {case.dataset!r} has {size} prompts; "
                f"lower num_prompts or use a larger dataset (prompts are never repeated)"
            )
        limit = self.max_model_len()
        if case.max_tokens is not None and limit is not None and not self.settings.endpoint \
                and case.max_tokens >= limit:
            raise ConfigError(
                f"specdec: max_tokens={case.max_tokens} leaves no room for the prompt: profile "
                f"{self.profile.name!r} serves with --max-model-len {limit}; lower max_tokens below {limit}"
            )

    def max_model_len(self) -> int | None:
        """The profile's `--max-model-len` (None when its server args leave it to the model)."""
        from .server import arg_value

        value = arg_value(self.profile.server_args, "--max-model-len")
        if value is None:
            return None
        try:
            return int(value)
        except ValueError:
            raise ConfigError(f"profile {self.profile.name!r}: --max-model-len {value!r} is not a "
                              f"whole number") from None

    def co_resident(self) -> bool:
        """Whether a test's reference and spec servers can be alive at once (always, on the CPU)."""
        placement = self.profile.raw.get("placement", {})
        return self.settings.endpoint is not None or (
            self.settings.max_servers >= 2 and bool(placement.get("co_resident", True))
        )

    def server_cpus(self) -> frozenset[int] | None:
        """CPU profiles: where servers start, leaving the profile's `[placement] client_cpus` to the client."""
        from .pool import split_cpus

        if self.profile.device != "cpu":
            return None
        return split_cpus(int(self.profile.raw.get("placement", {}).get("client_cpus", 0)))

    def max_alive(self) -> int:
        """Servers the pool keeps alive at once (the dry-run estimate counts restarts with it too)."""
        return self.settings.max_servers if self.co_resident() else 1

    def block_runs(self) -> int | None:
        """None: interleave pairs; else the block size of the arms' alternation (servers cannot co-reside)."""
        if self.co_resident():
            return None
        return self.settings.block_runs or -(-self.runs() // 2)

    def dataset(self, name: str) -> Dataset:
        """The dataset a spec names (loaded once); what loading skipped or defaulted is shown once."""
        if name not in self._datasets:
            from .datasets import load

            self._datasets[name] = load(name, self.rootpath)
            self.progress(f"specdec: dataset {self._datasets[name].summary()}")
        return self._datasets[name]

    def prompts(self, case: Case) -> list[Prompt]:
        """The workload: the dataset's prompts (a seeded sample of num_prompts), max_tokens applied."""
        import dataclasses

        self._check_possible(case)
        prompts = list(self.dataset(case.dataset).prompts)
        if case.num_prompts is not None:
            prompts = random.Random(0).sample(prompts, case.num_prompts)
        if case.max_tokens is not None:
            prompts = [dataclasses.replace(p, max_tokens=case.max_tokens) for p in prompts]
        if case.api == "completions":
            prompts = self._as_completions(prompts)
        return prompts

    def _as_completions(self, prompts: list[Prompt]) -> list[Prompt]:
        """Chat prompts rendered with the target's own chat template, for the completions API.

        The rendered text already holds the template's special tokens (BOS), so the request says
        add_special_tokens=false, as vLLM's chat endpoint does; the token stream then matches chat's.
        """
        import dataclasses

        if all(p.messages is None for p in prompts):
            return prompts
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.profile.target)
        tok = self._tokenizer
        if not getattr(tok, "chat_template", None):
            raise ConfigError(
                f"api='completions' with chat prompts needs the target's chat template to render them, but "
                f"{self.profile.target} has none: use a dataset with plain `prompt` fields, or api='chat'"
            )
        out = []
        for p in prompts:
            if p.messages is None:
                out.append(p)
                continue
            text = tok.apply_chat_template(p.messages, tokenize=False, add_generation_prompt=True)
            out.append(dataclasses.replace(p, messages=None, prompt=text, add_special_tokens=False))
        return out

    def server_spec(self, case: Case, reference: bool) -> ServerSpec:
        from .profiles import server_spec
        from .server import ServerSpec

        if reference or case.method == "none":
            spec = server_spec(self.profile, "none", None)
        elif case.speculative_config is not None:
            base = server_spec(self.profile, "none", None)
            spec = ServerSpec(model=base.model, speculative_config=case.speculative_config,
                              args=base.args, env=base.env)
        else:
            spec = server_spec(self.profile, case.method, case.k)
        return dataclasses.replace(spec, host=self.settings.host)

    # --- measuring -----------------------------------------------------------------------------
    def endpoint_facts(self, url: str) -> EndpointFacts:
        """What an external endpoint serves (read once per session)."""
        if url not in self._endpoint_facts:
            from .endpoints import read_facts

            self._endpoint_facts[url] = read_facts(url, self.settings.api_key)
        return self._endpoint_facts[url]

    def endpoint_skip_reason(self, case: Case) -> str | None:
        """Endpoint mode: why the endpoints cannot stand for this test's servers (None: they can).

        A speculating reference endpoint is a configuration error, not a skip: no test could be measured.
        """
        from .endpoints import reference_problem, unserved_reason

        assert self.settings.endpoint and self.settings.reference_endpoint
        problem = reference_problem(self.endpoint_facts(self.settings.reference_endpoint))
        if problem:
            raise ConfigError(problem)
        if case.method == "none":
            return None
        want = self.server_spec(case, reference=False).speculative_config
        assert want is not None
        facts = self.endpoint_facts(self.settings.endpoint)
        configs = {json.dumps(c, sort_keys=True) for c in (
            self.server_spec(other, reference=False).speculative_config
            for other in [*self.collected, case] if other.method != "none") if c is not None
            and (facts.k is None or c.get("num_speculative_tokens") == facts.k)}
        reason = unserved_reason(want, facts, rivals=len(configs))
        if reason is None and facts.speculative_config is None:
            self.progress(f"specdec: {self.settings.endpoint} speculates with k={facts.k}; its method and draft "
                          f"cannot be read (no /server_info), so it is measured as {json.dumps(want, sort_keys=True)}"
                          " unverified")
        return reason

    def endpoint(self, spec: ServerSpec, reference: bool, test: str | None = None) -> Endpoint:
        from .pool import Endpoint
        from .load import served_model

        if self.settings.endpoint:
            url = self.settings.reference_endpoint if reference else self.settings.endpoint
            assert url is not None
            return Endpoint(url, served_model(url, self.settings.api_key), owned=False)
        server = self.pool.get(spec, test)
        assert server.proc is not None
        return Endpoint(server.base_url, served_model(server.base_url), owned=True, instance=str(server.proc.pid))

    def _settle(self) -> Callable[[], Quiet] | None:
        """Before each run, wait for the servers to go idle: those this session started, or in endpoint
        mode the processes listening on loopback endpoints' ports; endpoints whose processes cannot be
        found (another host, another user) get a fixed delay instead."""
        timeout = self.settings.quiet_timeout_s
        if timeout <= 0:
            return None
        if not self.settings.endpoint:
            return lambda: self.pool.wait_quiet(timeout)
        from .server import idle_delay, is_loopback, listening_pgids, wait_quiet

        urls = [u for u in (self.settings.endpoint, self.settings.reference_endpoint) if u]

        def settle() -> Quiet:
            pgids: set[int] = set()
            for url in urls:
                host, port = _host_port(url)
                found = listening_pgids(port) if is_loopback(host) and port else set()
                if not found:
                    return idle_delay()
                pgids |= found
            # A server in our own process group (a simulated one in tests) cannot be told from the client.
            pgids.discard(os.getpgid(0))
            return wait_quiet(pgids, timeout_s=timeout)

        return settle

    def measure(self, nodeid: str, case: Case, verdicts: VerdictOptions | None = None) -> CaseResult:
        """Run the case's interleaved reference/spec runs; the result is recorded for the JSON.

        With ``verdicts`` the runs are compared with the stored baseline, and while a verdict is
        inconclusive more pairs are added two at a time up to the maximum (alpha split over the looks).
        """
        from .measurement import extend_case, measure_case

        if self.settings.endpoint:
            reason = self.endpoint_skip_reason(case)
            if reason:
                pytest.skip(f"specdec endpoint mode: {reason}")
        record = self.records.setdefault(nodeid, TestRecord(nodeid, case))
        prompts = self.prompts(case)
        ref_spec = self.server_spec(case, reference=True)
        spec_spec = None if case.method == "none" else self.server_spec(case, reference=False)
        record.servers = {"reference": ref_spec.key(), **({"spec": spec_spec.key()} if spec_spec else {})}
        block = self.block_runs() if spec_spec is not None else None
        if block is None:
            reference: Any = self.endpoint(ref_spec, reference=True, test=nodeid)
            spec: Any = self.endpoint(spec_spec, reference=False, test=nodeid) if spec_spec else None
        else:  # one server at a time: each run asks the pool, which restarts the other arm's server
            reference = lambda: self.endpoint(ref_spec, reference=True, test=nodeid)  # noqa: E731
            spec = lambda: self.endpoint(spec_spec, reference=False, test=nodeid)  # noqa: E731
        source = self._prompt_source(case, spec_spec, prompts)
        if source.fresh and block is None and spec_spec is not None:  # the spec server may be restarted
            spec = lambda: self.endpoint(spec_spec, reference=False, test=nodeid)  # noqa: E731
        how = "interleaved" if block is None else f"in blocks of {block} (one server at a time)"
        fresh = ", fresh prompts every run (suffix decoding learns what it served)" if source.fresh else ""
        self.progress(f"specdec: {nodeid}: {len(prompts)} prompts x {self.runs()} runs {how}{fresh}")
        sampling = self.sampling(case)
        record.sampling = sampling.to_request()
        kw: dict[str, Any] = dict(concurrency=case.concurrency, api_key=self.settings.api_key,
                                  rules=self.profile.validity_rules(), progress=self.progress,
                                  block=block, api=case.api, rate=case.request_rate, settle=self._settle(),
                                  spec_tokens=_spec_tokens(spec_spec))
        result = measure_case(reference, spec, source, sampling, runs=self.runs(), **kw)
        record.result = result
        if verdicts is not None:
            check = self._start_check(nodeid, case, record, ref_spec, spec_spec, sampling, verdicts)
            looks = self._looks() if check.check and check.status == "compared" and not self._updating_all() else [self.runs()]
            check.max_looks = len(looks)
            record.baseline = check  # its machine deviation joins the session's factor from the first look
            thresholds = self.thresholds(verdicts)
            from .stats import alpha_for_look, next_look_useful
            from .verdicts import gated_with

            for i, n in enumerate(looks, start=1):
                if len(result.reference_runs) < n:
                    self.progress(f"specdec: {nodeid}: inconclusive at look {i - 1} of {len(looks)}: "
                                  f"{n} interleaved runs")
                    extend_case(result, reference, spec, source, sampling, runs=n, **kw)
                check.looks.append(len(result.reference_runs))
                self._evaluate(check, result, thresholds, look=i, max_looks=len(looks))
                n_now = len(result.reference_runs)
                if i == len(looks) or n_now >= looks[-1]:
                    break
                if not next_look_useful(check.raw, n_now, looks[-1], alpha_for_look(self.settings.alpha, i,
                                                                                      len(looks))):
                    open_ = [v.metric for v in gated_with(check.raw, "inconclusive")]
                    check.unspent = looks[-1] - n_now
                    check.stop_reason = (
                        f"{', '.join(open_)} inconclusive, but {looks[-1]} runs could not settle it" if open_
                        else "every gated verdict is conclusive")
                    self.progress(f"specdec: {nodeid}: {check.unspent} run(s) per arm not spent: "
                                  f"{check.stop_reason}")
                    break
            record.baseline = check
        s = result.summary
        self.progress(
            f"specdec: {nodeid}: {_f(s['output_tps'])} tok/s vs reference {_f(s['reference_output_tps'])}, "
            f"speedup {_f(s['speedup'], '.2f')}x, acceptance {_f(s['acceptance_rate'], '.3f')}"
        )
        for line in coalesced_lines(nodeid, result):
            self.progress(line)
        return result

    @staticmethod
    def sampling(case: Case) -> Sampling:
        """Every sampling parameter of a case's requests (all sent explicitly, all recorded)."""
        from .load import Sampling

        return Sampling(temperature=case.temperature, ignore_eos=case.ignore_eos)

    def _prompt_source(self, case: Case, spec_spec: ServerSpec | None, prompts: list[Prompt]) -> PromptSource:
        """Fixed prompts, or for a drafter that learns across requests (suffix decoding, unless its global
        cache is off) prompts its server has never been sent, drawn from the whole dataset."""
        from .measurement import FixedPrompts, FreshPrompts

        config = spec_spec.speculative_config if spec_spec is not None else None
        if not config or config.get("method") != "suffix" or config.get("suffix_decoding_max_cached_requests") == 0:
            return FixedPrompts(prompts)
        pool = self.prompts(dataclasses.replace(case, num_prompts=None))
        key = spec_spec.key()  # type: ignore[union-attr]
        seen = self._sent.setdefault(key, set())
        n = len(prompts)

        def exhausted() -> None:
            self.pool.retire(spec_spec, f"every prompt of {case.dataset!r} left has been sent to it and "  # type: ignore[arg-type]
                                        f"suffix decoding learns responses; a fresh server for the next {n}")
        return FreshPrompts(pool, n, seen, exhausted, seed=len(seen))

    def distribution_check(self, nodeid: str, case: Case, samples_per_prompt: int, alpha: float,
                           tolerance_nats: float) -> dict[str, Any]:
        """Temperature > 0: the spec server's samples vs the reference's, scored by the reference server
        (`distribution.py`); sampled once per test and samples-per-prompt, recorded for the JSON."""
        from .distribution import collect

        key = (nodeid, samples_per_prompt)
        if key not in self._distributions:
            ref_spec = self.server_spec(case, reference=True)
            spec_spec = self.server_spec(case, reference=False)
            prompts = self.prompts(case)
            self.progress(f"specdec: {nodeid}: distribution check, {len(prompts)} prompts x {samples_per_prompt} "
                          "samples from the spec server and twice from the reference, scored by the reference")
            self._distributions[key] = collect(
                lambda: self.endpoint(spec_spec, reference=False, test=nodeid),
                lambda: self.endpoint(ref_spec, reference=True, test=nodeid),
                prompts, self.sampling(case), samples_per_prompt, api=case.api,  # type: ignore[arg-type]
                api_key=self.settings.api_key, progress=self.progress)
        out = self._distributions[key].summary(alpha, tolerance_nats)
        self.records.setdefault(nodeid, TestRecord(nodeid, case)).distribution = out
        m = out["mean_logprob"]
        self.progress(f"specdec: {nodeid}: distribution {out['verdict']}: mean log-prob per token spec "
                      f"{_f(m['spec'], '.3f')} vs reference {_f(m['reference_a'], '.3f')}, p {_f(out['p'], '.2g')}")
        return out

    # --- baselines and verdicts ------------------------------------------------------------------
    @property
    def store(self) -> BaselineStore:
        if self._store is None:
            from .baselines import BaselineStore

            self._store = BaselineStore(self.settings.baselines_dir, self.profile.name,
                                        mode=self.settings.update_baselines, keep=self.settings.keep_sessions)
        return self._store

    def _updating_all(self) -> bool:
        return self.settings.update_baselines == "all"

    def _looks(self) -> list[int]:
        """Runs per arm at each planned look: first the profile's runs, then two more at a time."""
        from .stats import planned_looks

        runs = self.runs()
        raw = self.settings.max_runs or self.profile.raw.get("verdicts", {}).get("max_runs") or runs
        if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
            raise ConfigError(f"profile {self.profile.path}: [verdicts] max_runs must be a whole number >= 1, "
                              f"got {raw!r}")
        if raw < runs:
            raise ConfigError(f"--specdec-max-runs / [verdicts] max_runs ({raw}) is below the runs per test "
                              f"({runs}); raise it or lower --specdec-runs")
        return planned_looks(runs, 2, raw)

    def gate(self, options: VerdictOptions | None = None) -> tuple[str, ...]:
        """The gated family's metrics: speedup, acceptance, P95 E2E ratio, plus ini and marker additions."""
        from .verdicts import GATED

        return tuple(dict.fromkeys((*GATED, *self.settings.gate, *(options.gate if options else ()))))

    def thresholds(self, options: VerdictOptions | None = None) -> Thresholds:
        """Defaults < profile [verdicts.thresholds] < ini specdec_thresholds < --specdec-threshold < marker."""
        from .verdicts import build_thresholds, check_mapping, parse_threshold_items

        if self._base_thresholds is None:
            raw = self.profile.raw.get("verdicts", {}).get("thresholds", {})
            self._base_thresholds = [
                check_mapping(raw, f"profile {self.profile.path} [verdicts] thresholds"),
                parse_threshold_items(self.settings.ini_thresholds, "ini specdec_thresholds"),
                parse_threshold_items(self.settings.cli_thresholds, "--specdec-threshold"),
            ]
        return build_thresholds(*self._base_thresholds, *([options.thresholds] if options else []))

    def stored(self) -> list[dict[str, Any]]:
        """Every readable stored baseline of this profile (read once, before any verdict)."""
        if self._stored is None:
            from .baselines import BaselineError, load

            datas = []
            for f in self.store.all_files():
                try:
                    data = load(f, "pytest --update-baselines")
                except BaselineError:
                    continue  # its own test reports it
                if data is not None:
                    datas.append(data)
            self._stored = datas
        return self._stored

    def priors(self) -> dict[tuple[str, str], Prior]:
        """Variance priors from every readable stored baseline of this profile (computed once)."""
        if self._priors is None:
            from .verdicts import priors_from

            self._priors = priors_from(self.stored())
        return self._priors

    def night_factors(self) -> dict[str, float]:
        """Each stored night's machine factor (log), from every file of the profile."""
        if self._night_factors is None:
            from .verdicts import night_factors

            self._night_factors = night_factors(self.stored())
        return self._night_factors

    def nights(self) -> dict[str, NightVariance]:
        """Per metric, the night-to-night variance pooled over the profile's stored baselines."""
        if self._nights is None:
            from .verdicts import night_variances, with_floor

            self._nights = with_floor(night_variances(self.stored(), self.night_factors()), self.min_night_sd())
        return self._nights

    def min_night_sd(self) -> float:
        """The profile's floor on the night-to-night sd of log-scale metrics, in % (0: none)."""
        raw = self.profile.raw.get("verdicts", {}).get("min_night_sd", 0.0)
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not 0 <= raw < 100:
            raise ConfigError(f"profile {self.profile.path}: [verdicts] min_night_sd must be a number of % in "
                              f"[0, 100), got {raw!r}")
        return float(raw)

    def _machine_log(self) -> float | None:
        """The machine factor (log) from every test compared so far (the session's, once all are in)."""
        devs = [r.baseline.deviation for r in self.records.values()
                if r.baseline is not None and r.baseline.deviation is not None]
        return sum(devs) / len(devs) if devs else None

    def comparability(self, case: Case, ref_spec: ServerSpec, spec_spec: ServerSpec | None,
                      sampling: Any) -> dict[str, Any]:
        """What must be equal for tonight to be compared with the baseline."""
        from .baselines import model_identity

        args = list(ref_spec.args)
        dp = args[args.index("--data-parallel-size") + 1] if "--data-parallel-size" in args[:-1] else "1"
        speculation = None
        if spec_spec is not None and spec_spec.speculative_config is not None:
            speculation = {k: v for k, v in spec_spec.speculative_config.items() if k != "model"}
        return {
            "hardware": _cpu_model() if self.profile.device == "cpu" else str(self.profile.raw.get("hardware",
                                                                                                 self.profile.name)),
            "device": self.profile.device,
            "device_count": (os.cpu_count() if self.profile.device == "cpu"
                             else int(self.profile.raw.get("gpus", self.profile.tensor_parallel_size))),
            "tensor_parallel_size": self.profile.tensor_parallel_size,
            "data_parallel_size": int(dp),
            "target": model_identity(self.profile.target, self.profile.raw.get("target", {}).get("revision")),
            "dataset": self.dataset(case.dataset).identity(),
            "workload": {"concurrency": case.concurrency, "max_tokens": case.max_tokens,
                         "num_prompts": case.num_prompts, "rate": case.request_rate, "api": case.api},
            "sampling": sampling.to_request(),
            "server_args": args,
            "method": case.method,
            "speculation": speculation,
        }

    def under_test(self, record: TestRecord, spec_spec: ServerSpec | None) -> dict[str, Any]:
        """What the gate judges: versions, the draft/head identity, the plugin, the resolved engine config."""
        import importlib.metadata as md

        from .baselines import model_identity
        from .vllm_cli import vllm_distribution

        def version(dist: str | None) -> str | None:
            try:
                return md.version(dist) if dist else None
            except md.PackageNotFoundError:
                return None

        draft = None
        if spec_spec is not None and spec_spec.speculative_config and spec_spec.speculative_config.get("model"):
            cfg = spec_spec.speculative_config
            draft = model_identity(str(cfg["model"]), cfg.get("revision"))
        servers = self._pool.servers if self._pool else {}
        engine = {arm: _portable(servers[key].engine_config()) for arm, key in record.servers.items()
                  if key in servers}
        dist = vllm_distribution()
        return {
            "vllm": version(dist), "vllm_distribution": dist, "torch": version("torch"),
            "cuda": None if self.profile.device == "cpu" else version("nvidia-cuda-runtime-cu12"),
            "driver": None if self.profile.device == "cpu" else _driver_version(),
            "plugin": __version__, "draft": draft, "engine_config": engine,
            "endpoint": "external" if self.settings.endpoint else "owned",
        }

    def _start_check(self, nodeid: str, case: Case, record: TestRecord, ref_spec: ServerSpec,
                     spec_spec: ServerSpec | None, sampling: Any, options: VerdictOptions) -> BaselineCheck:
        from .baselines import BaselineError, diff

        comp = self.comparability(case, ref_spec, spec_spec, sampling)
        ut = self.under_test(record, spec_spec)
        path = self.store.path(nodeid)
        gate = self.gate(options)
        check = BaselineCheck(path=path, status="missing", check=options.check, comparability=comp,
                              under_test=ut, entry={}, alpha=self.settings.alpha, gate=gate)
        try:
            path, data = self.store.read(nodeid, self.create_command(nodeid, "missing"))
        except BaselineError as exc:
            check.status, check.error = "error", str(exc)
            return check
        if data is not None:
            check.baseline = data
            check.fields = diff(data["comparability"], comp)
            check.status = "not-comparable" if check.fields else "compared"
        return check

    def _evaluate(self, check: BaselineCheck, result: CaseResult, thresholds: Thresholds, *, look: int,
                  max_looks: int) -> None:
        from .baselines import session_entry
        from .verdicts import evaluate, not_comparable_verdicts

        started = dt.datetime.fromtimestamp(self.started, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        check.entry = session_entry(result, started, check.under_test)
        check.thresholds = thresholds
        if check.status == "compared" and check.baseline is not None:
            from .verdicts import tonight_deviation

            check.deviation = tonight_deviation(check.baseline, check.entry, self.night_factors())
            check.raw = evaluate(check.baseline, check.entry, thresholds=thresholds, alpha=self.settings.alpha,
                                 look=look, max_looks=max_looks, priors=self.priors(), nights=self.nights(),
                                 factors=self.night_factors(), tonight_log=self._machine_log(), gate=check.gate)
        elif check.status == "not-comparable":
            check.raw = not_comparable_verdicts(check.entry, check.fields, check.gate)

    def create_command(self, nodeid: str, mode: str) -> str:
        flag = "--update-baselines" + ("=missing" if mode == "missing" else "")
        extra = [f"--specdec-baselines={self.settings.baselines_dir}"] if self.settings.baselines_dir != (
            self.rootpath / "baselines") else []
        return shlex.join(["pytest", nodeid, flag, *extra])

    def _adjusted(self, nodeid: str, *, final: bool) -> list[Verdict]:
        """This test's verdicts after BH/Holm over every raw verdict so far (padded with p=1 to the family
        size collected, unless ``final``)."""
        import dataclasses

        from .stats import adjust, detectable, kind_of

        order = [(n, r.baseline) for n, r in self.records.items() if r.baseline is not None and r.baseline.raw]
        flat = [v for _, c in order for v in c.raw]  # type: ignore[union-attr]
        looks_of = [c.max_looks for _, c in order for _ in c.raw]  # type: ignore[union-attr]
        adjusted = list(flat)
        sizes = {"gated": self.gated_family_size, "shown": self.family_size - self.gated_family_size}
        for family in ("gated", "shown"):
            idx = [i for i, v in enumerate(flat) if v.family == family]
            part = [flat[i] for i in idx]
            with_p = sum(1 for v in part if v.p is not None and v.verdict != "not-comparable")
            size = None if final else max(sizes[family], with_p)
            for i, v in zip(idx, adjust(part, self.settings.fdr, self.settings.alpha, family_size=size)):
                adjusted[i] = v
            # What a lone regression must clear: BH/Holm over m tests is alpha/m for the smallest p.
            m = max(1, size or with_p)
            for i in idx:
                v, c_looks = adjusted[i], looks_of[i]
                if v.var_fixed is not None and v.var_run is not None and v.threshold is not None and v.n_now:
                    mde = detectable(kind_of(v.metric), v.threshold, v.var_fixed + v.var_run / v.n_now,
                                     v.df or 1.0, self.settings.alpha / (c_looks * m))
                    adjusted[i] = dataclasses.replace(v, mde=mde)
        start = 0
        for n, c in order:
            k = len(c.raw)  # type: ignore[union-attr]
            if n == nodeid:
                return adjusted[start:start + k]
            start += k
        return []

    def check(self, nodeid: str) -> str | None:
        """At the end of a specdec test: the failure message, or None when it passes.

        Regressions found after the family adjustment fail the test; a missing baseline fails with the
        command that creates it; a non-comparable baseline warns (fails under --specdec-strict).
        """
        from .verdicts import attribution, table, under_test_diff

        record = self.records.get(nodeid)
        c = record.baseline if record else None
        if c is None:
            return None
        c.verdicts = self._adjusted(nodeid, final=False)
        if not c.check:
            return None
        if c.status == "error":  # --update-baselines replaces an unreadable file (the summary says so)
            return None if self._updating_all() else f"specdec: {c.error}"
        rel = _rel(c.path, self.rootpath)
        if c.status == "missing":
            if self.settings.update_baselines:
                return None
            return (f"specdec: no baseline for this test at {rel}\n"
                    f"create it with: {self.create_command(nodeid, 'missing')}")
        if self._updating_all():
            return None
        if c.status == "not-comparable":
            fields = "\n".join(f"  {k}: {a!r} → {b!r}" for k, (a, b) in c.fields.items())
            msg = (f"baseline {rel} was measured under different conditions (not-comparable):\n{fields}\n"
                   f"to replace it with tonight's measurement: --update-baselines")
            if self.settings.strict:
                return "specdec: " + msg
            warnings.warn(SpecDecWarning(f"{nodeid}: {msg}"), stacklevel=1)
            return None
        from .verdicts import gated_with

        if gated_with(c.verdicts, "regressed"):
            c.failed = True
            return self.regression_message(nodeid, c, c.verdicts)
        open_ = gated_with(c.verdicts, "inconclusive")
        if open_:
            from .verdicts import guard_text

            what = "; ".join(f"{v.metric} {guard_text(v)}" for v in open_)
            msg = (f"{len(open_)} gated metric(s) inconclusive after {c.looks[-1] if c.looks else '?'} run(s) per "
                   f"arm: {what}")
            if self.settings.fail_inconclusive:
                c.failed = True
                from .verdicts import table

                level = 100 * (1 - 2 * self.settings.alpha / max(1, c.max_looks))
                return (f"specdec: {msg} (--specdec-fail-inconclusive)\n\n{table(c.verdicts, f'{level:.4g}% CI')}")
            warnings.warn(SpecDecWarning(f"{nodeid}: {msg}; the test passes (--specdec-fail-inconclusive fails it)"),
                          stacklevel=1)
        return None

    def regression_message(self, nodeid: str, c: BaselineCheck, verdicts: list[Verdict]) -> str:
        from .verdicts import attribution, gated_with, table, under_test_diff

        bad = gated_with(verdicts, "regressed")
        assert c.baseline is not None
        sessions = c.baseline["sessions"]
        unit = "session means" if len(sessions) > 1 else "runs"
        level = 100 * (1 - 2 * self.settings.alpha / max(1, c.max_looks))
        fdr = {"bh": "Benjamini-Hochberg", "holm": "Holm"}[self.settings.fdr]
        last = sessions[-1] if sessions else {}
        lines = [
            f"specdec: {len(bad)} metric(s) regressed: {', '.join(v.metric for v in bad)}",
            f"baseline: {_rel(c.path, self.rootpath)} ({len(sessions)} session(s); unit of comparison: {unit}; "
            f"{c.looks[-1] if c.looks else '?'} run(s) per arm now, look {len(c.looks)} of {c.max_looks})",
            f"p: one-sided, x{c.max_looks} for the looks, adjusted by {fdr} over the session's metric tests "
            f"(the family depends on which tests were selected)",
            "",
            table(verdicts, f"{level:.4g}% CI"),
            "",
            f"attribution: {attribution(verdicts)}",
            f"under test, baseline ({last.get('started', '?')}) → now:",
            *under_test_diff(c.baseline.get("under_test", {}), c.under_test),
            "why:",
            *[f"  {v.metric}: {v.note}" for v in bad],
            "",
            f"to accept this change: --update-baselines   ({self.create_command(nodeid, 'all')})",
        ]
        return "\n".join(lines)

    def finalize(self) -> list[str]:
        """Session end: final adjustment over the whole family, queued baseline writes, summary lines."""
        from .baselines import Pending

        from .verdicts import evaluate, gated_with, machine_factor

        lines: list[str] = []
        checked = [(n, r) for n, r in self.records.items() if r.baseline is not None]
        compared = [r.baseline for _, r in checked if r.baseline is not None and r.baseline.status == "compared"
                    and r.baseline.raw]
        threshold = abs(self.thresholds().bad_side("reference_tok_s", "rate"))
        self.machine = machine_factor([c.deviation for c in compared if c.deviation is not None], threshold,
                                      self.settings.alpha)
        if self.machine is not None:
            # Absolute figures are re-judged with the whole session's factor (the gated ratios do not use it).
            for c in compared:
                assert c.baseline is not None
                c.raw = evaluate(c.baseline, c.entry, thresholds=c.thresholds, alpha=self.settings.alpha,
                                 look=len(c.looks) or 1, max_looks=c.max_looks, priors=self.priors(),
                                 nights=self.nights(), factors=self.night_factors(), tonight_log=self.machine.log,
                                 gate=c.gate)
            lines.append(self.machine.line())
            if self.machine.beyond and not self._updating_all():
                if self.settings.fail_machine:
                    self.machine_failed = True
                    lines.append("specdec: the session fails on the machine factor (--specdec-fail-machine)")
                else:
                    warnings.warn(SpecDecWarning(self.machine.line().removeprefix("specdec: ")), stacklevel=1)
        for nodeid, record in checked:
            c = record.baseline
            assert c is not None
            c.final = self._adjusted(nodeid, final=True) if c.raw else []
            late = gated_with(c.final, "regressed")  # a shown metric never fails the session
            if (late and c.check and not c.failed and not self._updating_all() and c.status == "compared"):
                self.late_regressions.append(nodeid)
                lines.append(self.regression_message(nodeid, c, c.final).replace(
                    "specdec:", f"specdec: {nodeid}: after the whole session's family was known,", 1))
        untrusted = {n: r.result.untrusted_runs for n, r in self.records.items()
                     if r.result is not None and r.result.untrusted_runs}
        if untrusted:
            runs = sum(map(len, untrusted.values()))
            lines.append(f"specdec: {runs} run(s) of {len(untrusted)} test(s) had a coalesced stream; their latency "
                         "figures are left out of the verdicts (throughput kept):")
            lines += [line for n, r in self.records.items() if n in untrusted
                      for line in coalesced_lines(n, r.result, indent="  ")]  # type: ignore[arg-type]
        if self.late_regressions:
            lines.insert(0, f"specdec: {len(self.late_regressions)} test(s) passed at their end but regressed once "
                            "every p-value of the session was known (Benjamini-Hochberg/Holm need all of them):")
        self.gate_summary = self.gate_lines()
        if self.settings.update_baselines and self._store is not None:
            for nodeid, record in checked:
                c = record.baseline
                assert c is not None
                valid = record.result is not None and any(r.valid for r in record.result.reference_runs)
                if not valid or record.outcome != "passed":
                    why = "no valid runs" if not valid else f"the test {record.outcome}"
                    lines.append(f"specdec: not writing {_rel(c.path, self.rootpath)}: {why}")
                    continue
                # Only a gated change is a change being accepted (it drops the older nights); a shown-family
                # figure that moved with the machine must not wipe the file's history.
                changed = ", ".join(f"{v.metric} {v.verdict}" for v in c.shown()
                                    if v.verdict in ("regressed", "improved") and v.family == "gated")
                self.store.queue(Pending(nodeid, c.path, c.comparability, c.under_test, c.entry, changed))
            lines += self.store.flush().lines(self.store.root)
        return lines

    def gate_lines(self) -> list[str]:
        """Per test, each gated verdict and what the baseline can catch, and the absolute figures once the
        machine factor is divided out (shown family); then the inconclusive count."""
        from .verdicts import ABSOLUTE, LABELS, guard_text, verdict_phrase

        # Gated metrics that come from latencies: a coalesced stream can leave them without values.
        latency_gated = {"e2e_p95_ratio", "ttft_p95_ms", "tpot_p95_ms", "e2e_p95_ms"}

        rows = [(n, r.baseline) for n, r in self.records.items() if r.baseline is not None and r.baseline.final]
        if not rows:
            return []
        m = sum(1 for _, c in rows for v in c.final or [] if v.family == "gated" and v.p is not None)
        out = [f"specdec gate: per test, the gated verdicts and the smallest change each would catch "
               f"(power 0.9, {self.settings.fdr.upper()} over {m} gated tests at alpha {self.settings.alpha:g}):"]
        counts: dict[str, int] = {}
        open_tests: list[str] = []
        unspent = 0
        for nodeid, c in rows:
            name = nodeid.split("::")[-1]
            gated = [v for v in c.final or [] if v.family == "gated"]
            for v in gated:
                counts[v.verdict] = counts.get(v.verdict, 0) + 1
            if c.status == "not-comparable":  # one line: no verdict was possible, and why
                fields = ", ".join(f"{k} {a!r} → {b!r}" for k, (a, b) in c.fields.items())
                out.append(f"  {name}: not comparable with its baseline ({fields})")
                continue
            parts = [f"{LABELS.get(v.metric, v.metric)} {v.verdict} ({guard_text(v)})" for v in gated]
            result = self.records[nodeid].result
            if result is not None and result.untrusted_runs:  # a latency left with no trusted run
                judged = {v.metric for v in gated}
                parts += [f"{LABELS.get(m, m)} not judged (coalesced streams: no run's latency trusted)"
                          for m in c.gate if m not in judged and m in latency_gated]
            out.append(f"  {name}: " + "; ".join(parts))
            absolute = [v for v in c.final or [] if v.metric in ABSOLUTE and v.family != "gated"]
            if absolute and self.machine is not None:
                out.append(f"    after the machine factor ({self.machine.factor:.3f}): "
                           + "; ".join(verdict_phrase(LABELS.get(v.metric, v.metric), v) for v in absolute))
            n_open = sum(1 for v in gated if v.verdict == "inconclusive")
            if n_open:
                open_tests.append(f"{name} ({n_open})")
            unspent += c.unspent
        total = ", ".join(f"{counts.get(k, 0)} {k}" for k in ("unchanged", "regressed", "improved", "inconclusive",
                                                             "not-comparable") if counts.get(k))
        out.append(f"specdec gate: {len(rows)} test(s), gated verdicts {total or 'none'}; "
                   f"{unspent} run(s) per arm not spent (no look could change a verdict)")
        out.append(f"specdec gate: inconclusive gated metrics per test: {', '.join(open_tests) or 'none'}"
                   + (" (they fail with --specdec-fail-inconclusive)" if open_tests and not self.settings.fail_inconclusive
                      else ""))
        return out

    def record_failure(self, nodeid: str, message: str) -> list[tuple[str, str]]:
        """A failed test: keep its failure text and its servers' log tails in the results (the HTML
        report shows them); returns the (title, tail) sections for the terminal report."""
        record = self.records.get(nodeid)
        if record is None:
            return []
        if record.error is None and message:
            record.error = message if len(message) <= 6000 else "…" + message[-6000:]
        by_key = self._pool.servers if self._pool else {}
        seen = {(e["arm"], e["server"]) for e in record.server_logs}
        sections = []
        for arm, key in record.servers.items():
            if key not in by_key:
                continue
            server = by_key[key]
            tail = server.log_tail()  # read once: the terminal section and the results share it
            sections.append((f"vLLM {arm} server log (tail, {server.log_path})", tail))
            if (arm, key) not in seen:
                record.server_logs.append({"arm": arm, "server": key, "path": str(server.log_path), "tail": tail})
        return sections

    # --- output --------------------------------------------------------------------------------
    def dry_run_lines(self, cases: list[tuple[str, Case]]) -> list[str]:
        """Every test's exact server commands and each suite's estimated run time, without starting anything."""
        from .estimate import PlannedTest, Timings, estimate, minutes
        from .measurement import warmup_requests

        profile = self.profile
        lines = [f"specdec dry run: profile {profile.name} ({profile.path}), {len(cases)} test(s); nothing is started"]
        if self.hardware_note:
            lines.append(f"specdec dry run: {self.hardware_note}")
        if self.settings.endpoint:
            lines.append(f"specdec dry run: endpoint mode: the commands are what the endpoints "
                         f"({self.settings.endpoint}, reference {self.settings.reference_endpoint}) would need to run")
        specs: dict[str, ServerSpec] = {}
        planned: list[PlannedTest] = []
        unknown: list[str] = []
        for nodeid, case in cases:
            arms = [("reference", self.server_spec(case, reference=True))]
            if case.method != "none":
                arms.append(("spec", self.server_spec(case, reference=False)))
            lines.append(f"  {nodeid}")
            for arm, spec in arms:
                specs.setdefault(spec.key(), spec)
                lines.append(f"    {arm} [{spec.key()}]: {_command_line(spec)}")
            try:
                prompts = self.prompts(case)
            except ConfigError as exc:
                unknown.append(f"{nodeid}: {exc}")
                continue
            warm = prompts[: warmup_requests(len(prompts), case.concurrency)]
            planned.append(PlannedTest(
                nodeid, tuple(spec.key() for _, spec in arms), sum(p.max_tokens for p in prompts), len(prompts),
                case.concurrency, sum(p.max_tokens for p in warm), len(warm),
            ))
        methods = ", ".join(f"{key} {spec.method}" for key, spec in specs.items())
        lines.append(f"specdec dry run: {len(specs)} distinct server(s): {methods}")
        cpus = None if self.settings.endpoint else self.server_cpus()
        if cpus:
            import os

            from .pool import format_cpus

            client = format_cpus(os.sched_getaffinity(0) - cpus)
            lines.append(f"specdec dry run: servers start on CPU {format_cpus(cpus)}, leaving CPU {client} to the "
                         f"client ([placement] client_cpus = {self.profile.raw['placement']['client_cpus']})")
        timings = Timings.from_profile(profile.raw, profile.path)
        if timings is None:
            lines.append(f"specdec dry run: no run-time estimate: profile {profile.path} has no [timings]")
            return lines
        max_runs = self._looks()[-1]
        modules = estimate(planned, timings, runs=self.runs(), max_runs=max_runs, max_servers=self.max_alive())
        lines.append(
            f"specdec dry run: estimated run time per suite ([timings] of {profile.name}: {timings.server_start_s:g} s "
            f"per server start, {timings.stream_tok_s:g} tok/s per request, {timings.max_tok_s:g} tok/s at most; "
            f"{self.runs()} interleaved run(s) per arm, every request to its max_tokens, spec runs at the "
            f"reference's rate):"
        )
        for m in modules:
            lines.append(f"  {m.module}: {m.tests} test(s), {m.starts} server start(s), {m.runs} run(s): "
                         f"~{minutes(m.seconds)} (up to {minutes(m.seconds_max)} if verdicts take {max_runs} "
                         f"run(s) per arm)")
        total = sum(m.seconds for m in modules)
        total_max = sum(m.seconds_max for m in modules)
        price = self.price()  # the report's price too: --specdec-gpu-hourly-usd, else the profile's, per server
        hourly = price["usd_per_hour"] if price else None
        cost = f"; ${total / 3600 * hourly:.2f} to ${total_max / 3600 * hourly:.2f} at ${hourly:g}/h" if hourly else ""
        lines.append(f"  total: ~{minutes(total)} (up to {minutes(total_max)}){cost}")
        lines += [f"  no estimate for {u}" for u in unknown]
        return lines

    def environment(self) -> dict[str, Any]:
        from .load import event_loop_name
        from .vllm_cli import vllm_distribution
        import importlib.metadata as md

        dist = vllm_distribution()
        servers = list(self._pool.servers.values()) if self._pool else []
        local = [{k: v for k, v in w.items() if k != "pid"} for s in servers for w in s.workarounds()]
        return {
            "hardware": self.hardware(),
            "device": self.profile.device,
            "vllm_distribution": dist,
            "vllm_version": md.version(dist) if dist else None,
            "plugin_version": __version__,
            "python": platform.python_version(),
            "client_event_loop": event_loop_name(),
            "target_model": self.profile.target,
            "commit": _commit_info(),
            "workarounds": _unique([*local, *(w for r in self._remote for w in r["workarounds"])]),
        }

    def hardware(self) -> str:
        """What the results say the session ran on: the CPU model, or the GPUs nvidia-smi listed (the SKU);
        without that look (dry run, endpoint mode) the profile's `hardware`, marked as not checked."""
        if self.profile.device == "cpu":
            return _cpu_model()
        if self.gpu_names:
            return self.gpu_names
        return f"{self.profile.raw.get('hardware', self.profile.name)} (profile; GPUs not checked)"

    def _local_servers(self) -> dict[str, dict[str, Any]]:
        servers = self._pool.servers if self._pool else {}
        return {
            key: {
                "method": server.spec.method,
                "command": server.command,
                "env": dict(server.spec.env),
                "startup_s": server.startup_s,
                "engine_config": server.engine_config(),
                "cuda_visible_devices": server.placement_env.get("CUDA_VISIBLE_DEVICES"),
                "cpus": sorted(server.cpus) if server.cpus else None,
                "priority": server.priority,
                **({"placements": [{"worker": self.worker, "startup_s": server.startup_s,
                                    "cuda_visible_devices": server.placement_env.get("CUDA_VISIBLE_DEVICES")}]}
                   if self.worker else {}),
            }
            for key, server in servers.items()
        }

    def server_starts(self) -> list[StartRecord]:
        """Every vLLM start of the session: this process's, and on the xdist controller every worker's."""
        return [*(self._pool.starts if self._pool else []), *(x for r in self._remote for x in r["starts"])]

    def results(self) -> dict[str, Any]:
        env = self.environment()
        servers = self._local_servers()
        for remote in self._remote:  # xdist: a spec several workers started is listed once, with each placement
            for key, info in remote["servers"].items():
                if key in servers:
                    servers[key]["placements"] = [*servers[key].get("placements", []), *info["placements"]]
                else:
                    servers[key] = info
        return {
            "schema": 1,
            "started": dt.datetime.fromtimestamp(self.started, dt.timezone.utc).isoformat(),
            "duration_s": round(time.time() - self.started, 1),
            "profile": self.profile.name,
            "environment": env,
            "servers": servers,
            "server_starts": len(self.server_starts()),
            "datasets": {name: d.describe() for name, d in self._datasets.items()},
            "endpoints": {url: facts.to_dict() for url, facts in self._endpoint_facts.items()},
            "price": self.price(),
            "machine_factor": self.machine.to_dict() if self.machine is not None else None,
            "gate": {"fail_inconclusive": self.settings.fail_inconclusive, "fail_machine": self.settings.fail_machine,
                     "machine_failed": self.machine_failed,
                     "night_variance": {k: v.to_dict() for k, v in (self._nights or {}).items()}},
            "tests": [r.to_dict() for r in self.records.values()],
        }

    def price(self) -> dict[str, Any] | None:
        """Hourly price of one server's hardware for the report's cost per 1M output tokens:
        --specdec-gpu-hourly-usd, else the profile's `price_per_hour_usd` (per GPU), times the GPUs a server uses."""
        per_gpu, source = self.settings.gpu_hourly_usd, "--specdec-gpu-hourly-usd"
        if per_gpu is None:
            raw = self.profile.raw.get("price_per_hour_usd")
            if raw is None:
                return None
            per_gpu, source = float(raw), f"profile {self.profile.name} price_per_hour_usd"
        gpus = 1 if self.profile.device == "cpu" else self.profile.tensor_parallel_size
        return {"usd_per_hour": per_gpu * gpus, "usd_per_gpu_hour": per_gpu, "gpus": gpus, "source": source}

    def write_report(self, results: dict[str, Any]) -> list[Path]:
        """The HTML report next to the JSON (timestamped + latest.html), or at --specdec-report; and the
        pytest-benchmark export at --specdec-benchmark-json. Returns the HTML paths."""
        from .report import benchmark_json, render_html

        stamp = dt.datetime.fromtimestamp(self.started, dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        html = render_html(results)
        paths = ([self.settings.report_path] if self.settings.report_path else
                 [self.settings.reports_dir / f"specdec-{stamp}.html", self.settings.reports_dir / "latest.html"])
        writes = [(path, html) for path in paths]
        if self.settings.benchmark_json:
            writes.append((self.settings.benchmark_json, json.dumps(benchmark_json(results), indent=1, default=str)))
        for path, text in writes:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(text, encoding="utf-8")
            tmp.replace(path)
        return paths

    def write_results(self) -> list[Path]:
        """Always under reports/ (timestamped + latest), and at --specdec-json when given; then the HTML
        report from the same data (its paths are `self.report_paths`)."""
        if not self.records:
            return []
        results = self.results()
        data = json.dumps(results, indent=1, sort_keys=True, default=str)
        stamp = dt.datetime.fromtimestamp(self.started, dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        paths = [self.settings.reports_dir / f"specdec-{stamp}.json", self.settings.reports_dir / "latest.json"]
        if self.settings.json_path:
            paths.append(self.settings.json_path)
        for path in paths:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(data)
            tmp.replace(path)
        self.report_paths = self.write_report(json.loads(data))
        return paths

    def close(self) -> None:
        if self._pool is not None:
            self._pool.stop_all()

    # --- pytest-xdist: workers measure, the controller alone adjusts, writes results and baselines ---
    def worker_output(self) -> bytes:
        """What a worker sends the controller at its session end (via `config.workeroutput`).

        Pickled: the records hold dataclasses (results, verdicts) that execnet cannot send as they are;
        both ends run the same plugin code.  The baseline files this worker read go too, so the
        controller's "unused" count sees every worker's tests.
        """
        import pickle

        store = self._store
        return pickle.dumps({
            "worker": self.worker,
            "records": self.records,
            "servers": self._local_servers(),
            "starts": self._pool.starts if self._pool else [],
            "workarounds": self.environment()["workarounds"] if self._pool else [],
            "used": store.used if store else set(),
            "modules": store.modules if store else set(),
        })

    def parallel_warning(self, workers: int) -> SpecDecWarning | None:
        """Why -n on a cpu-device profile measures badly (a GPU profile leases disjoint GPUs instead)."""
        if self.profile.device != "cpu":
            return None
        return SpecDecWarning(
            f"pytest-xdist runs {workers} workers on the {self.profile.name} profile (device cpu): their vLLM "
            "servers and load generators share this host's CPU cores, so every worker's timings disturb the "
            "others' and there are no GPUs to lease apart; use -n on GPU profiles, and keep baselines from "
            "sequential sessions")

    def merge_worker(self, blob: bytes) -> list[str]:
        """Controller: take a finished worker's records; returns problems to show (never dropped silently)."""
        import pickle

        data = pickle.loads(blob)  # noqa: S301 - sent by our own worker process over xdist's channel
        worker = str(data["worker"])
        problems = []
        for nodeid, record in data["records"].items():
            if nodeid in self.records:
                problems.append(f"specdec: {nodeid} was measured by both {self._measured_by[nodeid]} and {worker}; "
                                f"kept {self._measured_by[nodeid]}'s measurement")
                continue
            self.records[nodeid] = record
            self._measured_by[nodeid] = worker
        if data["used"] or data["modules"]:
            self.store.used |= data["used"]
            self.store.modules |= data["modules"]
        self._remote.append({k: data[k] for k in ("worker", "servers", "starts", "workarounds")})
        return problems


def _portable(value: Any) -> Any:
    """The zoo's model paths written `zoo:NAME` again: where a checkout lives is no change under test
    (the models' identity is in `draft` and the comparability's `target`, by sha256)."""
    from .zoo import MODELS_DIR

    prefix = f"{MODELS_DIR}/"
    if isinstance(value, str) and value.startswith(prefix):
        return "zoo:" + value[len(prefix):]
    if isinstance(value, dict):
        return {k: _portable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_portable(v) for v in value]
    return value


def _command_line(spec: ServerSpec) -> str:
    """`ENV=... vllm serve ...` as a shell line, the port left as $PORT (the pool picks a free one)."""
    from .server import build_command

    env = "".join(f"{k}={shlex.quote(v)} " for k, v in spec.env)
    return (env + shlex.join(build_command(spec, "$PORT"))).replace("'$PORT'", "$PORT")


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def _commit_info() -> dict[str, Any] | None:
    """The suite repository's commit, from the working directory like pytest-benchmark (its helper)."""
    from pytest_benchmark.utils import get_commit_info

    info = get_commit_info()
    return None if info.get("id") in (None, "unversioned", "unknown") else dict(info)


def _driver_version() -> str | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return out[0] if out else None


def _unique(entries: Any) -> list[dict[str, Any]]:
    """Distinct dicts in first-seen order (each server process records the same workaround)."""
    seen: dict[str, dict[str, Any]] = {}
    for entry in entries:
        seen.setdefault(json.dumps(entry, sort_keys=True), entry)
    return list(seen.values())


def coalesced_lines(nodeid: str, result: CaseResult, indent: str = "specdec: ") -> list[str]:
    """One line per run whose stream was coalesced: its latency figures are left out, and why."""
    return [f"{indent}{nodeid}: {r.arm} run {r.index + 1}: latency left out: {'; '.join(r.untrusted)}"
            for r in result.untrusted_runs]


def _host_port(url: str) -> tuple[str, int | None]:
    """An endpoint URL's host and port (None when it names none and its scheme implies one)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return parts.hostname or "", parts.port


def _spec_tokens(spec: ServerSpec | None) -> int | None:
    """The spec server's k: with it one engine step makes at most k + 1 tokens per request."""
    k = (spec.speculative_config or {}).get("num_speculative_tokens") if spec is not None else None
    return int(k) if isinstance(k, int) and not isinstance(k, bool) else None


def _f(x: float | None, spec: str = ".1f") -> str:
    return "—" if x is None else format(x, spec)
