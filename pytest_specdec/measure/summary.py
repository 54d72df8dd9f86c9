"""A test's summary over its valid runs: the pairs' speedups, geometric means for rates, pooled counters for
acceptance (and the requests' own figures, by prompt and category, where every valid spec run has them), medians
of per-run percentiles for latencies, the speedup explained (`explain.py`); and each run's Harrell-Davis P95s. It
reads the runs as the one run record (`record.ArmRun`), pairs them by the one rule (`record.pairs`) and derives τ
and the means as `figures.py` defines them.

The summary is a frozen value (`Summary`), handed up as it is: the results file's format writes it
(`output.schema.summary_entry`), and the test's `specdec.summary` is that same entry, so a user's test and the file
read one shape, written in one place."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from pytest_specdec.measure.acceptance import COUNTERS, PER_REQUEST, case_acceptance
from pytest_specdec.measure.figures import geomean, tau
from pytest_specdec.measure.record import dropped, goodput_ratio, goodput_undefined, pairs, speedup_per_pair

if TYPE_CHECKING:
    from pytest_specdec.measure.acceptance import AcceptanceTable, RunAcceptance
    from pytest_specdec.measure.explain import Explained
    from pytest_specdec.measure.metrics import RunMetrics
    from pytest_specdec.measure.record import ArmRun
    from pytest_specdec.measure.types import LoadResult


class SummaryRun(Protocol):
    """What the summary reads of a run (`runner.RunRecord`, which imports this module)."""

    @property
    def metrics(self) -> RunMetrics: ...

    @property
    def acceptance(self) -> RunAcceptance | None: ...

    @property
    def record(self) -> ArmRun: ...


def hd_p95s(load: LoadResult) -> dict[str, float | None]:
    """Harrell-Davis P95 in ms of the successful requests' TPOT, TTFT and E2E of one run."""
    from pytest_specdec.measure.metrics import harrell_davis_p95

    ok = [s for s in load.samples if s.error is None]
    out: dict[str, float | None] = {}
    for name, attr in (("tpot", "tpot_s"), ("ttft", "ttft_s"), ("e2e", "e2e_s")):
        vals = [v for v in (getattr(s, attr) for s in ok) if v is not None]
        p95 = harrell_davis_p95(vals)
        out[name] = None if p95 is None else p95 * 1000.0
    return out


def _median(values: list[float | None]) -> float | None:
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return None
    mid = len(vals) // 2
    return vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2


#: The latencies the summary gives percentiles of, by `RunMetrics` field (ms), in the order the file keeps them.
LATENCIES: tuple[str, ...] = ("ttft_ms", "tpot_ms", "itl_token_ms", "itl_chunk_ms", "e2e_ms")


@dataclass(frozen=True)
class Percentiles:
    """The median over a test's timed runs of each run's P50, P95 and P99 (ms; None: no run had one)."""

    p50: float | None
    p95: float | None
    p99: float | None


@dataclass(frozen=True)
class GoodputSummary:
    """A test with goodput SLOs: the goodput ratio (the geometric mean of the pairs' spec/ref, as the speedup's) over
    ``pairs`` pairs, each arm's mean goodput (req/s, a run that met no SLO counting 0) over its valid runs, and the
    kept pairs whose ratio is undefined, (run index, why) (`record.goodput_undefined`)."""

    goodput: float | None
    pairs: int | None
    undefined: tuple[tuple[int, str], ...]
    req_s: float | None
    reference_req_s: float | None


@dataclass(frozen=True)
class Summary:
    """A test's summary over its valid runs (`summarize`): the spec arm's figures, or the reference's when the test
    has no spec arm; the pairs the speedup is over and each one left out with why (a run invalid on either arm)."""

    valid_runs: int
    latency_runs: int  # the valid runs whose latencies count (a coalesced stream's are left out)
    valid_reference_runs: int
    output_tok_s: float | None
    reference_tok_s: float | None
    speedup: float | None
    pairs: int | None  # None: no spec arm
    pairs_dropped: tuple[tuple[int, str], ...] | None  # (run index, why); None: no spec arm
    acceptance_rate: float | None
    acceptance_length: float | None
    per_position_acceptance: tuple[float, ...] | None
    draft_coverage: float | None
    acceptance_source: str  # `acceptance.COUNTERS` or `acceptance.PER_REQUEST`
    request_acceptance: AcceptanceTable | None  # from the requests' own figures, where every valid spec run has them
    latencies: Mapping[str, Percentiles]  # by `LATENCIES` name
    explain: Explained | None  # τ, step times, predicted speedup, efficiency, draft overhead (`measure/explain.py`)
    goodput: GoodputSummary | None = None  # None: the test set no goodput SLOs


