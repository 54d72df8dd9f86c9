"""The plugin end to end through pytester, against simulated vLLM servers (endpoint mode)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from session import specdec_session

from fakes import FakeConfig, FakeServer

SUITE = {"concurrency": [1, 4], "num_prompts": 8, "max_tokens": 24, "body": """
s = specdec.summary
assert s["acceptance_rate"] is not None
assert specdec.params["method"] == "ngram"
"""}


def test_help_lists_the_options(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines([
        "*speculative decoding regression checks (pytest-specdec)*",
        "*--gpu=NAME*hardware profile: cpu, gpu-zoo, h100, h200, a100, l40s",
        "*Default: 'auto'",
        "*--specdec-runs=N*",
        "*--specdec-dry-run*",
        "*--specdec-endpoint=URL*",
        "*--specdec-baselines=DIR*",
        "*Default: 'baselines'",
        "*--update-baselines=[[]MODE]*",
        "*--specdec-strict*",
        "*--specdec-max-runs=N*",
        "*--specdec-alpha=ALPHA*",
        "*--specdec-multiplicity=METHOD*",
        "*--specdec-threshold=METRIC=VALUE*",
        "*specdec_keep_sessions (string)*",
        "*specdec_thresholds (linelist)*",
    ])


def test_marker_is_registered(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.specdec(method=..., k=..., temperature=..., concurrency=*",
                                 "@pytest.mark.specdec_verdicts(check=True, thresholds=*"])


def test_measures_interleaved_runs_and_writes_json(
    pytester: pytest.Pytester, fake_endpoints: tuple[str, str], fake_profile: Path, make_suite: Callable[..., str]
) -> None:
    # The test's summary is its results entry's, and changing it changes nothing the session records.
    body = SUITE["body"] + """
