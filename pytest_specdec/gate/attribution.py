"""What a test's verdicts against its baseline point at: the nightly's decision, as `ab_session.ABJudgement.cause`
is the A/B's. A typed cause; `output/wording.py` (`attribution`) words it, with the verdicts it names.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Literal

from pytest_specdec.gate.kinds import REGRESSED

if TYPE_CHECKING:
    from pytest_specdec.gate.stats import Verdict
    from pytest_specdec.measure.explain import Split

#: What a test's regressed verdicts point at, the first that holds (`attribute`):
#: - "acceptance", "step time", "acceptance and step time": the speedup regressed, and its split (baseline → now,
#:   `measure.explain.Split.cause`) measures fewer accepted tokens, a dearer step, or both alike;
#: - "draft": the speedup and the acceptance regressed (no split);
#: - "speculation cost": the speedup regressed at the same acceptance (no split);
#: - "non-speculative path": the reference decoding regressed while the speedup held;
#: - "acceptance alone": the acceptance (or a per-position acceptance) regressed, the speedup not beyond its threshold;
#: - "spec throughput": spec tok/s regressed with the reference and the speedup within their thresholds;
#: - "latency": another metric regressed while the throughput figures held.
Cause = Literal["acceptance", "step time", "acceptance and step time", "draft", "speculation cost",
                "non-speculative path", "acceptance alone", "spec throughput", "latency"]
#: The causes read from the speedup's split: with one of them the split is the evidence, not a figure beside it.
SPLIT_CAUSES: frozenset[Cause] = frozenset({"acceptance", "step time", "acceptance and step time"})


def attribute(verdicts: Iterable[Verdict], split: Split | None = None) -> Cause | None:
    """What ``verdicts`` (one test's, each metric once) point at; None: nothing regressed. A regressed speedup with
    its ``split`` is pointed at what the split measures."""
    by = {v.metric: v for v in verdicts}

    def bad(name: str) -> bool:
        return name in by and by[name].verdict == REGRESSED

    if bad("speedup") and split is not None:
        return split.cause() or "acceptance and step time"
    if bad("speedup"):
        return "draft" if bad("acceptance_rate") else "speculation cost"
    if bad("reference_tok_s"):
        return "non-speculative path"
    if bad("acceptance_rate") or any(v.verdict == REGRESSED and v.metric.startswith("per_position")
                                     for v in by.values()):
        return "acceptance alone"
    if bad("output_tok_s"):
        return "spec throughput"
    if any(v.verdict == REGRESSED for v in by.values()):
        return "latency"
    return None
