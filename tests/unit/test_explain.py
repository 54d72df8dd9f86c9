"""The speedup explained (`measure.explain`): τ both ways against a known truth, the predicted speedup and the
efficiency from step times, and the split of a speedup change, which must add up exactly."""

from __future__ import annotations

import math

import numpy as np
import pytest
from factories import ab_judgement, arm_run

from pytest_specdec.gate.nights import Night
from pytest_specdec.gate.verdicts import explained
from pytest_specdec.measure.explain import chain_tau, cost_per_million, explain, iid_alpha, iid_tau, split
from pytest_specdec.measure.record import ArmRun
from pytest_specdec.output.schema import split_entry, split_of

TRUE_TAU = (1 - 0.7 ** 4) / (1 - 0.7)  # 2.533: k = 3, every position accepted with 0.7 given the ones before


def simulated_counters(alpha: float, k: int, drafts: int, seed: int = 0) -> list[int]:
    """Accepted tokens per position over ``drafts`` drafts, accepted in order with chance ``alpha`` each until
    the first rejection (vLLM's chain acceptance)."""
    rng = np.random.default_rng(seed)
    accepted = rng.random((drafts, k)) < alpha
    chain = np.cumprod(accepted, axis=1)  # position i counts only when every position before it was accepted
    return [int(x) for x in chain.sum(axis=0)]


def run(index: int, *, tok_s: float, tpot_ms: float, per_pos: list[int] | None = None, drafts: int = 0,
        valid: bool = True) -> ArmRun:
    """One run as the run record has it, its TPOT (each percentile) ``tpot_ms``; a spec run where ``per_pos``."""
    return arm_run(index, tok_s, per_pos=per_pos, drafts=drafts, valid=valid, draft_coverage=None,
                   total_output_tokens=100, tpot_ms={"p50": tpot_ms, "p95": tpot_ms, "p99": tpot_ms}, hd_p95_ms={})


def test_tau_of_a_known_iid_acceptance() -> None:
    assert TRUE_TAU == pytest.approx(2.533, abs=5e-4)
    drafts = 20_000
    per_pos = simulated_counters(0.7, 3, drafts)
    tau = chain_tau(drafts, per_pos)
    alpha = iid_alpha(drafts, per_pos)
    assert tau is not None and alpha is not None
    assert tau == pytest.approx(TRUE_TAU, rel=0.02)
    assert iid_tau(alpha, 3) == pytest.approx(TRUE_TAU, rel=0.02)
    assert alpha == pytest.approx(0.7, abs=0.01)
    # vLLM's acceptance rate (accepted ÷ drafted) is not the α of the formula: it would say 1.9, not 2.5
    assert iid_tau(sum(per_pos) / (3 * drafts), 3) < 0.8 * TRUE_TAU


def test_non_uniform_acceptance_parts_the_two_taus() -> None:
    # the first position nearly always accepted, the later ones rarely: the chain τ is what vLLM measures
    drafts = 1000
    per_pos = [950, 200, 40]
    alpha = iid_alpha(drafts, per_pos)
    assert alpha is not None
    assert chain_tau(drafts, per_pos) == pytest.approx(2.19)
    assert abs(iid_tau(alpha, 3) - 2.19) > 0.1


def test_explained_figures_from_step_times() -> None:
    # τ 2.5 (k=3), reference 10 ms a token, spec 5 ms a token (12.5 ms a step): predicted 2.0x; measured 1.8x
    per_pos = [700, 500, 300]
    ref = [run(i, tok_s=100.0, tpot_ms=10.0) for i in range(3)]
    spec = [run(i, tok_s=180.0, tpot_ms=5.0, per_pos=per_pos, drafts=1000) for i in range(3)]
    e = explain(ref, spec)
    assert e is not None
    assert e.tau == pytest.approx(2.5) and e.k == 3 and e.pairs == 3
    assert e.ref_step_ms == pytest.approx(10.0) and e.spec_step_ms == pytest.approx(12.5)
    assert e.predicted_speedup == pytest.approx(2.0)
    assert e.speedup == pytest.approx(1.8) and e.efficiency == pytest.approx(0.72)
    assert e.draft_overhead == pytest.approx((1 / 0.72 - 1) / 3)
    # an invalid run leaves its pair; a reference arm alone explains nothing
    spec[0] = run(0, tok_s=1.0, tpot_ms=99.0, per_pos=per_pos, drafts=1000, valid=False)
    again = explain(ref, spec)
    assert again is not None and again.pairs == 2 and again.speedup == pytest.approx(1.8)
    assert explain(ref, []) is None