import json, pathlib
pathlib.Path(f"summary-c{specdec.params['concurrency']}.json").write_text(json.dumps(s))
s["speedup"] = -1.0
assert specdec.summary["speedup"] != -1.0
"""
    pytester.makepyfile(test_suite=make_suite(**{**SUITE, "body": body}))
    # No baselines yet: creating them is what makes a first session pass (test_baselines_e2e.py has the rest).
    session = specdec_session(pytester, fake_profile, fake_endpoints, "-v", "--update-baselines=missing")
    result = session.result
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines([
        "*test_ngram?ngram-k3-t0.0-c1? PASSED*",
        "*run 1/2 reference*tok/s*",
        "*run 1/2 spec*tok/s, acceptance 0.*",
        "*specdec results: *latest.json",
    ])
    data = session.results
    assert data["profile"] == "fake"
    import uvloop  # installed with vLLM: the client runs on its loop, and the results say so

    assert data["environment"]["client_event_loop"] == f"uvloop {uvloop.__version__}"
    test = data["tests"][0]
    assert test["params"] == {
        "method": "ngram", "k": 3, "temperature": 0.0, "concurrency": 1, "dataset": "builtin",
        "max_tokens": 24, "num_prompts": 8, "speculative_config": None, "api": "chat", "request_rate": None,
        "ignore_eos": False, "burstiness": 1.0, "input_len": None, "output_len": None, "range_ratio": 0.0,
        "goodput": None, "rate_sweep": None, "rate_fraction": None,
    }
    # Every sampling parameter the requests carried, explicitly (none left to the server's defaults).
    assert test["sampling"] == {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "presence_penalty": 0.0,
                                "frequency_penalty": 0.0, "repetition_penalty": 1.0, "ignore_eos": False}
    assert test["outcome"] == "passed"
    # The CIs' level goes with the results, so a reader (the HTML report) never has to guess it.
    assert test["baseline"]["alpha"] == 0.05
    assert test["baseline"]["ci_level"] == pytest.approx(1 - 2 * 0.05 / test["baseline"]["max_looks"])
    assert test["alternation"] == "interleaved"
    assert [r["arm"] for r in test["reference_runs"]] == ["reference", "reference"]
    assert len(test["runs"]) == 2 and len(test["speedup_per_pair"]) == 2
    summary = test["summary"]
    # The fake server accepts position i with probability (.8, .6, .4): mean 0.6.
    assert 0.4 < summary["acceptance_rate"] < 0.8
    assert summary["per_position_acceptance"][0] > summary["per_position_acceptance"][2]
    assert summary["speedup"] > 1.0
    assert set(summary["tpot_ms"]) == {"p50", "p95", "p99"}
    assert test["validity"]["valid"], test["validity"]
    for t in data["tests"]:
        assert json.loads((pytester.path / f"summary-c{t['params']['concurrency']}.json").read_text()) == t["summary"]


def test_unknown_marker_key_is_a_collection_error(pytester: pytest.Pytester, fake_profile: Path) -> None:
    pytester.makepyfile(
        """
        import pytest
        @pytest.mark.specdec(method="ngram", kk=3)
        def test_x(specdec):
            pass
        """
    )
    result = pytester.runpytest(f"--specdec-profile={fake_profile}", "-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*unknown key(s) kk; allowed: method, k, temperature*"])


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ("num_prompts=500", "*num_prompts=500 but dataset 'builtin' has 128 prompts; lower num_prompts*"),
        ("max_tokens=2048", "*max_tokens=2048 leaves no room for the prompt: profile 'fake' serves with "
                            "--max-model-len 1024; lower max_tokens below 1024*"),
        # a dataset record's own max_tokens, when the marker sets none
        ("dataset='p.jsonl'", "*dataset 'p.jsonl': prompt 'long' asks for max_tokens=4096, which leaves no room for "
                              "the prompt: profile 'fake' serves with --max-model-len 1024*"),
    ],
)
def test_impossible_workloads_are_collection_errors(
    pytester: pytest.Pytester, fake_profile: Path, fields: str, message: str
) -> None:
    fake_profile.write_text(fake_profile.read_text().replace(
        '[target]', '[server]\nargs = ["--max-model-len", "1024"]\n[target]'))
    (pytester.path / "p.jsonl").write_text('{"prompt": "Hi?", "max_tokens": 40}\n'
                                            '{"id": "long", "prompt": "Write a novel.", "max_tokens": 4096}\n')
    pytester.makepyfile(f"""
        import pytest
        @pytest.mark.specdec(method="ngram", {fields})
        def test_x(specdec):
            pass
        """)
    result = pytester.runpytest(f"--specdec-profile={fake_profile}", "--specdec-dry-run", "-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([message])


def test_dry_run_prints_commands_and_starts_nothing(pytester: pytest.Pytester, fake_profile: Path,
                                                    make_suite: Callable[..., str]) -> None:
    pytester.makepyfile(test_suite=make_suite(**SUITE, method=["ngram", "eagle3"]))
    result = pytester.runpytest(f"--specdec-profile={fake_profile}", "--specdec-dry-run", "-p", "no:cacheprovider")
    result.assert_outcomes(skipped=4)
    result.stdout.fnmatch_lines([
        "specdec dry run: profile fake*4 test(s)*",
        "*spec [[]*[]]: *serve fake-model --host 127.0.0.1 --port $PORT --generation-config vllm "
        "--speculative-config*eagle3*",
        "specdec dry run: 3 distinct server(s)*",
    ])


def test_specdec_host_is_where_servers_bind_and_a_bad_one_is_a_usage_error(
    pytester: pytest.Pytester, fake_profile: Path, make_suite: Callable[..., str]
) -> None:
    pytester.makepyfile(test_suite=make_suite(**SUITE))
    result = pytester.runpytest(f"--specdec-profile={fake_profile}", "--specdec-dry-run", "--specdec-host=0.0.0.0",
                                "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*serve fake-model --host 0.0.0.0 --port $PORT --generation-config vllm*"])
    bad = pytester.runpytest(f"--specdec-profile={fake_profile}", "--specdec-host=not a host", "-p", "no:cacheprovider")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*--specdec-host: expected an IP address (e.g. 127.0.0.1) or a host name, "
                              "got 'not a host'*"])


def test_specdec_draft_replaces_a_methods_head_under_the_same_test_ids(
    pytester: pytest.Pytester, fake_profile: Path, make_suite: Callable[..., str]
) -> None:
    pytester.makepyfile(test_suite=make_suite(**SUITE, method="eagle3"))
    result = pytester.runpytest(f"--specdec-profile={fake_profile}", "--specdec-dry-run", "-p", "no:cacheprovider",
                                "--specdec-draft", "eagle3=/heads/new-head", "-v")
    result.stdout.fnmatch_lines(["*--speculative-config*/heads/new-head*"])
    bad = pytester.runpytest(f"--specdec-profile={fake_profile}", "--specdec-dry-run", "-p", "no:cacheprovider",
                             "--specdec-draft", "nosuch=/x")
    bad.stdout.fnmatch_lines(["*--specdec-draft nosuch=...: method 'nosuch' is not in profile*allowed: ngram, eagle3*"])
    worse = pytester.runpytest("--specdec-draft", "eagle3")
    worse.stderr.fnmatch_lines(["*--specdec-draft expects METHOD=MODEL*got 'eagle3'*"])


def test_completions_api_and_open_loop_rate_from_marker_and_command_line(pytester: pytest.Pytester,
                                                                         make_profile: Callable[..., Path]) -> None:
    """api='completions' renders the chat prompts with the target's template (here the zoo's) and sends
    them to /v1/completions without a second BOS; request_rate= turns the run into an open loop."""
    from pytest_specdec.zoo import zoo_path

    profile = make_profile("zoo-target", model=str(zoo_path("target")), methods=("ngram",), k=None, runs=1,
                           validity=None)
    pytester.makepyfile(test_suite="""
        import pytest

        @pytest.mark.specdec(method="ngram", k=3, temperature=0.0, concurrency=2, num_prompts=4, max_tokens=8,
                             api="completions", request_rate=None)
        @pytest.mark.specdec_verdicts(check=False)
        def test_completions(specdec):
            assert specdec.params["api"] == "completions" and specdec.params["request_rate"] is None

        @pytest.mark.specdec(method="ngram", k=3, temperature=0.0, concurrency=2, num_prompts=4, max_tokens=8)
        @pytest.mark.specdec_verdicts(check=False)
        def test_rate_from_cli(specdec):
            assert specdec.params["api"] == "chat" and specdec.params["request_rate"] == 40.0
    """)
    spec_srv = FakeServer(FakeConfig(k=3, acceptance=(0.8, 0.6, 0.4), output_tokens=8))
    ref_srv = FakeServer(FakeConfig(output_tokens=8))
    with spec_srv as spec_url, ref_srv as ref_url:
        session = specdec_session(pytester, profile, (spec_url, ref_url), "--specdec-request-rate=40",
                                  "-k", "completions or rate", "-v",
                                  "--specdec-served-model=fake-model")  # the zoo's template, a fake's name
        sent = spec_srv.requests
    result = session.result
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*test_completions[[]ngram-k3-t0.0-c2-completions[]] PASSED*",
                                 "*test_rate_from_cli[[]ngram-k3-t0.0-c2-r40[]] PASSED*"])
    completions = [r for r in sent if "prompt" in r]
    chats = [r for r in sent if "messages" in r]
    assert completions and chats
    assert all(r["prompt"].startswith("<|bos|><|user|>\n") and r["prompt"].endswith("<|assistant|>\n")
               for r in completions)
    assert all(r["add_special_tokens"] is False and r["max_tokens"] == 8 for r in completions)
    data = session.results
    assert {t["params"]["api"] for t in data["tests"]} == {"completions", "chat"}
    rated = next(t for t in data["tests"] if t["params"]["request_rate"] == 40.0)
    assert rated["validity"]["valid"] and rated["runs"][0]["request_rate"] == 40.0


def test_a_session_without_specdec_tests_leaves_no_trace(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Installed is not used: as pytest-xdist does nothing until -n, a session of plain tests gets no signal
    handler from the plugin, no scan of /proc, no file (not even a probe it removes again), and no usage error
    from a disk the plugin could not write to (a full one here)."""
    import errno
    import os
    import signal

    from pytest_specdec.servers import hygiene, spawn

    installed: list[int] = []
    real_signal = signal.signal

    def spy(sig: int, handler: object) -> object:
        if sig in (signal.SIGTERM, signal.SIGHUP):
            installed.append(sig)
        return real_signal(sig, handler)  # type: ignore[arg-type]  # the spy passes on any handler it gets

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the plugin scanned /proc in a session without specdec tests")

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    for sig in (signal.SIGTERM, signal.SIGHUP):  # the defaults, as in a fresh process (the plugin sets only those)
        old = real_signal(sig, signal.SIG_DFL)
        request.addfinalizer(lambda sig=sig, old=old: real_signal(sig, old))
    monkeypatch.setattr(signal, "signal", spy)
    monkeypatch.setattr(hygiene, "find_strays", refuse)
    monkeypatch.setattr(spawn.os, "fsync", full)
    monkeypatch.setenv(hygiene.REGISTRY_ENV, str(tmp_path / "registry"))
    pytester.makepyfile("def test_plain():\n    pass\n")
    before = sorted(pytester.path.rglob("*"))
    for args in (["--co", "-q"], []):  # -p no:benchmark: pytest-benchmark makes .benchmarks/ on its own
        r = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:benchmark", *args)
        assert r.ret == pytest.ExitCode.OK, r.stdout.str()
    assert installed == [] and sorted(pytester.path.rglob("*")) == before and not (tmp_path / "registry").exists()


