"""A test's summary over its valid runs: per-pair speedups, geometric means for rates, pooled counters for
acceptance, medians of per-run percentiles for latencies, the speedup explained (`explain.py`); and each run's
Harrell-Davis P95s."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pytest_specdec.measure.metrics import RunMetrics
    from pytest_specdec.measure.types import LoadResult


class RunRecord(Protocol):
    """What the summary reads of a run (`runner.RunRecord`, which imports this module)."""

    metrics: RunMetrics

    @property
    def valid(self) -> bool: ...

    @property
    def latency_trusted(self) -> bool: ...

    def to_dict(self) -> dict[str, Any]: ...


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


def geomean(values: list[float]) -> float | None:
    vals = [v for v in values if v is not None and v > 0]
    return math.exp(sum(map(math.log, vals)) / len(vals)) if vals else None


def _median(values: list[float]) -> float | None:
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return None
    mid = len(vals) // 2
    return vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2


def speedups(reference: list[RunRecord], spec: list[RunRecord]) -> list[float | None]:
    """Per pair i: spec tok/s / reference tok/s, None when either run of the pair is invalid."""
    out: list[float | None] = []
    for ref, sp in zip(reference, spec):
        r, s = ref.metrics.output_tok_s, sp.metrics.output_tok_s
        out.append(s / r if ref.valid and sp.valid and r and s else None)
    return out


def summarize(reference: list[RunRecord], spec: list[RunRecord]) -> dict[str, Any]:
    """The test's summary over valid runs: geometric means for rates, pooled counters for acceptance,
    medians of per-run percentiles for latencies (of the spec arm; the reference's when no spec arm)."""
    ref_ok = [r for r in reference if r.valid]
    arm = [r for r in spec if r.valid] if spec else ref_ok
    timed = [r for r in arm if r.latency_trusted]  # a coalesced stream's latencies are left out
    pair = [s for s in speedups(reference, spec) if s is not None]
    figures = [r.metrics.spec for r in arm if r.metrics.spec is not None]
    drafts = sum(f.drafts for f in figures)
    draft_tokens = sum(f.draft_tokens for f in figures)
    accepted = sum(f.accepted_tokens for f in figures)
    per_pos: list[float] | None = None
    if drafts:
        width = max(len(f.per_position_acceptance or []) for f in figures)
        per_pos = [
            sum((f.per_position_acceptance or [0] * width)[i] * f.drafts for f in figures) / drafts
            for i in range(width)
        ]
    steps = sum(f.decode_steps or 0 for f in figures)

    def latency(name: str) -> dict[str, float | None]:
        return {
            p: _median([(getattr(r.metrics, name) or {}).get(p) for r in timed])  # type: ignore[misc]
            for p in ("p50", "p95", "p99")
        }

    from pytest_specdec.measure.explain import explain

    explained = explain([r.to_dict() for r in reference], [r.to_dict() for r in spec]) if spec else None
    return {
        "valid_runs": len(arm),
        "latency_runs": len(timed),
        "valid_reference_runs": len(ref_ok),
        "output_tok_s": geomean([r.metrics.output_tok_s for r in arm]),  # type: ignore[misc]
        "reference_tok_s": geomean([r.metrics.output_tok_s for r in ref_ok]),  # type: ignore[misc]
        "speedup": geomean(pair) if spec else None,
        "acceptance_rate": accepted / draft_tokens if draft_tokens else None,
        "acceptance_length": 1 + accepted / drafts if drafts else None,
        "per_position_acceptance": per_pos,
        "draft_coverage": min(1.0, drafts / steps) if steps and spec else None,
        "ttft_ms": latency("ttft_ms"),
        "tpot_ms": latency("tpot_ms"),
        "itl_token_ms": latency("itl_token_ms"),
        "itl_chunk_ms": latency("itl_chunk_ms"),
        "e2e_ms": latency("e2e_ms"),
        # τ, step times, predicted speedup, verification efficiency, draft overhead (measure/explain.py)
        "explain": None if explained is None else explained.to_dict(),
    }
