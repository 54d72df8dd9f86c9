"""When a run is not to be trusted: the `[validity]` limits of a profile, typed, and the checks that apply
them to one run. The profile builds `ValidityRules` once, when it is read; the runner only applies them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytest_specdec.measure.metrics import Chunking, RunMetrics


@dataclass(frozen=True)
class ValidityRules:
    """When a run is not to be trusted."""

    max_failed_share: float = 0.0
    # Mean lateness of the client's 10 ms event-loop ticker. A single long stall (the OS
    # descheduling the client once on a small machine) only shows in the max, which is reported.
    max_loop_lag_mean_ms: float = 20.0
    max_token_mismatch_share: float = 0.0
    # Share of a run's tokens that may arrive more per chunk than one engine step makes (1, or k + 1)
    # before the run's latency figures are untrusted (metrics.Chunking; docs/measurement.md).
    max_coalesced_share: float = 0.05
    # A server that sends nothing on a request for this long is hung: the request fails (not after the
    # total timeout), its run is invalid, and a server the plugin owns is restarted once.
    hung_timeout_s: float = 60.0
    # A run this much slower than the median of its arm's other runs in the same test (a fraction: 0.3 is 30 %
    # fewer tok/s; a spec arm's tok/s per acceptance length) was disturbed by something else on the machine, not
    # by what is under test: it leaves the verdicts with its pair (`disturbed`). 0 turns the rule off. On the CPU a
    # run's log tok/s varies with an sd
    # of about 0.07, so 0.3 (0.36 in log) is five sd away (docs/measurement.md#disturbed-runs).
    max_run_slowdown: float = 0.3
    # Another server of the session (an A/B session keeps three or four alive) using more than this many cores
    # during a run took them from the server measured: the run is invalid, naming it. 0 turns the rule off.
    max_neighbour_cores: float = 0.0


#: The rules with every default (a frozen value: safe as an argument's default)
DEFAULT_RULES = ValidityRules()

#: How a client-bound run's invalid reason starts: the lag invalidates the run's timing, not its counters
#: or texts, so callers that only need those (the zoo's acceptance checks) look for this prefix.
CLIENT_LAG = "client event loop lagged"
#: How a run whose server stopped sending is marked invalid (`RunRecord.hung` looks for it).
HUNG = "server hung"
#: How a disturbed run's invalid reason starts (the rule is applied anew over an arm's runs after every look).
DISTURBED = "disturbed"
#: How a run that shared the CPU with another server of the session is marked invalid (`runner.neighbour_reasons`).
NEIGHBOUR = "shared the CPU"
#: At most this share of an arm's runs is called disturbed: when more are that far below the median, the arm
#: itself is slow (an intermittent regression is still a regression), and every run counts.
MAX_DISTURBED_SHARE = 1 / 3


def invalid_reasons(m: RunMetrics, n_prompts: int, rules: ValidityRules) -> list[str]:
    """Why a run cannot be trusted (empty when it can)."""
    reasons: list[str] = []
    if m.n_requests and m.n_failed / m.n_requests > rules.max_failed_share:
        top = ", ".join(f"{k} x{v}" for k, v in sorted(m.errors.items(), key=lambda kv: -kv[1])[:2])
        reasons.append(f"{m.n_failed}/{m.n_requests} requests failed ({top})")
    engine = m.engine
    if engine and engine.preemptions:
        reasons.append(f"{engine.preemptions} preemption(s) during the run (KV cache too small for the load)")
    wanted = min(m.concurrency or 1, n_prompts)
    # In an open loop the concurrency is a cap, not a target: the arrival rate sets what is in flight.
    if m.request_rate is None and m.max_in_flight is not None and m.max_in_flight < wanted:
        reasons.append(f"concurrency not reached: at most {m.max_in_flight} in flight, wanted {wanted}")
    if engine and engine.token_counter_mismatch:
        share = abs(engine.token_counter_mismatch) / max(1, m.total_output_tokens)
        if share > rules.max_token_mismatch_share:
            reasons.append(
                f"server generated {engine.generation_tokens} tokens but responses carried {m.total_output_tokens} "
                "(another client, or replicas behind the endpoint): acceptance is untrusted"
            )
    if m.loop_lag_mean_ms is not None and m.loop_lag_mean_ms > rules.max_loop_lag_mean_ms:
        reasons.append(
            f"{CLIENT_LAG} {m.loop_lag_mean_ms:.0f} ms on average (max {m.loop_lag_max_ms:.0f} ms): "
            "client-bound"
        )
    return reasons


def latency_untrusted(chunks: Chunking, rules: ValidityRules) -> list[str]:
    """Why a run's latency figures (TTFT, TPOT, ITL, E2E) cannot be trusted: its stream was coalesced.

    The run stays valid (its tokens, counters and throughput are right); only its latencies leave the
    verdicts and the summary."""
    if chunks.over_limit_share <= rules.max_coalesced_share:
        return []
    return [f"coalesced stream: {chunks.over_limit_share:.0%} of tokens arrived more than {chunks.step_limit} per "
            f"chunk (limit {rules.max_coalesced_share:.0%}); {chunks.cause()}"]


def disturbed(tok_s: Sequence[float | None], max_slowdown: float, unit: str = "tok/s") -> dict[int, str]:
    """The runs of one arm (by position; None: a run already invalid, which neither counts nor is judged)
    that ran more than ``max_slowdown`` below the median of the arm's other runs, with the reason to show.
    ``unit`` names the rate compared (a spec arm's is tok/s per acceptance length: `step_rate`).

    A machine's slow day moves every run of a session alike and is left alone; one run that something else
    on the machine slowed stands out against its own arm. Only slower runs count: a disturbance cannot
    speed a run up. Fewer than three runs cannot say which one is off. Nothing is called disturbed when
    more than MAX_DISTURBED_SHARE of the runs would be."""
    if not max_slowdown:
        return {}
    runs = {i: x for i, x in enumerate(tok_s) if x is not None and x > 0}
    if len(runs) < 3:
        return {}
    found: dict[int, str] = {}
    for i, x in runs.items():
        others = sorted(math.log(v) for j, v in runs.items() if j != i)
        mid = len(others) // 2
        median = math.exp(others[mid] if len(others) % 2 else (others[mid - 1] + others[mid]) / 2)
        if x < (1 - max_slowdown) * median:
            found[i] = (f"{DISTURBED}: {x:.1f} {unit}, {1 - x / median:.0%} below the median of the arm's other "
                        f"runs ({median:.1f}; limit {max_slowdown:.0%}): something else slowed this run")
    return {} if len(found) > MAX_DISTURBED_SHARE * len(runs) else found


#: What the rule compares on a spec arm: a run that accepted less makes fewer tokens per step and is slower
#: for that reason alone; a disturbance slows the steps themselves.
STEP_RATE = "tok/s per acceptance length"


def step_rate(tok_s: float | None, acceptance_length: float | None) -> float | None:
    """A run's tok/s divided by its acceptance length (tokens per engine step and request): the rate of its
    engine steps, up to a constant, which acceptance leaves alone and a disturbance lowers."""
    if tok_s is None or acceptance_length is None or acceptance_length <= 0:
        return tok_s
    return tok_s / acceptance_length
