"""An A/B session's pieces, called directly: the three arms' order, the A/B thresholds and pairs, the candidate's
verdicts against the base pair by pair, its looks and stop rule, what a regression is attributed to, and what the
gate refuses."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from factories import ab_judgement, measured_run, run_metrics, spec_figures

from pytest_specdec.errors import ConfigError
from pytest_specdec.gate.ab import paired, until_pairs_settle
from pytest_specdec.gate.ab_session import ABGate, ABJudgement, ABPlan, ab_thresholds, ab_verdicts
from pytest_specdec.gate.protocol import Finished, GateOptions, Planned, TestOptions
from pytest_specdec.gate.stats import Verdict
from pytest_specdec.measure.runner import CaseResult, RunRecord
from pytest_specdec.measure.schedule import Arm, schedule_ab
from pytest_specdec.output.results import ab_entry
from pytest_specdec.profiles import load_profile
from pytest_specdec.profiles.placement import Placement
from pytest_specdec.profiles.resolve import run_limits


def test_reference_first_then_base_and_candidate_alternating() -> None:
    assert schedule_ab(0, 3) == [(0, "reference"), (0, "base"), (0, "spec"), (1, "reference"), (1, "spec"),
                                 (1, "base"), (2, "reference"), (2, "base"), (2, "spec")]
    assert schedule_ab(1, 2) == [(1, "reference"), (1, "spec"), (1, "base")]  # a later look keeps the parity


def test_thresholds_defaults_profile_ini_command_line_then_marker() -> None:
    t = ab_thresholds({}, [], [], "profile")
    assert (t.per_metric["output_tok_s"], t.per_metric["e2e_p95_ms"], t.acceptance_points) == (5.0, 10.0, 2.0)
    t = ab_thresholds({"output_tok_s": 3.0, "acceptance": 1.0}, [], ["e2e_p95_ms=20"], "profile")
    assert (t.per_metric["output_tok_s"], t.per_metric["e2e_p95_ms"], t.acceptance_points) == (3.0, 20.0, 1.0)
    assert "output_tok_s" not in ab_thresholds({}, [], ["rate=8"], "profile").per_metric  # a later kind wins
    t = ab_thresholds({"output_tok_s": 3.0}, ["output_tok_s=7", "e2e_p95_ms=30"], ["e2e_p95_ms=20"], "profile",
                      {"output_tok_s": 9.0})
    assert (t.per_metric["output_tok_s"], t.per_metric["e2e_p95_ms"]) == (9.0, 20.0)  # marker > cli > ini > profile
    with pytest.raises(ConfigError, match="--specdec-threshold: unknown metric 'tok_s'"):
        ab_thresholds({}, [], ["tok_s=5"], "profile")
    with pytest.raises(ConfigError, match="ini specdec_thresholds: unknown metric 'tok_s'"):
        ab_thresholds({}, ["tok_s=5"], [], "profile")


def test_pairs_from_the_profile_unless_given() -> None:
    cpu = load_profile("cpu")
    assert run_limits(cpu, None, None, ab=True) == ((12, 24), None)  # looks from ab_first_look up to ab_runs
    assert run_limits(cpu, 6, None, ab=True) == ((6, 24), None)  # looks from 6 pairs up to ab_runs
    assert run_limits(cpu, 6, 30, ab=True) == ((6, 30), None)  # ... or up to --specdec-max-runs
    assert run_limits(cpu, 30, None, ab=True) == ((30, 30), None)
    with pytest.raises(ConfigError,
                       match=r"--specdec-max-runs 5 is below the runs per test \(12, \[matrix\] ab_first_look"):
        run_limits(cpu, None, 5, ab=True)
    assert run_limits(cpu, None, None) == ((4, 4), None)


def run(arm: Arm, i: int, tok_s: float, acceptance: float | None = 0.8, e2e: float = 100.0,
        valid: bool = True) -> RunRecord:
    spec = None if acceptance is None else spec_figures(acceptance)
    return measured_run(arm, i, tok_s, metrics=run_metrics(tok_s, spec=spec), invalid=() if valid else ("broken",),
                        hd_p95_ms={"e2e": e2e})


NOISE = [1.00, 1.03, 0.98, 1.02, 0.99, 1.01, 0.97, 1.02]


def case(candidate_speed: float, candidate_acceptance: float = 0.8, invalid: int | None = None) -> CaseResult:
    base = [run("base", i, 500 * n, e2e=100 / n) for i, n in enumerate(NOISE)]
    cand = [run("spec", i, 500 * n * candidate_speed * (1.01 if i % 2 else 0.99), candidate_acceptance,
                e2e=100 / (n * candidate_speed), valid=i != invalid) for i, n in enumerate(NOISE)]
    return CaseResult(reference_runs=[], runs=cand, summary=None, speedup_per_pair=[], base_runs=base)


def by_metric(verdicts: list[Verdict]) -> dict[str, Verdict]:
    return {v.metric: v for v in verdicts}


def test_candidate_judged_against_the_base_pair_by_pair() -> None:
    v = by_metric(ab_verdicts(case(0.7), ab_thresholds({}, [], [], "p"), 0.05))
    assert list(v) == ["output_tok_s", "acceptance_rate", "e2e_p95_ms"]
    assert all(x.family == "gated" for x in v.values())
    assert v["output_tok_s"].verdict == "regressed" and -32 < v["output_tok_s"].delta < -28
    assert v["e2e_p95_ms"].verdict == "regressed" and v["acceptance_rate"].verdict == "unchanged"
    same = by_metric(ab_verdicts(case(1.0), ab_thresholds({}, [], [], "p"), 0.05))
    assert same["output_tok_s"].verdict == "unchanged", same["output_tok_s"]
    # An invalid candidate run takes its pair out; the base's run of that pair is not judged alone.
    assert by_metric(ab_verdicts(case(1.0, invalid=3), ab_thresholds({}, [], [], "p"), 0.05))["output_tok_s"].n_now == 7


def plan(g: ABGate) -> ABJudgement:
    """A test's A/B judgement before its first look, as `ABGate.start` plans it."""
    looks = g.planned_looks
    return ABJudgement(ABPlan("eagle3", "/a", "/b", {}, g.thresholds, looks=looks, max_looks=len(looks)))


