"""The one run record (`measure.record`) and the figures written once (`measure.figures`): the pairing rule of two
interleaved arms (same run index; a run invalid on one arm drops exactly its pair, counted and said), the typed
build of tonight's run agreeing with its stored shape, τ and the geometric mean."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import replace

import pytest
from factories import measured_run, run_metrics

from pytest_specdec.gate.ab_session import ab_verdicts
from pytest_specdec.gate.baselines import arm_run_entry
from pytest_specdec.gate.nights import Night
from pytest_specdec.gate.registry import METRICS
from pytest_specdec.gate.stats import Thresholds
from pytest_specdec.measure.figures import geomean, mean_log, tau
from pytest_specdec.measure.metrics import SpecFigures
from pytest_specdec.measure.record import DISTRIBUTIONS, ArmRun, dropped, pairs, speedup_per_pair
from pytest_specdec.measure.runner import CaseResult, RunRecord
from pytest_specdec.measure.schedule import Arm
from pytest_specdec.measure.summary import summarize
from pytest_specdec.output.results import run_entry
from pytest_specdec.output.schema import summary_entry


def rec(arm: Arm, i: int, tok_s: float, *, invalid: tuple[str, ...] = (), drafts: int | None = None) -> RunRecord:
    spec = None if drafts is None else SpecFigures.from_delta(_Delta(drafts), 8)
    latency = {"p50": 10.0 + i, "p95": 20.0 + i, "p99": 30.0 + i, "mean": 12.0}
    return measured_run(arm, i, tok_s, metrics=run_metrics(tok_s, latency=latency, spec=spec), invalid=tuple(invalid),
                        hd_p95_ms={"tpot": 1.0, "ttft": 2.0, "e2e": 100.0 + i})


class _Delta:
    """A spec-decode counter delta: 300 draft tokens in ``drafts`` drafts, 60 % of them accepted, by position
    120/90/70... of k = 3."""

    def __init__(self, drafts: int) -> None:
        self.drafts, self.draft_tokens, self.accepted_tokens = drafts, 3 * drafts, 280
        self.accepted_per_pos = [120, 90, 70]
        self.generation_tokens = 8 + 280 + 400


def test_an_invalid_run_on_one_arm_drops_exactly_its_pair_and_says_so() -> None:
    reference = [rec("reference", i, 100.0) for i in range(4)]
    spec = [rec("spec", i, 200.0 + i, drafts=100) for i in range(4)]
    spec[1] = replace(spec[1], invalid=("hung",))
    refs, specs = [r.record for r in reference], [r.record for r in spec]
    assert speedup_per_pair(refs, specs) == [2.0, None, 2.02, 2.03]
    assert dropped(pairs(refs, specs)) == [(1, "the spec run is invalid")]
    summary = summarize(reference, spec)
    assert summary.pairs == 3 and summary.pairs_dropped == ((1, "the spec run is invalid"),)
    assert summary_entry(summary)["pairs_dropped"] == [{"index": 1, "why": "the spec run is invalid"}]
    assert summary.speedup == pytest.approx(geomean([2.0, 2.02, 2.03]))
    assert summary.explain is not None and summary.explain.pairs == 3  # the explain split is over the same pairs
    # the gate's paired latency ratio leaves the same pair out
    e2e = Night.from_result(CaseResult(reference, spec, summary, speedup_per_pair(refs, specs))).metric_values()
    assert len(e2e["e2e_p95_ratio"]) == 3 and len(e2e["speedup"]) == 3
    # invalid on both arms: one pair dropped, both said
    reference[1] = replace(reference[1], invalid=("disturbed",))
    assert dropped(pairs([r.record for r in reference], [r.record for r in spec])) == [
        (1, "the reference run is invalid and the spec run is invalid")]


def test_pairs_are_by_run_index_not_by_position() -> None:
    # the spec arm lost run 2 (never measured): run 3 pairs with reference run 3, not with reference run 2
    reference = [rec("reference", i, 100.0 * (i + 1)).record for i in range(4)]
    spec = [rec("spec", i, 200.0 * (i + 1)).record for i in (0, 1, 3)]
    assert speedup_per_pair(reference, spec) == [2.0, 2.0, None, 2.0]
    assert dropped(pairs(reference, spec)) == [(2, "no spec run")]
    assert dropped(pairs(reference[::-1], spec)) == [(2, "no spec run")]  # order of the lists does not matter


def test_ab_pairs_base_and_candidate_by_run_index() -> None:
    # base run 2 never measured, base run 4 invalid: each drops its own pair only, and the candidate's other runs
    # stay paired with the base's of their index (by position, candidate run 2 would meet base run 3)
    noise = [1.01, 0.99, 1.02, 0.98, 1.00, 1.03]
    base = [rec("base", i, 100.0 * (1 + i / 10)) for i in (0, 1, 3, 4, 5)]
    cand = [rec("spec", i, 100.0 * (1 + i / 10) * noise[i]) for i in range(6)]
    base[3] = replace(base[3], invalid=("hung",))
    result = CaseResult([rec("reference", i, 50.0) for i in range(6)], cand, None, [], base_runs=base)
    tok_s = next(v for v in ab_verdicts(result, Thresholds(), 0.05) if v.metric == "output_tok_s")
    assert tok_s.n_now == tok_s.n_baseline == 4
    kept = [n for i, n in enumerate(noise) if i not in (2, 4)]
    assert tok_s.delta == pytest.approx(100 * (geomean(kept) - 1), rel=1e-6)  # each candidate over its own base


def test_the_runners_record_is_the_stored_shape_read_back() -> None:
    # what a baseline or a results file stores of tonight's run reads back as the record the gate judged
    for measured in (rec("spec", 3, 180.0, drafts=100, invalid=("hung",)), rec("reference", 0, 90.0)):
        run = replace(measured, untrusted=("coalesced",))
        assert ArmRun.from_entry(run_entry(run)) == run.record
        assert ArmRun.from_entry(arm_run_entry(run.record)) == run.record


def test_the_record_follows_its_runs_validity() -> None:
    run = rec("spec", 0, 180.0, drafts=100)
    built = run.record
    assert built.valid and run.record is built  # built once, not again on every read
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.invalid = ("disturbed: slow",)  # type: ignore[misc]  # what the test checks: a run cannot change
    slow = dataclasses.replace(run, invalid=("disturbed: slow",))  # a later look's rule: a new run in its place
    assert not slow.record.valid and slow.record.invalid_reasons == ("disturbed: slow",)
    assert slow.record.output_tok_s == built.output_tok_s and run.record is built
    assert dataclasses.replace(slow, invalid=()).record.valid


def test_tau_once_for_counters_record_summary_and_explain() -> None:
    assert tau(100, 280) == pytest.approx(3.8) and tau(0, 5) is None and tau(None, None) is None
    run = rec("spec", 0, 180.0, drafts=100)
    assert run.metrics.spec is not None
    assert run.metrics.spec.acceptance_length == run.record.acceptance_length == pytest.approx(3.8)
    summary = summarize([rec("reference", 0, 90.0)], [run])
    assert summary.explain is not None and summary.acceptance_length == summary.explain.tau == pytest.approx(3.8)


def test_geomean_and_mean_log() -> None:
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert geomean([None, 0.0, 4.0]) == pytest.approx(4.0)  # None and non-positive values are left out
    assert geomean([]) is None and geomean([None]) is None
    assert mean_log([math.e, math.e ** 3]) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="positive"):
        mean_log([1.0, 0.0])


def test_distributions_are_the_registrys_latencies() -> None:
    assert set(DISTRIBUTIONS) == {m.name.replace("_p95_ms", "_ms") for m in METRICS
                                  if m.kind == "latency" and m.name.endswith("_p95_ms")}