def test_the_former_spellings_of_renamed_options_still_work_with_a_warning(pytester: pytest.Pytester) -> None:
    """Each renamed option's former spelling sets the same setting for one release, with one deprecation
    warning naming the new spelling."""
    pytester.makepyfile('''
        from pytest_specdec.plugin import session_key

        def test_settings(pytestconfig):
            st = pytestconfig.stash[session_key].settings
            assert (st.settle_timeout_s, st.hung_timeout_s, st.multiplicity) == (0.5, 7.0, "holm")
            assert (st.report_path.name, st.reports_dir.name) == ("r.html", "out")
    ''')
    old = {"--specdec-quiet-timeout=0.5": "--specdec-settle-timeout",
           "--specdec-idle-timeout=7": "--specdec-hung-timeout",
           "--specdec-fdr=holm": "--specdec-multiplicity", "--specdec-report=r.html": "--specdec-report-html",
           "--specdec-reports=out": "--specdec-reports-dir"}
    r = pytester.runpytest("-p", "no:cacheprovider", "-W", "default", *old)
    r.assert_outcomes(passed=1, warnings=len(old))
    r.stdout.fnmatch_lines_random([f"*SpecDecDeprecationWarning: {flag.split('=')[0]} is deprecated and goes in the "
                                   f"next release: use {new}" for flag, new in old.items()])


def test_a_gated_goodput_without_slos_is_a_usage_error(pytester: pytest.Pytester, fake_profile: Path,
                                                        make_suite: Callable[..., str]) -> None:
    """A goodput gated where no SLO was set would never be judged: the session stops before anything starts."""
    pytester.makepyfile(test_suite=make_suite(name="test_plain", verdicts='gate=["goodput"]'))
    result = pytester.runpytest(f"--specdec-profile={fake_profile}", "--specdec-dry-run", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: test_suite.py::test_plain*: specdec_verdicts(gate=[[]..., 'goodput'[]]) "
                                 "but its specdec marker sets no goodput SLOs: add goodput=*"])