def test_attribution() -> None:
    assert ab_judgement(output_tok_s="regressed", acceptance_rate="regressed").cause() == "acceptance"
    assert ab_judgement(output_tok_s="unchanged", acceptance_rate="regressed").cause() == "acceptance"
    assert ab_judgement(output_tok_s="regressed", acceptance_rate="unchanged").cause() == "step time"
    assert ab_judgement(output_tok_s="regressed", acceptance_rate="inconclusive").cause() is None  # nothing to point at
    assert ab_judgement(output_tok_s="unchanged", acceptance_rate="unchanged", e2e_p95_ms="regressed").cause() is None
    # On another install: the reference slowed too and the speedup did not regress -> not speculation.
    assert ab_judgement(output_tok_s="regressed", acceptance_rate="unchanged", reference_tok_s="regressed",
                        speedup="inconclusive").cause() == "non-speculative path"
    assert ab_judgement(output_tok_s="regressed", acceptance_rate="unchanged", reference_tok_s="regressed",
                        speedup="regressed").cause() == "step time"


def gate(profile_path: str = "cpu", runs: int = 8, max_runs: int = 8, **drafts: str) -> ABGate:
    return ABGate(load_profile(profile_path), drafts or {"eagle3": "/heads/old"}, GateOptions(runs, max_runs))


def planned(method: str = "eagle3", nodeid: str = "t", **options: Any) -> Planned:
    return Planned(nodeid, method, 3, None, TestOptions(**options))


