"""Command-line options and ini values: one group, `--specdec-*` (plus the users' `--gpu`).

Each is declared once, as a row of `OPTIONS`: `addoption` registers the rows and `Settings.from_config` reads
them. Values stay plain strings/ints on `config.option` so pytest-xdist can serialise them; `Settings`
is the one frozen, validated view the rest of the plugin reads.
"""

from __future__ import annotations

import argparse
import builtins
import os
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from typing import Any, Literal

import pytest

from pytest_specdec.option_values import (
    UpdateBaselines,
    absolute_or_none,
    alpha_value,
    as_bool,
    as_is,
    base_draft_models,
    dataset_path,
    dataset_spec,
    draft_models,
    endpoint_url,
    extra_path,
    gpu_list,
    host_address,
    ini_gate,
    ini_keep_sessions,
    ini_threshold_items,
    non_negative_float,
    path_or_none,
    positive_float,
    positive_int,
    renamed,
    rooted,
    rooted_or_none,
    strings,
    threshold_item,
)

#: The types pytest's `Parser.addini` takes by name (its `_IniTypeTag`).
IniType = Literal["string", "paths", "pathlist", "args", "linelist", "bool", "int", "float"]


@dataclass(frozen=True)
class Option:
    """One declaration: a command-line flag, an ini value, or a flag with an ini twin, and the `Settings`
    field it fills (by default the flag's or ini value's name without `specdec_`: `--specdec-runs` -> `runs`).

    The flag's value lands on `config.option` under argparse's dest (`--specdec-runs` -> `specdec_runs`).
    An ini twin is read when its flag was not given (the command line wins); it is a bool, false by default.
    """

    flag: str | None = None  # None: an ini value only
    _: KW_ONLY
    setting: str = ""  # the Settings field, when it is not the name without `specdec_`
    ini: str | None = None  # the ini value: alone, or the flag's twin
    ini_type: IniType | None = None  # an ini value's type
    metavar: str | None = None
    type: Callable[[str], Any] | None = None
    action: str | builtins.type[argparse.Action] | None = None
    nargs: str | None = None
    choices: tuple[str, ...] | None = None
    default: Any = None  # the flag's default, or an ini value's
    help: str
    shown_default: str = "%(default)r"  # the help's last words, "Default: <this>" ("": none); argparse's repr
    read: Callable[[Any, pytest.Config], Any] = as_is  # the option's (or ini's) value -> the setting
    #: the flag's former spelling, still accepted for one release with a `SpecDecDeprecationWarning`
    old: str | None = None

    def __post_init__(self) -> None:
        if self.flag is None and self.ini is None:
            raise ValueError(f"option {self.setting!r}: neither a flag nor an ini value")
        if not self.setting:
            name = self.dest if self.flag is not None else str(self.ini)
            object.__setattr__(self, "setting", name.removeprefix("specdec_"))

    @property
    def dest(self) -> str:
        assert self.flag is not None
        return self.flag.lstrip("-").replace("-", "_")

    def register(self, parser: pytest.Parser, group: pytest.OptionGroup) -> None:
        text = f"{self.help} Default: {self.shown_default}" if self.shown_default else self.help
        if self.flag is None:
            parser.addini(str(self.ini), type=self.ini_type, default=self.default, help=text)
            return
        given = {"metavar": self.metavar, "type": self.type, "action": self.action, "nargs": self.nargs,
                 "choices": self.choices}
        group.addoption(self.flag, **{k: v for k, v in given.items() if v is not None}, default=self.default,
                        help=text)
        if self.old is not None:
            group.addoption(self.old, **{k: v for k, v in given.items() if v is not None and k != "action"},
                            action=renamed(self.flag, self.dest), default=None,
                            help=f"deprecated spelling of {self.flag}, removed in the next release.")
        if self.ini is not None:
            parser.addini(self.ini, type="bool", default=False, help=f"as {self.flag}. Default: false")

    def value(self, config: pytest.Config) -> Any:
        """This option's setting: the flag's value, else (not given) its ini value."""
        raw = getattr(config.option, self.dest) if self.flag is not None else None
        if raw is None and self.ini is not None:
            raw = config.getini(self.ini)
        return self.read(raw, config)


