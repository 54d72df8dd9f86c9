"""The session's results: one record per specdec test, the environment and servers they ran on, and the
files written from them (the JSON under reports/, then the HTML report and the pytest-benchmark export
from the same data).

Files are written to a temporary name and renamed, so a reader (CI, the next session) never sees half a file.
"""

from __future__ import annotations

import copy
import datetime as dt
import importlib.metadata as md
import json
import math
import os
import platform
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_specdec import __version__, redact
from pytest_specdec.files import write_atomic
from pytest_specdec.formats import RESULTS_SCHEMA
from pytest_specdec.gate.baselines import crossover_value_entry
from pytest_specdec.gate.kinds import INCONCLUSIVE, REGRESSED
from pytest_specdec.measure.probe import state_entry
from pytest_specdec.output.commit import commit_info
from pytest_specdec.output.schema import (
    baseline_writes_entry,
    calibration_used_entry,
    chunking_entry,
    drift_entry,
    endpoint_entry,
    hardware_entry,
    install_entry,
    machine_factor_entry,
    night_prior_entry,
    night_variance_entry,
    quiet_entry,
    rate_point_entry,
    render_results,
    run_acceptance_entry,
    run_metrics_entry,
    session_time_entry,
    split_entry,
    state_summary_entry,
    state_tolerance_entry,
    summary_entry,
    thresholds_entry,
)

if TYPE_CHECKING:
    from pytest_specdec.gate.ab_session import ABJudgement
    from pytest_specdec.gate.check import Judgement
    from pytest_specdec.gate.crossover_gate import SweepOutcome
    from pytest_specdec.gate.drift import Drift
    from pytest_specdec.gate.judge import Judge
    from pytest_specdec.gate.machine import MachineFactor, StateSummary
    from pytest_specdec.gate.stats import Verdict
    from pytest_specdec.gate.store import BaselineWrites
    from pytest_specdec.gate.variance import NightVariance
    from pytest_specdec.measure.datasets import Dataset
    from pytest_specdec.measure.runner import CaseResult, RunRecord
    from pytest_specdec.measure.saturation import RatePoint
    from pytest_specdec.measure.summary import Summary
    from pytest_specdec.output.schema import Results, TestEntry
    from pytest_specdec.output.timing import SessionTime
    from pytest_specdec.profiles import Profile
    from pytest_specdec.servers.endpoints import EndpointFacts
    from pytest_specdec.servers.process import VllmServer