def test_gate_base_profile_and_refusals(tmp_path: Path) -> None:
    g = gate()
    assert g.base.methods["eagle3"]["model"] == "/heads/old" and g.profile.methods["eagle3"]["model"] != "/heads/old"
    assert g.skip_reason("eagle3", None) is None
    assert "method 'ngram' has no base" in (g.skip_reason("ngram", None) or "")
    assert "its own speculative_config" in (g.skip_reason("eagle3", {"method": "eagle3"}) or "")
    assert Placement(g.profile, False, 2, None, 4, "127.0.0.1", 3).max_alive() == 3  # the third server fits
    with pytest.raises(ConfigError, match=r"--specdec-base-draft medusa=\.\.\.: method 'medusa' is not in profile"):
        gate(medusa="/x")
    with pytest.raises(ConfigError, match="--specdec-base-draft ngram=...: method 'ngram' .* has no draft model"):
        gate(ngram="/x")
    # Servers that cannot be alive at once take blocks (`schedule_ab`), so nothing is refused for it.
    assert Placement(g.profile, False, 1, None, 4, "127.0.0.1", 3).block_runs() == 2


def test_schedule_ab_orders_three_or_four_arms_interleaved_or_in_blocks() -> None:
    from pytest_specdec.measure.schedule import schedule_ab

    assert schedule_ab(0, 2, installs=True) == [
        (0, "base_reference"), (0, "reference"), (0, "base"), (0, "spec"),
        (1, "reference"), (1, "base_reference"), (1, "spec"), (1, "base")]
    # One server at a time: blocks of 2 pairs per arm, the arms' order reversed every block (ABBA), so the
    # server up at a block's end serves the next block's start; a later look continues the parity.
    assert schedule_ab(0, 3, block=2) == [
        (0, "reference"), (1, "reference"), (0, "base"), (1, "base"), (0, "spec"), (1, "spec"),
        (2, "spec"), (2, "base"), (2, "reference")]
    assert schedule_ab(3, 5, installs=True, block=2, block_index=2)[:2] == [(3, "base_reference"),
                                                                           (4, "base_reference")]
    with pytest.raises(ValueError, match="block must be >= 1"):
        schedule_ab(0, 2, block=0)


def test_test_end_pads_the_family_and_the_end_adjusts_it_whole() -> None:
    g = gate()
    first = ab_judgement(*ab_verdicts(case(0.9), g.thresholds, 0.05))
    collected = [planned()] * 40 + [planned("ngram")]  # 40 A/B tests: 120 verdicts
    ended, end = g.test_end("t1", [("t1", first)], collected)
    # one p-value so far (the P95s and acceptance of these runs repeat exactly: the exact rule), 119 unseen
    assert "119 without a p-value" in by_metric(ended.verdicts)["output_tok_s"].note and ended.failed
    assert (end.outcome, end.fails) == ("regressed", True) and ended.end == end and not first.failed
    # a marker's gate=[...] adds to the padding: 40 tests, each with tpot_p95_ms too
    padded, _ = g.test_end("t1", [("t1", first)], [planned(gate=("tpot_p95_ms",))] * 40)
    assert "159 without a p-value" in by_metric(padded.verdicts)["output_tok_s"].note
    session = g.finish([Finished("t1", ended, None, "failed")])
    assert session.late_regressions == ()  # it failed at its end already
    final = dict(session.judged)["t1"]
    assert final.final is not None and "without a p-value" not in by_metric(final.final)["output_tok_s"].note
    # as if its end had not called it: regressed only over the whole family
    assert [n for n, _ in g.finish([Finished("t1", first, None, "passed")]).late_regressions] == ["t1"]
    opted = ab_judgement(*first.raw, checked=False)  # specdec_verdicts(check=False): shown, never failed
    ended, end = g.test_end("t1", [("t1", opted)], collected)
    assert not end.fails and not ended.failed
    assert g.finish([Finished("t1", ended, None, "passed")]).late_regressions == ()