def summarize(reference: Sequence[SummaryRun], spec: Sequence[SummaryRun]) -> Summary:
    """The test's summary over valid runs: geometric means for rates, pooled counters for acceptance,
    medians of per-run percentiles for latencies (of the spec arm; the reference's when no spec arm), and how
    many pairs the speedup is over, with the dropped ones and why (`record.pairs`)."""
    refs, specs = [r.record for r in reference], [r.record for r in spec]
    ref_ok = [r for r in refs if r.valid]
    arm = [r for r in specs if r.valid] if spec else ref_ok
    timed = [r for r in arm if r.timed]  # a coalesced stream's latencies are left out
    paired = pairs(refs, specs) if spec else []
    counted = [r for r in arm if r.drafts is not None]
    drafts = sum(r.drafts or 0 for r in counted)
    draft_tokens = sum(r.draft_tokens or 0 for r in counted)
    accepted = sum(r.accepted_tokens or 0 for r in counted)
    per_pos: tuple[float, ...] | None = None
    if drafts:
        width = max(len(r.accepted_per_pos or ()) for r in counted)
        per_pos = tuple(sum((r.accepted_per_pos or (0,) * width)[i] for r in counted) / drafts for i in range(width))
    # decode steps are not a stored figure: the counters' own, of the same valid runs
    steps = sum(r.metrics.spec.decode_steps or 0 for r in (spec if spec else reference)
                if r.record.valid and r.metrics.spec is not None)

    def latency(name: str) -> Percentiles:
        return Percentiles(*(_median([(r.latencies_ms.get(name) or {}).get(p) for r in timed])
                             for p in ("p50", "p95", "p99")))

    from pytest_specdec.measure.explain import explain

    # acceptance from the requests' own figures, over prompts, where every valid spec run has them (one source)
    requests = case_acceptance([r.acceptance for r in spec if r.record.valid]) if spec else None
    return Summary(
        valid_runs=len(arm),
        latency_runs=len(timed),
        valid_reference_runs=len(ref_ok),
        output_tok_s=geomean(r.output_tok_s for r in arm),
        reference_tok_s=geomean(r.output_tok_s for r in ref_ok),
        speedup=geomean(speedup_per_pair(refs, specs)) if spec else None,
        pairs=sum(p.kept for p in paired) if spec else None,
        pairs_dropped=tuple(dropped(paired)) if spec else None,
        acceptance_rate=accepted / draft_tokens if draft_tokens else None,
        acceptance_length=tau(drafts, accepted),
        per_position_acceptance=per_pos,
        draft_coverage=min(1.0, drafts / steps) if steps and spec else None,
        acceptance_source=COUNTERS if requests is None else PER_REQUEST,
        request_acceptance=requests,
        latencies={name: latency(name) for name in LATENCIES},
        explain=explain(refs, specs) if spec else None,
        goodput=goodput_summary(refs, specs, paired),
    )


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def goodput_summary(refs: list[ArmRun], specs: list[ArmRun], paired: list[Any]) -> GoodputSummary | None:
    """A test with goodput SLOs: its `GoodputSummary`; None for a test without SLOs (nothing new to show)."""
    if not any(r.goodput_req_s is not None for r in (*refs, *specs)):
        return None
    ratios = [goodput_ratio(p) for p in paired]
    arm = [r for r in specs if r.valid] if specs else [r for r in refs if r.valid]
    return GoodputSummary(
        goodput=geomean(ratios) if specs else None,
        pairs=sum(r is not None for r in ratios) if specs else None,
        undefined=tuple(goodput_undefined(paired)),
        req_s=_mean([r.goodput_req_s for r in arm]),
        reference_req_s=_mean([r.goodput_req_s for r in refs if r.valid]),
    )
