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
    from .load import Prompt
    from .measurement import CaseResult
    from .pool import Endpoint, ServerPool
    from .profiles import Profile
    from .server import ServerSpec
    from .stats import Prior, Thresholds, Verdict


class SpecDecWarning(pytest.PytestWarning):
    """A pytest-specdec condition worth seeing that does not fail the test (e.g. a non-comparable baseline)."""


@dataclass
class VerdictOptions:
    """What the `specdec_verdicts` marker says for one test."""

    check: bool = True
    thresholds: dict[str, float] = field(default_factory=dict)


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

    def shown(self) -> list[Verdict]:
        return self.final if self.final is not None else (self.verdicts or self.raw)

    def under_test_diff(self) -> dict[str, list[Any]]:
        """What changed under test since the baseline's last session (the report shows it per test)."""
        if not self.baseline:
            return {}
        from .baselines import diff

        return {k: [a, b] for k, (a, b) in diff(self.baseline.get("under_test", {}), self.under_test).items()}

    def to_dict(self) -> dict[str, Any]:
        from .verdicts import attribution

        shown = self.shown()
        path = str(self.path)
        sessions = len(self.baseline["sessions"]) if self.baseline else 0
        return {
            "path": path, "status": self.status, "checked": self.check, "sessions": sessions,
            "not_comparable_fields": {k: [a, b] for k, (a, b) in self.fields.items()},
            "looks": self.looks, "max_looks": self.max_looks,
            "adjusted": "session" if self.final is not None else "test-end",
            "attribution": attribution(shown) if shown else None,
            "under_test": self.under_test,
            "under_test_diff": self.under_test_diff(),
            **({"error": self.error} if self.error else {}),
        }


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
    baseline: BaselineCheck | None = None
    #: tails of the servers' logs when the test failed, so the HTML report can show them the morning after
    server_logs: list[dict[str, str]] = field(default_factory=list)

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
        if self.server_logs:
            out["server_logs"] = self.server_logs
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
        self.records: dict[str, TestRecord] = {}
        self._store: BaselineStore | None = None
        self._priors: dict[tuple[str, str], Prior] | None = None
        self._base_thresholds: list[dict[str, float]] | None = None
        #: metric tests the collected specdec tests can add to the family (for BH before all are known)
        self.family_size = 0
        self.late_regressions: list[str] = []
        self.summary_lines: list[str] = []
        self.report_paths: list[Path] = []

    # --- configuration -------------------------------------------------------------------------
    @property
    def profile(self) -> Profile:
        if self._profile is None:
            from .profiles import load_profile

            name = self.settings.profile_path or (
                detect_profile_name() if self.settings.gpu == "auto" else self.settings.gpu
            )
            self._profile = load_profile(name).with_drafts(dict(self.settings.drafts))
            self.price()  # a bad price_per_hour_usd is an error now, not after the whole nightly ran
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

    def measure(self, nodeid: str, case: Case, verdicts: VerdictOptions | None = None) -> CaseResult:
        """Run the case's interleaved reference/spec runs; the result is recorded for the JSON.

        With ``verdicts`` the runs are compared with the stored baseline, and while a verdict is
        inconclusive more pairs are added two at a time up to the maximum (alpha split over the looks).
        """
        from .load import Sampling
        from .measurement import extend_case, measure_case

        record = self.records.setdefault(nodeid, TestRecord(nodeid, case))
        prompts = self.prompts(case)
        ref_spec = self.server_spec(case, reference=True)
        spec_spec = None if case.method == "none" else self.server_spec(case, reference=False)
        record.servers = {"reference": ref_spec.key(), **({"spec": spec_spec.key()} if spec_spec else {})}
        reference = self.endpoint(ref_spec, reference=True)
        spec = self.endpoint(spec_spec, reference=False) if spec_spec else None
        self.progress(f"specdec: {nodeid}: {len(prompts)} prompts x {self.runs()} interleaved runs")
        sampling = Sampling(temperature=case.temperature)
        kw: dict[str, Any] = dict(concurrency=case.concurrency, api_key=self.settings.api_key,
                                  rules=self.profile.validity_rules(), progress=self.progress)
        result = measure_case(reference, spec, prompts, sampling, runs=self.runs(), **kw)
        record.result = result
        if verdicts is not None:
            check = self._start_check(nodeid, case, record, ref_spec, spec_spec, sampling, verdicts)
            looks = self._looks() if check.check and check.status == "compared" and not self._updating_all() else [self.runs()]
            check.max_looks = len(looks)
            thresholds = self.thresholds(verdicts)
            for i, n in enumerate(looks, start=1):
                if len(result.reference_runs) < n:
                    self.progress(f"specdec: {nodeid}: inconclusive at look {i - 1} of {len(looks)}: "
                                  f"{n} interleaved runs")
                    extend_case(result, reference, spec, prompts, sampling, runs=n, **kw)
                check.looks.append(len(result.reference_runs))
                self._evaluate(check, result, thresholds, look=i, max_looks=len(looks))
                from .stats import should_continue

                if not any(should_continue(v, len(result.reference_runs), looks[-1]) for v in check.raw
                           if v.p is not None):
                    break
            record.baseline = check
        s = result.summary
        self.progress(
            f"specdec: {nodeid}: {_f(s['output_tps'])} tok/s vs reference {_f(s['reference_output_tps'])}, "
            f"speedup {_f(s['speedup'], '.2f')}x, acceptance {_f(s['acceptance_rate'], '.3f')}"
        )
        return result

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

    def priors(self) -> dict[tuple[str, str], Prior]:
        """Variance priors from every readable stored baseline of this profile (computed once)."""
        if self._priors is None:
            from .baselines import BaselineError, load
            from .verdicts import priors_from

            datas = []
            for f in self.store.all_files():
                try:
                    data = load(f, "pytest --update-baselines")
                except BaselineError:
                    continue  # its own test reports it
                if data is not None:
                    datas.append(data)
            self._priors = priors_from(datas)
        return self._priors

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
            "dataset": {"name": case.dataset, "sha256": self.dataset(case.dataset).sha256},
            "workload": {"concurrency": case.concurrency, "max_tokens": case.max_tokens,
                         "num_prompts": case.num_prompts, "rate": None},
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
        engine = {arm: servers[key].engine_config() for arm, key in record.servers.items() if key in servers}
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
        check = BaselineCheck(path=path, status="missing", check=options.check, comparability=comp,
                              under_test=ut, entry={})
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
        if check.status == "compared" and check.baseline is not None:
            check.raw = evaluate(check.baseline, check.entry, thresholds=thresholds, alpha=self.settings.alpha,
                                 look=look, max_looks=max_looks, priors=self.priors())
        elif check.status == "not-comparable":
            check.raw = not_comparable_verdicts(check.entry, check.fields)

    def create_command(self, nodeid: str, mode: str) -> str:
        flag = "--update-baselines" + ("=missing" if mode == "missing" else "")
        extra = [f"--specdec-baselines={self.settings.baselines_dir}"] if self.settings.baselines_dir != (
            self.rootpath / "baselines") else []
        return shlex.join(["pytest", nodeid, flag, *extra])

    def _adjusted(self, nodeid: str, *, final: bool) -> list[Verdict]:
        """This test's verdicts after BH/Holm over every raw verdict so far (padded with p=1 to the family
        size collected, unless ``final``)."""
        from .stats import adjust

        order = [(n, r.baseline) for n, r in self.records.items() if r.baseline is not None and r.baseline.raw]
        flat = [v for _, c in order for v in c.raw]  # type: ignore[union-attr]
        with_p = sum(1 for v in flat if v.p is not None and v.verdict != "not-comparable")
        size = None if final else max(self.family_size, with_p)
        adjusted = adjust(flat, self.settings.fdr, self.settings.alpha, family_size=size)
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
        bad = [v for v in c.verdicts if v.verdict == "regressed"]
        if not bad:
            return None
        c.failed = True
        return self.regression_message(nodeid, c, c.verdicts)

    def regression_message(self, nodeid: str, c: BaselineCheck, verdicts: list[Verdict]) -> str:
        from .verdicts import attribution, table, under_test_diff

        bad = [v for v in verdicts if v.verdict == "regressed"]
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

        lines: list[str] = []
        checked = [(n, r) for n, r in self.records.items() if r.baseline is not None]
        for nodeid, record in checked:
            c = record.baseline
            assert c is not None
            c.final = self._adjusted(nodeid, final=True) if c.raw else []
            late = [v for v in c.final if v.verdict == "regressed"]
            if (late and c.check and not c.failed and not self._updating_all() and c.status == "compared"):
                self.late_regressions.append(nodeid)
                lines.append(self.regression_message(nodeid, c, c.final).replace(
                    "specdec:", f"specdec: {nodeid}: after the whole session's family was known,", 1))
        if self.late_regressions:
            lines.insert(0, f"specdec: {len(self.late_regressions)} test(s) passed at their end but regressed once "
                            "every p-value of the session was known (Benjamini-Hochberg/Holm need all of them):")
        if self.settings.update_baselines and self._store is not None:
            for nodeid, record in checked:
                c = record.baseline
                assert c is not None
                valid = record.result is not None and any(r.valid for r in record.result.reference_runs)
                if not valid or record.outcome != "passed":
                    why = "no valid runs" if not valid else f"the test {record.outcome}"
                    lines.append(f"specdec: not writing {_rel(c.path, self.rootpath)}: {why}")
                    continue
                changed = ", ".join(f"{v.metric} {v.verdict}" for v in c.shown() if v.verdict in ("regressed", "improved"))
                self.store.queue(Pending(nodeid, c.path, c.comparability, c.under_test, c.entry, changed))
            lines += self.store.flush().lines(self.store.root)
        return lines

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

    def record_failure(self, nodeid: str, message: str) -> list[tuple[str, str]]:
        """A failed test: keep its failure text and its servers' log tails in the results (the HTML
        report shows them); returns the (title, tail) sections for the terminal report."""
        tails = self.log_tails(nodeid)
        record = self.records.get(nodeid)
        if record is None:
            return tails
        if record.error is None and message:
            record.error = message if len(message) <= 6000 else "…" + message[-6000:]
        by_key = self._pool.servers if self._pool else {}
        seen = {(e["arm"], e["server"]) for e in record.server_logs}
        for arm, key in record.servers.items():
            if key in by_key and (arm, key) not in seen:
                record.server_logs.append({"arm": arm, "server": key, "path": str(by_key[key].log_path),
                                           "tail": by_key[key].log_tail()})
        return tails

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
            "commit": _commit_info(),
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
            "price": self.price(),
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
            if isinstance(raw, bool) or not isinstance(raw, (int, float)) or raw <= 0:
                raise ConfigError(f"profile {self.profile.path}: price_per_hour_usd must be a number > 0 "
                                  f"(USD per GPU hour), got {raw!r}")
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


def _f(x: float | None, spec: str = ".1f") -> str:
    return "—" if x is None else format(x, spec)
