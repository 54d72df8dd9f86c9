"""The one object a pytest session keeps in `config.stash`: profile, servers, results.

`plugin.py` only forwards hooks here.  Nothing in this module starts work at import time.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import random
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from . import __version__
from .errors import ConfigError
from .markers import Case
from .options import Settings

if TYPE_CHECKING:
    from .datasets import Dataset
    from .load import Prompt
    from .measurement import CaseResult
    from .pool import Endpoint, ServerPool
    from .profiles import Profile
    from .server import ServerSpec


def detect_profile_name() -> str:
    """`--gpu auto`: cpu unless nvidia-smi lists a GPU."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "cpu"
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "cpu"
    if "GPU" not in out:
        return "cpu"
    raise ConfigError(
        f"--gpu auto found NVIDIA GPUs ({out.splitlines()[0]}) but no GPU profile is built in yet: "
        "pass --gpu cpu, or --specdec-profile PATH with your own profile"
    )


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

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "nodeid": self.nodeid,
            "params": self.case.params(),
            "outcome": self.outcome,
            "servers": self.servers,
        }
        if self.result is not None:
            out.update(self.result.to_dict())
        if self.error:
            out["error"] = self.error
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
        self.records: dict[str, TestRecord] = {}

    # --- configuration -------------------------------------------------------------------------
    @property
    def profile(self) -> Profile:
        if self._profile is None:
            from .profiles import load_profile

            name = self.settings.profile_path or (
                detect_profile_name() if self.settings.gpu == "auto" else self.settings.gpu
            )
            self._profile = load_profile(name)
        return self._profile

    @property
    def pool(self) -> ServerPool:
        if self._pool is None:
            from .pool import ServerPool

            self._pool = ServerPool(
                self.settings.reports_dir / "logs", self.settings.max_servers,
                self.settings.startup_timeout_s, progress=self.progress,
            )
        return self._pool

    def runs(self) -> int:
        return self.settings.runs or int(self.profile.matrix.get("runs", 3))

    def dataset(self, name: str) -> Dataset:
        if name not in self._datasets:
            from .datasets import builtin, load_jsonl

            if name == "builtin":
                self._datasets[name] = builtin()
            else:
                path = Path(name)
                if not path.is_absolute():
                    path = self.rootpath / path
                if not path.is_file():
                    raise ConfigError(f"dataset {name!r}: no such file ({path}); use 'builtin' or a JSONL path")
                self._datasets[name] = load_jsonl(path)
        return self._datasets[name]

    def prompts(self, case: Case) -> list[Prompt]:
        """The workload: the dataset's prompts (a seeded sample of num_prompts), max_tokens applied."""
        import dataclasses

        prompts = list(self.dataset(case.dataset).prompts)
        if case.num_prompts is not None:
            if case.num_prompts > len(prompts):
                raise ConfigError(
                    f"num_prompts={case.num_prompts} but dataset {case.dataset!r} has {len(prompts)} prompts"
                )
            prompts = random.Random(0).sample(prompts, case.num_prompts)
        if case.max_tokens is not None:
            prompts = [dataclasses.replace(p, max_tokens=case.max_tokens) for p in prompts]
        return prompts

    def server_spec(self, case: Case, reference: bool) -> ServerSpec:
        from .profiles import server_spec
        from .server import ServerSpec

        if reference or case.method == "none":
            return server_spec(self.profile, "none", None)
        if case.speculative_config is not None:
            base = server_spec(self.profile, "none", None)
            return ServerSpec(model=base.model, speculative_config=case.speculative_config,
                              args=base.args, env=base.env)
        return server_spec(self.profile, case.method, case.k)

    # --- measuring -----------------------------------------------------------------------------
    def endpoint(self, spec: ServerSpec, reference: bool) -> Endpoint:
        from .pool import Endpoint
        from .load import served_model

        if self.settings.endpoint:
            url = self.settings.reference_endpoint if reference else self.settings.endpoint
            assert url is not None
            return Endpoint(url, served_model(url, self.settings.api_key), owned=False)
        server = self.pool.get(spec)
        return Endpoint(server.base_url, served_model(server.base_url), owned=True)

    def measure(self, nodeid: str, case: Case) -> CaseResult:
        """Run the case's interleaved reference/spec runs; the result is recorded for the JSON."""
        from .load import Sampling
        from .measurement import measure_case

        record = self.records.setdefault(nodeid, TestRecord(nodeid, case))
        prompts = self.prompts(case)
        ref_spec = self.server_spec(case, reference=True)
        spec_spec = None if case.method == "none" else self.server_spec(case, reference=False)
        record.servers = {"reference": ref_spec.key(), **({"spec": spec_spec.key()} if spec_spec else {})}
        reference = self.endpoint(ref_spec, reference=True)
        spec = self.endpoint(spec_spec, reference=False) if spec_spec else None
        self.progress(f"specdec: {nodeid}: {len(prompts)} prompts x {self.runs()} interleaved runs")
        result = measure_case(
            reference, spec, prompts, Sampling(temperature=case.temperature),
            concurrency=case.concurrency, runs=self.runs(), api_key=self.settings.api_key,
            rules=self.profile.validity_rules(), progress=self.progress,
        )
        record.result = result
        s = result.summary
        self.progress(
            f"specdec: {nodeid}: {_f(s['output_tps'])} tok/s vs reference {_f(s['reference_output_tps'])}, "
            f"speedup {_f(s['speedup'], '.2f')}x, acceptance {_f(s['acceptance_rate'], '.3f')}"
        )
        return result

    def log_tails(self, nodeid: str) -> list[tuple[str, str]]:
        """(title, tail) of the server logs a test used, for its failure report."""
        record = self.records.get(nodeid)
        if record is None or self._pool is None:
            return []
        by_key = self._pool.servers
        return [
            (f"vLLM {arm} server log (tail, {by_key[key].log_path})", by_key[key].log_tail())
            for arm, key in record.servers.items() if key in by_key
        ]

    # --- output --------------------------------------------------------------------------------
    def dry_run_lines(self, cases: list[tuple[str, Case]]) -> list[str]:
        """The test matrix and every server command, without starting anything."""
        from .server import build_command

        lines = [f"specdec dry run: profile {self.profile.name} ({self.profile.path}), {len(cases)} test(s)"]
        specs: dict[str, ServerSpec] = {}
        for nodeid, case in cases:
            ref = self.server_spec(case, reference=True)
            specs.setdefault(ref.key(), ref)
            servers = f"reference {ref.key()}"
            if case.method != "none":
                spec = self.server_spec(case, reference=False)
                specs.setdefault(spec.key(), spec)
                servers += f", spec {spec.key()}"
            lines.append(f"  {nodeid}  [{servers}]")
        lines.append(f"specdec dry run: {len(specs)} distinct server(s):")
        for key, spec in specs.items():
            env = " ".join(f"{k}={shlex.quote(v)}" for k, v in spec.env)
            lines.append(f"  [{key}] {env} {shlex.join(build_command(spec, '$PORT'))}".replace("'$PORT'", "$PORT"))
        return lines

    def environment(self) -> dict[str, Any]:
        from .vllm_cli import vllm_distribution
        import importlib.metadata as md

        dist = vllm_distribution()
        servers = list(self._pool.servers.values()) if self._pool else []
        return {
            "hardware": _cpu_model() if self.profile.device == "cpu" else self.profile.name,
            "device": self.profile.device,
            "vllm_distribution": dist,
            "vllm_version": md.version(dist) if dist else None,
            "plugin_version": __version__,
            "python": platform.python_version(),
            "target_model": self.profile.target,
            "workarounds": _unique(
                {k: v for k, v in w.items() if k != "pid"} for s in servers for w in s.workarounds()
            ),
        }

    def results(self) -> dict[str, Any]:
        servers = self._pool.servers if self._pool else {}
        env = self.environment()
        return {
            "schema": 1,
            "started": dt.datetime.fromtimestamp(self.started, dt.timezone.utc).isoformat(),
            "duration_s": round(time.time() - self.started, 1),
            "profile": self.profile.name,
            "environment": env,
            "servers": {
                key: {
                    "method": server.spec.method,
                    "command": server.command,
                    "env": dict(server.spec.env),
                    "startup_s": server.startup_s,
                    "engine_config": server.engine_config(),
                }
                for key, server in servers.items()
            },
            "server_starts": len(self._pool.starts) if self._pool else 0,
            "tests": [r.to_dict() for r in self.records.values()],
        }

    def write_results(self) -> list[Path]:
        """Always under reports/ (timestamped + latest), and at --specdec-json when given."""
        if not self.records:
            return []
        data = json.dumps(self.results(), indent=1, sort_keys=True, default=str)
        stamp = dt.datetime.fromtimestamp(self.started, dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        paths = [self.settings.reports_dir / f"specdec-{stamp}.json", self.settings.reports_dir / "latest.json"]
        if self.settings.json_path:
            paths.append(self.settings.json_path)
        for path in paths:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(data)
            tmp.replace(path)
        return paths

    def close(self) -> None:
        if self._pool is not None:
            self._pool.stop_all()


def _unique(entries: Any) -> list[dict[str, Any]]:
    """Distinct dicts in first-seen order (each server process records the same workaround)."""
    seen: dict[str, dict[str, Any]] = {}
    for entry in entries:
        seen.setdefault(json.dumps(entry, sort_keys=True), entry)
    return list(seen.values())


def _f(x: float | None, spec: str = ".1f") -> str:
    return "—" if x is None else format(x, spec)
