"""Counter parsing and deltas, spec-decode figures against the fake server, parity with `vllm bench serve`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from vllm_child import run_vllm_script

from fakes import FakeConfig, FakeServer
from pytest_specdec.errors import SpecDecError
from pytest_specdec.measure.client import run_load_sync
from pytest_specdec.measure.metrics import (
    bench_parity,
    bench_run_metrics,
    compute_run_metrics,
    counters_delta,
    summarize,
)
from pytest_specdec.measure.types import LoadResult, Prompt, RequestSample, Sampling
from pytest_specdec.output.schema import run_metrics_entry
from pytest_specdec.vllm.counters import Counters, delta, parse_counters

# Shaped like a real vLLM /metrics body: two engines, `_total` samples, `_created` gauges, and look-alike
# families (`prompt_tokens_cached`, `_by_source`, a histogram) that must not be added in.
TWO_ENGINES = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 100.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 50.0
# HELP vllm:spec_decode_num_drafts_created Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_created gauge
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e+09
vllm:spec_decode_num_drafts_created{engine="1",model_name="m"} 1.7e+09
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 300.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="m"} 150.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 120.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="m"} 60.0
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 70.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 35.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 15.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="0"} 35.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="1"} 20.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="2"} 5.0
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_created Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_created gauge
vllm:spec_decode_num_accepted_tokens_per_pos_created{engine="0",model_name="m",position="0"} 1.7e+09
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 1000.0
vllm:generation_tokens_total{engine="1",model_name="m"} 500.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 40.0
vllm:prompt_tokens_total{engine="1",model_name="m"} 2.0
# HELP vllm:prompt_tokens_cached_total Number of cached prompt tokens (local + external).
# TYPE vllm:prompt_tokens_cached_total counter
vllm:prompt_tokens_cached_total{engine="0",model_name="m"} 999.0
# HELP vllm:prompt_tokens_by_source_total Number of prompt tokens by source.
# TYPE vllm:prompt_tokens_by_source_total counter
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 999.0
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 1.0
vllm:num_preemptions_total{engine="1",model_name="m"} 2.0
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 64.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 36.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 16.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 9.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 5.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 5.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 0.5
"""


def test_parse_counters_sums_engines_and_skips_created() -> None:
    c = parse_counters(TWO_ENGINES)
    assert c == Counters(drafts=150, draft_tokens=450, accepted_tokens=180, accepted_per_pos=(105, 55, 20),
                         generation_tokens=1500, prompt_tokens=42, preemptions=3, prefix_cache_queries=100,
                         prefix_cache_hits=25, spec_decode=True)


def test_parse_counters_without_spec_decode() -> None:
    text = "\n".join(line for line in TWO_ENGINES.splitlines() if "spec_decode" not in line) + "\n"
    c = parse_counters(text)
    assert not c.spec_decode and c.drafts == 0 and c.accepted_per_pos == () and c.generation_tokens == 1500


def test_delta_and_negative_delta_names_counter() -> None:
    before = Counters(drafts=10, draft_tokens=30, accepted_tokens=12, accepted_per_pos=(8, 4),
                      generation_tokens=100, spec_decode=True)
    after = Counters(drafts=20, draft_tokens=60, accepted_tokens=20, accepted_per_pos=(14, 6, 0),
                     generation_tokens=180, spec_decode=True)
    d = delta(before, after)
    assert (d.drafts, d.draft_tokens, d.accepted_tokens, d.accepted_per_pos, d.generation_tokens) == \
        (10, 30, 8, (6, 2, 0), 80)
    restarted = Counters(drafts=3, generation_tokens=500, spec_decode=True)
    with pytest.raises(SpecDecError, match="vllm:spec_decode_num_drafts went down from 20 to 3"):
        delta(after, restarted)
    with pytest.raises(SpecDecError, match=r'per_pos\{position="0"\}'):
        delta(after, Counters(drafts=30, draft_tokens=90, accepted_tokens=30, accepted_per_pos=(1, 9, 9),
                              generation_tokens=300, spec_decode=True))


