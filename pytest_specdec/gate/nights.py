"""One night's runs as the gate reads them: typed, whether they were measured tonight (`Night.from_result`)
or read back from a baseline file or a results file (`Night.from_entry`). Both feed the one definition of
every verdict metric's per-run values (`Night.metric_values`), so a stored night and tonight can never be
measured by two different rules.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_specdec.gate.registry import METRICS

if TYPE_CHECKING:
    from pytest_specdec.measure.metrics import SpecFigures
    from pytest_specdec.measure.runner import CaseResult, RunRecord

#: The latencies whose per-run P95 (Harrell-Davis, ms) gets a verdict, by `RunRecord.hd_p95_ms` key.
LATENCIES: tuple[str, ...] = tuple(m.name.removesuffix("_p95_ms") for m in METRICS
                                   if m.absolute and m.kind == "latency")


def accepted_counts(spec: SpecFigures | None) -> list[int] | None:
    """Accepted tokens per draft position as counts, as a baseline stores them (the run's per-position
    rates times its drafts)."""
    if spec is None or spec.per_position_acceptance is None:
        return None
    return [round(a * spec.drafts) for a in spec.per_position_acceptance]


@dataclass(frozen=True)
class ArmRun:
    """One run of one arm: the figures the verdict metrics are made of."""

    index: int
    valid: bool
    timed: bool  # its latencies can be trusted: the stream arrived as the engine made it
    output_tok_s: float | None
    acceptance_rate: float | None  # None: no spec-decode counters (the reference arm)
    draft_coverage: float | None
    drafts: int | None
    accepted_per_pos: tuple[int, ...] | None  # accepted tokens per draft position (counts, as stored)
    hd_p95_ms: Mapping[str, float | None]  # per-run P95 (Harrell-Davis) by LATENCIES name

    @classmethod
    def from_record(cls, run: RunRecord) -> ArmRun:
        m, spec = run.metrics, run.metrics.spec
        per_pos = accepted_counts(spec)
        return cls(index=run.index, valid=run.valid, timed=not run.untrusted, output_tok_s=m.output_tok_s,
                   acceptance_rate=spec and spec.acceptance_rate, draft_coverage=spec and spec.draft_coverage,
                   drafts=spec and spec.drafts, accepted_per_pos=None if per_pos is None else tuple(per_pos),
                   hd_p95_ms=dict(run.hd_p95_ms))

    @classmethod
    def from_entry(cls, d: Mapping[str, Any]) -> ArmRun:
        """A stored run (baseline or results file; the readers have checked its fields)."""
        per_pos = d.get("accepted_per_pos")
        return cls(index=d["index"], valid=d["valid"], timed=not d.get("latency_untrusted"),
                   output_tok_s=d.get("output_tok_s"), acceptance_rate=d.get("acceptance_rate"),
                   draft_coverage=d.get("draft_coverage"), drafts=d.get("drafts"),
                   accepted_per_pos=None if per_pos is None else tuple(per_pos), hd_p95_ms=d.get("hd_p95_ms") or {})


@dataclass(frozen=True)
class Night:
    """One session's runs of one test: both arms and the speedup of each interleaved pair."""

    reference: tuple[ArmRun, ...]
    spec: tuple[ArmRun, ...]
    speedup_per_pair: tuple[float | None, ...]

    @classmethod
    def from_result(cls, result: CaseResult) -> Night:
        return cls(tuple(map(ArmRun.from_record, result.reference_runs)), tuple(map(ArmRun.from_record, result.runs)),
                   tuple(result.speedup_per_pair))

    @classmethod
    def from_entry(cls, entry: Mapping[str, Any]) -> Night:
        """A stored session entry: ``{"runs": {"reference": [...], "spec": [...]}, "speedup_per_pair": [...]}``."""
        runs = entry["runs"]
        return cls(tuple(map(ArmRun.from_entry, runs["reference"])), tuple(map(ArmRun.from_entry, runs["spec"])),
                   tuple(entry.get("speedup_per_pair") or ()))

    def metric_values(self, *, untimed_too: bool = False) -> dict[str, list[float]]:
        """Per-run values of every verdict metric (valid runs only, None left out).

        The reference arm gives ``reference_tok_s``; the spec arm everything else; latencies come from the
        spec arm, or from the reference when the test has no spec arm (method ``none``), and only from runs
        whose stream was not coalesced (``untimed_too``: from those too, to tell a metric left out for
        coalesced streams from one no valid run or pair gives). A spec arm whose runs are all invalid gives
        nothing: never the other arm's figures in its place.
        """
        ref = [r for r in self.reference if r.valid]
        spec = [r for r in self.spec if r.valid]
        ref_t = [r for r in ref if r.timed or untimed_too]
        spec_t = [r for r in spec if r.timed or untimed_too]
        out: dict[str, list[float]] = {}

        def put(name: str, values: Sequence[float | None]) -> None:
            vals = [float(v) for v in values if v is not None]
            if vals:
                out[name] = vals

        put("speedup", self.speedup_per_pair)
        put("output_tok_s", [r.output_tok_s for r in spec])
        put("reference_tok_s", [r.output_tok_s for r in ref])
        put("acceptance_rate", [r.acceptance_rate for r in spec])
        width = max((len(r.accepted_per_pos or ()) for r in spec), default=0)
        for i in range(width):
            put(f"per_position_acceptance[{i}]", [
                r.accepted_per_pos[i] / r.drafts for r in spec
                if r.drafts and r.accepted_per_pos and i < len(r.accepted_per_pos)
            ])
        put("draft_coverage", [r.draft_coverage for r in spec])
        for name in LATENCIES:
            put(f"{name}_p95_ms", [r.hd_p95_ms.get(name) for r in (spec_t if self.spec else ref_t)])
        # The gated latency: spec P95 E2E ÷ reference P95 E2E of the same interleaved pair (run index), so
        # the machine's speed that night cancels as it does in the speedup. E2E, not TPOT or TTFT: a stream
        # whose chunks arrive merged still ends when the request ends.
        by_index = {r.index: r for r in ref_t}
        put("e2e_p95_ratio", [s_e2e / r_e2e for s in spec_t
                              if (r := by_index.get(s.index)) is not None
                              and (s_e2e := s.hd_p95_ms.get("e2e")) and (r_e2e := r.hd_p95_ms.get("e2e"))])
        return out
