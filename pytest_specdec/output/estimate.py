"""Dry-run estimate of how long each suite (module) takes, from the matrix and the profile's `[timings]`.

Why: a nightly job needs a timeout and a budget before anyone has run it on that GPU class.  The
estimate follows what the session will do: tests in collection order, servers started through an LRU
pool of `--specdec-max-servers`, each test running `runs` interleaved reference/spec pairs after one
warm-up per arm, and up to `max_runs` pairs when verdicts stay inconclusive.  It is an upper-bound
style figure: every request is assumed to run to its max_tokens, and spec runs are costed at the
reference's rate (speculation only makes them shorter).  Pure functions; no pytest import.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_specdec.errors import ConfigError

if TYPE_CHECKING:
    from pytest_specdec.profiles.starts import Fit


@dataclass(frozen=True)
class Timings:
    """A profile's `[timings]`: seconds per server start and the reference's decode rates."""

    server_start_s: float
    stream_tok_s: float  # one request's output tok/s (concurrency 1)
    max_tok_s: float  # the whole server's output tok/s at high concurrency
    run_overhead_s: float = 1.0

    @classmethod
    def from_profile(cls, raw: dict[str, Any], path: Path) -> Timings | None:
        """None when the profile has no `[timings]` (the dry run then says it cannot estimate)."""
        table = raw.get("timings")
        if not table:
            return None
        missing = [k for k in ("server_start_s", "stream_tok_s", "max_tok_s") if k not in table]
        if missing:
            raise ConfigError(f"profile {path}: [timings] needs {', '.join(missing)} (see cpu.toml for their meaning)")
        return cls(**{k: float(v) for k, v in table.items()})

    def run_s(self, output_tokens: int, n_requests: int, concurrency: int) -> float:
        """One run: its tokens at min(concurrency x per-stream rate, server maximum)."""
        if n_requests == 0:
            return 0.0
        rate = min(min(concurrency, n_requests) * self.stream_tok_s, self.max_tok_s)
        return output_tokens / rate + self.run_overhead_s


@dataclass(frozen=True)
class PlannedTest:
    """What one collected specdec test will do."""

    nodeid: str
    servers: tuple[str, ...]  # server keys in the order the test asks for them (reference first)
    output_tokens: int  # per run: sum of the prompts' max_tokens
    n_requests: int
    concurrency: int
    warmup_tokens: int  # per arm, before its first run
    warmup_requests: int
    #: a rate sweep's point: its open loop at this fraction of the saturation spreads the arrivals of a closed pass
    #: over 1/fraction of its time
    rate_fraction: float | None = None
    saturation: bool = False  # it measures its sweep's saturation first: one warmed closed pass on the reference

    @property
    def module(self) -> str:
        return self.nodeid.split("::", 1)[0]


@dataclass
class ModuleEstimate:
    module: str
    tests: int = 0
    starts: int = 0
    runs: int = 0  # runs at the profile's runs per arm (both arms counted)
    seconds: float = 0.0
    seconds_max: float = 0.0  # with every test taking max_runs pairs
    together: int = 0  # starts that overlapped others (counted in `starts` too)
    groups: int = 0  # groups of servers started together
    saved_s: float = 0.0  # start time the overlap saved: (servers in a group - 1) x a start, per group
    nodeids: list[str] = field(default_factory=list)


def estimate(tests: list[PlannedTest], timings: Timings, *, runs: int, max_runs: int,
             max_servers: int, fits: Fit | Mapping[str, float] | None = None,
             apart: Fit | None = None) -> list[ModuleEstimate]:
    """Per module, in first-seen order: server starts, runs and seconds (at `runs` and at `max_runs`). With
    ``fits`` (whether servers have room at once, or each server's memory share, where the placement starts servers
    together) the servers that start together before a test (`profiles.starts.plan_start`, as the session asks it)
    cost one start; ``apart`` says whether servers started at once share no GPU (None: they share one set)."""
    from pytest_specdec.profiles.starts import one_set_apart, plan_start

    alive: OrderedDict[str, None] = OrderedDict()
    modules: dict[str, ModuleEstimate] = {}
    for i, t in enumerate(tests):
        m = modules.setdefault(t.module, ModuleEstimate(t.module))
        m.tests += 1
        m.nodeids.append(t.nodeid)
        plan = None if fits is None else plan_start(
            t.servers, [key for later in tests[i + 1:] for key in later.servers], list(alive), fits, max_servers,
            apart or one_set_apart)
        if plan is not None:
            for key in plan.stop:
                del alive[key]
            alive.update(dict.fromkeys(plan.start))
            m.starts += len(plan.start)
            m.together += len(plan.start)
            m.groups += 1
            m.saved_s += (len(plan.start) - 1) * timings.server_start_s
            m.seconds += timings.server_start_s
            m.seconds_max += timings.server_start_s
        for key in t.servers:  # the pool: reuse, else stop the least recently used and start
            if key in alive:
                alive.move_to_end(key)
                continue
            while len(alive) >= max_servers:
                alive.popitem(last=False)
            alive[key] = None
            m.starts += 1
            m.seconds += timings.server_start_s
            m.seconds_max += timings.server_start_s
        arms = len(t.servers)
        warm = arms * timings.run_s(t.warmup_tokens, t.warmup_requests, t.concurrency)
        one = timings.run_s(t.output_tokens, t.n_requests, t.concurrency)
        if t.saturation:
            warm += warm / arms + one
        if t.rate_fraction and one:  # the arrivals of a pass spread over 1/fraction of its time; the overhead stays
            one = (one - timings.run_overhead_s) / t.rate_fraction + timings.run_overhead_s
        m.runs += arms * runs
        m.seconds += warm + arms * runs * one
        m.seconds_max += warm + arms * max(runs, max_runs) * one
    return list(modules.values())


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"