def _prompts(n: int, max_tokens: int) -> list[Prompt]:
    return [Prompt(id=f"p{i}", messages=[{"role": "user", "content": f"prompt {i} " * (1 + i % 5)}],
                   max_tokens=max_tokens) for i in range(n)]


ACCEPT = (0.8, 0.5, 0.2)


@pytest.mark.parametrize("engines", [1, 2])
def test_acceptance_figures_match_fake_server(engines: int) -> None:
    cfg = FakeConfig(k=3, acceptance=ACCEPT, draft_share=0.7, engines=engines, seed=engines)
    with FakeServer(cfg) as url:
        srv_warm = run_load_sync(url, "fake-model", _prompts(4, 8), Sampling(temperature=0.0), concurrency=4)
        assert srv_warm.n_failed == 0  # earlier traffic: the delta must exclude it
        load = run_load_sync(url, "fake-model", _prompts(96, 96), Sampling(temperature=0.0), concurrency=16,
                             warmup=8, cache_salt=f"salt{engines}")
    d = counters_delta(load)
    assert d is not None
    m = compute_run_metrics(load, d)
    assert m.n_requests == 96 and m.n_failed == 0
    e, spec = m.engine, m.spec
    assert e is not None and spec is not None
    assert e.token_counter_mismatch == 0 and e.generation_tokens == 96 * 96 == m.total_output_tokens
    assert spec.drafts > 1000
    # configured values are the expectations; tolerances are about 4 binomial standard deviations
    assert spec.per_position_acceptance == pytest.approx(list(ACCEPT), abs=0.06)
    assert spec.acceptance_rate == pytest.approx(sum(ACCEPT) / 3, abs=0.04)
    assert spec.acceptance_length == pytest.approx(1 + sum(ACCEPT), abs=0.12)
    # coverage is biased up slightly by accepted tokens cut at max_tokens (see SpecFigures.from_delta)
    assert spec.draft_coverage == pytest.approx(0.7, abs=0.05)
    assert spec.acceptance_rate == pytest.approx(spec.accepted_tokens / spec.draft_tokens)
    assert e.prefix_cache_hit_rate == 0.0  # a fresh salt: nothing cached, warm-up salted apart
    assert e.prefix_cache_hits == 0 and e.prefix_cache_queries > 0
    assert m.output_tok_s is not None and m.output_tok_s > 0
    assert m.ttft_ms is not None and set(m.ttft_ms) == {"p50", "p95", "p99", "mean"}
    flat = run_metrics_entry(m)
    json.dumps(flat)
    # stored runs stay flat: the counter figures sit beside the rest, under their own names
    assert flat["drafts"] == spec.drafts and flat["preemptions"] == e.preemptions
    assert "spec" not in flat and "engine" not in flat


def test_no_speculation_gives_none_not_zero() -> None:
    with FakeServer(FakeConfig(k=0)) as url:
        load = run_load_sync(url, "fake-model", _prompts(8, 10), Sampling(temperature=0.0), concurrency=4)
    m = compute_run_metrics(load, counters_delta(load))
    assert m.spec is None and m.engine is not None
    flat = run_metrics_entry(m)
    assert all(flat[name] is None for name in ("drafts", "acceptance_rate", "acceptance_length",
                                                "per_position_acceptance", "draft_coverage"))
    assert m.engine.token_counter_mismatch == 0 and m.itl_chunk_ms is not None


def test_undefined_figures_are_none() -> None:
    load = LoadResult(samples=[RequestSample(prompt_id="x", start=0.0, error="HTTP 500: boom")], t_start=0.0,
                      t_end=1.0, max_in_flight=1, loop_lag_max_s=0.0, loop_lag_mean_s=0.0,
                      sampling=Sampling(temperature=0.0), base_url="", model="m", api="chat", concurrency=1,
                      rate=None, seed=0, cache_salt=None, warmup=0, timeout_s=1.0)
    m = compute_run_metrics(load, Counters(spec_decode=True))
    assert m.ttft_ms is None and m.tpot_ms is None and m.itl_chunk_ms is None and m.n_failed == 1
    assert m.spec is not None and m.spec.drafts == 0
    assert m.spec.acceptance_rate is None and m.spec.acceptance_length is None and m.spec.draft_coverage is None
    assert m.errors == {"HTTP 500: boom": 1}


