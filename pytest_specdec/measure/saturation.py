"""A rate sweep's load: the reference's saturation, measured once per sweep, and each point's rate as a fraction of it.

`vllm bench sweep` (benchmarks/sweep/serve_workload.py) runs the workload at max_concurrency 1 and at max_concurrency
= the dataset's size, takes their request throughputs as the ends and sweeps rates between. Here the top end is the
same measurement: the reference's request throughput with every request let in at once (rate inf) up to the test's
concurrency cap, which is one closed-loop pass of the test's prompts at its concurrency (set concurrency to
num_prompts for bench sweep's "all prompts in flight"). It is measured on the reference server the sweep's first
test started and warmed, so every point of the sweep reads one saturation; the points are ``i/N`` of it, i = 1..N,
up to 1.0 (bench sweep's low end, the throughput at concurrency 1, would cost a second measurement and places no
point where a user runs a server at a fraction of its capacity).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pytest_specdec.errors import SpecDecError

if TYPE_CHECKING:
    from pytest_specdec.measure.types import Api, Prompt, Sampling
    from pytest_specdec.measure.validity import ValidityRules
    from pytest_specdec.servers.pool import Endpoint

#: The most points a rate sweep takes: its test ids name each in whole % of the saturation (``sat33``).
MAX_POINTS = 100


def fractions(n: int) -> tuple[float, ...]:
    """The ``n`` points of a rate sweep as fractions of the saturation: 1/n, 2/n, ..., 1.0 (rounded to 6 places,
    so a fraction reads the same in an id, a baseline's workload and a stored record)."""
    if isinstance(n, bool) or not isinstance(n, int) or not 3 <= n <= MAX_POINTS:
        raise ValueError(f"a rate sweep has 3 to {MAX_POINTS} points, got {n!r}")
    return tuple(round(i / n, 6) for i in range(1, n + 1))


@dataclass(frozen=True)
class Saturation:
    """The reference's throughput with every request in flight at once (up to the concurrency cap): one run."""

    req_s: float
    output_tok_s: float | None
    n_requests: int
    duration_s: float
    concurrency: int
    measured_by: str  # the test whose warm reference server it was measured on


@dataclass(frozen=True)
class RatePoint:
    """One test's point of a rate sweep: its fraction and the saturation it is a fraction of."""

    fraction: float
    points: int
    saturation: Saturation

    @property
    def request_rate(self) -> float:
        """The open-loop rate this test offers, req/s."""
        return self.fraction * self.saturation.req_s


def measure_saturation(endpoint: Endpoint, prompts: Sequence[Prompt], sampling: Sampling, *, concurrency: int,
                       api: Api, api_key: str | None, rules: ValidityRules, measured_by: str,
                       settle: Callable[[str | None, float | None], object] | None = None) -> Saturation:
    """One closed-loop run of ``prompts`` on the reference at ``concurrency`` (rate inf, capped), warmed up as the
    runner warms a server, after ``settle`` (the pool's wait for idle servers, as before every measured run: a
    server just started still spins, and on a small host would take the reference's cores); its request throughput
    is the saturation. An invalid run (failed requests, a hung stream) cannot stand for the server's capacity: an
    error with its reasons."""
    from pytest_specdec.measure.prompts import FixedPrompts
    from pytest_specdec.measure.runner import one_run
    from pytest_specdec.measure.schedule import warmup_requests

    warm = FixedPrompts(list(prompts)).warmup(warmup_requests(len(prompts), concurrency))
    if settle is not None:
        settle(endpoint.instance, None)
    rec = one_run(endpoint, "reference", 0, list(prompts), sampling, concurrency=concurrency, api_key=api_key,
                  rules=rules, api=api, rate=None, warmup_prompts=warm)
    m = rec.metrics
    if not rec.valid or not m.request_s:
        raise SpecDecError(f"specdec rate sweep: the reference's saturation run for {measured_by} is invalid "
                           f"({'; '.join(rec.invalid) or 'no request finished'}): the sweep's rates are fractions of "
                           "it, so none can be set")
    return Saturation(m.request_s, m.output_tok_s, m.n_requests, m.duration_s, concurrency, measured_by)


@dataclass
class Saturations:
    """The session's saturation per rate sweep: measured at the sweep's first test, read by the others."""

    found: dict[Hashable, Saturation] = field(default_factory=dict)

    def point(self, sweep: Hashable, fraction: float, points: int, measure: Callable[[], Saturation]) -> RatePoint:
        """The test's point; ``measure()`` runs only for the sweep's first test in this session."""
        if sweep not in self.found:
            self.found[sweep] = measure()
        return RatePoint(fraction, points, self.found[sweep])
