"""Goodput: vllm bench serve's count of requests meeting every SLO (`metrics.good_requests`), per run and stored with
the run, the per-pair ratio the gate judges (`record.goodput_ratio`; a pair where an arm met no SLO has none and is
said), its verdict shown or gated (stored nights and A/B), and nothing new for a test without SLOs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from factories import night_entry, run_entry

from pytest_specdec.errors import ConfigError
from pytest_specdec.gate.ab_session import pair_verdicts
from pytest_specdec.gate.baselines import arm_run_entry
from pytest_specdec.gate.nights import Night
from pytest_specdec.gate.stats import DEFAULT_THRESHOLDS
from pytest_specdec.gate.verdicts import evaluate
from pytest_specdec.measure.metrics import bench_run_metrics, compute_run_metrics, good_requests
from pytest_specdec.measure.record import ArmRun, goodput_ratio, goodput_undefined, pairs, run_problem
from pytest_specdec.measure.summary import goodput_summary
from pytest_specdec.measure.types import LoadResult, RequestSample, Sampling
from pytest_specdec.output.progress import goodput_text
from pytest_specdec.output.schema import goodput_entry, run_metrics_entry

BENCH_FILE = Path(__file__).resolve().parents[1] / "data" / "bench_serve_detailed_eagle3.json"


def sample(ttft: float, e2e: float, tokens: int, error: str | None = None) -> RequestSample:
    return RequestSample(prompt_id="p", start=0.0, ttft_s=ttft, e2e_s=e2e, output_tokens=tokens, error=error,
                         chunks=[(ttft, 1)])


def load(samples: list[RequestSample], duration: float = 2.0) -> LoadResult:
    return LoadResult(samples=samples, t_start=0.0, t_end=duration, max_in_flight=1, loop_lag_max_s=0.0,
                      loop_lag_mean_s=0.0, sampling=Sampling(temperature=0.0), base_url="", model="m",
                      api="completions", concurrency=1, rate=None, seed=0, cache_salt=None, warmup=0, timeout_s=1.0)


def test_a_request_is_good_when_every_slo_holds_as_bench_counts() -> None:
    # tpot (0.5 - 0.1) / 4 = 0.1 s; a 1-token request's tpot counts as 0, however long its E2E after the TTFT
    ok = sample(0.1, 0.5, 5)
    one_token = sample(0.1, 0.9, 1)
    failed = sample(0.01, 0.02, 3, error="HTTP 500")
    assert good_requests([ok, one_token, failed], {"tpot": 100}) == 2  # s >= r: 100 ms holds for 0.1 s exactly
    assert good_requests([ok, one_token, failed], {"tpot": 99.9}) == 1  # only the 1-token request
    assert good_requests([ok, one_token], {"tpot": 100, "e2el": 600}) == 1  # every SLO must hold
    assert good_requests([ok, one_token], {"ttft": 100, "tpot": 200, "e2el": 1000}) == 2
    with pytest.raises(ConfigError, match="goodput SLO.s. itl unknown: the SLOs are ttft, tpot, e2el"):
        good_requests([ok], {"itl": 5})


def test_goodput_divides_by_the_duration_request_throughput_divides_by_and_records_its_slos() -> None:
    m = compute_run_metrics(load([sample(0.1, 0.5, 5), sample(0.3, 0.6, 5), sample(0.1, 0.2, 2, "x")]), None,
                            {"ttft": 200})
    assert (m.good_requests, m.goodput_req_s, m.request_s) == (1, 0.5, 1.0)
    assert run_metrics_entry(m)["goodput_slos_ms"] == {"ttft": 200} and run_metrics_entry(m)["goodput_req_s"] == 0.5
    # no SLOs: no goodput, and nothing new in the results' run
    plain = run_metrics_entry(compute_run_metrics(load([sample(0.1, 0.5, 5)]), None))
    assert not {"goodput_req_s", "good_requests", "goodput_slos_ms"} & set(plain)


def bench_goodput(res: dict[str, Any], slos: dict[str, float]) -> float:
    """vllm/benchmarks/serve.py calculate_metrics' goodput, transcribed: success = empty error; tpot 0 for
    output_len <= 1; good when every ``slo / 1000 >= value``; divided by the file's duration."""
    good = 0
    for err, ttft, lat, out in zip(res["errors"], res["ttfts"], res["latencies"], res["output_lens"], strict=True):
        if err:
            continue
        tpot = (lat - ttft) / (out - 1) if out > 1 else 0.0
        value = {"ttft": ttft, "tpot": tpot, "e2el": lat}
        good += all(ms / 1000 >= value[k] for k, ms in slos.items())
    return good / res["duration"]