@dataclass
class TestRecord:
    """One specdec test's entry in the JSON results."""

    nodeid: str
    params: dict[str, Any]  # the test's case, as its id reads
    result: CaseResult | None = None
    outcome: str = "pending"  # pytest's word: passed, failed or skipped
    when: str | None = None  # the phase that decided it: setup, call or teardown
    servers: dict[str, str] = field(default_factory=dict)  # arm -> server spec key
    error: str | None = None
    baseline: Judgement | None = None
    #: tails of the servers' logs when the test failed, so the HTML report can show them the morning after
    server_logs: list[dict[str, str]] = field(default_factory=list)
    #: the temperature > 0 distribution check (specdec.distribution_check), when the test ran it
    distribution: dict[str, Any] | None = None
    #: every sampling parameter the requests carried (Sampling.to_request)
    sampling: dict[str, Any] | None = None
    #: an A/B session's comparison of the candidate with the base (`gate.ab_session`), None outside one
    ab: ABJudgement | None = None
    #: the test's other parametrize values, as recorded (`gate.crossover_gate.recorded`): a sweep is told by them
    callspec: dict[str, Any] = field(default_factory=dict)
    #: a rate sweep's point (`rate_point_entry`): the rate found at run time, and from what
    rate_sweep: RatePoint | None = None
    #: its runs' drift within the session, early half against late half on one server (`gate.drift`); None
    #: without a spec arm
    drift: Drift | None = None

    def failed(self, message: str, servers: dict[str, VllmServer]) -> list[tuple[str, str]]:
        """Keep the failure text and the test's servers' log tails (the HTML report shows them the morning
        after); returns the (title, tail) sections for the terminal report."""
        if self.error is None and message:
            self.error = clipped(message)
        seen = {(e["arm"], e["server"]) for e in self.server_logs}
        sections = []
        for arm, key in self.servers.items():
            if key not in servers:
                continue
            server = servers[key]
            tail = server.log_tail()  # read once: the terminal section and the results share it
            sections.append((f"vLLM {arm} server log (tail, {server.log_path})", tail))
            if (arm, key) not in seen:
                self.server_logs.append({"arm": arm, "server": key, "path": str(server.log_path), "tail": tail})
        return sections

    def output_match_entry(self) -> dict[str, Any] | None:
        """The test's `output_match` in the results: at temperature 0, spec vs reference outputs against the
        reference-vs-reference control, with the prompts whose outputs differed
        (`measure.outputs.greedy_output_match`): the evidence a failed lossless check needs the morning
        after, when the texts themselves are gone. None above temperature 0 (outputs differ by design there)
        and without a spec arm."""
        if self.result is None or not self.result.runs:
            return None
        if (self.sampling or {}).get("temperature", self.params.get("temperature")) != 0:
            return None
        from pytest_specdec.measure.outputs import greedy_output_match

        return greedy_output_match(self.result)

    def to_dict(self, usd_per_hour: float | None = None) -> dict[str, Any]:
        """The test's entry in the results; ``usd_per_hour`` (the session's `price`) gives its cost per 1M output
        tokens, each arm at its own throughput (`measure.explain.cost_per_million`, which the report reads too)."""
        out: dict[str, Any] = {
            "nodeid": self.nodeid,
            "params": self.params,
            **({"callspec": self.callspec} if self.callspec else {}),
            **({"rate_sweep": rate_point_entry(self.rate_sweep)} if self.rate_sweep is not None else {}),
            **({"sampling": self.sampling} if self.sampling is not None else {}),
            "outcome": self.outcome,
            "when": self.when,
            "servers": self.servers,
        }
        if self.result is not None:
            out.update(case_entry(self.result))
            match = self.output_match_entry()
            if match is not None:
                out["output_match"] = match
            out["cost_per_1m_output_usd"] = cost_entry(self.result.summary, usd_per_hour)
            if self.drift is not None:
                out["drift"] = drift_entry(self.drift)
        if self.error:
            out["error"] = self.error
        if self.server_logs:
            out["server_logs"] = self.server_logs
        if self.distribution is not None:
            out["distribution"] = self.distribution
        if self.ab is not None:
            out["ab"] = ab_entry(self.ab, self.result)
        if self.baseline is not None:
            from pytest_specdec.output.wording import attribution

            shown = self.baseline.shown()
            split = self.baseline.split()
            raw = {v.metric: v for v in self.baseline.raw}
            out["verdicts"] = {v.metric: {**verdict_entry(v), "unadjusted": unadjusted_entry(raw.get(v.metric))}
                               for v in shown}
            out["baseline"] = {**baseline_entry(self.baseline),
                               "attribution": attribution(shown, split) if shown else None,
                               "split": None if split is None else split_entry(split)}
        return out


#: Characters of a failure message the results keep.
ERROR_CHARS = 6000