def test_inconclusive_warns_or_fails_under_fail_inconclusive() -> None:
    few = dataclasses.replace(case(1.0), runs=case(1.0).runs[:1], base_runs=case(1.0).base_runs[:1])
    for fail in (False, True):
        g = ABGate(load_profile("cpu"), {"eagle3": "/heads/old"}, GateOptions(1, 1, fail_inconclusive=fail))
        c = ab_judgement(*ab_verdicts(few, g.thresholds, 0.05))  # one pair: too little data
        c, end = g.test_end("t1", [("t1", c)], [planned()])
        assert (end.outcome, end.fails, c.failed) == ("inconclusive", fail, fail)
        assert [v.metric for v in end.open] == ["output_tok_s", "acceptance_rate", "e2e_p95_ms"]


def stepped_gate(runs: int, max_runs: int, step: int) -> ABGate:
    """`gate` with the profile's [matrix] ab_look_step set to ``step``."""
    cpu = load_profile("cpu")
    profile = dataclasses.replace(cpu, matrix={**cpu.matrix, "ab_look_step": step})
    return ABGate(profile, {"eagle3": "/heads/old"}, GateOptions(runs, max_runs))


def upto(n: int, speed: float) -> CaseResult:
    full = case(speed)
    return dataclasses.replace(full, runs=full.runs[:n], base_runs=full.base_runs[:n])


def test_looks_add_pairs_while_more_could_settle_a_verdict() -> None:
    """The A/B's sequential looks (`ABGate.look`): alpha split over the planned looks (2, 4, 6 pairs: the profile's
    ab_look_step), another look while a gated verdict is inconclusive and more pairs could settle it; it stops on a
    regression once it holds at the session family's level, and says why and after how many pairs."""
    assert gate(runs=2, max_runs=6).planned_looks == (2, 6)  # cpu's step of 12
    g = stepped_gate(2, 6, 2)
    assert g.planned_looks == (2, 4, 6)
    g.refuse([planned()])  # one test: a family of 3 gated verdicts
    c, step = g.look("t1", plan(g), upto(2, 0.9), 1)  # two pairs at alpha/3: the -10 % is not yet significant
    assert by_metric(c.raw)["output_tok_s"].verdict == "inconclusive" and step.next_runs == 4, c.raw
    assert "inconclusive at look 1 of 3: 4 pairs" in step.line
    c, step = g.look("t1", c, upto(4, 0.9), 2)
    assert by_metric(c.raw)["output_tok_s"].verdict == "regressed" and step.next_runs is None
    assert c.looks == [2, 4] and c.unspent == 2 and c.stop_reason == "every gated verdict is conclusive"
    assert c.stop == "regressed" and "stopped at 4 of 6 pairs (regressed)" in step.line
    entry = ab_entry(c, None)
    assert entry["pairs"] == 4 and entry["max_pairs"] == 6 and entry["stop"] == "regressed"
    assert "p x3 (Bonferroni over looks)" in by_metric(c.raw)["output_tok_s"].note
    # One usable pair: too little data, and more pairs bring it (the nightly's rule alone would stop there).
    one = ab_verdicts(upto(1, 1.0), g.thresholds, 0.05)
    assert until_pairs_settle(one, 1, 6, 0.05) is None and until_pairs_settle(one, 6, 6, 0.05) is not None


def test_a_regression_the_family_could_take_back_does_not_stop_a_test() -> None:
    """In a family of 100 tests the same -10 % at 4 pairs is regressed on its own but not at p x 300 (the end's BH
    could take it back), so the test takes its last look instead of stopping on it; at the maximum it says so."""
    g = stepped_gate(2, 6, 2)
    g.refuse([planned(nodeid=f"t{i}") for i in range(100)])
    assert g.family_size == 300
    c, _ = g.look("t1", plan(g), upto(2, 0.9), 1)
    c, step = g.look("t1", c, upto(4, 0.9), 2)
    assert by_metric(c.raw)["output_tok_s"].verdict == "regressed" and step.next_runs == 6, c.raw
    c, step = g.look("t1", c, upto(6, 0.9), 3)
    assert step.next_runs is None and c.stop == "max reached" and c.unspent == 0