@pytest.mark.parametrize("slos", [{"ttft": 50.0}, {"tpot": 6.0}, {"e2el": 1000.0},
                                  {"ttft": 60.0, "tpot": 7.0, "e2el": 1200.0}])
def test_goodput_of_a_real_bench_file_is_bench_serves(slos: dict[str, float]) -> None:
    """The committed `vllm bench serve --save-detailed` file (eagle3 on vLLM CPU), its per-request records counted
    against SLOs that cut through its requests (neither none nor all good)."""
    res = json.loads(BENCH_FILE.read_text(encoding="utf-8"))
    m = bench_run_metrics(res, slos)
    assert m.good_requests is not None and 0 < m.good_requests < res["completed"], m.good_requests
    assert m.goodput_req_s == pytest.approx(bench_goodput(res, slos), rel=1e-12)


def arm(i: int, goodput: float | None, *, valid: bool = True, tok_s: float = 100.0) -> ArmRun:
    return ArmRun.from_entry({"index": i, "valid": valid, "invalid_reasons": [] if valid else ["hung"],
                              "output_tok_s": tok_s, "hd_p95_ms": {}, "goodput_req_s": goodput})


def test_the_pair_ratio_and_the_pairs_where_an_arm_met_no_slo() -> None:
    ref = [arm(0, 2.0), arm(1, 0.0), arm(2, 2.0), arm(3, 2.0, valid=False), arm(4, 0.0)]
    spec = [arm(0, 3.0), arm(1, 1.0), arm(2, 0.0), arm(3, 1.0), arm(4, 0.0)]
    ps = pairs(ref, spec)
    assert [goodput_ratio(p) for p in ps] == [1.5, None, None, None, None]
    # the dropped pair (an invalid run) is said by the pairing rule; these are the kept pairs without a ratio
    assert goodput_undefined(ps) == [(1, "the reference run met no SLO (goodput 0)"),
                                     (2, "the spec run met no SLO (goodput 0)"),
                                     (4, "the reference and the spec runs met no SLO (goodput 0)")]
    assert goodput_undefined(pairs([arm(0, None)], [arm(0, 1.0)])) == [(0, "the reference run has no goodput")]
    summary = goodput_summary(ref, spec, ps)
    assert summary is not None and summary.goodput == 1.5 and summary.pairs == 1 and len(summary.undefined) == 3
    assert summary.req_s == pytest.approx(1.0)  # a run that met no SLO counts 0 in the arm's mean
    line = goodput_text(goodput_entry(summary))
    assert line.startswith("goodput 1.50x (1.00 vs reference 1.00 req/s meeting the SLOs) (undefined at 3 pair(s), "
                           "left out of its verdict: run 2: the reference run met no SLO (goodput 0); run 3: ")


def test_a_test_without_slos_shows_nothing_new() -> None:
    ref, spec = [arm(i, None) for i in range(3)], [arm(i, None, tok_s=150.0) for i in range(3)]
    assert goodput_summary(ref, spec, pairs(ref, spec)) is None and goodput_text({"speedup": 1.5}) == ""
    assert "goodput" not in Night(tuple(ref), tuple(spec), (1.5, 1.5, 1.5)).metric_values()
    assert "goodput_req_s" not in arm_run_entry(spec[0])
    assert "goodput" not in {v.metric for v in pair_verdicts(ref, spec, DEFAULT_THRESHOLDS, 0.05, reference=ref)}