def clipped(message: str, limit: int = ERROR_CHARS) -> str:
    """A failure message cut to about ``limit`` characters: its start up to the first log tail (what failed, the
    exception the engine raised, the command; at most half the budget) and its end, so a long log tail never
    pushes out the cause quoted above it."""
    if len(message) <= limit:
        return message
    cut = message.find("\n--- last ")
    head = message[:cut + 1 if 0 <= cut < limit // 2 else limit // 2]
    return head + "…" + message[-(limit - len(head)):]


def cost_entry(summary: Summary | None, usd_per_hour: float | None) -> dict[str, float | None] | None:
    """A test's cost per 1M output tokens, US dollars, each arm at its own throughput; None without a price."""
    if not usd_per_hour:
        return None
    from pytest_specdec.measure.explain import cost_per_million

    return {"spec": cost_per_million(None if summary is None else summary.output_tok_s, usd_per_hour),
            "reference": cost_per_million(None if summary is None else summary.reference_tok_s, usd_per_hour)}


def ab_entry(c: ABJudgement, result: CaseResult | None) -> dict[str, Any]:
    """A test's `ab` section: what was compared, the verdicts (`verdict_entry`, as the nightly's), what a
    regression points at, each side's install and what differs between them (versions, engine configs), how it was
    judged (its looks, gated metrics and level), and every run of the three or four arms in the results' run shape,
    each with its arm's name (the candidate's are the test's own `runs`, there named `spec`)."""
    from pytest_specdec.output.ab_wording import ab_attribution

    cause = c.cause()
    runs = [] if result is None else [*(run_entry(r) for r in result.reference_runs),
                                      *(run_entry(r) for r in result.base_reference_runs),
                                      *(run_entry(r) for r in result.base_runs),
                                      *({**run_entry(r), "arm": "candidate"} for r in result.runs)]
    plan = c.plan
    installs = {name: install_entry(i) for name, i in (plan.installs or {}).items()}
    return {"method": plan.method,
            "base": {"draft": plan.base_draft, "server": plan.servers.get("base"), "install": installs.get("base"),
                     "reference_server": plan.servers.get("base_reference")},
            "candidate": {"draft": plan.candidate_draft, "server": plan.servers.get("spec"),
                          "install": installs.get("candidate")},
            **({"engines": {"base": plan.engines[0], "candidate": plan.engines[1]}} if plan.engines else {}),
            "changed": {k: list(v) for k, v in plan.changed.items()},
            "verdicts": {v.metric: verdict_entry(v) for v in c.shown()}, REGRESSED: [v.metric for v in c.regressed()],
            "attribution": cause, "attribution_text": ab_attribution(c),
            "split": None if c.split is None else split_entry(c.split),
            "adjusted": "session" if c.final is not None else "test-end",
            "thresholds": thresholds_entry(plan.thresholds),
            "checked": plan.checked, "gate": list(plan.metrics), "looks": c.looks,
            "max_looks": plan.max_looks, "planned_looks": list(plan.looks), "unspent_runs": c.unspent,
            "pairs": c.looks[-1] if c.looks else 0, "max_pairs": plan.looks[-1] if plan.looks else 0,
            "stop": c.stop, "stop_reason": c.stop_reason, "alpha": plan.alpha,
            "ci_level": 1 - 2 * plan.alpha / max(1, plan.max_looks), "runs": runs}


def baseline_entry(j: Judgement) -> dict[str, Any]:
    """A test's `baseline` section: how it met its stored baseline and how it was judged (its looks, gated
    metrics, level, the machine deviation, what changed under test)."""
    from pytest_specdec.gate.verdicts import gated_with

    plan, shown = j.plan, j.shown()
    sessions = len(plan.baseline["sessions"]) if plan.baseline else 0
    return {
        "path": str(plan.path), "status": plan.status, "checked": plan.checked, "sessions": sessions,
        "not_comparable_fields": {k: [a, b] for k, (a, b) in plan.differs.items()},
        "looks": j.looks, "max_looks": plan.max_looks, "unspent_runs": j.unspent,
        "stop_reason": j.stop_reason, "gate": list(plan.gate),
        "inconclusive_gated": [v.metric for v in gated_with(shown, INCONCLUSIVE)],
        "machine_deviation": j.deviation,
        "alpha": plan.alpha, "ci_level": 1 - 2 * plan.alpha / max(1, plan.max_looks),
        "adjusted": "session" if j.final is not None else "test-end",
        "under_test": plan.under_test,
        "under_test_diff": j.under_test_diff(),
        "comparability": plan.comparability,
        "thresholds": None if plan.thresholds is None else thresholds_entry(plan.thresholds),
        **({"error": plan.error} if plan.error else {}),
        # other machines whose nights judged its acceptance (this machine has no baseline of the test)
        **({"machines": list(plan.machines)} if plan.machines else {}),
    }


def gate_settings(judge: Judge) -> dict[str, Any]:
    """The results' ``gate.settings``: how this session judged, what `pytest-specdec compare` needs to judge it
    again (level, multiplicity rule, night sd floor and prior, calibration, state tolerance, thresholds, machine)."""
    cfg, options = judge.cfg, judge.cfg.options
    return {"alpha": options.alpha, "multiplicity": options.multiplicity, "min_night_sd": cfg.profile.min_night_sd,
            "night_prior": night_prior_entry(judge.night_prior),
            **({"calibration": calibration_used_entry(used)} if (used := judge.calibration_used) is not None else {}),
            "machine_state_tolerance": state_tolerance_entry(judge.state_tolerance),
            "thresholds": thresholds_entry(judge.thresholds()), "hardware": hardware_entry(judge.hardware),
            **({"calibration_session": True} if options.calibrate else {})}


def verdict_entry(v: Verdict) -> dict[str, Any]:
    """One verdict's entry: its figures, how it was decided and what it can catch."""
    return {
        "verdict": v.verdict, "baseline": v.baseline, "now": v.now, "delta": v.delta,
        "ci": None if v.ci_low is None else [v.ci_low, v.ci_high], "p": v.p,
        "n_baseline": v.n_baseline, "n_now": v.n_now, "per": v.per, "delta_unit": v.unit,
        "threshold": v.threshold, "method": v.method, "note": v.note, "family": v.family,
        "mde": v.mde if v.mde is not None and math.isfinite(v.mde) else None,  # null beside an se: unbounded
        "se": None if v.var_fixed is None or v.var_run is None or not v.n_now
        else math.sqrt(v.var_fixed + v.var_run / v.n_now), "df": v.df,
    }


def unadjusted_entry(v: Verdict | None) -> dict[str, Any] | None:
    """A verdict before the family's adjustment (its word, p and note): what `pytest-specdec merge` adjusts again
    over several sessions' verdicts together, since an adjusted p cannot be undone. None: no raw verdict."""
    return None if v is None else {"verdict": v.verdict, "p": v.p, "note": v.note}


def run_entry(r: RunRecord) -> dict[str, Any]:
    """A run in the results file: every field of the run a baseline stores (`record.ArmRun`, which reads this
    back), with the same names and values, and what only the results keep beside them."""
    per_pos = r.record.accepted_per_pos
    return {
        "arm": r.arm, "index": r.index, "valid": r.valid, "invalid_reasons": list(r.invalid),
        "cache_salt": r.cache_salt, **run_metrics_entry(r.metrics), "hd_p95_ms": dict(r.hd_p95_ms),
        "accepted_per_pos": None if per_pos is None else list(per_pos),
        "settle": None if r.settle is None else quiet_entry(r.settle),
        **({"prompt_ids": list(r.prompt_ids)} if r.prompt_ids is not None else {}),
        "latency_untrusted": list(r.untrusted),
        "chunking": None if r.chunking is None else chunking_entry(r.chunking),
        **({"neighbour_cores": dict(r.neighbours)} if r.neighbours is not None else {}),
        **({"arrivals": dict(r.arrivals)} if r.arrivals is not None else {}),
        "acceptance_source": r.acceptance_source,
        "per_request_acceptance": None if r.acceptance is None else run_acceptance_entry(r.acceptance),
        **({"block": r.block} if r.block is not None else {}),
    }


def case_entry(result: CaseResult) -> dict[str, Any]:
    """What a test measured, in its entry: both arms' runs, the pairs' speedups, the machine state, the summary and
    which runs were invalid or had untrusted latency."""
    return {
        "runs": [run_entry(r) for r in result.runs],
        "reference_runs": [run_entry(r) for r in result.reference_runs],
        "speedup_per_pair": result.speedup_per_pair,
        "alternation": result.alternation,
        "machine_state": None if result.machine_state is None else {
            **state_entry(result.machine_state), "probes": [state_entry(s) for s in result.machine_states]},
        "summary": summary_entry(result.summary),
        "validity": {
            "valid": not result.invalid_runs,
            "invalid_runs": [
                {"arm": r.arm, "index": r.index, "reasons": list(r.invalid)} for r in result.invalid_runs
            ],
            "latency_untrusted_runs": [
                {"arm": r.arm, "index": r.index, "reasons": list(r.untrusted)} for r in result.untrusted_runs
            ],
        },
    }


def crossover_entry(x: SweepOutcome) -> dict[str, Any]:
    """A sweep's entry in the results' ``crossovers`` (docs/results.md): its points, crossover, verdict or error."""
    return {"sweep": x.sweep, "line": x.line, "tests": list(x.tests), "axis": x.axis,
            **({"saturation_req_s": x.saturation} if x.saturation is not None else {}),
            "points": [{x.axis: c, "n": len(v), "speedups": v} for c, v in x.points],
            "crossover": crossover_value_entry(x.crossover) if x.crossover else None,
            "verdict": verdict_entry(x.verdict) if x.verdict else None, "path": x.path, "family": x.family,
            "stored": {"started": x.stored.started, "text": x.stored.text} if x.stored and x.verdict else None,
            "note": x.note or None, "error": x.error, "failed": x.failed}


def session_results(*, started: float, profile: Profile, gpu_names: str | None, servers: dict[str, VllmServer],
                    worker: str | None, remote: Sequence[dict[str, Any]], server_starts: int,
                    datasets: dict[str, Dataset], endpoints: dict[str, EndpointFacts], gpu_hourly_usd: float | None,
                    machine: MachineFactor | None, machine_failed: bool, fail_inconclusive: bool, fail_machine: bool,
                    night_variances: dict[str, NightVariance], records: Iterable[TestRecord],
                    baseline_writes: BaselineWrites | None = None, outputs_file: str | None = None,
                    gate_settings: dict[str, Any] | None = None,
                    crossovers: list[dict[str, Any]] | None = None,
                    machine_state: StateSummary | None = None,
                    errors: list[tuple[str, str]] | None = None,
                    timing: SessionTime | None = None) -> dict[str, Any]:
    """The results document. ``servers`` are this process's; ``remote`` what each xdist worker sent
    besides its records (its servers, starts and workarounds); ``server_starts`` counts them all;
    ``baseline_writes`` is what --update-baselines wrote (None without it); ``outputs_file`` the name of
    the --specdec-save-outputs side file in the same directory; ``gate_settings`` how the gate judged
    (`gate_settings`), so that `pytest-specdec compare` can judge the file again as the session did;
    ``crossovers`` each concurrency sweep's crossover and its verdict or error (`crossover_entry`);
    ``machine_state`` the session's machine state against its stored nights (`gate.machine.StateSummary`);
    ``errors`` what failed at the session's end, (what, why): a test whose entry cannot be made joins them;
    ``timing`` where the session's wall time went (`timing.SessionTime`)."""
    hourly = price(profile, gpu_hourly_usd)
    errors = errors if errors is not None else []
    tests = test_entries(records, hourly["usd_per_hour"] if hourly else None, errors)
    return {
        "schema": RESULTS_SCHEMA,
        "started": dt.datetime.fromtimestamp(started, dt.UTC).isoformat(),
        "duration_s": round(time.time() - started, 1),
        "profile": profile.name,
        "environment": endpoint_environment(environment(profile, gpu_names, list(servers.values()),
                                                        (w for r in remote for w in r["workarounds"])), endpoints),
        "servers": merge_servers(server_entries(servers, worker), [r["servers"] for r in remote]),
        "server_starts": server_starts,
        "time": None if timing is None else session_time_entry(timing),
        "datasets": {name: d.describe() for name, d in datasets.items()},
        "endpoints": {url: endpoint_entry(facts) for url, facts in endpoints.items()},
        "price": hourly,
        "machine_factor": machine_factor_entry(machine) if machine is not None else None,
        "machine_state": None if machine_state is None else state_summary_entry(machine_state),
        "gate": {"fail_inconclusive": fail_inconclusive, "fail_machine": fail_machine, "machine_failed": machine_failed,
                 "night_variance": {k: night_variance_entry(v) for k, v in night_variances.items()},
                 **({"settings": gate_settings} if gate_settings else {})},
        "baseline_update": baseline_writes_entry(baseline_writes) if baseline_writes is not None else None,
        **({"outputs_file": outputs_file} if outputs_file else {}),
        **({"crossovers": crossovers} if crossovers is not None else {}),
        "errors": [{"what": what, "error": why} for what, why in errors],
        "tests": tests,
    }


def test_entries(records: Iterable[TestRecord], usd_per_hour: float | None, errors: list[tuple[str, str]]
                 ) -> list[dict[str, Any]]:
    """Every test's entry; one that cannot be made keeps its id, case and outcome with the reason, and joins
    ``errors``: one test's fault never loses the others' entries."""
    out = []
    for r in records:
        try:
            out.append(r.to_dict(usd_per_hour))
        except Exception as exc:  # noqa: BLE001 - this test's entry is lost, not the file
            why = f"its results entry could not be made ({type(exc).__name__}: {exc})"
            errors.append((r.nodeid, why))
            out.append({"nodeid": r.nodeid, "params": r.params, "outcome": r.outcome, "when": r.when,
                        "servers": r.servers, "error": why})
    return out


def hardware_name(profile: Profile, gpu_names: str | None) -> str:
    """What the results say the session ran on: the CPU model, or the GPUs nvidia-smi listed (the SKU);
    without that look (dry run, endpoint mode) the profile's `hardware`, marked as not checked."""
    from pytest_specdec.servers.hardware import cpu_model

    if profile.device == "cpu":
        return cpu_model()
    if gpu_names:
        return gpu_names
    return f"{profile.hardware} (profile; GPUs not checked)"


def environment(profile: Profile, gpu_names: str | None, servers: Iterable[VllmServer],
                remote_workarounds: Iterable[dict[str, Any]] = ()) -> dict[str, Any]:
    """Versions, hardware, the client's event loop, the suite's commit and the vLLM workarounds in effect.
    ``target_identity`` is the target as baselines compare it (a local model by its content hash), so two
    nights run from different checkouts of the same model stay comparable."""
    from pytest_specdec.gate.baselines import model_identity
    from pytest_specdec.measure.client import event_loop_name
    from pytest_specdec.servers.hardware import driver_version
    from pytest_specdec.vllm.cli import vllm_distribution
    from pytest_specdec.vllm.install import provenance, this_install

    dist = vllm_distribution()
    return {
        "hardware": hardware_name(profile, gpu_names),
        "device": profile.device,
        "vllm_distribution": dist,
        "vllm_version": md.version(dist) if dist else None,
        "plugin_version": __version__,
        "python": platform.python_version(),
        "client_event_loop": event_loop_name(),
        "target_model": profile.target,
        "target_identity": model_identity(profile.target, profile.raw.get("target", {}).get("revision")),
        "commit": commit_info(),
        "workarounds": workarounds(servers, remote_workarounds),
        "provenance": provenance(this_install(), driver_version() if gpu_names else None),
    }


def endpoint_environment(env: dict[str, Any], endpoints: dict[str, EndpointFacts]) -> dict[str, Any]:
    """Endpoint mode: the vLLM under test is the endpoints', as they told it (/server_info or /version), else
    unknown; this client's own vLLM and packages move to `client_vllm_version` and `client_provenance`, so a
    night's results never pass them off as what was measured. Unchanged without endpoints."""
    if not endpoints:
        return env
    from pytest_specdec.gate.conditions import UNKNOWN

    told = sorted({f.vllm_version for f in endpoints.values() if f.vllm_version})
    return {**{k: v for k, v in env.items() if k != "provenance"}, "vllm_version": ", ".join(told) or UNKNOWN,
            "vllm_distribution": None, "client_vllm_version": env.get("vllm_version"),
            "client_vllm_distribution": env.get("vllm_distribution"), "client_provenance": env.get("provenance")}


def workarounds(servers: Iterable[VllmServer], remote: Iterable[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """The vLLM workarounds in effect: these servers' (without their pids), then the workers' (xdist)."""
    local = [{k: v for k, v in w.items() if k != "pid"} for s in servers for w in s.workarounds()]
    return unique([*local, *remote])


def server_entries(servers: dict[str, VllmServer], worker: str | None) -> dict[str, dict[str, Any]]:
    """Each server this process started, by spec key: command, start-up time, engine config, placement."""
    return {
        key: {
            "method": server.spec.method,
            "command": redact.args(server.command),
            "env": redact.env(dict(server.spec.env)),
            "startup_s": server.startup_s,
            "engine_config": server.engine_config(),
            "cuda_visible_devices": server.placement_env.get("CUDA_VISIBLE_DEVICES"),
            "cpus": sorted(server.cpus) if server.cpus else None,
            "priority": server.priority,
            **({"placements": [{"worker": worker, "startup_s": server.startup_s,
                                "cuda_visible_devices": server.placement_env.get("CUDA_VISIBLE_DEVICES")}]}
               if worker else {}),
        }
        for key, server in servers.items()
    }


def merge_servers(local: dict[str, dict[str, Any]], remote: Sequence[dict[str, dict[str, Any]]]
                  ) -> dict[str, dict[str, Any]]:
    """xdist: a spec several workers started is listed once, with each placement."""
    servers = dict(local)
    for entries in remote:
        for key, info in entries.items():
            if key in servers:
                servers[key]["placements"] = [*servers[key].get("placements", []), *info["placements"]]
            else:
                servers[key] = info
    return servers


def price(profile: Profile, gpu_hourly_usd: float | None, held: int | None = None) -> dict[str, Any] | None:
    """Hourly price of one server's hardware for the report's cost per 1M output tokens:
    --specdec-gpu-hourly-usd, else the profile's `price_per_hour_usd` (per GPU), times the GPUs a server uses
    (TP x PP x DP, `Profile.server_gpus`); with ``held``, the GPUs a test holds at once (`profiles.pool.gpus_held`),
    what the dry run's cost uses."""
    per_gpu, source = gpu_hourly_usd, "--specdec-gpu-hourly-usd"
    if per_gpu is None:
        raw = profile.raw.get("price_per_hour_usd")
        if raw is None:
            return None
        per_gpu, source = float(raw), f"profile {profile.name} price_per_hour_usd"
    gpus = 1 if profile.device == "cpu" else profile.server_gpus
    return {"usd_per_hour": per_gpu * gpus, "usd_per_gpu_hour": per_gpu, "gpus": gpus, "source": source,
            **({"gpus_held": held, "usd_per_hour_held": per_gpu * held} if held is not None else {})}


def stamp(started: float) -> str:
    """The session's start as it appears in file names (UTC, to the microsecond), and this process's pid: two
    sessions sharing a reports directory never write the same name, even when they start at the same moment.
    Every file of the session (results, report, saved outputs) carries the same stamp, which pairs them."""
    t = dt.datetime.fromtimestamp(started, dt.UTC)
    return f"{t:%Y%m%dT%H%M%S}.{t:%f}Z-{os.getpid()}"


#: A test expected but in no shard of a merged night (`pytest-specdec merge --expect`): its outcome there.
INSUFFICIENT_DATA = "insufficient-data"


@dataclass(frozen=True)
class Shard:
    """One shard's results file for `pytest-specdec merge`: its path, the file as parsed, and as read."""

    path: Path
    data: Mapping[str, Any]
    results: Results


@dataclass(frozen=True)
class MergedTest:
    """One test of a merged night as the merge decided it (`app.merge`): its shard's file and entry, as written
    (``entry``) and as read (``test``); its verdicts and drift adjusted over the night's one family (``verdicts``
    None: it is in no family, and its entry stands as its shard wrote it); its outcome, and why where the merged
    family changed it."""

    shard: str
    entry: Mapping[str, Any]
    test: TestEntry
    outcome: str
    verdicts: tuple[Verdict, ...] | None = None
    drift: Drift | None = None
    why: str = ""


def merged_test_entry(m: MergedTest) -> dict[str, Any]:
    """A merged test's entry: its shard's, with the shard's file, its verdicts as adjusted over the night (each
    with its shard's `unadjusted` beside it), its drift, its baseline section marked ``adjusted: merged`` with the
    inconclusive gated metrics and the attribution on the merged verdicts, and its outcome with why where it
    changed."""
    from pytest_specdec.gate.verdicts import gated_with
    from pytest_specdec.output.schema import split_of
    from pytest_specdec.output.wording import attribution

    entry = copy.deepcopy(dict(m.entry))
    entry["shard"] = m.shard
    recorded = m.test.verdicts
    if m.verdicts is not None:
        if recorded:
            entry["verdicts"] = {v.metric: {**verdict_entry(v), "unadjusted": recorded[v.metric].unadjusted}
                                 for v in m.verdicts}
        if m.drift is not None:
            entry["drift"] = drift_entry(m.drift)
        if recorded and isinstance(entry.get("baseline"), dict):  # a test in the family by its drift alone
            # keeps its baseline section as its shard wrote it
            split = entry["baseline"].get("split")
            entry["baseline"] = {
                **entry["baseline"], "adjusted": "merged",
                "inconclusive_gated": [v.metric for v in gated_with(m.verdicts, INCONCLUSIVE)],
                "attribution": (attribution(m.verdicts, split_of(split) if isinstance(split, Mapping) else None)
                                if m.verdicts else None)}
    if m.why:
        entry["error"] = f"{entry['error']}\n{m.why}" if entry.get("error") else m.why
        entry["outcome"] = m.outcome
    return entry


def missing_test_entry(nodeid: str, shards: int) -> dict[str, Any]:
    """A test expected in a merged night but in none of its ``shards``: `INSUFFICIENT_DATA`, and why."""
    return {"nodeid": nodeid, "params": {}, "outcome": INSUFFICIENT_DATA, "when": None, "servers": {},
            "error": f"expected (--expect) but in none of the {shards} shards' results: the shard "
                     "that should have run it never ran or never uploaded its results"}


def merged_results(shards: Sequence[Shard], tests: Sequence[MergedTest], missing: Sequence[str]) -> dict[str, Any]:
    """The merged night's results document: the first shard's session-level fields (the shards agree on what
    `app.merge.SAME` names), the night's start (the earliest shard's) and length (the longest shard's), the
    servers, datasets, endpoints and sweeps of every shard, no machine factor of its own (each shard's is in
    `merged_from`, and in its tests' verdicts), each shard's file, start, machine factor and tests (`merged_from`),
    and its tests: the merged ones (`merged_test_entry`), then the ``missing`` (`missing_test_entry`)."""
    first = copy.deepcopy(dict(shards[0].data))
    durations = [d for s in shards if (d := s.results.duration_s) is not None]

    def union(key: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for s in shards:
            out.update({k: v for k, v in (s.data.get(key) or {}).items() if k not in out})
        return out

    return {
        **first,
        "started": min(s.results.started for s in shards),
        "duration_s": max(durations) if durations else None,
        "servers": union("servers"),
        "server_starts": sum(s.results.server_starts or 0 for s in shards),
        "time": None,
        "datasets": union("datasets"),
        "endpoints": union("endpoints"),
        "machine_factor": None,
        "machine_state": None,
        "gate": {**first.get("gate", {}),
                 "machine_failed": any(s.results.gate.machine_failed for s in shards)},
        "baseline_update": None,
        "crossovers": [x for s in shards for x in s.data.get("crossovers") or ()],
        "errors": [{"what": f"{s.path}: {e['what']}", "error": e["error"]} for s in shards for e in s.results.errors],
        "merged_from": [{"file": str(s.path), "started": s.results.started, "duration_s": s.results.duration_s,
                         "machine_factor": s.data.get("machine_factor"),
                         "tests": [t.nodeid for t in s.results.tests]} for s in shards],
        "tests": [*map(merged_test_entry, tests), *(missing_test_entry(n, len(shards)) for n in missing)],
    }


def write_results(results: dict[str, Any], reports_dir: Path, started: float, json_path: Path | None = None
                  ) -> tuple[list[Path], dict[str, Any]]:
    """The JSON, always under reports/ (timestamped + latest) and at --specdec-json when given. Returns the
    paths and the data as written (what the report renders, so both say the same)."""
    data = render_results(results)
    paths = [reports_dir / f"specdec-{stamp(started)}.json", reports_dir / "latest.json"]
    if json_path:
        paths.append(json_path)
    for path in paths:
        write_atomic(path, data)
    return paths, json.loads(data)


def outputs_path(reports_dir: Path, started: float) -> Path:
    """The --specdec-save-outputs side file: named after the session's results file, beside it."""
    return reports_dir / f"specdec-{stamp(started)}.outputs.json"


def write_outputs(records: Iterable[TestRecord], path: Path) -> None:
    """Every request's output text and token count, per test, arm and run (valid or not), by prompt id:
    what a lossless failure or a changed workload is read against later. A side file, so the results
    stay small enough for the report and for comparing nights."""
    tests = [{"nodeid": r.nodeid, "runs": [{"arm": run.arm, "index": run.index, "valid": run.valid,
                                            "outputs": dict(run.texts), "output_tokens": dict(run.output_tokens)}
                                           for run in (*r.result.reference_runs, *r.result.runs)]}
             for r in records if r.result is not None]
    write_atomic(path, json.dumps({"schema": 1, "tests": tests}, indent=1, ensure_ascii=False))


def write_report(results: dict[str, Any], reports_dir: Path, started: float, report_path: Path | None = None,
                 benchmark_json: Path | None = None) -> list[Path]:
    """The HTML report next to the JSON (timestamped + latest.html), or at --specdec-report-html; and the
    pytest-benchmark export at --specdec-benchmark-json. Returns the HTML paths."""
    from pytest_specdec.output.benchmark import benchmark_json as to_benchmark
    from pytest_specdec.output.report import render_html

    html = render_html(results)
    paths = ([report_path] if report_path else
             [reports_dir / f"specdec-{stamp(started)}.html", reports_dir / "latest.html"])
    writes = [(path, html) for path in paths]
    if benchmark_json:
        writes.append((benchmark_json, json.dumps(to_benchmark(results), indent=1, default=str)))
    for path, text in writes:
        write_atomic(path, text)
    return paths


def unique(entries: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Distinct dicts in first-seen order (each server process records the same workaround)."""
    seen: dict[str, dict[str, Any]] = {}
    for entry in entries:
        seen.setdefault(json.dumps(entry, sort_keys=True), entry)
    return list(seen.values())