def test_an_aa_test_stops_on_equivalence() -> None:
    """An A/A whose CIs fall inside ±threshold stops at its first look with every gated verdict unchanged."""
    g = stepped_gate(4, 8, 4)
    g.refuse([planned()])
    c, step = g.look("t1", plan(g), upto(4, 1.0), 1)
    assert step.next_runs is None and c.stop == "equivalence" and c.unspent == 4, c.raw
    assert {v.verdict for v in c.raw} == {"unchanged"}


def test_marker_and_ini_fields_an_ab_cannot_apply_are_refused_by_name() -> None:
    g = gate()
    g.refuse([planned(gate=("tpot_p95_ms",), thresholds={"latency": 20.0, "e2e_p95_ms": 30.0})])  # applies
    g.refuse([planned("ngram", gate=("speedup",))])  # a test without an A/B comparison is skipped, not refused
    with pytest.raises(ConfigError, match=r"t: specdec_verdicts\(gate=\['speedup'\]\): an A/B session .* cannot "
                                          r"gate speedup; it may gate output_tok_s"):
        g.refuse([planned(gate=("speedup",))])
    with pytest.raises(ConfigError, match=r"t: specdec_verdicts\(thresholds=...\): an A/B session does not judge "
                                          r"e2e_p95_ratio \(it judges output_tok_s, acceptance_rate, e2e_p95_ms\)"):
        g.refuse([planned(thresholds={"e2e_p95_ratio": 20.0})])
    with pytest.raises(ConfigError, match="ini specdec_gate names e2e_p95_ratio, which an A/B session cannot gate"):
        ABGate(load_profile("cpu"), {"eagle3": "/x"}, GateOptions(8, 8, gate=("e2e_p95_ratio",)))


def test_a_base_arm_without_a_valid_run_is_a_dead_arm() -> None:
    """`nights.dead_arms`, the one rule for an arm never judged on another's figures, covers an A/B base arm."""
    from types import SimpleNamespace

    from pytest_specdec.measure.record import dead_arms

    ok, bad = SimpleNamespace(valid=True), SimpleNamespace(valid=False)
    assert dead_arms([ok], [ok], [bad, bad]) == ["base"]
    assert dead_arms([ok], [ok], [bad, ok]) == [] and dead_arms([ok], [ok]) == []
    assert dead_arms([bad], [ok], [bad]) == ["reference", "base"]


def test_an_early_stop_reads_the_same_at_the_tests_end_and_the_sessions() -> None:
    """A test that stopped `regressed` at its first look (at p x the 60 gated verdicts of 20 planned tests) stays
    `regressed` after the test end's BH padded to 60 and after the session's BH; an A/A that stopped on
    equivalence stays `unchanged` (its CI never moves with p); one regressed on its own but not at the family's
    level takes more pairs instead of stopping on a verdict its end would take back."""
    from pytest_specdec.gate.kinds import REGRESSED, UNCHANGED

    g = stepped_gate(4, 8, 4)
    g.refuse([planned(nodeid=f"t{i}") for i in range(20)])
    checks = []
    # t3's -5.5 % at 4 pairs is regressed on its own (p x 2 looks ~0.002) but not at p x 60 (~0.13), which the
    # test end's BH padded to 60 would take back: it takes its second look, the last, and regresses there.
    for nodeid, speed in (("t0", 0.7), ("t1", 1.0), ("t2", 1.0), ("t3", 0.945)):
        c = plan(g)
        for look, n in enumerate(g.planned_looks, start=1):
            c, step = g.look(nodeid, c, upto(n, speed), look)
            if step.next_runs is None:
                break
        checks.append((nodeid, c))
    assert [c.stop for _, c in checks] == ["regressed", "equivalence", "equivalence", "max reached"]
    assert [c.looks for _, c in checks] == [[4], [4], [4], [4, 8]]
    ended = [g.test_end(nodeid, checks, [planned(nodeid=f"t{i}") for i in range(20)])[0] for nodeid, _ in checks]
    session = g.finish([Finished(n, c, None, "passed") for (n, _), c in zip(checks, ended, strict=True)])
    for at_end, (n, final) in zip(ended, session.judged, strict=True):
        want = UNCHANGED if final.stop == "equivalence" else REGRESSED
        assert by_metric(at_end.verdicts)["output_tok_s"].verdict == want, (n, at_end.verdicts)
        assert by_metric(final.shown())["output_tok_s"].verdict == want, (n, final.final)