def _fail_flag(name: str, what: str) -> Option:
    """An opt-in failure: a flag with an ini twin, saying what it makes fail."""
    ini = "specdec_" + name.replace("-", "_")
    return Option(f"--specdec-{name}", ini=ini, action="store_true", help=f"{what}. Ini: {ini}", shown_default="",
                  read=as_bool)


#: Every option and ini value of the plugin, in `pytest --help` order.
OPTIONS: tuple[Option, ...] = (
    Option("--gpu", metavar="NAME", default="auto",
           help="hardware profile: cpu, gpu-zoo, h100, h200, a100, l40s or h100x8-70b (a 70B target at TP 4 on "
                "8 H100s). A GPU profile stops unless nvidia-smi lists "
                "only its GPU class (e.g. h100 = H100 SXM; not PCIe); gpu-zoo serves the zoo (no download) on any one "
                "class of NVIDIA GPU, keyed by the class nvidia-smi lists; auto picks the profile from nvidia-smi "
                "(never gpu-zoo or h100x8-70b), cpu without GPUs. --specdec-dry-run skips the check."),
    Option("--specdec-profile", setting="profile_path", metavar="PATH",
           help="a profile TOML file of your own instead of the built-in one named by --gpu."),
    Option("--specdec-runs", metavar="N", type=positive_int, shown_default="the profile's (cpu: 4)",
           help="interleaved reference/spec run pairs per test; above the profile's [verdicts] max_runs it raises "
                "max_runs to N."),
    Option("--specdec-dry-run", action="store_true", default=False,
           help="print every server command and the test matrix; start nothing."),
    Option("--specdec-endpoint", metavar="URL", type=endpoint_url,
           help="measure a spec server someone else started (needs --specdec-reference-endpoint)."),
    Option("--specdec-reference-endpoint", metavar="URL", type=endpoint_url,
           help="the matching no-speculation server for --specdec-endpoint."),
    Option("--specdec-api-key-env", metavar="VAR", default="OPENAI_API_KEY",
           help="environment variable holding the endpoints' API key (never printed or stored)."),
    Option("--specdec-json", setting="json_path", metavar="PATH", read=path_or_none,
           help="also write the JSON results here (they always go under reports/)."),
    Option("--specdec-reports-dir", setting="reports_dir", metavar="DIR", default="reports", read=rooted,
           old="--specdec-reports",
           help="directory for JSON results and server logs."),
    Option("--specdec-max-servers", metavar="N", type=positive_int, default=2,
           help="vLLM servers alive at once; the least recently used one is stopped first."),
    Option("--specdec-host", metavar="ADDR", type=host_address, default="127.0.0.1",
           help="address the vLLM servers the plugin starts bind to (vLLM's own default is 0.0.0.0: every "
                "interface); the client connects there too."),
    Option("--specdec-block-runs", metavar="N", type=positive_int,
           help="when the reference and spec servers cannot be alive at once (--specdec-max-servers 1 or the "
                "profile's [placement] co_resident = false), alternate the arms in blocks of N runs (ABBA).",
           shown_default="half the runs, rounded up"),
    Option("--specdec-api", metavar="API", choices=("chat", "completions"), default="chat",
           help="endpoint for tests whose marker sets no api=: chat (the model's chat template, as EAGLE heads "
                "are trained) or completions (chat prompts rendered with the target's chat template)."),
    Option("--specdec-request-rate", metavar="RATE", type=positive_float,
           help="open loop for tests whose marker sets no request_rate=: seeded Poisson arrivals at RATE "
                "requests/s, still capped at the test's concurrency.", shown_default="closed loop"),
    Option("--specdec-startup-timeout", setting="startup_timeout_s", metavar="SECONDS", type=positive_float,
           default=900.0, help="how long a vLLM server may take to become ready."),
    Option("--specdec-settle-timeout", setting="settle_timeout_s", metavar="SECONDS", type=non_negative_float,
           default=3.0, old="--specdec-quiet-timeout",
           help="before each run, wait up to SECONDS for every server this session started to go idle: CPU at "
                "rest and no request running or waiting (vLLM's processes busy-wait for 1 s after their last step "
                "and would share the cores with the run); in endpoint mode for the processes behind loopback "
                "endpoints, else a fixed 1.2 s from the previous run's end; 0 skips the wait."),
    Option("--specdec-hung-timeout", setting="hung_timeout_s", metavar="SECONDS", type=positive_float,
           old="--specdec-idle-timeout",
           help="a server that sends nothing on a request for SECONDS is hung: the request fails, its run is "
                "invalid, and a server this session started is restarted once.",
           shown_default="the profile's [validity] hung_timeout_s, else 60"),
    Option("--specdec-served-model", metavar="NAME",
           help="endpoint mode: the model name the endpoints serve (vLLM's --served-model-name); a server "
                "listing another model is an error, so its figures are never recorded as the target's.",
           shown_default="the profile's target model"),
    Option("--specdec-baselines", setting="baselines_dir", metavar="DIR", default="baselines", read=rooted,
           help="root of the stored baselines (<DIR>/<profile>/<suite module>/<test id>.json)."),
    Option("--update-baselines", metavar="MODE", nargs="?", action=UpdateBaselines,
           help="write baselines at session end: the bare flag adds tonight's session to every baseline "
                "(accepting any change); =missing only creates missing ones. Never written without it."),
    Option("--specdec-draft", setting="drafts", metavar="METHOD=MODEL", action="append", default=[],
           read=draft_models,
           help="use MODEL (a path, hub id or zoo:NAME) as METHOD's draft/head instead of the profile's, under "
                "the same test ids, e.g. eagle3=/heads/new (repeatable).", shown_default="the profile's"),
    Option("--specdec-base-draft", setting="base_drafts", metavar="METHOD=MODEL", action="append", default=[],
           read=base_draft_models,
           help="A/B in one session: MODEL is METHOD's draft/head of the base; the candidate is the profile's (or "
                "--specdec-draft's). Each test of METHOD runs the reference, the base and the candidate interleaved "
                "and is judged candidate vs base, pair by pair; stored baselines are neither read nor written "
                "(docs/gate.md, A/B in one session).", shown_default="no A/B"),
    Option("--specdec-base-python", setting="base_python", metavar="PATH", read=absolute_or_none,
           help="A/B in one session: PATH is the interpreter of another install whose vLLM is the base (e.g. "
                ".venv-base-0.31.0/bin/python from `scripts/setup.sh --base 0.31.0` in a checkout of pytest-specdec); "
                "the candidate is this "
                "environment's vLLM. Each install gets its own reference and spec arms, interleaved; combines with "
                "--specdec-base-draft.", shown_default="no A/B"),
    Option("--specdec-base-engine", setting="base_engine", metavar="NAME",
           help="A/B in one session on this install: NAME is the engine mode of the base (the profile's "
                "[engines.NAME], or default); each test in another mode (specdec(engine=...)) is judged against its "
                "method in mode NAME, each side with its own reference; tests in mode NAME are skipped "
                "(docs/suites.md, Engine modes).", shown_default="no A/B"),
    Option("--specdec-strict", action="store_true", default=False,
           help="fail (not just warn) when a baseline was measured under different comparability keys."),
    Option("--specdec-max-runs", metavar="N", type=positive_int,
           help="when a verdict is inconclusive, add interleaved run pairs two at a time up to N per arm "
                "(alpha split over the looks); not below the runs per test.",
           shown_default="the profile's [verdicts] max_runs (cpu: 4, as many as its runs), else no extra runs"),
    Option("--specdec-alpha", metavar="ALPHA", type=alpha_value, default=0.05,
           help="one-sided significance level of the verdicts (the CIs are 1-2*ALPHA)."),
    Option("--specdec-multiplicity", setting="multiplicity", metavar="METHOD", choices=("bh", "holm"), default="bh",
           old="--specdec-fdr",
           help="multiplicity control within each family (gated, shown) of the session's metric tests: bh "
                "(Benjamini-Hochberg: the false discovery rate) or holm (the family-wise error rate)."),
    _fail_flag("fail-inconclusive",
               "fail a test whose gated metric (speedup, acceptance, P95 E2E ratio, or what `gate` adds) stays "
               "inconclusive after its last look (by default it passes with a warning), or whose gated drift "
               "within the session is inconclusive"),
    _fail_flag("fail-machine",
               "fail the session when the machine factor (tonight's reference speed against the baseline nights) "
               "is beyond the reference_tok_s threshold; by default it warns"),
    Option("--specdec-threshold", setting="cli_thresholds", metavar="METRIC=VALUE", action="append",
           type=threshold_item, default=[], read=strings,
           help="practical threshold of a metric (%% for rates and latencies, points for acceptance), or of a "
                "kind (rate, acceptance, latency); repeatable; overrides ini and profile."),
    Option("--specdec-dataset", metavar="[FORMAT:]PATH[#CATEGORY,...]", type=dataset_spec,
           default="builtin", read=dataset_path,
           help="prompts of every specdec test whose marker names no dataset= (a marker's dataset= wins): builtin, "
                "or a prompts JSONL, ShareGPT JSON, spec_bench/MT-Bench JSONL or InstructCoder JSON(L) file, format "
                "detected from the content unless prefixed (prompts:, sharegpt:, spec_bench:, instructcoder:); "
                "#CATEGORY keeps only those categories."),
    Option("--specdec-gpus", metavar="LIST", type=gpu_list,
           help="GPU ids the servers may lease, e.g. 0,1,2,3 (GPU profiles; each server gets its TP size in GPUs "
                "as CUDA_VISIBLE_DEVICES).", shown_default="CUDA_VISIBLE_DEVICES, else every GPU nvidia-smi lists"),
    Option("--specdec-lease-dir", metavar="DIR", default=".pytest_cache/specdec-gpus",
           read=rooted,
           help="where the GPU lease file and its lock live; share it between every session on a host "
                "(e.g. /var/tmp/specdec-gpus) so they never measure on the same GPU."),
    Option("--specdec-gpu-wait", setting="gpu_wait_s", metavar="SECONDS", type=positive_float, default=3600.0,
           help="how long a server waits for GPUs other workers hold before failing with who holds them."),
    Option("--specdec-pin-cpus", action="store_true", default=False,
           help="pin each vLLM server to the CPUs local to its leased GPUs (their NUMA node, as in "
                "`nvidia-smi topo -m`)."),
    Option("--specdec-report-html", setting="report_path", metavar="PATH", read=rooted_or_none,
           old="--specdec-report",
           help="write the HTML report here instead of reports/specdec-<UTC stamp>.html and reports/latest.html."),
    Option("--specdec-gpu-hourly-usd", metavar="USD", type=positive_float,
           help="price of one GPU hour (the machine hour on cpu), for the report's cost per 1M output tokens; "
                "overrides the profile's price_per_hour_usd.", shown_default="the profile's, else no cost"),
    Option("--specdec-benchmark-json", metavar="PATH", read=extra_path("pytest_benchmark", "--specdec-benchmark-json"),
           help="also write the runs in pytest-benchmark's JSON format (seconds per output token, TPOT, E2E; "
                "lower is better) for `pytest-benchmark compare`; needs pytest-benchmark (the `benchmark` extra)."),
    Option("--specdec-calibrate", action="store_true", default=False,
           help="this session is one of this machine's calibration sessions: at its end, every such session of the "
                "profile and machine in the reports directory (this one included) measures the host's noise, and "
                "from the second on the record is written to baselines/<profile>/<hardware>/host.calibration "
                "(docs/gate.md, Calibration)."),
    Option("--specdec-save-outputs", action="store_true", default=False,
           help="also keep every request's output text, per test, arm and run, in "
                "reports/specdec-<UTC stamp>.outputs.json beside the results (which name it as outputs_file)."),
    Option(ini="specdec_keep_sessions", ini_type="string", default="5", read=ini_keep_sessions,
           help="measurement sessions (server starts) --update-baselines keeps per baseline file.", shown_default="5"),
    Option(ini="specdec_gate", ini_type="linelist", default=[], read=ini_gate,
           help="metrics added to the gated family of every test (e.g. output_tok_s, tpot_p95_ms); the gated "
                "family fails tests, the others are judged and shown.",
           shown_default="none (speedup, acceptance_rate and e2e_p95_ratio are always gated)"),
    Option(ini="specdec_redact", ini_type="linelist", default=[], read=lambda v, c: tuple(strings(v, c)),
           help="more names whose values are secrets, one per line: server flags (--my-token) or environment "
                "variables (MY_TOKEN); masked in logs, results, the report, the dry run and baselines.",
           shown_default="--hf-token, --api-key and names with TOKEN, KEY, SECRET, PASSWORD or CREDENTIAL"),
    Option(ini="specdec_thresholds", setting="ini_thresholds", ini_type="linelist", default=[],
           read=ini_threshold_items,
           help="practical thresholds, one METRIC=VALUE per line (see --specdec-threshold).", shown_default="none"),
)


def addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("specdec", "speculative decoding regression checks (pytest-specdec)")
    for option in OPTIONS:
        option.register(parser, group)


@dataclass(frozen=True)
class Settings:
    """The validated options of one pytest session."""

    gpu: str
    profile_path: str | None
    runs: int | None
    dry_run: bool
    endpoint: str | None
    reference_endpoint: str | None
    api_key_env: str
    json_path: Path | None
    reports_dir: Path
    max_servers: int
    startup_timeout_s: float
    settle_timeout_s: float = 3.0
    hung_timeout_s: float | None = None
    served_model: str | None = None
    baselines_dir: Path = Path("baselines")
    update_baselines: str | None = None
    strict: bool = False
    max_runs: int | None = None
    alpha: float = 0.05
    multiplicity: str = "bh"
    cli_thresholds: tuple[str, ...] = ()
    ini_thresholds: tuple[str, ...] = ()
    keep_sessions: int = 5
    drafts: tuple[tuple[str, str], ...] = ()
    base_drafts: tuple[tuple[str, str], ...] = ()  # --specdec-base-draft: an A/B session when given
    base_python: str | None = None  # --specdec-base-python: an A/B session on another install's vLLM
    base_engine: str | None = None  # --specdec-base-engine: an A/B session between two engine modes
    block_runs: int | None = None
    api: str = "chat"
    request_rate: float | None = None
    dataset: str = "builtin"  # --specdec-dataset, a relative path made absolute from the invocation dir
    gpus: str | None = None  # --specdec-gpus as given; parsed when a GPU server is first started
    lease_dir: Path = Path(".pytest_cache/specdec-gpus")
    gpu_wait_s: float = 3600.0
    pin_cpus: bool = False
    report_path: Path | None = None
    gpu_hourly_usd: float | None = None
    benchmark_json: Path | None = None
    save_outputs: bool = False  # --specdec-save-outputs: every request's output text in a side file
    calibrate: bool = False  # --specdec-calibrate: one of this machine's calibration sessions
    host: str = "127.0.0.1"  # --specdec-host: where the servers we start bind
    fail_inconclusive: bool = False
    fail_machine: bool = False
    gate: tuple[str, ...] = ()  # ini specdec_gate: metrics added to the gated family
    redact: tuple[str, ...] = ()  # ini specdec_redact: more secret flag and environment names

    @property
    def api_key(self) -> str | None:
        """Read on use, never stored in results."""
        return os.environ.get(self.api_key_env) or None

    @classmethod
    def from_config(cls, config: pytest.Config) -> Settings:
        opt: Any = config.option
        if bool(opt.specdec_endpoint) != bool(opt.specdec_reference_endpoint):
            raise pytest.UsageError(
                "--specdec-endpoint and --specdec-reference-endpoint go together: the speedup needs "
                "the no-speculation reference server as well"
            )
        settings = cls(**{option.setting: option.value(config) for option in OPTIONS})
        ab = settings.ab_flag
        if ab and settings.update_baselines:
            raise pytest.UsageError(
                f"--update-baselines with {ab}: an A/B session judges the candidate against the base "
                "measured beside it, not against stored nights, so it has nothing to store as a night; run the "
                f"baselines update without {ab}")
        if ab and settings.calibrate:
            raise pytest.UsageError(
                f"--specdec-calibrate with {ab}: a calibration measures how stored nights move, and an A/B session "
                "judges against the base beside it, not against nights; calibrate with nightly sessions")
        if ab and settings.endpoint:
            raise pytest.UsageError(
                f"{ab} with --specdec-endpoint: an A/B session starts the base's and the candidate's "
                "servers itself, and two endpoints serve only one spec config; drop one of the two")
        return settings

    @property
    def ab_flag(self) -> str | None:
        """The flags that make this an A/B session, as messages name them (None: a nightly session)."""
        flags = [f for f, on in (("--specdec-base-draft", self.base_drafts),
                                 ("--specdec-base-python", self.base_python),
                                 ("--specdec-base-engine", self.base_engine))
                 if on]
        return " and ".join(flags) or None

    @property
    def ab_servers(self) -> int:
        """The servers one test keeps alive: reference and spec, a base spec in an A/B session, and a base
        reference when the base is another install or another engine mode."""
        return 2 + bool(self.ab_flag) + bool(self.base_python or self.base_engine)