def test_split_adds_up_exactly_and_names_the_cause() -> None:
    ref = [run(i, tok_s=100.0, tpot_ms=10.0) for i in range(2)]
    before = explain(ref, [run(i, tok_s=200.0, tpot_ms=5.0, per_pos=[800, 600, 400], drafts=1000)
                           for i in range(2)])
    slower = explain(ref, [run(i, tok_s=160.0, tpot_ms=6.25, per_pos=[800, 600, 400], drafts=1000)
                           for i in range(2)])
    fewer = explain(ref, [run(i, tok_s=150.0, tpot_ms=5.0, per_pos=[500, 300, 100], drafts=1000)
                          for i in range(2)])
    s = split(before, slower)
    assert s is not None
    assert s.speedup_log == pytest.approx(s.acceptance_log + s.step_log, abs=1e-12)
    d = split_entry(s)
    assert d["speedup_change_pct"] == pytest.approx(-20.0) and d["tau_change_pct"] == pytest.approx(0.0)
    assert d["step_change_pct"] == pytest.approx(25.0) and s.cause() == "step time"
    s = split(before, fewer)
    assert s is not None and s.cause() == "acceptance"
    assert s.speedup_log == pytest.approx(s.acceptance_log + s.step_log, abs=1e-12)
    assert math.isclose(s.tau_change_pct, 100 * (1.9 / 2.8 - 1))
    assert split_of(split_entry(s)) == s  # the results file reads back what it wrote


def night(ref_tok_s: float, spec_tok_s: float) -> Night:
    ref = [run(i, tok_s=ref_tok_s, tpot_ms=10.0) for i in range(2)]
    spec = [run(i, tok_s=spec_tok_s, tpot_ms=5.0, per_pos=[800, 600, 400], drafts=1000) for i in range(2)]
    return Night(tuple(ref), tuple(spec), (spec_tok_s / ref_tok_s,) * 2)


def test_nights_pooled() -> None:
    # a baseline's sessions: each night's own pairs, whatever the machine's speed that night
    pooled = explained([night(100.0, 200.0), night(50.0, 100.0)])
    assert pooled is not None and pooled.pairs == 4 and pooled.speedup == pytest.approx(2.0)
    assert pooled.tau == pytest.approx(2.8)


def test_cost_per_million() -> None:
    assert cost_per_million(1000.0, 3.6) == pytest.approx(1.0)
    assert cost_per_million(None, 3.6) is None and cost_per_million(1000.0, None) is None


def test_ab_cause_reads_the_split() -> None:
    ref = [run(i, tok_s=100.0, tpot_ms=10.0) for i in range(2)]
    base = explain(ref, [run(i, tok_s=200.0, tpot_ms=5.0, per_pos=[800, 600, 400], drafts=1000) for i in range(2)])
    slower = split(base, explain(ref, [run(i, tok_s=150.0, tpot_ms=6.7, per_pos=[800, 600, 400], drafts=1000)
                                       for i in range(2)]))
    # tok/s regressed with the acceptance verdict still open: the split has measured where the drop is
    assert ab_judgement(split=slower, output_tok_s="regressed", acceptance_rate="inconclusive").cause() == "step time"
    assert ab_judgement(split=None, output_tok_s="regressed", acceptance_rate="inconclusive").cause() is None
    assert ab_judgement(split=slower, output_tok_s="unchanged", acceptance_rate="unchanged").cause() is None