# --- parity with `vllm bench serve` -----------------------------------------------------------------

def synthetic_bench_result(seed: int = 7, n: int = 60) -> dict[str, Any]:
    """A `--save-result --save-detailed` dict in vLLM's format, with failures and 1-token requests."""
    rng = np.random.default_rng(seed)
    ttfts: list[float] = []
    itls: list[list[float]] = []
    lats: list[float] = []
    outs: list[int] = []
    errors: list[str] = []
    starts: list[float] = []
    for i in range(n):
        if i % 13 == 5:  # failed: vLLM stores ttft 0, no itl, latency 0, output_len 0 and the error
            ttfts.append(0.0)
            itls.append([])
            lats.append(0.0)
            outs.append(0)
            errors.append("Bad Gateway")
        else:
            out = 1 if i % 17 == 3 else int(rng.integers(2, 80))
            chunks = max(1, out - int(rng.integers(0, out // 2 + 1)))  # spec decode: fewer chunks than tokens
            ttft = float(rng.gamma(2.0, 0.05))
            gaps = [float(x) for x in rng.gamma(3.0, 0.004, size=chunks - 1)]
            ttfts.append(ttft)
            itls.append(gaps)
            lats.append(ttft + sum(gaps))
            outs.append(out)
            errors.append("")
        starts.append(1000.0 + i * 0.01)
    ok = [i for i in range(n) if not errors[i]]
    duration = 3.21
    res: dict[str, Any] = {
        "duration": duration, "completed": len(ok), "failed": n - len(ok),
        "input_lens": [32] * n, "output_lens": outs, "ttfts": ttfts, "itls": itls, "latencies": lats,
        "start_times": starts, "errors": errors, "generated_texts": [""] * n,
        "request_throughput": len(ok) / duration, "output_throughput": sum(outs) / duration,
        "spec_decode_acceptance_rate": 55.0, "spec_decode_acceptance_length": 2.65,
        "spec_decode_num_drafts": 400, "spec_decode_draft_tokens": 1200, "spec_decode_accepted_tokens": 660,
        "spec_decode_per_position_acceptance_rates": [0.8, 0.55, 0.3],
    }
    # Summary figures exactly as serve.py computes them (calculate_metrics + process_one_metric).
    series = {
        "ttft": [ttfts[i] for i in ok],
        "tpot": [(lats[i] - ttfts[i]) / (outs[i] - 1) for i in ok if outs[i] > 1],
        "itl": [x for i in ok for x in itls[i]],
        "e2el": [lats[i] for i in ok],
    }
    for name, vals in series.items():
        res[f"mean_{name}_ms"] = np.mean(vals or 0) * 1000
        res[f"median_{name}_ms"] = np.median(vals or 0) * 1000
        for p in (50, 95, 99):
            res[f"p{p}_{name}_ms"] = np.percentile(vals or 0, p) * 1000
    return res


def assert_matches_bench_summary(res: dict[str, Any], rel: float = 1e-3) -> int:
    """Compare our figures for a bench result with the summary figures stored in it; returns how many."""
    figures = bench_parity(res)
    worse = {k: v for k, v in figures.items() if not v["rel_diff"] <= rel}
    assert not worse, worse
    for name in ("ttft", "tpot", "itl", "e2el"):
        assert any(k.endswith(f"_{name}_ms") for k in figures), f"no {name} figures compared"
    m = bench_run_metrics(res)
    assert m.n_requests - m.n_failed == res["completed"]
    if "spec_decode_num_drafts" in res:
        assert m.spec is not None
        assert m.spec.acceptance_rate == pytest.approx(res["spec_decode_acceptance_rate"] / 100)
        assert m.spec.acceptance_length == pytest.approx(res["spec_decode_acceptance_length"])
    return len(figures)


def test_percentile_parity_with_bench_formulas() -> None:
    assert assert_matches_bench_summary(synthetic_bench_result()) >= 20


def test_summarize_matches_numpy_linear_percentiles() -> None:
    vals = [0.3, 0.1, 0.2, 0.4]
    s = summarize(vals)
    assert s is not None and set(s) == {"p50", "p95", "p99", "mean"}
    assert [s["p50"], s["p95"], s["p99"], s["mean"]] == pytest.approx([250.0, 385.0, 397.0, 250.0])
    assert summarize([]) is None


_VLLM_SCRIPT = r"""
import json, sys
from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput
from vllm.benchmarks.serve import calculate_metrics
r = json.load(sys.stdin)
outs = [RequestFuncOutput(success=not e, latency=l, output_tokens=o, ttft=t, itl=i, prompt_len=p,
                          start_time=s, error=e)
        for e, l, o, t, i, p, s in zip(r["errors"], r["latencies"], r["output_lens"], r["ttfts"], r["itls"],
                                       r["input_lens"], r["start_times"])]
m, _ = calculate_metrics([], outs, r["duration"], None, [50.0, 95.0, 99.0], r.get("goodput_slos_ms") or {})
d = {"request_throughput": m.request_throughput, "output_throughput": m.output_throughput,
     "completed": m.completed, "request_goodput": m.request_goodput}
for name in ("ttft", "tpot", "itl", "e2el"):
    d[f"mean_{name}_ms"] = float(getattr(m, f"mean_{name}_ms"))
    d[f"median_{name}_ms"] = float(getattr(m, f"median_{name}_ms"))
    for p, v in getattr(m, f"percentiles_{name}_ms"):
        d[f"p{int(p)}_{name}_ms"] = float(v)
print("RESULT " + json.dumps(d))
"""


#: Goodput SLOs for the synthetic records (TTFTs of about 0.1 s, TPOTs of about 4-12 ms).
GOODPUT_SLOS_MS = {"ttft": 150.0, "tpot": 8.0, "e2el": 600.0}


@pytest.mark.slow
def test_percentile_parity_with_installed_vllm_bench() -> None:
    """Feed the synthetic records through vLLM's own calculate_metrics (in a child: importing vLLM is
    heavy and warns) and check our figures agree within 0.1%, and our goodput with its own (SLOs that cut
    through the requests, a TPOT one among them, which 1-token requests meet at a TPOT of 0) exactly."""
    res = {**synthetic_bench_result(seed=11), "goodput_slos_ms": GOODPUT_SLOS_MS}
    # a 1-token request ends 50 ms after its first token, as real ones do: its TPOT still counts as 0 for goodput
    one_token = [i for i, (out, err) in enumerate(zip(res["output_lens"], res["errors"], strict=True))
                 if out == 1 and not err]
    assert one_token
    for i in one_token:
        res["latencies"][i] += 0.05
    theirs = run_vllm_script(_VLLM_SCRIPT, res, "vllm's calculate_metrics", TERM_PLOTLIB_DISABLE="1")
    ours = bench_run_metrics(res, GOODPUT_SLOS_MS)
    assert ours.good_requests is not None and 0 < ours.good_requests < theirs["completed"]
    assert ours.goodput_req_s == pytest.approx(theirs.pop("request_goodput"), rel=1e-12)
    mine = {k: v for k, v in res.items() if not k.endswith("_ms") and k not in ("request_throughput",
                                                                                 "output_throughput")}
    assert assert_matches_bench_summary({**mine, **theirs}) >= 20


REAL_BENCH_FILE = Path(__file__).resolve().parents[1] / "data" / "bench_serve_detailed_eagle3.json"


def test_real_bench_file() -> None:
    """A real `vllm bench serve --save-result --save-detailed` file from vLLM CPU serving the zoo's eagle3
    (written by `python -m scripts.vs_bench_serve ab --keep-detailed tests/data/...`): every summary
    figure bench serve printed agrees with ours, recomputed from its per-request records, within 0.1%."""
    with REAL_BENCH_FILE.open(encoding="utf-8") as f:
        res = json.load(f)
    assert res["completed"] >= 20 and res["spec_decode_num_drafts"] > 0
    assert assert_matches_bench_summary(res) >= 20
