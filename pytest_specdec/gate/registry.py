"""Every metric the gate knows, defined once: how it is compared, how it is shown, and which family it
belongs to.  Statistics, verdicts, baselines, the report and the fixture all read this table.

A metric's kind fixes its comparison: ``rate`` (throughput; compared on the log scale, in %, higher is
better), ``latency`` (log scale, in %, lower is better) or ``acceptance`` (a proportion, in points,
higher is better). Its unit is how one value reads; a change is in its kind's ``DELTA_UNITS``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pytest_specdec.gate.kinds import GATED as GATED_FAMILY
from pytest_specdec.gate.kinds import PERCENT, POINTS, SHOWN, Family, Unit

Kind = Literal["rate", "acceptance", "latency"]
#: The goodput ratio's name: a metric only a test with goodput SLOs has (the nightly's, the A/B's and the summary's).
GOODPUT = "goodput"

KINDS: tuple[Kind, ...] = ("rate", "acceptance", "latency")
#: How a change of each kind is stated: relative for the log-scale kinds, in points for a proportion.
DELTA_UNITS: dict[Kind, Unit] = {"rate": PERCENT, "latency": PERCENT, "acceptance": POINTS}
LOG_KINDS: tuple[Kind, ...] = ("rate", "latency")


@dataclass(frozen=True)
class Metric:
    name: str  # as in verdicts, thresholds and the JSON; indexed ones are written `name[i]`
    kind: Kind
    unit: str  # of one value: "x" (speedup), "ms", "tok/s", "req/s", "tokens", "" (a proportion or plain ratio)
    label: str  # as the terminal and the report show it
    family: Family = SHOWN  # gated metrics fail a test; `gate=[...]` moves a shown one in
    absolute: bool = False  # an absolute figure: judged after the session's machine factor is divided out
    verdict: bool = True  # compared with the baseline (False: only an SLO or a summary figure)
    badge: bool = False  # one of the report's per-test badges
    indexed: bool = False  # one value per draft position: `name[i]`
    #: a tail ratio: per interleaved pair, the spec run's figure of this per-run metric ÷ the reference run's
    #: (`ArmRun.figure`), so the machine's speed that night cancels as it does in the speedup
    ratio_of: str = ""

    @property
    def higher_is_better(self) -> bool:
        return self.kind != "latency"

    def format(self, x: float | None, times: str = "x") -> str:
        """A value as the failure table and the HTML report show it (tables name throughputs in their
        header, so only ratios and milliseconds carry their unit)."""
        if x is None:
            return "—"
        if self.kind == "acceptance":
            return f"{x:.3f}"
        if self.unit == "x":
            return f"{x:.3f}{times}"
        if self.unit == "ms":
            return f"{x:.4g} ms"
        return f"{x:.4g}"


#: In table order (verdict metrics first, as the failure table and the report list them).
METRICS: tuple[Metric, ...] = (
    Metric("speedup", "rate", "x", "speedup", family=GATED_FAMILY, badge=True),
    Metric("acceptance_rate", "acceptance", "", "acceptance", family=GATED_FAMILY, badge=True),
    Metric("e2e_p95_ratio", "latency", "", "P95 E2E spec/ref", family=GATED_FAMILY, badge=True, ratio_of="e2e_p95_ms"),
    Metric("output_tok_s", "rate", "tok/s", "spec tok/s", absolute=True, badge=True),
    Metric("reference_tok_s", "rate", "tok/s", "reference tok/s", absolute=True),
    Metric("per_position_acceptance", "acceptance", "", "per-position acceptance", indexed=True),
    Metric("draft_coverage", "acceptance", "", "draft coverage"),
    # τ, tokens per verification step: what the speedup is made of beside the step time (measure/explain.py)
    Metric("acceptance_length", "rate", "tokens", "acceptance length"),
    # per pair, spec goodput ÷ reference goodput (requests meeting the test's SLOs per second, vllm bench serve's
    # --goodput): only a test with `goodput=` SLOs has it; `gate=["goodput"]` gates it
    Metric(GOODPUT, "rate", "x", "goodput spec/ref"),
    # the TTFT tails per pair: a method can lengthen time to first token (the draft's prefill, a longer schedule)
    # while it shortens TPOT; `gate=["ttft_p99_ratio"]` gates one (P99 as vllm bench serve computes it)
    Metric("ttft_p95_ratio", "latency", "", "P95 TTFT spec/ref", ratio_of="ttft_p95_ms"),
    Metric("ttft_p99_ratio", "latency", "", "P99 TTFT spec/ref", ratio_of="ttft_p99_ms"),
    Metric("tpot_p95_ms", "latency", "ms", "P95 TPOT", absolute=True, badge=True),
    Metric("ttft_p95_ms", "latency", "ms", "P95 TTFT", absolute=True),
    Metric("e2e_p95_ms", "latency", "ms", "P95 E2E", absolute=True),
    # the absolute tails, each run's P99 as vllm bench serve computes it (a P99 of 8 to 64 requests is near their
    # maximum: shown, `gate=[...]` gates one where a suite sends enough requests for it)
    Metric("tpot_p99_ms", "latency", "ms", "P99 TPOT", absolute=True),
    Metric("ttft_p99_ms", "latency", "ms", "P99 TTFT", absolute=True),
    Metric("e2e_p99_ms", "latency", "ms", "P99 E2E", absolute=True),
    Metric("request_s", "rate", "req/s", "requests/s", verdict=False),
    Metric("itl_token_p95_ms", "latency", "ms", "P95 ITL per token", verdict=False),
    Metric("itl_chunk_p95_ms", "latency", "ms", "P95 ITL per chunk", verdict=False),
    # a concurrency sweep's, not a test's (gate/crossover.py): judged once per sweep line at the session's end
    Metric("crossover", "rate", "c", "crossover concurrency", verdict=False),
)
BY_NAME: dict[str, Metric] = {m.name: m for m in METRICS}

VERDICT_METRICS: tuple[str, ...] = tuple(m.name for m in METRICS if m.verdict)
GATED: tuple[str, ...] = tuple(m.name for m in METRICS if m.family == GATED_FAMILY)
ABSOLUTE: tuple[str, ...] = tuple(m.name for m in METRICS if m.absolute)
LATENCY_VERDICTS: frozenset[str] = frozenset(m.name for m in METRICS if m.verdict and m.kind == "latency")
BADGES: tuple[Metric, ...] = tuple(m for m in METRICS if m.badge)
#: What the tokens alone decide, not the machine's speed: at T=0 acceptance repeated to the last digit on AMD and Intel
#: hosts and an H200 (docs/validation.md). Judged against other machines' nights where this one has none of its own.
PORTABLE: frozenset[str] = frozenset({"acceptance_rate", "acceptance_length", "per_position_acceptance",
                                      "draft_coverage"})
#: The tail ratios (`Metric.ratio_of`), each judged against the nights of a comparable machine state as the speedup is.
TAIL_RATIOS: tuple[Metric, ...] = tuple(m for m in METRICS if m.ratio_of)


def metric(name: str) -> Metric | None:
    """The registry entry of `name` (``per_position_acceptance[2]`` is ``per_position_acceptance``)."""
    return BY_NAME.get(name.split("[", 1)[0])


def label(name: str) -> str:
    """How a metric is named to people; an unknown name is shown as it is."""
    m = BY_NAME.get(name)
    return m.label if m is not None else name
