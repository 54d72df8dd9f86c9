"""gate/verdicts.evaluate: which metrics get a verdict when tonight's runs lack some figures."""

from __future__ import annotations

from typing import Any

from pytest_specdec.gate.nights import Night
from pytest_specdec.gate.registry import GATED
from pytest_specdec.gate.stats import DEFAULT_THRESHOLDS
from pytest_specdec.gate.verdicts import evaluate


def _run(index: int, tok_s: float, valid: bool = True, spec: bool = True) -> dict[str, Any]:
    return {"index": index, "valid": valid, "invalid_reasons": [] if valid else ["server died"],
            "latency_untrusted": [], "output_tok_s": tok_s, "drafts": 100 if spec else None,
            "draft_tokens": 300 if spec else None, "accepted_tokens": 180 if spec else None,
            "accepted_per_pos": [80, 60, 40] if spec else None, "acceptance_rate": 0.6 if spec else None,
            "draft_coverage": 1.0 if spec else None,
            "hd_p95_ms": {"tpot": 5.0 + index, "ttft": 20.0 + index, "e2e": 100.0 + index}}


def _night(spec_valid: bool = True, ref_valid: bool = True, spec_coalesced: bool = False) -> dict[str, Any]:
    ref = [_run(i, 100.0 + i, valid=ref_valid, spec=False) for i in range(3)]
    spec = [_run(i, 150.0 + 3 * i, valid=spec_valid) for i in range(3)]
    for run in spec if spec_coalesced else ():
        run["latency_untrusted"] = ["coalesced: 3.0 tokens per event"]
    pairs = [s["output_tok_s"] / r["output_tok_s"] if s["valid"] and r["valid"] else None for s, r in zip(spec, ref)]
    return {"started": "s", "under_test": {}, "runs": {"reference": ref, "spec": spec}, "speedup_per_pair": pairs}


def _verdicts(now: dict[str, Any]) -> dict[str, str]:
    baseline = {"sessions": [_night(), _night()]}
    return {v.metric: v.verdict
            for v in evaluate(baseline, Night.from_entry(now), thresholds=DEFAULT_THRESHOLDS, alpha=0.05)
            if v.family == "gated"}


def test_every_gated_metric_is_judged_when_tonight_has_its_figures() -> None:
    assert set(_verdicts(_night())) == set(GATED)


def test_a_gated_metric_tonight_lacks_is_inconclusive_never_left_out() -> None:
    """A dead reference arm leaves no speedup and no latency ratio: those two must still be verdicts (a missing
    gated verdict would let the test pass in silence), and never judged on the spec arm's figures alone."""
    verdicts = _verdicts(_night(ref_valid=False))
    assert verdicts == {"speedup": "inconclusive", "acceptance_rate": "unchanged", "e2e_p95_ratio": "inconclusive"}
    assert set(_verdicts(_night(spec_valid=False)).values()) == {"inconclusive"}


def test_a_gated_latency_left_out_for_coalesced_streams_stays_out() -> None:
    """Valid runs whose streams arrived merged have no trusted latencies: the gate reports the ratio as not
    judged, for that reason, rather than as an inconclusive verdict with no reason given."""
    assert _verdicts(_night(spec_coalesced=True)) == {"speedup": "unchanged", "acceptance_rate": "unchanged"}
