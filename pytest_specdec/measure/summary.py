"""A test's summary over its valid runs: the pairs' speedups, geometric means for rates, pooled counters for
acceptance (and the requests' own figures, by prompt and category, where every valid spec run has them), medians
of per-run percentiles for latencies, the speedup explained (`explain.py`); and each run's Harrell-Davis P95s. It
reads the runs as the one run record (`record.ArmRun`), pairs them by the one rule (`record.pairs`) and derives τ
and the means as `figures.py` defines them.

The summary is one mapping, the test's `specdec.result.summary` and its `summary` in the results file alike; the
typed values in it are written here, once, for both (`request_acceptance_entry`, `explained_entry`: the results
file's module reads them back and writes a run's acceptance with the same shape)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from pytest_specdec.measure.acceptance import COUNTERS, PER_REQUEST, case_acceptance
from pytest_specdec.measure.figures import geomean, tau
from pytest_specdec.measure.record import dropped, goodput_ratio, goodput_undefined, pairs, speedup_per_pair

if TYPE_CHECKING:
    from pytest_specdec.measure.acceptance import Acceptance, AcceptanceTable, RunAcceptance
    from pytest_specdec.measure.explain import Explained
    from pytest_specdec.measure.metrics import RunMetrics
    from pytest_specdec.measure.record import ArmRun
    from pytest_specdec.measure.types import LoadResult


class SummaryRun(Protocol):
    """What the summary reads of a run (`runner.RunRecord`, which imports this module)."""

    metrics: RunMetrics
    acceptance: RunAcceptance | None

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


def summarize(reference: Sequence[SummaryRun], spec: Sequence[SummaryRun]) -> dict[str, Any]:
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
    per_pos: list[float] | None = None
    if drafts:
        width = max(len(r.accepted_per_pos or ()) for r in counted)
        per_pos = [sum((r.accepted_per_pos or (0,) * width)[i] for r in counted) / drafts for i in range(width)]
    # decode steps are not a stored figure: the counters' own, of the same valid runs
    steps = sum(r.metrics.spec.decode_steps or 0 for r in (spec if spec else reference)
                if r.record.valid and r.metrics.spec is not None)

    def latency(name: str) -> dict[str, float | None]:
        return {p: _median([(r.latencies_ms.get(name) or {}).get(p) for r in timed]) for p in ("p50", "p95", "p99")}

    from pytest_specdec.measure.explain import explain

    explained = explain(refs, specs) if spec else None
    # acceptance from the requests' own figures, over prompts, where every valid spec run has them (one source)
    requests = case_acceptance([r.acceptance for r in spec if r.record.valid]) if spec else None
    return {
        **goodput_summary(refs, specs, paired),
        "valid_runs": len(arm),
        "latency_runs": len(timed),
        "valid_reference_runs": len(ref_ok),
        "output_tok_s": geomean(r.output_tok_s for r in arm),
        "reference_tok_s": geomean(r.output_tok_s for r in ref_ok),
        "speedup": geomean(speedup_per_pair(refs, specs)) if spec else None,
        # the pairs the speedup is over, and each one left out with why (a run invalid on either arm)
        "pairs": sum(p.kept for p in paired) if spec else None,
        "pairs_dropped": [{"index": i, "why": why} for i, why in dropped(paired)] if spec else None,
        "acceptance_rate": accepted / draft_tokens if draft_tokens else None,
        "acceptance_length": tau(drafts, accepted),
        "per_position_acceptance": per_pos,
        "draft_coverage": min(1.0, drafts / steps) if steps and spec else None,
        "acceptance_source": COUNTERS if requests is None else PER_REQUEST,
        "request_acceptance": None if requests is None else request_acceptance_entry(requests),
        "ttft_ms": latency("ttft_ms"),
        "tpot_ms": latency("tpot_ms"),
        "itl_token_ms": latency("itl_token_ms"),
        "itl_chunk_ms": latency("itl_chunk_ms"),
        "e2e_ms": latency("e2e_ms"),
        # τ, step times, predicted speedup, verification efficiency, draft overhead (measure/explain.py)
        "explain": None if explained is None else explained_entry(explained),
    }


def acceptance_entry(a: Acceptance) -> dict[str, Any]:
    """Acceptance over some units as the summary holds it: the counts, the rate, τ and the interval over the units
    (`output.schema.AcceptanceEntry` reads it back)."""
    return {"units": a.units, "drafts": a.drafts, "draft_tokens": a.draft_tokens,
            "accepted_tokens": a.accepted_tokens, "acceptance_rate": a.rate,
            "acceptance_length": tau(a.drafts, a.accepted_tokens),
            "ci": None if a.ci is None else list(a.ci)}


def request_acceptance_entry(t: AcceptanceTable) -> dict[str, Any]:
    """The summary's ``request_acceptance``: what the intervals are over and their level, the overall figures,
    the histogram of verify steps by accepted draft tokens, and the figures per dataset category
    (`output.schema.RequestAcceptanceEntry` reads it back; a results run's ``per_request_acceptance`` has the same
    shape, `output.schema.run_acceptance_entry`)."""
    return {"unit": t.unit, "ci_level": t.ci_level, **acceptance_entry(t.overall),
            "acceptance_histogram": list(t.histogram),
            "by_category": {c: acceptance_entry(a) for c, a in t.by_category.items()}}


def explained_entry(e: Explained) -> dict[str, Any]:
    """The summary's ``explain``: every figure of the speedup explained (`measure.explain.Explained`), by its
    field's name (what the terminal, the report and `history` read, from a session or a file)."""
    return dataclasses.asdict(e)


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def goodput_summary(refs: list[ArmRun], specs: list[ArmRun], paired: list[Any]) -> dict[str, Any]:
    """A test with goodput SLOs: its goodput ratio (the geometric mean of the pairs' spec/ref, as the speedup's),
    each arm's mean goodput (req/s, a run that met no SLO counting 0) over its valid runs, and the kept pairs whose
    ratio is undefined with why (`record.goodput_undefined`). Empty for a test without SLOs: nothing new to show."""
    if not any(r.goodput_req_s is not None for r in (*refs, *specs)):
        return {}
    ratios = [goodput_ratio(p) for p in paired]
    arm = [r for r in specs if r.valid] if specs else [r for r in refs if r.valid]
    return {
        "goodput": geomean(ratios) if specs else None,
        "goodput_pairs": sum(r is not None for r in ratios) if specs else None,
        "goodput_undefined": [{"index": i, "why": why} for i, why in goodput_undefined(paired)],
        "goodput_req_s": _mean([r.goodput_req_s for r in arm]),
        "reference_goodput_req_s": _mean([r.goodput_req_s for r in refs if r.valid]),
    }
