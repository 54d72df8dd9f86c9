"""`--specdec-dry-run`: every test's exact server commands and each suite's estimated run time, without
starting anything (so a GPU profile can be checked on a machine without GPUs)."""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_specdec import redact
from pytest_specdec.errors import ConfigError

if TYPE_CHECKING:
    from pytest_specdec.measure.types import Prompt
    from pytest_specdec.profiles import Profile
    from pytest_specdec.profiles.starts import Fit
    from pytest_specdec.vllm.command import ServerSpec


@dataclass(frozen=True)
class DryRunTest:
    """One collected test as the dry run sees it: its servers, and its prompts (or why they cannot load)."""

    nodeid: str
    arms: list[tuple[str, ServerSpec]]  # (arm, spec), reference first
    concurrency: int
    prompts: list[Prompt] | None
    error: str | None = None
    rate_fraction: float | None = None  # a rate sweep's point (`PlannedTest.rate_fraction`)
    saturation: bool = False  # it measures its rate sweep's saturation


def dry_run_test(nodeid: str, arms: list[tuple[str, ServerSpec]], concurrency: int,
                 prompts: Callable[[], list[Prompt]], rate_fraction: float | None = None,
                 saturation: bool = False) -> DryRunTest:
    """A test whose prompts cannot load is still listed, with why it has no estimate."""
    try:
        return DryRunTest(nodeid, arms, concurrency, prompts(), None, rate_fraction, saturation)
    except ConfigError as exc:
        return DryRunTest(nodeid, arms, concurrency, None, str(exc), rate_fraction, saturation)


def command_line(spec: ServerSpec) -> str:
    """`ENV=... vllm serve ...` as a shell line, the port left as $PORT (the pool picks a free one)."""
    from pytest_specdec.vllm.command import build_command

    env = "".join(f"{k}={shlex.quote(v)} " for k, v in redact.env(dict(spec.env)).items())
    return (env + shlex.join(redact.args(build_command(spec, "$PORT")))).replace("'$PORT'", "$PORT")


def dry_run_lines(profile: Profile, tests: list[DryRunTest], *, hardware_note: str, endpoints: tuple[str, str] | None,
                  server_cpus: frozenset[int] | None, runs: int, max_runs: int, max_servers: int,
                  price: dict[str, Any] | None, fit_of: Callable[[Sequence[ServerSpec]], Fit] | None = None,
                  apart_of: Callable[[Sequence[ServerSpec]], Fit] | None = None,
                  skipped: Mapping[str, str] | None = None) -> list[str]:
    """The dry run's lines: each test's commands, the servers, the leases' CPUs and the estimate per suite.
    ``fit_of``: where servers start together, whether given servers have room at once (`Placement.fit`); None:
    one at a time. ``apart_of``: whether given servers started at once share no GPU (`Placement.apart`)."""
    from pytest_specdec.measure.schedule import warmup_requests
    from pytest_specdec.output.estimate import PlannedTest, Timings, estimate, minutes

    lines = [f"specdec dry run: profile {profile.name} ({profile.path}), {len(tests)} test(s)"
             + (f" and {len(skipped)} skipped" if skipped else "") + "; nothing is started"]
    if hardware_note:
        lines.append(f"specdec dry run: {hardware_note}")
    if endpoints:
        lines.append(f"specdec dry run: endpoint mode: the commands are what the endpoints "
                     f"({endpoints[0]}, reference {endpoints[1]}) would need to run")
    specs: dict[str, ServerSpec] = {}
    planned: list[PlannedTest] = []
    unknown: list[str] = []
    for t in tests:
        lines.append(f"  {t.nodeid}")
        for arm, spec in t.arms:
            specs.setdefault(spec.key(), spec)
            lines.append(f"    {arm} [{spec.key()}]: {command_line(spec)}")
        if t.prompts is None:
            unknown.append(f"{t.nodeid}: {t.error}")
            continue
        warm = t.prompts[: warmup_requests(len(t.prompts), t.concurrency)]
        planned.append(PlannedTest(
            t.nodeid, tuple(spec.key() for _, spec in t.arms), sum(p.max_tokens for p in t.prompts), len(t.prompts),
            t.concurrency, sum(p.max_tokens for p in warm), len(warm), t.rate_fraction, t.saturation,
        ))
    for nodeid, reason in (skipped or {}).items():
        lines.append(f"  {nodeid}: skipped, not estimated (specdec A/B session: {reason})")
    methods = ", ".join(f"{key} {spec.method}" for key, spec in specs.items())
    lines.append(f"specdec dry run: {len(specs)} distinct server(s): {methods}")
    if server_cpus:
        from pytest_specdec.servers.pool import format_cpus

        client = format_cpus(os.sched_getaffinity(0) - server_cpus)
        lines.append(f"specdec dry run: servers start on CPU {format_cpus(server_cpus)}, leaving CPU {client} to the "
                     f"client ([placement] client_cpus = {profile.raw['placement']['client_cpus']})")
    timings = Timings.from_profile(profile.raw, profile.path)
    if timings is None:
        lines.append(f"specdec dry run: no run-time estimate: profile {profile.path} has no [timings]")
        return lines
    fits = None if fit_of is None else fit_of(list(specs.values()))
    apart = None if apart_of is None else apart_of(list(specs.values()))
    modules = estimate(planned, timings, runs=runs, max_runs=max_runs, max_servers=max_servers, fits=fits,
                       apart=apart)
    lines.append(
        f"specdec dry run: estimated run time per suite ([timings] of {profile.name}: {timings.server_start_s:g} s "
        f"per server start, {timings.stream_tok_s:g} tok/s per request, {timings.max_tok_s:g} tok/s at most; "
        f"{runs} interleaved run(s) per arm, every request to its max_tokens, spec runs at the "
        f"reference's rate):"
    )
    for m in modules:
        together = (f"; {m.together} of its starts in {m.groups} group(s) started together, ~{minutes(m.saved_s)} "
                    "saved" if m.groups else "")
        lines.append(f"  {m.module}: {m.tests} test(s), {m.starts} server start(s), {m.runs} run(s): "
                     f"~{minutes(m.seconds)} (up to {minutes(m.seconds_max)} if verdicts take {max_runs} "
                     f"run(s) per arm){together}")
    total = sum(m.seconds for m in modules)
    total_max = sum(m.seconds_max for m in modules)
    # what a test holds at once: one server's GPUs (the report's price), or every arm's where each has its own
    hourly = (price.get("usd_per_hour_held") or price["usd_per_hour"]) if price else None
    cost = f"; ${total / 3600 * hourly:.2f} to ${total_max / 3600 * hourly:.2f} at ${hourly:g}/h" if hourly else ""
    lines.append(f"  total: ~{minutes(total)} (up to {minutes(total_max)}){cost}")
    saved = sum(m.saved_s for m in modules)
    if saved:
        lines.append(f"  servers that co-reside start together: ~{minutes(saved)} of starts saved "
                     f"(~{minutes(total + saved)} with every server started one after another)")
    elif fits is not None:
        lines.append("  servers start one after another: no two that a test needs next fit beside each other on GPUs "
                     "of their own (two starting at once on one GPU can leave the second no KV cache; "
                     "--gpu-memory-utilization summing to at most 1 on each, --specdec-max-servers)")
    lines += [f"  no estimate for {u}" for u in unknown]
    return lines