def test_a_stored_run_may_lack_goodput_but_never_hold_a_bad_one() -> None:
    from pytest_specdec.measure.record import RUN_FIELDS

    run = {**dict.fromkeys(RUN_FIELDS), "index": 0, "valid": True, "invalid_reasons": [], "latency_untrusted": [],
           "hd_p95_ms": {}}
    del run["goodput_req_s"]
    assert run_problem(run) == ""
    assert run_problem({**run, "goodput_req_s": -1.0}) == ".goodput_req_s is -1.0, not a finite number >= 0"
    assert arm_run_entry(ArmRun.from_entry({**run, "goodput_req_s": 2.5}))["goodput_req_s"] == 2.5


def night(spec_goodput: float, n: int = 4) -> dict[str, Any]:
    """A stored night: the reference's goodput 2 req/s, the spec's ``spec_goodput`` (±2 % from run to run)."""
    def run(i: int, goodput: float) -> dict[str, Any]:
        return run_entry(i, per_pos=None, hd_p95_ms={}, goodput_req_s=goodput)

    wobble = [1.0, 1.02, 0.98, 1.01]
    return night_entry([run(i, 2.0) for i in range(n)], [run(i, spec_goodput * wobble[i % 4]) for i in range(n)],
                       speedup_per_pair=[1.0] * n)


@pytest.mark.parametrize("gate", [(), ("goodput",)], ids=["shown", "gated"])
def test_a_goodput_that_falls_is_regressed_against_stored_nights_gated_when_asked(gate: tuple[str, ...]) -> None:
    baseline = {"sessions": [night(3.0), night(3.06)]}
    verdicts = {v.metric: v for v in evaluate(baseline, Night.from_entry(night(1.5)), thresholds=DEFAULT_THRESHOLDS,
                                              alpha=0.05, gate=("speedup", *gate))}
    v = verdicts["goodput"]
    assert v.verdict == "regressed" and v.family == ("gated" if gate else "shown"), v
    assert v.now == pytest.approx(0.75, rel=0.03)


@pytest.mark.parametrize("gated", [False, True])
def test_an_ab_judges_each_arms_goodput_ratio_shown_or_gated(gated: bool) -> None:
    ref = [arm(i, 2.0) for i in range(6)]
    base = [arm(i, 3.0 * (1 + 0.01 * (i % 3))) for i in range(6)]
    candidate = [arm(i, 1.5 * (1 + 0.01 * (i % 2))) for i in range(6)]
    candidate[2] = arm(2, 0.0)  # met no SLO: the pair leaves the verdict, counted in its note
    metrics = ("output_tok_s", "goodput") if gated else ("output_tok_s",)
    v = {x.metric: x for x in pair_verdicts(base, candidate, DEFAULT_THRESHOLDS, 0.05, metrics=metrics,
                                             reference=ref)}["goodput"]
    assert v.verdict == "regressed" and v.family == ("gated" if gated else "shown"), v
    assert v.n_now == 5 and "1 pair(s) left out" in v.note, v
    assert v.now == pytest.approx(0.75, rel=0.02) and v.baseline == pytest.approx(1.5, rel=0.02)


def test_an_ab_takes_a_goodput_threshold_only_from_a_test_with_slos() -> None:
    from pytest_specdec.gate.ab_session import ABGate
    from pytest_specdec.gate.protocol import GateOptions, Planned, TestOptions
    from pytest_specdec.profiles import load_profile

    g = ABGate(load_profile("cpu"), {"eagle3": "/heads/old"}, GateOptions(8, 8))
    g.refuse([Planned("t", "eagle3", 3, None, TestOptions(thresholds={"goodput": 10.0}), goodput=True)])
    with pytest.raises(ConfigError, match=r"t: specdec_verdicts\(thresholds=...\): an A/B session does not judge "
                                          r"goodput"):
        g.refuse([Planned("t", "eagle3", 3, None, TestOptions(thresholds={"goodput": 10.0}))])
