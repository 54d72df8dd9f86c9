"""gate/verdicts.evaluate: which metrics get a verdict when tonight's runs lack some figures."""

from __future__ import annotations

from typing import Any

from factories import night_entry, run_entry

from pytest_specdec.gate.nights import Night
from pytest_specdec.gate.registry import GATED
from pytest_specdec.gate.stats import DEFAULT_THRESHOLDS
from pytest_specdec.gate.verdicts import evaluate


def _night(spec_valid: bool = True, ref_valid: bool = True, spec_coalesced: bool = False) -> dict[str, Any]:
    ref = [run_entry(i, 100.0 + i, per_pos=None, invalid=None if ref_valid else "server died") for i in range(3)]
    spec = [run_entry(i, 150.0 + 3 * i, invalid=None if spec_valid else "server died") for i in range(3)]
    for run in spec if spec_coalesced else ():
        run["latency_untrusted"] = ["coalesced: 3.0 tokens per event"]
    return night_entry(ref, spec)


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