def test_in_blocks_the_unit_is_the_block() -> None:
    # A CI A/A session with one server at a time (blocks of 3 pairs; the stand-in's speed rose as the machine's
    # load fell): pair by pair it read "regressed" -5.1 %; a block's pairs share that drift, so the unit is the block.
    base = [632.9, 647.8, 668.2, 709.5, 697.2, 698.9]
    cand = [638.5, 619.2, 630.4, 697.0, 645.8, 617.8]
    assert paired("output_tok_s", base, cand).verdict == "regressed"
    v = paired("output_tok_s", base, cand, blocks=[0, 0, 0, 1, 1, 1])
    assert v.verdict == "inconclusive" and v.df == 1 and "unit: block of base/candidate pairs (2 block(s)" in v.note, v
    assert paired("output_tok_s", base, cand, blocks=[0] * 6).note.startswith("too little data: 1 block, need 2")
    # a pair left out leaves its block; every pair its own block is the pairs' t
    assert paired("output_tok_s", [None, *base[1:]], cand, blocks=[0, 0, 0, 1, 1, 1]).n_now == 5
    assert paired("output_tok_s", base, cand, blocks=list(range(6))).note == paired("output_tok_s", base, cand).note
    # Acceptance that repeats pair to pair keeps the exact rule in one block.
    assert paired("acceptance_rate", [0.6] * 3, [0.6] * 3, blocks=[0] * 3).method == "exact"


def test_blocks_keep_the_false_alarm_rate_where_pairs_lose_it() -> None:
    # Simulated A/A sessions: 4 blocks of 3 pairs, each block's pairs moved alike (sd 10 %: a machine's swing or a
    # server start), 1 % noise pair to pair. Pair by pair the t sees only the 1 % and calls a block swing "regressed";
    # block by block the false alarms stay within the level (5 %).
    rng = np.random.default_rng(7)
    blocks = [b for b in range(4) for _ in range(3)]
    alarms = {"pairs": 0, "blocks": 0}
    n = 800
    for _ in range(n):
        x = np.repeat(rng.normal(0.0, 0.10, 4), 3) + rng.normal(0.0, 0.01, 12)
        cand = list(100.0 * np.exp(x))
        alarms["pairs"] += paired("output_tok_s", [100.0] * 12, cand).verdict == "regressed"
        alarms["blocks"] += paired("output_tok_s", [100.0] * 12, cand, blocks=blocks).verdict == "regressed"
    assert alarms["pairs"] / n > 0.10 and alarms["blocks"] / n < 0.05 + 2 * (0.05 * 0.95 / n) ** 0.5, alarms


def test_test_end_pads_the_shown_family_with_the_shown_drift_to_come() -> None:
    """A shown drift joins the shown family (`gate.drift`): at a test's end that family is padded to what the
    collected tests can add, each A/B test's candidate drift (2 metrics, none gated here) included."""
    from pytest_specdec.gate.drift import STEP_TIME_DRIFT, Drift, DriftVerdict

    g = gate()
    step = DriftVerdict(STEP_TIME_DRIFT, "regressed", "shown", "%", 10.0, 1.0, 1.6, 60.0, (40.0, 80.0), 0.01,
                        (0, 1, 2, 3), (4, 5, 6, 7), ())
    first = dataclasses.replace(ab_judgement(*ab_verdicts(case(0.9), g.thresholds, 0.05)),
                                drift=Drift((step,), 0.05))
    ended, _ = g.test_end("t1", [("t1", first)], [planned()] * 40)
    assert ended.drift is not None
    (shown,) = ended.drift.shown
    assert "Benjamini-Hochberg over 80 tests (79 without a p-value" in shown.note, shown.note
    assert shown.verdict == "inconclusive", shown  # p 0.01 x 80 at the test's end; judged whole at the session's
