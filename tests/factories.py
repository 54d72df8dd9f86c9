"""The gate's values built for tests: a verdict, a stored run, a stored night and an A/B look's judgement, and a run
as the runner records it (`measured_run`), each with sensible defaults that a test overrides by keyword, naming only
what it is about.

A stored run and a stored night come as the dicts a baseline file holds (``run_entry``, ``night_entry``), which
the readers check and `gate.verdicts.evaluate` takes, or as the typed values built from them (``arm_run``,
``night``), which is how the gate reads a stored night too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pytest_specdec.gate.ab_session import ABJudgement, ABPlan
from pytest_specdec.gate.check import Look
from pytest_specdec.gate.kinds import REGRESSED
from pytest_specdec.gate.nights import Night
from pytest_specdec.gate.stats import Thresholds, Verdict
from pytest_specdec.measure.metrics import RunMetrics, SpecFigures
from pytest_specdec.measure.record import DISTRIBUTIONS, ArmRun
from pytest_specdec.measure.runner import RunRecord

#: A conclusive regressed speedup: 2.0x → 1.5x, -25 % (CI -30 to -20 %), p 0.001, five runs a side.
VERDICT: dict[str, Any] = dict(metric="speedup", verdict=REGRESSED, baseline=2.0, now=1.5, delta=-25.0, ci_low=-30.0,
                               ci_high=-20.0, p=0.001, n_baseline=5, n_now=5, unit="%", method="welch-log",
                               threshold=-5.0, note="")

#: A spec run's accepted tokens per draft position (k = 3) over its 100 drafts: 180 of 300 drafted, 0.6.
PER_POS = (80, 60, 40)


def verdict(**fields: Any) -> Verdict:
    """``VERDICT`` with ``fields`` (any of `Verdict`'s) in place of its own."""
    return Verdict(**{**VERDICT, **fields})


def pair_verdict(metric: str, word: str) -> Verdict:
    """An A/B look's verdict of ``metric``: ``word``, gated, pair by pair over 8 pairs that measured no change."""
    return verdict(metric=metric, verdict=word, baseline=1.0, now=1.0, delta=0.0, ci_low=0.0, ci_high=0.0, p=0.5,
                   n_baseline=8, n_now=8, method="paired-t", family="gated", per="pair")


def ab_judgement(*raw: Verdict, checked: bool = True, split: Any = None, **words: str) -> ABJudgement:
    """A test's A/B judgement (eagle3, drafts /a and /b) after one look of 8 pairs that gave the ``raw`` verdicts
    and, for each ``metric=word``, ``pair_verdict(metric, word)``; ``checked=False``: `specdec_verdicts(check=False)`;
    ``split``: the speedup's split, which the cause reads."""
    look = Look(8, (*raw, *(pair_verdict(metric, word) for metric, word in words.items())))
    return ABJudgement(ABPlan("eagle3", "/a", "/b", {}, Thresholds(), checked=checked), (look,), split=split)


def run_entry(index: int = 0, tok_s: float | None = 100.0, *, per_pos: Sequence[float] | None = PER_POS,
              drafts: int = 100, invalid: str | None = None, **fields: Any) -> dict[str, Any]:
    """A stored run, every field a baseline file holds: ``tok_s`` output tok/s over 8 requests; a spec run whose
    ``drafts`` drafts accepted ``per_pos`` tokens per position (its counters and acceptance follow from them, draft
    coverage 1.0), or with ``per_pos=None`` one without spec-decode counters (a reference run); invalid where
    ``invalid`` says why; no latency distributions, and per-run P95s of 5, 20 and 100 ms (TPOT, TTFT, E2E) plus
    the index, so that runs differ. ``fields`` replace any of these."""
    counters: dict[str, Any] = dict.fromkeys(("drafts", "draft_tokens", "accepted_tokens", "accepted_per_pos",
                                              "acceptance_rate", "draft_coverage"))
    if per_pos is not None:
        counters = {"drafts": drafts, "draft_tokens": drafts * len(per_pos), "accepted_tokens": sum(per_pos),
                    "accepted_per_pos": list(per_pos), "acceptance_rate": sum(per_pos) / (drafts * len(per_pos)),
                    "draft_coverage": 1.0}
    entry: dict[str, Any] = {
        "index": index, "valid": invalid is None, "invalid_reasons": [] if invalid is None else [invalid],
        "latency_untrusted": [], "output_tok_s": tok_s, "n_requests": 8, "total_output_tokens": 192, **counters,
        **dict.fromkeys(DISTRIBUTIONS), "hd_p95_ms": {"tpot": 5.0 + index, "ttft": 20.0 + index, "e2e": 100.0 + index},
    }
    return {**entry, **fields}


def arm_run(index: int = 0, tok_s: float | None = 100.0, **kw: Any) -> ArmRun:
    """``run_entry(index, tok_s, **kw)`` as the gate reads it."""
    return ArmRun.from_entry(run_entry(index, tok_s, **kw))


def night_entry(reference: Sequence[Mapping[str, Any]], spec: Sequence[Mapping[str, Any]], *,
                speedup_per_pair: Sequence[float | None] | None = None, started: str = "s",
                machine_state: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A stored night of these runs (``run_entry``'s), nothing under test recorded; each pair's speedup its spec
    run's tok/s over its reference run's (None where either is invalid) unless given; the machine's state only
    where given."""
    pairs = ([s["output_tok_s"] / r["output_tok_s"] if s["valid"] and r["valid"] else None
              for s, r in zip(spec, reference, strict=True)] if speedup_per_pair is None else list(speedup_per_pair))
    entry = {"started": started, "under_test": {}, "runs": {"reference": list(reference), "spec": list(spec)},
             "speedup_per_pair": pairs}
    return entry if machine_state is None else {**entry, "machine_state": machine_state}


def night(reference: Sequence[Mapping[str, Any]], spec: Sequence[Mapping[str, Any]], **kw: Any) -> Night:
    """``night_entry(reference, spec, **kw)`` as the gate reads it."""
    return Night.from_entry(night_entry(reference, spec, **kw))


def spec_figures(acceptance: float, drafts: int = 100, k: int = 3) -> SpecFigures:
    """A spec run's counters: ``drafts`` drafts of ``k`` tokens, ``acceptance`` of them accepted."""
    accepted = round(drafts * k * acceptance)
    return SpecFigures(drafts=drafts, draft_tokens=drafts * k, accepted_tokens=accepted, acceptance_rate=acceptance,
                       acceptance_length=1 + accepted / drafts)


def run_metrics(tok_s: float | None = 100.0, *, n_requests: int = 8, duration_s: float = 1.0,
                latency: Mapping[str, float] | None = None, spec: SpecFigures | None = None,
                **fields: Any) -> RunMetrics:
    """One run's figures: ``tok_s`` output tok/s over ``n_requests`` requests in ``duration_s``; every latency
    distribution ``latency`` (None: not measured); the spec-decode counters ``spec`` (None: a reference run);
    ``fields`` replace any of these."""
    dist = None if latency is None else dict(latency)
    return RunMetrics(**{**dict(n_requests=n_requests, n_failed=0, duration_s=duration_s, output_tok_s=tok_s,
                                request_s=n_requests / duration_s, total_output_tokens=round(tok_s or 0),
                                ttft_ms=dist, tpot_ms=dist, e2e_ms=dist, itl_chunk_ms=None, itl_token_ms=dist,
                                spec=spec), **fields})


def measured_run(arm: Any = "spec", index: int = 0, tok_s: float | None = 100.0, *,
                 metrics: RunMetrics | None = None, **fields: Any) -> RunRecord:
    """A run as the runner records it: ``metrics`` (default: ``run_metrics(tok_s)``), valid and unwaited; ``fields``
    are `RunRecord`'s (``invalid``, ``texts``, ``hd_p95_ms``, ``settle``, ...)."""
    return RunRecord(arm=arm, index=index, metrics=run_metrics(tok_s) if metrics is None else metrics,
                     cache_salt="s", **fields)
